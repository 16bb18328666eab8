"""The gateway, tried as a hostile client would (issue 33): every probe is refused, nothing leaks, it keeps serving.

The probes are those of the issue's "Why", replayed through the real
``trino`` client and plain HTTP against a gateway on two size-1 clusters
(TPC-H SF 0.01). After each: the warehouse file's checksum is unchanged, no
file appeared outside the log folder, a loopback listener saw no
connection, and the gateway answers the next query.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time

import pytest

pytest.importorskip("trino")

#: A query that runs for many seconds on SF 0.01: something to cut.
LONG_SQL = "SELECT count(*) FROM range(5000000000) t(i) WHERE i % 7 = 3"


class Listener:
    """A TCP listener on loopback that counts the connections it receives (it should receive none)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


def _sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def hostile(tpch_db, tmp_path_factory):
    """A gateway with short limits (run time 4 s, client timeout 3 s, 256 MB per worker), served on loopback."""
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.gateway.policy import GatewayPolicy
    from sloctl.serving.local import LocalServer

    log_dir = tmp_path_factory.mktemp("gateway-logs")
    policy = GatewayPolicy(max_run_time_s=4.0, client_timeout_s=3.0)
    options = GatewayOptions(cluster_sizes=(1, 1), router="least-queued", log_dir=log_dir, policy=policy,
                             worker_memory_limit="256MB", max_query_length=10_000)
    gateway = Gateway(tpch_db, options).start()
    listener = Listener()
    before = _sha256(tpch_db)
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, client, listener, log_dir
    finally:
        gateway.close()
        listener.close()
    assert _sha256(tpch_db) == before, "the warehouse file changed"
    assert listener.accepted == 0, "the gateway made a connection the client asked for"


def _cursor(client, user="mallory", **kwargs):
    import trino

    return trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), user=user, **kwargs).cursor()


def _refused(client, sql, **kwargs):
    """Run ``sql``; return the Trino error the client raised (the test fails if it ran)."""
    import trino

    cur = _cursor(client, **kwargs)
    with pytest.raises(trino.exceptions.TrinoQueryError) as caught:
        cur.execute(sql)
        cur.fetchall()
    return caught.value


def _serves_next(client):
    cur = _cursor(client, user="alice")
    cur.execute("SELECT count(*) FROM nation")
    assert cur.fetchall() == [[25]]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_text('/etc/shadow')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM glob('/root/**')",
    "SELECT * FROM read_parquet('/etc/*.parquet')",
])
def test_host_files_cannot_be_read_or_listed(hostile, sql):
    _, client, _, _ = hostile
    err = _refused(client, sql)
    assert err.error_name == "PERMISSION_DENIED" and "Access Denied" in err.message
    _serves_next(client)


def test_copy_cannot_overwrite_the_warehouse_or_write_anywhere(hostile, tpch_db, tmp_path):
    _, client, _, _ = hostile
    target = tmp_path / "out.csv"
    for sql in (f"COPY (SELECT 'x') TO '{tpch_db}'", f"COPY (SELECT 'x') TO '{target}'",
                f"COPY nation TO '{target}' (FORMAT parquet)"):
        err = _refused(client, sql)
        assert err.error_name == "PERMISSION_DENIED" and "COPY" in err.message
    # a SELECT cannot write either: DuckDB's table functions that write are behind the same sandbox
    assert not target.exists()
    _serves_next(client)


def test_attach_and_create_are_refused(hostile, tmp_path):
    _, client, _, _ = hostile
    other = tmp_path / "o.duckdb"
    for sql, kind in ((f"ATTACH '{other}' AS o (READ_WRITE)", "ATTACH"),
                      ("CREATE TABLE o.t AS SELECT * FROM customer", "CREATE"),
                      ("INSERT INTO nation VALUES (99, 'X', 0, 'x')", "INSERT"),
                      ("CALL pragma_version()", "CALL")):
        err = _refused(client, sql)
        assert err.error_name == "PERMISSION_DENIED" and kind in err.message
    assert not other.exists()
    _serves_next(client)


def test_the_server_never_connects_where_a_client_says(hostile):
    _, client, listener, _ = hostile
    url = f"http://127.0.0.1:{listener.port}/x"
    err = _refused(client, f"INSTALL httpfs FROM '{url}'")
    assert err.error_name == "PERMISSION_DENIED" and "INSTALL" in err.message
    err = _refused(client, "LOAD httpfs")
    assert err.error_name == "PERMISSION_DENIED"
    err = _refused(client, f"SELECT * FROM read_csv('{url}')")
    assert err.error_name == "PERMISSION_DENIED"
    time.sleep(0.3)
    assert listener.accepted == 0
    _serves_next(client)


def test_settings_never_reach_another_query(hostile):
    gateway, client, _, _ = hostile
    cur = _cursor(client, user="alice")
    cur.execute("SELECT current_setting('threads'), current_setting('memory_limit')")
    before = cur.fetchall()
    for sql in ("SET GLOBAL threads = 1", "SET threads = 7", "PRAGMA memory_limit = '1GB'",
                "SET enable_external_access = true", "RESET lock_configuration"):
        err = _refused(client, sql)
        assert err.error_name == "PERMISSION_DENIED" and "SET" in err.message, sql
    err = _refused(client, "SET SESSION threads = 7")
    assert err.error_name == "INVALID_SESSION_PROPERTY"
    cur.execute("USE main")  # Trino's USE: answered by the gateway in the client's session, never run by an engine
    cur.fetchall()
    for _ in range(4):  # both clusters
        cur.execute("SELECT current_setting('threads'), current_setting('memory_limit')")
        assert cur.fetchall() == before


def test_set_session_lives_in_the_client_session(hostile):
    import trino

    gateway, client, _, _ = hostile
    conn = trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), user="alice")
    cur = conn.cursor()
    cur.execute("SET SESSION slo_s = 2.5")
    cur.fetchall()
    assert conn._client_session.properties.get("slo_s") == "2.5"
    cur.execute("SELECT 1")
    cur.fetchall()
    assert gateway.get(cur.query_id).slo_s == 2.5


def test_one_statement_per_request_and_nothing_runs_in_the_gateway(hostile):
    gateway, client, _, _ = hostile
    started = time.monotonic()
    err = _refused(client, "SELECT 1 AS a; SELECT count(*) FROM lineitem a, lineitem b")
    assert err.error_name == "NOT_SUPPORTED" and "one statement" in err.message
    assert time.monotonic() - started < 5  # refused at once, the cross join never ran
    assert all(c["running"] == 0 for c in gateway.status()["clusters"])
    path = gateway.flush_log()  # the query log goes on after a multi-statement text
    assert path is None or path.exists()
    assert gateway.status()["log_errors"].get("write", 0) == 0
    _serves_next(client)


@pytest.mark.parametrize("sql", ["-- hi", ";", "/* only a comment */", " ; ; "])
def test_empty_or_comment_only_text_fails_at_once(hostile, sql):
    gateway, client, _, _ = hostile
    started = time.monotonic()
    err = _refused(client, sql)
    assert err.error_name == "SYNTAX_ERROR" and time.monotonic() - started < 5
    assert all(c["running"] == 0 for c in gateway.status()["clusters"])


def test_a_text_over_the_length_limit_is_413_before_parsing(hostile):
    _, client, _, _ = hostile
    response = client.post("/v1/statement", content=b"SELECT 1 -- " + b"x" * 20_000, headers={"X-Trino-User": "m"})
    assert response.status_code == 413 and response.json()["field"] == "body"
    _serves_next(client)


def test_a_runaway_query_is_cut_at_the_run_time_limit_and_not_retried(hostile, wait_until):
    gateway, client, _, _ = hostile
    err = _refused(client, LONG_SQL, client_tags=["high"])  # high retries twice on a failure
    assert err.error_name == "EXCEEDED_TIME_LIMIT" and "maximum run time" in err.message
    q = gateway.get(err.query_id)
    assert len(q.attempts) == 1 and q.latency_s < 4.0 + 2.0
    wait_until(lambda: all(c["running"] == 0 for c in gateway.status()["clusters"]), "the clusters to be idle")
    _serves_next(client)


def test_a_query_whose_client_stopped_polling_is_cancelled(hostile, wait_until):
    gateway, client, _, _ = hostile
    first = client.post("/v1/statement", content=LONG_SQL.encode(), headers={"X-Trino-User": "mallory"}).json()
    q = gateway.get(first["id"])
    wait_until(lambda: q.done.is_set(), "the abandoned query to be cancelled", timeout_s=10)
    assert q.error.name == "ABANDONED_QUERY" and len(q.attempts) == 1
    wait_until(lambda: all(c["running"] == 0 for c in gateway.status()["clusters"]), "the clusters to be idle")
    assert gateway.status()["counts"]["abandoned"] >= 1


def test_a_query_that_needs_more_memory_than_its_worker_fails_alone(hostile):
    gateway, client, _, _ = hostile
    err = _refused(client, "SELECT list(i) FROM range(200000000) t(i)", client_tags=["high"])
    assert err.error_name == "EXCEEDED_LOCAL_MEMORY_LIMIT"
    assert len(gateway.get(err.query_id).attempts) == 1  # the query's failure: never retried
    assert all(c["ready"] for c in gateway.status()["clusters"])
    _serves_next(client)
    _serves_next(client)


def test_a_query_record_serves_only_its_user(hostile):
    _, client, _, _ = hostile
    cur = _cursor(client, user="alice")
    cur.execute("SELECT 1")
    cur.fetchall()
    qid = cur.query_id
    assert client.get(f"/v1/query/{qid}", headers={"X-Trino-User": "alice"}).status_code == 200
    assert client.get(f"/v1/query/{qid}", headers={"X-Trino-User": "mallory"}).status_code == 404
    assert client.get(f"/v1/query/{qid}").status_code in (400, 404)


def test_results_stream_in_pages_held_at_most_buffer_pages(hostile, wait_until):
    """A big result is not built up at the gateway: the worker waits for the client to read."""
    gateway, client, _, _ = hostile
    n = 40 * gateway.options.page_rows
    first = client.post("/v1/statement", content=f"SELECT i FROM range({n}) t(i)".encode(),
                        headers={"X-Trino-User": "alice"}).json()
    q = gateway.get(first["id"])
    wait_until(lambda: q.pages_received >= gateway.options.buffer_pages, "the first pages")
    time.sleep(0.5)  # the worker would send more now if it were not held back
    assert len(q.pages) <= gateway.options.buffer_pages and not q.done.is_set()
    doc, rows = first, [r[0] for r in first.get("data", [])]  # the first answer may carry a page already
    while "nextUri" in doc:
        doc = client.get(doc["nextUri"], headers={"X-Trino-User": "alice"}).json()
        rows += [r[0] for r in doc.get("data", [])]
        assert len(q.pages) <= gateway.options.buffer_pages + 1
    assert rows == list(range(n)) and doc["stats"]["state"] == "FINISHED"


@pytest.mark.skipif(not hasattr(os, "kill"), reason="needs kill")
def test_a_killed_worker_is_replaced_and_its_query_retried(hostile, wait_until):
    gateway, client, _, _ = hostile
    first = client.post("/v1/statement", content=b"SELECT count(*) FROM range(400000000) t(i) WHERE i % 7 = 3",
                        headers={"X-Trino-User": "alice", "X-Trino-Client-Tags": "high"}).json()
    q = gateway.get(first["id"])
    wait_until(lambda: q.attempts and q.attempts[-1].get("status") == "running", "the attempt to start")
    victim = q.attempts[-1]["cluster_id"]
    pid = next(info.pid for info in gateway.pool.clusters() if info.cluster_id == victim)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: len(q.attempts) >= 2 or q.done.is_set(), "the attempt to be retried")
    assert q.attempts[0]["cluster_id"] == victim and q.attempts[1]["cluster_id"] != victim
    wait_until(lambda: sum(c["ready"] for c in gateway.status()["clusters"]) == 2, "a replacement", timeout_s=10)
    assert time.monotonic() - killed < 10
    assert gateway.status()["restarts"][-1]["cluster_id"] == victim
    _serves_next(client)


def test_sloctl_gateway_refuses_a_public_address_without_authentication_and_tls(tpch_db, tmp_path):
    from typer.testing import CliRunner

    from sloctl.cli import app

    runner = CliRunner()
    public = runner.invoke(app, ["gateway", "--db", str(tpch_db), "--host", "0.0.0.0"])
    assert public.exit_code == 2 and "--host" in public.output and "authentication" in public.output
    lonely = runner.invoke(app, ["gateway", "--db", str(tpch_db), "--admin-user", "root"])
    assert lonely.exit_code == 2 and "--admin-user" in lonely.output
    half = runner.invoke(app, ["gateway", "--db", str(tpch_db), "--tls-cert", str(tpch_db)])
    assert half.exit_code == 2 and "--tls-key" in half.output
    (tmp_path / "users.txt").write_text("alice:not-a-hash\n")
    broken = runner.invoke(app, ["gateway", "--db", str(tpch_db), "--password-file", str(tmp_path / "users.txt")])
    assert broken.exit_code == 2 and "--password-file" in broken.output


@pytest.mark.slow
def test_sloctl_gateway_over_tls_with_passwords_drains_on_sigterm(tpch_db, tmp_path, monkeypatch):
    """The CLI end to end: TLS, Basic auth through the trino client, then SIGTERM drains and writes the log."""
    # requests lets these variables override a session's own `verify` (the trino client sets that)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    import json
    import ssl
    import subprocess
    import sys

    import httpx
    import trino

    from sloctl.datasets.querylog import read_log
    from sloctl.serving.gateway.auth import self_signed_cert, set_password
    from sloctl.serving.local import free_port

    cert, key = self_signed_cert(tmp_path)
    set_password(tmp_path / "users.txt", "alice", "s3cret-pass")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sloctl.cli", "gateway", "--db", str(tpch_db), "--port", str(port),
                             "--router", "least-queued", "--log-dir", str(tmp_path / "logs"), "--json",
                             "--password-file", str(tmp_path / "users.txt"), "--admin-user", "alice",
                             "--tls-cert", str(cert), "--tls-key", str(key), "--drain-grace-s", "1"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        state = json.loads(proc.stdout.readline())
        assert state["url"] == f"https://127.0.0.1:{port}"
        conn = trino.dbapi.connect(host="127.0.0.1", port=port, user="alice", http_scheme="https", verify=str(cert),
                                   auth=trino.auth.BasicAuthentication("alice", "s3cret-pass"))
        cur = conn.cursor()
        cur.execute("SELECT count(*) FROM nation")
        assert cur.fetchall() == [[25]]
        trust = ssl.create_default_context(cafile=cert)
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=trust) as client:
            anonymous = client.post("/v1/statement", content=b"SELECT 1", headers={"X-Trino-User": "alice"})
            assert anonymous.status_code == 401 and "Basic" in anonymous.headers["www-authenticate"]
            wrong = client.post("/v1/statement", content=b"SELECT 1", auth=("alice", "guess"))
            assert wrong.status_code == 401
            first = client.post("/v1/statement", content=LONG_SQL.encode(), auth=("alice", "s3cret-pass")).json()
            time.sleep(1.0)
            proc.send_signal(signal.SIGTERM)
            doc = first
            while "nextUri" in doc:  # pages are still served while the gateway drains
                doc = client.get(doc["nextUri"], auth=("alice", "s3cret-pass")).json()
            assert doc["error"]["errorName"] == "SERVER_SHUTTING_DOWN"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert "drained (0 finished, 1 cancelled)" in err, err
    log = read_log(next((tmp_path / "logs").glob("gateway-*.parquet")))
    assert len(log) == 2 and (log["error"] != "").sum() == 1  # the cut attempt is in the log too


@pytest.mark.slow
def test_lineitem_at_sf1_streams_through_the_gateway_in_bounded_memory(tmp_path):
    """Issue 33: the whole of lineitem at SF 1 either completes with the gateway's RSS up by <= 200 MB and the
    worker under its memory_limit, or fails with EXCEEDED_LOCAL_MEMORY_LIMIT while both clusters go on."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gateway_memory.py"
    out = subprocess.run([sys.executable, str(bench), "--sf", "1", "--data-dir", str(tmp_path),
                          "--memory-limit", "1GB", "--json"], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["next_queries_ok"] == "4/4"
    if result["error"] is None:
        assert result["rows"] == 6_001_215 and result["gateway_growth_mb"] <= 200
        assert result["worker_peak_mb"] < 1024
    else:
        assert result["error"] == "EXCEEDED_LOCAL_MEMORY_LIMIT"
