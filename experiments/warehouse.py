"""Experiments of AutoSLO §8.4–8.6 in simulation, scaled to this machine.

Every scenario replays the same seeded BaseWorkload(λ) through each approach
on the emulated warehouse (:mod:`sloctl.simulation.emulator`), which is
calibrated on a real log and independent of the predictors the policies use.
Rates are set from the measured isolated latencies so that the offered load
matches the paper's two levels on this machine; SLOs are ``κ ×`` each
template's largest isolated latency on the smallest size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sloctl.control.autoscaler import (
    QueueTrigger,
    RelativeAutoscalerSettings,
    SpinupTrigger,
    autoscaler_for,
)
from sloctl.control.router import IconqRouter, Query, RoundRobinRouter, RouterGuard, StageCostRouter
from sloctl.core.kinds import RouterKind
from sloctl.datasets.tpc import Template
from sloctl.datasets.workloads import base_workload
from sloctl.models.metrics import q_error_summary
from sloctl.models.online import OnlinePredictor
from sloctl.simulation.emulator import calibrated_world
from sloctl.simulation.engine import WarehouseSimulator

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.models.predictor import LatencyPredictor

__all__ = [
    "RouterExperimentConfig",
    "ScalingExperimentConfig",
    "autoscaler_config",
    "mean_delta",
    "predictor_error",
    "router_experiment",
    "scaling_setup",
    "scaling_experiment",
]


@dataclass(frozen=True)
class RouterExperimentConfig:
    """The scenario grid: loads × κ × cluster sets (Table 2, scaled).

    Attributes:
        loads: offered load of each λ, as a fraction of the capacity of two
            size-1 clusters (λ = load × 2 / mean isolated latency on size 1).
        kappas: SLO multipliers.
        cluster_sets: cluster sizes routed between ([32, 16] -> [2, 1], ...).
        copies: copies of every template in BaseWorkload.
        minimum_s: billing minimum window, in units of the mean isolated
            latency on size 1 (the paper's 60 s against its query latencies).
        seed: seed of workloads and service-time noise.
        slo_margin, cost_tolerance: the Iconq+ router's settings (see
            :class:`~sloctl.config.RouterSection`).
        guard: the Iconq+ router's guard (``None``: always trust the model);
            each scenario reports how often it fired.
        violation_spread: the Iconq+ router's soft-count spread (0: hard counts).
        tie_break: the Iconq+ router's tie break (``"load"`` or ``"latency"``).
        noise_draws: runs of every approach per scenario, each with its own
            draw of the world's service-time noise (same arrivals and SLOs).
            Draw 0 uses ``seed`` and gives ``vr`` / ``cost`` as with one
            draw; with more, each result also has ``vr_draws`` and
            ``vr_mean``, and the result a ``noise`` section (see
            :func:`noise_summary`).
    """

    loads: tuple[float, ...] = (0.6, 0.85)
    kappas: tuple[float, ...] = (4.0, 2.0)
    cluster_sets: tuple[tuple[int, ...], ...] = ((2, 1), (1, 1))
    copies: int = 10
    minimum_s: float = 5.0
    seed: int = 0
    slo_margin: float = 0.3
    cost_tolerance: float = 3.0
    guard: RouterGuard | None = None
    violation_spread: float = 0.0
    tie_break: str = "load"
    noise_draws: int = 1

    def __post_init__(self) -> None:
        if self.noise_draws < 1:
            raise ValueError(f"The 'noise_draws' parameter must be >= 1, got {self.noise_draws!r}.")


def noise_seed(seed: int, draw: int) -> int:
    """The simulator seed of noise draw ``draw`` of a scenario seeded ``seed`` (draw 0: ``seed`` itself)."""
    if draw == 0:
        return seed
    return int(np.random.SeedSequence([seed, draw]).generate_state(1)[0])


def paired_ratio_interval(mine: list[float], base: list[float], *, level: float = 0.90, resamples: int = 2000,
                          seed: int = 0) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of ``mean(mine) / mean(base)`` over paired draws (draw ``k`` of both ran
    on the same noise), resampling the draw indices; None when the baseline's mean is 0 or there is one draw."""
    a, b = np.asarray(mine, float), np.asarray(base, float)
    if len(a) != len(b):
        raise ValueError(f"paired_ratio_interval needs as many draws of both, got {len(a)} and {len(b)}.")
    if len(b) < 2 or b.mean() <= 0:
        return None
    idx = np.random.default_rng(seed).integers(0, len(b), size=(resamples, len(b)))
    num, den = a[idx].mean(axis=1), b[idx].mean(axis=1)
    ratios = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.inf)
    tail = (1 - level) / 2 * 100
    # no interpolation: a resample whose baseline mean is 0 has an infinite ratio
    return float(np.percentile(ratios, tail, method="lower")), float(np.percentile(ratios, 100 - tail, method="higher"))


def noise_summary(scenarios: list[dict], baseline: str, margin: float = 0.10) -> dict[str, Any]:
    """How far one draw of the world's noise decides "worse than the baseline" (scenarios with ``vr_draws``).

    Per approach: scenarios where its draw-0 VR exceeds the baseline's by more
    than ``margin`` (relative; baseline VR > 0), and where the mean over the
    draws does. ``baseline_vs_itself``: scenarios where another draw of the
    baseline itself exceeds its draw 0 by more than ``margin`` — how often
    the single-draw test would fail the baseline against itself.

    Beyond the noise: the draws are paired (draw ``k`` of every approach
    runs on the same noise), so :func:`paired_ratio_interval` gives a 90%
    interval of the approach's mean VR over the baseline's.
    ``worse_beyond_noise`` counts scenarios whose interval lies above 1 (worse
    at all, with 90% confidence), ``worse_by_margin_beyond_noise`` those above
    ``1 + margin``; each scenario's result carries its ``vr_ratio_90``.
    """
    out: dict[str, Any] = {"margin": margin, "draws": len(scenarios[0]["results"][baseline]["vr_draws"]),
                           "scenarios": len(scenarios), "approaches": {}}
    itself = 0
    for s in scenarios:
        draws = s["results"][baseline]["vr_draws"]
        if draws[0] > 0 and any(v > (1 + margin) * draws[0] for v in draws[1:]):
            itself += 1
    out["baseline_vs_itself"] = itself
    for approach in scenarios[0]["results"]:
        if approach == baseline:
            continue
        single = mean = beyond = beyond_margin = 0
        for s in scenarios:
            base, mine = s["results"][baseline], s["results"][approach]
            if base["vr"] > 0 and mine["vr"] > (1 + margin) * base["vr"]:
                single += 1
            if base["vr_mean"] > 0 and mine["vr_mean"] > (1 + margin) * base["vr_mean"]:
                mean += 1
            interval = paired_ratio_interval(mine["vr_draws"], base["vr_draws"])
            mine["vr_ratio_90"] = list(interval) if interval is not None else None
            beyond += interval is not None and interval[0] > 1.0
            beyond_margin += interval is not None and interval[0] > 1.0 + margin
        out["approaches"][approach] = {"worse_single_draw": single, "worse_mean_of_draws": mean,
                                       "worse_beyond_noise": beyond, "worse_by_margin_beyond_noise": beyond_margin}
    return out


def mean_delta(results: list[dict[str, dict[str, float]]], baseline: str) -> dict[str, dict[str, float]]:
    """Mean relative change of VR and cost against ``baseline`` (−0.478 = 47.8% lower).

    Scenarios where the baseline's value is 0 have no relative change and are
    left out of that mean (``n_vr`` / ``n_cost`` say how many counted);
    ``worst_vr`` is the largest relative change of VR among them, and
    ``n_worse_10pct`` how many are more than 10% worse.
    """
    out: dict[str, dict[str, float]] = {}
    for approach in results[0]:
        if approach == baseline:
            continue
        deltas = {"vr": [], "cost": []}
        for r in results:
            for metric in deltas:
                base = r[baseline][metric]
                if base > 0:
                    deltas[metric].append(r[approach][metric] / base - 1.0)
        out[approach] = {m: float(np.mean(v)) if v else 0.0 for m, v in deltas.items()}
        out[approach].update({f"n_{m}": len(v) for m, v in deltas.items()})
        out[approach]["worst_vr"] = float(max(deltas["vr"])) if deltas["vr"] else 0.0
        out[approach]["n_worse_10pct"] = sum(1 for d in deltas["vr"] if d > 0.10)
    return out


def _setup(log: pd.DataFrame, sizes: set[int], seed: int, demand: str = "median"):
    """World, calibration report, SLO references, usable templates, time unit and feature table."""
    return calibrated_world(log, sizes, seed, demand)


def predictor_error(frames: list[pd.DataFrame]) -> dict[str, float]:
    """Q-error of the routers' predictions (made at routing time) against the world's latencies."""

    if not frames:
        return q_error_summary(np.empty(0), np.empty(0))
    import pandas as pd

    both = pd.concat(frames, ignore_index=True).dropna()
    out = q_error_summary(both["predicted_s"].to_numpy(), both["latency_s"].to_numpy())
    out["under_predicted"] = float((both["predicted_s"] < both["latency_s"]).mean())
    return out


def _result(scenarios: list[dict], baseline: str, report: Any, predicted_vs_world: list[pd.DataFrame],
            time_scale: dict[str, Any]) -> dict[str, Any]:
    """The JSON shape every simulated experiment returns."""
    results = [{a: {"vr": r["vr"], "cost": r["cost"]} for a, r in s["results"].items()} for s in scenarios]
    return {
        "scenarios": scenarios,
        "baseline": baseline,
        "mean_delta": mean_delta(results, baseline),
        "world": {"alpha": {str(k): v for k, v in report.alpha.items()}, "noise_sigma": report.noise_sigma,
                  "heldout_q_error": report.heldout_q_error,
                  "heldout_q_error_concurrent": report.heldout_q_error_concurrent},
        "predictor_vs_world": predictor_error(predicted_vs_world),
        "time_scale": time_scale,
    }


def router_experiment(log: pd.DataFrame, predictor: LatencyPredictor, cfg: RouterExperimentConfig | None = None,
                      *, on_scenario: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Run the router scenarios; returns the JSON-ready result (see ``sloctl experiment router``)."""

    cfg = cfg or RouterExperimentConfig()
    world, report, slo_ref, templates, mean_iso, table = _setup(
        log, {s for cs in cfg.cluster_sets for s in cs}, cfg.seed)
    minimum_s = cfg.minimum_s * mean_iso
    scenarios = []
    predicted_vs_world: list[pd.DataFrame] = []
    for load in cfg.loads:
        rate = load * 2.0 / mean_iso
        workload = base_workload([Template(t, "") for t in templates], rate, cfg.copies, seed=cfg.seed)
        for kappa in cfg.kappas:
            queries = [Query(i, q.template, q.arrival_s, kappa * slo_ref[q.template])
                       for i, q in enumerate(workload.queries)]
            for sizes_set in cfg.cluster_sets:
                clusters = [(f"c{i}-s{s}", s) for i, s in enumerate(sizes_set)]
                routers = {name: _fresh_router(name, predictor, table, cfg) for name in _ROUTERS}
                results = {}
                for name, router in routers.items():
                    sim = WarehouseSimulator(world, clusters, router, minimum_s=minimum_s, seed=cfg.seed)
                    outcome = sim.run(queries)
                    results[name] = {"vr": outcome.violation_rate, "cost": outcome.cost}
                    if name == "iconq+cost":
                        predicted_vs_world.append(outcome.queries[["predicted_s", "latency_s"]])
                        if router.guard_state is not None:
                            results[name]["guard"] = router.guard_state.summary()
                    if cfg.noise_draws > 1:
                        draws = [outcome.violation_rate]
                        for k in range(1, cfg.noise_draws):
                            again = _fresh_router(name, predictor, table, cfg)
                            draws.append(WarehouseSimulator(world, clusters, again, minimum_s=minimum_s,
                                                            seed=noise_seed(cfg.seed, k)).run(queries).violation_rate)
                        results[name]["vr_draws"] = draws
                        results[name]["vr_mean"] = float(np.mean(draws))
                scenario = {"lambda": rate, "load": load, "kappa": kappa, "clusters": list(sizes_set),
                            "results": results}
                scenarios.append(scenario)
                if on_scenario is not None:
                    on_scenario(scenario)
    result = _result(scenarios, "round-robin", report, predicted_vs_world,
                     {"mean_isolated_s": mean_iso, "minimum_s": minimum_s, "copies": cfg.copies})
    if cfg.noise_draws > 1:
        result["noise"] = noise_summary(scenarios, "round-robin")
    return result


_ROUTERS = ("round-robin", "stage+cost", "iconq+cost")


def _fresh_router(name: str, predictor: LatencyPredictor, table: pd.DataFrame, cfg: RouterExperimentConfig):
    """A new router of the experiment's approach ``name`` (fresh state: one per simulated run)."""
    if name == RouterKind.ROUND_ROBIN:
        return RoundRobinRouter()
    if name == "stage+cost":
        return StageCostRouter(OnlinePredictor(predictor, table, use_iconq=False))
    return IconqRouter(OnlinePredictor(predictor, table), slo_margin=cfg.slo_margin,
                       cost_tolerance=cfg.cost_tolerance, guard=cfg.guard,
                       violation_spread=cfg.violation_spread, tie_break=cfg.tie_break)


_AUTOSCALER = RelativeAutoscalerSettings()


@dataclass(frozen=True)
class ScalingExperimentConfig:
    """Scenarios of Tables 3-4, scaled: one starting cluster, overloaded at first.

    Attributes:
        loads: offered load as a fraction of one size-1 cluster's capacity.
        kappas: SLO multipliers.
        start_sizes: the single starting cluster's size.
        copies: copies of every template in BaseWorkload.
        minimum_s, spinup_delay_s, window_s, t_idle_s, t_min_lifetime_s: in
            units of the mean isolated latency on size 1 (the paper's 60 s,
            300 s, ... against its query latencies).
        queue_n: N of the Queue@N trigger baseline.
    """

    loads: tuple[float, ...] = (1.0, 1.4)
    kappas: tuple[float, ...] = (4.0, 2.0)
    start_sizes: tuple[int, ...] = (1, 2)
    copies: int = 10
    minimum_s: float = _AUTOSCALER.minimum_s
    spinup_delay_s: float = _AUTOSCALER.spinup_delay_s
    window_s: float = _AUTOSCALER.window_s
    t_idle_s: float = _AUTOSCALER.t_idle_s
    t_min_lifetime_s: float = _AUTOSCALER.t_min_lifetime_s
    theta: int = _AUTOSCALER.theta
    tau_trigger: float = _AUTOSCALER.tau_trigger
    tau_target: float = _AUTOSCALER.tau_target
    mu: int = _AUTOSCALER.mu
    queue_n: int = 8
    candidate_sizes: tuple[int, ...] = _AUTOSCALER.candidate_sizes
    seed: int = 0
    slo_margin: float = 0.3
    cost_tolerance: float = 3.0
    guard: RouterGuard | None = None
    violation_spread: float = 0.0

    def autoscaler_settings(self) -> RelativeAutoscalerSettings:
        """The autoscaler knobs of this experiment (in units of the mean isolated latency)."""
        return RelativeAutoscalerSettings(
            minimum_s=self.minimum_s, spinup_delay_s=self.spinup_delay_s, window_s=self.window_s,
            t_idle_s=self.t_idle_s, t_min_lifetime_s=self.t_min_lifetime_s, theta=self.theta,
            tau_trigger=self.tau_trigger, tau_target=self.tau_target, mu=self.mu,
            candidate_sizes=self.candidate_sizes)


def autoscaler_config(cfg: ScalingExperimentConfig, mean_iso: float, *, candidate_sizes: tuple[int, ...] | None = None,
                      spinup_delay_s: float | None = None, max_clusters: int = 4) -> Any:
    """The :class:`~sloctl.control.autoscaler.AutoscalerConfig` of ``cfg`` in seconds (units × ``mean_iso``)."""
    return cfg.autoscaler_settings().config(mean_iso, candidate_sizes=candidate_sizes, spinup_delay_s=spinup_delay_s,
                                            max_clusters=max_clusters)


def scaling_setup(log: pd.DataFrame, cfg: ScalingExperimentConfig, demand: str = "median"):
    """:func:`_setup` for the sizes a scaling experiment starts with or may add."""
    return _setup(log, set(cfg.start_sizes) | set(cfg.candidate_sizes), cfg.seed, demand)


def _run_scaling(kind: str, approach: str, world, predictor, table, queries, start_size: int, cfg, mean_iso: float):

    def make_router(model):
        return IconqRouter(model, slo_margin=cfg.slo_margin, cost_tolerance=cfg.cost_tolerance, guard=cfg.guard,
                           violation_spread=cfg.violation_spread)

    router = make_router(OnlinePredictor(predictor, table))
    scaled = autoscaler_config(cfg, mean_iso)
    minimum_s = cfg.minimum_s * mean_iso
    n = len(queries)
    if kind == "sizer":
        mode = {"no-op": "none", "horizontal": "horizontal", "vertical+ours": "vertical", "add+ours": "add"}[approach]
        autoscaler = autoscaler_for(scaled, router, make_router, trigger=None, mode=mode, minimum_s=minimum_s,
                                    teardown=False)
        sim = WarehouseSimulator(world, [("c0", start_size)], router, minimum_s=minimum_s, seed=cfg.seed,
                                 autoscaler=autoscaler, force_scaling_at=int(0.2 * n), mark_at=(int(0.8 * n),))
        out = sim.run(queries)
        last = out.queries.sort_values("arrival_s").iloc[int(0.8 * n):]
        return {"vr": float(last["violated"].mean()), "cost": out.cost_since(int(0.8 * n)),
                "_predictions": out.queries[["predicted_s", "latency_s"]],
                "clusters": sorted(set(out.queries["cluster_size"].astype(int))), **_guard(router)}
    trigger = {"no-op": None, "queue": QueueTrigger(cfg.queue_n),
               "observed": SpinupTrigger(cfg.theta, cfg.tau_trigger, observed_only=True),
               "ours": SpinupTrigger(cfg.theta, cfg.tau_trigger)}[approach]
    autoscaler = autoscaler_for(scaled, router, make_router, trigger=trigger,
                                mode="none" if trigger is None else "add", minimum_s=minimum_s)
    sim = WarehouseSimulator(world, [("c0", start_size)], router, minimum_s=minimum_s, seed=cfg.seed,
                             autoscaler=autoscaler)
    out = sim.run(queries)
    return {"vr": out.violation_rate, "cost": out.cost, "_predictions": out.queries[["predicted_s", "latency_s"]],
            "spin_ups": sum(e["event"] == "spin_up" for e in out.events), **_guard(router)}


def _guard(router: IconqRouter) -> dict[str, Any]:
    """``{"guard": summary}`` when the router has a guard, else nothing."""
    return {"guard": router.guard_state.summary()} if router.guard_state is not None else {}


def scaling_experiment(kind: str, log: pd.DataFrame, predictor: LatencyPredictor,
                       cfg: ScalingExperimentConfig | None = None, *,
                       on_scenario: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Table 3 (``kind="sizer"``) or Table 4 (``kind="trigger"``) in simulation.

    ``sizer``: force one scaling decision after 20% of the arrivals, report
    VR and cost over the last 20%. ``trigger``: each trigger decides when to
    scale (size chosen by the Spinup Size Selector), report the whole run.
    """

    if kind not in ("sizer", "trigger"):
        raise ValueError(f"The 'kind' parameter must be 'sizer' or 'trigger', got {kind!r}.")
    cfg = cfg or ScalingExperimentConfig()
    world, report, slo_ref, templates, mean_iso, table = scaling_setup(log, cfg)
    approaches = (("no-op", "horizontal", "vertical+ours", "add+ours") if kind == "sizer"
                  else ("no-op", "queue", "observed", "ours"))
    scenarios = []
    predicted_vs_world: list[pd.DataFrame] = []
    for load in cfg.loads:
        rate = load / mean_iso
        workload = base_workload([Template(t, "") for t in templates], rate, cfg.copies, seed=cfg.seed)
        for kappa in cfg.kappas:
            queries = [Query(i, q.template, q.arrival_s, kappa * slo_ref[q.template])
                       for i, q in enumerate(workload.queries)]
            for start in cfg.start_sizes:
                results = {a: _run_scaling(kind, a, world, predictor, table, queries, start, cfg, mean_iso)
                           for a in approaches}
                for r in results.values():
                    predicted_vs_world.append(r.pop("_predictions"))
                scenario = {"lambda": rate, "load": load, "kappa": kappa, "clusters": [start], "results": results}
                scenarios.append(scenario)
                if on_scenario is not None:
                    on_scenario(scenario)
    return _result(scenarios, "no-op", report, predicted_vs_world,
                   {"mean_isolated_s": mean_iso, "unit": "mean isolated latency on size 1"})
