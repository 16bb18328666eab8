"""``sloctl sidecar ...``: Envoy sidecars that take their retry budgets from a running ``sloctl serve``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

from sloctl._cli_common import ForceOption, check_out, echo, keep_mode

__all__ = ["sidecar_app"]

sidecar_app = typer.Typer(help="Envoy sidecars: fetch retry budgets from `sloctl serve`, write RDS bootstraps.",
                          no_args_is_help=True)

# What to check, by the HTTP status a failed sync got (None: the server was not reached).
_HINTS = {None: "is `sloctl serve` running at --server?", 401: "check --token (or $SLOCTL_TOKEN)",
          403: "check --token (or $SLOCTL_TOKEN)", 422: "check --service"}


class _EchoHandler(logging.Handler):
    """Log records on stderr through typer (so they follow whatever stderr is now, as under CliRunner)."""

    def emit(self, record: logging.LogRecord) -> None:
        echo(self.format(record))


def _fail(message: str) -> typer.Exit:
    echo(f"error: {message}")
    return typer.Exit(2)


def _sync_error(exc: Exception) -> typer.Exit:
    hint = _HINTS.get(exc.status) if hasattr(exc, "status") else None  # a SyncError; a bad answer has none
    return _fail(f"{exc}" + (f" ({hint})" if hint else ""))


def _describe(result) -> str:
    budgets = ", ".join(f"{name}={k}" for name, k in result.num_retries.items())
    state = "changed: wrote" if result.changed else "unchanged:"
    return f"{result.service} {state} {result.path} ({budgets}); policy {result.source or 'source unknown'}"


@sidecar_app.command("sync")
def sync_cmd(
    server: str = typer.Option(..., "--server", help="The running `sloctl serve`, e.g. http://127.0.0.1:8080."),
    service: str = typer.Option(..., "--service", help="The service this sidecar fronts."),
    rds_file: Path = typer.Option(..., "--rds-file", help="The RDS file Envoy reads its routes from."),
    token: str | None = typer.Option(None, "--token", envvar="SLOCTL_TOKEN", help="Bearer token ($SLOCTL_TOKEN)."),
    network: str | None = typer.Option(None, "--network", help="The network whose budgets to fetch (registered "
                                       "by `sloctl retry optimise -n NETWORK` as retry-policy-NETWORK; default: "
                                       "the server's serve.retry_uri)."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between polls."),
    once: bool = typer.Option(False, "--once", help="Sync once, print what happened and exit."),
    as_json: bool = typer.Option(False, "--json", help="With --once: print what happened as JSON on stdout."),
) -> None:
    """Write the server's Envoy routes for --service to --rds-file whenever they change (Envoy hot-reloads)."""
    import signal
    import threading

    from sloctl.serving.runtime.retry_sync import SyncError, run_sync, sync_once

    if not interval > 0:
        raise typer.BadParameter(f"must be > 0 seconds; got {interval:g}", param_hint="--interval")
    if not server.startswith(("http://", "https://")):
        raise typer.BadParameter(f"expected an http:// or https:// URL; got {server!r}", param_hint="--server")
    if not rds_file.parent.is_dir():
        raise typer.BadParameter(f"directory {str(rds_file.parent)!r} does not exist", param_hint="--rds-file")
    try:
        first = sync_once(server, service, rds_file, token=token, network=network)
        if as_json and once:
            typer.echo(json.dumps({"service": first.service, "changed": first.changed, "path": str(first.path),
                                   "num_retries": first.num_retries, "source": first.source}))
        else:
            typer.echo(_describe(first))
    except (SyncError, ValueError) as exc:
        # A wrong service or token will not fix itself; a server that is down or has no policy yet may
        # (the loop below logs the error and keeps polling).
        if once or not isinstance(exc, SyncError) or exc.status in (401, 403, 422):
            raise _sync_error(exc) from None
    if once:
        return
    logger = logging.getLogger("sloctl.serving.runtime.retry_sync")
    logger.setLevel(logging.INFO)
    if not any(isinstance(h, _EchoHandler) for h in logger.handlers):
        handler = _EchoHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM (a pod stopping) ends the loop cleanly
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    echo(f"syncing {service} from {server} into {rds_file} every {interval:g} s (Ctrl-C to stop)")
    try:
        run_sync(server, {service: rds_file}, interval, stop, token=token, network=network)
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    echo("stopped")


@sidecar_app.command("bootstrap")
def bootstrap_cmd(
    service: str = typer.Option(..., "--service", help="The service this sidecar fronts."),
    listen_port: int = typer.Option(..., "--listen-port", min=1, max=65535, help="Where the sidecar listens."),
    upstream_port: int = typer.Option(..., "--upstream-port", min=1, max=65535, help="Where the service listens."),
    rds_file: Path = typer.Option(..., "--rds-file", help="The RDS file `sloctl sidecar sync` keeps current."),
    out: Path = typer.Option(..., "--out", "-o", help="Bootstrap to write (JSON; `envoy -c OUT`)."),
    admin_port: int | None = typer.Option(None, "--admin-port", min=1, max=65535, help="Envoy's admin port."),
    force: bool = ForceOption,
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON on stdout."),
) -> None:
    """Write an Envoy bootstrap that reads its routes from --rds-file over RDS (updates need no restart)."""
    from sloctl.serving.runtime.retry_sync import bootstrap_from_rds

    if not rds_file.is_file():
        raise _fail(f"the --rds-file {str(rds_file)!r} does not exist yet: run `sloctl sidecar sync --once "
                    f"--server URL --service {service} --rds-file {rds_file}` first (Envoy needs it at start)")
    if not out.parent.is_dir():
        raise typer.BadParameter(f"directory {str(out.parent)!r} does not exist", param_hint="--out")
    out_mode = check_out(out, "envoy-bootstrap", force)
    try:
        bootstrap = bootstrap_from_rds(rds_file, service=service, listen_port=listen_port,
                                       upstream_port=upstream_port, admin_port=admin_port)
    except ValueError as exc:
        raise _fail(f"{exc} (check --service and --rds-file)") from None
    out.write_text(json.dumps(bootstrap, indent=2))
    keep_mode(out, out_mode)
    if as_json:
        typer.echo(json.dumps({"out": str(out), "service": service, "listen_port": listen_port,
                               "upstream_port": upstream_port, "rds_file": str(rds_file.resolve())}))
        return
    typer.echo(f"wrote {out}: 127.0.0.1:{listen_port} -> 127.0.0.1:{upstream_port}, routes from "
               f"{rds_file.resolve()}; start it with `envoy -c {out}`")
