"""A seeded event-driven simulator of one server with several bottlenecks (the setting of Svalinn §2).

The server has ``cores`` worker cores fed by one FIFO run queue, a memory
bandwidth shared by every thread inside a memory-bound section, and optional
named locks. A request holds its core from start to finish — including while
it is stalled on memory or spinning on a lock — so too many concurrent
memory sections eat the cores CPU-bound requests need (Svalinn §2,
observation 1). The one exception is a policy's m_semaphore: a request parked
there gives its core back and, once granted, resumes at the head of the run
queue (a parked user thread in Shenango does not occupy a core).

A request runs these phases in order, skipping empty ones: the first half of
its CPU work, its memory section, the second half of its CPU work, its lock
section (CPU time spent holding the lock). Memory sections share bandwidth as
a fluid: each of the ``n`` active sections moves bytes at
``min(per-thread max, B / n)``, recomputed whenever ``n`` changes.

An :class:`~sloctl.control.admission.AdmissionController` decides at every
control point (the same object that runs behind the live middleware); see its
docstring and ``docs/admission_sim.md``. Times are seconds, sizes bytes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloctl.control.admission import AdmissionController
from sloctl.control.admission_oracle import GoodputBound, goodput_bound

__all__ = [
    "DemandChange",
    "Request",
    "RequestType",
    "ServerConfig",
    "SimResult",
    "TypeStats",
    "capacity_per_s",
    "isolated_service_s",
    "lock_ceiling_per_s",
    "oracle_bound",
    "simulate",
]

_ARRIVE, _CPU, _MEM, _LOCK, _TICK, _SAMPLE, _DEMAND, _MARK = range(8)


@dataclass(frozen=True)
class RequestType:
    """One kind of request.

    Args:
        name: the type's name (metrics are keyed by it).
        klass: its priority class (e.g. ``"high"``/``"low"``), what credit pools shed by.
        cpu_s: CPU work (seconds), split in two halves around the memory section.
        mem_bytes: bytes the memory-bound section moves (0: no section).
        lock: name of the lock its last section holds, or None.
        lock_s: CPU time spent holding the lock (seconds).
        slo_s: latency SLO (seconds), arrival to completion.
        share: relative share of arrivals.
        thread_bytes_per_s: the most bandwidth one of its threads can draw (its
            access pattern); None = the server's ``thread_bytes_per_s``.
    """

    name: str
    klass: str
    cpu_s: float
    mem_bytes: float = 0.0
    lock: str | None = None
    lock_s: float = 0.0
    slo_s: float = 1e-3
    share: float = 1.0
    thread_bytes_per_s: float | None = None


@dataclass(frozen=True)
class ServerConfig:
    """The machine: cores, memory bandwidth ``B`` and one thread's bandwidth ceiling (bytes/s).

    ``oversubscription_loss`` (γ, default 0: the bus saturates without
    degrading) makes an oversubscribed bus lose bandwidth: with the active
    sections' ceilings summing to ``r × B`` for ``r > 1``, they share
    ``B / (1 + γ (r − 1))``. It is a what-if knob for the comparison's
    sensitivity, not a measured property of any machine.
    """

    cores: int = 16
    bandwidth_bytes_per_s: float = 60e9
    thread_bytes_per_s: float = 10e9
    oversubscription_loss: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.oversubscription_loss) and self.oversubscription_loss >= 0):
            raise ValueError("The 'oversubscription_loss' field of ServerConfig must be a finite number >= 0, "
                             f"got {self.oversubscription_loss!r}.")


@dataclass(frozen=True)
class DemandChange:
    """From ``at_s`` on, arrivals are drawn from ``types`` instead (e.g. another memory access pattern)."""

    at_s: float
    types: tuple[RequestType, ...]


def isolated_service_s(rtype: RequestType, config: ServerConfig) -> float:
    """Latency of a request alone on the server: CPU + memory at its thread ceiling + lock section."""
    mem_s = rtype.mem_bytes / _thread_cap(rtype, config) if rtype.mem_bytes > 0 else 0.0
    return rtype.cpu_s + mem_s + rtype.lock_s


def _thread_cap(rtype: RequestType, config: ServerConfig) -> float:
    return rtype.thread_bytes_per_s if rtype.thread_bytes_per_s is not None else config.thread_bytes_per_s


@dataclass(eq=False)
class Request:
    """A request in flight; it satisfies :class:`~sloctl.control.admission.AdmissionRequest`.

    ``ctx`` belongs to the policy (budgets, credits held, ...); ``ok`` is
    always True here (a simulated server never answers with an error).
    """

    id: int
    rtype: RequestType
    arrival_s: float
    phase: int = 0
    enqueued_s: float = 0.0
    core_since_s: float = math.nan
    core_s: float = 0.0
    mem_start_s: float = math.nan
    mem_s: float = 0.0
    mem_gated: bool = False
    mem_granted: bool = False
    ctx: dict[str, Any] = field(default_factory=dict)
    ok: bool = True


@dataclass
class TypeStats:
    """Counts and latencies of one request type's arrivals inside the measurement window."""

    offered: int = 0
    admitted: int = 0
    dropped: int = 0
    completed: int = 0
    good: int = 0
    latencies_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` measured over ``[warmup_s, duration_s)``; ``to_dict()`` gives the plain form."""

    window_s: float
    types: dict[str, TypeStats]
    slo_s: dict[str, float]
    utilisation: float
    bandwidth_bytes_per_s: float
    series: dict[str, list[float]]
    events: int
    locks: dict[str, dict[str, int]] = field(default_factory=dict)

    def goodput_per_s(self, name: str) -> float:
        """Completions of ``name`` within its SLO, per second of the window."""
        return self.types[name].good / self.window_s

    def p_latency_s(self, name: str, q: float) -> float:
        """The ``q``-quantile (0..1) latency of admitted-and-completed ``name`` requests (NaN if none)."""
        lat = self.types[name].latencies_s
        return float(np.quantile(lat, q)) if lat else math.nan

    @property
    def drop_rate(self) -> float:
        offered = sum(s.offered for s in self.types.values())
        return sum(s.dropped for s in self.types.values()) / offered if offered else 0.0

    def to_dict(self) -> dict[str, Any]:
        per_type = {n: {"offered": s.offered, "admitted": s.admitted, "dropped": s.dropped,
                        "completed": s.completed, "goodput_per_s": self.goodput_per_s(n),
                        "p50_s": self.p_latency_s(n, 0.5), "p99_s": self.p_latency_s(n, 0.99),
                        "slo_s": self.slo_s[n]} for n, s in self.types.items()}
        return {"types": per_type, "drop_rate": self.drop_rate, "utilisation": self.utilisation,
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s, "window_s": self.window_s,
                "locks": {n: dict(c) for n, c in self.locks.items()}}


def simulate(types: Sequence[RequestType], policy: AdmissionController, *, rate_per_s: float, duration_s: float,
             config: ServerConfig = ServerConfig(), warmup_s: float = 0.0, seed: int = 0,
             control_interval_s: float = 1e-4, sample_interval_s: float = 1e-3,
             demand_change: DemandChange | None = None) -> SimResult:
    """Run ``policy`` on the server under open-loop Poisson arrivals.

    Arrivals stop at ``duration_s``; the run then continues until every
    request has resolved or for twice the largest SLO, whichever is first, so
    that measured requests can finish (later ones could not count as good anyway).

    Args:
        types: the request mix (``share`` weights arrivals).
        policy: the overload controller (see :class:`~sloctl.control.admission.AdmissionController`).
        rate_per_s: total arrival rate (requests/s).
        duration_s: when arrivals stop (seconds).
        config: the machine.
        warmup_s: arrivals before this are not measured (seconds).
        seed: seeds arrivals and type draws; equal seeds give equal results.
        control_interval_s: cadence of ``observe_bandwidth`` + ``tick``.
        sample_interval_s: cadence of the time series.
        demand_change: an optional switch of the request mix.

    Returns:
        The measured :class:`SimResult`.
    """
    _validate(types, rate_per_s, duration_s, warmup_s, control_interval_s, sample_interval_s, config)
    return _Engine(types, policy, rate_per_s, duration_s, config, warmup_s, seed, control_interval_s,
                   sample_interval_s, demand_change).run()


def _validate(types, rate_per_s, duration_s, warmup_s, control_interval_s, sample_interval_s, config) -> None:
    if not types:
        raise ValueError("The 'types' parameter of simulate must hold at least one RequestType, got none.")
    for name, value in (("rate_per_s", rate_per_s), ("duration_s", duration_s),
                        ("control_interval_s", control_interval_s), ("sample_interval_s", sample_interval_s),
                        ("bandwidth_bytes_per_s", config.bandwidth_bytes_per_s),
                        ("thread_bytes_per_s", config.thread_bytes_per_s)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"The '{name}' parameter of simulate must be > 0, got {value!r}.")
    if not 0 <= warmup_s < duration_s:
        raise ValueError(f"The 'warmup_s' parameter of simulate must be in [0, {duration_s!r}), got {warmup_s!r}.")
    if config.cores < 1:
        raise ValueError(f"The 'cores' parameter of ServerConfig must be >= 1, got {config.cores!r}.")
    for t in types:
        if t.cpu_s < 0 or t.mem_bytes < 0 or t.lock_s < 0 or t.slo_s <= 0 or t.share <= 0:
            raise ValueError(f"The 'types' parameter of simulate must have cpu_s, mem_bytes, lock_s >= 0 and "
                             f"slo_s, share > 0, got {t!r}.")


class _Engine:
    """The event loop; one instance per run."""

    def __init__(self, types, policy, rate_per_s, duration_s, config, warmup_s, seed, control_interval_s,
                 sample_interval_s, demand_change) -> None:
        self.policy, self.config, self.rate = policy, config, rate_per_s
        self.duration_s, self.warmup_s = duration_s, warmup_s
        self.control_s, self.sample_s = control_interval_s, sample_interval_s
        self.rng = np.random.default_rng(seed)
        all_types = list(types) + (list(demand_change.types) if demand_change else [])
        self.stats = {t.name: TypeStats() for t in all_types}
        self.slo = {t.name: t.slo_s for t in all_types}
        self.end_s = duration_s + 2 * max(t.slo_s for t in all_types)
        self.demand_change = demand_change
        self._set_mix(types)
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.now = 0.0
        self.events = 0
        self.next_id = 0
        self.live = 0  # requests arrived and not yet completed or dropped
        self.free_cores = config.cores
        self.runq: deque[Request] = deque()
        self.locks: dict[str, Request | None] = {}
        self.lock_waiters: dict[str, deque[Request]] = {}
        # Per lock, over measured requests: sections run, sections that waited for the holder, refusals at the lock.
        self.lock_counts: dict[str, dict[str, int]] = {}
        self.mem_active: dict[Request, float] = {}  # request -> bytes left
        self.mem_last_s = 0.0
        self.mem_version = 0
        self.bytes_moved = 0.0
        self.busy_area = 0.0  # ∫ busy cores dt
        self.busy_last_s = 0.0
        self.marks: dict[str, tuple[float, float]] = {}
        self.tick_bytes = 0.0
        self.series: dict[str, list[float]] = {"t_s": [], "utilisation": [], "bandwidth_bytes_per_s": [],
                                               "queue_len": []}
        self.sample_counts: dict[str, int] = {}
        self.sample_last = (0.0, 0.0, 0.0)
        # Periodic events are due at n × interval (integer counts): repeated float additions drift
        # (0.0001 added five times is 0.00049999...), which once stretched the 500 µs tuner interval to 600 µs.
        self.tick_n = 0
        self.sample_n = 0

    def _set_mix(self, types: Sequence[RequestType]) -> None:
        self.types = list(types)
        share = np.array([t.share for t in self.types], dtype=float)
        self.cum_share = np.cumsum(share / share.sum())

    # -- bookkeeping -------------------------------------------------------

    def push(self, t: float, kind: int, payload: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))

    def _account_cores(self) -> None:
        self.busy_area += (self.config.cores - self.free_cores) * (self.now - self.busy_last_s)
        self.busy_last_s = self.now

    def _take_core(self, req: Request) -> None:
        self._account_cores()
        self.free_cores -= 1
        req.core_since_s = self.now

    def _free_core(self, req: Request) -> None:
        self._account_cores()
        self.free_cores += 1
        req.core_s += self.now - req.core_since_s
        req.core_since_s = math.nan

    def _measured(self, req: Request) -> TypeStats | None:
        return self.stats[req.rtype.name] if self.warmup_s <= req.arrival_s < self.duration_s else None

    # -- the loop ------------------------------------------------------------

    def run(self) -> SimResult:
        self.push(self.rng.exponential(1 / self.rate), _ARRIVE)
        self.push(self.control_s, _TICK)
        self.push(self.sample_s, _SAMPLE)
        self.push(self.warmup_s, _MARK, "start")
        self.push(self.duration_s, _MARK, "end")
        if self.demand_change is not None:
            self.push(self.demand_change.at_s, _DEMAND)
        handlers = {_ARRIVE: self._on_arrival, _CPU: self._advance, _MEM: self._on_mem_done,
                    _LOCK: self._on_lock_done, _TICK: self._on_tick, _SAMPLE: self._on_sample,
                    _DEMAND: self._on_demand, _MARK: self._on_mark}
        while self.heap and self.heap[0][0] <= self.end_s:
            if self.live == 0 and self.heap[0][0] > self.duration_s and "end" in self.marks:
                break  # arrivals are over and every request has resolved
            self.now, _, kind, payload = heapq.heappop(self.heap)
            self.events += 1
            handlers[kind](payload)
        (t0, busy0), (t1, busy1) = self.marks["start"], self.marks["end"]
        window = t1 - t0
        return SimResult(window_s=window, types={n: s for n, s in self.stats.items() if s.offered},
                         slo_s=self.slo, utilisation=(busy1 - busy0) / (window * self.config.cores),
                         bandwidth_bytes_per_s=(self.marks["end_bytes"][0] - self.marks["start_bytes"][0]) / window,
                         series=self.series, events=self.events, locks=self.lock_counts)

    def _on_mark(self, which: str) -> None:
        self._account_cores()
        self._mem_progress()
        self.marks[which] = (self.now, self.busy_area)
        self.marks[which + "_bytes"] = (self.bytes_moved, 0.0)

    def _on_demand(self, _: Any) -> None:
        self._set_mix(self.demand_change.types)

    def _on_arrival(self, _: Any) -> None:
        if self.now < self.duration_s:
            self.push(self.now + self.rng.exponential(1 / self.rate), _ARRIVE)
        else:
            return
        rtype = self.types[int(np.searchsorted(self.cum_share, self.rng.random(), side="right"))]
        req = Request(self.next_id, rtype, self.now)
        self.next_id += 1
        self.live += 1
        stats = self._measured(req)
        if stats is not None:
            stats.offered += 1
        self.sample_counts["offered"] = self.sample_counts.get("offered", 0) + 1
        if not self.policy.on_arrival(req, self.now):
            self._drop(req, partial=False)
            return
        if stats is not None:
            stats.admitted += 1
        if not self.policy.on_enqueue(req, "cpu", len(self.runq), self.now):
            self._drop(req, partial=False)
            return
        req.enqueued_s = self.now
        self.runq.append(req)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.free_cores > 0 and self.runq:
            req = self.runq.popleft()
            self._take_core(req)
            if req.mem_granted:  # resumed after the m_semaphore: straight into its memory section
                self._start_mem(req)
            else:
                self.policy.on_dequeue(req, "cpu", self.now - req.enqueued_s, self.now)
                self._advance(req)

    def _advance(self, req: Request) -> None:
        """Run ``req``'s next non-empty phase; it holds a core."""
        rtype = req.rtype
        while True:
            phase = req.phase
            req.phase += 1
            if phase in (0, 2) and rtype.cpu_s > 0:
                self.push(self.now + rtype.cpu_s / 2, _CPU, req)
                return
            if phase == 1 and rtype.mem_bytes > 0:
                self._enter_mem(req)
                return
            if phase == 3 and rtype.lock is not None:
                self._enter_lock(req)
                return
            if phase >= 4:
                self._complete(req)
                return

    # -- memory ----------------------------------------------------------------

    def _enter_mem(self, req: Request) -> None:
        outcome = self.policy.mem_gate(req, self.now)
        if outcome == "acquired":
            req.mem_gated = True
            self._start_mem(req)
        elif outcome == "queued":
            req.mem_gated = True
            self._free_core(req)
            self._dispatch()
        else:
            self._free_core(req)
            self._drop(req, partial=True)
            self._dispatch()

    def _rate_each(self) -> dict[Request, float]:
        """Max-min fair shares of ``B`` under each thread's ceiling (water-filling)."""
        left, n = self.config.bandwidth_bytes_per_s, len(self.mem_active)
        if self.config.oversubscription_loss > 0:
            demand = sum(_thread_cap(r.rtype, self.config) for r in self.mem_active) / left
            left /= 1.0 + self.config.oversubscription_loss * max(0.0, demand - 1.0)
        rates = {}
        for req in sorted(self.mem_active, key=lambda r: _thread_cap(r.rtype, self.config)):
            rates[req] = min(_thread_cap(req.rtype, self.config), left / n)
            left -= rates[req]
            n -= 1
        return rates

    def _mem_progress(self) -> None:
        dt = self.now - self.mem_last_s
        if dt > 0 and self.mem_active:
            for req, rate in self._rate_each().items():
                self.mem_active[req] -= rate * dt
                self.bytes_moved += rate * dt
        self.mem_last_s = self.now

    def _mem_reschedule(self) -> None:
        self.mem_version += 1
        if self.mem_active:
            rates = self._rate_each()
            t = min(max(left, 0.0) / rates[req] for req, left in self.mem_active.items())
            self.push(self.now + t, _MEM, self.mem_version)

    def _start_mem(self, req: Request) -> None:
        req.mem_granted = False
        req.mem_start_s = self.now
        self._mem_progress()
        self.mem_active[req] = req.rtype.mem_bytes
        self._mem_reschedule()

    def _on_mem_done(self, version: int) -> None:
        if version != self.mem_version:
            return
        self._mem_progress()
        done = [r for r, left in self.mem_active.items() if left <= 1e-6 * r.rtype.mem_bytes]
        for req in done:
            del self.mem_active[req]
        self._mem_reschedule()
        for req in done:
            req.mem_s = self.now - req.mem_start_s
            if req.mem_gated:
                self._resume(self.policy.mem_release(req, self.now))
            self._advance(req)
        self._dispatch()

    def _resume(self, granted: list[Request]) -> None:
        for req in reversed(granted):
            req.mem_granted = True
            self.runq.appendleft(req)

    # -- locks -------------------------------------------------------------------

    def _enter_lock(self, req: Request) -> None:
        name = req.rtype.lock
        waiters = self.lock_waiters.setdefault(name, deque())
        counts = self.lock_counts.setdefault(name, {"held": 0, "waited": 0, "dropped": 0})
        measured = self._measured(req) is not None
        if not self.policy.on_enqueue(req, name, len(waiters), self.now):
            counts["dropped"] += measured
            self._free_core(req)
            self._drop(req, partial=True)
            self._dispatch()
            return
        counts["held"] += measured
        counts["waited"] += measured and self.locks.get(name) is not None
        if self.locks.get(name) is None:
            self.locks[name] = req
            self.policy.on_dequeue(req, name, 0.0, self.now)
            self.push(self.now + req.rtype.lock_s, _LOCK, req)
        else:
            req.enqueued_s = self.now
            waiters.append(req)  # spins on its core

    def _on_lock_done(self, req: Request) -> None:
        name = req.rtype.lock
        waiters = self.lock_waiters[name]
        self.locks[name] = None
        on_release = getattr(self.policy, "on_release", None)  # optional in the controller interface
        if on_release is not None:
            on_release(req, name, self.now)
        if waiters:
            nxt = waiters.popleft()
            self.locks[name] = nxt
            self.policy.on_dequeue(nxt, name, self.now - nxt.enqueued_s, self.now)
            self.push(self.now + nxt.rtype.lock_s, _LOCK, nxt)
        self._advance(req)

    # -- outcomes --------------------------------------------------------------------

    def _complete(self, req: Request) -> None:
        self._free_core(req)
        self.live -= 1
        latency = self.now - req.arrival_s
        stats = self._measured(req)
        if stats is not None:
            stats.completed += 1
            stats.latencies_s.append(latency)
            stats.good += latency <= req.rtype.slo_s
        if latency <= req.rtype.slo_s:
            key = "good_" + req.rtype.name
            self.sample_counts[key] = self.sample_counts.get(key, 0) + 1
        self.policy.on_complete(req, self.now)
        self._dispatch()

    def _drop(self, req: Request, partial: bool) -> None:
        self.live -= 1
        stats = self._measured(req)
        if stats is not None:
            stats.dropped += 1
        self.sample_counts["dropped"] = self.sample_counts.get("dropped", 0) + 1
        self.policy.on_drop(req, self.now, partial)

    # -- control and sampling ------------------------------------------------------------

    def _on_tick(self, _: Any) -> None:
        self._mem_progress()
        self.policy.observe_bandwidth((self.bytes_moved - self.tick_bytes) / self.control_s, self.now)
        self.tick_bytes = self.bytes_moved
        self.policy.tick(self.now)
        for req in self.policy.mem_expired(self.now):
            self._drop(req, partial=True)
        granted = self.policy.mem_release(None, self.now)
        if granted:
            self._resume(granted)
            self._dispatch()
        self.tick_n += 1
        self.push((self.tick_n + 1) * self.control_s, _TICK)

    def _on_sample(self, _: Any) -> None:
        self._account_cores()
        self._mem_progress()
        t0, busy0, bytes0 = self.sample_last
        dt = self.now - t0
        s = self.series
        s["t_s"].append(self.now)
        s["utilisation"].append((self.busy_area - busy0) / (dt * self.config.cores))
        s["bandwidth_bytes_per_s"].append((self.bytes_moved - bytes0) / dt)
        s["queue_len"].append(float(len(self.runq)))
        counts, self.sample_counts = self.sample_counts, {}
        for key in {"offered", "dropped", *("good_" + n for n in self.stats)}:
            s.setdefault(key + "_per_s", []).append(counts.get(key, 0) / dt)
        for key, value in self.policy.gauges().items():
            s.setdefault(key, []).append(float(value))
        self.sample_last = (self.now, self.busy_area, self.bytes_moved)
        self.sample_n += 1
        self.push((self.sample_n + 1) * self.sample_s, _SAMPLE)


def capacity_per_s(types: Sequence[RequestType], config: ServerConfig) -> tuple[float, int]:
    """The total arrival rate at which the best static m_semaphore capacity just saturates a resource.

    With ``k`` memory sections allowed at once, each moves ``b_k = min(b, B/k)``
    bytes/s. At total rate ``λ`` (type shares ``s_i``) the server needs
    ``λ Σ s_i M_i ≤ k b_k`` (bandwidth), ``λ Σ s_i (cpu_i + M_i/b_k + lock_i) ≤ cores``
    and ``λ Σ_{i uses lock} s_i lock_i ≤ 1`` per lock. ``capacity(k)`` is the
    largest such ``λ``; the result is ``max_k capacity(k)`` and the smallest ``k``
    reaching it.
    """
    total = sum(t.share for t in types)
    best = (0.0, 1)
    for k in range(1, config.cores + 1):
        bounds = []
        mem = sum(t.share / total * t.mem_bytes for t in types)
        cores = 0.0
        for t in types:
            b_k = min(t.thread_bytes_per_s or config.thread_bytes_per_s, config.bandwidth_bytes_per_s / k)
            cores += t.share / total * (t.cpu_s + t.mem_bytes / b_k + t.lock_s)
            if t.mem_bytes:
                bounds.append(k * b_k / mem)
        bounds.append(config.cores / cores)
        for lock in {t.lock for t in types if t.lock}:
            bounds.append(1.0 / sum(t.share / total * t.lock_s for t in types if t.lock == lock))
        if min(bounds) > best[0] * (1 + 1e-9):
            best = (min(bounds), k)
    return best


def oracle_bound(types: Sequence[RequestType], config: ServerConfig, rate_per_s: float) -> GoodputBound:
    """The goodput upper bound per request type at total arrival rate ``rate_per_s`` (see
    :func:`sloctl.control.admission_oracle.goodput_bound`).

    Resources: the cores (``cores`` core-seconds per second; a request holds
    one for its CPU work, its memory section at its thread ceiling — the
    fastest it can run — and its lock section), the bus
    (``bandwidth_bytes_per_s``) and each lock (one second per second). A
    type's SLO-feasible share is 1 if its isolated service time fits its SLO,
    else 0. The bus-loss what-if γ does not lower the bound (a controller
    can always keep the bus at its knee).
    """
    total = sum(t.share for t in types)
    usage = {}
    capacity = {"cores": float(config.cores), "bandwidth": float(config.bandwidth_bytes_per_s)}
    for t in types:
        row = {"cores": isolated_service_s(t, config), "bandwidth": float(t.mem_bytes)}
        if t.lock is not None:
            row["lock:" + t.lock] = t.lock_s
            capacity["lock:" + t.lock] = 1.0
        usage[t.name] = row
    return goodput_bound({t.name: rate_per_s * t.share / total for t in types}, usage, capacity,
                         {t.name: 1.0 if isolated_service_s(t, config) <= t.slo_s else 0.0 for t in types})


def lock_ceiling_per_s(rate_per_s: float, hold_s: float, allowance_s: float, *, arrivals: int = 200_000,
                       seed: int = 0) -> float:
    """The most requests per second one FIFO lock can serve within their queueing allowance, over Poisson
    arrivals at ``rate_per_s`` with a fixed critical section ``hold_s`` (seconds).

    A clairvoyant admission: each arrival is let in exactly when its wait for the lock, known from the
    sections already admitted, fits ``allowance_s``. With equal holds and deadlines in arrival order this
    greedy rule serves the most requests in time (a request it admits and another policy refuses can
    take the place of that policy's next admitted one without making anything late), so no admission
    policy serves more; a real request also spends part of its allowance before the lock (its CPU work,
    the run queue), so real ones serve less. The fluid bound (:func:`oracle_bound`) counts the lock full
    whenever the offered load reaches it; under random arrivals a lock whose queue may hold only a
    couple of sections idles between bursts.

    Args:
        rate_per_s: arrival rate of the requests that take the lock (> 0).
        hold_s: the critical section (seconds, > 0).
        allowance_s: the queueing time each request can afford (seconds, >= 0).
        arrivals: how many arrivals to play (the estimate's sample).
        seed: seeds the arrivals.
    """
    for name, value in (("rate_per_s", rate_per_s), ("hold_s", hold_s)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"The '{name}' parameter of lock_ceiling_per_s must be > 0, got {value!r}.")
    if not (math.isfinite(allowance_s) and allowance_s >= 0):
        raise ValueError(f"The 'allowance_s' parameter of lock_ceiling_per_s must be >= 0, got {allowance_s!r}.")
    if not (isinstance(arrivals, int) and arrivals >= 1):
        raise ValueError(f"The 'arrivals' parameter of lock_ceiling_per_s must be an integer >= 1, got {arrivals!r}.")
    times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate_per_s, arrivals)).tolist()
    free_at, served = 0.0, 0
    for t in times:
        if free_at - t <= allowance_s:
            served += 1
            free_at = max(free_at, t) + hold_s
    return served / times[-1]
