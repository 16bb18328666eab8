"""OpenTelemetry instrumentation of the live retry testbed (:mod:`sloctl.experiments.retry_live`).

Each service gets a tracer whose resource names it (``service.name``); spans
carry the class in ``sloctl.class`` and the answer in
``http.response.status_code``, and the W3C ``traceparent`` header links a call
to the attempts its callee's sidecar makes. Times are on the testbed's model
clock (the virtual-time FIFO server's): a SERVER span starts when the attempt
reaches the handler, a served attempt's calls start when its service ends, and
a leaf's SERVER span ends then too. Spans go through the SDK's batch processor
to :class:`~sloctl.serving.otlp_file.OtlpJsonFileExporter` (OTLP/JSON lines).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, MutableMapping
from pathlib import Path
from typing import Any

__all__ = ["CALLER_HEADER", "Tracing"]

CLASS_ATTRIBUTE = "sloctl.class"
# the caller's name on every call, as a caller's Envoy would set it (Envoy's access logs read it back)
CALLER_HEADER = "x-envoy-downstream-service-cluster"


class Tracing:
    """Tracers for ``services`` writing to ``path``; every method is a no-op when ``path`` is None."""

    def __init__(self, path: str | Path | None, services: Iterable[str], clock: Callable[[], float]) -> None:
        self.enabled = path is not None
        if not self.enabled:
            return
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from sloctl.serving.otlp_file import OtlpJsonFileExporter

        self.exporter = OtlpJsonFileExporter(path)
        self.propagator = TraceContextTextMapPropagator()
        self.providers, self.tracers = [], {}
        for name in services:
            provider = TracerProvider(resource=Resource.create({"service.name": name}))
            provider.add_span_processor(BatchSpanProcessor(self.exporter, max_queue_size=1 << 16,
                                                           max_export_batch_size=2048, schedule_delay_millis=500))
            self.providers.append(provider)
            self.tracers[name] = provider.get_tracer("sloctl.retry_testbed")
        self.clock = clock
        self.t0, self.wall0_ns = clock(), time.time_ns()

    def ns(self, t: float) -> int:
        return self.wall0_ns + int(round((t - self.t0) * 1e9))

    def server(self, service: str, klass: str, headers: Any, now: float) -> Any:
        if not self.enabled:
            return None
        from opentelemetry.trace import SpanKind

        ctx = self.propagator.extract(headers)
        return self.tracers[service].start_span("GET /", context=ctx, kind=SpanKind.SERVER,
                                                start_time=self.ns(now), attributes={CLASS_ATTRIBUTE: klass})

    def client(self, caller: str, callee: str, klass: str, parent: Any, sent: float,
               headers: MutableMapping[str, str]) -> Any:
        """A CLIENT span for a call from ``caller`` to ``callee``; its context is injected into ``headers``."""
        if not self.enabled:
            return None
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        ctx = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracers[caller].start_span(f"GET {callee}", context=ctx, kind=SpanKind.CLIENT,
                                               start_time=self.ns(sent),
                                               attributes={CLASS_ATTRIBUTE: klass, "peer.service": callee})
        self.propagator.inject(headers, context=trace.set_span_in_context(span))
        return span

    def end(self, span: Any, status: int, at: float | None = None) -> None:
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        if status:
            span.set_attribute("http.response.status_code", status)
        else:  # no answer: the caller gave up (OpenTelemetry's error.type for it)
            span.set_attribute("error.type", "cancelled")
        if status >= 500 or not status:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=self.ns(self.clock() if at is None else at))

    def rotate(self, path: str | Path) -> None:
        """Flush what is buffered to the current file, then write to ``path``."""
        if self.enabled:
            for provider in self.providers:
                provider.force_flush()
            self.exporter.rotate(path)

    def shutdown(self) -> None:
        if self.enabled:
            for provider in self.providers:
                provider.force_flush()
            for provider in self.providers:
                provider.shutdown()
