"""Svalinn admission control in front of any ASGI app (Starlette, FastAPI), and an asyncio m_semaphore.

Both are thin adapters around one :class:`~sloctl.control.admission.Svalinn`,
the object the simulator drives too: it makes every decision, and the
adapters only turn ASGI events, awaits and the clock into its calls.

``AdmissionMiddleware`` reads each request's priority class and SLO budget
from headers and hands the request to Svalinn: a credit (``on_arrival``), the
server's AQM (``on_enqueue``; the request waits at the server until it
completes), completion (``on_dequeue`` + ``on_complete``) or drop
(``on_drop``). A drop is answered ``503`` with ``Retry-After`` and an RFC 9457
problem document; a bad header 422 naming it (the budget must be a finite
number of milliseconds in [0.001, 86,400,000]: ``inf``, ``1e400``,
``5e-324`` are refused).
It counts decisions in Prometheus metrics. The controller runs its
micro-experiments on the request path (``tick`` on every request), so no
background thread is needed.

``AsyncMSemaphore`` wraps a memory-heavy path with Svalinn's
:class:`~sloctl.control.admission.MemoryGate`: ``try_acquire`` never queues,
``acquire(budget)`` queues FIFO only while the expected wait fits the budget,
and an optional bandit tuner moves its capacity every ``interval_s`` from the
bytes the handlers report. :meth:`AsyncMSemaphore.around` shares the gate of
the middleware's Svalinn.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from sloctl.control.admission import InFlightRequest, MemoryGate, RequestProfile, Svalinn
from sloctl.control.aqm import BottleneckAQM, DelayBudget
from sloctl.control.credits import ClassShare, CreditController
from sloctl.control.msemaphore import EpsilonGreedyTuner
from sloctl.control.policies import AdmissionPolicy
from sloctl.registry.store import load_policy
from sloctl.serving.front import send_problem

__all__ = ["AdmissionMiddleware", "AdmissionSettings", "AsyncMSemaphore", "MSemaphoreDropped"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class AdmissionSettings:
    """Headers, defaults and answers of :class:`AdmissionMiddleware`.

    Attributes:
        class_header: request header naming the priority class.
        budget_header: request header with the SLO budget in milliseconds.
        default_class: class of a request without the header.
        default_budget_ms: budget of a request without the header.
        classes: the known classes (a request naming another gets 400).
        retry_after_s: ``Retry-After`` on a 503.
        exempt_paths: paths never controlled (health checks, metrics).
        concurrency: how many requests the app serves at once (the AQM's servers).
    """

    class_header: str = "x-priority"
    budget_header: str = "x-slo-budget-ms"
    default_class: str = "high"
    default_budget_ms: float = 1000.0
    classes: tuple[str, ...] = ("high", "low")
    retry_after_s: int = 1
    exempt_paths: tuple[str, ...] = ("/healthz", "/readyz", "/metrics")
    concurrency: int = 8


def _budget_adapter() -> Any:
    """The header's validator: the same pydantic rules as every body field (non-finite numbers refused)."""
    from typing import Annotated

    from pydantic import Field, TypeAdapter

    return TypeAdapter(Annotated[float, Field(ge=0.001, le=86_400_000, allow_inf_nan=False)])


class _Metrics:
    """Prometheus counters on a private registry (one per middleware, so tests and apps don't collide)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.decisions = Counter("sloctl_admission_decisions", "Admission decisions.", ["klass", "decision"],
                                 registry=self.registry)
        self.latency = Histogram("sloctl_admission_latency_seconds", "Latency of admitted requests.", ["klass"],
                                 registry=self.registry)
        self.credits = Gauge("sloctl_admission_credits", "Credit pool size.", registry=self.registry)
        self.in_flight = Gauge("sloctl_admission_in_flight", "Admitted requests in flight.", registry=self.registry)


class AdmissionMiddleware:
    """ASGI middleware around a :class:`~sloctl.control.admission.Svalinn`: credits + server AQM, 503 on drop.

    Without ``svalinn`` it builds one from ``controller``, an AQM with the
    settings' ``concurrency`` as servers and an m_semaphore of that capacity
    (unused unless an :class:`AsyncMSemaphore` is put :meth:`~AsyncMSemaphore.around` it).

    Args:
        app: the ASGI app to protect.
        controller: the credit controller (default: one with the library defaults and the settings' classes).
        settings: headers and defaults.
        clock: monotonic clock in seconds (tests may pass their own).
        svalinn: a ready Svalinn to drive instead (then ``controller`` must be None and
            ``settings.concurrency`` is not read); share it with an :class:`AsyncMSemaphore`
            so that one object makes every decision.
    """

    def __init__(self, app: Callable, controller: CreditController | None = None,
                 settings: AdmissionSettings | None = None, clock: Callable[[], float] = time.monotonic, *,
                 svalinn: Svalinn | None = None) -> None:
        self.app = app
        self.settings = settings or AdmissionSettings()
        if svalinn is None:
            if controller is None:
                n = len(self.settings.classes)
                controller = CreditController(classes=[ClassShare(c, n - i)
                                                       for i, c in enumerate(self.settings.classes)])
            servers = self.settings.concurrency
            svalinn = Svalinn(controller, BottleneckAQM("server", servers=servers), MemoryGate(servers))
        elif controller is not None:
            raise ValueError("The 'controller' parameter of AdmissionMiddleware must be None when 'svalinn' is "
                             f"given (its credits are svalinn.credits_), got {controller!r}.")
        self.svalinn = svalinn
        self.clock = clock
        self.metrics = _Metrics()
        self._budget = _budget_adapter()

    @property
    def controller(self) -> CreditController:
        """The credit controller (``svalinn.credits_``)."""
        return self.svalinn.credits_

    @property
    def aqm(self) -> BottleneckAQM:
        """The server's AQM (``svalinn.cpu_aqm_``)."""
        return self.svalinn.cpu_aqm_

    @classmethod
    def from_policy(cls, app: Callable, policy: AdmissionPolicy, settings: AdmissionSettings | None = None
                    ) -> AdmissionMiddleware:
        """A middleware whose controller comes from an :class:`~sloctl.control.policies.AdmissionPolicy`.

        Without ``settings``, the policy's classes (most important first) are
        the known classes and the most important one is the default.
        """
        classes = policy.class_names()
        if settings is None:
            settings = AdmissionSettings(**({"classes": classes, "default_class": classes[0]} if classes else {}))
        return cls(app, policy.controller(), settings)

    @classmethod
    def from_registry(cls, app: Callable, *, tracking_uri: str,
                      uri: str = f"models:/{AdmissionPolicy.kind}@champion",
                      settings: AdmissionSettings | None = None) -> AdmissionMiddleware:
        """A middleware configured from the registered admission policy (by alias)."""

        return cls.from_policy(app, load_policy(uri, tracking_uri=tracking_uri, kind=AdmissionPolicy.kind), settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.settings.exempt_paths:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        klass = headers.get(self.settings.class_header, self.settings.default_class)
        if klass not in self.settings.classes:
            await send_problem(send, 422, f"header {self.settings.class_header!r} must be one of "
                               f"{', '.join(self.settings.classes)}, got {klass[:64]!r}",
                               field=self.settings.class_header)
            return
        raw_budget = headers.get(self.settings.budget_header)
        if raw_budget is None:
            budget_ms = self.settings.default_budget_ms
        else:
            from pydantic import ValidationError

            try:
                budget_ms = float(self._budget.validate_python(raw_budget.strip()))
            except ValidationError as exc:
                await send_problem(send, 422, f"header {self.settings.budget_header!r} must be a finite number of "
                                   f"milliseconds in [0.001, 86400000]: {exc.errors()[0]['msg']}",
                                   field=self.settings.budget_header)
                return
        now = self.clock()
        svalinn = self.svalinn
        svalinn.tick(now)
        req = InFlightRequest(RequestProfile(klass, klass, budget_ms / 1000.0), now)
        if not svalinn.on_arrival(req, now):
            await self._drop(send, req, now, "no_credit")
            return
        if not svalinn.on_enqueue(req, "cpu", svalinn.cpu_aqm_.queue_len, now):
            await self._drop(send, req, now, "queue_budget")
            return
        self.metrics.decisions.labels(klass, "admitted").inc()
        self.metrics.in_flight.set(self.controller.in_flight)
        self.metrics.credits.set(self.controller.credits)
        status = 500

        async def send_status(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            scope.setdefault("state", {})["sloctl_budget"] = req.ctx["budget"]
            await self.app(scope, receive, send_status)
        finally:
            done = self.clock()
            req.core_s, req.ok = done - now, status < 500
            # The app's own queue is invisible from here: a request waits at the server until it completes.
            svalinn.on_dequeue(req, "cpu", 0.0, done)
            svalinn.on_complete(req, done)
            self.metrics.latency.labels(klass).observe(req.core_s)
            self.metrics.in_flight.set(self.controller.in_flight)

    async def _drop(self, send: Send, req: InFlightRequest, now: float, reason: str) -> None:
        self.svalinn.on_drop(req, now, partial=False)
        klass = req.rtype.klass
        self.metrics.decisions.labels(klass, reason).inc()
        await send_problem(send, 503, "overloaded, retry later", kind="overloaded", reason=reason, **{"class": klass},
                           retry_after_s=self.settings.retry_after_s,
                           headers=[(b"retry-after", str(self.settings.retry_after_s).encode())])

    def metrics_text(self) -> bytes:
        """The Prometheus exposition of this middleware's metrics."""
        from prometheus_client import generate_latest

        return generate_latest(self.metrics.registry)


class MSemaphoreDropped(Exception):
    """The m_semaphore refused a caller (no free slot, or the wait would not fit its budget)."""


_CALLER = RequestProfile("m_semaphore", "all", math.inf)  # no deadline: the budget was checked on entry


@dataclass(eq=False)
class _Caller(InFlightRequest):
    """A caller of the m_semaphore as the gate sees it, and the future its hand-off resolves."""

    future: asyncio.Future | None = None


class AsyncMSemaphore:
    """An asyncio m_semaphore: one shared capacity for every annotated memory-heavy path.

    A thin adapter around a :class:`~sloctl.control.admission.MemoryGate`
    (Svalinn's m_semaphore and its bandit, §4.3), which makes every decision —
    take a slot, park, drop, hand a freed slot to the oldest parked caller,
    resize; a parked caller awaits a future that the hand-off resolves.
    :meth:`around` puts it around an existing gate, e.g. the one inside the
    middleware's :class:`~sloctl.control.admission.Svalinn`.

    Args:
        capacity: initial number of concurrent holders.
        expected_hold_s: initial guess of a holder's time (an EWMA of real holds replaces it).
        tuner: optional bandit from :mod:`sloctl.control.msemaphore` that sets the capacity every
            ``interval_s`` from the bytes reported with :meth:`record_bytes`.
        interval_s: tuning interval (the paper's 500 µs is below asyncio's resolution; 10 ms by default).
        clock: monotonic clock in seconds.
    """

    def __init__(self, capacity: int, *, expected_hold_s: float = 0.01, tuner: Any = None,
                 interval_s: float = 0.01, clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"The 'capacity' parameter of AsyncMSemaphore must be an integer >= 1, got {capacity!r}.")
        self._attach(MemoryGate(capacity, tuner, initial_hold_s=expected_hold_s), interval_s, clock)

    @classmethod
    def around(cls, gate: MemoryGate, *, interval_s: float = 0.01, clock: Callable[[], float] = time.monotonic
               ) -> AsyncMSemaphore:
        """An m_semaphore whose decisions ``gate`` makes (e.g. ``svalinn.memory_``, shared with the middleware)."""
        sem = cls.__new__(cls)
        sem._attach(gate, interval_s, clock)
        return sem

    def _attach(self, gate: MemoryGate, interval_s: float, clock: Callable[[], float]) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"The 'interval_s' parameter of AsyncMSemaphore must be > 0, got {interval_s!r}.")
        self.gate = gate
        self.interval_s = interval_s
        self.clock = clock
        self._bytes = 0.0
        self._window_start = clock()

    @property
    def capacity(self) -> int:
        return self.gate.msem_.capacity

    @property
    def in_use(self) -> int:
        return self.gate.msem_.in_use

    @property
    def queued(self) -> int:
        return self.gate.msem_.queued

    @property
    def hold_s(self) -> float:
        """The expected hold (EWMA of reported holds, seconds)."""
        return self.gate.hold_s_

    @property
    def tuner(self) -> Any:
        return self.gate.tuner_

    def try_acquire(self) -> bool:
        """Take a slot only if one is free and nobody waits; never queues."""
        now = self.clock()
        self._maybe_tune(now)
        return self.gate.try_wait(now)

    async def acquire(self, budget: DelayBudget | float | None = None) -> None:
        """Take a slot, queueing FIFO only while the expected wait fits ``budget`` (seconds or DelayBudget).

        The wait is deducted from a :class:`~sloctl.control.aqm.DelayBudget`; a refused one is dropped
        (its cleanups run).

        Raises:
            MSemaphoreDropped: the expected wait exceeds the remaining budget.
        """
        now = self.clock()
        self._maybe_tune(now)
        caller = _Caller(_CALLER, now, future=asyncio.get_running_loop().create_future())
        caller.ctx["budget"] = math.inf if budget is None else budget
        outcome = self.gate.mem_gate(caller, now)
        if outcome == "acquired":
            return
        if outcome == "dropped":
            remaining = budget.remaining_s if isinstance(budget, DelayBudget) else budget
            expected = (self.queued + 1) * self.hold_s / self.capacity
            raise MSemaphoreDropped(f"expected wait {expected * 1000:.1f} ms exceeds the remaining budget "
                                    f"{remaining * 1000:.1f} ms")
        try:
            await caller.future  # resolved by a hand-off: the slot is already ours
        except asyncio.CancelledError:
            if caller.future.cancelled():
                self.gate.on_drop(caller, self.clock(), partial=True)  # leaves the queue if still parked
            else:
                self.release()  # the slot was handed over just as we were cancelled
            raise

    def release(self, hold_s: float | None = None) -> None:
        """Free a slot, handing it straight to the oldest waiter (FIFO) when there is one."""
        now = self.clock()
        done = _Caller(_CALLER, now, mem_s=math.nan if hold_s is None else hold_s)
        self._wake(self.gate.mem_release(done, now))
        self._maybe_tune(now)

    def record_bytes(self, n: float) -> None:
        """Bytes a holder moved (the tuner's bandwidth signal)."""
        self._bytes += n

    def _wake(self, granted: list) -> None:
        for caller in granted:
            if caller.future is not None and not caller.future.done():
                caller.future.set_result(None)
            else:  # its caller gave up meanwhile: pass the slot on
                self.release()

    def _maybe_tune(self, now: float) -> None:
        """Every ``interval_s``: the window's bandwidth and a tick to the gate; then wake whoever it granted."""
        if now - self._window_start >= self.interval_s:
            self.gate.observe_bandwidth(self._bytes / (now - self._window_start), now)
            self._bytes, self._window_start = 0.0, now
            self.gate.tick(now)
            for caller in self.gate.mem_expired(now):
                if caller.future is not None and not caller.future.done():
                    caller.future.set_exception(MSemaphoreDropped("its deadline passed while it waited"))
        self._wake(self.gate.mem_release(None, now))

    @classmethod
    def from_policy(cls, policy: AdmissionPolicy, *, tune: bool = False, max_bandwidth: float = 1.0
                    ) -> AsyncMSemaphore:
        """An m_semaphore with an :class:`~sloctl.control.policies.AdmissionPolicy`'s capacity; with ``tune``, a
        bandit warm-started from its arm values (``max_bandwidth`` in the units passed to :meth:`record_bytes`
        per second)."""
        msem = policy.msem
        tuner = None
        if tune:

            values = dict(msem.arm_values)
            tuner = EpsilonGreedyTuner(max(values, default=msem.capacity) or 1, max_bandwidth, alpha=msem.alpha,
                                       omega=msem.omega, epsilon=msem.epsilon, initial_capacity=msem.capacity)
            if values:
                tuner.warm_start(values)
        return cls(msem.capacity, tuner=tuner)

    async def __aenter__(self) -> AsyncMSemaphore:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()
