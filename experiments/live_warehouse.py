"""Live warehouse experiments: routers and autoscalers on real DuckDB clusters, against their baselines.

:func:`live_router_experiment` compares round-robin with the Iconq+ router
(AutoSLO Algorithm 1) on the same seeded arrivals, one fresh pool per router,
in alternating rounds; :func:`paired_rounds` compares them round by round;
:func:`live_autoscale_experiment` runs the spin-up trigger, or a forced decision of
the Spinup Size Selector, live. All of them drive
:func:`sloctl.serving.live.run_live`, the live runner the product uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.control.autoscaler import Autoscaler, autoscaler_for
from sloctl.control.router import (
    IconqRouter,
    Query,
    RoundRobinRouter,
    RouterGuard,
    ShadowRoundRobinRouter,
    StageCostRouter,
)
from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.tpc import Template
from sloctl.datasets.workloads import base_workload
from sloctl.experiments.warehouse import ScalingExperimentConfig, autoscaler_config, mean_delta, predictor_error
from sloctl.models.online import OnlinePredictor
from sloctl.serving.live import live_setup, run_live, torch_threads

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.models.predictor import LatencyPredictor

__all__ = ["live_autoscale_experiment", "live_router_experiment", "paired_rounds"]


def live_router_experiment(
    db_path: str | Path,
    log: pd.DataFrame,
    predictor: LatencyPredictor,
    *,
    clusters: tuple[tuple[str, int], ...] = (("c0", 1), ("c1", 1)),
    load: float = 0.85,
    kappa: float = 2.0,
    copies: int = 2,
    seed: int = 0,
    slo_margin: float = 0.3,
    cost_tolerance: float = 3.0,
    guard: RouterGuard | None = None,
    violation_spread: float = 0.0,
    minimum_s_factor: float = 5.0,
    rounds: int = 3,
    shadow_baseline: bool = True,
    on_progress: Callable[[str, int, int], None] | None = None,
    pool_options: Mapping[str, Any] | None = None,
    stage_router: bool = False,
) -> dict[str, Any]:
    """Round-robin vs the Iconq+ router on live clusters, on the same arrivals.

    The comparison runs ``rounds`` times, on workload seeds ``seed``,
    ``seed + 1``, ...; within a round both routers replay the same arrivals,
    and the order rotates between rounds so that drift in the machine's
    background load does not favour one of them. With ``shadow_baseline``,
    a third approach, ``round-robin+inference``
    (:class:`~sloctl.control.router.ShadowRoundRobinRouter`), places like
    round-robin while running the router's inference: where the router
    shares cores with the clusters, it pays the same CPU time. VR is pooled over rounds
    (violations / queries) and cost summed; ``rounds`` in the result keeps each
    round's figures.

    One seeded BaseWorkload(λ) over the TPC-H templates with isolated runs on
    size 1 in ``log``: SLO = ``kappa ×`` each template's largest isolated
    latency on size 1, ``λ = load × Σ sizes / ℓ̄`` and the billing minimum
    ``minimum_s_factor × ℓ̄``, where ``ℓ̄`` is the mean (over templates) of the
    median isolated latency on size 1 — the time scale of
    :func:`sloctl.experiments.warehouse.router_experiment`.

    Args:
        db_path: the TPC-H database the log was collected on.
        log: query log with isolated runs on size 1 (SLOs, time scale, plan features).
        predictor: an Iconq+ predictor (chronological after-pass).
        clusters: ``(cluster_id, size)`` of the live clusters.
        load: offered load as a fraction of the clusters' cores.
        kappa: SLO multiplier.
        copies: copies of every template in the workload.
        seed: seed of the first round's workload.
        slo_margin, cost_tolerance: the Iconq+ router's settings.
        minimum_s_factor: billing minimum window in units of ``ℓ̄``.
        rounds: repetitions, each on its own seeded workload.
        shadow_baseline: also run ``round-robin+inference``.
        on_progress: ``(approach, finished, total)`` after every completion.
        pool_options: CPU-budget options of the pool (sizes as cgroup CPU
            budgets beside the controller's reserved core; see
            :class:`~sloctl.datasets.duckdb_pool.DuckDBClusterPool`); ``None``
            pins whole cores. The log should come from clusters with the same
            budgets (its ``cpu_budget`` column), or its time scale is off.
        stage_router: also run the concurrency-unaware ``stage+cost`` router.

    Returns:
        A JSON-ready dict: ``live``, ``lambda``, ``load``, ``kappa``,
        ``clusters`` (sizes), ``pool`` (sizes, ids and CPU-budget options),
        ``n_rounds``, ``results`` (approach -> pooled ``vr``, total
        ``cost``), ``rounds`` (per round: ``seed`` and its ``results``),
        ``baseline``, ``mean_delta``, ``mean_delta_vs_inference_baseline``
        (the router against ``round-robin+inference``; None without it),
        ``predictor_vs_live``, ``paired_rounds`` (the router against
        round-robin round by round, with a bootstrap over rounds: see
        :func:`paired_rounds`) and ``time_scale``.
    """


    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"The 'load' parameter of live_router_experiment must be > 0, got {load!r}.")
    if not (math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"The 'kappa' parameter of live_router_experiment must be > 0, got {kappa!r}.")
    if rounds < 1:
        raise ValueError(f"The 'rounds' parameter of live_router_experiment must be >= 1, got {rounds!r}.")
    sql, slo_ref, templates, mean_iso, table = live_setup(log)
    cores = sum(size for _, size in clusters)
    rate = load * cores / mean_iso
    minimum_s = minimum_s_factor * mean_iso
    sizes = dict(clusters)

    warm = OnlinePredictor(predictor, table)
    for t in templates:  # Stage estimates and features up front, so routing never waits for them
        for size in set(sizes.values()):
            warm.features(t, size)
    warm.counterfactuals(templates[0], 0.0, sizes, 0.0)  # warm the network; changes nothing

    def iconq_router() -> IconqRouter:  # fresh running state per run, features shared
        return IconqRouter(warm.fork(), slo_margin=slo_margin, cost_tolerance=cost_tolerance, guard=guard,
                           violation_spread=violation_spread)

    stage = OnlinePredictor(predictor, table, use_iconq=False) if stage_router else None
    if stage is not None:
        for t in templates:
            for size in set(sizes.values()):
                stage.features(t, size)

    per_round: list[dict[str, Any]] = []
    totals: dict[str, dict[str, float]] = {}
    predicted: list[pd.DataFrame] = []
    n_queries = 0
    with torch_threads(1):
        for r in range(rounds):
            workload = base_workload([Template(t, sql[t]) for t in templates], rate, copies, seed=seed + r)
            queries = [Query(i, q.template, q.arrival_s, kappa * slo_ref[q.template])
                       for i, q in enumerate(workload.queries)]
            n_queries += len(queries)
            makers = [("round-robin", RoundRobinRouter), ("iconq+cost", iconq_router)]
            if stage is not None:
                makers.append(("stage+cost", lambda: StageCostRouter(stage.fork())))
            if shadow_baseline:
                makers.append(("round-robin+inference", lambda: ShadowRoundRobinRouter(iconq_router())))
            results: dict[str, dict[str, float]] = {}
            for name, make in makers[r % len(makers):] + makers[:r % len(makers)]:
                def progress(done: int, total: int, name: str = name) -> None:
                    if on_progress is not None:
                        on_progress(name, done, total)

                outcome = run_live(db_path, queries, list(clusters), make(), minimum_s=minimum_s,
                                   sql_by_template=sql, on_progress=progress, pool_options=pool_options)
                results[name] = {"vr": outcome.violation_rate, "cost": outcome.cost}
                if name == "iconq+cost":
                    predicted.append(outcome.queries[["predicted_s", "latency_s"]])
                total = totals.setdefault(name, {"violations": 0.0, "n": 0, "cost": 0.0})
                total["violations"] += float(outcome.queries["violated"].sum())
                total["n"] += len(outcome.queries)
                total["cost"] += outcome.cost
            per_round.append({"seed": seed + r, "n_queries": len(queries), "results": results})
    pooled = {name: {"vr": totals[name]["violations"] / max(totals[name]["n"], 1), "cost": totals[name]["cost"]}
              for name, _ in makers}
    return {
        "live": True,
        "lambda": rate,
        "load": load,
        "kappa": kappa,
        "clusters": [size for _, size in clusters],
        "pool": {"clusters": [{"cluster_id": cid, "size": size} for cid, size in clusters],
                 **{k: v for k, v in dict(pool_options or {}).items()}},
        "n_rounds": rounds,
        "results": pooled,
        "rounds": per_round,
        "baseline": "round-robin",
        "mean_delta": mean_delta([pooled], "round-robin"),
        "mean_delta_vs_inference_baseline": (
            mean_delta([{k: pooled[k] for k in ("round-robin+inference", "iconq+cost")}], "round-robin+inference")
            if shadow_baseline else None),
        "predictor_vs_live": predictor_error(predicted),
        "paired_rounds": paired_rounds(per_round, "iconq+cost", "round-robin", seed=seed),
        "time_scale": {"mean_isolated_s": mean_iso, "minimum_s": minimum_s, "copies": copies,
                       "n_queries": n_queries},
    }


def paired_rounds(per_round: list[dict[str, Any]], approach: str, baseline: str, *, seed: int = 0,
                  resamples: int = 10_000) -> dict[str, Any]:
    """How ``approach`` fared against ``baseline`` round by round (the same arrivals within a round).

    Returns the rounds where its VR was lower, equal and higher, and a
    percentile bootstrap over rounds (``resamples`` draws, seeded) of the
    pooled relative VR change: ``ci90`` is its 5th and 95th percentile and
    ``p_lower`` the share of draws where the approach's pooled VR is lower.
    Rounds are resampled whole, so each keeps its pairing.
    """
    import numpy as np

    vr = np.array([[r["results"][approach]["vr"], r["results"][baseline]["vr"]] for r in per_round])
    n = np.array([r["n_queries"] for r in per_round], dtype=float)
    out: dict[str, Any] = {"approach": approach, "baseline": baseline, "rounds": len(per_round),
                           "lower": int(np.sum(vr[:, 0] < vr[:, 1])), "equal": int(np.sum(vr[:, 0] == vr[:, 1])),
                           "higher": int(np.sum(vr[:, 0] > vr[:, 1]))}
    draws = np.random.default_rng(seed).integers(0, len(per_round), (resamples, len(per_round)))
    violations = vr * n[:, None]  # (R, 2)
    pooled = violations[draws].sum(axis=1)  # (resamples, 2)
    ok = pooled[:, 1] > 0
    rel = pooled[ok, 0] / pooled[ok, 1] - 1.0
    out["ci90"] = [float(np.percentile(rel, 5)), float(np.percentile(rel, 95))] if rel.size else None
    out["p_lower"] = float(np.mean(pooled[:, 0] < pooled[:, 1]))
    return out


def live_autoscale_experiment(
    db_path: str | Path,
    log: pd.DataFrame,
    predictor: LatencyPredictor,
    *,
    kind: str = "trigger",
    load: float = 1.4,
    kappa: float = 3.0,
    copies: int = 3,
    seed: int = 0,
    slo_margin: float = 0.3,
    cost_tolerance: float = 1.0,
    guard: RouterGuard | None = None,
    violation_spread: float = 0.0,
    minimum_s_factor: float = 5.0,
    warmup_s: float = 1.0,
    on_progress: Callable[[str, int, int], None] | None = None,
    pool_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One live scenario of the trigger (Table 4) or size-selector (Table 3) experiment: size 1 under overload.

    ``kind="trigger"`` (AutoSLO §8.6): the Iconq+ router alone (no-op)
    against the same router with the Autoscaler (observed + projected
    trigger, Spinup Size Selector over the sizes that fit the free cores,
    teardown) on the same seeded arrivals; VR and cost over the whole run.

    ``kind="sizer"`` (§8.5): one scaling decision is forced at 20% of the
    arrivals, as in the simulated experiment: ``no-op`` (the router alone),
    ``horizontal`` (a copy of the size-1 cluster) and ``add+ours`` (the
    Spinup Size Selector picks the size to add, or nothing); no trigger and
    no teardown. VR is over the last 20% of the arrivals and cost is what was
    billed after the 80% arrival, once scaling has taken effect. The size
    selector runs on the live runner's background sizer: the forced arrival
    is routed at once and the spin-up comes at the first arrival after the
    job finishes (its ``sizing`` event says when).

    Spin-ups are real processes; ``warmup_s`` is added to each, and the
    autoscaler plans with that delay (plus the measured process start).
    With ``pool_options`` (CPU budgets, see
    :class:`~sloctl.datasets.duckdb_pool.DuckDBClusterPool`) sizes are budget
    units on the cores not reserved for the controller, and the sizes the
    selector may add are those whose budget still fits beside the first
    cluster.

    Returns:
        A JSON-ready dict: ``live``, ``lambda``, ``load``, ``kappa``,
        ``clusters`` (the start size), ``pool`` (CPU-budget options),
        ``candidate_sizes``, ``results`` (approach -> ``vr``, ``cost``,
        ``spin_ups``, ``events``), ``baseline`` (``no-op``), ``mean_delta``
        and ``time_scale``. For ``sizer`` also ``force_scaling_at`` and
        ``mark_at`` (the arrival indices of the forced decision and of the
        cost mark) and, per approach, ``clusters`` (the sizes that ran queries).
    """
    import os

    if kind not in ("trigger", "sizer"):
        raise ValueError(f"The 'kind' parameter of live_autoscale_experiment must be 'trigger' or 'sizer', "
                         f"got {kind!r}.")
    options = dict(pool_options or {})
    unit = options.get("size_unit_cores")
    if unit is not None:
        cluster_cores = len(os.sched_getaffinity(0)) - int(options.get("reserved_cores", 0))
        free = math.floor(cluster_cores / unit + 1e-9) - 1  # units left beside the size-1 cluster
    else:
        free = len(os.sched_getaffinity(0)) - 1
    if free < 1:
        raise ClusterPoolError("The live autoscaling experiment needs room for a second cluster (one to start on, "
                               "one to add): more cores, or a smaller size unit.")
    sql, slo_ref, templates, mean_iso, table = live_setup(log)
    rate = load / mean_iso
    minimum_s = minimum_s_factor * mean_iso
    workload = base_workload([Template(t, sql[t]) for t in templates], rate, copies, seed=seed)
    queries = [Query(i, q.template, q.arrival_s, kappa * slo_ref[q.template]) for i, q in enumerate(workload.queries)]
    cfg = ScalingExperimentConfig()
    sizes = tuple(s for s in (1, 2) if s <= free)
    config = autoscaler_config(cfg, mean_iso, candidate_sizes=sizes, spinup_delay_s=warmup_s + 0.1, max_clusters=2)
    n = len(queries)
    force_at, mark = int(0.2 * n), int(0.8 * n)  # as the simulated sizer experiment (§8.5)

    def make_router(model: Any) -> IconqRouter:
        return IconqRouter(model, slo_margin=slo_margin, cost_tolerance=cost_tolerance, guard=guard,
                           violation_spread=violation_spread)

    def make_autoscaler(name: str, router: IconqRouter) -> Autoscaler | None:
        if name == "no-op":
            return None
        if kind == "trigger":
            return autoscaler_for(config, router, make_router, minimum_s=minimum_s)  # config.theta is cfg.theta
        mode = {"horizontal": "horizontal", "add+ours": "add"}[name]
        return autoscaler_for(config, router, make_router, trigger=None, mode=mode, minimum_s=minimum_s,
                              teardown=False)

    approaches = ("no-op", "ours") if kind == "trigger" else ("no-op", "horizontal", "add+ours")
    results: dict[str, dict[str, Any]] = {}
    with torch_threads(1):
        for name in approaches:
            online = OnlinePredictor(predictor, table)
            for t in templates:
                for size in (1, *sizes):
                    online.features(t, size)
            router = make_router(online)
            autoscaler = make_autoscaler(name, router)

            def progress(done: int, total: int, name: str = name) -> None:
                if on_progress is not None:
                    on_progress(name, done, total)

            sizing: dict[str, Any] = {}
            if kind == "sizer":
                sizing = {"mark_at": (mark,), "force_scaling_at": None if autoscaler is None else force_at}
            outcome = run_live(db_path, queries, [("c0", 1)], router, minimum_s=minimum_s, sql_by_template=sql,
                               on_progress=progress, autoscaler=autoscaler, warmup_s=warmup_s,
                               pool_options=pool_options, **sizing)
            spin_ups = sum(e["event"] == "spin_up" for e in outcome.events)
            if kind == "trigger":
                results[name] = {"vr": outcome.violation_rate, "cost": outcome.cost, "spin_ups": spin_ups,
                                 "events": outcome.events}
            else:
                last = outcome.queries.sort_values(["arrival_s", "query_id"]).iloc[mark:]
                results[name] = {"vr": float(last["violated"].mean()), "cost": outcome.cost_since(mark),
                                 "spin_ups": spin_ups, "events": outcome.events,
                                 "clusters": sorted({int(s) for s in outcome.queries["cluster_size"]})}
    out = {"live": True, "lambda": rate, "load": load, "kappa": kappa, "clusters": [1], "pool": options,
           "candidate_sizes": list(sizes), "results": results,
           "baseline": "no-op",
           "mean_delta": mean_delta([{k: {"vr": v["vr"], "cost": v["cost"]} for k, v in results.items()}], "no-op"),
           "time_scale": {"mean_isolated_s": mean_iso, "minimum_s": minimum_s, "n_queries": n,
                          "warmup_s": warmup_s}}
    if kind == "sizer":
        out.update(force_scaling_at=force_at, mark_at=mark)
    return out
