"""``sloctl tune policy``: parse, call :func:`sloctl.training.day_plan.tune_execution_plan`, print.

The steps (history window, forecasts, time scale, tuning, registration) are
described in :mod:`sloctl.training.day_plan`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sloctl._cli_common import (
    SEVERAL_LOGS_HELP,
    ConfigOption,
    describe_logs,
    echo,
    load_cli_config,
    load_cli_model,
    read_logs_with_metadata,
)

__all__ = ["check_history", "tune_policy_cmd"]

DEFAULT_LOG = Path("reports") / "demo_log.parquet"


def check_history(path: Path) -> None:
    """Refuse, before any work, a ``--history`` that is missing or not readable as what it claims to be.

    A ``.parquet`` or ``.csv`` file must hold ``timestamp`` and ``query_count``
    columns (Redset's hourly layout); anything else must be a Reservoir SQLite
    file (a ``meta`` table).

    Raises:
        typer.BadParameter: one line naming ``--history``, the file and what is wrong with it.
    """
    import sqlite3
    from contextlib import closing

    def bad(why: str) -> typer.BadParameter:
        return typer.BadParameter(f"{path}: {' '.join(why.split())}", param_hint="--history")

    if not path.is_file():
        raise bad("no such file (a Reservoir SQLite file, or hourly counts as Parquet/CSV)")
    if path.suffix in (".parquet", ".csv"):
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            columns = (pq.read_schema(path).names if path.suffix == ".parquet"
                       else list(pd.read_csv(path, nrows=5).columns))
        except (OSError, ValueError, UnicodeDecodeError, pa.ArrowException) as exc:
            raise bad(f"not a readable {path.suffix[1:]} file ({exc})") from None
        missing = [c for c in ("timestamp", "query_count") if c not in columns]
        if missing:
            raise bad(f"hourly counts need columns timestamp and query_count; {', '.join(missing)} missing")
        return
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            con.execute("SELECT value FROM meta LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        raise bad(f"not a Reservoir SQLite file ({exc}); hourly counts must end in .parquet or .csv") from None


def tune_policy_cmd(
    history: Path = typer.Option(..., "--history", help="Reservoir SQLite file, or Redset-style hourly counts "
                                                        "(Parquet/CSV: instance_id, timestamp, query_count)."),
    days: int = typer.Option(7, "--days", min=1, help="Days of history before the target day to forecast from."),
    target_date: str | None = typer.Option(None, "--target-date", help="Day to plan (YYYY-MM-DD; default: the "
                                                                       "day after the history)."),
    instance: int | None = typer.Option(None, "--instance", help="Hourly file: the instance_id (default: the "
                                                                 "one with the most hours)."),
    strategy: str = typer.Option("adaptive", "--strategy", help="grid, random, coordinate, adaptive or optuna."),
    budget: int = typer.Option(12, "--budget", min=1, help="Knob configurations simulated on training forecasts."),
    top_k: int = typer.Option(3, "--top-k", min=1, help="Best configurations re-run on validation forecasts."),
    log: list[Path] = typer.Option([DEFAULT_LOG], "--log", "-l", help="Real query log: calibrates the emulated "
                                   f"warehouse and gives SLOs. {SEVERAL_LOGS_HELP}"),
    model: str | None = typer.Option(None, "--model", help="Latency model for the Iconq+ router (then the "
                                                           "autoscaler's knobs are tuned); default: round-robin."),
    seed: int = typer.Option(0, help="Seed of forecasts, search and simulation."),
    workers: int | None = typer.Option(None, help="Simulation processes (default: all cores)."),
    ray: bool = typer.Option(False, "--ray", help="Simulate on Ray instead of local processes: on the cluster at "
                             "ADDRESS when one follows (ray://head:10001, auto), else on a Ray cluster of this "
                             "machine (--workers CPUs). Same result for a seed. Needs the ray extra of sloctl."),
    ray_address: str | None = typer.Argument(None, metavar="ADDRESS", show_default=False,
                                             help="The Ray cluster of --ray (default: one on this machine)."),
    register: bool = typer.Option(True, help="Register as 'execution-config' (alias champion) in MLflow."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    config: Path | None = ConfigOption,
) -> None:
    """Forecast the day ahead, tune the autoscaler knobs and scheduled spin-ups, register the result."""
    from sloctl.core.progress import progress
    from sloctl.training.day_plan import tune_execution_plan

    _check_inputs(strategy, history, log)
    address = _ray_address(ray, ray_address)
    cfg = load_cli_config(config)
    frame, log_metadata = read_logs_with_metadata(log)
    predictor = None if model is None else load_cli_model(model, cfg)
    # cells: one configuration on one forecast; the total grows as the tuner asks for batches
    with progress(f"tune policy ({'ray' if ray else 'processes'}): simulations") as bar:
        summary = tune_execution_plan(history, frame, days=days, target_date=target_date, instance=instance,
                                      predictor=predictor, strategy=strategy, budget=budget, top_k=top_k, seed=seed,
                                      workers=workers, tracking_uri=cfg.registry.tracking_uri,
                                      experiment=cfg.registry.experiment, register=register,
                                      log_path=describe_logs(log), log_metadata=log_metadata,
                                      on_progress=bar.callback(), ray_address=address)
    if as_json:
        typer.echo(json.dumps(summary, default=float))
    else:
        _print_plan(summary, days, cfg.registry.tracking_uri)


def _check_inputs(strategy: str, history: Path, logs: list[Path]) -> None:
    from sloctl.training.policy_tuner import STRATEGIES

    if strategy not in STRATEGIES:
        raise typer.BadParameter(f"expected one of {', '.join(STRATEGIES)}; got {strategy!r}",
                                 param_hint="--strategy")
    check_history(history)
    for path in logs:
        if not path.exists():
            raise typer.BadParameter(f"no such log {path} (run `make demo`, or name one)", param_hint="--log")


def _ray_address(ray: bool, ray_address: str | None) -> str | None:
    """``--ray [ADDRESS]`` as ``simulate_batch`` takes it: ``None`` (processes), ``"local"`` or the address."""
    if ray_address is not None and not ray:
        raise typer.BadParameter(f"a Ray address needs --ray before it; got {ray_address!r}",
                                 param_hint="ADDRESS")
    if ray:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise typer.BadParameter("Ray is not installed: pip install 'sloctl[ray]'", param_hint="--ray")
    return (ray_address or "local") if ray else None


def _print_plan(summary: dict, days: int, tracking_uri: str) -> None:
    from sloctl.control.policies import ExecutionPlan

    p = summary["predicted"]
    spinups = ", ".join(f"size {s['size']} at {s['real_time']}" for s in summary["spinups"]) or "none"
    typer.echo(f"target {summary['target_date']} from {days} days ({summary['history'].get('instance', 'reservoir')})"
               f": start clusters {summary['start_sizes']}, scheduled spin-ups: {spinups}")
    typer.echo(f"knobs {summary['knobs']}; validation VR {p['validation_vr']:.3f} cost {p['validation_cost']:.1f} "
               f"({summary['evaluated']} configurations, {summary['simulations']} simulations, "
               f"{summary['wall_s']:.1f} s)")
    if "version" in summary:
        echo(f"registered {ExecutionPlan.kind} v{summary['version']} (alias champion) in {tracking_uri}")
