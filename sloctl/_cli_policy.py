"""``sloctl tune policy``: forecast the day ahead, tune the execution configuration, register it (AutoSLO §7).

:func:`tune_policy_run` does the work and returns a JSON-ready summary;
:func:`tune_policy_cmd` is the command (registered by ``sloctl.cli`` as
``tune policy``). Steps:

1. History: the last ``days`` days before the target day, from a Reservoir
   SQLite file or a Redset-style hourly file (one instance, loaded into a
   temporary reservoir as contour-only counts).
2. Forecasts: ``n_train + n_validation`` sampled workloads of the target day
   (Forecaster, one seed each); the first ``n_train`` train, the rest validate.
3. Templates: forecast template names that the log lacks (Redset's ``all``)
   are replaced query by query, in arrival order, by the log's templates
   cycled round-robin in a seeded shuffled order, so every template gets an
   equal share.
4. Time: compressed as in ``experiments/day.py`` — an hour lasts ``hour_units``
   mean isolated latencies and the busiest forecast hour offers ``peak_load``
   times one size-1 cluster's capacity (queries are thinned at random when
   the forecast holds more, hours shortened when it holds fewer).
5. Tuning (:func:`~sloctl.training.policy_tuner.tune_policy`): knobs first,
   then scheduled spin-ups on the winner. With the round-robin runner the
   reactive autoscaler cannot run, so the knobs are the starting clusters;
   with ``--model`` (Iconq+ router) they are the autoscaler's.
6. The execution configuration is registered as ``execution-config`` (alias
   ``champion``) with the predicted validation VR and cost, and what it was
   optimised on (:func:`plan_provenance_tags`): the log's provenance as the
   latency models record it (benchmark, scale factor, cluster sizes, log
   hashes: :mod:`sloctl.registry.provenance`) and the history window (file,
   instance, days, dates, hash) as ``provenance.*`` tags; the window's counts
   and the log as MLflow dataset inputs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from sloctl._cli_common import (
    SEVERAL_LOGS_HELP,
    ConfigOption,
    describe_logs,
    echo,
    load_cli_config,
    read_logs_with_metadata,
)

__all__ = ["history_hash", "plan_provenance_tags", "tune_policy_cmd", "tune_policy_run"]

DEFAULT_LOG = Path("reports") / "demo_log.parquet"


def _stored_cap(path: Path) -> int | None:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
        row = con.execute("SELECT value FROM meta WHERE key = 'max_arrivals_per_bin'").fetchone()
    return None if row is None or row[0] == "none" else int(row[0])


def history_reservoir(history: str | Path, days: int, target_date: str | None, folder: Path, *,
                      instance: int | None = None) -> tuple[Any, str, dict[str, Any]]:
    """A temporary reservoir holding only the ``days`` days before the target day.

    Returns:
        ``(reservoir, target date ISO, description)``; the target defaults to
        the day after the history's last date.
    """
    import pandas as pd

    from sloctl.core.errors import WorkloadError
    from sloctl.datasets.reservoir import Reservoir

    path = Path(history)
    if not path.is_file():
        raise WorkloadError(f"The 'history' parameter names no file: {path}.")
    if days < 1:
        raise WorkloadError(f"The 'days' parameter must be >= 1, got {days}.")
    out = Reservoir(folder / "window.sqlite", max_arrivals_per_bin=None)
    info: dict[str, Any] = {"history": str(path)}
    if path.suffix in (".parquet", ".csv"):
        frame = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
        if "instance_id" in frame.columns:
            if instance is None:  # the instance with the most hours of data
                instance = int(frame.groupby("instance_id").size().idxmax())
            frame = frame[frame["instance_id"] == instance]
            info["instance"] = instance
        stamps = pd.to_datetime(frame["timestamp"])
        target = dt.date.fromisoformat(target_date) if target_date else stamps.max().date() + dt.timedelta(days=1)
        first = target - dt.timedelta(days=days)
        keep = (stamps.dt.date >= first) & (stamps.dt.date < target)
        if not keep.any():
            raise WorkloadError(f"The history holds no hour in the {days} days before {target}.")
        out.add_hourly_counts(frame[keep].drop(columns=["instance_id"], errors="ignore"))
    else:
        source = Reservoir(path, max_arrivals_per_bin=_stored_cap(path))
        dates = source.dates()
        if not dates:
            raise WorkloadError(f"The 'history' reservoir {path} holds no date.")
        target = dt.date.fromisoformat(target_date) if target_date else (
            dt.date.fromisoformat(dates[-1]) + dt.timedelta(days=1))
        first = target - dt.timedelta(days=days)
        window = [d for d in dates if first.isoformat() <= d < target.isoformat()]
        if not window:
            raise WorkloadError(f"The history holds no date in the {days} days before {target}.")
        counts, arrivals = source.counts(dates=window), source.arrivals(dates=window)
        # kept offsets become queries with arrival times; the rest of each bin's count is added without
        stamps = (pd.to_datetime(arrivals["date"]) + pd.to_timedelta(arrivals["hour"], unit="h")
                  + pd.to_timedelta(arrivals["offset_s"], unit="s"))
        out.add_queries(pd.DataFrame({"timestamp": stamps, "template": arrivals["template"]}))
        kept = arrivals.groupby(["date", "hour", "template"]).size().rename("kept")
        rest = counts.join(kept, on=["date", "hour", "template"]).fillna({"kept": 0})
        rest = rest.assign(query_count=(rest["count"] - rest["kept"]).astype(int))
        rest = rest[rest["query_count"] > 0]
        if len(rest):
            out.add_hourly_counts(pd.DataFrame({
                "timestamp": pd.to_datetime(rest["date"]) + pd.to_timedelta(rest["hour"], unit="h"),
                "query_count": rest["query_count"], "template": rest["template"]}))
    info.update(target_date=target.isoformat(), first_date=first.isoformat(), days=days)
    return out, target.isoformat(), info


def history_hash(reservoir: Any) -> str:
    """SHA-256 (16 hex digits) of a reservoir's counts and kept arrivals: the history a plan was tuned on."""
    import pandas as pd

    digest = hashlib.sha256()
    for frame in (reservoir.counts(), reservoir.arrivals()):
        digest.update(",".join(frame.columns).encode())
        digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return digest.hexdigest()[:16]


def plan_provenance_tags(provenance: Any, info: Mapping[str, Any], window_hash: str) -> dict[str, str]:
    """The ``provenance.*`` tags of an execution configuration.

    Args:
        provenance: the calibration log's :class:`~sloctl.registry.provenance.Provenance` (benchmark,
            scale factor, cluster sizes, log hashes, log paths), tagged as the latency models tag theirs.
        info: the history window (:func:`history_reservoir`'s description).
        window_hash: :func:`history_hash` of the window.
    """
    from sloctl.registry.provenance import PREFIX

    return {**provenance.to_tags(), f"{PREFIX}history": str(info.get("history", "")),
            f"{PREFIX}history_hash": window_hash, f"{PREFIX}days": str(info.get("days", "")),
            f"{PREFIX}first_date": str(info.get("first_date", "")),
            f"{PREFIX}target_date": str(info.get("target_date", "")),
            **({f"{PREFIX}instance": str(info["instance"])} if "instance" in info else {})}


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


def map_templates(workload: list[tuple[float, str]], templates: list[str], seed: int) -> list[tuple[float, str]]:
    """Replace names the log lacks, query by query, by the log's templates round-robin in a seeded order."""
    import numpy as np

    order = [templates[i] for i in np.random.default_rng(seed).permutation(len(templates))]
    known, out, n = set(templates), [], 0
    for t, name in workload:
        if name in known:
            out.append((t, name))
        else:
            out.append((t, order[n % len(order)]))
            n += 1
    return out


def tune_policy_run(history: str | Path, log: Any, *, days: int = 7, target_date: str | None = None,
                    instance: int | None = None, predictor: Any = None, strategy: str = "adaptive",
                    budget: int = 12, top_k: int = 3, n_train: int = 4, n_validation: int = 2,
                    forecast_policy: str = "decay", hour_units: float = 40.0, peak_load: float = 1.6,
                    kappa: float = 3.0, tau_target: float = 0.05, eta: int = 2, phi: int = 3, seed: int = 0,
                    workers: int | None = None, tracking_uri: str | None = None,
                    experiment: str = "policy-tuner", register: bool = True, log_path: str = "",
                    log_metadata: Mapping[str, str] | None = None, on_progress: Any = None,
                    ray_address: str | None = None) -> dict[str, Any]:
    """Forecast, tune and (optionally) register; returns the JSON-ready summary.

    Args:
        history: a Reservoir SQLite file or a Redset-style hourly Parquet/CSV.
        log: a validated query log (calibrates the emulated warehouse, gives SLOs).
        predictor: a latency predictor for the Iconq+ router; ``None``: round-robin.
        budget: knob configurations the tuner runs on the training forecasts.
        hour_units, peak_load: time compression (see the module docstring).
        kappa: SLO multiplier on each template's isolated latency.
        eta, phi: the scheduler's rounds and attempts per round.
        log_path, log_metadata: the log's path(s) and file metadata (benchmark, scale factor, merged
            runs), recorded as its provenance when registering.
        ray_address: simulate on Ray (``"local"`` or a cluster address; see
            :func:`~sloctl.simulation.batch.simulate_batch`) instead of the
            process pool; the result is the same for a seed.
        on_progress: ``on_progress(done, total)`` after each simulated cell:
            cells done and cells asked for so far (the tuner asks batch by batch).
        Other arguments: see :func:`~sloctl.training.policy_tuner.tune_policy`.
    """
    import numpy as np

    from sloctl.control.policies import ExecutionPlan
    from sloctl.control.router import Query
    from sloctl.control.scheduler import ExecutionConfig
    from sloctl.datasets.forecast import Forecaster
    from sloctl.experiments.warehouse import ScalingExperimentConfig, autoscaler_config, scaling_setup
    from sloctl.simulation.batch import WarehouseRunner, pack_folder, simulate_batch
    from sloctl.training.policy_tuner import SearchSpace, tune_policy

    started = time.perf_counter()
    cfg = ScalingExperimentConfig(seed=seed)
    world, _, slo_ref, templates, mean_iso, table = scaling_setup(log, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        reservoir, target, info = history_reservoir(history, days, target_date, Path(tmp), instance=instance)
        window_hash, window_counts = history_hash(reservoir), reservoir.counts()
        forecaster = Forecaster(reservoir, policy=forecast_policy, seed=seed)
        peak = float(forecaster.hourly_counts(target).max())
        raw = [forecaster.workload(target, seed=seed + j) for j in range(n_train + n_validation)]
        runner_dir = Path(tmp) / "predictor"
        if predictor is not None:
            from sloctl.registry.bundles import save_predictor

            save_predictor(predictor, runner_dir)
        capacity = peak_load * hour_units  # queries one size-1 cluster serves in hour_units mean latencies
        keep_p = min(1.0, capacity / max(peak, 1e-9))
        hour_s = mean_iso * (hour_units if peak >= capacity else peak / peak_load)
        rng = np.random.default_rng([seed, 1])
        workloads = []
        for j, w in enumerate(raw):
            w = [q for q in w if rng.random() < keep_p]
            w = map_templates(w, templates, seed + j)
            workloads.append([Query(i, name, t / 3600.0 * hour_s, kappa * slo_ref[name])
                              for i, (t, name) in enumerate(w)])
        train, validation = workloads[:n_train], workloads[n_train:]

        spinup_delay_s = cfg.spinup_delay_s * mean_iso
        runner = WarehouseRunner(world, minimum_s=cfg.minimum_s * mean_iso, spinup_delay_s=spinup_delay_s,
                                 max_clusters=4, router="iconq" if predictor is not None else "round-robin",
                                 predictor_dir=str(runner_dir) if predictor is not None else None,
                                 table=table if predictor is not None else None,
                                 # Ray workers on other hosts get the model itself, not a path of this one
                                 predictor_bundle=pack_folder(runner_dir) if predictor is not None
                                 and ray_address not in (None, "local") else None)
        sizes = tuple(sorted(set(cfg.start_sizes) | set(cfg.candidate_sizes)))
        if predictor is None:  # round-robin: no reactive autoscaler, tune the starting clusters
            base = ExecutionConfig(start_sizes=(1,))
            space = SearchSpace({"start_clusters": (1, 3, "int"), "start_size": list(sizes)})
        else:
            base = ExecutionConfig(autoscaler=autoscaler_config(cfg, mean_iso, candidate_sizes=sizes))
            u = mean_iso
            space = SearchSpace({"window_s": (5 * u, 40 * u, "log"), "t_idle_s": (10 * u, 100 * u, "log"),
                                 "t_min_lifetime_s": (50 * u, 400 * u, "log"), "theta": (5, 30, "int"),
                                 "tau_trigger": (0.02, 0.3, "float"), "mu": (10, 40, "int")})
        simulations = 0

        def evaluate(configs, wl):
            nonlocal simulations
            before = simulations
            simulations += len(configs) * len(wl)
            cell = None if on_progress is None else (lambda done, _total: on_progress(before + done, simulations))
            return simulate_batch(configs, wl, runner=runner, workers=workers, seed=seed, ray_address=ray_address,
                                  on_progress=cell)

        result = tune_policy(space, evaluate=evaluate, train=train, validation=validation, sizes=sizes,
                             delta_s=spinup_delay_s, base=base, strategy=strategy, budget=budget, top_k=top_k,
                             tau_target=tau_target, seed=seed, eta=eta, phi=phi, sigma_min_s=spinup_delay_s)
    best = result.best
    forecasts = {"train": n_train, "validation": n_validation, "policy": forecast_policy,
                 "queries": [len(w) for w in workloads]}
    data_hash = hashlib.sha256(json.dumps(info, sort_keys=True).encode()
                               + json.dumps(forecasts).encode()).hexdigest()[:16]
    plan = ExecutionPlan(
        config=best, target_date=target, knobs=result.tuning.best_params,
        predicted={"validation_vr": result.best_validation[0], "validation_cost": result.best_validation[1],
                   "knobs_validation_vr": result.tuning.best_validation[0],
                   "knobs_validation_cost": result.tuning.best_validation[1]},
        time_scale={"hour_s": hour_s, "mean_isolated_s": mean_iso, "hour_units": hour_s / mean_iso,
                    "kept_fraction": keep_p},
        router=runner.router, strategy=strategy, budget=budget, order=result.order, forecasts=forecasts,
        history=info, evaluated=result.tuning.evaluated, simulations=simulations,
        trials=tuple({"params": t.params, "train": list(t.train),
                      "validation": list(t.validation) if t.validation else None} for t in result.tuning.trials),
        provenance={"data_hash": data_hash, "seed": str(seed), "source": str(history), "history_hash": window_hash,
                    **({"log": log_path} if log_path else {})})
    # the summary is the document without its trials; "version" is the registered version, if any
    summary = {k: v for k, v in plan.to_doc().items() if k not in ("trials", "version")}
    if register:
        from sloctl.registry.provenance import log_provenance
        from sloctl.registry.store import register_policy

        tags = plan_provenance_tags(log_provenance(log, log_metadata, logs=log_path), info, window_hash)
        inputs = [(window_counts, f"history-{Path(history).stem}", "optimisation"),
                  (log, f"log-{Path(log_path).stem}" if log_path and "," not in log_path else "log", "calibration",
                   log_path if log_path and "," not in log_path else None)]
        params = {"strategy": strategy, "budget": budget, "top_k": top_k, "days": days, "target_date": target,
                  "router": runner.router, "hour_units": round(hour_s / mean_iso, 3), "kappa": kappa,
                  "tau_target": tau_target, "log_path": log_path}
        metrics = {"validation_vr": result.best_validation[0], "validation_cost": result.best_validation[1],
                   "spinups": float(len(best.spinups)), "evaluated": float(result.tuning.evaluated)}
        summary["version"] = register_policy(plan, tracking_uri=tracking_uri or "sqlite:///mlflow.db",
                                             experiment=experiment, params=params, metrics=metrics, tags=tags,
                                             inputs=inputs)
    summary["wall_s"] = time.perf_counter() - started
    return summary


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
    from sloctl.training.policy_tuner import STRATEGIES

    if strategy not in STRATEGIES:
        raise typer.BadParameter(f"expected one of {', '.join(STRATEGIES)}; got {strategy!r}",
                                 param_hint="--strategy")
    check_history(history)
    for path in log:
        if not path.exists():
            raise typer.BadParameter(f"no such log {path} (run `make demo`, or name one)", param_hint="--log")
    cfg = load_cli_config(config)
    frame, log_metadata = read_logs_with_metadata(log)
    predictor = None
    if model is not None:
        from sloctl._cli_common import load_cli_model

        predictor = load_cli_model(model, cfg)
    if ray_address is not None and not ray:
        raise typer.BadParameter(f"a Ray address needs --ray before it; got {ray_address!r}",
                                 param_hint="ADDRESS")
    address = (ray_address or "local") if ray else None
    if ray:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise typer.BadParameter("Ray is not installed: pip install 'sloctl[ray]'", param_hint="--ray")
    from sloctl.core.progress import progress

    # cells: one configuration on one forecast; the total grows as the tuner asks for batches
    with progress(f"tune policy ({'ray' if ray else 'processes'}): simulations") as bar:
        summary = tune_policy_run(history, frame, days=days, target_date=target_date, instance=instance,
                                  predictor=predictor, strategy=strategy, budget=budget, top_k=top_k, seed=seed,
                                  workers=workers, tracking_uri=cfg.registry.tracking_uri,
                                  experiment=cfg.registry.experiment, register=register,
                                  log_path=describe_logs(log), log_metadata=log_metadata,
                                  on_progress=bar.callback(), ray_address=address)
    if as_json:
        typer.echo(json.dumps(summary, default=float))
        return
    p = summary["predicted"]
    spinups = ", ".join(f"size {s['size']} at {s['real_time']}" for s in summary["spinups"]) or "none"
    typer.echo(f"target {summary['target_date']} from {days} days ({summary['history'].get('instance', 'reservoir')})"
               f": start clusters {summary['start_sizes']}, scheduled spin-ups: {spinups}")
    typer.echo(f"knobs {summary['knobs']}; validation VR {p['validation_vr']:.3f} cost {p['validation_cost']:.1f} "
               f"({summary['evaluated']} configurations, {summary['simulations']} simulations, "
               f"{summary['wall_s']:.1f} s)")
    if "version" in summary:
        from sloctl.control.policies import ExecutionPlan

        echo(f"registered {ExecutionPlan.kind} v{summary['version']} (alias champion) in {cfg.registry.tracking_uri}")
