"""``make demo``: real interference on real DuckDB clusters, in a few minutes.

Generates (once) a small TPC-H database, runs every template alone on each
cluster size (isolated latency), then BaseWorkload(λ) on each size so that
queries overlap, writes the log, a per-template table and a PNG plot. Then it
trains Stage and Iconq+ on that log, registers both in MLflow and reports
their accuracy on the held-out queries.
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
    from sloctl.datasets.analysis import plot_latency_vs_concurrency, template_summary
    from sloctl.datasets.collect import collect, concat_logs
    from sloctl.datasets.querylog import write_log
    from sloctl.datasets.tpc import ensure_database, load_templates
    from sloctl.datasets.workloads import base_workload, isolated_workload

    d = cfg.demo
    db = ensure_database(d.benchmark, d.scale_factor, data_dir or cfg.warehouse.data_dir, log=log)
    templates = load_templates(d.benchmark)
    isolated = isolated_workload(templates, d.isolated_copies, seed=d.seed)
    busy = base_workload(templates, d.concurrent_rate_per_s, d.concurrent_copies, seed=d.seed)
    log(f"Isolated run: {len(isolated)} queries per size; then BaseWorkload"
        f"({d.concurrent_rate_per_s:g}/s): {len(busy)} queries per size; sizes {list(d.sizes)}.")
    parts = [collect(db, workload, d.sizes, timeout_s=cfg.warehouse.query_timeout_s, warmup_s=cfg.warehouse.warmup_s,
                     allow_oversubscribe=cfg.warehouse.allow_oversubscribe, log=log).log
             for workload in (isolated, busy)]
    df = concat_logs(parts, [w.name for w in (isolated, busy)])
    reports = Path(d.reports_dir)
    log_path = write_log(df, reports / "demo_log.parquet",
                         metadata={"benchmark": d.benchmark, "scale_factor": d.scale_factor})
    summary = template_summary(df)
    summary.to_csv(reports / "demo_templates.csv", index=False)
    plot = plot_latency_vs_concurrency(df, reports / "demo_latency_vs_concurrency.png")
    return summary, [log_path, reports / "demo_templates.csv", plot]


def train_demo_models(cfg: SloctlConfig, log_path: Path, *, log: Callable[[str], None] = print) -> list[dict]:
    """Train and register Stage and Iconq+ on the demo log; one accuracy row each."""
    from sloctl.datasets.querylog import read_log
    from sloctl.registry.store import register
    from sloctl.training.pipeline import train_iconq, train_stage

    frame = read_log(log_path)
    rows = []
    log("Training Stage (LightGBM on isolated executions) ...")
    stage = train_stage(frame, cfg.stage, val_fraction=cfg.iconq.val_fraction,
                        test_fraction=cfg.iconq.test_fraction, seed=cfg.iconq.seed,
                        risk_quantile=cfg.router.risk_quantile)
    log(f"Training Iconq+ (up to {cfg.iconq.max_epochs} epochs, early stopping) ...")
    iconq = train_iconq(frame, cfg.stage, cfg.iconq, risk_quantile=cfg.router.risk_quantile)
    for name, result in (("stage", stage), ("iconq", iconq)):
        reg = register(result, frame, name=name, tracking_uri=cfg.registry.tracking_uri,
                       experiment=cfg.registry.experiment, log_path=str(log_path))
        m = result.metrics
        rows.append({"model": name, "version": reg.version, "champion": reg.champion,
                     **{f"test_{s}": m[f"test_q_error_{s}"] for s in ("p50", "p90", "p95")},
                     "test_concurrent_p90": m["test_concurrent_q_error_p90"], "n_test": m["test_n"],
                     "n_test_concurrent": m["test_concurrent_n"]})
    return rows
