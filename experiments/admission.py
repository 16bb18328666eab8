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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sloctl.control.admission import AdmitAll, Svalinn
from sloctl.control.credits import DropPenaltyUtility, ThroughputUtility
from sloctl.simulation.admission_policies import ProtegoPolicy, SedaPolicy, SingleQueuePolicy
from sloctl.simulation.server_sim import (
    DemandChange,
    RequestType,
    ServerConfig,
    SimResult,
    capacity_per_s,
    isolated_service_s,
    simulate,
)

__all__ = ["APPROACHES", "admission_experiment", "bus_loss_sensitivity", "make_policy",
           "plot_admission", "synthetic_workload"]

APPROACHES = ("none", "single-queue", "seda", "protego", "svalinn")
SLO_MULTIPLE = 3.0  # SLO = 3 × isolated service time, for both types
DROP_LOAD_FACTOR = 1.25  # where the drop-utility comparison runs (some drops are unavoidable above 1)
CHANGE_THREAD_SCALE = 1.5  # per-thread bandwidth of memory sections after the demand change


def synthetic_workload(slo_multiple: float = SLO_MULTIPLE, config: ServerConfig = ServerConfig(),
                       thread_scale: float = 1.0) -> list[RequestType]:
    """The 50/50 mix: short CPU requests (5 µs) and memory requests (2 µs CPU + 600 kB at ≤ 10 GB/s/thread).

    On the default machine (16 cores, 60 GB/s) six memory sections saturate the bus.
    ``thread_scale`` multiplies the memory sections' per-thread bandwidth (the demand change).
    """
    cpu = RequestType("cpu", "be", cpu_s=5e-6, slo_s=1.0, share=0.5)
    mem = RequestType("mem", "be", cpu_s=2e-6, mem_bytes=600e3, slo_s=1.0, share=0.5,
                      thread_bytes_per_s=config.thread_bytes_per_s * thread_scale)
    base = [cpu, dataclasses.replace(mem, thread_bytes_per_s=config.thread_bytes_per_s)]
    # SLOs come from the pre-change service times, so a demand change does not move them.
    return [dataclasses.replace(t, slo_s=slo_multiple * isolated_service_s(b, config)) for t, b in zip(
        [cpu, mem], base, strict=True)]


def make_policy(name: str, types: Sequence[RequestType], config: ServerConfig, *, capacity: float, seed: int = 0,
                **svalinn_kwargs: Any):
    """A fresh policy of approach ``name`` configured from the workload's SLOs (see the docs)."""
    expected = {t.name: isolated_service_s(t, config) for t in types}
    if name == "none":
        return AdmitAll()
    if name == "single-queue":
        # One queue, one target: half the tightest queueing allowance, so no type's SLO is given up on.
        return SingleQueuePolicy(target_delay_s=min(t.slo_s - expected[t.name] for t in types) / 2)
    if name == "seda":
        return SedaPolicy(initial_rate_per_s=capacity)
    if name == "protego":
        return ProtegoPolicy()
    if name == "svalinn":
        priorities = {"high": 1, "low": 0} if {t.klass for t in types} >= {"high", "low"} else None
        return Svalinn.for_server(config.cores, config.bandwidth_bytes_per_s, expected, priorities=priorities,
                                  seed=seed, **svalinn_kwargs)
    raise ValueError(f"The 'name' parameter of make_policy must be one of {', '.join(APPROACHES)}, got {name!r}.")


def _summary(result: SimResult) -> dict[str, Any]:
    return {"goodput_per_s": {n: result.goodput_per_s(n) for n in result.types},
            "p99_s": {n: result.p_latency_s(n, 0.99) for n in result.types},
            "drop_rate": result.drop_rate}


def _run(name, types, config, capacity, load, seed, duration_s, **kwargs) -> tuple[SimResult, Any]:
    policy = make_policy(name, types, config, capacity=capacity, seed=seed, **kwargs)
    result = simulate(types, policy, rate_per_s=load * capacity, duration_s=duration_s, config=config,
                      warmup_s=duration_s / 4, seed=seed)
    return result, policy


def _best_static_capacity(types, config, capacity, load, seed, duration_s) -> tuple[int, dict[int, float]]:
    """Offline sweep: the static capacity whose measured bandwidth earns the tuner's reward best."""
    rewards = {}
    for k in range(1, config.cores + 1):
        result, policy = _run("svalinn", types, config, capacity, load, seed, duration_s, static_capacity=k)
        rewards[k] = policy.tuner_.reward(k, result.bandwidth_bytes_per_s)
    return max(rewards, key=lambda k: (rewards[k], -k)), rewards


def _convergence(config, capacity, load, seed, change_s=0.1, end_s=0.25) -> dict[str, Any]:
    before, after = synthetic_workload(config=config), synthetic_workload(config=config,
                                                                          thread_scale=CHANGE_THREAD_SCALE)
    old_best, _ = _best_static_capacity(before, config, capacity, load, seed, 0.04)
    new_best, rewards = _best_static_capacity(after, config, capacity, load, seed, 0.04)
    policy = make_policy("svalinn", before, config, capacity=capacity, seed=seed)
    simulate(before, policy, rate_per_s=load * capacity, duration_s=end_s, config=config, seed=seed,
             demand_change=DemandChange(change_s, tuple(after)))
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
                         seed: int = 0, duration_s: float = 0.2) -> list[dict[str, Any]]:
    """Svalinn ÷ single-queue goodput per type when an oversubscribed bus loses bandwidth.

    For each γ in ``losses`` (:attr:`ServerConfig.oversubscription_loss`),
    both approaches run the overload comparison on that machine; capacity and
    SLOs stay those of the default machine (γ does not change a bus that is
    not oversubscribed). Returns rows ``{"loss", "ratio": {type: …},
    "single_queue_goodput_per_s": {…}, "svalinn_goodput_per_s": {…}}``.
    """
    base = ServerConfig()
    types = synthetic_workload(config=base)
    capacity, _ = capacity_per_s(types, base)
    rows = []
    for loss in losses:
        config = dataclasses.replace(base, oversubscription_loss=float(loss))
        good = {name: _summary(_run(name, types, config, capacity, load_factor, seed, duration_s)[0])["goodput_per_s"]
                for name in ("single-queue", "svalinn")}
        rows.append({"loss": float(loss),
                     "ratio": {t: good["svalinn"][t] / good["single-queue"][t] if good["single-queue"][t] else math.inf
                               for t in good["svalinn"]},
                     "single_queue_goodput_per_s": good["single-queue"], "svalinn_goodput_per_s": good["svalinn"]})
    return rows


def admission_experiment(*, load_factor: float = 2.0, seed: int = 0, duration_s: float = 0.2,
                         loads: Sequence[float] = (0.5, 1, 1.5, 2, 2.5, 3),
                         bus_losses: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)) -> dict[str, Any]:
    """Run the overload comparison, the load sweep, the convergence and the drop-utility experiments.

    Args:
        load_factor: offered load of the overload comparison, × capacity.
        seed: seeds arrivals and every controller.
        duration_s: simulated seconds per run (the first quarter is warm-up).
        loads: loads of the sweep, × capacity.
        bus_losses: γ values of :func:`bus_loss_sensitivity` (empty: skip it).

    Returns:
        ``{"overload": {"load_factor", "results": {approach: {"goodput_per_s",
        "p99_s", "drop_rate"}}}, "baseline": "single-queue", "convergence_ms",
        "sweep": [...], "drop_utility": {...}, "bus_loss_sensitivity": [...]}`` plus ``capacity_per_s``,
        ``slo_s`` and ``convergence`` (details of the convergence run).
    """

    config = ServerConfig()
    types = synthetic_workload(config=config)
    capacity, _ = capacity_per_s(types, config)
    sweep = []
    for load in loads:
        row = {"load_factor": float(load), "results": {}}
        for name in APPROACHES:
            result, _ = _run(name, types, config, capacity, load, seed, duration_s)
            row["results"][name] = {**_summary(result), "utilisation": result.utilisation}
        sweep.append(row)
    by_load = {row["load_factor"]: row["results"] for row in sweep}
    overload = by_load.get(float(load_factor)) or {
        name: _summary(_run(name, types, config, capacity, load_factor, seed, duration_s)[0]) for name in APPROACHES}
    overload = {name: {k: r[k] for k in ("goodput_per_s", "p99_s", "drop_rate")} for name, r in overload.items()}
    convergence = _convergence(config, capacity, load_factor, seed)
    drop_utility = {}
    for label, utility in (("throughput", ThroughputUtility()), ("drop_penalty_0.1", DropPenaltyUtility(0.1))):
        result, _ = _run("svalinn", types, config, capacity, DROP_LOAD_FACTOR, seed, duration_s, utility=utility)
        drop_utility[label] = {"drop_rate": result.drop_rate,
                               "throughput_per_s": sum(s.completed for s in result.types.values()) / result.window_s,
                               "goodput_per_s": sum(result.goodput_per_s(n) for n in result.types)}
    return {"overload": {"load_factor": float(load_factor), "results": overload}, "baseline": "single-queue",
            "convergence_ms": convergence["convergence_ms"], "sweep": sweep,
            "drop_utility": {"load_factor": DROP_LOAD_FACTOR, **drop_utility},
            "bus_loss_sensitivity": bus_loss_sensitivity(bus_losses, load_factor=load_factor, seed=seed,
                                                         duration_s=duration_s) if bus_losses else [],
            "capacity_per_s": capacity, "slo_s": {t.name: t.slo_s for t in types}, "convergence": convergence}


def plot_admission(result: dict[str, Any], folder: str | Path) -> list[Path]:
    """Write goodput-vs-load, p99-vs-load and capacity-around-the-change PNGs into ``folder``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    loads = [row["load_factor"] for row in result["sweep"]]
    types = list(result["slo_s"])
    paths = []
    for metric, label, scale in (("goodput_per_s", "goodput (k req/s)", 1e-3), ("p99_s", "p99 latency (µs)", 1e6)):
        fig, axes = plt.subplots(1, len(types), figsize=(5 * len(types), 3.5), squeeze=False)
        for ax, name in zip(axes[0], types, strict=True):
            for approach in APPROACHES:
                ys = [row["results"][approach][metric].get(name, math.nan) * scale for row in result["sweep"]]
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
