"""SLO references from a query log: how long each template takes when it runs alone.

An SLO is set as κ × a template's isolated latency (AutoSLO §8.1); the
experiments and the live runner take the reference from the log's isolated
executions (rows that overlapped no other query on their cluster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloctl.datasets.analysis import overlap_counts

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["isolated_medians", "slo_baselines"]


def _isolated_ok(log: pd.DataFrame, size: int) -> pd.DataFrame:
    ok = log[log["status"] == "ok"].copy()
    return ok[(overlap_counts(ok).to_numpy() == 0) & (ok["cluster_size"] == size)]


def slo_baselines(log: pd.DataFrame, size: int) -> dict[str, float]:
    """Largest isolated latency of each template on ``size`` (the SLO reference)."""
    return _isolated_ok(log, size).groupby("template")["latency_s"].max().to_dict()


def isolated_medians(log: pd.DataFrame, size: int) -> dict[str, float]:
    """Median latency of each template run alone on ``size`` (ok rows)."""
    return _isolated_ok(log, size).groupby("template")["latency_s"].median().to_dict()
