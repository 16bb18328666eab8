"""Analysis vs simulation over a load sweep (the shape of DiffTry's Fig. 5).

As in the paper's §VII.A, one class's load stays fixed and the others' grows
until the bottleneck's total offered load reaches each target ρ; at each point
the network is solved with the analysis and run in the discrete-event
simulator for every retry-budget vector given. The result feeds a table, a PNG
and the tests that hold the analysis to within 0.02 of the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sloctl.datasets.analysis import save_figure
from sloctl.models.retry import offered_rho, solve_network
from sloctl.models.retry_network import NetworkSpec
from sloctl.simulation.retry_sim import simulate_network

__all__ = ["plot_retry_sweep", "retry_sweep", "sweep_spec"]


def sweep_spec(spec: NetworkSpec, rho: float, fixed: Sequence[str]) -> NetworkSpec:
    """``spec`` with the non-``fixed`` classes scaled so that the bottleneck's offered load is ``rho``.

    One scale factor, applied to every class not in ``fixed``, is found by
    bisection (offered load grows with it).

    Raises:
        ValueError: the fixed classes alone already offer ``rho`` or more, or
            there is no class left to scale.
    """

    scaled = [c for c in spec.classes if c not in fixed]
    if not scaled:
        raise ValueError(f"The 'fixed' parameter holds every class ({', '.join(spec.classes)}); one must be swept.")
    rho_fixed = offered_rho(spec.scale_arrivals({c: 0.0 for c in scaled}))
    if rho_fixed >= rho:
        raise ValueError(f"The fixed classes alone offer load {rho_fixed:.3g} >= the target {rho:g}.")
    if offered_rho(spec.scale_arrivals({c: 0.0 for c in fixed})) <= 0:
        raise ValueError(f"The swept classes ({', '.join(scaled)}) have no external arrivals to scale.")
    # The bottleneck may move as the swept classes grow: find the factor by bisection (load grows with it).
    lo, hi = 0.0, 1.0
    while offered_rho(spec.scale_arrivals({c: hi for c in scaled})) < rho:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if offered_rho(spec.scale_arrivals({c: mid for c in scaled})) < rho:
            lo = mid
        else:
            hi = mid
    return spec.scale_arrivals({c: (lo + hi) / 2 for c in scaled})


def retry_sweep(spec: NetworkSpec, rhos: Sequence[float], budgets: Sequence[Mapping[str, int]], *,
                fixed: Sequence[str] = (), model: str = "mm1m", seed: int = 0, duration_s: float = 600.0,
                simulate: bool = True, on_point: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Analysis (and simulation) of ``spec`` at each load in ``rhos`` for each budget vector.

    Args:
        spec: the network.
        rhos: target bottleneck offered loads.
        budgets: retry limits per class (every hop), e.g. ``[{"high": 5, "low": 1}, {"high": 5, "low": 5}]``.
        fixed: classes whose arrivals stay as in ``spec`` (default: the first class).
        model: the analysis's rejection function.
        seed, duration_s: the simulator's.
        simulate: False for analysis only (fast).
        on_point: called with each finished point.

    Returns:
        ``{"network_model": model, "points": [{"offered_rho", "k", "analysis": {C: rejection},
        "simulated": {C: rejection}, "simulated_ci": {C: [lo, hi]}, "calls_per_success": {...}}]}``.
    """

    fixed = tuple(fixed) if fixed else spec.classes[:1]
    points = []
    for rho in rhos:
        loaded = sweep_spec(spec, rho, fixed)
        for k in budgets:
            net = loaded.with_retries(dict(k))
            analysis = solve_network(net, model=model).to_json()
            point: dict[str, Any] = {
                "offered_rho": float(rho), "k": dict(k),
                "arrivals": {c: dict(v) for c, v in net.arrivals.items()},
                "analysis": {c: v["end_to_end_rejection"] for c, v in analysis["classes"].items()},
            }
            if simulate:
                sim = simulate_network(net, seed=seed, duration_s=duration_s).to_json()
                point["simulated"] = {c: v["end_to_end_rejection"] for c, v in sim["classes"].items()}
                point["simulated_ci"] = {c: v["end_to_end_rejection_ci"] for c, v in sim["classes"].items()}
                point["calls_per_success"] = {c: v["calls_per_success"] for c, v in sim["classes"].items()}
                point["max_abs_error"] = max(abs(point["analysis"][c] - point["simulated"][c]) for c in spec.classes)
            points.append(point)
            if on_point is not None:
                on_point(point)
    return {"network_model": model, "fixed": list(fixed), "seed": seed, "duration_s": duration_s, "points": points}


def plot_retry_sweep(result: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """End-to-end rejection per class against offered load: analysis lines, simulation markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    budgets = []
    for p in result["points"]:
        key = tuple(sorted(p["k"].items()))
        if key not in budgets:
            budgets.append(key)
    styles = ["-", "--", ":", "-."]
    for b, key in enumerate(budgets):
        pts = [p for p in result["points"] if tuple(sorted(p["k"].items())) == key]
        label_k = "(" + ",".join(str(v) for _, v in key) + ")"
        for klass in pts[0]["analysis"]:
            rho = [p["offered_rho"] for p in pts]
            line, = ax.plot(rho, [p["analysis"][klass] for p in pts], styles[b % len(styles)],
                            label=f"{klass}, k={label_k}: analysis")
            if "simulated" in pts[0]:
                ax.plot(rho, [p["simulated"][klass] for p in pts], "o", color=line.get_color(), fillstyle="none",
                        label=f"{klass}, k={label_k}: simulation")
    from matplotlib.ticker import MultipleLocator, PercentFormatter

    ax.set_xlabel("offered load ρ at the bottleneck (1 = saturated; no losses, no retries)")
    ax.set_ylabel("end-to-end rejection (% of requests)")
    ax.set_ylim(-0.02, 1.0)
    ax.yaxis.set_major_locator(MultipleLocator(0.1))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(title or "DiffTry: per-class rejection, analysis vs simulation")
    return save_figure(fig, path)
