"""Traces of a simulated service network: what an instrumented mesh running a network file would record.

Each service is one FIFO server with exponential service times and a buffer of
m attempts counting the one in service (the model of docs/retry.md); retries
wait an exponential delay of mean ``retry_delay_s``. The spans follow the
OpenTelemetry conventions the fitter reads (:mod:`sloctl.training.network_fit`):

* a client-only ``loadgen`` service makes one root CLIENT span per external call;
* every attempt at a service is a SERVER span that starts on arrival; a refused
  attempt answers 503 at once; an admitted one ends after its own calls;
* a served attempt's calls are CLIENT spans that start when its service ends,
  one per call, with the attempts at the callee as SERVER children (retries
  below the application, as an Envoy sidecar makes them);
* every span carries the class in ``sloctl.class``.

Head sampling keeps a trace with probability ``sampling`` (all its spans or
none). The simulator is independent of the fitter: a test that fits these
traces and finds the network file again checks the fitting rules, not itself.
"""

from __future__ import annotations

import collections
import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sloctl.models.retry_network import NetworkSpec

__all__ = ["synthesize_spans", "write_otlp_json"]

LOADGEN = "loadgen"


class _Call:
    __slots__ = ("service", "klass", "trace", "parent", "tries_left", "done", "sampled", "span")

    def __init__(self, service, klass, trace, parent, tries_left, done, sampled):
        self.service, self.klass, self.trace, self.parent = service, klass, trace, parent
        self.tries_left, self.done, self.sampled = tries_left, done, sampled


def synthesize_spans(spec: NetworkSpec, *, duration_s: float = 60.0, seed: int = 0, sampling: float = 1.0,
                     epoch_s: float = 1.7e9, resend_spans: bool = False) -> Iterator[Any]:
    """Simulate ``spec`` for ``duration_s`` and yield its spans (:class:`~sloctl.datasets.traces.Span`).

    Args:
        spec: the network (capacities, buffers, retries, arrivals, routing).
        duration_s: simulated seconds of external arrivals (calls still open then are finished).
        seed: seeds arrivals, service times, routing draws, retry delays and sampling.
        sampling: the probability that a trace is kept.
        epoch_s: the wall-clock time the simulation starts at.
        resend_spans: record retries as the HTTP client does (one CLIENT span per attempt with
            ``http.request.resend_count``) instead of as SERVER attempts under one CLIENT span.
    """
    return _Synth(spec, seed, sampling, epoch_s, resend_spans).run(duration_s)


class _Synth:
    """The event loop of :func:`synthesize_spans`: FIFO single servers with buffers, retries, calls."""

    def __init__(self, spec: NetworkSpec, seed: int, sampling: float, epoch_s: float, resend_spans: bool) -> None:
        from sloctl.datasets.traces import Span

        self.span_type, self.spec, self.sampling, self.resend_spans = Span, spec, sampling, resend_spans
        self.rng = random.Random(seed)
        self.heap: list[tuple[float, int, Callable, tuple]] = []
        self.seq = iter(range(1 << 62))
        self.out: list[Any] = []
        self.mu = {s.name: s.capacity_per_s for s in spec.services}
        self.room = {s.name: s.buffer for s in spec.services}
        self.present: dict[str, collections.deque] = {s: collections.deque() for s in self.mu}
        self.last_dep = dict.fromkeys(self.mu, 0.0)
        self.delay = spec.effective_retry_delay_s
        self.t0 = int(epoch_s * 1e9)

    def at(self, t: float, fn: Callable, *args: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn, args))

    def new_id(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    def emit(self, call: _Call, sid: str, parent: str, kind: str, service: str, start: float, end: float,
             status: int, resend: int = 0, peer: str = "") -> None:
        if call.sampled:
            self.out.append(self.span_type(call.trace, sid, parent, kind, service, f"{kind} {service}",
                                           self.t0 + int(start * 1e9), self.t0 + int(end * 1e9), status >= 500,
                                           status, resend, call.klass, peer, True, False))

    def start_call(self, call: _Call, caller: str, t: float, resend: int = 0) -> None:
        call.span = (self.new_id(), t, resend)
        self.attempt(call, caller, t)

    def attempt(self, call: _Call, caller: str, t: float) -> None:
        b, q = call.service, self.present[call.service]
        while q and q[0] <= t:
            q.popleft()
        if len(q) < self.room[b]:
            dep = self.last_dep[b] = max(t, self.last_dep[b]) + self.rng.expovariate(self.mu[b])
            q.append(dep)
            self.at(dep, self.served, call, caller, t, self.new_id(), dep)
            return
        parent = call.span[0]
        self.emit(call, self.new_id(), parent, "server", b, t, t, 503)
        if call.tries_left <= 0:
            self.finish(call, caller, t, 503)
            return
        call.tries_left -= 1
        when = t + self.rng.expovariate(1.0 / self.delay)
        if self.resend_spans:  # the HTTP client retries: this attempt's CLIENT span ends, a resend starts
            self.emit(call, parent, call.parent, "client", caller, call.span[1], t, 503, call.span[2], b)
            self.at(when, self.start_call, call, caller, when, call.span[2] + 1)
        else:
            self.at(when, self.attempt, call, caller, when)

    def served(self, call: _Call, caller: str, arrived: float, sid: str, dep: float) -> None:
        b, rng = call.service, self.rng
        callees = [c for c, w in self.spec.routing.get(call.klass, {}).get(b, {}).items()
                   for _ in range(math.floor(w) + (rng.random() < w - math.floor(w)))]
        if not callees:
            self.emit(call, sid, call.span[0], "server", b, arrived, dep, 200)
            self.finish(call, caller, dep, 200)
            return
        pending = {"n": len(callees), "ok": True, "end": dep}

        def child_done(t: float, status: int) -> None:
            pending["n"] -= 1
            pending["ok"] &= status < 300
            pending["end"] = max(pending["end"], t)
            if pending["n"] == 0:
                status_b = 200 if pending["ok"] else 502
                self.emit(call, sid, call.span[0], "server", b, arrived, pending["end"], status_b)
                self.finish(call, caller, pending["end"], status_b)

        for callee in callees:
            child = _Call(callee, call.klass, call.trace, sid, self.spec.retries[call.klass][callee], child_done,
                          call.sampled)
            self.start_call(child, b, dep)

    def finish(self, call: _Call, caller: str, t: float, status: int) -> None:
        sid, start, resend = call.span
        self.emit(call, sid, call.parent, "client", caller, start, t, status, resend, call.service)
        call.done(t, status)

    def external(self, klass: str, service: str, rate: float, t: float, duration_s: float) -> None:
        if t < duration_s:
            call = _Call(service, klass, f"{self.rng.getrandbits(128):032x}", "", self.spec.retries[klass][service],
                         _ignore, self.rng.random() < self.sampling)
            self.start_call(call, LOADGEN, t)
            self.at(t + self.rng.expovariate(rate), self.external, klass, service, rate)

    def run(self, duration_s: float) -> Iterator[Any]:
        for klass, row in self.spec.arrivals.items():
            for service, rate in row.items():
                if rate > 0:
                    self.at(self.rng.expovariate(rate), self.external, klass, service, rate)
        while self.heap:
            t, _, fn, args = heapq.heappop(self.heap)
            if fn == self.external:
                fn(*args, t, duration_s)
            else:
                fn(*args)
            if self.out:
                yield from self.out
                self.out.clear()


def _ignore(t: float, status: int) -> None:
    return None


def write_otlp_json(spans: Iterable[Any], folder: str | Path, *, per_line: int = 100,
                    per_file: int = 200_000) -> list[Path]:
    """Write spans as OTLP/JSON lines (one ``ExportTraceServiceRequest`` per line, spans grouped by service).

    The encoding is OTLP's JSON mapping: hex ids, int64 times as strings, enum
    kinds as integers. A new file starts every ``per_file`` spans.
    """
    import itertools
    import json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kinds = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}
    paths: list[Path] = []

    def flush(batch: list[Any], out: Any) -> None:
        by_service: dict[str, list] = {}
        for s in batch:
            attrs = [{"key": "sloctl.class", "value": {"stringValue": s.klass}},
                     {"key": "http.response.status_code", "value": {"intValue": str(s.http_status)}}]
            if s.resend_count:
                attrs.append({"key": "http.request.resend_count", "value": {"intValue": str(s.resend_count)}})
            if s.peer_service:
                attrs.append({"key": "peer.service", "value": {"stringValue": s.peer_service}})
            by_service.setdefault(s.service, []).append({
                "traceId": s.trace_id, "spanId": s.span_id, "parentSpanId": s.parent_id, "name": s.name,
                "kind": kinds.get(s.kind, 0), "startTimeUnixNano": str(s.start_ns), "endTimeUnixNano": str(s.end_ns),
                "attributes": attrs, "status": {"code": 2 if s.error else 0}})
        out.write(json.dumps({"resourceSpans": [
            {"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": name}}]},
             "scopeSpans": [{"scope": {"name": "sloctl.trace_synth"}, "spans": rows}]}
            for name, rows in by_service.items()]}, separators=(",", ":")) + "\n")

    stream = iter(spans)
    while chunk := list(itertools.islice(stream, per_file)):
        paths.append(folder / f"spans-{len(paths):04d}.jsonl")
        with open(paths[-1], "w", encoding="utf-8") as out:
            for i in range(0, len(chunk), per_line):
                flush(chunk[i:i + per_line], out)
    return paths
