"""Service traces and Envoy access logs, read as a stream of normalized records.

Four formats are read, each as its own project documents it:

``otlp-json``
    OTLP/JSON (opentelemetry.io/docs/specs/otlp, "JSON Protobuf Encoding") as
    the OpenTelemetry Collector's file exporter writes it: one
    ``ExportTraceServiceRequest`` object per line, or one object per file
    (pretty-printed is fine). Ids are hex; base64 ids, as protobuf's
    ``json_format`` writes them, are converted (and counted). Legacy
    ``instrumentationLibrarySpans`` is read like ``scopeSpans``.
``zipkin``
    Zipkin v2 JSON (zipkin2-api.yaml): an array of spans, or an array of
    traces (arrays of spans) as ``GET /api/v2/traces`` returns them.
``jaeger``
    The JSON of Jaeger's query API and of its UI's "Download JSON":
    ``{"data": [trace, ...]}``, a bare array of traces, or one trace.
``envoy-access``
    Envoy access-log lines in a format string (:data:`SLOCTL_ACCESS_FORMAT`
    by default, or :data:`ENVOY_DEFAULT_FORMAT`, or any other string whose
    ``%START_TIME%`` is one of the forms :func:`iter_access_records` knows).

:func:`iter_spans` yields :class:`Span` records, :func:`iter_access_records`
yields :class:`AccessRecord` records. Both open one file at a time (``.gz``
files are decompressed on the fly), read JSON Lines line by line, and never
stop on a bad record: a line that is not JSON, a span without its ids or start
time, an access-log line that does not match the format are counted in the
:class:`ParseReport` (with up to five ``path:where: reason`` examples) and
skipped. The report also has each file's SHA-256 and size, computed while
reading. A file in another format than the one asked for is an error
(:class:`~sloctl.core.errors.TraceFormatError`) that names both.

Ids are lowercase hex. OTLP ids are 32 (trace) or 16 (span) digits; Zipkin and
Jaeger ids are kept at their own width, except that Jaeger's ids, which its
JSON writes without leading zeros, are left-padded to 16 or 32 digits (so are
Zipkin's, which its spec already asks for). An all-zero parent id means "no
parent".
"""

from __future__ import annotations

import base64
import binascii
import calendar
import contextlib
import functools
import gzip
import hashlib
import io
import json
import math
import os
import re
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from sloctl.core.errors import TraceFormatError

__all__ = [
    "ENVOY_DEFAULT_FORMAT",
    "FORMATS",
    "SLOCTL_ACCESS_FORMAT",
    "AccessRecord",
    "ParseReport",
    "Span",
    "compile_access_format",
    "detect_format",
    "iter_access_records",
    "iter_spans",
    "trace_files",
]

FORMATS = ("otlp-json", "zipkin", "jaeger", "envoy-access")
_SPAN_FORMATS = FORMATS[:3]

#: What each format looks like, for error messages.
_LOOKS = {
    "otlp-json": "one ExportTraceServiceRequest object per line",
    "zipkin": "a JSON array of spans",
    "jaeger": 'a {"data": [traces]} object from Jaeger\'s query API',
    "envoy-access": "Envoy access-log lines",
}

#: Envoy's default access-log format string (Envoy docs, "Access logging", "Default Format String").
ENVOY_DEFAULT_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"\n'
)

#: The format sloctl's sidecars log in: Envoy's default with exact epoch start times, the route, the upstream
#: cluster, the number of upstream attempts (retries), the calling service, and when the last attempt was sent
#: and its answer received (microseconds after the call arrived).
SLOCTL_ACCESS_FORMAT = ENVOY_DEFAULT_FORMAT[:-1].replace("%START_TIME%", "%START_TIME(%s.%6f)%") + (
    ' %ROUTE_NAME% %UPSTREAM_CLUSTER% %UPSTREAM_REQUEST_ATTEMPT_COUNT% "%REQ(X-ENVOY-DOWNSTREAM-SERVICE-CLUSTER)%"'
    " %COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)% %COMMON_DURATION(DS_RX_BEG:US_RX_END:us)%\n"
)

_HEAD_BYTES = 64 * 1024
_CHUNK = 1 << 20
_MAX_EXAMPLES = 5
_HEX = "0123456789abcdef"
_GZIP_MAGIC = b"\x1f\x8b"


class Span(NamedTuple):
    """One span, whatever format it came from (times in epoch nanoseconds, ids in lowercase hex)."""

    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    service: str
    name: str
    start_ns: int
    end_ns: int
    error: bool
    http_status: int
    resend_count: int
    klass: str
    peer_service: str
    sampled: bool
    shared: bool


class AccessRecord(NamedTuple):
    """One Envoy access-log line: one downstream request to that Envoy."""

    start_ns: int
    duration_ms: float
    response_code: int
    response_flags: str
    attempts: int
    route_name: str
    upstream_cluster: str
    upstream_service_time_ms: float
    request_id: str
    caller: str
    user_agent: str
    downstream_address: str
    fields: dict[str, str]
    source: str


@dataclass
class ParseReport:
    """What a read saw: the files, and the records it could not read.

    Attributes:
        files: One dict per file: ``path``, ``format``, ``sha256``, ``bytes`` (of the file as stored, compressed
            or not) and ``records`` (spans or access-log lines read). ``sha256`` and ``bytes`` are filled in when
            the file has been read to its end.
        unreadable: Records or lines skipped: not JSON, a span without its ids or start time, a line that does not
            match the access-log format.
        examples: Up to five ``path:where: reason`` strings for those.
        ids_base64: OTLP ids that were base64 (as protobuf's ``json_format`` writes them), converted to hex.
    """

    files: list[dict[str, Any]] = field(default_factory=list)
    unreadable: int = 0
    examples: list[str] = field(default_factory=list)
    ids_base64: int = 0

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return {
            "files": [dict(entry) for entry in self.files],
            "unreadable": self.unreadable,
            "examples": list(self.examples),
            "ids_base64": self.ids_base64,
        }

    def _bad(self, path: Path, where: object, reason: str) -> None:
        self.unreadable += 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(f"{path}:{where}: {reason}")


class _Unreadable(ValueError):
    """One record cannot be read; the reason is the message."""


_RECORD_ERRORS = (_Unreadable, KeyError, TypeError, ValueError, AttributeError, IndexError)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _Unreadable):
        return str(exc)
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------------------------------
# Files: finding them, detecting their format, reading them while hashing
# ---------------------------------------------------------------------------------------------------------------


def trace_files(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The files to read: ``source`` itself, or every file under it.

    Args:
        source: A file, a directory (walked recursively in sorted order; hidden files and folders, whose names
            start with ``.``, are skipped) or a sequence of those (kept in the order given).

    Returns:
        The files.

    Raises:
        TraceFormatError: A path does not exist, or there is no file at all.
    """
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    found: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found.extend(_walk(path))
        elif path.is_file():
            found.append(path)
        else:
            raise TraceFormatError(f"{path}: no such file or directory (expected a trace file or a folder of them).")
    if not found:
        names = ", ".join(str(item) for item in items) or "(nothing)"
        raise TraceFormatError(f"{names}: no trace files there (hidden files and folders are skipped).")
    return found


def _walk(root: Path) -> list[Path]:
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files.extend(Path(folder, name) for name in names if not name.startswith("."))
    return sorted(files, key=lambda p: p.relative_to(root).parts)


def _read_head(path: Path) -> bytes:
    """The first 64 KiB of the file's content (decompressed when it is gzip, even if the file is cut short)."""
    with open(path, "rb") as fh:
        head = fh.read(_HEAD_BYTES)
        if head[:2] != _GZIP_MAGIC:
            return head
        out = b""
        inflate = zlib.decompressobj(wbits=31)
        try:
            while head and len(out) < _HEAD_BYTES:
                out += inflate.decompress(head, _HEAD_BYTES - len(out))
                head = inflate.unconsumed_tail or fh.read(_HEAD_BYTES)
                if inflate.eof:  # the next member of a multi-member file
                    head, inflate = inflate.unused_data + head, zlib.decompressobj(wbits=31)
        except zlib.error as exc:
            if not out:
                raise TraceFormatError(f"{path}: starts like a gzip file but cannot be decompressed ({exc}).") from exc
        return out


def _sniff(head: bytes) -> str | None:
    """The format ``head`` looks like; ``""`` when it is empty, None when it looks like none."""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if not text:
        return ""
    first = text[:1]
    if first == b"{":
        if b'"resourceSpans"' in text:
            return "otlp-json"
        if b'"data"' in text or (b'"traceID"' in text and b'"spans"' in text):
            return "jaeger"
        return None
    if first == b"[":
        if text[1:2].isdigit():
            return "envoy-access"
        after = text[1:].lstrip()[:1]
        if after == b"{":
            if b'"traceID"' in text and b'"spans"' in text:
                return "jaeger"
            if b'"traceId"' in text or b'"id"' in text:
                return "zipkin"
            return None
        return "zipkin" if after in (b"[", b"]") else None
    if first.isdigit():
        line = text.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
        if _sloctl_format()(line) is not None:
            return "envoy-access"
    return None


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a trace or access-log file, judged by its first 64 KiB (decompressed for gzip).

    Args:
        path: The file.

    Returns:
        One of :data:`FORMATS`.

    Raises:
        TraceFormatError: The file is empty or looks like none of them; the message names the file.
    """
    path = Path(path)
    found = _sniff(_read_head(path))
    if found:
        return found
    what = "is empty" if found == "" else "looks like none of the trace formats sloctl reads"
    listed = "; ".join(f"{name} ({looks})" for name, looks in _LOOKS.items())
    raise TraceFormatError(f"{path}: {what}. Expected one of: {listed}.")


class _HashingReader(io.RawIOBase):
    """A raw reader that hashes and counts every byte read through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.nbytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)
        if n:
            self.sha256.update(memoryview(buffer)[:n])
            self.nbytes += n
        return n or 0

    def drain(self) -> None:
        """Read (and hash) whatever the consumer left unread."""
        buffer = bytearray(_CHUNK)
        while self.readinto(buffer):
            pass


@contextlib.contextmanager
def _open_counted(path: Path, entry: dict[str, Any]) -> Iterator[IO[bytes]]:
    """Open ``path`` for reading (through gzip when it is gzip); fill ``entry``'s hash and size once read whole."""
    with open(path, "rb", buffering=0) as raw:
        tee = _HashingReader(raw)
        buffered = io.BufferedReader(tee, _CHUNK)
        stream: IO[bytes] = buffered
        if buffered.peek(2)[:2] == _GZIP_MAGIC:
            stream = gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[assignment]
        with stream:
            yield stream
            tee.drain()
            entry["sha256"] = tee.sha256.hexdigest()
            entry["bytes"] = tee.nbytes


def _file_entry(report: ParseReport, path: Path, fmt: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": str(path), "format": fmt, "sha256": None, "bytes": None, "records": 0}
    report.files.append(entry)
    return entry


# ---------------------------------------------------------------------------------------------------------------
# Spans
# ---------------------------------------------------------------------------------------------------------------


class _Ctx:
    """What the span readers of one file share: where they are, what to look for, where to report."""

    __slots__ = ("path", "report", "klass", "keys")

    def __init__(self, path: Path, report: ParseReport, class_attribute: str) -> None:
        self.path = path
        self.report = report
        self.klass = class_attribute
        self.keys = frozenset({*_SPAN_KEYS, class_attribute})

    def bad(self, where: object, reason: str) -> None:
        self.report._bad(self.path, where, reason)

    def b64_id(self, value: str) -> str:
        """An OTLP id that is not 32/16 hex digits: base64 of 16/8 bytes, as protobuf's json_format writes."""
        try:
            raw = base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError, AttributeError):
            raw = b""
        if len(raw) not in (16, 8):
            raise _Unreadable(f"id {value!r} is neither 32 or 16 hex digits nor base64 of 16 or 8 bytes")
        self.report.ids_base64 += 1
        return raw.hex()


_HTTP_STATUS = "http.response.status_code"
_HTTP_STATUS_LEGACY = "http.status_code"
_RESEND = "http.request.resend_count"
_PEER = "peer.service"
_SPAN_KEYS = (_HTTP_STATUS, _HTTP_STATUS_LEGACY, _RESEND, _PEER, "span.kind", "error")
_KINDS = ("server", "client", "internal", "producer", "consumer")


def _as_int(value: Any) -> int:
    """An attribute's integer value (int64 strings parsed); 0 when absent or not a number."""
    if value is None or value is True or value is False:
        return 0
    if type(value) is int:
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return 0


def _as_str(value: Any) -> str:
    """An attribute's text (booleans as ``true``/``false``); "" for None, lists and maps."""
    if type(value) is str:
        return value
    if value is None or isinstance(value, (list, dict)):
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _common(values: dict[str, Any], klass: str, default_klass: str) -> tuple[int, int, str, str]:
    """``(http_status, resend_count, klass, peer_service)`` from picked attribute values."""
    status = values.get(_HTTP_STATUS)
    if status is None:
        status = values.get(_HTTP_STATUS_LEGACY)
    cls = values.get(klass)
    return (_as_int(status), _as_int(values.get(_RESEND)), default_klass if cls is None else _as_str(cls),
            _as_str(values.get(_PEER)))


def iter_spans(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, fmt: str | None = None,
               class_attribute: str = "sloctl.class", report: ParseReport | None = None) -> Iterator[Span]:
    """Every span in the trace files, one file at a time.

    Args:
        paths: A file, a folder (see :func:`trace_files`) or a sequence of them.
        fmt: ``otlp-json``, ``zipkin`` or ``jaeger``; None to detect each file's format. A file that looks like
            another format than ``fmt`` is an error; one that looks like none is read as ``fmt``.
        class_attribute: The attribute (tag) whose value is :attr:`Span.klass`: span attributes first, then
            resource (Jaeger: process) attributes.
        report: Filled with the files read and the records skipped; pass one to see them.

    Yields:
        The spans, in file order.

    Raises:
        TraceFormatError: ``fmt`` is unknown, a file is in another format or in none, or it is an access log.
    """
    if fmt is not None and fmt not in _SPAN_FORMATS:
        raise TraceFormatError(f"format {fmt!r}: expected one of {', '.join(_SPAN_FORMATS)} for spans "
                               f"(envoy-access logs are read by iter_access_records).")
    report = report if report is not None else ParseReport()
    for path in trace_files(paths):
        yield from _spans_of_file(path, fmt, class_attribute, report)


def _span_format(path: Path, fmt: str | None) -> str:
    """The format to read ``path`` as ("" for an empty file), checked against the one asked for."""
    found = _sniff(_read_head(path))
    if found == "envoy-access":
        raise TraceFormatError(f"{path}: looks like an Envoy access log ({_LOOKS[found]}), not spans; read it "
                               f"with iter_access_records (the access-log path).")
    if fmt is None:
        return found if found is not None else detect_format(path)
    if found and found != fmt:
        raise TraceFormatError(f"{path}: looks like {found} ({_LOOKS[found]}), not {fmt} ({_LOOKS[fmt]}) "
                               f"as --format says.")
    return "" if found == "" else fmt


def _spans_of_file(path: Path, fmt: str | None, class_attribute: str, report: ParseReport) -> Iterator[Span]:
    use = _span_format(path, fmt)
    entry = _file_entry(report, path, use)
    if not use:  # an empty file: nothing to read, but listed with its hash
        with _open_counted(path, entry):
            return
    ctx = _Ctx(path, report, class_attribute)
    reader = _READERS[use]
    count = 0
    try:
        with _open_counted(path, entry) as stream:
            try:
                for batch in reader(stream, ctx):
                    count += len(batch)
                    entry["records"] = count
                    yield from batch
            except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
                ctx.bad("end", f"cannot read further ({exc})")
    finally:
        entry["records"] = count


_loads = json.loads


def _document(stream: IO[bytes], ctx: _Ctx) -> Any:
    """A whole-file JSON document; None (counted unreadable) when it is not JSON."""
    data = stream.read()
    try:
        return _loads(data)
    except ValueError as exc:
        where = exc.lineno if isinstance(exc, json.JSONDecodeError) else 1
        ctx.bad(where, f"not JSON ({getattr(exc, 'msg', exc)})")
        return None


# --- OTLP/JSON ---------------------------------------------------------------------------------------------------

_OTLP_KIND: dict[Any, str] = {
    0: "", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer",
    "SPAN_KIND_UNSPECIFIED": "", "SPAN_KIND_INTERNAL": "internal", "SPAN_KIND_SERVER": "server",
    "SPAN_KIND_CLIENT": "client", "SPAN_KIND_PRODUCER": "producer", "SPAN_KIND_CONSUMER": "consumer",
}
_OTLP_ERROR = (2, "STATUS_CODE_ERROR")
_ZERO_IDS = ("0" * 16, "0" * 32)


def _anyvalue(value: Any) -> Any:
    """An OTLP ``AnyValue``'s scalar (its one field); None for arrays, maps and empty values."""
    if type(value) is dict:
        for scalar in value.values():
            return None if type(scalar) is dict or type(scalar) is list else scalar
        return None
    return value


def _otlp_attrs(attributes: Any, keys: frozenset[str]) -> dict[str, Any]:
    """The values of the attributes named in ``keys`` (one pass over the list)."""
    return {a["key"]: _anyvalue(a.get("value")) for a in attributes if a["key"] in keys}


def _otlp_file(stream: IO[bytes], ctx: _Ctx) -> Iterator[list[Span]]:
    """JSON Lines of ``ExportTraceServiceRequest``; or one such object over the whole file."""
    lineno = 0
    for line in stream:
        lineno += 1
        if line.strip():
            break
    else:
        return
    try:
        doc = _loads(line)
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError) and exc.pos >= len(exc.doc.rstrip()):
            yield from _otlp_whole(line + stream.read(), lineno, ctx)  # an object over several lines
            return
        ctx.bad(lineno, f"not JSON ({getattr(exc, 'msg', exc)})")
    else:
        yield _otlp_batch(doc, ctx, lineno)
    for line in stream:
        lineno += 1
        yield _otlp_line(line, lineno, ctx)


def _otlp_line(line: bytes, lineno: int, ctx: _Ctx) -> list[Span]:
    try:
        doc = _loads(line)
    except ValueError as exc:
        if line.strip():
            ctx.bad(lineno, f"not JSON ({getattr(exc, 'msg', exc)})")
        return []
    return _otlp_batch(doc, ctx, lineno)


def _otlp_whole(data: bytes, first_lineno: int, ctx: _Ctx) -> Iterator[list[Span]]:
    try:
        doc = _loads(data)
    except ValueError:  # not one object either: JSON Lines whose first line is cut short
        for lineno, line in enumerate(data.splitlines(), first_lineno):
            yield _otlp_line(line, lineno, ctx)
        return
    yield _otlp_batch(doc, ctx, first_lineno)


def _otlp_batch(doc: Any, ctx: _Ctx, lineno: int) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest``; bad spans (or resources) are counted and skipped."""
    out: list[Span] = []
    if not isinstance(doc, dict):
        ctx.bad(lineno, "not an ExportTraceServiceRequest object")
        return out
    resource_keys = frozenset(("service.name", ctx.klass))
    number = 0
    for rs in doc.get("resourceSpans") or ():
        try:
            resource = _otlp_attrs((rs.get("resource") or {}).get("attributes") or (), resource_keys)
            scopes = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ()
            service = _as_str(resource.get("service.name"))
            rklass = _as_str(resource.get(ctx.klass))
            for scope in scopes:
                for raw in scope.get("spans") or ():
                    number += 1
                    try:
                        out.append(_otlp_span(raw, service, rklass, ctx))
                    except _RECORD_ERRORS as exc:
                        ctx.bad(lineno, f"span {number}: {_reason(exc)}")
        except _RECORD_ERRORS as exc:
            ctx.bad(lineno, f"resourceSpans: {_reason(exc)}")
    return out


def _otlp_span(raw: dict[str, Any], service: str, rklass: str, ctx: _Ctx) -> Span:
    """One OTLP span; the common case (lowercase hex ids, a few attributes) takes no detour."""
    get = raw.get
    trace_id, span_id, start = get("traceId"), get("spanId"), get("startTimeUnixNano")
    if not trace_id or not span_id:
        raise _Unreadable("missing traceId or spanId")
    if not start or start == "0":
        raise _Unreadable("missing startTimeUnixNano")
    if len(trace_id) != 32 or trace_id.strip(_HEX):
        trace_id = _otlp_id(trace_id, ctx)
    if len(span_id) != 16 or span_id.strip(_HEX):
        span_id = _otlp_id(span_id, ctx)
    parent = get("parentSpanId") or ""
    if parent and (len(parent) != 16 or parent.strip(_HEX)):
        parent = _otlp_id(parent, ctx)
    if parent in _ZERO_IDS:
        parent = ""
    attributes = get("attributes")
    http = resend = 0
    klass, peer = rklass, ""
    if attributes:
        keys = ctx.keys
        picked = {a["key"]: a["value"] for a in attributes if a["key"] in keys}
        if picked:
            http, resend, klass, peer = _otlp_picked(picked, ctx.klass, rklass)
    end, status, flags = get("endTimeUnixNano"), get("status"), get("flags")
    if flags and type(flags) is not int:
        flags = int(flags)
    return Span(trace_id, span_id, parent, _OTLP_KIND.get(get("kind", 0), ""), service, get("name") or "",
                int(start), int(end) if end else 0, bool(status) and status.get("code") in _OTLP_ERROR,
                http, resend, klass, peer, not flags or not flags & 0x100 or bool(flags & 0x1), False)


def _otlp_picked(picked: dict[str, Any], class_attribute: str, rklass: str) -> tuple[int, int, str, str]:
    """``(http_status, resend_count, klass, peer_service)`` from the span's ``AnyValue``s of interest."""
    status = picked.get(_HTTP_STATUS) or picked.get(_HTTP_STATUS_LEGACY)
    resend = picked.get(_RESEND)
    klass = picked.get(class_attribute)
    peer = picked.get(_PEER)
    return (_as_int(_anyvalue(status)) if status else 0, _as_int(_anyvalue(resend)) if resend else 0,
            rklass if klass is None else _as_str(_anyvalue(klass)), _as_str(_anyvalue(peer)) if peer else "")


def _otlp_id(value: str, ctx: _Ctx) -> str:
    """An OTLP id as lowercase hex: 32 or 16 hex digits (any case), else base64 of 16 or 8 bytes."""
    n = len(value)
    if n == 32 or n == 16:
        low = value.lower()
        if not low.strip(_HEX):
            return low
    return ctx.b64_id(value)


# --- Zipkin and Jaeger ----------------------------------------------------------------------------------------------


def _plain_id(value: Any, what: str) -> str:
    """A Zipkin or Jaeger hex id, lowercased and left-padded with zeros to 16 or 32 digits."""
    if type(value) is not str:
        raise _Unreadable(f"{what} {value!r} is not a hex string")
    low = value.lower()
    n = len(low)
    if not n or n > 32 or low.strip(_HEX):
        raise _Unreadable(f"{what} {value!r} is not 1 to 32 hex digits")
    if n == 16 or n == 32:
        return low
    return low.zfill(16 if n < 16 else 32)


def _parent_id(value: Any) -> str:
    if not value:
        return ""
    parent = _plain_id(value, "parent id")
    return "" if parent in _ZERO_IDS else parent


def _us_to_ns(value: Any) -> int:
    if type(value) is int:
        return value * 1000
    return round(float(value) * 1000)


_ZIPKIN_KIND = {"SERVER": "server", "CLIENT": "client", "PRODUCER": "producer", "CONSUMER": "consumer"}


def _zipkin_file(stream: IO[bytes], ctx: _Ctx) -> Iterator[list[Span]]:
    """A Zipkin v2 array of spans, or an array of traces."""
    doc = _document(stream, ctx)
    if doc is None:
        return
    if not isinstance(doc, list):
        ctx.bad(1, "not a JSON array of Zipkin v2 spans")
        return
    out: list[Span] = []
    number = 0
    for item in doc:
        for raw in item if isinstance(item, list) else (item,):
            number += 1
            try:
                out.append(_zipkin_span(raw, ctx))
            except _RECORD_ERRORS as exc:
                ctx.bad(f"span {number}", _reason(exc))
    yield out


def _zipkin_span(raw: dict[str, Any], ctx: _Ctx) -> Span:
    get = raw.get
    trace_id, span_id, timestamp = get("traceId"), get("id"), get("timestamp")
    if not trace_id or not span_id:
        raise _Unreadable("missing traceId or id")
    if not timestamp:
        raise _Unreadable("missing timestamp")
    start = _us_to_ns(timestamp)
    duration = get("duration")
    tags = get("tags") or {}
    http, resend, klass, peer = _common(tags, ctx.klass, "")
    local = get("localEndpoint") or {}
    remote = get("remoteEndpoint") or {}
    return Span(_plain_id(trace_id, "traceId"), _plain_id(span_id, "id"), _parent_id(get("parentId")),
                _ZIPKIN_KIND.get(get("kind"), ""), local.get("serviceName") or "", get("name") or "", start,
                start + _us_to_ns(duration) if duration is not None else 0, "error" in tags, http, resend, klass,
                remote.get("serviceName") or peer, True, bool(get("shared")))


def _jaeger_tags(tags: Any, keys: frozenset[str]) -> dict[str, Any]:
    picked = {}
    for tag in tags or ():
        key = tag.get("key")
        if key in keys:
            picked[key] = tag.get("value")
    return picked


def _jaeger_traces(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        return (doc.get("data") or []) if "data" in doc else [doc]
    if isinstance(doc, list):
        return doc
    raise _Unreadable('not a {"data": [traces]} object, an array of traces or one trace')


def _jaeger_file(stream: IO[bytes], ctx: _Ctx) -> Iterator[list[Span]]:
    """Jaeger query-API JSON: ``{"data": [trace]}``, ``[trace]`` or ``trace``."""
    doc = _document(stream, ctx)
    if doc is None:
        return
    try:
        traces = _jaeger_traces(doc)
    except _Unreadable as exc:
        ctx.bad(1, str(exc))
        return
    out: list[Span] = []
    class_key = frozenset((ctx.klass,))
    number = 0
    for trace in traces:
        try:
            processes = {pid: (p.get("serviceName") or "", _jaeger_tags(p.get("tags"), class_key).get(ctx.klass))
                         for pid, p in (trace.get("processes") or {}).items()}
            trace_id = trace.get("traceID")
            for raw in trace.get("spans") or ():
                number += 1
                try:
                    out.append(_jaeger_span(raw, trace_id, processes, ctx))
                except _RECORD_ERRORS as exc:
                    ctx.bad(f"span {number}", _reason(exc))
        except _RECORD_ERRORS as exc:
            ctx.bad(f"trace {trace.get('traceID') if isinstance(trace, dict) else trace!r}", _reason(exc))
    yield out


def _jaeger_parent(raw: dict[str, Any]) -> str:
    """The first CHILD_OF reference, else the first FOLLOWS_FROM one, else the old ``parentSpanID``."""
    follows = None
    for ref in raw.get("references") or ():
        kind = ref.get("refType")
        if kind == "CHILD_OF":
            return _parent_id(ref.get("spanID"))
        if kind == "FOLLOWS_FROM" and follows is None:
            follows = ref.get("spanID")
    return _parent_id(follows if follows is not None else raw.get("parentSpanID"))


def _jaeger_span(raw: dict[str, Any], trace_id: Any, processes: dict[str, tuple[str, Any]], ctx: _Ctx) -> Span:
    get = raw.get
    trace_id, span_id, start = get("traceID") or trace_id, get("spanID"), get("startTime")
    if not trace_id or not span_id:
        raise _Unreadable("missing traceID or spanID")
    if not start:
        raise _Unreadable("missing startTime")
    start_ns = _us_to_ns(start)
    duration = get("duration")
    tags = _jaeger_tags(get("tags"), ctx.keys)
    process = get("process")
    if isinstance(process, dict):  # older exports embed the process in each span
        service, pklass = process.get("serviceName") or "", _jaeger_tags(process.get("tags"), ctx.keys).get(ctx.klass)
    else:
        service, pklass = processes.get(get("processID"), ("", None))
    http, resend, klass, peer = _common(tags, ctx.klass, _as_str(pklass))
    kind = _as_str(tags.get("span.kind")).lower()
    flags = get("flags")
    return Span(_plain_id(trace_id, "traceID"), _plain_id(span_id, "spanID"), _jaeger_parent(raw),
                kind if kind in _KINDS else "", service, get("operationName") or "", start_ns,
                start_ns + _us_to_ns(duration) if duration is not None else 0,
                tags.get("error") in (True, "true", "True"), http, resend, klass, peer,
                flags is None or bool(int(flags) & 0x1), False)


_READERS: dict[str, Callable[[IO[bytes], _Ctx], Iterator[list[Span]]]] = {
    "otlp-json": _otlp_file,
    "zipkin": _zipkin_file,
    "jaeger": _jaeger_file,
}


# ---------------------------------------------------------------------------------------------------------------
# Envoy access logs
# ---------------------------------------------------------------------------------------------------------------

_COMMAND = re.compile(r"%([A-Z][A-Z0-9_]*)(?:\(([^)]*)\))?(?::(\d+))?%")
_EPOCH_FORM = re.compile(r"%s(?:\.%[1-9]?f)?")


class _AccessFormat:
    """A compiled Envoy format string: call it with a line to get ``{command: value}`` or None."""

    def __init__(self, log_format: str) -> None:
        self.log_format = log_format
        self.commands: list[re.Match[str]] = []
        self.regex = re.compile(self._pattern(log_format.rstrip("\r\n")), re.DOTALL)
        self.keys = tuple(m.group(0) for m in self.commands)

    def _pattern(self, text: str) -> str:
        literals: list[str] = []
        pos = 0
        for m in _COMMAND.finditer(text):
            literals.append(text[pos:m.start()])
            self.commands.append(m)
            pos = m.end()
        literals.append(text[pos:])
        pattern = [re.escape(literals[0])]
        quoted = literals[0].count('"') % 2 == 1
        for i, command in enumerate(self.commands):
            after = literals[i + 1]
            pattern.append(_capture(command, quoted, after, last=i + 1 == len(self.commands)))
            pattern.append(re.escape(after))
            quoted ^= after.count('"') % 2 == 1
        return "".join(pattern)

    def __call__(self, line: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(line)
        return None if m is None else dict(zip(self.keys, m.groups(), strict=True))


def _capture(command: re.Match[str], quoted: bool, after: str, *, last: bool) -> str:
    """The regex group for one command, given whether it is inside quotes and the literal text after it."""
    if command.group(1) == "START_TIME" and " " in (command.group(2) or ""):
        return "(.+?)"
    if quoted:
        if after.startswith('"'):
            return '([^"]*)'
        return '([^" ]*)' if after.startswith(" ") else '([^"]*?)'
    if after.startswith(" ") or (not after and last):
        return r"(\S+)"
    return "(.*?)"


def compile_access_format(log_format: str) -> Callable[[str], dict[str, str] | None]:
    """Turn an Envoy access-log format string into a line parser.

    Literal text must match exactly; each ``%COMMAND%``, ``%COMMAND(args)%`` or ``%COMMAND(args):N%`` captures a
    value: ``[^"]*`` inside double quotes, ``\\S+`` before a space or at the end, the shortest text before the
    next literal otherwise. A final newline in the format is ignored (lines are read without theirs).

    Args:
        log_format: The format string, as in Envoy's ``text_format`` / ``format``.

    Returns:
        A function from a line (without its newline) to ``{command text: value text}`` (e.g.
        ``{"%RESPONSE_CODE%": "503", ...}``), or None when the line does not match.
    """
    return _AccessFormat(log_format)


@functools.lru_cache(maxsize=1)
def _sloctl_format() -> _AccessFormat:
    return _AccessFormat(SLOCTL_ACCESS_FORMAT)


@functools.lru_cache(maxsize=1)
def _default_format() -> _AccessFormat:
    return _AccessFormat(ENVOY_DEFAULT_FORMAT)


@functools.lru_cache(maxsize=4096)
def _utc_seconds(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def _iso_ns(text: str) -> int:
    """Envoy's default ``%START_TIME%``: ``2026-12-04T18:58:00.123Z``."""
    if not text.endswith("Z"):
        raise ValueError(f"start time {text!r} is not like 2026-12-04T18:58:00.123Z")
    stamp, _, fraction = text[:-1].partition(".")
    if not fraction.isdigit() and fraction:
        raise ValueError(f"start time {text!r} is not like 2026-12-04T18:58:00.123Z")
    return _utc_seconds(stamp) * 1_000_000_000 + (int(fraction[:9].ljust(9, "0")) if fraction else 0)


def _epoch_ns(text: str) -> int:
    """``%START_TIME(%s)%``, ``(%s.%3f)%``, ``(%s.%6f)%``: epoch seconds with a decimal fraction."""
    seconds, _, fraction = text.partition(".")
    if not seconds.isdigit() or (fraction and not fraction.isdigit()):
        raise ValueError(f"start time {text!r} is not epoch seconds like 1765000000.123456")
    return int(seconds) * 1_000_000_000 + (int(fraction[:9].ljust(9, "0")) if fraction else 0)


def _float_or_nan(text: str | None) -> float:
    return math.nan if text is None or text == "-" else float(text)


def _int_or_zero(text: str | None) -> int:
    return 0 if text is None or text == "-" else int(text)


class _AccessFields:
    """Where each :class:`AccessRecord` field is in a format's values, and how to read its start time."""

    def __init__(self, fmt: _AccessFormat) -> None:
        def key(name: str, arg: str | None = None) -> str | None:
            for m in fmt.commands:
                if m.group(1) == name and (arg is None or (m.group(2) or "").upper() == arg):
                    return m.group(0)
            return None

        start = next((m for m in fmt.commands if m.group(1) == "START_TIME"), None)
        if start is None:
            raise TraceFormatError(f"access-log format {fmt.log_format!r}: has no %START_TIME%; sloctl needs it.")
        args = start.group(2)
        if args and not _EPOCH_FORM.fullmatch(args):
            raise TraceFormatError(
                f"access-log format: {start.group(0)} is not a start-time form sloctl reads; use %START_TIME% "
                f"(2026-12-04T18:58:00.123Z), %START_TIME(%s)%, %START_TIME(%s.%3f)% or %START_TIME(%s.%6f)%.")
        self.start, self.parse_start = start.group(0), _epoch_ns if args else _iso_ns
        self.duration, self.code, self.flags = key("DURATION"), key("RESPONSE_CODE"), key("RESPONSE_FLAGS")
        self.attempts, self.route = key("UPSTREAM_REQUEST_ATTEMPT_COUNT"), key("ROUTE_NAME")
        self.cluster = key("UPSTREAM_CLUSTER")
        self.service_time = key("RESP", "X-ENVOY-UPSTREAM-SERVICE-TIME")
        self.request_id, self.user_agent = key("REQ", "X-REQUEST-ID"), key("REQ", "USER-AGENT")
        self.caller = key("REQ", "X-ENVOY-DOWNSTREAM-SERVICE-CLUSTER")
        self.address = key("DOWNSTREAM_REMOTE_ADDRESS") or key("DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT")

    def record(self, values: dict[str, str], source: str) -> AccessRecord:
        get = values.get

        def text(k: str | None) -> str:
            value = get(k) if k else None
            return "" if value is None or value == "-" else value

        return AccessRecord(
            self.parse_start(values[self.start]), _float_or_nan(get(self.duration) if self.duration else None),
            _int_or_zero(get(self.code) if self.code else None), text(self.flags),
            _int_or_zero(get(self.attempts) if self.attempts else None), text(self.route), text(self.cluster),
            _float_or_nan(get(self.service_time) if self.service_time else None), text(self.request_id),
            text(self.caller), text(self.user_agent), text(self.address), values, source)


def iter_access_records(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                        log_format: str = SLOCTL_ACCESS_FORMAT,
                        report: ParseReport | None = None) -> Iterator[AccessRecord]:
    """Every line of the Envoy access logs, one file at a time.

    ``-`` (Envoy's "no value") reads as ``""`` in text fields, NaN in times and 0 in counts. With the default
    ``log_format``, a file whose first line does not match :data:`SLOCTL_ACCESS_FORMAT` but does match
    :data:`ENVOY_DEFAULT_FORMAT` is read in that default format (its ``attempts`` and ``caller`` are then 0 and
    ``""``).

    Args:
        paths: A file, a folder (see :func:`trace_files`) or a sequence of them.
        log_format: The Envoy format string the lines were written with.
        report: Filled with the files read and the lines skipped.

    Yields:
        One record per line that matches the format; other lines are counted unreadable.

    Raises:
        TraceFormatError: The format has no %START_TIME% or one in a form not read, or a file holds spans.
    """
    fmt = _AccessFormat(log_format)
    fields = _AccessFields(fmt)
    fallback = log_format == SLOCTL_ACCESS_FORMAT
    report = report if report is not None else ParseReport()
    for path in trace_files(paths):
        found = _sniff(_read_head(path))
        if found in _SPAN_FORMATS:
            raise TraceFormatError(f"{path}: looks like {found} ({_LOOKS[found]}), not envoy-access "
                                   f"({_LOOKS['envoy-access']}); read it with iter_spans.")
        yield from _access_file(path, fmt, fields, fallback, report)


def _access_file(path: Path, fmt: _AccessFormat, fields: _AccessFields, fallback: bool,
                 report: ParseReport) -> Iterator[AccessRecord]:
    entry = _file_entry(report, path, "envoy-access")
    count = lineno = 0
    try:
        with _open_counted(path, entry) as stream:
            for raw in stream:
                lineno += 1
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line.strip():
                    continue
                values = fmt(line)
                if fallback:  # decided on the first line: Envoy's default format instead of sloctl's?
                    fallback = False
                    if values is None and (values := _default_format()(line)) is not None:
                        fmt, fields = _default_format(), _AccessFields(_default_format())
                if values is None:
                    report._bad(path, lineno, "does not match the access-log format")
                    continue
                try:
                    record = fields.record(values, f"{path}:{lineno}")
                except (ValueError, KeyError) as exc:
                    report._bad(path, lineno, _reason(exc))
                    continue
                count += 1
                yield record
    except (OSError, EOFError) as exc:
        report._bad(path, lineno + 1, f"cannot read further ({exc})")
    finally:
        entry["records"] = count
