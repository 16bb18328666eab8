"""Retry budgets learned from the live testbed's own traces: fit, compare, optimise, run the budgets live.

The testbed (:class:`~sloctl.experiments.retry_live.RetryTestbed`) runs a
network behind Envoy sidecars with its services and load generator traced by
the OpenTelemetry SDK (OTLP/JSON files) and every sidecar writing an access
log. At each offered load the traces and the logs of that load alone are
fitted into a network file twice (:func:`~sloctl.training.network_fit.fit_network`,
:func:`~sloctl.training.network_fit_access.fit_network_from_access_logs`); each
fitted network is set beside the configured one (capacities, routing weights,
arrivals) and solved, and the analysis's end-to-end rejection per class is set
beside what the load generator measured. Then budgets are optimised on the
network fitted at one load and run live at that load: measured against the
analysis's prediction for them. The fitted files are written beside the
traces, so every figure can be reproduced with ``sloctl fit network``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sloctl.experiments.retry_live import RetryTestbed, scaled_spec
from sloctl.models.retry import solve_network
from sloctl.models.retry_network import NetworkSpec, load_network
from sloctl.simulation.retry_sweep import sweep_spec
from sloctl.training.network_fit import FitOptions, NetworkFit, fit_network
from sloctl.training.network_fit_access import fit_network_from_access_logs

__all__ = ["compare_networks", "retry_fit_live_experiment"]


def compare_networks(fitted: NetworkSpec, truth: NetworkSpec) -> dict[str, Any]:
    """How far a fitted network is from the configured one: capacities, routing weights, arrivals."""
    true_cap = {s.name: s.capacity_per_s for s in truth.services}
    cap = {s.name: s.capacity_per_s / true_cap[s.name] - 1 for s in fitted.services if s.name in true_cap}
    routing: dict[str, float] = {}
    for c in truth.classes:
        edges = {(a, b) for a, row in truth.routing.get(c, {}).items() for b in row} | \
                {(a, b) for a, row in fitted.routing.get(c, {}).items() for b in row}
        for a, b in sorted(edges):
            if a in cap and b in cap:  # an edge into an unfitted service cannot be compared
                routing[f"{c}:{a}->{b}"] = (fitted.routing.get(c, {}).get(a, {}).get(b, 0.0)
                                            - truth.routing.get(c, {}).get(a, {}).get(b, 0.0))
    arrivals = {f"{c}:{s}": fitted.arrivals.get(c, {}).get(s, 0.0) / r - 1
                for c, row in truth.arrivals.items() for s, r in row.items() if r > 0}
    return {"capacity_rel_error": cap, "routing_abs_error": routing, "arrivals_rel_error": arrivals,
            "unfitted": sorted(set(true_cap) - set(cap)),
            "max_capacity_rel_error": max((abs(v) for v in cap.values()), default=None),
            "max_routing_abs_error": max((abs(v) for v in routing.values()), default=None),
            "max_arrivals_rel_error": max((abs(v) for v in arrivals.values()), default=None)}


def _grade(fit: NetworkFit, truth: NetworkSpec, measured: Mapping[str, float | None], model: str) -> dict[str, Any]:
    spec = fit.spec()
    predicted = {c: v["end_to_end_rejection"] for c, v in solve_network(spec, model=model).to_json()["classes"].items()}
    errors = [abs(predicted[c] - m) for c, m in measured.items() if m is not None and c in predicted]
    return {"network": fit.network, "against_config": compare_networks(spec, truth),
            "config_within_ci95": _within_ci(fit.report, truth), "analysis": predicted,
            "rejection_abs_error": max(errors, default=None),
            "unfitted": fit.report["unfitted"], "anomalies": fit.report["anomalies"]}


def _within_ci(report: Mapping[str, Any], truth: NetworkSpec) -> dict[str, bool]:
    """Whether each configured arrival rate and routing weight lies in the fit's 95% sampling interval."""
    out: dict[str, bool] = {}
    for c, row in report["classes"].items():
        for s, (lo, hi) in row.get("arrivals_ci95_per_s", {}).items():
            out[f"arrivals {c}:{s}"] = lo <= truth.arrivals.get(c, {}).get(s, 0.0) <= hi
        for a, callees in row.get("routing", {}).items():
            for b, cell in callees.items():
                if cell.get("weight_ci95") and b in truth.service_names and a in truth.service_names:
                    lo, hi = cell["weight_ci95"]
                    out[f"routing {c}:{a}->{b}"] = lo <= truth.routing.get(c, {}).get(a, {}).get(b, 0.0) <= hi
    return out


def _fit_point(folder: Path, weights: Mapping[str, float], min_spans: int) -> tuple[NetworkFit, NetworkFit]:
    options = FitOptions(weights=dict(weights), min_spans=min_spans)
    traced = fit_network(sorted(folder.glob("*.jsonl")), fmt="otlp-json", options=options)
    logged = fit_network_from_access_logs(sorted(folder.glob("access-*.log")), options=options)
    for fit, name in ((traced, "network-from-traces.yaml"), (logged, "network-from-access-logs.yaml")):
        (folder / name).write_text(fit.to_yaml())
    return traced, logged


def retry_fit_live_experiment(network_path: str | Path, traces_dir: str | Path, *,
                              loads: Sequence[float] = (0.5, 1.0, 1.5, 2.0),
                              budget: Mapping[str, int] | None = None, optimise_at: float | None = 1.5,
                              duration_s: float = 40.0, warmup_s: float = 15.0, tail_s: float = 15.0, seed: int = 0,
                              capacity_scale: float = 0.2, buffer: int | None = 12, retry_delay_s: float = 2.0,
                              fixed: Sequence[str] = ("high",), model: str = "mm1m", min_spans: int = 100,
                              on_point: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Fit the live testbed's network from its traces and access logs at each load; optimise and run the budgets.

    Args:
        network_path: the configured network (scaled as in :func:`scaled_spec`).
        traces_dir: where each load's traces, access logs and fitted files go (``rho-<load>/``).
        budget: the retry limits the sweep runs with (default: the network file's).
        optimise_at: the load whose traces-fitted network the budgets are optimised on and
            then run live (None: skip).
        min_spans: the fewest admitted attempts a fitted capacity may rest on.

    Returns:
        ``{"points": [{"offered_rho", "measured", "from_traces", "from_access_logs"}], "optimised": {...}}``
        where each ``from_*`` holds the fitted network, its errors against the configured one
        and the analysis's rejection on it.
    """
    base = scaled_spec(load_network(network_path), capacity_scale=capacity_scale, buffer=buffer,
                       retry_delay_s=retry_delay_s)
    k = dict(budget) if budget is not None else {c: max(base.retries[c].values()) for c in base.classes}
    traces_dir = Path(traces_dir)
    points, fitted_at = [], {}
    with RetryTestbed(base, k, seed=seed, traced=True) as bed:
        bed.collect(traces_dir / "startup")
        for i, rho in enumerate(loads):
            net = sweep_spec(base, rho, fixed).with_retries(k)
            run = bed.run_load(net.arrivals, duration_s=duration_s, warmup_s=warmup_s, tail_s=tail_s, seed=seed + i)
            folder = bed.collect(traces_dir / f"rho-{rho:g}")
            measured = {c: v["end_to_end_rejection"] for c, v in run["classes"].items()}
            traced, logged = _fit_point(folder, base.weights, min_spans)
            fitted_at[rho] = traced
            points.append({"offered_rho": float(rho), "k": k, "folder": str(folder), "measured": measured,
                           "requests": {c: v["requests"] for c, v in run["classes"].items()},
                           "from_traces": _grade(traced, net, measured, model),
                           "from_access_logs": _grade(logged, net, measured, model)})
            if on_point is not None:
                on_point(points[-1])
    result: dict[str, Any] = {"network": str(network_path), "capacity_scale": capacity_scale, "buffer": buffer,
                              "model": model, "duration_s": duration_s, "seed": seed, "points": points}
    if optimise_at is not None and optimise_at in fitted_at:
        result["optimised"] = _optimise_and_run(fitted_at[optimise_at], base, optimise_at, fixed, seed, model,
                                                duration_s, warmup_s, tail_s, traces_dir)
    return result


def _optimise_and_run(fit: NetworkFit, base: NetworkSpec, rho: float, fixed: Sequence[str], seed: int, model: str,
                      duration_s: float, warmup_s: float, tail_s: float, traces_dir: Path) -> dict[str, Any]:
    """Budgets optimised on the fitted network, run live at the same load, against the analysis's prediction."""
    from sloctl.training.retry_budget import BudgetSearch, optimise_budgets

    fitted = fit.spec()
    policy = optimise_budgets(fitted, BudgetSearch(model=model))
    k = {c: max(row.values()) for c, row in policy.retries.items()}
    predicted = {c: v["end_to_end_rejection"]
                 for c, v in solve_network(fitted.with_retries(k), model=model).to_json()["classes"].items()}
    net = sweep_spec(base, rho, fixed).with_retries(k)
    with RetryTestbed(base, k, seed=seed, traced=True) as bed:
        run = bed.run_load(net.arrivals, duration_s=duration_s, warmup_s=warmup_s, tail_s=tail_s, seed=seed + 100)
        bed.collect(traces_dir / f"optimised-rho-{rho:g}")
    measured = {c: v["end_to_end_rejection"] for c, v in run["classes"].items()}
    errors = [abs(predicted[c] - m) for c, m in measured.items() if m is not None]
    return {"offered_rho": rho, "k": k, "predicted": predicted, "measured": measured,
            "abs_error": max(errors, default=None)}
