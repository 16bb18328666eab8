"""Credit-based admission tuned by utility micro-experiments (Svalinn §4.1).

A :class:`CreditController` holds a pool of credits; a request runs only
while it holds one. The pool is tuned online by a hill climb: after a
warm-up, run the pool one step higher and one step lower for a short
micro-experiment each (in random order), score both windows with a
user-chosen utility, and move towards the better side — unless the two
scores differ by less than the dead-band, which keeps noise from moving the
pool. Priority classes shed from the bottom: a class may only take a credit
while the total in-flight count is below its share of the pool.

Everything is driven by explicit timestamps (``now_s``), so the same object
runs inside a discrete-event simulator and a live server.
"""

from __future__ import annotations

import heapq
import math
import numbers
import random
import secrets
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "ClassShare",
    "CreditController",
    "DropPenaltyUtility",
    "GoodputUtility",
    "Lease",
    "LeaseError",
    "LeaseStore",
    "LeasedCredits",
    "MemoryLeaseStore",
    "ThroughputUtility",
    "Utility",
    "WindowStats",
]


@dataclass(frozen=True)
class WindowStats:
    """What happened during one micro-experiment window.

    ``received`` counts every request offered to :meth:`CreditController.try_acquire`
    (admitted or not); ``dropped`` counts refusals plus later drops
    (:meth:`CreditController.record_drop`); ``good`` counts completions that
    were ok and within their SLO. ``admitted`` and ``mean_in_flight`` (credits
    actually held, time-averaged) are extras the controller uses to relabel
    experiments; utilities may ignore them.
    """

    received: int
    completed: int
    good: int
    dropped: int
    duration_s: float
    admitted: int = 0
    mean_in_flight: float = 0.0


Utility = Callable[[WindowStats], float]


def _rate(count: int, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else 0.0


class ThroughputUtility:
    """Completions per second, whatever their outcome."""

    def __call__(self, stats: WindowStats) -> float:
        return _rate(stats.completed, stats.duration_s)


class GoodputUtility:
    """Completions per second that were ok and within their SLO."""

    def __call__(self, stats: WindowStats) -> float:
        return _rate(stats.good, stats.duration_s)


class DropPenaltyUtility:
    """Throughput, penalised once the drop rate passes a threshold (Svalinn Fig. 9).

    ``u = x − weight · x · max(0, dropped/received − threshold)`` with ``x`` the
    throughput (completions/s).

    Args:
        threshold: drop rate (fraction of received requests) tolerated for free.
        weight: how hard each point of drop rate beyond the threshold costs.
    """

    def __init__(self, threshold: float = 0.1, weight: float = 10.0) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"The 'threshold' parameter of DropPenaltyUtility must be in [0, 1], got {threshold!r}.")
        if not weight >= 0.0:
            raise ValueError(f"The 'weight' parameter of DropPenaltyUtility must be >= 0, got {weight!r}.")
        self.threshold = threshold
        self.weight = weight

    def __call__(self, stats: WindowStats) -> float:
        x = _rate(stats.completed, stats.duration_s)
        drop_rate = stats.dropped / stats.received if stats.received else 0.0
        return x - self.weight * x * max(0.0, drop_rate - self.threshold)


@dataclass(frozen=True)
class ClassShare:
    """A traffic class: higher ``priority`` = more important; ``share`` is a relative weight."""

    name: str
    priority: int
    share: float = 1.0


class _Window:
    """Mutable counters of the window being measured."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.received = self.admitted = self.completed = self.good = self.dropped = 0
        self.in_flight_area = 0.0  # ∫ in_flight dt over the window

    def freeze(self, end_s: float) -> WindowStats:
        duration = end_s - self.start_s
        mean = self.in_flight_area / duration if duration > 0 else 0.0
        return WindowStats(self.received, self.completed, self.good, self.dropped, duration, self.admitted, mean)


_EPS_S = 1e-12  # phase boundaries tolerate float round-off in event timestamps

_RELABEL_STATS = {
    "in_flight": lambda s: s.mean_in_flight,
    "admitted": lambda s: s.admitted,
    "received": lambda s: s.received,
}


class CreditController:
    """A credit pool tuned by paired ± micro-experiments (Svalinn §4.1).

    One control cycle: ``warmup_s`` at the pool ``P`` (lets the last change
    propagate), then ``experiment_s`` at ``P + δ`` and ``experiment_s`` at
    ``P − δ`` in a seeded random order, with ``δ = max(1, round(ε · P))``.
    Each window is scored by ``utility``; the relative difference
    ``|u₊ − u₋| / max(|u₊|, |u₋|)`` at or below ``dead_band`` holds the pool,
    otherwise it moves to the better side and is clamped to
    ``[min_credits, max_credits]``.

    Relabelling: a window only tells us about "more credits" if the credits
    were used. Before comparing, the two windows are ordered by the credits
    actually exercised (``relabel_by``, see below) and the window that used
    more is treated as the ``+δ`` one; ties keep the intended labels.
    ``"in_flight"`` (default) is the time-averaged number of credits held —
    robust both to clients that hold credits without sending and to
    open-loop arrival noise; ``"received"`` is the paper's request count
    (fine when clients only send with a credit, noisy for open-loop
    arrivals); ``"admitted"``; ``"none"`` disables relabelling.

    Priority classes: thresholds are fractions of the pool. With shares
    normalised to sum to 1, class ``c`` may take a credit only while
    ``in_flight < pool · θ(c)`` where ``θ(c) = 1 − Σ share(c')`` over classes
    ``c'`` strictly more important than ``c``. The most important class gets
    ``θ = 1``; under overload the least important class is refused first and
    the credits above its threshold stay reserved for the classes above it.
    Without classes every name is admitted up to the full pool.

    Args:
        initial_credits: starting pool (credits).
        min_credits, max_credits: bounds of the pool.
        epsilon: relative experiment step ``ε`` (``δ = max(1, round(ε · P))``).
        experiment_s: length of each micro-experiment (seconds).
        warmup_s: wait after every pool change before measuring (seconds).
        dead_band: relative utility difference under which the pool holds.
        utility: scores a :class:`WindowStats` (higher is better).
        classes: priority classes; empty = one class, no shedding order.
        seed: seeds the experiment order.
        relabel_by: ``"in_flight"``, ``"admitted"``, ``"received"`` or ``"none"``.
        history_limit: control cycles kept in ``history`` and ``windows_``
            (the newest; ``None`` keeps all, for offline studies — a
            long-running server should bound it, see :meth:`bound_history`).
    """

    def __init__(self, initial_credits: int = 64, min_credits: int = 2, max_credits: int = 4096,
                 epsilon: float = 0.1, experiment_s: float = 0.002, warmup_s: float = 0.001,
                 dead_band: float = 0.02, utility: Utility | None = None, classes: Sequence[ClassShare] = (),
                 seed: int = 0, relabel_by: str = "in_flight", history_limit: int | None = None) -> None:
        self.initial_credits = initial_credits
        self.min_credits = min_credits
        self.max_credits = max_credits
        self.epsilon = epsilon
        self.experiment_s = experiment_s
        self.warmup_s = warmup_s
        self.dead_band = dead_band
        self.utility = utility if utility is not None else ThroughputUtility()
        self.classes = tuple(classes)
        self.seed = seed
        self.relabel_by = relabel_by
        self.history_limit = history_limit
        self._validate()
        self.thresholds_ = self._thresholds()
        self.history: list[tuple[float, int, float, float]] = []
        self.windows_: list[tuple[WindowStats, WindowStats]] = []  # (+δ, −δ) after relabelling
        if history_limit is not None:
            self.bound_history(history_limit)
        self._rng = random.Random(seed)
        self._pool = int(initial_credits)
        self._limit = int(initial_credits)
        self._in_flight = 0
        self._by_class: dict[str, int] = {}
        self._phase = "warmup"
        self._phase_start: float | None = None  # set by the first call
        self._order: tuple[int, int] = (1, -1)
        self._delta = 0
        self._window: _Window | None = None
        self._done: dict[int, WindowStats] = {}
        self._now = -math.inf

    def _validate(self) -> None:
        name = type(self).__name__
        for field in ("initial_credits", "min_credits", "max_credits"):
            value = getattr(self, field)
            if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"The '{field}' parameter of {name} must be an integer >= 1, got {value!r}.")
        if self.min_credits > self.max_credits:
            raise ValueError(f"The 'min_credits' parameter of {name} must be <= max_credits "
                             f"({self.max_credits}), got {self.min_credits!r}.")
        if not self.min_credits <= self.initial_credits <= self.max_credits:
            raise ValueError(f"The 'initial_credits' parameter of {name} must be in [{self.min_credits}, "
                             f"{self.max_credits}], got {self.initial_credits!r}.")
        if not 0.0 < self.epsilon <= 1.0:
            raise ValueError(f"The 'epsilon' parameter of {name} must be in (0, 1], got {self.epsilon!r}.")
        if not self.experiment_s > 0:
            raise ValueError(f"The 'experiment_s' parameter of {name} must be > 0, got {self.experiment_s!r}.")
        if not self.warmup_s >= 0:
            raise ValueError(f"The 'warmup_s' parameter of {name} must be >= 0, got {self.warmup_s!r}.")
        if not 0.0 <= self.dead_band < 1.0:
            raise ValueError(f"The 'dead_band' parameter of {name} must be in [0, 1), got {self.dead_band!r}.")
        if not callable(self.utility):
            raise ValueError(f"The 'utility' parameter of {name} must be callable, got {self.utility!r}.")
        if self.relabel_by not in (*_RELABEL_STATS, "none"):
            raise ValueError(f"The 'relabel_by' parameter of {name} must be in_flight, admitted, received or "
                             f"none, got {self.relabel_by!r}.")
        if self.history_limit is not None and not (isinstance(self.history_limit, numbers.Integral)
                                                   and self.history_limit >= 1):
            raise ValueError(f"The 'history_limit' parameter of {name} must be an integer >= 1 or None, "
                             f"got {self.history_limit!r}.")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"The 'classes' parameter of {name} must have unique names, got {names!r}.")
        for c in self.classes:
            if not (math.isfinite(c.share) and c.share > 0):
                raise ValueError(f"The 'share' parameter of ClassShare {c.name!r} must be > 0, got {c.share!r}.")

    def _thresholds(self) -> dict[str, float]:
        total = sum(c.share for c in self.classes)
        return {c.name: 1.0 - sum(o.share for o in self.classes if o.priority > c.priority) / total
                for c in self.classes}

    def bound_history(self, limit: int) -> None:
        """Keep only the newest ``limit`` control cycles in ``history`` and ``windows_`` from now on."""
        if not (isinstance(limit, numbers.Integral) and limit >= 1):
            raise ValueError(f"The 'limit' argument of {type(self).__name__}.bound_history must be an integer "
                             f">= 1, got {limit!r}.")
        self.history_limit = int(limit)
        self.history = deque(self.history, maxlen=self.history_limit)  # type: ignore[assignment]
        self.windows_ = deque(self.windows_, maxlen=self.history_limit)  # type: ignore[assignment]

    # -- state -----------------------------------------------------------

    @property
    def credits(self) -> int:
        """The pool ``P`` the controller has settled on (credits)."""
        return self._pool

    @property
    def limit(self) -> int:
        """The pool in force now: ``P`` in warm-up, ``P ± δ`` during an experiment."""
        return self._limit

    @property
    def in_flight(self) -> int:
        """Credits held right now."""
        return self._in_flight

    @property
    def phase(self) -> str:
        """``"warmup"``, ``"plus"`` or ``"minus"``."""
        return self._phase

    def in_flight_of(self, klass: str) -> int:
        """Credits held right now by ``klass``."""
        return self._by_class.get(klass, 0)

    def threshold(self, klass: str) -> float:
        """The fraction of the pool ``klass`` may fill (1.0 without classes)."""
        if not self.classes:
            return 1.0
        try:
            return self.thresholds_[klass]
        except KeyError:
            raise ValueError(f"The 'klass' argument of {type(self).__name__} must be one of "
                             f"{sorted(self.thresholds_)}, got {klass!r}.") from None

    # -- request events ----------------------------------------------------

    def try_acquire(self, klass: str, now_s: float) -> bool:
        """Take a credit for a request of ``klass`` if its threshold allows; False = refused (a drop)."""
        threshold = self.threshold(klass)
        self.tick(now_s)
        w = self._window
        if w is not None:
            w.received += 1
        if self._in_flight < self._limit * threshold:
            self._in_flight += 1
            self._by_class[klass] = self._by_class.get(klass, 0) + 1
            if w is not None:
                w.admitted += 1
            return True
        if w is not None:
            w.dropped += 1
        return False

    def release(self, klass: str, now_s: float, *, ok: bool = True, within_slo: bool = True) -> None:
        """A request holding a credit completed; ``good`` if ``ok and within_slo``."""
        self._free(klass, now_s)
        if self._window is not None:
            self._window.completed += 1
            self._window.good += int(ok and within_slo)

    def record_drop(self, klass: str, now_s: float) -> None:
        """A request holding a credit was dropped later (e.g. by an AQM); frees its credit."""
        self._free(klass, now_s)
        if self._window is not None:
            self._window.dropped += 1

    def _free(self, klass: str, now_s: float) -> None:
        if self._by_class.get(klass, 0) <= 0:
            raise RuntimeError(f"{type(self).__name__}: no credit held by class {klass!r} to free.")
        self.tick(now_s)
        self._by_class[klass] -= 1
        self._in_flight -= 1

    # -- control loop --------------------------------------------------------

    def _accrue(self, now_s: float) -> None:
        # Integrate in-flight credits over time (Little's law load of the window).
        if self._window is not None and now_s > self._now:
            self._window.in_flight_area += self._in_flight * (now_s - self._now)
        self._now = max(self._now, now_s)

    def tick(self, now_s: float) -> None:
        """Advance the warm-up / +δ / −δ cycle to ``now_s``; idempotent, called by every event too.

        A timestamp earlier than one already seen is treated as the latest one.
        """
        if self._phase_start is None:
            self._phase_start, self._now = now_s, now_s
        self._accrue(now_s)
        now_s = self._now
        if self._phase == "warmup":
            if now_s - self._phase_start >= self.warmup_s - _EPS_S:
                self._delta = max(1, round(self.epsilon * self._pool))
                self._order = (1, -1) if self._rng.random() < 0.5 else (-1, 1)
                self._done = {}
                self._start_experiment(self._order[0], now_s)
        elif now_s - self._phase_start >= self.experiment_s - _EPS_S:
            sign = 1 if self._phase == "plus" else -1
            self._done[sign] = self._window.freeze(now_s)
            if len(self._done) == 1:
                self._start_experiment(self._order[1], now_s)
            else:
                self._decide(now_s)

    def _start_experiment(self, sign: int, now_s: float) -> None:
        self._phase = "plus" if sign > 0 else "minus"
        self._phase_start = now_s
        self._limit = min(self.max_credits, max(self.min_credits, self._pool + sign * self._delta))
        self._window = _Window(now_s)

    def _decide(self, now_s: float) -> None:
        plus, minus = self._done[1], self._done[-1]
        if self.relabel_by != "none":
            used = _RELABEL_STATS[self.relabel_by]
            if used(plus) < used(minus):
                plus, minus = minus, plus
        u_plus, u_minus = float(self.utility(plus)), float(self.utility(minus))
        scale = max(abs(u_plus), abs(u_minus))
        if scale > 0 and abs(u_plus - u_minus) / scale > self.dead_band:
            step = self._delta if u_plus > u_minus else -self._delta
            self._pool = min(self.max_credits, max(self.min_credits, self._pool + step))
        self.history.append((now_s, self._pool, u_plus, u_minus))
        self.windows_.append((plus, minus))
        self._phase, self._phase_start, self._window = "warmup", now_s, None
        self._limit = self._pool


# -- leases ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    """A credit handed to one holder until it is released or ``expires_s`` passes.

    ``generation`` counts the controllers a :class:`LeasedCredits` has had
    (a new admission policy starts a new pool); a lease of an older pool is
    released without touching the new one. ``owner`` names the
    :class:`LeasedCredits` that granted it (a runtime replica, when replicas
    share one lease book): the credit goes back to that owner's pool.
    """

    lease_id: str
    holder: str
    klass: str
    granted_s: float
    expires_s: float
    generation: int = 0
    owner: str = ""


class LeaseError(LookupError):
    """A release the lease book refuses: ``reason`` is ``"unknown"`` (released, expired, never granted) or
    ``"holder"`` (the lease is another holder's)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class LeaseStore(Protocol):
    """Where leases live: the operations a shared store (e.g. Redis, one replica each) must offer atomically."""

    def put(self, lease: Lease) -> None:
        """Record a new lease."""

    def get(self, lease_id: str) -> Lease | None:
        """The lease with this id, or None."""

    def pop(self, lease_id: str) -> Lease | None:
        """Remove and return the lease with this id (None when there is none): exactly one caller wins."""

    def pop_expired(self, now_s: float) -> list[Lease]:
        """Remove and return every lease with ``expires_s <= now_s``."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Lease]: ...

    def forward(self, lease: Lease, outcome: str, good: bool) -> None:
        """Send a lease's end to its owner's pool (``outcome``: ``released`` or ``expired``).

        Only a shared store sees leases of other owners; a store of one
        process never needs it.
        """

    def take_forwarded(self, owner: str) -> list[tuple[str, int, str, bool]]:
        """Ends of ``owner``'s leases handled elsewhere: ``(class, generation, outcome, good)``, each once."""


class MemoryLeaseStore:
    """Leases in this process: a dict by id and a heap by expiry (stale heap entries are skipped)."""

    def __init__(self) -> None:
        self._by_id: dict[str, Lease] = {}
        self._expiry: list[tuple[float, str]] = []

    def put(self, lease: Lease) -> None:
        self._by_id[lease.lease_id] = lease
        heapq.heappush(self._expiry, (lease.expires_s, lease.lease_id))

    def get(self, lease_id: str) -> Lease | None:
        return self._by_id.get(lease_id)

    def pop(self, lease_id: str) -> Lease | None:
        lease = self._by_id.pop(lease_id, None)
        if not self._by_id:
            self._expiry.clear()
        return lease

    def pop_expired(self, now_s: float) -> list[Lease]:
        out = []
        while self._expiry and self._expiry[0][0] <= now_s:
            _, lease_id = heapq.heappop(self._expiry)
            lease = self._by_id.get(lease_id)
            if lease is not None and lease.expires_s <= now_s:
                del self._by_id[lease_id]
                out.append(lease)
        return out

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._by_id.values()))

    def forward(self, lease: Lease, outcome: str, good: bool) -> None:
        raise ValueError(f"MemoryLeaseStore holds one owner's leases only, got a lease of {lease.owner!r}.")

    def take_forwarded(self, owner: str) -> list[tuple[str, int, str, bool]]:
        return []


class LeasedCredits:
    """A :class:`CreditController` whose credits are leases: only the lease releases itself, and it expires.

    ``acquire`` takes a credit and records a :class:`Lease` (an unguessable id,
    the holder, the class, an expiry); ``release`` needs the lease's id (and
    its holder, when one is named): releasing twice, or a lease that is not
    one's own, is refused instead of taking another request's credit.
    :meth:`reclaim` returns the credits of expired leases to the pool (each
    counts as a drop in the controller's window), so a client that never
    releases cannot shrink the pool for good. Every method reclaims first.

    Args:
        controller: the credit pool.
        store: where leases live (default :class:`MemoryLeaseStore`).
        default_ttl_s: a lease's lifetime when ``acquire`` names none.
        max_ttl_s: the longest lifetime a caller may ask for.
        new_id: makes lease ids (default: 128 random bits, URL-safe).
        owner: this pool's name in a lease book that several pools share (one
            per runtime replica): a lease of another owner released or
            reclaimed here is forwarded to its owner's pool
            (:meth:`LeaseStore.forward`), which takes it back at its next call.
    """

    def __init__(self, controller: CreditController, store: LeaseStore | None = None, *,
                 default_ttl_s: float = 30.0, max_ttl_s: float = 600.0,
                 new_id: Callable[[], str] = lambda: secrets.token_urlsafe(16), owner: str = "") -> None:
        if not (math.isfinite(max_ttl_s) and max_ttl_s > 0):
            raise ValueError(f"The 'max_ttl_s' parameter of LeasedCredits must be > 0, got {max_ttl_s!r}.")
        if not (math.isfinite(default_ttl_s) and 0 < default_ttl_s <= max_ttl_s):
            raise ValueError(f"The 'default_ttl_s' parameter of LeasedCredits must be in (0, {max_ttl_s}], "
                             f"got {default_ttl_s!r}.")
        self.controller = controller
        self.store: LeaseStore = store if store is not None else MemoryLeaseStore()
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self.new_id = new_id
        self.owner = owner
        self.generation = 0
        self.counts = {"granted": 0, "released": 0, "expired": 0, "refused": 0, "forwarded": 0}

    def swap(self, controller: CreditController) -> None:
        """Put a new pool in force; leases of the old one stay valid and release without touching it."""
        self.controller = controller
        self.generation += 1

    def acquire(self, klass: str, holder: str, now_s: float, ttl_s: float | None = None) -> Lease | None:
        """A lease on a credit of ``klass`` for ``holder``, or None when the pool refuses (a drop)."""
        ttl = self.default_ttl_s if ttl_s is None else ttl_s
        if not (math.isfinite(ttl) and 0 < ttl <= self.max_ttl_s):
            raise ValueError(f"The 'ttl_s' argument of LeasedCredits.acquire must be in (0, {self.max_ttl_s}], "
                             f"got {ttl_s!r}.")
        self.reclaim(now_s)
        if not self.controller.try_acquire(klass, now_s):
            self.counts["refused"] += 1
            return None
        lease = Lease(self.new_id(), holder, klass, now_s, now_s + ttl, self.generation, self.owner)
        self.store.put(lease)
        self.counts["granted"] += 1
        return lease

    def release(self, lease_id: str, now_s: float, *, holder: str | None = None, ok: bool = True,
                within_slo: bool = True) -> Lease:
        """End a lease and return its credit (``good`` if ``ok and within_slo``).

        Raises:
            LeaseError: no such lease (released, expired, never granted) or, with ``holder``, not theirs.
        """
        self.reclaim(now_s)
        lease = self.store.get(lease_id)
        if lease is None:
            raise LeaseError(f"no lease {lease_id!r}: released already, expired, or never granted", "unknown")
        if holder is not None and holder != lease.holder:
            raise LeaseError(f"lease {lease_id!r} is held by another holder", "holder")
        if self.store.pop(lease_id) is None:  # another caller released it first
            raise LeaseError(f"no lease {lease_id!r}: released already", "unknown")
        if lease.owner != self.owner:  # another replica's credit: its pool takes it back
            self.store.forward(lease, "released", ok and within_slo)
            self.counts["forwarded"] += 1
        elif lease.generation == self.generation:
            self.controller.release(lease.klass, now_s, ok=ok, within_slo=within_slo)
        self.counts["released"] += 1
        return lease

    def reclaim(self, now_s: float) -> list[Lease]:
        """Return the credits of every lease expired by ``now_s`` (each a drop); the expired leases.

        Also takes back the credits of this owner's leases that another
        owner released or reclaimed (a shared lease book).
        """
        for klass, generation, outcome, good in self.store.take_forwarded(self.owner):
            if generation != self.generation:
                continue  # a lease of an earlier pool: the pool in force never counted it
            if outcome == "released":
                self.controller.release(klass, now_s, ok=good, within_slo=good)
            else:
                self.controller.record_drop(klass, now_s)
        expired = self.store.pop_expired(now_s)
        for lease in expired:
            if lease.owner != self.owner:
                self.store.forward(lease, "expired", False)
                self.counts["forwarded"] += 1
            elif lease.generation == self.generation:
                self.controller.record_drop(lease.klass, now_s)
        self.counts["expired"] += len(expired)
        return expired

    @property
    def outstanding(self) -> int:
        """Leases not yet released nor expired."""
        return len(self.store)
