"""``sloctl fit network``: a DiffTry network file fitted from traces or Envoy access logs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sloctl._cli_common import echo

__all__ = ["fit_app", "fit_from_cli", "parse_pairs"]

fit_app = typer.Typer(help="Fit models of the fleet from what it already records.", no_args_is_help=True)

FORMATS_HELP = "otlp-json, zipkin, jaeger or envoy-access (default: detected per file from its content)"


def parse_pairs(values: list[str], hint: str, kind: type = int, low: float = 0) -> dict[str, int | float]:
    """``["a=1,b=2", "c=3"]`` -> ``{"a": 1, "b": 2, "c": 3}``; a bad pair names the option and the expected form."""
    out: dict[str, int | float] = {}
    for text in values:
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            try:
                number = kind(value.strip())
            except ValueError:
                number = None
            if not sep or not name.strip() or number is None or number < low:
                what = "a whole number" if kind is int else "a number"
                raise typer.BadParameter(f"expected NAME=VALUE with VALUE {what} >= {low:g}, got {part!r}",
                                         param_hint=hint)
            out[name.strip()] = number
    return out


def fit_from_cli(traces: list[Path], *, fmt: str | None, class_attribute: str, sampling: float, buffers: list[str],
                 retries: list[str], servers: list[str], weights: list[str], window: str | None,
                 log_format: str | None, min_spans: int = 20):
    """Fit a network from the options shared by ``fit network`` and ``retry optimise --traces``."""
    from sloctl.core.progress import progress
    from sloctl.datasets.traces import FORMATS
    from sloctl.training.network_fit import FitOptions, fit_network, parse_window
    from sloctl.training.network_fit_access import fit_network_from_access_logs

    if fmt is not None and fmt not in FORMATS:
        raise typer.BadParameter(f"expected one of {', '.join(FORMATS)}, got {fmt!r}", param_hint="--format")
    if not 0 < sampling <= 1:
        raise typer.BadParameter(f"expected a rate in (0, 1], got {sampling!r}", param_hint="--sampling")
    options = FitOptions(sampling=sampling, buffers=parse_pairs(buffers, "--buffer", int, 1),
                         retries=parse_pairs(retries, "--retries", int, 0),
                         servers=parse_pairs(servers, "--servers", int, 1),
                         weights=parse_pairs(weights, "--weight", float, 0),
                         window_s=parse_window(window) if window else None, min_spans=min_spans)
    files, kinds = _readable(traces, fmt)
    if "envoy-access" in kinds:
        if len(kinds) > 1:
            raise typer.BadParameter(f"access logs and traces cannot be fitted together; found {sorted(kinds)}: "
                                     "give each its own --traces files", param_hint="--traces")
        return fit_network_from_access_logs(files, log_format=log_format, options=options)
    with progress("fit network: spans read", total=None) as bar:
        return fit_network(files, fmt=fmt, class_attribute=class_attribute, options=options,
                           progress=lambda n: bar.update(n))


def _readable(traces: list[Path], fmt: str | None) -> tuple[list, set[str]]:
    """The trace files named (a folder's files of no known format are skipped and named) and their formats."""
    from sloctl.core.errors import TraceFormatError
    from sloctl.datasets.traces import detect_format, trace_files

    files, kinds = [], set()
    for source in traces:
        for path in trace_files(source):
            try:
                kind = fmt or detect_format(path)
            except TraceFormatError as exc:
                if not source.is_dir():
                    raise
                echo(f"skipped {path}: {exc}")
                continue
            files.append(path)
            kinds.add(kind)
    if not files:
        raise typer.BadParameter(f"no trace or access-log file in {', '.join(map(str, traces))}",
                                 param_hint="--traces")
    return files, kinds


TracesOption = typer.Option(..., "--traces", "-t", help="A trace or access-log file, or a folder of them "
                                                          "(walked); repeatable.")


@fit_app.command("network")
def fit_network_cmd(
    traces: list[Path] = TracesOption,
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the network file here (default: print it)."),
    fmt: str | None = typer.Option(None, "--format", help=FORMATS_HELP),
    class_attribute: str = typer.Option("sloctl.class", help="The span or resource attribute naming the class "
                                                              "(access logs: the route name class-<c>)."),
    sampling: float = typer.Option(1.0, help="Fraction of traces kept by head sampling; arrivals are divided by "
                                             "it (capacities then come from mean local phases)."),
    buffer: list[str] = typer.Option([], "--buffer", help="SERVICE=N: a buffer from config (repeatable)."),
    retries: list[str] = typer.Option([], "--retries", help="CLASS=K: a retry limit from config (repeatable)."),
    servers: list[str] = typer.Option([], "--servers", help="SERVICE=C: servers per service (default 1)."),
    weight: list[str] = typer.Option([], "--weight", help="CLASS=W: the value of a success, for the optimiser."),
    window: str | None = typer.Option(None, help="START:END, epoch seconds or ISO 8601: only spans starting "
                                                 "within (default: the external calls' span)."),
    log_format: str | None = typer.Option(None, help="The Envoy access-log format line (default: sloctl's, "
                                                     "docs/retry.md)."),
    min_spans: int = typer.Option(20, min=1, help="The fewest admitted attempts a capacity may rest on."),
    as_json: bool = typer.Option(False, "--json", help="Print the fit report as JSON (with the network)."),
) -> None:
    """Fit a DiffTry network file (docs/retry.md) from OpenTelemetry, Zipkin or Jaeger traces or Envoy logs.

    The file feeds `sloctl retry solve | simulate | optimise` as it is. The
    report says how many spans each estimate rests on, which services could
    not be fitted and why, and what was odd about the traces (orphans, clock
    skew, duplicates, open spans).
    """
    fitted = fit_from_cli(traces, fmt=fmt, class_attribute=class_attribute, sampling=sampling, buffers=buffer,
                          retries=retries, servers=servers, weights=weight, window=window, log_format=log_format,
                          min_spans=min_spans)
    text = fitted.to_yaml()
    if out is not None:
        from sloctl.core.files import atomic_write

        with atomic_write(out, "w") as f:
            f.write(text)
        echo(f"wrote {out}: {len(fitted.network['services'])} services, {len(fitted.network['classes'])} classes")
    if as_json:
        typer.echo(json.dumps({"network": fitted.network, "report": fitted.report}, default=str))
    elif out is None:
        typer.echo(text, nl=False)
    for name, reason in fitted.report["unfitted"].items():
        echo(f"not fitted: {name}: {reason}")
