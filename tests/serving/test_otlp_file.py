"""The OTLP/JSON file exporter: spans made by the OpenTelemetry SDK read back by sloctl's trace reader.

The reader (``sloctl.datasets.traces``) was written from the OTLP/JSON encoding
(https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding) and tested on
hand-written fixtures; here the SDK's own spans go through the exporter and back.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from sloctl.datasets.traces import detect_format, iter_spans
from sloctl.serving.otlp_file import OtlpJsonFileExporter


def _provider(name: str, exporter: OtlpJsonFileExporter) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_sdk_spans_round_trip_through_the_exporter(tmp_path):
    exporter = OtlpJsonFileExporter(tmp_path / "a.jsonl")
    front, back = _provider("frontend", exporter), _provider("backend", exporter)
    root = front.get_tracer("t").start_span("GET /", kind=SpanKind.SERVER, start_time=1_000,
                                            attributes={"sloctl.class": "high"})
    call = front.get_tracer("t").start_span("GET backend", context=trace.set_span_in_context(root),
                                            kind=SpanKind.CLIENT, start_time=2_000,
                                            attributes={"peer.service": "backend", "http.request.resend_count": 1})
    served = back.get_tracer("t").start_span("GET /", context=trace.set_span_in_context(call),
                                             kind=SpanKind.SERVER, start_time=2_500,
                                             attributes={"http.response.status_code": 503})
    served.set_status(Status(StatusCode.ERROR))
    served.end(end_time=2_600)
    call.end(end_time=3_000)
    exporter.rotate(tmp_path / "b.jsonl")  # the root lands in the second file
    root.end(end_time=4_000)
    exporter.shutdown()
    assert detect_format(tmp_path / "a.jsonl") == "otlp-json"
    spans = {s.name + s.service: s for s in iter_spans([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])}
    r, c, s = spans["GET /frontend"], spans["GET backendfrontend"], spans["GET /backend"]
    assert (r.kind, c.kind, s.kind) == ("server", "client", "server")
    assert c.parent_id == r.span_id and s.parent_id == c.span_id and r.parent_id == ""
    assert len(r.trace_id) == 32 and r.trace_id == s.trace_id
    assert (s.start_ns, s.end_ns, s.http_status, s.error) == (2_500, 2_600, 503, True)
    assert c.resend_count == 1 and c.peer_service == "backend"
    assert r.klass == "high" and s.klass == ""
    assert exporter.export([]).name == "FAILURE"  # closed: nothing is written after shutdown
