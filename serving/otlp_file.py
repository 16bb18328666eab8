"""An OpenTelemetry span exporter that writes OTLP/JSON lines, as the Collector's file exporter does.

Each export writes one ``ExportTraceServiceRequest`` as one JSON line, in the
OTLP/JSON encoding (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding):
trace and span ids as hex strings, 64-bit integers as decimal strings, enum
values as integers, spans grouped by resource and instrumentation scope. The
Python SDK ships no such exporter; ``sloctl fit network`` reads its files like
the Collector's. :meth:`OtlpJsonFileExporter.rotate` moves output to a new file
(the live testbed keeps one trace folder per load point).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["OtlpJsonFileExporter", "otlp_json_request"]


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list | tuple):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _attributes(attrs: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in (attrs or {}).items()]


def _span(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.context
    out: dict[str, Any] = {
        "traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}",
        "parentSpanId": f"{span.parent.span_id:016x}" if span.parent is not None else "",
        "flags": int(ctx.trace_flags) | 0x100 | (0x200 if span.parent is not None and span.parent.is_remote else 0),
        "name": span.name, "kind": span.kind.value + 1,  # the SDK's INTERNAL is 0; OTLP's is 1 (0: unspecified)
        "startTimeUnixNano": str(span.start_time), "endTimeUnixNano": str(span.end_time),
        "attributes": _attributes(span.attributes),
        "status": {"code": span.status.status_code.value},
    }
    if span.status.description:
        out["status"]["message"] = span.status.description
    return out


def otlp_json_request(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The ``ExportTraceServiceRequest`` of ``spans`` in OTLP/JSON form."""
    by_resource: dict[int, tuple[Any, dict[tuple, list]]] = {}
    for span in spans:
        resource, scopes = by_resource.setdefault(id(span.resource), (span.resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        scopes.setdefault(key, []).append(_span(span))
    return {"resourceSpans": [
        {"resource": {"attributes": _attributes(resource.attributes)},
         "scopeSpans": [{"scope": {"name": name, **({"version": version} if version else {})}, "spans": rows}
                        for (name, version), rows in scopes.items()]}
        for resource, scopes in by_resource.values()]}


class OtlpJsonFileExporter(SpanExporter):
    """Append each batch of spans to ``path`` as one OTLP/JSON line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = self._open(self.path)

    @staticmethod
    def _open(path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json.dumps(otlp_json_request(spans), separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def rotate(self, path: str | Path) -> None:
        """Write from now on to ``path`` (the current file is closed)."""
        new = self._open(Path(path))
        with self._lock:
            old, self._file, self.path = self._file, new, Path(path)
        old.close()

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
