"""Usage-based billing of warehouse clusters (AutoSLO §2).

A cluster's cost is ``price × size × active time``, where active time is
measured by a timer that:

* starts paused;
* starts running when a query arrives at the cluster while it is paused;
* pauses once the cluster has no running query **and** at least
  ``minimum_s`` seconds (often 60) have passed since it started running.

So an idle cluster that receives a query opens a new billing window of at
least ``minimum_s`` seconds, while queries that keep a cluster busy extend the
current window. A query that arrives exactly when the window could close
keeps it open (the pause happens only strictly before the arrival).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["BillingTimer", "best_with_target"]


class BillingTimer:
    """The billing timer of one cluster, driven by query starts and ends.

    Args:
        minimum_s: the minimum running time of a billing window (``m``).
    """

    def __init__(self, minimum_s: float = 60.0) -> None:
        if not (isinstance(minimum_s, (int, float)) and math.isfinite(minimum_s) and minimum_s >= 0):
            raise ValueError(f"The 'minimum_s' parameter of BillingTimer must be >= 0, got {minimum_s!r}.")
        self.minimum_s = float(minimum_s)
        self._start: float | None = None  # when the current window opened (None: paused)
        self._accrued_s = 0.0            # closed windows
        self._running = 0
        self._idle_since = 0.0
        self._now = -math.inf
        self._windows = 0                # billing windows opened (each costs at least minimum_s)
        self._busy_s = 0.0               # closed stretches with at least one running query
        self._busy_since = 0.0

    def copy(self) -> BillingTimer:
        """An independent timer in the same state (for what-if simulations)."""
        twin = BillingTimer(self.minimum_s)
        twin.__dict__.update(self.__dict__)
        return twin

    @property
    def is_running(self) -> bool:
        return self._start is not None

    @property
    def running_queries(self) -> int:
        return self._running

    def _advance(self, t: float) -> None:
        if t < self._now - 1e-9:
            raise ValueError(f"Billing time must not go backwards: {t} after {self._now}.")
        self._now = max(self._now, t)
        if self._start is not None and self._running == 0:
            pause_at = max(self._idle_since, self._start + self.minimum_s)
            if pause_at < t:
                self._accrued_s += pause_at - self._start
                self._start = None

    def query_arrived(self, t: float) -> None:
        """A query starts on the cluster at time ``t``."""
        self._advance(t)
        if self._start is None:
            self._start = t
            self._windows += 1
        if self._running == 0:
            self._busy_since = t
        self._running += 1

    def query_finished(self, t: float) -> None:
        """A query on the cluster ends at time ``t``."""
        self._advance(t)
        if self._running <= 0:
            raise ValueError("query_finished() called with no running query on the cluster.")
        self._running -= 1
        if self._running == 0:
            self._idle_since = t
            self._busy_s += t - self._busy_since

    def active_s(self, t: float) -> float:
        """Billed seconds up to time ``t``."""
        self._advance(t)
        if self._start is None:
            return self._accrued_s
        return self._accrued_s + (t - self._start)

    def projected_active_s(self, t: float, drain_s: float) -> float:
        """Billed seconds if the running queries end at ``drain_s`` and nothing else arrives.

        Args:
            t: now.
            drain_s: when the last running query is expected to end (>= t);
                ignored when nothing runs.
        """
        self._advance(t)
        if self._start is None:
            return self._accrued_s
        idle_from = max(drain_s, t) if self._running > 0 else self._idle_since
        return self._accrued_s + max(idle_from, self._start + self.minimum_s) - self._start

    def projected_with_arrival(self, t: float, drain_s: float) -> float:
        """Billed seconds if one more query starts now and everything ends by ``drain_s``."""
        self._advance(t)
        start = self._start if self._start is not None else t
        return self._accrued_s + max(drain_s, t, start + self.minimum_s) - start

    def usage(self, t: float) -> dict[str, float]:
        """Where the billed time up to ``t`` went: ``billed_s``, ``busy_s`` (a query running),
        ``minimum_added_s`` (billed while idle: what the minimum windows added) and ``windows`` opened."""
        billed = self.active_s(t)
        busy = self._busy_s + (t - self._busy_since if self._running > 0 else 0.0)
        return {"billed_s": billed, "busy_s": busy, "minimum_added_s": max(0.0, billed - busy),
                "windows": float(self._windows)}

    def cost(self, t: float, price_per_unit_s: float, size: int) -> float:
        """``price × size × active time`` up to ``t``."""
        return price_per_unit_s * size * self.active_s(t)


def best_with_target(outcomes: Sequence[tuple[float, float]], target: float) -> int:
    """Index of the best ``(violation rate, cost)`` pair under BestWithTarget (§2).

    Lexicographic minimum of ``(max(0, v - target), cost)``: meet the target
    violation rate first, then spend least. Ties keep the first index.
    """
    if not outcomes:
        raise ValueError("The 'outcomes' parameter must hold at least one (violation rate, cost) pair.")
    keys = [(max(0.0, v - target), k) for v, k in outcomes]
    return min(range(len(keys)), key=lambda i: keys[i])
