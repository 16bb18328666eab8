"""Q-error, the accuracy measure of latency predictors (AutoSLO §8.3)."""

from __future__ import annotations

import numpy as np

__all__ = ["q_error", "q_error_summary"]


def q_error(predicted_s: np.ndarray, actual_s: np.ndarray, floor_s: float = 1e-4) -> np.ndarray:
    """``max(pred / actual, actual / pred)`` per query (1 is perfect).

    Both sides are floored at ``floor_s`` so that a zero never divides.
    """
    p = np.maximum(np.asarray(predicted_s, dtype=float), floor_s)
    a = np.maximum(np.asarray(actual_s, dtype=float), floor_s)
    return np.maximum(p / a, a / p)


def q_error_summary(predicted_s: np.ndarray, actual_s: np.ndarray) -> dict[str, float]:
    """``{"p50", "p90", "p95", "mean"}`` of the Q-error (NaN when empty)."""
    q = q_error(predicted_s, actual_s)
    if q.size == 0:
        return {"p50": float("nan"), "p90": float("nan"), "p95": float("nan"), "mean": float("nan")}
    return {
        "p50": float(np.percentile(q, 50)),
        "p90": float(np.percentile(q, 90)),
        "p95": float(np.percentile(q, 95)),
        "mean": float(q.mean()),
    }
