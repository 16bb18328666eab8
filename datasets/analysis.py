"""Summaries of a query log: concurrency, per-template slowdown, plots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["overlap_counts", "plot_latency_vs_concurrency", "save_figure", "template_summary"]


def overlap_counts(df: pd.DataFrame) -> pd.Series:
    """For each query, how many other queries ran on its cluster while it ran.

    Two executions overlap when each starts before the other ends. Queries on
    different clusters never interfere here (clusters have their own cores).
    """
    import numpy as np
    import pandas as pd

    out = pd.Series(0, index=df.index, dtype="int64")
    for _, group in df.groupby("cluster_id", sort=False):
        start = group["start_s"].to_numpy()
        end = group["end_s"].to_numpy()
        overlaps = (start[:, None] < end[None, :]) & (start[None, :] < end[:, None])
        out.loc[group.index] = overlaps.sum(axis=1) - 1
    return out.astype("int64").clip(lower=0).astype(np.int64)


def template_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per template and cluster size: isolated latency vs latency under concurrency.

    Returns:
        Columns ``template, cluster_size, isolated_s`` (median latency with no
        neighbour), ``n_concurrent``, ``median_s`` and ``p95_s`` (latency with
        at least one neighbour), ``slowdown`` (``median_s / isolated_s``) and
        ``mean_neighbours``. Only ``ok`` rows count.
    """
    import numpy as np
    import pandas as pd

    ok = df[df["status"] == "ok"].copy()
    ok["neighbours"] = overlap_counts(ok)
    rows = []
    for (template, size), group in ok.groupby(["template", "cluster_size"], sort=True):
        alone = group[group["neighbours"] == 0]["latency_s"]
        busy = group[group["neighbours"] > 0]
        isolated = float(alone.median()) if len(alone) else np.nan
        median = float(busy["latency_s"].median()) if len(busy) else np.nan
        rows.append({
            "template": template,
            "cluster_size": int(size),
            "isolated_s": isolated,
            "n_concurrent": len(busy),
            "median_s": median,
            "p95_s": float(busy["latency_s"].quantile(0.95)) if len(busy) else np.nan,
            "slowdown": median / isolated if isolated > 0 else np.nan,
            "mean_neighbours": float(busy["neighbours"].mean()) if len(busy) else 0.0,
        })
    return pd.DataFrame(rows)


def plot_latency_vs_concurrency(df: pd.DataFrame, path: str | Path) -> Path:
    """Scatter of slowdown (latency / template's isolated latency) against neighbours.

    Writes a PNG and returns its path.
    """
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df["status"] == "ok"].copy()
    ok["neighbours"] = overlap_counts(ok)
    isolated = (ok[ok["neighbours"] == 0].groupby(["template", "cluster_size"])["latency_s"]
                .median().rename("isolated_s"))
    ok = ok.join(isolated, on=["template", "cluster_size"]).dropna(subset=["isolated_s"])
    ok["slowdown"] = ok["latency_s"] / ok["isolated_s"]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for size, group in ok.groupby("cluster_size"):
        ax.scatter(group["neighbours"], group["slowdown"], s=14, alpha=0.6,
                   label=f"size {size} ({len(group)} queries)")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("concurrent neighbours during execution (queries)")
    ax.set_ylabel("slowdown (× the template's isolated latency)")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3, which="major")
    ax.set_title("Interference on DuckDB clusters")
    ax.legend()
    return save_figure(fig, path)


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write (folders created) and close a matplotlib figure; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
