"""Per-bottleneck active queue management with SLO-derived delay budgets (Svalinn §4.2).

A request enters with a :class:`DelayBudget`: the queueing delay it can still
afford, its SLO minus its expected service time. Every explicit bottleneck
(a lock, a disk, an :class:`~sloctl.control.msemaphore.MSemaphore`) has a
:class:`BottleneckAQM` that predicts the wait a newcomer would see and drops
the request *before* it joins when that wait exceeds the remaining budget;
the wait actually spent is deducted when the request leaves the queue, so a
request crossing several bottlenecks pays for each of them.

A request may be dropped after partial work (it already holds a buffer, a
lock, a row). Cleanup callbacks registered on its budget run exactly once
when it is dropped, wherever that happens.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Callable

__all__ = ["BottleneckAQM", "DelayBudget"]


class DelayBudget:
    """The queueing delay a request may still spend (seconds).

    ``remaining_s`` starts at ``slo_s − expected_service_s`` and shrinks by
    every wait deducted. It can go negative (the request waited longer than
    predicted); :attr:`exhausted` is then True and every AQM drops it.

    Args:
        slo_s: the request's latency SLO (seconds, > 0).
        expected_service_s: its expected service time, excluding queueing
            (seconds, in [0, slo_s]).
        cleanup: optional callback to run once if the request is dropped.
    """

    def __init__(self, slo_s: float, expected_service_s: float = 0.0,
                 cleanup: Callable[[], object] | None = None) -> None:
        if not (isinstance(slo_s, numbers.Real) and math.isfinite(slo_s) and slo_s > 0):
            raise ValueError(f"The 'slo_s' parameter of DelayBudget must be > 0, got {slo_s!r}.")
        if not (isinstance(expected_service_s, numbers.Real) and math.isfinite(expected_service_s)
                and expected_service_s >= 0):
            raise ValueError(f"The 'expected_service_s' parameter of DelayBudget must be >= 0, "
                             f"got {expected_service_s!r}.")
        if expected_service_s > slo_s:
            raise ValueError(f"The 'slo_s' parameter of DelayBudget must be >= expected_service_s "
                             f"({expected_service_s!r}), got {slo_s!r}.")
        self.slo_s = float(slo_s)
        self.expected_service_s = float(expected_service_s)
        self.remaining_s = self.slo_s - self.expected_service_s
        self.spent_s = 0.0
        self._cleanups: list[Callable[[], object]] = [cleanup] if cleanup is not None else []
        self._dropped = False

    @property
    def exhausted(self) -> bool:
        """No queueing time left (``remaining_s <= 0``)."""
        return self.remaining_s <= 0.0

    @property
    def dropped(self) -> bool:
        return self._dropped

    def deduct(self, wait_s: float) -> float:
        """Spend ``wait_s`` seconds of queueing; returns the remaining budget."""
        if not (math.isfinite(wait_s) and wait_s >= 0):
            raise ValueError(f"The 'wait_s' parameter of DelayBudget.deduct must be >= 0, got {wait_s!r}.")
        self.remaining_s -= wait_s
        self.spent_s += wait_s
        return self.remaining_s

    def on_drop(self, callback: Callable[[], object]) -> None:
        """Register cleanup for partial work; runs at once if the request was already dropped."""
        if self._dropped:
            callback()
        else:
            self._cleanups.append(callback)

    def drop(self) -> bool:
        """Mark the request dropped and run its cleanups, once; later calls do nothing and return False."""
        if self._dropped:
            return False
        self._dropped = True
        callbacks, self._cleanups = self._cleanups, []
        for callback in callbacks:
            callback()
        return True

    def __repr__(self) -> str:
        return f"DelayBudget(slo_s={self.slo_s}, remaining_s={self.remaining_s:.6g}, dropped={self._dropped})"


_GAP_EWMA = 0.05  # weight of the newest gap between arrivals (about the last 20 arrivals)


class BottleneckAQM:
    """Drop-before-enqueue AQM for one bottleneck (Svalinn §4.2).

    The expected wait of a newcomer is ``queue_len × mean_hold_s / servers``,
    where ``mean_hold_s`` is an EWMA of how long an item holds one of the
    ``servers`` (weight ``ewma`` on the newest sample). With
    ``count_in_service`` the AQM also knows how many items hold a server, and
    when every server is held the newcomer waits for one more hold: behind a
    busy lock it waits for the holder too. Without it the estimate misses the
    holder's remaining time, up to a whole hold: on a single-server
    bottleneck near saturation, requests admitted with too little budget
    spend the bottleneck's time and still finish late.

    With ``residual`` as well, the AQM also remembers when each holder got
    its server (``left(..., now_s=)``) and counts, instead of a whole hold,
    what is left of the longest-running holder's: ``max(0, mean_hold −
    elapsed)`` at ``should_drop(..., now_s=)``. With fixed holds (a lock's
    critical section) this is exact; a whole hold refuses newcomers that
    would have been served in time, and the server idles between them.

    Items may name their ``kind`` (e.g. the request type). The AQM then also
    keeps an EWMA of each kind's holds, and counts every queued item at its
    own kind's mean (the all-kinds mean for a kind not seen yet, or an item
    without one): a run queue of 5 µs and 66 µs holds is misjudged by one
    mean hold per item.

    With ``protect_tightest`` (a FIFO shared by kinds with different
    budgets, such as a run queue), a newcomer is also held to the tightest
    budget among the kinds that use the queue (each kind's budget on
    arrival, an EWMA; a kind counts while it makes at least ``min_share`` of
    the recent arrivals). On one FIFO a loose-budget request admitted into a
    long queue lengthens the wait of every tight-budget request behind it;
    judged by its own budget alone, the loosest kind sets the queue's length
    and the tightest kind is refused at every arrival. ``tightest_scale``
    (>= 1) loosens that target to a multiple of the tightest budget: it
    trades the tightest kind's share of the queue for the others' (the
    frontier experiment, docs/admission_sim.md, measures the trade).

    Protocol per request: ``should_drop(budget, kind)`` → if False,
    ``joined(kind)``; when it reaches a server, ``left(wait_s, budget,
    kind)``; when it lets go of the server, ``observe_hold(hold_s, kind)``
    (and, with ``count_in_service``, ``released()``).

    Args:
        name: the bottleneck's name (for reports).
        servers: how many items it serves at once (>= 1).
        ewma: weight of the newest hold sample, in (0, 1].
        initial_hold_s: mean hold assumed before the first sample (seconds).
        count_in_service: track items holding a server (``left`` to
            ``released``) and count the wait for one of them when all are held.
        residual: with ``count_in_service``, count the longest-running holder's
            remaining hold (when the caller passes ``now_s``) instead of a whole one.
        protect_tightest: hold every newcomer to the tightest budget among
            the kinds that use the queue (see above).
        activity: weight of one arrival in the per-kind arrival shares (about
            the last ``1 / activity`` arrivals count).
        min_share: a kind with a smaller share of the recent arrivals does
            not set the queue's target.
        tightest_scale: with ``protect_tightest``, the target is this
            multiple (>= 1) of the tightest budget; 1 holds every newcomer to
            the tightest budget itself.
    """

    def __init__(self, name: str, servers: int = 1, ewma: float = 0.2, initial_hold_s: float = 0.0,
                 count_in_service: bool = False, protect_tightest: bool = False, activity: float = 0.001,
                 min_share: float = 0.02, residual: bool = False, tightest_scale: float = 1.0) -> None:
        if not (isinstance(servers, numbers.Integral) and not isinstance(servers, bool) and servers >= 1):
            raise ValueError(f"The 'servers' parameter of BottleneckAQM must be an integer >= 1, got {servers!r}.")
        if not 0.0 < ewma <= 1.0:
            raise ValueError(f"The 'ewma' parameter of BottleneckAQM must be in (0, 1], got {ewma!r}.")
        if not (math.isfinite(initial_hold_s) and initial_hold_s >= 0):
            raise ValueError(f"The 'initial_hold_s' parameter of BottleneckAQM must be >= 0, "
                             f"got {initial_hold_s!r}.")
        if not 0.0 < activity <= 1.0:
            raise ValueError(f"The 'activity' parameter of BottleneckAQM must be in (0, 1], got {activity!r}.")
        if not 0.0 <= min_share <= 1.0:
            raise ValueError(f"The 'min_share' parameter of BottleneckAQM must be in [0, 1], got {min_share!r}.")
        if not (math.isfinite(tightest_scale) and tightest_scale >= 1.0):
            raise ValueError(f"The 'tightest_scale' parameter of BottleneckAQM must be a number >= 1, "
                             f"got {tightest_scale!r}.")
        self.name = name
        self.tightest_scale = float(tightest_scale)
        self.servers = int(servers)
        self.protect_tightest = bool(protect_tightest)
        self.activity = float(activity)
        self.min_share = float(min_share)
        self._kind_budget_s: dict[str, float] = {}  # EWMA of each kind's budget on arrival
        self._kind_share: dict[str, float] = {}  # decayed share of recent arrivals per kind
        self.ewma = ewma
        self.mean_hold_s = float(initial_hold_s)
        self.count_in_service = bool(count_in_service)
        self.residual = bool(residual)
        self._hold_starts: deque[float] = deque()  # when each current holder got its server (with ``residual``)
        self.queue_len = 0
        self.in_service = 0
        self.drops = 0
        self.admitted = 0
        self._samples = 0
        self.mean_gap_s: float | None = None  # EWMA of the gaps between arrivals noted with ``arrived``
        self._last_arrival_s: float | None = None
        self._queued: dict[str | None, int] = {}  # queued items per kind
        self._kind_hold_s: dict[str, float] = {}  # EWMA of holds per kind

    def observe_hold(self, hold_s: float, kind: str | None = None) -> None:
        """An item (of ``kind``) held a server for ``hold_s`` seconds; a first sample replaces the initial guess."""
        if not (math.isfinite(hold_s) and hold_s >= 0):
            raise ValueError(f"The 'hold_s' parameter of BottleneckAQM.observe_hold must be >= 0, got {hold_s!r}.")
        self.mean_hold_s = hold_s if self._samples == 0 else self.ewma * hold_s + (1 - self.ewma) * self.mean_hold_s
        self._samples += 1
        if kind is not None:
            old = self._kind_hold_s.get(kind)
            self._kind_hold_s[kind] = hold_s if old is None else self.ewma * hold_s + (1 - self.ewma) * old

    def expected_wait_s(self, queue_len: int | None = None, now_s: float | None = None) -> float:
        """Predicted wait (seconds) behind ``queue_len`` items of the mean hold (default: the current queue,
        each item at its kind's mean hold); ``now_s`` lets a ``residual`` AQM count what is left of the
        current hold."""
        if queue_len is None:
            held = self.mean_hold_s
            queued = sum(n * self._kind_hold_s.get(kind, held) for kind, n in self._queued.items() if n)
        else:
            queued = queue_len * self.mean_hold_s
        if self.count_in_service and self.in_service >= self.servers:
            # every server is held: one must let go first (a whole hold: never too little; with ``residual``,
            # what is left of the longest-running holder's)
            if self.residual and now_s is not None and self._hold_starts:
                queued += max(0.0, self.mean_hold_s - (now_s - self._hold_starts[0]))
            else:
                queued += self.mean_hold_s
        return queued / self.servers

    def target_s(self) -> float:
        """The tightest budget among the kinds that use the queue, times ``tightest_scale`` (``inf`` when none
        is known yet)."""
        active = [b for kind, b in self._kind_budget_s.items() if self._kind_share.get(kind, 0.0) >= self.min_share]
        return self.tightest_scale * min(active, default=math.inf)

    def _saw(self, kind: str, budget_s: float) -> None:
        decay = 1.0 - self.activity
        for k in self._kind_share:
            self._kind_share[k] *= decay
        self._kind_share[kind] = self._kind_share.get(kind, 0.0) + self.activity
        old = self._kind_budget_s.get(kind)
        self._kind_budget_s[kind] = budget_s if old is None else self.ewma * budget_s + (1 - self.ewma) * old

    def should_drop(self, budget: DelayBudget, kind: str | None = None, now_s: float | None = None,
                    reserve_s: float = 0.0) -> bool:
        """True (and the budget is dropped, running its cleanups) when the wait would exceed the budget.

        With ``protect_tightest``, also when it would exceed the tightest
        budget among the kinds using the queue (:meth:`target_s`; ``kind``
        names the newcomer's). ``reserve_s``: budget the request keeps for a
        later bottleneck; it is judged (and its kind's budget counted) as if
        it had that much less. A request already dropped elsewhere is
        refused again without being counted twice.
        """
        if budget.dropped:
            return True
        if not (math.isfinite(reserve_s) and reserve_s >= 0):
            raise ValueError(f"The 'reserve_s' parameter of BottleneckAQM.should_drop must be >= 0, got {reserve_s!r}.")
        allowed = budget.remaining_s - reserve_s
        if self.protect_tightest and kind is not None:
            self._saw(kind, allowed)
            allowed = min(allowed, self.target_s())
        if self.expected_wait_s(now_s=now_s) > allowed:
            self.refuse(budget)
            return True
        return False

    def refuse(self, budget: DelayBudget) -> None:
        """Count a drop at this bottleneck and drop ``budget`` (running its cleanups), whatever the rule that
        refused it."""
        self.drops += 1
        budget.drop()

    def arrived(self, now_s: float) -> None:
        """A request reached the bottleneck at ``now_s``: updates :attr:`mean_gap_s` (an EWMA of the gaps
        between arrivals, weight 0.05 on the newest)."""
        if self._last_arrival_s is not None:
            gap = now_s - self._last_arrival_s
            self.mean_gap_s = gap if self.mean_gap_s is None else _GAP_EWMA * gap + (1 - _GAP_EWMA) * self.mean_gap_s
        self._last_arrival_s = now_s

    def joined(self, kind: str | None = None) -> None:
        """A request (of ``kind``) entered the queue."""
        self.queue_len += 1
        self.admitted += 1
        self._queued[kind] = self._queued.get(kind, 0) + 1

    def left(self, wait_s: float, budget: DelayBudget | None = None, kind: str | None = None,
             now_s: float | None = None) -> None:
        """A request (of ``kind``, as it joined) left the queue for a server after waiting ``wait_s``; deducts it
        from ``budget``. ``now_s``: when it got the server (a ``residual`` AQM remembers it)."""
        if self.queue_len <= 0:
            raise RuntimeError(f"BottleneckAQM {self.name!r}: left() with an empty queue.")
        if not self._queued.get(kind):
            raise RuntimeError(f"BottleneckAQM {self.name!r}: left() with no queued item of kind {kind!r}.")
        self.queue_len -= 1
        self._queued[kind] -= 1
        self.in_service += 1
        if self.residual and now_s is not None:
            self._hold_starts.append(now_s)
        if budget is not None:
            budget.deduct(wait_s)

    def released(self) -> None:
        """An item let go of its server (needed with ``count_in_service``)."""
        if self.in_service <= 0:
            raise RuntimeError(f"BottleneckAQM {self.name!r}: released() with no item holding a server.")
        self.in_service -= 1
        if self._hold_starts:
            self._hold_starts.popleft()  # the longest-running holder (exact with one server)

    def __repr__(self) -> str:
        return (f"BottleneckAQM({self.name!r}, servers={self.servers}, queue_len={self.queue_len}, "
                f"mean_hold_s={self.mean_hold_s:.6g}, drops={self.drops}, admitted={self.admitted})")
