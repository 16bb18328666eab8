"""``make demo``: real interference on real DuckDB clusters, in a few minutes.

Generates (once) a small TPC-H database, runs every template alone on each
cluster size (isolated latency), then BaseWorkload(λ) on each size so that
queries overlap, writes the log, a per-template table and a PNG plot.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.config import SloctlConfig

__all__ = ["run_demo"]


def run_demo(cfg: SloctlConfig, *, data_dir: str | Path | None = None,
             log: Callable[[str], None] = print) -> tuple[pd.DataFrame, list[Path]]:
    """Run the demo; return the per-template summary and the files written."""
    import pandas as pd

    from sloctl.datasets.analysis import plot_latency_vs_concurrency, template_summary
    from sloctl.datasets.collect import collect
    from sloctl.datasets.querylog import validate_log, write_log
    from sloctl.datasets.tpc import ensure_database, load_templates
    from sloctl.datasets.workloads import base_workload, isolated_workload

    d = cfg.demo
    db = ensure_database(d.benchmark, d.scale_factor, data_dir or cfg.warehouse.data_dir, log=log)
    templates = load_templates(d.benchmark)
    isolated = isolated_workload(templates, d.isolated_copies, seed=d.seed)
    busy = base_workload(templates, d.concurrent_rate_per_s, d.concurrent_copies, seed=d.seed)
    log(f"Isolated run: {len(isolated)} queries per size; then BaseWorkload"
        f"({d.concurrent_rate_per_s:g}/s): {len(busy)} queries per size; sizes {list(d.sizes)}.")
    parts = []
    for workload in (isolated, busy):
        result = collect(db, workload, d.sizes, timeout_s=cfg.warehouse.query_timeout_s,
                         warmup_s=cfg.warehouse.warmup_s,
                         allow_oversubscribe=cfg.warehouse.allow_oversubscribe, log=log)
        frame = result.log.copy()
        frame["query_id"] += sum(len(p) for p in parts)
        frame["cluster_id"] = frame["cluster_id"] + f"-{workload.name}"
        parts.append(frame)
    df = validate_log(pd.concat(parts, ignore_index=True), source="demo log")
    reports = Path(d.reports_dir)
    log_path = write_log(df, reports / "demo_log.parquet",
                         metadata={"benchmark": d.benchmark, "scale_factor": d.scale_factor})
    summary = template_summary(df)
    summary.to_csv(reports / "demo_templates.csv", index=False)
    plot = plot_latency_vs_concurrency(df, reports / "demo_latency_vs_concurrency.png")
    return summary, [log_path, reports / "demo_templates.csv", plot]
