"""A simulated day (``make demo``): routing and autoscaling against baselines.

Arrivals follow an hourly contour (the Redset serverless trace when present,
else a synthetic daily curve), time-compressed so that one hour lasts
``hour_units`` mean isolated latencies and the busiest hour offers
``peak_load`` times what one size-1 cluster can serve. Three approaches run
on the same arrivals in the emulated warehouse:

* ``round-robin [1,1]`` — two fixed clusters, no scaling;
* ``queue@N`` — Iconq+ router, Queue@N trigger, Spinup Size Selector, teardown;
* ``autoslo`` — Iconq+ router, observed+projected trigger, Size Selector, teardown.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sloctl.control.autoscaler import QueueTrigger, RelativeAutoscalerSettings, SpinupTrigger, autoscaler_for
from sloctl.control.router import IconqRouter, Query, RoundRobinRouter, RouterGuard
from sloctl.datasets.analysis import save_figure
from sloctl.datasets.tpc import Template
from sloctl.datasets.workloads import contour_workload, hourly_counts
from sloctl.models.online import OnlinePredictor
from sloctl.simulation.emulator import calibrated_world
from sloctl.simulation.engine import WarehouseSimulator

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.models.predictor import LatencyPredictor

__all__ = ["plot_day", "simulated_day"]

#: Cluster sizes the emulated warehouse must know besides the autoscaler's candidates.
START_SIZES = (1, 2)
#: N of the Queue@N baseline.
QUEUE_N = 8
SHARED_HOURLY = Path(__file__).resolve().parents[2] / "shared" / "data" / "redset_serverless_hourly.parquet"


def simulated_day(log: pd.DataFrame, predictor: LatencyPredictor, *, hours: int = 24, hour_units: float = 40.0,
                  peak_load: float = 1.6, kappa: float = 3.0, seed: int = 0, contour_file: str | None = None,
                  slo_margin: float = 0.3, cost_tolerance: float = 3.0, guard: RouterGuard | None = None,
                  violation_spread: float = 0.0) -> dict[str, Any]:
    """Run the day; returns totals and per-hour VR / cumulative cost per approach."""

    knobs = RelativeAutoscalerSettings()  # in mean isolated latencies
    world, report, slo_ref, templates, mean_iso, table = calibrated_world(
        log, {*START_SIZES, *knobs.candidate_sizes}, seed)
    source = contour_file if contour_file is not None else (str(SHARED_HOURLY) if SHARED_HOURLY.is_file() else None)
    counts = hourly_counts(source, hours=hours, seed=seed)
    hour_s = hour_units * mean_iso
    peak_rate = peak_load / mean_iso
    scale = peak_rate * hour_s / max(counts.max(), 1.0)
    workload = contour_workload([Template(t, "") for t in templates], counts, time_compression=3600.0 / hour_s,
                                count_scale=scale, seed=seed)
    queries = [Query(i, q.template, q.arrival_s, kappa * slo_ref[q.template]) for i, q in enumerate(workload.queries)]
    arrivals = np.array([q.arrival_s for q in queries])
    hour_index = np.minimum((arrivals // hour_s).astype(int), hours - 1)
    marks = tuple(int(np.searchsorted(arrivals, h * hour_s)) for h in range(1, hours)
                  if np.searchsorted(arrivals, h * hour_s) < len(queries))
    minimum_s = knobs.minimum_s * mean_iso
    scaled = knobs.config(mean_iso)

    def make_router(model: Any) -> IconqRouter:
        return IconqRouter(model, slo_margin=slo_margin, cost_tolerance=cost_tolerance, guard=guard,
                           violation_spread=violation_spread)

    results: dict[str, Any] = {}
    for name in ("round-robin [1,1]", f"queue@{QUEUE_N}", "autoslo"):
        if name.startswith("round-robin"):
            sim = WarehouseSimulator(world, [("c0", 1), ("c1", 1)], RoundRobinRouter(), minimum_s=minimum_s,
                                     seed=seed, mark_at=marks)
        else:
            router = make_router(OnlinePredictor(predictor, table))
            trigger = (QueueTrigger(QUEUE_N) if name.startswith("queue")
                       else SpinupTrigger(knobs.theta, knobs.tau_trigger))
            autoscaler = autoscaler_for(scaled, router, make_router, trigger=trigger, minimum_s=minimum_s)
            sim = WarehouseSimulator(world, [("c0", 1)], router, minimum_s=minimum_s, seed=seed,
                                     autoscaler=autoscaler, mark_at=marks)
        out = sim.run(queries)
        frame = out.queries.sort_values("query_id")
        per_hour_vr = [float(frame["violated"].to_numpy()[hour_index == h].mean()) if (hour_index == h).any()
                       else float("nan") for h in range(hours)]
        cumulative = [out.cost_marks.get(m, np.nan) for m in marks] + [out.cost]
        results[name] = {"vr": out.violation_rate, "cost": out.cost, "per_hour_vr": per_hour_vr,
                         "cumulative_cost": cumulative,
                         "spin_ups": sum(e["event"] == "spin_up" for e in out.events),
                         "tear_downs": sum(e["event"] == "tear_down" for e in out.events)}
    return {"queries": len(queries), "hours": hours, "hour_s": hour_s, "kappa": kappa, "results": results,
            "contour": "redset" if source else "synthetic", "world_alpha": report.alpha}


def plot_day(day: dict[str, Any], path: str | Path) -> Path:
    """Per-hour violation rate and cumulative cost of each approach, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker as ticker

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), dpi=110, sharex=True)
    for name, r in day["results"].items():
        hours = np.arange(len(r["per_hour_vr"]))
        top.plot(hours, 100 * np.asarray(r["per_hour_vr"], float), marker="o", ms=3,
                 label=f"{name} (VR {r['vr']:.1%})")
        # cumulative_cost[i] is the bill at the end of hour i (the last one at the end of the day)
        ends = np.arange(1, len(r["cumulative_cost"]) + 1)
        bottom.plot(ends, r["cumulative_cost"], label=f"{name} (cost {r['cost']:.0f})")
    top.set_ylabel("SLO violation rate (% of the hour's queries)")
    top.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}%"))
    top.set_ylim(bottom=0)
    top.set_title(f"A simulated day ({day['queries']} queries, {day['contour']} contour; "
                  f"an hour lasts {day['hour_s']:.0f} s of simulated time)", fontsize=10)
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_ylabel("cost so far (size-1 cluster-seconds)")
    bottom.set_xlabel("hour of the day (h)")
    bottom.xaxis.set_major_locator(ticker.MultipleLocator(2 if day.get("hours", 24) > 12 else 1))
    bottom.set_ylim(bottom=0)
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    return save_figure(fig, path)
