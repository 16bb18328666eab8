"""The ``sloctl`` command line.

Commands are grouped by job: ``warehouse`` (the embedded DuckDB warehouse),
``collect`` (run workloads, write query logs), ``import`` (bring outside logs
in), ``log`` (check and summarise logs), ``train`` / ``evaluate`` /
``predict`` / ``tune`` (latency models), ``experiment`` (policy experiments), ``retry``
(retry budgets), ``config`` and ``demo``. Only typer
and rich load at start-up; everything heavy loads inside the command that
needs it, so ``sloctl --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sloctl._cli_common import (
    SEVERAL_LOGS_HELP,
    ConfigOption,
    ForceOption,
    bind_port,
    check_out,
    cli_router,
    echo,
    keep_mode,
    load_cli_config,
    log_files,
    parse_sizes,
    read_logs,
)
from sloctl._cli_errors import SloctlGroup
from sloctl._cli_experiments import experiment_app
from sloctl._cli_fit import fit_app
from sloctl._cli_forecast import forecast_app
from sloctl._cli_gateway import gateway_cmd, gateway_passwd_cmd
from sloctl._cli_gateway_admin import add_gateway_admin
from sloctl._cli_models import evaluate_app, predict_cmd, train_app, tune_app
from sloctl._cli_policy import tune_policy_cmd
from sloctl._cli_retry import retry_app
from sloctl._cli_sidecar import sidecar_app
from sloctl._cli_simulate import simulate_app
from sloctl.core.errors import ConfigError, QueryLogError
from sloctl.datasets.merge import DEFAULT_GAP_S

app = typer.Typer(
    name="sloctl",
    help="Learn how a service fleet behaves under load, then control it to meet latency SLOs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=SloctlGroup,
)
warehouse_app = typer.Typer(help="The embedded DuckDB warehouse: generate TPC databases.",
                            no_args_is_help=True)
log_app = typer.Typer(help="Query logs: validate, summarise and merge.", no_args_is_help=True)
import_app = typer.Typer(help="Import outside traces as query logs.", no_args_is_help=True)
config_app = typer.Typer(help="Configuration files.", no_args_is_help=True)
app.add_typer(warehouse_app, name="warehouse")
app.add_typer(log_app, name="log")
app.add_typer(import_app, name="import")
app.add_typer(config_app, name="config")
app.add_typer(train_app, name="train")
app.add_typer(evaluate_app, name="evaluate")
tune_app.command("policy")(tune_policy_cmd)
app.add_typer(tune_app, name="tune")
app.add_typer(experiment_app, name="experiment")
app.add_typer(retry_app, name="retry")
app.add_typer(fit_app, name="fit")
app.add_typer(sidecar_app, name="sidecar")
app.add_typer(forecast_app, name="forecast")
app.add_typer(simulate_app, name="simulate")
app.command("predict")(predict_cmd)
gateway_app = typer.Typer(help="The SLO gateway: serve (no command), or manage a running one.")
gateway_app.callback(invoke_without_command=True)(gateway_cmd)
add_gateway_admin(gateway_app)
app.add_typer(gateway_app, name="gateway")
app.command("gateway-passwd")(gateway_passwd_cmd)


def _version(value: bool) -> None:
    if value:
        from sloctl._cli_common import package_version

        typer.echo(f"sloctl {package_version()}")
        raise typer.Exit()


@app.callback()
def _sloctl(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                 help="Print sloctl's version (from the installed package) and exit."),
) -> None:
    """Learn how a service fleet behaves under load, then control it to meet latency SLOs."""


JsonOption = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


@warehouse_app.command("generate")
def warehouse_generate(
    benchmark: str = typer.Option("tpch", help="tpch or tpcds."),
    sf: float = typer.Option(0.1, "--sf", help="TPC scale factor."),
    data_dir: Path | None = typer.Option(None, help="Where databases live (config: warehouse.data_dir)."),
    as_json: bool = JsonOption,
    config: Path | None = ConfigOption,
) -> None:
    """Generate a TPC database once (reused by later runs)."""
    import json

    from sloctl.datasets.tpc import ensure_database

    cfg = load_cli_config(config)
    path = ensure_database(benchmark, sf, data_dir or cfg.warehouse.data_dir, log=echo)
    typer.echo(json.dumps({"benchmark": benchmark, "scale_factor": sf, "path": str(path)}) if as_json else str(path))


@warehouse_app.command("templates")
def warehouse_templates(benchmark: str = typer.Option("tpch", help="tpch or tpcds."),
                        as_json: bool = JsonOption) -> None:
    """List the benchmark's query templates."""
    import json

    from sloctl.datasets.tpc import load_templates

    if as_json:
        typer.echo(json.dumps([{"name": t.name, "sql": t.sql} for t in load_templates(benchmark)]))
        return
    for template in load_templates(benchmark):
        first = " ".join(template.sql.split())[:70]
        typer.echo(f"{template.name}\t{first}")


@app.command("collect")
def collect_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Query log to write (Parquet)."),
    benchmark: str | None = typer.Option(None, help="tpch or tpcds (config: collect.benchmark)."),
    sf: float | None = typer.Option(None, "--sf", help="Scale factor (config: collect.scale_factor)."),
    sizes: str | None = typer.Option(None, help="Cluster sizes in units of CPU budget "
                                      "(warehouse.size_unit_cores, default 0.25 core), e.g. 1,2,4; each runs "
                                      "the workload in turn."),
    workload: str | None = typer.Option(None, help="base, phased, isolated or contour; several, comma-separated "
                                         "(e.g. isolated,base), run in turn and written as one merged log."),
    rate: float | None = typer.Option(None, help="Arrival rate λ per second (base)."),
    copies: int | None = typer.Option(None, help="Copies of every template."),
    seed: int | None = typer.Option(None, help="Seed of the workload."),
    templates: str | None = typer.Option(None, help="Only these templates, e.g. tpch-q01,tpch-q06."),
    timeout_s: float | None = typer.Option(None, help="Per-query timeout (config: warehouse.query_timeout_s)."),
    warmup_s: float | None = typer.Option(None, help="Warm-up added to each spin-up."),
    allow_oversubscribe: bool = typer.Option(False, help="Let CPU budgets (or pinned cores) exceed the cluster "
                                             "cores; every affected row is marked."),
    data_dir: Path | None = typer.Option(None, help="Where databases live."),
    force: bool = ForceOption,
    as_json: bool = JsonOption,
    config: Path | None = ConfigOption,
) -> None:
    """Run a workload (or several in turn) on DuckDB clusters of the given sizes and write the query log."""
    import json

    import numpy as np

    from sloctl.datasets.tpc import ensure_database, load_templates
    from sloctl.datasets.workloads import build_workload

    cfg = load_cli_config(config)
    out_mode = check_out(out, "log", force)
    wcfgs = _workload_configs(cfg, workload, {"rate_per_s": rate, "copies": copies, "seed": seed})
    bench = benchmark or cfg.collect.benchmark
    scale = sf if sf is not None else cfg.collect.scale_factor
    size_list = parse_sizes(sizes) if sizes else cfg.collect.sizes
    db = ensure_database(bench, scale, data_dir or cfg.warehouse.data_dir, log=echo)
    chosen = load_templates(bench, templates.split(",") if templates else None)
    workloads = [build_workload(wcfg, chosen) for wcfg in wcfgs]
    for wl in workloads:
        echo(f"Workload {wl.name}: {len(wl)} queries from {len(chosen)} templates "
             f"over {wl.duration_s:.1f} s, on sizes {list(size_list)}.")
    results = _run_workloads(db, workloads, size_list, cfg, timeout_s=timeout_s, warmup_s=warmup_s,
                             allow_oversubscribe=allow_oversubscribe)
    run_meta = {"benchmark": bench, "scale_factor": scale, "sizes": ",".join(map(str, size_list)),
                "size_unit_cores": str(cfg.warehouse.size_unit_cores),
                "reserved_cores": str(cfg.warehouse.reserved_cores), **results[0].metadata(), "dialect": "duckdb",
                **_warehouse_catalog(db)}
    log = _write_collected(results, workloads, out, run_meta)
    status = log["status"].value_counts().to_dict()
    lags = np.asarray([lag for result in results for lag in result.dispatch_lag_s]) * 1000
    keep_mode(out, out_mode)
    lag_ms = {"p50": float(np.percentile(lags, 50)), "p99": float(np.percentile(lags, 99))} if len(lags) else None
    if as_json:
        typer.echo(json.dumps({"out": str(out), "rows": len(log), "status": {str(k): int(v) for k, v in status.items()},
                               "dispatch_lag_ms": lag_ms}))
        return
    lag_text = f"; dispatch lag p50 {lag_ms['p50']:.2f} ms, p99 {lag_ms['p99']:.2f} ms" if lag_ms else ""
    typer.echo(f"Wrote {len(log)} rows to {out} (status {status}){lag_text}.")


def _workload_configs(cfg, workload: str | None, overrides: dict) -> list:
    """One workload config per ``--workload`` kind, with the given overrides (``None``: the config's)."""
    import dataclasses

    overrides = {k: v for k, v in overrides.items() if v is not None}
    kinds = [kind.strip() for kind in workload.split(",")] if workload is not None else [cfg.workload.kind]
    for kind in kinds:
        if kind not in ("base", "phased", "isolated", "contour"):
            raise typer.BadParameter(f"expected base, phased, isolated or contour (several: comma-separated); "
                                     f"got {kind!r}", param_hint="--workload")
    return [dataclasses.replace(cfg.workload, **overrides, kind=kind) for kind in kinds]


def _run_workloads(db, workloads: list, size_list, cfg, *, timeout_s: float | None, warmup_s: float | None,
                   allow_oversubscribe: bool) -> list:
    """Each workload on clusters of ``size_list``, in turn, with one progress bar per cluster."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sloctl.datasets.collect import collect

    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=False, console=Console(stderr=True)) as progress:
        tasks = {}
        for wl in workloads:
            label = f"{wl.name} " if len(workloads) > 1 else ""

            def on_progress(cluster_id: str, done: int, total: int, label: str = label) -> None:
                if label + cluster_id not in tasks:
                    tasks[label + cluster_id] = progress.add_task(label + cluster_id, total=total)
                progress.update(tasks[label + cluster_id], completed=done)

            results.append(collect(
                db, wl, size_list,
                timeout_s=timeout_s if timeout_s is not None else cfg.warehouse.query_timeout_s,
                warmup_s=warmup_s if warmup_s is not None else cfg.warehouse.warmup_s,
                allow_oversubscribe=allow_oversubscribe or cfg.warehouse.allow_oversubscribe,
                on_progress=on_progress, log=progress.console.print,
                pool_options=cfg.warehouse.pool_options()))
    return results


def _warehouse_catalog(db) -> dict[str, str]:
    """The warehouse's table statistics as log metadata (what the text and catalog features were built from)."""
    from sloctl.core.errors import QueryLogError
    from sloctl.datasets.sql_features import CATALOG_KEY, catalog_metadata, load_catalog

    try:
        return {CATALOG_KEY: catalog_metadata(load_catalog(db))}
    except QueryLogError as exc:  # a database another process holds open for writing: the log still is one
        echo(f"note: the log records no catalog ({exc})")
        return {}


def _write_collected(results: list, workloads: list, out: Path, run_meta: dict):
    """Write the collected log (several workloads: merged) with its metadata; returns it."""
    from sloctl.datasets.querylog import write_log

    if len(workloads) == 1:
        log, wl = results[0].log, workloads[0]
        write_log(log, out, metadata={**run_meta, "workload": wl.name, "workload_params": wl.params,
                                      "time_compression": wl.time_compression})
    else:
        log, metadata = _merge_workloads(results, workloads, run_meta)
        write_log(log, out, metadata=metadata)
    return log


def _merge_workloads(results, workloads, run_meta: dict) -> tuple:
    """One log from the runs of several workloads, merged as ``sloctl log merge`` does, and its metadata.

    Each workload's run is one input of :func:`~sloctl.datasets.merge.merge_logs`
    (ids renumbered, clocks end to end, clusters prefixed ``r0/``, ``r1/`` in
    the order of ``--workload``); ``workload`` lists the kinds, comma-separated.
    """
    import json

    from sloctl.datasets.merge import merge_logs

    parts = [{**{k: str(v) for k, v in run_meta.items()}, "workload": wl.name,
              "workload_params": json.dumps(wl.params, default=str), "time_compression": str(wl.time_compression)}
             for wl in workloads]
    log, metadata = merge_logs([result.log for result in results], metadata=parts)
    compressions = sorted({str(wl.time_compression) for wl in workloads})
    return log, {**metadata, **run_meta, "workload": ",".join(wl.name for wl in workloads),
                 "workload_params": json.dumps([wl.params for wl in workloads], default=str),
                 "time_compression": ",".join(compressions)}


@import_app.command("redset")
def import_redset_cmd(
    file: Path = typer.Argument(..., help="Redset Parquet or CSV file."),
    out: Path = typer.Option(..., "--out", "-o", help="Query log to write."),
    default_size: int = typer.Option(1, help="cluster_size for rows without one (serverless)."),
    instance: int | None = typer.Option(None, help="Only this instance_id."),
    limit: int | None = typer.Option(None, help="Only the first N arrivals."),
    force: bool = ForceOption,
    as_json: bool = JsonOption,
) -> None:
    """Map per-query Redset rows onto the query-log schema (see docs/querylog.md)."""
    import json

    from sloctl.datasets.querylog import write_log
    from sloctl.datasets.redset import import_redset

    if not file.is_file():
        raise typer.BadParameter(f"no such file: {file}", param_hint="FILE")
    out_mode = check_out(out, "log", force)
    log, skipped = import_redset(file, default_size=default_size, instance=instance, limit=limit)
    write_log(log, out, metadata={"source": f"redset:{file.name}"})
    keep_mode(out, out_mode)
    if as_json:
        typer.echo(json.dumps({"out": str(out), "rows": len(log), "skipped": int(skipped)}))
        return
    typer.echo(f"Wrote {len(log)} rows to {out}; skipped {skipped} rows with missing times.")


@import_app.command("executions")
def import_executions_cmd(
    source: Path = typer.Argument(..., help="An engine's execution history: a file, or a folder of them."),
    out: Path = typer.Option(..., "--out", "-o", help="Query log to write."),
    fmt: str | None = typer.Option(None, "--format", help="csv, parquet, trino-events, snowflake, redshift or "
                                   "postgres-csvlog (default: detected from the file)."),
    dialect: str | None = typer.Option(None, help="sqlglot dialect of the SQL (default: the format's)."),
    catalog: Path | None = typer.Option(None, help="Table statistics CSV (table, rows, optional bytes)."),
    sizes: Path | None = typer.Option(None, help="Cluster sizes CSV (cluster, from, to, size) for logs without "
                                      "sizes."),
    size: int | None = typer.Option(None, help="Size of every cluster the log or --sizes does not size."),
    status_map: str | None = typer.Option(None, help="Canonical form: status values to ok/timeout/error, e.g. "
                                          "SUCCESS=ok,FAILED_WITH_ERROR=error."),
    statement_timeout_s: float | None = typer.Option(None, help="postgres-csvlog: a timed-out statement with no "
                                                     "logged start started this long before its ERROR line."),
    slots: Path | None = typer.Option(None, help="redshift: STL_WLM_QUERY export (query, slot_count)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what was understood; write nothing."),
    force: bool = ForceOption,
    as_json: bool = JsonOption,
) -> None:
    """Map executions from Trino, Snowflake, Redshift, PostgreSQL or the canonical CSV onto the query-log schema.

    Every row read is imported, censored (timeouts, cancellations) or refused
    with a reason; see docs/querylog.md, "Importing executions".
    """
    import json
    import time

    from sloctl.datasets.executions import import_executions
    from sloctl.datasets.querylog import write_log

    if not source.exists():
        raise typer.BadParameter(f"no such file or folder: {source}", param_hint="FILE")
    for option, path in (("--catalog", catalog), ("--sizes", sizes), ("--slots", slots)):
        if path is not None and not path.is_file():
            raise typer.BadParameter(f"no such file: {path}", param_hint=option)
    if size is not None and size < 1:
        raise typer.BadParameter(f"must be >= 1, got {size}", param_hint="--size")
    out_mode = None if dry_run else check_out(out, "log", force)
    last = [time.monotonic()]

    def progress(rows: int, file: str) -> None:
        if time.monotonic() - last[0] >= 5.0:
            last[0] = time.monotonic()
            echo(f"import executions: {rows} rows read ({file})")

    result = import_executions(source, format=fmt, dialect=dialect, catalog=catalog, sizes=sizes, size=size,
                               status_map=status_map, statement_timeout_s=statement_timeout_s, slots=slots,
                               progress=progress)
    report = result.report
    if not dry_run:
        write_log(result.log, out, metadata=result.metadata)
        keep_mode(out, out_mode)
    if as_json:
        typer.echo(json.dumps({"out": None if dry_run else str(out), "dry_run": dry_run, "rows": len(result.log),
                               **report.to_dict()}, default=str))
    else:
        typer.echo(_import_summary(report, len(result.log), out, dry_run))


def _import_summary(report, rows: int, out: Path, dry_run: bool) -> str:
    """What an import read, kept, censored and refused, how columns and time were understood."""
    lines = [f"{report.format} ({report.dialect} SQL), {len(report.files)} file(s): read {report.read}, imported "
             f"{report.imported}, censored {report.censored} (timeouts), refused {report.refused}"]
    lines += [f"  refused {v['count']}: {k} (first: row {v['first_row']} of {v['file']})"
              for k, v in report.refusals.items()]
    lines += ["  columns: " + "; ".join(f"{k} -> {v}" for k, v in report.columns_mapped.items()),
              f"  time: {report.timezone}",
              f"  features: {report.feature_source}; unparseable SQL: {report.parse_failures['rows']} rows "
              f"({report.parse_failures['fingerprints']} fingerprints)"]
    lines += [f"  cluster {name}: {c['queries']} queries, at most {c['max_concurrent']} at once, "
              f"{c['mean_concurrent']:.2f} on average" for name, c in report.concurrency.items()]
    lines.append("dry run: nothing written." if dry_run else f"Wrote {rows} rows to {out}.")
    return "\n".join(lines)


@log_app.command("validate")
def log_validate(file: Path = typer.Argument(..., help="Query log (Parquet)."), as_json: bool = JsonOption) -> None:
    """Check a log against the schema; exit 2 naming the first bad column/row."""
    import json

    from sloctl.datasets.querylog import read_log

    df = read_log(file)
    if as_json:
        typer.echo(json.dumps({"file": str(file), "valid": True, "rows": len(df)}))
        return
    typer.echo(f"{file}: valid query log, {len(df)} rows.")


@log_app.command("summary")
def log_summary(file: Path = typer.Argument(..., help="Query log (Parquet)."),
                as_json: bool = typer.Option(False, "--json", help="Print one JSON object per template and size "
                                             "(a list; latencies in seconds, NaN as null) on stdout.")) -> None:
    """Per-template isolated latency, latency under concurrency, and slowdown."""
    from sloctl.datasets.analysis import template_summary
    from sloctl.datasets.querylog import read_log

    summary = template_summary(read_log(file))
    if as_json:
        typer.echo(summary.to_json(orient="records"))
        return
    _print_summary(summary)


@log_app.command("merge")
def log_merge(
    files: list[Path] | None = typer.Argument(None, help="Query logs (Parquet), or folders of them (their *.parquet, "
                                              "sorted), in run order.", show_default=False, metavar="FILES"),
    out: Path = typer.Option(..., "--out", "-o", help="Merged query log to write; never one of the inputs."),
    gap_s: float = typer.Option(DEFAULT_GAP_S, "--gap-s", help="Idle seconds between one run's last end_s and the "
                                "next run's first arrival."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary of the merge on stdout."),
    force: bool = ForceOption,
) -> None:
    """Merge the logs of separate runs into one: ids renumbered, clocks end to end, clusters kept apart.

    The inputs become runs 0, 1, ... (a run column; cluster ids prefixed r0/,
    r1/, ...); the merged file's metadata records each input (docs/querylog.md).
    """
    import json
    import os

    from sloctl.datasets.merge import merge_logs
    from sloctl.datasets.querylog import write_log

    if not gap_s >= 0 or gap_s == float("inf"):
        raise typer.BadParameter(f"must be a finite number >= 0; got {gap_s}", param_hint="--gap-s")
    inputs = log_files(files or [], "FILES")
    if out.is_dir():
        raise QueryLogError(f"--out {out}: is a folder; name the merged log's file.")
    for path in inputs:
        if out.resolve() == path.resolve() or (out.exists() and os.path.samefile(out, path)):
            raise QueryLogError(f"--out {out}: is also an input ({path}); refusing to overwrite an input.")
    out_mode = check_out(out, "log", force)
    try:
        log, metadata = merge_logs(inputs, gap_s=gap_s)
    except QueryLogError as exc:
        raise QueryLogError(f"FILES {' '.join(str(exc).split())}") from exc
    write_log(log, out, metadata=metadata)
    runs = [{k: run[k] for k in ("run", "path", "rows", "offset_s", "first_query_id", "cluster_prefix")}
            for run in json.loads(metadata["merged_from"])]
    keep_mode(out, out_mode)
    (echo if as_json else typer.echo)(f"Merged {len(runs)} logs ({len(log)} rows) into {out}: runs laid end to end "
                                      f"{gap_s:g} s apart, clusters prefixed r0/..r{len(runs) - 1}/.")
    if as_json:
        typer.echo(json.dumps({"out": str(out), "rows": len(log), "gap_s": gap_s,
                               "plan_feature_version": metadata["plan_feature_version"], "runs": runs}))


def _print_summary(summary, *, err: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Latency by template and cluster size (ok rows)",
                  caption="iso: median alone; n: runs with neighbours; med/p95: their latency; "
                          "slow: med/iso; nbrs: mean neighbours")
    for column in ("template", "size", "iso ms", "n", "med ms", "p95 ms", "slow", "nbrs"):
        table.add_column(column, justify="left" if column == "template" else "right")

    def ms(value: float) -> str:
        return "-" if value != value else f"{value * 1000:.1f}"

    for row in summary.itertuples():
        table.add_row(row.template, str(row.cluster_size), ms(row.isolated_s), str(row.n_concurrent),
                      ms(row.median_s), ms(row.p95_s),
                      "-" if row.slowdown != row.slowdown else f"{row.slowdown:.2f}x",
                      f"{row.mean_neighbours:.1f}")
    Console(stderr=err).print(table)


@config_app.command("show")
def config_show(config: Path | None = ConfigOption, as_json: bool = JsonOption) -> None:
    """Print the effective configuration (defaults plus the file's changes)."""
    import dataclasses
    import json

    import yaml

    effective = dataclasses.asdict(load_cli_config(config))
    typer.echo(json.dumps(effective, default=str) if as_json else yaml.safe_dump(effective, sort_keys=False))


@app.command("demo")
def demo_cmd(
    config: Path | None = ConfigOption,
    data_dir: Path | None = typer.Option(None, help="Where databases live."),
    train: bool = typer.Option(True, help="Train and register Stage and Iconq+ on the demo log."),
    as_json: bool = typer.Option(False, "--json", help="Print the results (interference summary, files, models, "
                                 "the simulated day, the service run) as one JSON object on stdout; the tables "
                                 "then go to stderr."),
) -> None:
    """Collect a short TPC-H log on sizes 1 and 2, report interference, train and register the models."""
    import json

    from sloctl.demo import run_demo, train_demo_models

    say = echo if as_json else typer.echo  # with --json, the narration is a log
    cfg = load_cli_config(config)
    summary, paths = run_demo(cfg, data_dir=data_dir, log=echo)
    doc: dict = {"summary": json.loads(summary.to_json(orient="records")), "files": [str(p) for p in paths]}
    _print_summary(summary, err=as_json)
    for size, group in summary.groupby("cluster_size"):
        slowdown = group["slowdown"].dropna()
        if len(slowdown):
            say(f"size {size}: median slowdown under concurrency {slowdown.median():.2f}x "
                       f"(max {slowdown.max():.2f}x) over {len(slowdown)} templates")
    for path in paths:
        say(f"wrote {path}")
    if train:
        rows = train_demo_models(cfg, paths[0], log=echo)
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Latency models on held-out demo queries (Q-error)")
        for column in ("model", "version", "champion", "p50", "p90", "p95", "with neighbours p90"):
            table.add_column(column, justify="left" if column == "model" else "right")
        for row in rows:
            table.add_row(row["model"], row["version"], "yes" if row["champion"] else "no",
                          *(f"{row[f'test_{s}']:.3f}" for s in ("p50", "p90", "p95")),
                          f"{row['test_concurrent_p90']:.3f} (n={row['n_test_concurrent']:.0f})")
        Console(stderr=as_json).print(table)
        say(f"models registered in {cfg.registry.tracking_uri} "
            "(try: sloctl evaluate predictor --log reports/demo_log.parquet --json)")
        doc["models"] = rows
        doc["day"] = _simulated_day(cfg, paths[0], as_json)
        doc["service"] = _serve_briefly(cfg, paths[0], as_json)
    if as_json:
        typer.echo(json.dumps(doc, default=str))


def _serve_briefly(cfg, log_path: Path, as_json: bool = False) -> dict:
    """The demo's coda: start the runtime on a loopback port and route the demo workload through it."""
    import dataclasses
    import secrets
    import tempfile

    from sloctl.datasets.querylog import read_log
    from sloctl.serving.controller import load_templates_table
    from sloctl.serving.local import LocalServer, replay_log
    from sloctl.serving.runtime.app import create_app

    echo("Starting `sloctl serve` briefly and routing the demo workload through it ...")
    token = secrets.token_hex(8)
    with tempfile.TemporaryDirectory() as tmp:
        run_cfg = dataclasses.replace(cfg, serve=dataclasses.replace(cfg.serve, state_db=str(Path(tmp) / "s.db")))
        app_ = create_app(run_cfg, token=token, templates=load_templates_table(log_path), watch=False)
        with LocalServer(app_) as client:
            result = replay_log(client, read_log(log_path), token=token, duration_s=3.0)
            (echo if as_json else typer.echo)(f"service at {client.base_url}: routed {result['queries']} queries with "
                       f"{'/'.join(result['models'])} ({result['per_cluster']}); decision time p50 "
                       f"{result['decision_ms_p50']:.2f} ms, p99 {result['decision_ms_p99']:.2f} ms; VR "
                       f"{result['violation_rate']:.3f}, cost {result['total_cost']:.1f}")
    return result


def _simulated_day(cfg, log_path: Path, as_json: bool = False) -> dict:
    """The demo's last act: a routed and autoscaled day in the emulated warehouse."""
    from rich.console import Console
    from rich.table import Table

    from sloctl._cli_common import load_cli_model
    from sloctl.datasets.querylog import read_log
    from sloctl.simulation.day import plot_day, simulated_day

    echo("Simulating a compressed day: round-robin on two clusters vs Queue@N vs AutoSLO autoscaling ...")
    predictor = load_cli_model("models:/iconq@champion", cfg)
    frame = read_log(log_path)
    router = cli_router(cfg, predictor, frame)
    day = simulated_day(frame, predictor, slo_margin=router.slo_margin, cost_tolerance=router.cost_tolerance,
                        guard=router.guard, violation_spread=router.violation_spread, seed=cfg.demo.seed)
    table = Table(title=f"A simulated day: {day['queries']} queries ({day['contour']} contour), emulated warehouse")
    for column in ("approach", "VR", "cost", "spin-ups", "teardowns"):
        table.add_column(column, justify="left" if column == "approach" else "right")
    for name, r in day["results"].items():
        table.add_row(name, f"{r['vr']:.3f}", f"{r['cost']:.1f}", str(r["spin_ups"]), str(r["tear_downs"]))
    Console(stderr=as_json).print(table)
    plot = plot_day(day, Path(cfg.demo.reports_dir) / "demo_day.png")
    (echo if as_json else typer.echo)(f"wrote {plot}")
    return {"queries": day["queries"], "contour": day["contour"], "results": day["results"], "plot": str(plot)}


@app.command("serve")
def serve_cmd(
    port: int | None = typer.Option(None, help="Port (default: serve.port in the config, 8080)."),
    host: str | None = typer.Option(None, help="Address (default: serve.host, 127.0.0.1)."),
    templates_log: Path | None = typer.Option(None, help="Query log giving each template's plan features "
                                              "(default: serve.templates_log)."),
    insecure: bool = typer.Option(False, help="Allow starting without a token (mutating endpoints open)."),
    state_url: str | None = typer.Option(None, help="Where runtime state lives (default: state.url; none: the "
                                         "SQLite file serve.state_db). redis://HOST:PORT/DB: shared by replicas "
                                         "(docs/scale-out.md)."),
    config: Path | None = ConfigOption,
) -> None:
    """The controller runtime: routing, admission and retry budgets over HTTP (see docs/serving.md)."""
    import dataclasses
    import os

    from sloctl.serving.runtime.server import run_runtime

    cfg = load_cli_config(config)
    if state_url is not None:
        from sloctl.config import StateSection

        try:
            cfg = dataclasses.replace(cfg, state=StateSection(url=state_url, key_prefix=cfg.state.key_prefix))
        except ConfigError as exc:
            raise typer.BadParameter(str(exc).removeprefix("key 'state.url' "), param_hint="--state-url") from None
    token = os.environ.get("SLOCTL_TOKEN") or cfg.serve.token
    if not token and not insecure:
        raise typer.BadParameter("no bearer token: set SLOCTL_TOKEN or serve.token in the config "
                                 "(or pass --insecure for a local experiment)", param_hint="--insecure")
    port = cfg.serve.port if port is None else port
    if not 0 < port < 65536:
        raise typer.BadParameter(f"must be in 1..65535; got {port}", param_hint="--port")
    host = host or cfg.serve.host
    sock = bind_port(host, port)  # before anything is loaded or announced: a taken port is exit 2, one line
    run_runtime(cfg, token=token or None, sock=sock, host=host, port=port, templates_log=templates_log, say=echo)


@app.command("run-live")
def run_live_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help="Query log: templates, SLO references and plan "
                                   f"features. {SEVERAL_LOGS_HELP}"),
    url: str | None = typer.Option(None, help="The running service (default: http://serve.host:serve.port)."),
    model: str = typer.Option("models:/iconq@champion", help="Model the local autoscaler plans with."),
    db: Path | None = typer.Option(None, help="TPC-H database the log was collected on (default: SF 1)."),
    load: float = typer.Option(0.85, help="Offered load, x one size-1 cluster's capacity."),
    kappa: float = typer.Option(2.0, help="SLO = kappa x the template's reference latency."),
    copies: int = typer.Option(2, help="Copies of every template in the workload."),
    seed: int = typer.Option(0),
    autoscale: bool = typer.Option(True, help="Run the AutoSLO autoscaler (real spin-ups)."),
    warmup_s: float = typer.Option(1.0, help="Warm-up added to every real spin-up."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write the placement timeline (each query on its "
                                     "cluster over time, SLO misses in red, spin-ups marked) to this PNG "
                                     "(e.g. reports/run-live.png)."),
    as_json: bool = typer.Option(False, "--json"),
    config: Path | None = ConfigOption,
) -> None:
    """Replay a workload on live DuckDB clusters, every query routed by a running `sloctl serve`."""
    import json
    import os

    from sloctl._cli_common import load_cli_model
    from sloctl._cli_experiments import _live_db
    from sloctl.serving.live import run_live_through_service

    cfg = load_cli_config(config)
    if load <= 0 or kappa <= 0 or copies < 1:
        raise typer.BadParameter("--load and --kappa must be > 0 and --copies >= 1")
    url = url or f"http://{cfg.serve.host}:{cfg.serve.port}"
    token = os.environ.get("SLOCTL_TOKEN") or cfg.serve.token
    from sloctl.core.progress import progress

    with progress("run-live: queries", total=None) as bar:
        result = run_live_through_service(url, token, _live_db(db, cfg), read_logs(log),
                                          load_cli_model(model, cfg), load=load, kappa=kappa, copies=copies,
                                          seed=seed, autoscale=autoscale, warmup_s=warmup_s,
                                          on_progress=bar.callback())
    if plot is not None:
        from sloctl.plots import plot_placements

        written = plot_placements(result["placements"], plot, events=result["events"],
                                  title=f"run-live through {url}")
        echo(f"wrote {written}")
    if as_json:
        typer.echo(json.dumps(result))
        return
    events = ", ".join(f"{e['event']} at {e['t']:.2f} s" for e in result["events"]) or "no scaling"
    typer.echo(f"{result['queries']} queries routed by {url} ({result['service']['model']}): VR {result['vr']:.3f}, "
               f"cost {result['cost']:.1f} ({events}); the service counts VR "
               f"{result['service']['violation_rate']:.3f}, cost {result['service']['total_cost']:.1f}")


def main() -> None:
    """Entry point: run the CLI; bad input exits 2 with one line ``error: ...`` on stderr.

    The error handling lives in :class:`~sloctl._cli_errors.SloctlGroup` so
    that tests driving ``app`` in-process see the same shape. Set
    ``SLOCTL_DEBUG=1`` to see the full traceback instead.
    """
    app()


if __name__ == "__main__":
    main()
