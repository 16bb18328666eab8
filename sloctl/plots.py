"""Plots a person reads after a command: predicted vs actual, approaches side by side, forecasts, placements.

Every figure names its axes with units, keeps tick labels readable (plain
numbers on log axes, percentages for rates) and is written where the caller
says, by default under ``reports/`` (never the working folder's root). Each
``*_figure`` function returns the matplotlib figure (tests read its axes);
each ``plot_*`` writes it with :func:`~sloctl.datasets.analysis.save_figure`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sloctl.datasets.analysis import save_figure

__all__ = [
    "REPORTS",
    "approach_bars_figure",
    "forecast_figure",
    "placement_figure",
    "plot_approach_bars",
    "plot_forecast",
    "plot_placements",
    "plot_predicted_vs_actual",
    "predicted_vs_actual_figure",
    "report_path",
    "scenario_label",
]

#: Where generated images go unless the user names a path.
REPORTS = Path("reports")


def report_path(name: str, folder: str | Path | None = None) -> Path:
    """``reports/<name>`` (or ``folder/<name>``): the default place of a generated image."""
    return Path(folder if folder is not None else REPORTS) / name


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_log_ticks(axis) -> None:
    """Log-axis ticks as plain numbers (0.1, 1, 10), not 10^x, and no crowded minor labels."""
    import matplotlib.ticker as ticker

    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


# -- predicted vs actual -----------------------------------------------------------------
def predicted_vs_actual_figure(predicted_s: Sequence[float], actual_s: Sequence[float], *,
                               groups: Sequence[Any] | None = None, group_label: str = "cluster size",
                               title: str = "Predicted vs actual latency"):
    """Log-log scatter of predicted against actual latency, the y = x line and the ×2 band.

    Args:
        predicted_s, actual_s: seconds, one pair per query (non-positive pairs are dropped).
        groups: a label per query (e.g. cluster size) to colour by.
        group_label: what ``groups`` are, for the legend.
        title: the figure's title.
    """
    plt = _pyplot()
    p, a = np.asarray(predicted_s, float), np.asarray(actual_s, float)
    if p.shape != a.shape:
        raise ValueError(f"The 'predicted_s' and 'actual_s' parameters must have the same length, "
                         f"got {p.size} and {a.size}.")
    keep = (p > 0) & (a > 0) & np.isfinite(p) & np.isfinite(a)
    if not keep.any():
        raise ValueError("No query has a positive predicted and actual latency to plot.")
    g = np.asarray(groups if groups is not None else ["all"] * p.size, dtype=object)[keep]
    p, a = p[keep], a[keep]
    fig, ax = plt.subplots(figsize=(6, 5.4), dpi=110)
    for value in sorted(set(g), key=str):
        mask = g == value
        n = int(mask.sum())
        label = f"{group_label} {value} ({n} queries)" if groups is not None else f"{n} queries"
        ax.scatter(a[mask], p[mask], s=12, alpha=0.6, label=label)
    lo, hi = min(a.min(), p.min()) / 1.5, max(a.max(), p.max()) * 1.5
    line = np.array([lo, hi])
    ax.plot(line, line, color="black", lw=1, label="predicted = actual")
    ax.fill_between(line, line / 2, line * 2, color="grey", alpha=0.15, label="within ×2")
    q = np.maximum(p / a, a / p)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    _plain_log_ticks(ax.xaxis)
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("actual latency (s)")
    ax.set_ylabel("predicted latency (s)")
    ax.set_title(f"{title}\nQ-error p50 {np.median(q):.2f}, p90 {np.quantile(q, 0.9):.2f}", fontsize=10)
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def plot_predicted_vs_actual(predicted_s: Sequence[float], actual_s: Sequence[float], path: str | Path,
                             **options: Any) -> Path:
    """Write :func:`predicted_vs_actual_figure` to ``path``."""
    return save_figure(predicted_vs_actual_figure(predicted_s, actual_s, **options), path)


# -- approaches side by side -------------------------------------------------------------
def approach_bars_figure(results: Mapping[str, Any], *, title: str = "",
                         cost_label: str = "cost (size-1 cluster-seconds)"):
    """Bar charts of SLO violation rate (%) and cost, one bar per approach, grouped by scenario.

    Args:
        results: ``{approach: {"vr": fraction, "cost": number}}`` for one
            scenario, or ``{scenario label: {approach: {...}}}`` for several
            (the router, sizer and trigger experiments' scenarios).
        title: the figure's title.
        cost_label: the cost axis, with its unit.
    """
    import matplotlib.ticker as ticker

    plt = _pyplot()
    if not results:
        raise ValueError("The 'results' parameter must hold at least one approach.")
    first = next(iter(results.values()))
    groups = {"": results} if "vr" in first else dict(results)
    approaches = list(dict.fromkeys(a for g in groups.values() for a in g))
    n_groups, n = len(groups), len(approaches)
    width = 0.8 / n
    figsize = (min(12.0, max(7.0, 0.45 * n_groups * n + 2)), 7.5 if n_groups > 2 else 4)
    fig, axes = plt.subplots(2 if n_groups > 2 else 1, 1 if n_groups > 2 else 2, figsize=figsize, dpi=110)
    if n_groups == 1:  # one scenario: the approaches are the x axis, no legend needed
        groups = {a: {a: g} for a, g in next(iter(groups.values())).items()}
        n_groups, n, width = len(groups), 1, 0.7
    x = np.arange(n_groups)
    single = n == 1
    for ax, key, label, scale in ((axes[0], "vr", "SLO violation rate (% of queries)", 100.0),
                                  (axes[1], "cost", cost_label, 1.0)):
        top = 0.0
        for j, approach in enumerate(approaches):
            values = [scale * float(g[approach][key]) if approach in g else np.nan for g in groups.values()]
            if single:
                values = [v if approach in g else np.nan for v, g in zip(values, groups.values(), strict=True)]
            bars = ax.bar(x + (0 if single else (j - (n - 1) / 2) * width), values, width, color=f"C{j}",
                          label=approach)
            if n_groups * n <= 12:
                fmt = "{:.1f}%" if key == "vr" else "{:.0f}"
                ax.bar_label(bars, labels=[fmt.format(v) if np.isfinite(v) else "" for v in values], fontsize=7,
                             padding=2)
            top = max(top, np.nanmax(values) if np.isfinite(values).any() else 0.0)
        ax.set_ylabel(label)
        ax.set_ylim(0, max(top * (1.15 if single else 1.3), 1e-9))
        ax.set_xticks(x)
        ax.set_xticklabels(list(groups), fontsize=8, rotation=20 if single and n_groups > 3 else 0)
        ax.set_xlabel("approach" if single else "scenario")
        ax.grid(axis="y", alpha=0.3)
        if not single:
            ax.legend(fontsize=8, ncol=min(n, 4), loc="upper right")
    axes[0].yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}%"))
    axes[0].set_title("SLO violations (lower is better)", fontsize=9)
    axes[1].set_title("cost (lower is better)", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def scenario_label(scenario: Mapping[str, Any]) -> str:
    """``load 0.85, κ 2, [2, 1]``: a short label of an experiment scenario for an axis."""
    clusters = scenario.get("clusters")
    sizes = ",".join(str(c[1] if isinstance(c, list | tuple) else c) for c in clusters) if clusters else ""
    return f"load {scenario['load']:g}\nκ {scenario['kappa']:g}\nsizes {sizes}"


def plot_approach_bars(results: Mapping[str, Mapping[str, float]], path: str | Path, **options: Any) -> Path:
    """Write :func:`approach_bars_figure` to ``path``."""
    return save_figure(approach_bars_figure(results, **options), path)


# -- forecast vs actual ------------------------------------------------------------------
def forecast_figure(actual: Sequence[float], forecasts: Mapping[str, Sequence[float]], *,
                    start: Any = None, title: str = "Day-ahead forecast vs actual"):
    """Hourly query counts over the test days: the actual series and each policy's forecast.

    Args:
        actual: queries per hour, hour by hour.
        forecasts: ``{policy: queries per hour}``, the same length as ``actual``.
        start: the first test day (a date; labels the x axis in days from it).
        title: the figure's title.
    """
    plt = _pyplot()
    a = np.asarray(actual, float)
    fig, ax = plt.subplots(figsize=(9, 4), dpi=110)
    hours = np.arange(a.size)
    ax.plot(hours, a, color="black", lw=1.4, label="actual")
    for i, (name, values) in enumerate(forecasts.items()):
        f = np.asarray(values, float)
        if f.shape != a.shape:
            raise ValueError(f"The forecast of {name!r} must have {a.size} hours, got {f.size}.")
        wape = float(np.abs(f - a).sum() / a.sum()) if a.sum() else float("nan")
        ax.plot(hours, f, lw=1, alpha=0.85, color=f"C{i}", label=f"{name} (WAPE {wape:.2f})")
    days = max(1, a.size // 24)
    step = 1 if days <= 14 else 7
    ticks = np.arange(0, a.size + 1, 24 * step)
    ax.set_xticks(ticks)
    if start is not None:
        import pandas as pd

        first = pd.Timestamp(start)
        ax.set_xticklabels([(first + pd.Timedelta(hours=int(t))).strftime("%m-%d") for t in ticks], fontsize=8)
        ax.set_xlabel("test day (month-day, ticks at midnight)")
    else:
        ax.set_xticklabels([str(int(t // 24)) for t in ticks], fontsize=8)
        ax.set_xlabel("test day (ticks at midnight)")
    ax.set_xlim(0, max(a.size - 1, 1))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("queries per hour")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    return fig


def plot_forecast(actual: Sequence[float], forecasts: Mapping[str, Sequence[float]], path: str | Path,
                  **options: Any) -> Path:
    """Write :func:`forecast_figure` to ``path``."""
    return save_figure(forecast_figure(actual, forecasts, **options), path)


# -- placements over time ----------------------------------------------------------------
def placement_figure(placements: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]] = (), *,
                     title: str = "Where each query ran"):
    """A timeline per cluster: each query a bar from start to end, red when it missed its SLO.

    Args:
        placements: one mapping per query with ``cluster_id``, ``start_s``,
            ``end_s`` and ``violated`` (and optionally ``cluster_size``).
        events: scaling events with ``event`` and run-clock ``t`` (spin-ups, ready, ...).
        title: the figure's title.
    """
    from matplotlib.patches import Patch

    plt = _pyplot()
    rows = [p for p in placements if p.get("start_s") is not None and p.get("end_s") is not None]
    if not rows:
        raise ValueError("The 'placements' parameter holds no query with a start and an end to plot.")
    clusters = sorted({str(p["cluster_id"]) for p in rows})
    sizes = {str(p["cluster_id"]): p.get("cluster_size") for p in rows}
    lane = {c: i for i, c in enumerate(clusters)}
    slots = _slots(rows)
    depth = {c: 1 + max(slots[i] for i, p in enumerate(rows) if str(p["cluster_id"]) == c) for c in clusters}
    fig, ax = plt.subplots(figsize=(9, 1.6 + 1.0 * len(clusters)), dpi=110)
    # Queries running at once on one cluster get sub-lanes of its row, so concurrency reads as height.
    for i, p in enumerate(rows):
        c = str(p["cluster_id"])
        height = 0.8 / depth[c]
        y = lane[c] - 0.4 + slots[i] * height
        colour = "tab:red" if p.get("violated") else "tab:blue"
        ax.broken_barh([(float(p["start_s"]), max(float(p["end_s"]) - float(p["start_s"]), 1e-3))],
                       (y + 0.05 * height, 0.9 * height), facecolors=colour, alpha=0.6, edgecolor="none")
    styles = {"spin_up": "tab:green", "ready": "tab:olive", "force": "black"}
    seen = set()
    for e in events:
        if e.get("t") is None:
            continue
        name = str(e.get("event"))
        ax.axvline(float(e["t"]), color=styles.get(name, "tab:grey"), lw=1.0, ls="--",
                   label=name.replace("_", " ") if name not in seen else None)
        seen.add(name)
    ax.set_yticks(range(len(clusters)))
    ax.set_yticklabels([f"{c} (size {sizes[c]})" if sizes[c] is not None else c for c in clusters])
    ax.set_ylim(-0.5, len(clusters) - 0.5)
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("cluster")
    n_bad = sum(bool(p.get("violated")) for p in rows)
    ax.set_title(f"{title}: {len(rows)} queries, {n_bad} missed their SLO\n"
                 f"(queries running at once stack within their cluster's row)", fontsize=10)
    handles = [Patch(color="tab:blue", alpha=0.6, label="met SLO"),
               Patch(color="tab:red", alpha=0.6, label="missed SLO"), *ax.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.2 / len(clusters)),
              ncol=len(handles), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _slots(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """The lowest sub-lane free on its cluster for each query, in order of start (interval packing)."""
    order = sorted(range(len(rows)), key=lambda i: float(rows[i]["start_s"]))
    busy: dict[str, list[float]] = {}  # cluster -> end time of the query in each sub-lane
    out = [0] * len(rows)
    for i in order:
        lanes = busy.setdefault(str(rows[i]["cluster_id"]), [])
        start = float(rows[i]["start_s"])
        free = next((j for j, end in enumerate(lanes) if end <= start), None)
        if free is None:
            lanes.append(0.0)
            free = len(lanes) - 1
        lanes[free] = float(rows[i]["end_s"])
        out[i] = free
    return out


def plot_placements(placements: Sequence[Mapping[str, Any]], path: str | Path,
                    events: Sequence[Mapping[str, Any]] = (), **options: Any) -> Path:
    """Write :func:`placement_figure` to ``path``."""
    return save_figure(placement_figure(placements, events, **options), path)
