"""Svalinn admission control in front of any ASGI app (Starlette, FastAPI), and an asyncio m_semaphore.

``AdmissionMiddleware`` reads each request's priority class and SLO budget
from headers, asks the credit controller for a credit, drops the request
before it queues when the server's expected wait exceeds its remaining budget
(per-bottleneck AQM), and answers ``503`` with ``Retry-After`` and a JSON body
when it drops. It counts decisions in Prometheus metrics. The controller runs
its micro-experiments on the request path (``tick`` on every request), so no
background thread is needed.

``AsyncMSemaphore`` wraps a memory-heavy path: ``try_acquire`` never queues,
``acquire(budget)`` queues FIFO only while the expected wait fits the budget,
and an optional bandit tuner moves its capacity every ``interval_s`` from the
bytes the handlers report.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from sloctl.control.aqm import BottleneckAQM, DelayBudget
from sloctl.control.credits import CreditController

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
    """ASGI middleware: credits + server AQM per request, 503 on drop.

    Args:
        app: the ASGI app to protect.
        controller: the credit controller (default: one with the library defaults and the settings' classes).
        settings: headers and defaults.
        clock: monotonic clock in seconds (tests may pass their own).
    """

    def __init__(self, app: Callable, controller: CreditController | None = None,
                 settings: AdmissionSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.settings = settings or AdmissionSettings()
        if controller is None:
            from sloctl.control.credits import ClassShare

            n = len(self.settings.classes)
            controller = CreditController(classes=[ClassShare(c, n - i) for i, c in enumerate(self.settings.classes)])
        self.controller = controller
        self.aqm = BottleneckAQM("server", servers=self.settings.concurrency)
        self.clock = clock
        self.metrics = _Metrics()

    @classmethod
    def from_policy(cls, app: Callable, policy: Mapping[str, Any], settings: AdmissionSettings | None = None
                    ) -> AdmissionMiddleware:
        """A middleware whose controller comes from an ``admission-policy`` document."""
        from sloctl.training.admission_policy import controller_from_policy

        classes = tuple(c["name"] for c in sorted(policy.get("classes", []), key=lambda c: -c["priority"]))
        if settings is None:
            settings = AdmissionSettings(**({"classes": classes, "default_class": classes[0]} if classes else {}))
        return cls(app, controller_from_policy(policy), settings)

    @classmethod
    def from_registry(cls, app: Callable, *, tracking_uri: str, uri: str = "models:/admission-policy@champion",
                      settings: AdmissionSettings | None = None) -> AdmissionMiddleware:
        """A middleware configured from the registered admission policy (by alias)."""
        from sloctl.registry.store import load_policy

        return cls.from_policy(app, load_policy(uri, tracking_uri=tracking_uri), settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.settings.exempt_paths:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        klass = headers.get(self.settings.class_header, self.settings.default_class)
        if klass not in self.settings.classes:
            await _json(send, 400, {"error": f"header {self.settings.class_header!r} must be one of "
                                             f"{', '.join(self.settings.classes)}, got {klass!r}",
                                    "field": self.settings.class_header})
            return
        raw_budget = headers.get(self.settings.budget_header)
        try:
            budget_ms = self.settings.default_budget_ms if raw_budget is None else float(raw_budget)
            if not budget_ms > 0:
                raise ValueError
        except ValueError:
            await _json(send, 400, {"error": f"header {self.settings.budget_header!r} must be a positive number of "
                                             f"milliseconds, got {raw_budget!r}", "field": self.settings.budget_header})
            return
        now = self.clock()
        self.controller.tick(now)
        budget = DelayBudget(budget_ms / 1000.0)
        if not self.controller.try_acquire(klass, now):
            await self._drop(send, klass, "no_credit")
            return
        if self.aqm.should_drop(budget):
            self.controller.record_drop(klass, now)
            await self._drop(send, klass, "queue_budget")
            return
        self.metrics.decisions.labels(klass, "admitted").inc()
        self.metrics.in_flight.set(self.controller.in_flight)
        self.metrics.credits.set(self.controller.credits)
        status = 500
        self.aqm.joined()

        async def send_status(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            scope.setdefault("state", {})["sloctl_budget"] = budget
            await self.app(scope, receive, send_status)
        finally:
            done = self.clock()
            hold = done - now
            self.aqm.left(0.0, budget)
            self.aqm.observe_hold(hold)
            self.metrics.latency.labels(klass).observe(hold)
            self.controller.release(klass, done, ok=status < 500, within_slo=hold <= budget_ms / 1000.0)
            self.metrics.in_flight.set(self.controller.in_flight)

    async def _drop(self, send: Send, klass: str, reason: str) -> None:
        self.metrics.decisions.labels(klass, reason).inc()
        await _json(send, 503, {"error": "overloaded, retry later", "reason": reason, "class": klass},
                    extra=[(b"retry-after", str(self.settings.retry_after_s).encode())])

    def metrics_text(self) -> bytes:
        """The Prometheus exposition of this middleware's metrics."""
        from prometheus_client import generate_latest

        return generate_latest(self.metrics.registry)


async def _json(send: Send, status: int, body: dict, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": payload})


class MSemaphoreDropped(Exception):
    """The m_semaphore refused a caller (no free slot, or the wait would not fit its budget)."""


class AsyncMSemaphore:
    """An asyncio m_semaphore: one shared capacity for every annotated memory-heavy path.

    Args:
        capacity: initial number of concurrent holders.
        expected_hold_s: initial guess of a holder's time (an EWMA of real holds replaces it).
        tuner: optional bandit (``select(now_s) -> int``, ``update(capacity, bandwidth, now_s)``) that sets
            the capacity every ``interval_s`` from the bytes reported with :meth:`record_bytes`.
        interval_s: tuning interval (the paper's 500 µs is below asyncio's resolution; 10 ms by default).
    """

    def __init__(self, capacity: int, *, expected_hold_s: float = 0.01, tuner: Any = None,
                 interval_s: float = 0.01, clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"The 'capacity' parameter of AsyncMSemaphore must be an integer >= 1, got {capacity!r}.")
        self.capacity = capacity
        self.in_use = 0
        self.hold_s = expected_hold_s
        self.tuner = tuner
        self.interval_s = interval_s
        self.clock = clock
        self._waiters: deque[asyncio.Future] = deque()
        self._bytes = 0.0
        self._window_start = clock()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a slot only if one is free and nobody waits; never queues."""
        self._maybe_tune()
        if self.in_use < self.capacity and not self._waiters:
            self.in_use += 1
            return True
        return False

    async def acquire(self, budget: DelayBudget | float | None = None) -> None:
        """Take a slot, queueing FIFO only while the expected wait fits ``budget`` (seconds or DelayBudget).

        Raises:
            MSemaphoreDropped: the expected wait exceeds the remaining budget.
        """
        if self.try_acquire():
            return
        remaining = budget.remaining_s if isinstance(budget, DelayBudget) else budget
        expected = (len(self._waiters) + 1) * self.hold_s / self.capacity
        if remaining is not None and expected > remaining:
            raise MSemaphoreDropped(f"expected wait {expected * 1000:.1f} ms exceeds the remaining budget "
                                    f"{remaining * 1000:.1f} ms")
        start = self.clock()
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future  # the slot is handed over by release(): in_use already counts us
        except asyncio.CancelledError:
            if future in self._waiters:
                self._waiters.remove(future)
            elif future.done() and not future.cancelled():
                self.release()
            raise
        if isinstance(budget, DelayBudget):
            budget.deduct(self.clock() - start)

    def release(self, hold_s: float | None = None) -> None:
        """Free a slot, handing it straight to the oldest waiter (FIFO) when there is one."""
        if hold_s is not None:
            self.hold_s = 0.8 * self.hold_s + 0.2 * hold_s
        while self._waiters and self.in_use <= self.capacity:  # a shrunk capacity takes this slot instead
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                return  # the slot passes to the waiter; in_use unchanged
        self.in_use -= 1
        self._maybe_tune()

    def record_bytes(self, n: float) -> None:
        """Bytes a holder moved (the tuner's bandwidth signal)."""
        self._bytes += n

    def _maybe_tune(self) -> None:
        if self.tuner is None:
            return
        now = self.clock()
        if now - self._window_start < self.interval_s:
            return
        bandwidth = self._bytes / (now - self._window_start)
        self.tuner.update(self.capacity, bandwidth, now)
        self.capacity = max(1, int(self.tuner.select(now)))
        self._bytes, self._window_start = 0.0, now
        while self._waiters and self.in_use < self.capacity:
            future = self._waiters.popleft()
            if not future.done():
                self.in_use += 1
                future.set_result(None)

    @classmethod
    def from_policy(cls, policy: Mapping[str, Any], *, tune: bool = False, max_bandwidth: float = 1.0
                    ) -> AsyncMSemaphore:
        """An m_semaphore with an ``admission-policy``'s capacity; with ``tune``, a bandit warm-started
        from the policy's arm values (``max_bandwidth`` in the units passed to :meth:`record_bytes` per second)."""
        msem = policy["msem"]
        tuner = None
        if tune:
            from sloctl.control.msemaphore import EpsilonGreedyTuner

            values = {int(k): float(v) for k, v in msem.get("arm_values", {}).items()}
            tuner = EpsilonGreedyTuner(max(values, default=msem["capacity"]) or 1, max_bandwidth,
                                       alpha=msem.get("alpha", 0.7), omega=msem.get("omega", 0.8),
                                       epsilon=msem.get("epsilon", 0.3), initial_capacity=msem["capacity"])
            if values:
                tuner.warm_start(values)
        return cls(int(msem["capacity"]), tuner=tuner)

    async def __aenter__(self) -> AsyncMSemaphore:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()
