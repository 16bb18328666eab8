from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest

from sloctl.core.errors import TraceFormatError
from sloctl.datasets.traces import (
    ENVOY_DEFAULT_FORMAT,
    FORMATS,
    SLOCTL_ACCESS_FORMAT,
    ParseReport,
    Span,
    compile_access_format,
    detect_format,
    iter_access_records,
    iter_spans,
    trace_files,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
T0_NS = 1_768_471_200_000_000_000  # 2026-01-15T10:00:00Z
MS = 1_000_000
OPENZIPKIN = DATA / "zipkin-openzipkin-smartthings-oauth-authorization.json"

# The retried call, as every fixture tells it: (service, kind, name-ish, start offset us, duration us, http, resend,
# error, klass).
OTLP_IDS = {
    "loadgen": "1a2b3c4d5e6f7081", "frontend": "2b3c4d5e6f708192", "try1": "3c4d5e6f708192a3",
    "backend1": "4d5e6f708192a3b4", "try2": "5e6f708192a3b4c5", "backend2": "6f708192a3b4c5d6",
}


def by_id(spans: list[Span]) -> dict[str, Span]:
    return {s.span_id: s for s in spans}


def read(path: Path, **kwargs) -> tuple[list[Span], ParseReport]:
    report = ParseReport()
    return list(iter_spans(path, report=report, **kwargs)), report


def assert_retried_call(spans: dict[str, Span], ids: dict[str, str], *, trace_id: str) -> None:
    """The six spans of loadgen -> frontend -> backend (503, then 200 on the retry)."""
    lg, fe, c1, b1, c2, b2 = (spans[ids[k]] for k in ("loadgen", "frontend", "try1", "backend1", "try2", "backend2"))
    assert {s.trace_id for s in (lg, fe, c1, b1, c2, b2)} == {trace_id}
    assert [s.kind for s in (lg, fe, c1, b1, c2, b2)] == ["client", "server", "client", "server", "client", "server"]
    assert [s.service for s in (lg, fe, c1, b1, c2, b2)] == ["loadgen", "frontend", "frontend", "backend",
                                                             "frontend", "backend"]
    assert (lg.parent_id, fe.parent_id, c1.parent_id, c2.parent_id) == ("", lg.span_id, fe.span_id, fe.span_id)
    assert (b1.parent_id, b2.parent_id) == (c1.span_id, c2.span_id)
    assert (lg.start_ns, lg.end_ns) == (T0_NS, T0_NS + 48_250_000)
    assert (fe.start_ns, fe.end_ns) == (T0_NS + 1_100_000, T0_NS + 48 * MS)
    assert (c1.start_ns, c1.end_ns, b1.start_ns, b1.end_ns) == (T0_NS + 5 * MS, T0_NS + 15 * MS,
                                                                 T0_NS + 5_600_000, T0_NS + 14_400_000)
    assert (c2.start_ns, c2.end_ns) == (T0_NS + 20 * MS, T0_NS + 40_500_000)
    assert [s.http_status for s in (lg, fe, c1, b1, c2, b2)] == [200, 200, 503, 503, 200, 200]
    assert [s.resend_count for s in (lg, fe, c1, b1, c2, b2)] == [0, 0, 0, 0, 1, 0]
    assert [s.error for s in (lg, fe, c1, b1, c2, b2)] == [False, False, True, True, False, False]
    assert (c1.peer_service, c2.peer_service, lg.peer_service) == ("backend", "backend", "frontend")
    assert all(s.sampled for s in (lg, fe, c1, b1, c2, b2))


# --- each fixture -------------------------------------------------------------------------------------------------


def test_otlp_json_lines_give_the_retried_call_with_classes_from_span_then_resource():
    spans, report = read(DATA / "otlp.jsonl")
    assert len(spans) == 6 and report.unreadable == 0 and report.ids_base64 == 0
    found = by_id(spans)
    assert_retried_call(found, OTLP_IDS, trace_id="7d3f1c2a9b8e4f60a1b2c3d4e5f60718")
    klass = {k: found[v].klass for k, v in OTLP_IDS.items()}
    assert klass == {"loadgen": "gold", "frontend": "gold", "try1": "standard", "try2": "standard",
                     "backend1": "", "backend2": ""}
    assert not any(s.shared for s in spans)


def test_otlp_one_pretty_printed_object_reads_like_the_json_lines():
    one, report = read(DATA / "otlp-one-object.json")
    assert report.unreadable == 0
    lines, _ = read(DATA / "otlp.jsonl")
    assert sorted(one) == sorted(lines)


def test_report_lists_each_file_with_its_hash_size_and_records():
    path = DATA / "otlp.jsonl"
    _, report = read(path)
    data = path.read_bytes()
    assert report.files == [{"path": str(path), "format": "otlp-json", "sha256": hashlib.sha256(data).hexdigest(),
                             "bytes": len(data), "records": 6}]
    assert json.loads(json.dumps(report.to_json())) == {"files": report.files, "unreadable": 0, "examples": [],
                                                        "ids_base64": 0}


def test_zipkin_shared_client_and_server_halves_keep_one_id():
    spans, report = read(DATA / "zipkin.json")
    assert len(spans) == 7 and report.unreadable == 0
    assert {s.trace_id for s in spans} == {"5af7183fb1d4cf5f"}  # a 64-bit id is kept as given
    halves = [s for s in spans if s.span_id == "3c4d5e6f708192a3"]
    assert [(s.kind, s.service, s.shared, s.http_status, s.error) for s in halves] == [
        ("client", "frontend", False, 503, True), ("server", "backend", True, 503, True)]
    assert halves[0].peer_service == "backend"  # remoteEndpoint.serviceName
    retry = [s for s in spans if s.span_id == "5e6f708192a3b4c5"]
    assert [(s.kind, s.resend_count, s.http_status, s.parent_id) for s in retry] == [
        ("client", 1, 200, "1a2b3c4d5e6f7081"), ("server", 0, 200, "1a2b3c4d5e6f7081")]
    assert (retry[0].start_ns, retry[0].end_ns) == (T0_NS + 20 * MS, T0_NS + 40_500_000)
    root = [s for s in spans if s.span_id == "1a2b3c4d5e6f7081"]
    assert [(s.parent_id, s.klass, s.service) for s in root] == [("", "gold", "loadgen"), ("", "gold", "frontend")]
    local = next(s for s in spans if s.name == "stock-lookup")
    assert (local.kind, local.end_ns, local.parent_id) == ("", 0, "5e6f708192a3b4c5")  # no duration: still open


def test_jaeger_spans_take_kind_from_tags_and_class_from_the_process():
    spans, report = read(DATA / "jaeger.json")
    assert len(spans) == 6 and report.unreadable == 0
    ids = dict(OTLP_IDS, backend2="0f708192a3b4c5d6")  # Jaeger drops leading zeros; they come back
    found = by_id(spans)
    assert_retried_call(found, ids, trace_id="8e1f2a3b4c5d6e7f8091a2b3c4d5e6f7")
    assert [found[ids[k]].klass for k in ("loadgen", "frontend", "try1", "backend1")] == ["gold", "gold", "standard",
                                                                                          ""]
    assert found[ids["loadgen"]].name == "GET /checkout"


def test_jaeger_bare_trace_parent_fallbacks_and_flags(tmp_path):
    trace = {
        "traceID": "ABC", "processes": {"p1": {"serviceName": "svc"}},
        "spans": [
            {"spanID": "1", "startTime": 10, "duration": 5, "processID": "p1", "flags": 0,
             "references": [{"refType": "FOLLOWS_FROM", "spanID": "9"}]},
            {"spanID": "2", "startTime": 10, "processID": "p1", "parentSpanID": "1", "tags": [
                {"key": "span.kind", "type": "string", "value": "PRODUCER"},
                {"key": "error", "type": "string", "value": "true"}]},
            {"spanID": "3", "startTime": 10, "processID": "nope", "references": [
                {"refType": "FOLLOWS_FROM", "spanID": "1"}, {"refType": "CHILD_OF", "spanID": "2"}]},
        ],
    }
    path = tmp_path / "one-trace.json"
    path.write_text(json.dumps([trace]))
    assert detect_format(path) == "jaeger"
    spans, report = read(path)
    assert report.unreadable == 0
    assert [(s.trace_id, s.span_id, s.parent_id) for s in spans] == [
        ("0000000000000abc", "0000000000000001", "0000000000000009"),
        ("0000000000000abc", "0000000000000002", "0000000000000001"),
        ("0000000000000abc", "0000000000000003", "0000000000000002")]
    assert [s.sampled for s in spans] == [False, True, True]  # flags 0: not sampled; no flags: sampled
    assert (spans[1].kind, spans[1].error, spans[1].end_ns, spans[2].service) == ("producer", True, 0, "")
    assert (spans[0].start_ns, spans[0].end_ns, spans[0].service) == (10_000, 15_000, "svc")


def test_openzipkin_trace_reads_whole():
    spans, report = read(OPENZIPKIN)
    assert report.unreadable == 0 and len(spans) == 175
    assert len({s.service for s in spans}) == 8
    assert {s.trace_id for s in spans} == {"8ce82b2e9ed820ba"}
    assert sum(s.end_ns == 0 for s in spans) == 19  # reported without a duration
    assert sum(s.error for s in spans) == 2
    assert sum(s.shared for s in spans) == 45
    assert sum(s.parent_id == "" for s in spans) == 1
    assert {s.kind for s in spans} == {"client", "server", ""}
    assert all(s.start_ns > 1_500_000_000 * 10**9 for s in spans)
    assert {s.http_status for s in spans} == {0, 302, 307, 401}


# --- detection and wrong formats ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "fmt"), [
    ("otlp.jsonl", "otlp-json"), ("otlp-one-object.json", "otlp-json"), ("zipkin.json", "zipkin"),
    ("jaeger.json", "jaeger"), ("envoy-access.log", "envoy-access"), ("envoy-default.log", "envoy-access"),
    (OPENZIPKIN.name, "zipkin"),
])
def test_detect_format_of_each_fixture(name, fmt):
    assert detect_format(DATA / name) == fmt
    assert fmt in FORMATS


@pytest.mark.parametrize(("text", "fmt"), [
    ("[]", "zipkin"), ("[[]]", "zipkin"), ('  \n[ {"id": "1"} ]', "zipkin"),
    ('{"traceID": "a", "spans": []}', "jaeger"), ('{"data": []}', "jaeger"),
])
def test_detect_format_of_small_documents(tmp_path, text, fmt):
    path = tmp_path / "t"
    path.write_text(text)
    assert detect_format(path) == fmt


def test_unknown_or_empty_file_is_named_with_the_formats_listed(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(TraceFormatError, match=r"notes\.txt: looks like none .*otlp-json.*zipkin.*jaeger.*envoy"):
        detect_format(path)
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    with pytest.raises(TraceFormatError, match=r"empty\.json: is empty"):
        detect_format(empty)
    spans, report = read(empty)  # an empty file holds no spans, and that is no error
    assert spans == [] and report.files[0]["records"] == 0 and report.files[0]["bytes"] == 3


def test_a_file_of_another_format_is_named_in_the_error():
    with pytest.raises(TraceFormatError, match=r"zipkin\.json: looks like zipkin \(a JSON array of spans\), not "
                                               r"otlp-json \(one ExportTraceServiceRequest object per line\)"):
        list(iter_spans(DATA / "zipkin.json", fmt="otlp-json"))
    with pytest.raises(TraceFormatError, match=r"otlp\.jsonl: looks like otlp-json .*, not jaeger"):
        list(iter_spans(DATA / "otlp.jsonl", fmt="jaeger"))


def test_access_logs_and_spans_do_not_mix():
    with pytest.raises(TraceFormatError, match=r"envoy-access\.log: looks like an Envoy access log.*iter_access_rec"):
        list(iter_spans(DATA / "envoy-access.log"))
    with pytest.raises(TraceFormatError, match=r"jaeger\.json: looks like jaeger .* not envoy-access"):
        list(iter_access_records(DATA / "jaeger.json"))
    with pytest.raises(TraceFormatError, match="format 'envoy-access'"):
        list(iter_spans(DATA / "envoy-access.log", fmt="envoy-access"))


def test_named_format_reads_a_file_detection_cannot_place(tmp_path):
    good = (DATA / "otlp.jsonl").read_text()
    path = tmp_path / "t.jsonl"
    path.write_text("garbage first line\n" + good)
    with pytest.raises(TraceFormatError, match="looks like none"):
        list(iter_spans(path))
    spans, report = read(path, fmt="otlp-json")
    assert len(spans) == 6 and report.unreadable == 1 and report.examples[0].startswith(f"{path}:1: not JSON")


# --- robustness ---------------------------------------------------------------------------------------------------


def to_base64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


def test_base64_ids_are_converted_and_counted(tmp_path):
    doc = json.loads((DATA / "otlp.jsonl").read_text().splitlines()[1])  # the backend's two spans
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId", "parentSpanId"):
            span[key] = to_base64(span[key])
    path = tmp_path / "b64.jsonl"
    path.write_text(json.dumps(doc) + "\n")
    spans, report = read(path)
    assert report.ids_base64 == 6 and report.unreadable == 0
    assert [(s.trace_id, s.span_id, s.parent_id) for s in spans] == [
        ("7d3f1c2a9b8e4f60a1b2c3d4e5f60718", OTLP_IDS["backend1"], OTLP_IDS["try1"]),
        ("7d3f1c2a9b8e4f60a1b2c3d4e5f60718", OTLP_IDS["backend2"], OTLP_IDS["try2"])]


def test_a_bad_json_line_is_counted_not_fatal(tmp_path):
    lines = (DATA / "otlp.jsonl").read_text().splitlines()
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([lines[0], '{"resourceSpans": [', "", lines[1]]) + "\n")
    spans, report = read(path)
    assert len(spans) == 6
    assert report.unreadable == 1
    assert report.examples == [f"{path}:2: not JSON (Expecting value)"]


def test_spans_without_ids_or_start_time_are_unreadable(tmp_path):
    base = {"traceId": "7d3f1c2a9b8e4f60a1b2c3d4e5f60718", "spanId": "1a2b3c4d5e6f7081",
            "startTimeUnixNano": "1768471200000000000"}
    spans = [dict(base), {**base, "traceId": ""}, {k: v for k, v in base.items() if k != "spanId"},
             {**base, "startTimeUnixNano": "0"}, {**base, "spanId": "not-an-id!"},
             {**base, "kind": "SPAN_KIND_PRODUCER"}]
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(doc) + "\n")
    got, report = read(path)
    assert [(s.kind, s.end_ns, s.service, s.sampled) for s in got] == [("", 0, "", True), ("producer", 0, "", True)]
    assert report.unreadable == 4 and len(report.examples) == 4
    assert report.examples[0] == f"{path}:1: span 2: missing traceId or spanId"
    assert report.examples[2] == f"{path}:1: span 4: missing startTimeUnixNano"
    assert "span 5: id 'not-an-id!' is neither" in report.examples[3]


def test_otlp_flags_say_not_sampled_only_when_populated():
    def sampled(flags):
        doc = {"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "7d3f1c2a9b8e4f60a1b2c3d4e5f60718", "spanId": "1a2b3c4d5e6f7081", "flags": flags,
             "startTimeUnixNano": 1}]}]}]}
        return doc

    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        path.write_text("\n".join(json.dumps(sampled(f)) for f in (0, 1, 0x100, 0x101, 0x300, 0x301)) + "\n")
        assert [s.sampled for s in iter_spans(path)] == [True, True, False, True, False, True]


def test_examples_stop_at_five_but_the_count_goes_on(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("{oops}\n" * 8)
    spans, report = read(path, fmt="otlp-json")
    assert spans == [] and report.unreadable == 8 and len(report.examples) == 5


def test_gzip_files_are_read_and_detected(tmp_path):
    path = tmp_path / "otlp.jsonl.gz"
    raw = (DATA / "otlp.jsonl").read_bytes()
    path.write_bytes(gzip.compress(raw))
    assert detect_format(path) == "otlp-json"
    spans, report = read(path)
    assert sorted(spans) == sorted(read(DATA / "otlp.jsonl")[0])
    assert report.files[0]["bytes"] == path.stat().st_size
    assert report.files[0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    zipped = tmp_path / "zipkin.gz"
    zipped.write_bytes(gzip.compress((DATA / "zipkin.json").read_bytes()))
    assert detect_format(zipped) == "zipkin" and len(list(iter_spans(zipped))) == 7


def test_a_truncated_gzip_file_keeps_what_it_read(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress((DATA / "otlp.jsonl").read_bytes() * 20)[:-200])
    spans, report = read(path)
    assert len(spans) > 0 and report.unreadable >= 1


def test_trace_files_walks_sorted_and_skips_hidden(tmp_path):
    for name in ("b/2.json", "b/1.json", "a.json", ".hidden.json", ".git/x.json", "c/.d/y.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / "zipkin.json", tmp_path / name)
    assert [p.relative_to(tmp_path).as_posix() for p in trace_files(tmp_path)] == ["a.json", "b/1.json", "b/2.json"]
    assert trace_files([tmp_path / "b/2.json", tmp_path / "a.json"]) == [tmp_path / "b/2.json", tmp_path / "a.json"]
    report = ParseReport()
    assert len(list(iter_spans(tmp_path, report=report))) == 21 and len(report.files) == 3
    with pytest.raises(TraceFormatError, match="no trace files"):
        trace_files(tmp_path / "c")
    with pytest.raises(TraceFormatError, match="no such file"):
        trace_files(tmp_path / "missing")


# --- Envoy access logs --------------------------------------------------------------------------------------------


def test_default_format_constants():
    assert ENVOY_DEFAULT_FORMAT.startswith('[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% ')
    assert ENVOY_DEFAULT_FORMAT.endswith('"%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"\n')
    assert ENVOY_DEFAULT_FORMAT.count("\n") == 1
    assert SLOCTL_ACCESS_FORMAT == (
        '[%START_TIME(%s.%6f)%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
        "%RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "
        '"%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" '
        "%ROUTE_NAME% %UPSTREAM_CLUSTER% %UPSTREAM_REQUEST_ATTEMPT_COUNT% "
        '"%REQ(X-ENVOY-DOWNSTREAM-SERVICE-CLUSTER)%" '
        "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)% %COMMON_DURATION(DS_RX_BEG:US_RX_END:us)%\n")


def test_access_log_lines_give_attempts_route_flags_and_caller():
    report = ParseReport()
    records = list(iter_access_records(DATA / "envoy-access.log", report=report))
    assert report.unreadable == 0 and report.files[0]["records"] == 4 and report.files[0]["format"] == "envoy-access"
    ingress, retried, exhausted, refused = records
    assert (ingress.start_ns, ingress.route_name, ingress.upstream_cluster, ingress.attempts, ingress.caller) == (
        T0_NS + 1_100_000, "frontend_ingress", "frontend_local", 1, "loadgen")
    assert (retried.response_code, retried.attempts, retried.response_flags, retried.caller) == (200, 2, "", "frontend")
    assert (retried.duration_ms, retried.upstream_service_time_ms, retried.user_agent) == (35.0, 19.0, "frontend/2.3")
    assert retried.request_id == ingress.request_id == "6f1c5d0e-2b7a-4c59-9d3e-0a1b2c3d4e5f"
    assert (exhausted.response_code, exhausted.response_flags, exhausted.attempts) == (503, "URX", 3)
    assert refused.response_flags == "UF,URX" and math.isnan(refused.upstream_service_time_ms)
    assert retried.fields["%UPSTREAM_HOST%"] == "10.0.0.3:8080"
    assert retried.fields["%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"] == "/stock?sku=42"
    assert retried.source == f"{DATA / 'envoy-access.log'}:2"


@pytest.mark.parametrize("log_format", [ENVOY_DEFAULT_FORMAT, SLOCTL_ACCESS_FORMAT])
def test_the_default_envoy_format_parses_too(log_format):
    report = ParseReport()
    records = list(iter_access_records(DATA / "envoy-default.log", log_format=log_format, report=report))
    assert report.unreadable == 0 and len(records) == 3
    first, second, disconnected = records
    assert first.start_ns == T0_NS + 1 * MS and second.start_ns == T0_NS + 5 * MS
    assert [r.attempts for r in records] == [0, 0, 0] and {r.caller for r in records} == {""}
    assert (second.route_name, second.upstream_cluster, second.duration_ms) == ("", "", 35.0)
    assert (disconnected.response_code, disconnected.response_flags) == (0, "DC")
    assert disconnected.fields["%UPSTREAM_HOST%"] == "-"


def test_unmatched_access_lines_are_counted(tmp_path):
    lines = (DATA / "envoy-access.log").read_text().splitlines()
    path = tmp_path / "a.log"
    path.write_text("\n".join([lines[0], "not an access log line", lines[1].replace(" 200 ", " abc "), lines[2]]))
    report = ParseReport()
    records = list(iter_access_records(path, report=report))
    assert len(records) == 2 and report.unreadable == 2
    assert report.examples[0] == f"{path}:2: does not match the access-log format"
    assert report.examples[1].startswith(f"{path}:3: ValueError")


def test_compile_access_format_captures_every_command_by_its_text():
    parse = compile_access_format(
        '%START_TIME(%s.%3f)% %COMMON_DURATION(US_TX_BEG:US_RX_END:us)% "%REQ(USER-AGENT):10%" '
        "%DOWNSTREAM_REMOTE_ADDRESS%/%BYTES_SENT%\n")
    values = parse('1768471200.250 1234 "curl/8.5 x" 10.0.0.9:5555/17')
    assert values == {"%START_TIME(%s.%3f)%": "1768471200.250", "%COMMON_DURATION(US_TX_BEG:US_RX_END:us)%": "1234",
                      "%REQ(USER-AGENT):10%": "curl/8.5 x", "%DOWNSTREAM_REMOTE_ADDRESS%": "10.0.0.9:5555",
                      "%BYTES_SENT%": "17"}
    assert parse("1768471200.250 1234 curl 10.0.0.9:5555/17") is None


def test_access_records_in_a_custom_format(tmp_path):
    log_format = "%START_TIME(%s)% %DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% %RESPONSE_CODE% %DURATION%\n"
    path = tmp_path / "c.log"
    path.write_text("1768471200 10.0.0.9 204 -\n")
    (record,) = iter_access_records(path, log_format=log_format)
    assert (record.start_ns, record.downstream_address, record.response_code) == (T0_NS, "10.0.0.9", 204)
    assert math.isnan(record.duration_ms) and record.attempts == 0 and record.route_name == ""


def test_unreadable_start_time_forms_are_refused_up_front():
    with pytest.raises(TraceFormatError, match=r"%START_TIME\(%Y/%m/%d\)% is not a start-time form"):
        list(iter_access_records(DATA / "envoy-access.log", log_format="%START_TIME(%Y/%m/%d)% %DURATION%"))
    with pytest.raises(TraceFormatError, match="no %START_TIME%"):
        list(iter_access_records(DATA / "envoy-access.log", log_format="%DURATION%"))
