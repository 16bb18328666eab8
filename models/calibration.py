"""Calibrating the Query Router's SLO margin from a query log (AutoSLO §5).

At routing time the router predicts a query's latency from the neighbours
already running; neighbours that arrive later are invisible to it, so its
predictions run low (AutoSLO §5 leaves this to the model). The margin says how
much headroom to keep: a query counts as violating once its predicted latency
exceeds ``(1 − margin) × SLO``.

Rather than pick the margin by looking at experiment results, it is derived
from the log the model was trained on: replay every logged query with only the
neighbours it could see on arrival, take the ratio actual / predicted, and
choose the margin that covers a stated quantile of that ratio
(``risk_quantile``; 0.75 keeps three in four queries within their SLO when the
prediction says they are exactly at it).

Pure computation on a predictor and a log, so that training (which stores the
margin in the model bundle) and the registry (which builds routers, and
calibrates on a log when an older bundle has no margin) share it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.models.predictor import LatencyPredictor

__all__ = ["MarginCalibration", "arrival_time_ratios", "calibrate_slo_margin"]


@dataclass(frozen=True)
class MarginCalibration:
    """The margin and where it came from."""

    slo_margin: float
    risk_quantile: float
    ratio_at_quantile: float
    ratio_p50: float
    queries: int

    def describe(self) -> str:
        return (f"router SLO margin {self.slo_margin:.3f}: at routing time the model under-predicts the log's "
                f"latencies by a ratio p50 {self.ratio_p50:.2f}, q{self.risk_quantile:g} {self.ratio_at_quantile:.2f} "
                f"({self.queries} queries)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> MarginCalibration:
        return cls(slo_margin=float(doc["slo_margin"]), risk_quantile=float(doc["risk_quantile"]),
                   ratio_at_quantile=float(doc["ratio_at_quantile"]), ratio_p50=float(doc["ratio_p50"]),
                   queries=int(doc["queries"]))


def arrival_time_ratios(predictor: LatencyPredictor, log: pd.DataFrame) -> np.ndarray:
    """Actual / predicted latency of every finished query, predicted from the neighbours seen on arrival."""
    done = log[log["status"] == "ok"].reset_index(drop=True) if "status" in log.columns else log
    if done.empty:
        raise ValueError("The log has no finished ('ok') queries to calibrate the router margin on.")
    predicted = predictor.predict(done, neighbours="arrival")
    actual = done["latency_s"].to_numpy(dtype=float)
    return actual / predicted


def calibrate_slo_margin(predictor: LatencyPredictor, log: pd.DataFrame, risk_quantile: float = 0.75
                         ) -> MarginCalibration:
    """The SLO margin covering ``risk_quantile`` of the routing-time under-prediction on ``log``.

    Args:
        predictor: the model the router uses.
        log: the query log it was trained on (finished rows are used).
        risk_quantile: in (0, 1); higher is more conservative.

    Returns:
        The margin ``max(0, 1 − 1 / q)`` where ``q`` is that quantile of
        actual / predicted, with the figures behind it.
    """
    if not 0.0 < risk_quantile < 1.0:
        raise ValueError(f"The 'risk_quantile' parameter must be in (0, 1), got {risk_quantile!r}.")
    ratios = arrival_time_ratios(predictor, log)
    q = float(np.quantile(ratios, risk_quantile))
    return MarginCalibration(slo_margin=max(0.0, 1.0 - 1.0 / q), risk_quantile=risk_quantile, ratio_at_quantile=q,
                             ratio_p50=float(np.median(ratios)), queries=len(ratios))
