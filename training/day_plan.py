"""One day planned ahead: forecast it from history, tune its execution configuration, register it (AutoSLO §7).

What ``sloctl tune policy`` runs (:func:`tune_execution_plan`). Steps:

1. History: the last ``days`` days before the target day, from a Reservoir
   SQLite file or a Redset-style hourly file (one instance, loaded into a
   temporary reservoir as contour-only counts; :func:`history_reservoir`).
2. Forecasts: ``n_train + n_validation`` sampled workloads of the target day
   (Forecaster, one seed each); the first ``n_train`` train, the rest validate.
3. Templates: forecast template names that the log lacks (Redset's ``all``)
   are replaced query by query, in arrival order, by the log's templates
   cycled round-robin in a seeded shuffled order, so every template gets an
   equal share (:func:`map_templates`).
4. Time: an hour lasts ``hour_units`` mean isolated latencies and the
   busiest forecast hour offers ``peak_load`` times one size-1 cluster's
   capacity (queries are thinned at random when the forecast holds more,
   hours shortened when it holds fewer).
5. Tuning (:func:`~sloctl.training.policy_tuner.tune_policy`): knobs first,
   then scheduled spin-ups on the winner. With the round-robin runner the
   reactive autoscaler cannot run, so the knobs are the starting clusters;
   with a latency model (Iconq+ router) they are the autoscaler's.
6. The execution configuration is registered as ``execution-config`` (alias
   ``champion``) with the predicted validation VR and cost, and what it was
   optimised on (:func:`plan_provenance_tags`): the log's provenance as the
   latency models record it (benchmark, scale factor, cluster sizes, log
   hashes: :mod:`sloctl.registry.provenance`) and the history window (file,
   instance, days, dates, hash) as ``provenance.*`` tags; the window's counts
   and the log as MLflow dataset inputs.

Scripts that call :func:`tune_execution_plan` need an ``if __name__ ==
"__main__":`` guard: the simulation pool spawns its workers.
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

from sloctl.control.autoscaler import RelativeAutoscalerSettings
from sloctl.simulation.day import START_SIZES
from sloctl.simulation.emulator import calibrated_world
from sloctl.training.policy_tuner import SearchSpace, tune_policy

__all__ = ["history_hash", "history_reservoir", "map_templates", "plan_provenance_tags",
           "tune_execution_plan"]

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


def tune_execution_plan(history: str | Path, log: Any, *, days: int = 7, target_date: str | None = None,
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
    from sloctl.simulation.batch import WarehouseRunner, pack_folder, simulate_batch

    started = time.perf_counter()
    knobs = RelativeAutoscalerSettings()  # in mean isolated latencies, as the scaled experiments' defaults
    world, _, slo_ref, templates, mean_iso, table = calibrated_world(log, {*START_SIZES, *knobs.candidate_sizes},
                                                                     seed)
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

        spinup_delay_s = knobs.spinup_delay_s * mean_iso
        runner = WarehouseRunner(world, minimum_s=knobs.minimum_s * mean_iso, spinup_delay_s=spinup_delay_s,
                                 max_clusters=4, router="iconq" if predictor is not None else "round-robin",
                                 predictor_dir=str(runner_dir) if predictor is not None else None,
                                 table=table if predictor is not None else None,
                                 # Ray workers on other hosts get the model itself, not a path of this one
                                 predictor_bundle=pack_folder(runner_dir) if predictor is not None
                                 and ray_address not in (None, "local") else None)
        sizes = tuple(sorted(set(START_SIZES) | set(knobs.candidate_sizes)))
        if predictor is None:  # round-robin: no reactive autoscaler, tune the starting clusters
            base = ExecutionConfig(start_sizes=(1,))
            space = SearchSpace({"start_clusters": (1, 3, "int"), "start_size": list(sizes)})
        else:
            base = ExecutionConfig(autoscaler=knobs.config(mean_iso, candidate_sizes=sizes))
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
