"""``sloctl simulate ...``: query logs of any size from a world calibrated on a real log."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer

from sloctl._cli_common import check_out, echo, keep_mode, log_files, positive, read_logs_with_metadata

__all__ = ["simulate_app"]

simulate_app = typer.Typer(help="Simulated query logs from a world calibrated on a real one.", no_args_is_help=True)


@simulate_app.callback()
def _simulate() -> None:
    """Simulated query logs from a world calibrated on a real one (docs/querylog.md)."""


@simulate_app.command("log")
def simulate_log_cmd(
    world: list[Path] = typer.Option(..., "--world", help="The real query log(s) (collected or imported) whose "
                                     "world is simulated: its templates, service demand per size, interference and "
                                     "arrival pattern. Repeat for several."),
    rows: int = typer.Option(..., "--rows", help="Executions to write."),
    out: Path = typer.Option(..., "--out", "-o", help="Query log to write (Parquet)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every draw (same world, rows and seed: same log)."),
    timeout_s: float | None = typer.Option(None, "--timeout-s", help="Stop executions still running this long "
                                           "after arrival (status timeout: censored rows); default none."),
    demand: str = typer.Option("empirical", "--demand", help="Service demand: 'empirical' (the real log's own "
                               "isolated executions) or 'median' (the median with log-normal noise)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out even if it is not a sloctl query log."),
) -> None:
    """Write a query log of --rows executions drawn from the world of --world, in the collected logs' schema.

    Runs copy the real log's cluster runs (workload, size, template mix,
    arrival rate, admission limit); executions share their cluster by
    processor sharing with the calibrated interference; ``--timeout-s``
    censors. Train on it, never grade on it: a model is graded on a real log.
    """
    from sloctl.datasets.querylog import write_log
    from sloctl.simulation.log_synth import simulate_log

    if rows < 1:
        raise typer.BadParameter(f"must be a whole number >= 1; got {rows}", param_hint="--rows")
    positive(timeout_s=timeout_s)
    if demand not in ("empirical", "median"):
        raise typer.BadParameter(f"must be 'empirical' or 'median'; got {demand!r}", param_hint="--demand")
    paths = log_files(world, "--world")
    mode = check_out(out, "log", force)
    log, world_meta = read_logs_with_metadata(paths, "--world")
    last = [0.0]

    def progress(done: int, total: int, elapsed: float) -> None:
        if elapsed - last[0] >= 5.0 or done == total:
            last[0] = elapsed
            eta = elapsed / done * (total - done) if done else float("nan")
            print(f"simulated {done:,}/{total:,} rows ({done / max(elapsed, 1e-9):,.0f} rows/s, "
                  f"ETA {eta:.0f} s)", file=sys.stderr, flush=True)

    started = time.perf_counter()
    try:
        frame = simulate_log(log, rows, seed=seed, timeout_s=timeout_s, demand=demand, progress=progress)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--world") from None
    from sloctl.training.pipeline import data_hash

    # what the world's own metadata says of the engine and sizes holds for its simulation too
    metadata = {k: v for k, v in world_meta.items()
                if k not in ("schema_version", "plan_feature_version", "merged_from", "workload", "workload_params")}
    metadata |= {"simulated_from": json.dumps([str(p) for p in paths]), "simulated_world_hash": data_hash(log),
                "simulated_seed": str(seed), "simulated_rows": str(rows), "simulated_demand": demand,
                "simulated_timeout_s": "" if timeout_s is None else str(timeout_s),
                "workload": "simulated"}
    write_log(frame, out, metadata=metadata)
    keep_mode(out, mode)
    summary = {"out": str(out), "rows": len(frame), "runs": int(frame["run"].nunique()),
               "timeouts": int((frame["status"] == "timeout").sum()), "world": [str(p) for p in paths],
               "seed": seed, "wall_s": round(time.perf_counter() - started, 2)}
    (echo if as_json else typer.echo)(f"Wrote {len(frame):,} simulated executions ({summary['runs']} cluster runs, "
                                      f"{summary['timeouts']} timeouts) to {out} in {summary['wall_s']} s.")
    if as_json:
        typer.echo(json.dumps(summary))
