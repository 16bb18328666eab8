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

The same pass records the model's **concurrency support**: per cluster size,
the most queries the log ever showed running when a query arrived. Beyond it
the model extrapolates, and the router's guard (``RouterGuard``) stops
trusting it there.

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

__all__ = ["MarginCalibration", "arrival_time_ratios", "calibrate_slo_margin", "concurrency_support",
           "running_at_arrival"]


@dataclass(frozen=True)
class MarginCalibration:
    """The margin and where it came from."""

    slo_margin: float
    risk_quantile: float
    ratio_at_quantile: float
    ratio_p50: float
    queries: int
    concurrency_support: dict[int, int] | None = None

    def describe(self) -> str:
        support = ""
        if self.concurrency_support:
            support = "; trained on up to " + ", ".join(
                f"{n} running on size {s}" for s, n in sorted(self.concurrency_support.items()))
        return (f"router SLO margin {self.slo_margin:.3f}: at routing time the model under-predicts the log's "
                f"latencies by a ratio p50 {self.ratio_p50:.2f}, q{self.risk_quantile:g} {self.ratio_at_quantile:.2f} "
                f"({self.queries} queries){support}")

    def spread(self) -> float:
        """``σ``: the spread of log(actual / predicted), from the median and the ``risk_quantile`` quantile.

        Assumes the ratio is log-normal between those two points:
        ``(log q − log p50) / Φ⁻¹(risk_quantile)``; at least 0.05.
        """
        from scipy.special import ndtri

        z = float(ndtri(self.risk_quantile))
        if z <= 0 or self.ratio_at_quantile <= 0 or self.ratio_p50 <= 0:
            return 0.05
        return max(0.05, (np.log(self.ratio_at_quantile) - np.log(self.ratio_p50)) / z)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.concurrency_support is not None:
            out["concurrency_support"] = {str(k): int(v) for k, v in self.concurrency_support.items()}
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> MarginCalibration:
        return cls(slo_margin=float(doc["slo_margin"]), risk_quantile=float(doc["risk_quantile"]),
                   ratio_at_quantile=float(doc["ratio_at_quantile"]), ratio_p50=float(doc["ratio_p50"]),
                   queries=int(doc["queries"]),
                   concurrency_support=({int(k): int(v) for k, v in doc["concurrency_support"].items()}
                                        if doc.get("concurrency_support") is not None else None))


def running_at_arrival(log: pd.DataFrame) -> np.ndarray:
    """For every row, how many queries of the same run were running on its cluster when it arrived.

    A query counts as running from its arrival until ``arrival + latency``
    (timed-out rows until they were stopped). Rows of different runs
    (``run`` column, as ``sloctl log merge`` writes it) never overlap.
    """
    out = np.zeros(len(log), dtype=int)
    if log.empty:
        return out
    keys = ["run", "cluster_id"] if "run" in log.columns else ["cluster_id"]
    arrival_all = log["arrival_s"].to_numpy(dtype=float)
    end_all = arrival_all + np.nan_to_num(log["latency_s"].to_numpy(dtype=float), nan=0.0)
    for _, index in log.groupby(keys, sort=False).indices.items():
        arrival, end = arrival_all[index], end_all[index]
        started = np.searchsorted(np.sort(arrival), arrival, side="left")
        ended = np.searchsorted(np.sort(end), arrival, side="right")
        out[index] = started - ended
    return out


def concurrency_support(log: pd.DataFrame) -> dict[int, int]:
    """Per cluster size, the most queries running at any arrival in ``log`` (the model's support)."""
    if log.empty:
        return {}
    running = running_at_arrival(log)
    sizes = log["cluster_size"].to_numpy(dtype=int)
    return {int(s): int(running[sizes == s].max()) for s in np.unique(sizes)}


def arrival_time_ratios(predictor: LatencyPredictor, log: pd.DataFrame) -> np.ndarray:
    """Actual / predicted latency of every finished query, predicted from the neighbours seen on arrival."""
    done = log[log["status"] == "ok"].reset_index(drop=True) if "status" in log.columns else log
    if done.empty:
        raise ValueError("The log has no finished ('ok') queries to calibrate the router margin on.")
    predicted = predictor.predict(done, neighbours="arrival")
    actual = done["latency_s"].to_numpy(dtype=float)
    return actual / predicted


#: The most rows a margin is calibrated on (a quantile needs no more; a year of history would need gigabytes).
CALIBRATION_ROWS = 200_000


def calibration_rows(log: pd.DataFrame, max_rows: int = CALIBRATION_ROWS, seed: int = 0) -> pd.DataFrame:
    """``log`` itself, or at most about ``max_rows`` of it that keep every query's neighbours: whole clusters in a
    seeded random order while they are small, else the ``max_rows`` rows around the middle of the log in time."""
    if len(log) <= max_rows:
        return log
    groups = log.groupby("cluster_id", sort=False).indices
    sizes = np.array([len(v) for v in groups.values()])
    if sizes.max() <= max_rows // 10:
        order = np.random.default_rng(seed).permutation(len(sizes))
        keep = order[:int(np.searchsorted(np.cumsum(sizes[order]), max_rows)) + 1]
        names = list(groups)
        rows = np.sort(np.concatenate([groups[names[i]] for i in keep]))
    else:
        by_time = np.argsort(log["arrival_s"].to_numpy(dtype=float), kind="stable")
        first = (len(log) - max_rows) // 2
        rows = np.sort(by_time[first:first + max_rows])
    return log.iloc[rows].reset_index(drop=True)


def calibrate_slo_margin(predictor: LatencyPredictor, log: pd.DataFrame, risk_quantile: float = 0.75,
                         max_rows: int = CALIBRATION_ROWS) -> MarginCalibration:
    """The SLO margin covering ``risk_quantile`` of the routing-time under-prediction on ``log``.

    Args:
        predictor: the model the router uses.
        log: the query log it was trained on (finished rows are used).
        risk_quantile: in (0, 1); higher is more conservative.
        max_rows: on a longer log, calibrate on this many of its rows (:func:`calibration_rows`).

    Returns:
        The margin ``max(0, 1 − 1 / q)`` where ``q`` is that quantile of
        actual / predicted, with the figures behind it and the log's
        :func:`concurrency_support`.
    """
    if not 0.0 < risk_quantile < 1.0:
        raise ValueError(f"The 'risk_quantile' parameter must be in (0, 1), got {risk_quantile!r}.")
    ratios = arrival_time_ratios(predictor, calibration_rows(log, max_rows))
    q = float(np.quantile(ratios, risk_quantile))
    return MarginCalibration(slo_margin=max(0.0, 1.0 - 1.0 / q), risk_quantile=risk_quantile, ratio_at_quantile=q,
                             ratio_p50=float(np.median(ratios)), queries=len(ratios),
                             concurrency_support=concurrency_support(log))
