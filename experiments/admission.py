"""Svalinn vs. four baselines on the synthetic 50/50 CPU/memory workload (the shape of Svalinn Figs. 4, 9, 11).

Four experiments, all on :mod:`sloctl.simulation.server_sim`, all seeded:

* ``overload`` — every approach at ``load_factor`` × capacity: goodput and
  p99 per request type, drop rate.
* ``sweep`` — the same at each load in ``loads``.
* ``convergence_ms`` — Svalinn under overload; the memory type's access
  pattern changes (per-thread bandwidth ×1.5, so fewer concurrent sections
  saturate the bus); how long until the bandit's best arm settles on the new
  best capacity, found by an offline sweep of static capacities.
* ``drop_utility`` — Svalinn's credit pool tuned for throughput vs. for
  throughput with a 10 % drop-rate allowance (``DropPenaltyUtility(0.1)``).

Capacity is defined analytically (:func:`~sloctl.simulation.server_sim.capacity_per_s`) and documented in
``docs/admission_sim.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sloctl.control.admission import AdmitAll, Svalinn
from sloctl.control.admission_baselines import ProtegoAdmission, SedaAdmission, SingleQueueAdmission
from sloctl.control.credits import DropPenaltyUtility, ThroughputUtility
from sloctl.experiments.admission_bandit import bandit_experiment, tuner_factories
from sloctl.simulation.server_sim import (
    DemandChange,
    RequestType,
    ServerConfig,
    SimResult,
    capacity_per_s,
    isolated_service_s,
    lock_ceiling_per_s,
    oracle_bound,
    simulate,
)

__all__ = ["APPROACHES", "FRONTIER_LOADS", "FRONTIER_SCALES", "FRONTIER_SPIN_GAPS", "MIXES", "SWEEP_LOADS",
           "admission_experiment", "bus_loss_sensitivity", "frontier_experiment", "make_policy", "mix_workload",
           "plot_admission", "sweep_experiment", "synthetic_workload", "three_bottleneck_workload", "up_to_figures"]

APPROACHES = ("none", "single-queue", "seda", "protego", "svalinn")
SLO_MULTIPLE = 3.0  # SLO = 3 × isolated service time, for both types
DROP_LOAD_FACTOR = 1.25  # where the drop-utility comparison runs (some drops are unavoidable above 1)
CHANGE_THREAD_SCALE = 1.5  # per-thread bandwidth of memory sections after the demand change

OnProgress = Callable[[int, int], None]  # on_progress(done, total)


def _shifted(on_progress: OnProgress | None, start: int, total: int) -> OnProgress | None:
    """A part's own ``on_progress(done, part_total)`` reported as ``start + done`` of the whole job's ``total``."""
    if on_progress is None:
        return None
    return lambda done, _part_total: on_progress(start + done, total)


def synthetic_workload(slo_multiple: float = SLO_MULTIPLE, config: ServerConfig = ServerConfig(),
                       thread_scale: float = 1.0, cpu_share: float = 0.5) -> list[RequestType]:
    """The CPU/memory mix: short CPU requests (5 µs) and memory requests (2 µs CPU + 600 kB at ≤ 10 GB/s/thread).

    On the default machine (16 cores, 60 GB/s) six memory sections saturate the bus.
    ``thread_scale`` multiplies the memory sections' per-thread bandwidth (the demand change);
    ``cpu_share`` is the CPU requests' share of arrivals (0.5: the 50/50 mix).
    """
    if not 0 < cpu_share < 1:
        raise ValueError(f"The 'cpu_share' parameter of synthetic_workload must be in (0, 1), got {cpu_share!r}.")
    cpu = RequestType("cpu", "be", cpu_s=5e-6, slo_s=1.0, share=cpu_share)
    mem = RequestType("mem", "be", cpu_s=2e-6, mem_bytes=600e3, slo_s=1.0, share=1 - cpu_share,
                      thread_bytes_per_s=config.thread_bytes_per_s * thread_scale)
    base = [cpu, dataclasses.replace(mem, thread_bytes_per_s=config.thread_bytes_per_s)]
    # SLOs come from the pre-change service times, so a demand change does not move them.
    return [dataclasses.replace(t, slo_s=slo_multiple * isolated_service_s(b, config)) for t, b in zip(
        [cpu, mem], base, strict=True)]


def three_bottleneck_workload(slo_multiple: float = SLO_MULTIPLE, config: ServerConfig = ServerConfig()
                              ) -> list[RequestType]:
    """CPU, memory-bandwidth and lock requests, a third each (the shape of Svalinn Fig. 12).

    ``cpu``: 40 µs of compute. ``mem``: as in :func:`synthetic_workload`. ``lock``: 2 µs of CPU, then a
    10 µs critical section on the lock ``hot``. At capacity (300 000 req/s on the default machine) the
    bus and the lock saturate together and the cores are 71 % busy; from about 2 × capacity on, CPU
    requests alone could fill the cores left over.
    """
    cpu = RequestType("cpu", "be", cpu_s=40e-6, share=1.0)
    mem = RequestType("mem", "be", cpu_s=2e-6, mem_bytes=600e3, share=1.0)
    lock = RequestType("lock", "be", cpu_s=2e-6, lock="hot", lock_s=10e-6, share=1.0)
    return [dataclasses.replace(t, slo_s=slo_multiple * isolated_service_s(t, config)) for t in (cpu, mem, lock)]


MIXES = ("50/50", "80/20", "20/80", "three-bottleneck")  # CPU/memory shares; then CPU / memory / lock


def mix_workload(mix: str, config: ServerConfig = ServerConfig()) -> list[RequestType]:
    """The request types of one of :data:`MIXES`."""
    if mix == "three-bottleneck":
        return three_bottleneck_workload(config=config)
    shares = {"50/50": 0.5, "80/20": 0.8, "20/80": 0.2}
    if mix not in shares:
        raise ValueError(f"The 'mix' parameter must be one of {', '.join(MIXES)}, got {mix!r}.")
    return synthetic_workload(config=config, cpu_share=shares[mix])


def make_policy(name: str, types: Sequence[RequestType], config: ServerConfig, *, capacity: float, seed: int = 0,
                **svalinn_kwargs: Any):
    """A fresh policy of approach ``name`` configured from the workload's SLOs (see the docs)."""
    expected = {t.name: isolated_service_s(t, config) for t in types}
    if name == "none":
        return AdmitAll()
    if name == "single-queue":
        # One queue, one target: half the tightest queueing allowance, so no type's SLO is given up on.
        return SingleQueueAdmission(target_delay_s=min(t.slo_s - expected[t.name] for t in types) / 2)
    if name == "seda":
        return SedaAdmission(initial_rate_per_s=capacity)
    if name == "protego":
        return ProtegoAdmission()
    if name == "svalinn":
        priorities = {"high": 1, "low": 0} if {t.klass for t in types} >= {"high", "low"} else None
        return Svalinn.for_server(config.cores, config.bandwidth_bytes_per_s, expected, priorities=priorities,
                                  seed=seed, **svalinn_kwargs)
    raise ValueError(f"The 'name' parameter of make_policy must be one of {', '.join(APPROACHES)}, got {name!r}.")


def _summary(result: SimResult, bound: Any = None) -> dict[str, Any]:
    out = {"goodput_per_s": {n: result.goodput_per_s(n) for n in result.types},
           "p99_s": {n: result.p_latency_s(n, 0.99) for n in result.types},
           "drop_rate": result.drop_rate}
    if bound is not None:
        total = sum(out["goodput_per_s"].values())
        out["fraction_of_oracle"] = bound.fraction(out["goodput_per_s"])
        out["total_goodput_per_s"] = total
        out["total_fraction_of_oracle"] = total / bound.total_per_s if bound.total_per_s else math.nan
    return out


SWEEP_LOADS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)


def sweep_experiment(*, mixes: Sequence[str] = MIXES, loads: Sequence[float] = SWEEP_LOADS,
                     approaches: Sequence[str] = APPROACHES, seed: int = 0, duration_s: float = 0.1,
                     on_progress: OnProgress | None = None) -> list[dict[str, Any]]:
    """Every approach at every load of every mix, graded against the goodput bound (issue 21).

    ``on_progress(done, total)`` is called after each simulated run, ``total`` = mixes × loads × approaches.

    Returns:
        One row per (mix, load): ``{"mix", "load_factor", "capacity_per_s", "oracle": GoodputBound.to_dict(),
        "results": {approach: {"goodput_per_s", "p99_s", "drop_rate", "fraction_of_oracle",
        "total_goodput_per_s", "total_fraction_of_oracle", "utilisation", "locks"}}}``, and for a mix with
        a lock ``"lock_ceiling": {type: fraction of the bound}`` (:func:`_lock_ceilings`).
    """
    config = ServerConfig()
    rows = []
    total, done = len(mixes) * len(loads) * len(approaches), 0
    for mix in mixes:
        types = mix_workload(mix, config)
        capacity, _ = capacity_per_s(types, config)
        for load in loads:
            bound = oracle_bound(types, config, load * capacity)
            row = {"mix": mix, "load_factor": float(load), "capacity_per_s": capacity, "oracle": bound.to_dict(),
                   "slo_s": {t.name: t.slo_s for t in types}, "results": {}}
            ceiling = _lock_ceilings(types, config, load * capacity, bound, seed)
            if ceiling:
                row["lock_ceiling"] = ceiling
            for name in approaches:
                result, _ = _run(name, types, config, capacity, load, seed, duration_s)
                row["results"][name] = {**_summary(result, bound), "utilisation": result.utilisation,
                                        "locks": result.locks}
                done += 1
                if on_progress is not None:
                    on_progress(done, total)
            rows.append(row)
    return rows


def _lock_ceilings(types: Sequence[RequestType], config: ServerConfig, rate_per_s: float, bound: Any,
                   seed: int) -> dict[str, float]:
    """Per type that takes a lock alone: the most of its bound any admission policy can serve in time
    (:func:`~sloctl.simulation.server_sim.lock_ceiling_per_s` with the type's whole queueing allowance,
    ``slo − isolated service``), as a fraction of the bound, at most 1."""
    total = sum(t.share for t in types)
    out = {}
    for t in types:
        if t.lock is None or sum(1 for u in types if u.lock == t.lock) > 1:
            continue
        served = lock_ceiling_per_s(rate_per_s * t.share / total, t.lock_s, t.slo_s - isolated_service_s(t, config),
                                    seed=seed)
        limit = bound.goodput_per_s.get(t.name, 0.0)
        out[t.name] = min(1.0, served / limit) if limit > 0 else math.nan
    return out


FRONTIER_LOADS = (2.0, 3.0, 6.0)
FRONTIER_SCALES = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
FRONTIER_SPIN_GAPS = (1.0, 1.5, 2.0, 3.0)


def frontier_experiment(*, mix: str = "three-bottleneck", loads: Sequence[float] = FRONTIER_LOADS,
                        scales: Sequence[float] = FRONTIER_SCALES, spin_gaps: Sequence[float] = FRONTIER_SPIN_GAPS,
                        seeds: Sequence[int] = (0,), duration_s: float = 0.1, workers: int = 1,
                        on_progress: OnProgress | None = None) -> dict[str, Any]:
    """What Svalinn can trade between classes: its fractions of the bound over a grid of its two levers.

    The levers: the run queue's target as a multiple of the tightest budget
    (``run_queue_target_scale``: above 1 the tight-budget class gives up part
    of the run queue to the others) and how long a lock waiter may spin while
    cores are short (``lock_spin_gaps``: shorter frees cores and idles the
    lock more). Every setting runs at every load on every seed, graded
    against the bound like the sweep; a setting's ``worst_fraction`` is its
    smallest fraction of the bound over the classes and seeds.

    ``workers`` > 1 spreads the runs over that many processes (each run is seeded: the result is the same).
    ``on_progress(done, total)`` after each run, ``total`` = loads × scales × spin gaps × seeds.

    Returns:
        ``{"mix", "duration_s", "seeds", "rows": [{"load_factor", "run_queue_target_scale", "lock_spin_gaps",
        "fraction_of_oracle": {class: [per seed]}, "mean_fraction": {class: mean}, "worst_fraction",
        "total_goodput_per_s": [per seed]}], "best_per_load": {load: the row (setting) with the largest
        worst_fraction}, "best_everywhere": {"run_queue_target_scale", "lock_spin_gaps", "worst_fraction",
        "per_load"}, "lock_ceiling": {load: {class: fraction}}}`` (the lock ceilings of the first seed: the
        most of its bound any admission serves, see :func:`sweep_experiment`).
    """
    for label, values in (("loads", loads), ("spin_gaps", spin_gaps)):
        if not values or any(not (math.isfinite(v) and v > 0) for v in values):
            raise ValueError(f"The '{label}' parameter of frontier_experiment must be numbers > 0, got {values!r}.")
    if not scales or any(not (math.isfinite(v) and v >= 1.0) for v in scales):
        raise ValueError(f"The 'scales' parameter of frontier_experiment must be numbers >= 1, got {scales!r}.")
    if not seeds:
        raise ValueError("The 'seeds' parameter of frontier_experiment must name at least one seed.")
    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"The 'workers' parameter of frontier_experiment must be an integer >= 1, got {workers!r}.")
    config = ServerConfig()
    types = mix_workload(mix, config)
    capacity, _ = capacity_per_s(types, config)
    cells = [(float(load), float(scale), float(gaps), int(seed))
             for load in loads for scale in scales for gaps in spin_gaps for seed in seeds]
    results: dict[tuple[float, float, float, int], dict[str, Any]] = {}
    if on_progress is not None:
        on_progress(0, len(cells))

    def done(cell: tuple[float, float, float, int], summary: dict[str, Any]) -> None:
        results[cell] = summary
        if on_progress is not None:
            on_progress(len(results), len(cells))

    if workers == 1:
        for cell in cells:
            done(cell, _frontier_cell(mix, *cell, duration_s))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_frontier_cell, mix, *cell, duration_s): cell for cell in cells}
            for future in as_completed(futures):
                done(futures[future], future.result())
    rows, ceilings = [], {}
    for load in dict.fromkeys(float(v) for v in loads):
        bound = oracle_bound(types, config, load * capacity)
        ceiling = _lock_ceilings(types, config, load * capacity, bound, seeds[0])
        if ceiling:
            ceilings[load] = ceiling
        for scale in dict.fromkeys(float(v) for v in scales):
            for gaps in dict.fromkeys(float(v) for v in spin_gaps):
                fractions: dict[str, list[float]] = {}
                for seed in seeds:
                    for klass, frac in results[(load, scale, gaps, int(seed))]["fraction_of_oracle"].items():
                        if not math.isnan(frac):
                            fractions.setdefault(klass, []).append(frac)
                rows.append({"load_factor": load, "run_queue_target_scale": scale, "lock_spin_gaps": gaps,
                             "fraction_of_oracle": fractions,
                             "mean_fraction": {k: sum(v) / len(v) for k, v in fractions.items()},
                             "worst_fraction": min(min(v) for v in fractions.values()),
                             "total_goodput_per_s": [results[(load, scale, gaps, int(seed))]["total_goodput_per_s"]
                                                     for seed in seeds]})
    best_per_load = {}
    for load in dict.fromkeys(r["load_factor"] for r in rows):
        best_per_load[load] = max((r for r in rows if r["load_factor"] == load), key=lambda r: r["worst_fraction"])
    settings: dict[tuple[float, float], dict[float, float]] = {}
    for r in rows:
        settings.setdefault((r["run_queue_target_scale"], r["lock_spin_gaps"]), {})[r["load_factor"]] = \
            r["worst_fraction"]
    (scale, gaps), per_load = max(settings.items(), key=lambda item: min(item[1].values()))
    return {"mix": mix, "duration_s": duration_s, "seeds": list(seeds), "workers": workers, "rows": rows,
            "best_per_load": best_per_load,
            "best_everywhere": {"run_queue_target_scale": scale, "lock_spin_gaps": gaps,
                                "worst_fraction": min(per_load.values()), "per_load": per_load},
            "lock_ceiling": ceilings}


def _frontier_cell(mix: str, load: float, scale: float, gaps: float, seed: int, duration_s: float
                   ) -> dict[str, Any]:
    """One run of :func:`frontier_experiment` (top level, so that a process pool can run it)."""
    config = ServerConfig()
    types = mix_workload(mix, config)
    capacity, _ = capacity_per_s(types, config)
    result, _ = _run("svalinn", types, config, capacity, load, seed, duration_s, run_queue_target_scale=scale,
                     lock_spin_gaps=gaps)
    return _summary(result, oracle_bound(types, config, load * capacity))


def up_to_figures(rows: Sequence[dict[str, Any]], *, policy: str = "svalinn") -> dict[str, Any]:
    """The "up to" figures of a sweep: per mix and baseline, the largest ``policy`` ÷ baseline goodput per
    class (and in total) and the load where it occurs; a baseline at 0 is reported as such, not as ∞.

    Also ``min_fraction_of_oracle``: per mix, ``policy``'s smallest fraction of the bound over every load
    and every class the bound serves, and where it occurs.
    """
    out: dict[str, Any] = {}
    for mix in dict.fromkeys(r["mix"] for r in rows):
        mine = [r for r in rows if r["mix"] == mix]
        entry: dict[str, Any] = {"ratios": {}}
        for base in (a for a in mine[0]["results"] if a != policy):
            per: dict[str, Any] = {}
            for key in [*mine[0]["oracle"]["goodput_per_s"], "total"]:
                best = None
                for r in mine:
                    ours, theirs = (r["results"][policy], r["results"][base])
                    a = ours["total_goodput_per_s"] if key == "total" else ours["goodput_per_s"].get(key, 0.0)
                    b = theirs["total_goodput_per_s"] if key == "total" else theirs["goodput_per_s"].get(key, 0.0)
                    if b > 0 and (best is None or a / b > best["ratio"]):
                        best = {"ratio": a / b, "load_factor": r["load_factor"]}
                zero = [r["load_factor"] for r in mine if (r["results"][base]["total_goodput_per_s"] if key == "total"
                                                           else r["results"][base]["goodput_per_s"].get(key, 0.0)) <= 0]
                per[key] = {**(best or {"ratio": math.nan, "load_factor": math.nan}), "baseline_zero_at": zero}
            entry["ratios"][base] = per
        worst = None
        for r in mine:
            for klass, frac in r["results"][policy]["fraction_of_oracle"].items():
                if not math.isnan(frac) and (worst is None or frac < worst["fraction"]):
                    worst = {"fraction": frac, "class": klass, "load_factor": r["load_factor"]}
        entry["min_fraction_of_oracle"] = worst
        out[mix] = entry
    return out


def _targets(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's done-when checks on a sweep, measured (never forced): each with its figures."""
    fractions = [{"mix": r["mix"], "load_factor": r["load_factor"], "class": k, "fraction": f}
                 for r in rows for k, f in r["results"].get("svalinn", {}).get("fraction_of_oracle", {}).items()
                 if not math.isnan(f)]
    cpu = [{"load_factor": r["load_factor"],
            "ratio": (r["results"]["svalinn"]["goodput_per_s"]["cpu"] / r["results"]["single-queue"]["goodput_per_s"]
                      ["cpu"]) if r["results"]["single-queue"]["goodput_per_s"]["cpu"] else math.inf}
           for r in rows if r["mix"] == "50/50" and {"svalinn", "single-queue"} <= set(r["results"])]
    three = [{"load_factor": r["load_factor"], **{a: r["results"][a]["total_goodput_per_s"]
                                                  for a in ("svalinn", "single-queue", "protego")}}
             for r in rows if r["mix"] == "three-bottleneck" and
             {"svalinn", "single-queue", "protego"} <= set(r["results"])]
    ceilings = {(r["mix"], r["load_factor"], k): c for r in rows for k, c in r.get("lock_ceiling", {}).items()}
    misses = []
    for f in fractions:
        if f["fraction"] < 0.9:
            ceiling = ceilings.get((f["mix"], f["load_factor"], f["class"]))
            misses.append(f if ceiling is None else {**f, "ceiling": ceiling})
    return {
        "svalinn_at_least_0.9_of_oracle": {"met": all(f["fraction"] >= 0.9 for f in fractions), "misses": misses,
                                           "misses_below_ceiling_0.9": [m for m in misses
                                                                        if m.get("ceiling", 1.0) < 0.9]},
        "cpu_vs_single_queue_at_least_0.95_load_50_50": {
            "met": all(c["ratio"] >= 0.95 * c["load_factor"] for c in cpu), "ratios": cpu},
        "three_bottleneck_total_beats_both": {
            "met": all(t["svalinn"] > max(t["single-queue"], t["protego"]) for t in three), "totals": three},
    }


def _run(name, types, config, capacity, load, seed, duration_s, **kwargs) -> tuple[SimResult, Any]:
    policy = make_policy(name, types, config, capacity=capacity, seed=seed, **kwargs)
    result = simulate(types, policy, rate_per_s=load * capacity, duration_s=duration_s, config=config,
                      warmup_s=duration_s / 4, seed=seed)
    return result, policy


def _best_static_capacity(types, config, capacity, load, seed, duration_s, step: Callable[[], None] = lambda: None
                          ) -> tuple[int, dict[int, float]]:
    """Offline sweep: the static capacity whose measured bandwidth earns the tuner's reward best."""
    rewards = {}
    for k in range(1, config.cores + 1):
        result, policy = _run("svalinn", types, config, capacity, load, seed, duration_s, static_capacity=k)
        rewards[k] = policy.tuner_.reward(k, result.bandwidth_bytes_per_s)
        step()
    return max(rewards, key=lambda k: (rewards[k], -k)), rewards


def _convergence_runs(config: ServerConfig) -> int:
    """Simulated runs of :func:`_convergence`: every static capacity before and after the change, then Svalinn."""
    return 2 * config.cores + 1


def _convergence(config, capacity, load, seed, change_s=0.1, end_s=0.25, probe_s=0.04,
                 on_progress: OnProgress | None = None) -> dict[str, Any]:
    if not 0 < change_s < end_s or not probe_s > 0:
        raise ValueError(f"The convergence run needs 0 < change_s < end_s and probe_s > 0, got change_s={change_s!r}, "
                         f"end_s={end_s!r}, probe_s={probe_s!r}.")
    total, done = _convergence_runs(config), [0]

    def step() -> None:
        done[0] += 1
        if on_progress is not None:
            on_progress(done[0], total)

    before, after = synthetic_workload(config=config), synthetic_workload(config=config,
                                                                          thread_scale=CHANGE_THREAD_SCALE)
    old_best, _ = _best_static_capacity(before, config, capacity, load, seed, probe_s, step)
    new_best, rewards = _best_static_capacity(after, config, capacity, load, seed, probe_s, step)
    policy = make_policy("svalinn", before, config, capacity=capacity, seed=seed)
    simulate(before, policy, rate_per_s=load * capacity, duration_s=end_s, config=config, seed=seed,
             demand_change=DemandChange(change_s, tuple(after)))
    step()
    log = policy.capacity_log_
    # Settled = from the first update after which the bandit's best arm is the new best to the end of the run.
    after_change = [(t, best) for t, _, best in log if t >= change_s]
    last_wrong = max((i for i, (_, best) in enumerate(after_change) if best != new_best), default=-1)
    converged = last_wrong < len(after_change) - 1
    settle_s = (after_change[last_wrong + 1][0] if last_wrong >= 0 else change_s) if converged else math.nan
    return {"change_s": change_s, "old_best": old_best, "new_best": new_best,
            "static_rewards": rewards, "converged": converged,
            "convergence_ms": (settle_s - change_s) * 1e3,
            "log": [(t, c, b) for t, c, b in log if change_s - 0.03 <= t <= change_s + 0.1]}


def bus_loss_sensitivity(losses: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5), *, load_factor: float = 2.0,
                         seed: int = 0, duration_s: float = 0.2, on_progress: OnProgress | None = None
                         ) -> list[dict[str, Any]]:
    """Svalinn ÷ single-queue goodput per type when an oversubscribed bus loses bandwidth.

    For each γ in ``losses`` (:attr:`ServerConfig.oversubscription_loss`),
    both approaches run the overload comparison on that machine; capacity and
    SLOs stay those of the default machine (γ does not change a bus that is
    not oversubscribed). Returns rows ``{"loss", "ratio": {type: …},
    "single_queue_goodput_per_s": {…}, "svalinn_goodput_per_s": {…}}``. ``on_progress(done, total)`` is
    called after each simulated run (two per γ).
    """
    base = ServerConfig()
    types = synthetic_workload(config=base)
    capacity, _ = capacity_per_s(types, base)
    rows = []
    total = 2 * len(losses)
    for loss in losses:
        config = dataclasses.replace(base, oversubscription_loss=float(loss))
        good = {}
        for name in ("single-queue", "svalinn"):
            good[name] = _summary(_run(name, types, config, capacity, load_factor, seed, duration_s)[0])[
                "goodput_per_s"]
            if on_progress is not None:
                on_progress(2 * len(rows) + len(good), total)
        rows.append({"loss": float(loss),
                     "ratio": {t: good["svalinn"][t] / good["single-queue"][t] if good["single-queue"][t] else math.inf
                               for t in good["svalinn"]},
                     "single_queue_goodput_per_s": good["single-queue"], "svalinn_goodput_per_s": good["svalinn"]})
    return rows


def admission_experiment(*, load_factor: float = 2.0, seed: int = 0, duration_s: float = 0.2,
                         loads: Sequence[float] = SWEEP_LOADS, mixes: Sequence[str] = MIXES,
                         sweep_duration_s: float = 0.1, bus_losses: Sequence[float] = (),
                         bandit_seeds: Sequence[int] = tuple(range(10)), convergence_change_s: float = 0.1,
                         convergence_end_s: float = 0.25, convergence_probe_s: float = 0.04,
                         on_progress: OnProgress | None = None) -> dict[str, Any]:
    """Run the overload comparison, the sweep over loads and mixes, the convergence and the drop-utility runs.

    Every goodput is graded against the bound of :func:`~sloctl.simulation.server_sim.oracle_bound`.

    Args:
        load_factor: offered load of the overload comparison (50/50 mix), × capacity.
        seed: seeds arrivals and every controller.
        duration_s: simulated seconds of the overload comparison (the first quarter is warm-up).
        loads: loads of the sweep, × capacity.
        mixes: mixes of the sweep (see :data:`MIXES`); empty: no sweep.
        sweep_duration_s: simulated seconds per sweep run.
        bus_losses: γ values of :func:`bus_loss_sensitivity` (default empty: the what-if is off).
        bandit_seeds: seeds of the m_semaphore tuners on Svalinn's own bandit curve, clean and noisy
            (:func:`~sloctl.experiments.admission_bandit.bandit_experiment`; empty: skip).
        convergence_change_s: when the demand changes in the convergence run (simulated seconds).
        convergence_end_s: length of the convergence run.
        convergence_probe_s: simulated seconds of each static-capacity run that finds the best capacity
            before and after the change.
        on_progress: ``on_progress(done, total)`` after each unit of work: each simulated server run
            (approach × load × mix, every static capacity of the convergence, ...) and each (tuner, seed)
            of the bandit curve; ``total`` is known from the start (first call: ``(0, total)``).

    Returns:
        ``{"overload": {"load_factor", "results": {approach: {"goodput_per_s", "p99_s", "drop_rate",
        "fraction_of_oracle", ...}}}, "oracle": {...}, "baseline": "single-queue", "convergence_ms",
        "sweep": [...], "up_to": {...}, "targets": {...}, "bandit": {...}, "drop_utility": {...},
        "bus_loss_sensitivity": [...]}``
        plus ``capacity_per_s``, ``slo_s`` and ``convergence`` (details of the convergence run).
    """
    config = ServerConfig()
    types = synthetic_workload(config=config)
    capacity, _ = capacity_per_s(types, config)
    bound = oracle_bound(types, config, load_factor * capacity)
    mixes = tuple(mixes)
    parts = {"overload": len(APPROACHES), "sweep": len(mixes) * len(loads) * len(APPROACHES),
             "convergence": _convergence_runs(config), "drop_utility": 2,
             "bandit": len(tuner_factories()) * len(bandit_seeds), "bus_loss": 2 * len(bus_losses)}
    total = sum(parts.values())
    starts = dict(zip(parts, [sum(list(parts.values())[:i]) for i in range(len(parts))], strict=True))
    if on_progress is not None:
        on_progress(0, total)

    def part(name: str) -> OnProgress | None:
        return _shifted(on_progress, starts[name], total)

    overload = {}
    for i, name in enumerate(APPROACHES, 1):
        overload[name] = _summary(_run(name, types, config, capacity, load_factor, seed, duration_s)[0], bound)
        if on_progress is not None:
            on_progress(starts["overload"] + i, total)
    sweep = sweep_experiment(mixes=mixes, loads=loads, seed=seed, duration_s=sweep_duration_s,
                             on_progress=part("sweep")) if mixes else []
    convergence = _convergence(config, capacity, load_factor, seed, change_s=convergence_change_s,
                               end_s=convergence_end_s, probe_s=convergence_probe_s, on_progress=part("convergence"))
    drop_utility = {}
    for i, (label, utility) in enumerate((("throughput", ThroughputUtility()),
                                          ("drop_penalty_0.1", DropPenaltyUtility(0.1))), 1):
        result, _ = _run("svalinn", types, config, capacity, DROP_LOAD_FACTOR, seed, duration_s, utility=utility)
        drop_utility[label] = {"drop_rate": result.drop_rate,
                               "throughput_per_s": sum(s.completed for s in result.types.values()) / result.window_s,
                               "goodput_per_s": sum(result.goodput_per_s(n) for n in result.types)}
        if on_progress is not None:
            on_progress(starts["drop_utility"] + i, total)
    bandit = bandit_experiment(seeds=bandit_seeds, on_progress=part("bandit")) if bandit_seeds else {}
    bus_loss = bus_loss_sensitivity(bus_losses, load_factor=load_factor, seed=seed, duration_s=duration_s,
                                    on_progress=part("bus_loss")) if bus_losses else []
    return {"overload": {"load_factor": float(load_factor), "results": overload}, "oracle": bound.to_dict(),
            "baseline": "single-queue", "convergence_ms": convergence["convergence_ms"], "sweep": sweep,
            "up_to": up_to_figures(sweep) if sweep else {}, "targets": _targets(sweep) if sweep else {},
            "bandit": bandit,
            "sweep_duration_s": sweep_duration_s, "duration_s": duration_s, "seed": seed,
            "drop_utility": {"load_factor": DROP_LOAD_FACTOR, **drop_utility},
            "bus_loss_sensitivity": bus_loss,
            "capacity_per_s": capacity, "slo_s": {t.name: t.slo_s for t in types}, "convergence": convergence,
            "world": "simulation.server_sim (fluid bus, FIFO run queue, FIFO locks), seeded"}


def plot_admission(result: dict[str, Any], folder: str | Path) -> list[Path]:
    """Write goodput-vs-load, p99-vs-load and capacity-around-the-change PNGs into ``folder``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sweep = [row for row in result["sweep"] if row.get("mix", "50/50") == "50/50"]
    loads = [row["load_factor"] for row in sweep]
    types = list(result["slo_s"])
    paths = []
    for metric, label, scale in (("goodput_per_s", "goodput (k req/s)", 1e-3), ("p99_s", "p99 latency (µs)", 1e6)):
        fig, axes = plt.subplots(1, len(types), figsize=(5 * len(types), 3.5), squeeze=False)
        for ax, name in zip(axes[0], types, strict=True):
            for approach in APPROACHES:
                ys = [row["results"][approach][metric].get(name, math.nan) * scale for row in sweep]
                ax.plot(loads, ys, marker="o", label=approach)
            if metric == "p99_s":
                ax.axhline(result["slo_s"][name] * scale, color="k", ls="--", lw=0.8, label="SLO")
                ax.set_yscale("log")
            ax.set(title=f"{name} requests", xlabel="offered load (× capacity)", ylabel=label)
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        paths.append(folder / f"admission_{metric.removesuffix('_per_s').removesuffix('_s')}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    conv = result["convergence"]
    t = [(x - conv["change_s"]) * 1e3 for x, _, _ in conv["log"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.step(t, [c for _, c, _ in conv["log"]], where="post", lw=0.8, alpha=0.6, label="capacity in force")
    ax.step(t, [b for _, _, b in conv["log"]], where="post", lw=1.6, label="bandit's best arm")
    ax.axhline(conv["new_best"], color="k", ls="--", lw=0.8, label="best static (after)")
    ax.axvline(0, color="r", lw=0.8)
    ax.set(xlabel="time since demand change (ms)", ylabel="m_semaphore capacity",
           title=f"re-convergence: {conv['convergence_ms']:.1f} ms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(folder / "admission_capacity.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
