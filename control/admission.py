"""The admission-controller interface, and Svalinn: credits, per-bottleneck AQM and a tuned m_semaphore (Svalinn §4).

An :class:`AdmissionController` makes the decisions of overload control at
every control point of a request's life on one server — admit it at all, let
it join a bottleneck's queue, let it start a memory-bound section — and hears
every outcome and the clock. The same object runs inside the simulator
(:func:`sloctl.simulation.server_sim.simulate`) and behind the live ASGI
middleware and asyncio m_semaphore (:mod:`sloctl.serving.runtime.admission`): each
driver only turns its own events and clock into these calls, so a controller
that works in simulation works live unchanged.

A controller reads a request through :class:`AdmissionRequest`: its kind
(:class:`RequestKind`: name, priority class, SLO, CPU and lock work), arrival
time, the core and memory time its driver measured, and a ``ctx`` dict the
controller owns. The simulator's requests satisfy it structurally; live
drivers use :class:`InFlightRequest` and :class:`RequestProfile`.

:class:`AdmitAll` is the do-nothing controller and the base of the others.
:class:`MemoryGate` is Svalinn's m_semaphore with its ε-greedy bandit (§4.3);
:class:`Svalinn` composes a :class:`~sloctl.control.credits.CreditController`
(§4.1), a :class:`~sloctl.control.aqm.BottleneckAQM` per bottleneck (§4.2) and
a :class:`MemoryGate`. See ``docs/admission.md`` and ``docs/admission_sim.md``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from sloctl.control.aqm import BottleneckAQM, DelayBudget
from sloctl.control.credits import ClassShare, CreditController, Utility
from sloctl.control.msemaphore import CapacityTuner, EpsilonGreedyTuner, MSemaphore

__all__ = [
    "AdmissionController",
    "AdmissionRequest",
    "AdmitAll",
    "GateOutcome",
    "InFlightRequest",
    "MemoryGate",
    "RequestKind",
    "RequestProfile",
    "Svalinn",
]

GateOutcome = Literal["acquired", "queued", "dropped"]


class RequestKind(Protocol):
    """What a controller reads of a request's kind (the simulator's ``RequestType``, a live :class:`RequestProfile`)."""

    @property
    def name(self) -> str:
        """The kind's name (expected service times are keyed by it)."""

    @property
    def klass(self) -> str:
        """Its priority class (what credit pools shed by)."""

    @property
    def slo_s(self) -> float:
        """Latency SLO, arrival to completion (seconds)."""

    @property
    def cpu_s(self) -> float:
        """CPU work (seconds); half of it follows the memory section."""

    @property
    def lock_s(self) -> float:
        """CPU time spent holding its lock (seconds)."""


class AdmissionRequest(Protocol):
    """A request in flight as a controller sees it; hashable by identity (it is its own m_semaphore token).

    ``core_s``, ``mem_s`` and ``ok`` are filled in by the driver before the
    callback that reads them: ``core_s`` (time on a server) before
    ``on_complete``, ``mem_s`` (length of the memory section, NaN if not
    measured) before ``mem_release``, ``ok`` (the server answered without an
    error; simulated requests always do) before ``on_complete``.
    """

    @property
    def rtype(self) -> RequestKind: ...

    @property
    def arrival_s(self) -> float: ...

    @property
    def ctx(self) -> dict[str, Any]:
        """Scratch space owned by the controller (credits held, delay budget, ...)."""

    @property
    def core_s(self) -> float: ...

    @property
    def mem_s(self) -> float: ...

    @property
    def ok(self) -> bool: ...


@dataclass(frozen=True)
class RequestProfile:
    """A request kind for live drivers (the simulator has its ``RequestType``).

    Args:
        name: the kind's name (expected service times are keyed by it).
        klass: its priority class.
        slo_s: latency SLO (seconds, > 0; ``inf``: no deadline).
        cpu_s: CPU work (seconds, >= 0).
        lock_s: CPU time spent holding a lock (seconds, >= 0).
    """

    name: str
    klass: str
    slo_s: float
    cpu_s: float = 0.0
    lock_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.slo_s > 0:  # also refuses NaN
            raise ValueError(f"The 'slo_s' field of RequestProfile must be > 0, got {self.slo_s!r}.")
        for name in ("cpu_s", "lock_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"The '{name}' field of RequestProfile must be a finite number >= 0, "
                                 f"got {value!r}.")


@dataclass(eq=False)
class InFlightRequest:
    """A live request as its driver tracks it; satisfies :class:`AdmissionRequest` (equal only to itself)."""

    rtype: RequestKind
    arrival_s: float
    core_s: float = 0.0
    mem_s: float = math.nan
    ok: bool = True
    ctx: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class AdmissionController(Protocol):
    """The decisions an overload controller makes, and the events it hears.

    Decisions (return False / ``"dropped"`` to drop the request):

    * ``on_arrival(req, now_s)`` — admit a new request at all.
    * ``on_enqueue(req, bottleneck, queue_len, now_s)`` — before joining an
      explicit queue: ``"cpu"`` (the run queue; live: the server's workers)
      or a lock's name; ``queue_len`` counts the requests already waiting
      there. A drop at a lock is partial (the request already ran some work).
    * ``mem_gate(req, now_s)`` — before a memory section: ``"acquired"``
      (run it now), ``"queued"`` (the controller parks the request; its
      core is freed) or ``"dropped"`` (partial drop). A controller without
      an m_semaphore returns ``"acquired"``.
    * ``mem_release(req, now_s)`` — called with the request whose gated
      memory section just ended, and with ``None`` after every ``tick`` (a
      grown capacity may free slots); returns the parked requests that may
      now run their memory section, oldest first.
    * ``mem_expired(now_s)`` — called after every ``tick``: parked requests
      the controller gives up on (e.g. their deadline can no longer be met);
      each becomes a partial drop.

    Outcome callbacks: ``on_dequeue(req, bottleneck, wait_s, now_s)`` when a
    request leaves an explicit queue for its server; ``on_complete(req,
    now_s)``; ``on_drop(req, now_s, partial)`` for every drop, whoever made
    it (also a refusal by ``on_arrival``). Control: ``tick(now_s)`` on the
    driver's control cadence, right after ``observe_bandwidth(bytes_per_s,
    now_s)`` with the mean memory bandwidth since the last tick where the
    driver measures it. ``gauges()`` returns numbers for a time series.
    """

    def on_arrival(self, req: AdmissionRequest, now_s: float) -> bool: ...
    @staticmethod
    def _kind(bottleneck: str, req: AdmissionRequest) -> str | None:
        """The run queue counts each request at its type's core time; a lock's holds are one kind."""
        return req.rtype.name if bottleneck == "cpu" else None

    def on_enqueue(self, req: AdmissionRequest, bottleneck: str, queue_len: int, now_s: float) -> bool: ...
    def on_dequeue(self, req: AdmissionRequest, bottleneck: str, wait_s: float, now_s: float) -> None: ...
    def mem_gate(self, req: AdmissionRequest, now_s: float) -> GateOutcome: ...
    def mem_release(self, req: AdmissionRequest | None, now_s: float) -> list[AdmissionRequest]: ...
    def mem_expired(self, now_s: float) -> list[AdmissionRequest]: ...
    def on_complete(self, req: AdmissionRequest, now_s: float) -> None: ...
    def on_drop(self, req: AdmissionRequest, now_s: float, partial: bool) -> None: ...
    def tick(self, now_s: float) -> None: ...
    def observe_bandwidth(self, bytes_per_s: float, now_s: float) -> None: ...
    def gauges(self) -> dict[str, float]: ...


class AdmitAll:
    """Admit everything, never gate memory: the ``none`` baseline and the defaults the other controllers override."""

    def on_arrival(self, req: AdmissionRequest, now_s: float) -> bool:
        return True

    @staticmethod
    def _kind(bottleneck: str, req: AdmissionRequest) -> str | None:
        """The run queue counts each request at its type's core time; a lock's holds are one kind."""
        return req.rtype.name if bottleneck == "cpu" else None

    def on_enqueue(self, req: AdmissionRequest, bottleneck: str, queue_len: int, now_s: float) -> bool:
        return True

    def on_dequeue(self, req: AdmissionRequest, bottleneck: str, wait_s: float, now_s: float) -> None:
        pass

    def mem_gate(self, req: AdmissionRequest, now_s: float) -> GateOutcome:
        return "acquired"

    def mem_release(self, req: AdmissionRequest | None, now_s: float) -> list[AdmissionRequest]:
        return []

    def mem_expired(self, now_s: float) -> list[AdmissionRequest]:
        return []

    def on_complete(self, req: AdmissionRequest, now_s: float) -> None:
        pass

    def on_drop(self, req: AdmissionRequest, now_s: float, partial: bool) -> None:
        pass

    def tick(self, now_s: float) -> None:
        pass

    def observe_bandwidth(self, bytes_per_s: float, now_s: float) -> None:
        pass

    def gauges(self) -> dict[str, float]:
        return {}


class MemoryGate(AdmitAll):
    """Svalinn's m_semaphore and the bandit that sizes it (§4.3); every other decision admits.

    * :meth:`mem_gate` is ``MSemaphore.wait_if_uncongested`` with the
      request's delay budget (``ctx["budget"]``: a
      :class:`~sloctl.control.aqm.DelayBudget` or seconds) and the expected
      hold ``hold_s_``, an EWMA (weight 0.2 on the newest) of the section
      times reported to :meth:`mem_release`. :meth:`try_wait` is the
      never-queueing entry.
    * A parked request predicted to finish after its deadline
      (``start + hold + cpu_s / 2 > arrival + slo``) is passed over at
      hand-off and given up at the next :meth:`mem_expired`.
    * :meth:`tick`: once the tuner is due (every ``tuner.interval_s``) it
      learns the mean of the bandwidths observed since its last step and
      picks the next capacity; slots a grown capacity opens go to the oldest
      parked requests, returned by the next ``mem_release(None, now_s)``.

    Args:
        capacity: starting capacity (None: the tuner's first pick, ``select(0.0)``).
        tuner: one of :mod:`sloctl.control.msemaphore`'s bandits (it also
            offers ``due(now_s)`` and ``best``); None keeps the capacity fixed.
        tune: False keeps the capacity fixed even with a tuner (its reward
            and ``best`` then serve as a yardstick only).
        initial_hold_s: expected section time before the first report
            (seconds; while the estimate is 0 a report replaces it).
    """

    def __init__(self, capacity: int | None = None, tuner: CapacityTuner | None = None, *, tune: bool = True,
                 initial_hold_s: float = 0.0) -> None:
        if capacity is None and tuner is None:
            raise ValueError("The 'capacity' parameter of MemoryGate must be given when 'tuner' is None, got None.")
        if not (math.isfinite(initial_hold_s) and initial_hold_s >= 0):
            raise ValueError(f"The 'initial_hold_s' parameter of MemoryGate must be >= 0, got {initial_hold_s!r}.")
        self.tuner_ = tuner
        self.tune = tune and tuner is not None
        start = capacity if capacity is not None else tuner.select(0.0)
        self.msem_ = MSemaphore(start)
        self.hold_s_ = float(initial_hold_s)
        self.capacity_log_: list[tuple[float, int, int]] = [(0.0, start, self._best())]
        self._bw_sum = 0.0
        self._bw_n = 0
        self._granted: deque[AdmissionRequest] = deque()
        self._expired: list[AdmissionRequest] = []
        self._parked: dict[AdmissionRequest, None] = {}  # insertion-ordered, for determinism

    def _best(self) -> int:
        return self.tuner_.best if self.tuner_ is not None else self.msem_.capacity

    def try_wait(self, now_s: float) -> bool:
        """Take a slot only if one is free and nobody is parked; never queues (the paper's ``try_wait``)."""
        return self.msem_.try_wait(None)

    def mem_gate(self, req: AdmissionRequest, now_s: float) -> GateOutcome:
        outcome = self.msem_.wait_if_uncongested(req, req.ctx["budget"], now_s, self.hold_s_)
        if outcome == "queued":
            req.ctx["mem_queued_s"] = now_s
            self._parked[req] = None
        return outcome

    def _late(self, req: AdmissionRequest, start_s: float) -> bool:
        """Would ``req`` miss its deadline if its memory section started at ``start_s``?"""
        return start_s + self.hold_s_ + req.rtype.cpu_s / 2 > req.arrival_s + req.rtype.slo_s

    def _grant(self, req: AdmissionRequest, now_s: float) -> AdmissionRequest:
        self._parked.pop(req, None)
        wait_s = max(0.0, now_s - req.ctx.pop("mem_queued_s"))
        budget = req.ctx["budget"]
        if isinstance(budget, DelayBudget):
            budget.deduct(wait_s)
        return req

    def mem_release(self, req: AdmissionRequest | None, now_s: float) -> list[AdmissionRequest]:
        if req is None:
            granted, self._granted = list(self._granted), deque()
            return granted
        if not math.isnan(req.mem_s):
            self.hold_s_ = req.mem_s if self.hold_s_ == 0.0 else 0.2 * req.mem_s + 0.8 * self.hold_s_
        nxt = self.msem_.post(now_s)
        while nxt is not None and self._late(nxt, now_s):  # too late: pass the slot on
            del self._parked[nxt]
            self._expired.append(nxt)
            nxt = self.msem_.post(now_s)
        return [] if nxt is None else [self._grant(nxt, now_s)]

    def mem_expired(self, now_s: float) -> list[AdmissionRequest]:
        # A waiter predicted to finish after its deadline cannot count as good: free its place for one that can.
        expired, self._expired = self._expired, []
        per_slot_s = self.hold_s_ / self.msem_.capacity
        for position, req in enumerate(list(self._parked)):
            if self._late(req, now_s + (position + 1) * per_slot_s):
                self.msem_.cancel(req)
                del self._parked[req]
                expired.append(req)
        return expired

    def on_drop(self, req: AdmissionRequest, now_s: float, partial: bool) -> None:
        # A parked request dropped by someone else (e.g. a live caller gave up) leaves the queue.
        if req in self._parked:
            self.msem_.cancel(req)
            del self._parked[req]

    def observe_bandwidth(self, bytes_per_s: float, now_s: float) -> None:
        self._bw_sum += bytes_per_s
        self._bw_n += 1

    def tick(self, now_s: float) -> None:
        if not self.tune or not self.tuner_.due(now_s) or self._bw_n == 0:
            return
        self.tuner_.update(self.msem_.capacity, self._bw_sum / self._bw_n, now_s)
        self._bw_sum, self._bw_n = 0.0, 0
        capacity = self.tuner_.select(now_s)
        self._granted.extend(self._grant(r, now_s) for r in self.msem_.set_capacity(capacity, now_s))
        self.capacity_log_.append((now_s, capacity, self.tuner_.best))

    def gauges(self) -> dict[str, float]:
        return {"msem_capacity": self.msem_.capacity, "msem_best": self._best(),
                "msem_queued": self.msem_.queued, "mem_hold_s": self.hold_s_}


class Svalinn(AdmitAll):
    """Svalinn (§4): credits for total throughput, AQM per bottleneck, a bandit-sized m_semaphore.

    * Arrival: a :class:`~sloctl.control.aqm.DelayBudget` of
      ``slo − expected service`` and a credit
      (:class:`~sloctl.control.credits.CreditController`, shedding
      low-priority classes first; §4.1).
    * Run queue (``"cpu"``) and each lock: a
      :class:`~sloctl.control.aqm.BottleneckAQM` drops the request before it
      joins when the predicted wait exceeds its remaining budget; the wait
      actually spent is deducted on leaving (§4.2). The run queue's items
      are kinds of request: each queued request counts its type's mean core
      time (an EWMA of ``core_s`` at completion per request type), spread
      over the cores. A lock's hold is its ``lock_s``.
    * Memory sections: the :class:`MemoryGate` (§4.3).

    A completion releases the credit as good when it was ``ok`` and within
    its SLO; a drop returns the credit as a drop and runs the budget's
    cleanups. :meth:`for_server` builds the configuration the simulator's
    experiments run.

    Args:
        credits: the credit controller; with classes a request takes a
            credit of its kind's ``klass``, without them every request
            draws on one pool (class ``"all"``).
        cpu_aqm: the run queue's AQM (its servers: the cores, or the live
            server's concurrency).
        memory: the m_semaphore and its tuner.
        expected_service_s: isolated service time per request kind name
            (seconds); kinds not listed expect 0.
        lock_residual: a lock's AQM counts what is left of the holder's
            section (``BottleneckAQM(residual=True)``, from the time the holder
            got the lock) instead of a whole section; False is the rule before
            2026-12-03 (the three-bottleneck lock class 0.83 → 0.85 of the bound
            at 1×, about what a clairvoyant admission serves; docs/admission_sim.md).
        lock_reserve_holds: at the run queue, a request that will take a lock
            (its type names one, ``rtype.lock``) is judged with this many of the
            lock's mean holds kept back from its budget, so that it reaches the
            lock with time left to wait there; 0 keeps nothing back.
        lock_spin_gaps: while requests wait for a core, a lock admits a waiter
            only if its expected wait is at most this many mean gaps between
            arrivals at the lock: a waiter spins on its core, and a later
            arrival would likely take the lock with less spinning. None admits
            every waiter whose budget allows. (Both since 2026-12-03: in the
            three-bottleneck mix the lock class 0.84–0.89 → 0.91–0.93 of the bound
            at 3–6×, the CPU class at 2× 0.89 → 0.86–0.87; docs/admission_sim.md.)
    """

    def __init__(self, credits: CreditController, cpu_aqm: BottleneckAQM, memory: MemoryGate,
                 expected_service_s: Mapping[str, float] | None = None, lock_residual: bool = True,
                 lock_reserve_holds: float = 1.0, lock_spin_gaps: float | None = 2.0) -> None:
        if not (math.isfinite(lock_reserve_holds) and lock_reserve_holds >= 0):
            raise ValueError(f"The 'lock_reserve_holds' parameter of Svalinn must be >= 0, got {lock_reserve_holds!r}.")
        if lock_spin_gaps is not None and not (math.isfinite(lock_spin_gaps) and lock_spin_gaps > 0):
            raise ValueError(f"The 'lock_spin_gaps' parameter of Svalinn must be > 0 or None, got {lock_spin_gaps!r}.")
        self.lock_residual = bool(lock_residual)
        self.lock_reserve_holds = float(lock_reserve_holds)
        self.lock_spin_gaps = lock_spin_gaps
        self.credits_ = credits
        self.cpu_aqm_ = cpu_aqm
        self.memory_ = memory
        self.expected_service_s = dict(expected_service_s or {})
        self.lock_aqm_: dict[str, BottleneckAQM] = {}

    @classmethod
    def for_server(cls, cores: int, max_bandwidth_bytes_per_s: float, expected_service_s: Mapping[str, float],
                   priorities: Mapping[str, int] | None = None, utility: Utility | None = None,
                   static_capacity: int | None = None, credit_kwargs: Mapping[str, Any] | None = None,
                   tuner_kwargs: Mapping[str, Any] | None = None, seed: int = 0,
                   shares: Mapping[str, float] | None = None, lock_residual: bool = True,
                   lock_reserve_holds: float = 1.0, lock_spin_gaps: float | None = 2.0,
                   run_queue_target_scale: float = 1.0) -> Svalinn:
        """Svalinn for a server with ``cores`` cores and peak memory bandwidth ``max_bandwidth_bytes_per_s``.

        The run queue's AQM has ``cores`` servers; the m_semaphore's
        :class:`~sloctl.control.msemaphore.EpsilonGreedyTuner` has arms
        ``1..cores``, starts at ``cores`` and earns its full bandwidth reward
        at ``max_bandwidth_bytes_per_s``.

        Args:
            cores: the server's cores.
            max_bandwidth_bytes_per_s: peak memory bandwidth (the tuner's full reward).
            expected_service_s: isolated service time per request type name (seconds).
            priorities: priority per class name (higher = more important); one
                class, or none given, disables shedding order.
            utility: the credit controller's utility (default throughput).
            static_capacity: fix the m_semaphore capacity and disable the tuner.
            credit_kwargs, tuner_kwargs: passed on to the controller and the tuner.
            seed: seeds the credit experiments and the tuner.
            shares: credit share per class name (default 1 each; see ``ClassShare``).
            lock_residual, lock_reserve_holds, lock_spin_gaps: see the class's arguments.
            run_queue_target_scale: the run queue's AQM holds every newcomer to
                this multiple (>= 1) of the tightest budget among the request
                types using it (``BottleneckAQM(tightest_scale=)``); above 1 the
                tightest type gives up part of the queue to the others.
        """
        priorities = dict(priorities or {})
        shares = dict(shares or {})
        classes = ([ClassShare(n, p, shares.get(n, 1.0)) for n, p in priorities.items()]
                   if len(priorities) > 1 else [])
        credits = CreditController(utility=utility, classes=classes, seed=seed, **dict(credit_kwargs or {}))
        tuner = EpsilonGreedyTuner(cores, max_bandwidth_bytes_per_s, seed=seed,
                                   **{"initial_capacity": cores, **dict(tuner_kwargs or {})})
        memory = MemoryGate(static_capacity, tuner, tune=static_capacity is None)
        run_queue = BottleneckAQM("cpu", servers=cores, protect_tightest=True, tightest_scale=run_queue_target_scale)
        return cls(credits, run_queue, memory, expected_service_s,
                   lock_residual=lock_residual, lock_reserve_holds=lock_reserve_holds, lock_spin_gaps=lock_spin_gaps)

    # -- the parts, under the names drivers and reports read -------------------------

    @property
    def tuner_(self) -> CapacityTuner | None:
        return self.memory_.tuner_

    @property
    def msem_(self) -> MSemaphore:
        return self.memory_.msem_

    @property
    def mem_hold_s_(self) -> float:
        return self.memory_.hold_s_

    @property
    def capacity_log_(self) -> list[tuple[float, int, int]]:
        """``(now_s, capacity, best arm)`` at the start and after every tuner step."""
        return self.memory_.capacity_log_

    # -- decisions and outcomes -------------------------------------------------------

    def _klass(self, req: AdmissionRequest) -> str:
        return req.rtype.klass if self.credits_.classes else "all"

    def on_arrival(self, req: AdmissionRequest, now_s: float) -> bool:
        slo_s = req.rtype.slo_s  # the budget first: a bad SLO raises before a credit is taken
        budget = DelayBudget(slo_s, min(self.expected_service_s.get(req.rtype.name, 0.0), slo_s))
        if not self.credits_.try_acquire(self._klass(req), now_s):
            return False
        req.ctx["credit"] = True
        req.ctx["budget"] = budget
        return True

    def _aqm(self, bottleneck: str) -> BottleneckAQM:
        if bottleneck == "cpu":
            return self.cpu_aqm_
        if bottleneck not in self.lock_aqm_:
            self.lock_aqm_[bottleneck] = BottleneckAQM(bottleneck, servers=1, count_in_service=True,
                                                       residual=self.lock_residual)
        return self.lock_aqm_[bottleneck]

    @staticmethod
    def _kind(bottleneck: str, req: AdmissionRequest) -> str | None:
        """The run queue counts each request at its type's core time; a lock's holds are one kind."""
        return req.rtype.name if bottleneck == "cpu" else None

    def on_enqueue(self, req: AdmissionRequest, bottleneck: str, queue_len: int, now_s: float) -> bool:
        aqm = self._aqm(bottleneck)
        kind = self._kind(bottleneck, req)
        reserve_s = 0.0
        if bottleneck == "cpu":
            lock = getattr(req.rtype, "lock", None)
            if lock is not None and self.lock_reserve_holds > 0:
                reserve_s = self.lock_reserve_holds * self._aqm(lock).mean_hold_s
        else:
            aqm.arrived(now_s)
            if self.lock_spin_gaps is not None and self._spins_too_long(aqm, now_s):
                aqm.refuse(req.ctx["budget"])
                return False
        if aqm.should_drop(req.ctx["budget"], kind, now_s, reserve_s=reserve_s):
            return False
        aqm.joined(kind)
        return True

    def _spins_too_long(self, aqm: BottleneckAQM, now_s: float) -> bool:
        """Whether a newcomer at the lock ``aqm`` guards would spin longer than ``lock_spin_gaps`` mean gaps
        between arrivals there while requests wait for a core (a later arrival would likely take it sooner)."""
        if aqm.mean_gap_s is None or self.cpu_aqm_.queue_len == 0:
            return False  # no estimate yet, or idle cores: spinning costs no one
        wait_s = aqm.expected_wait_s(now_s=now_s)
        return wait_s > 0 and wait_s > self.lock_spin_gaps * aqm.mean_gap_s

    def on_dequeue(self, req: AdmissionRequest, bottleneck: str, wait_s: float, now_s: float) -> None:
        aqm = self._aqm(bottleneck)
        aqm.left(wait_s, req.ctx["budget"], self._kind(bottleneck, req), now_s)
        if bottleneck != "cpu":
            aqm.observe_hold(req.rtype.lock_s)

    def on_release(self, req: AdmissionRequest, bottleneck: str, now_s: float) -> None:
        """``req`` let go of lock ``bottleneck`` (its AQM counts the lock as free again)."""
        if bottleneck != "cpu":
            self._aqm(bottleneck).released()

    def mem_gate(self, req: AdmissionRequest, now_s: float) -> GateOutcome:
        return self.memory_.mem_gate(req, now_s)

    def mem_release(self, req: AdmissionRequest | None, now_s: float) -> list[AdmissionRequest]:
        return self.memory_.mem_release(req, now_s)

    def mem_expired(self, now_s: float) -> list[AdmissionRequest]:
        return self.memory_.mem_expired(now_s)

    def on_complete(self, req: AdmissionRequest, now_s: float) -> None:
        self.cpu_aqm_.observe_hold(req.core_s, req.rtype.name)
        within_slo = now_s - req.arrival_s <= req.rtype.slo_s
        self.credits_.release(self._klass(req), now_s, ok=req.ok, within_slo=within_slo)

    def on_drop(self, req: AdmissionRequest, now_s: float, partial: bool) -> None:
        self.memory_.on_drop(req, now_s, partial)
        if req.ctx.pop("credit", False):
            self.credits_.record_drop(self._klass(req), now_s)
            req.ctx["budget"].drop()

    def observe_bandwidth(self, bytes_per_s: float, now_s: float) -> None:
        self.memory_.observe_bandwidth(bytes_per_s, now_s)

    def tick(self, now_s: float) -> None:
        self.credits_.tick(now_s)
        self.memory_.tick(now_s)

    def gauges(self) -> dict[str, float]:
        mean_hold_s = self.cpu_aqm_.mean_hold_s
        return {"credits": self.credits_.credits, "in_flight": self.credits_.in_flight, **self.memory_.gauges(),
                "cpu_mean_hold_s": mean_hold_s if math.isfinite(mean_hold_s) else 0.0}

