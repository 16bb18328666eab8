"""The gateway against a determined stranger (issue 51): planning off the event loop, per-user caps, byte bounds.

A stranger here holds no special access: it sends texts chosen to be slow
to parse, posts hundreds of queries it never reads, and asks for results
whose single values are hundreds of megabytes. The gateway must keep
serving everyone else, `/healthz` first, hold its memory by bytes, and
account for every query. The clients are the `trino` DB-API client and
plain HTTP (the Trino client REST protocol, as Trino's docs describe it).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

pytest.importorskip("trino")


def _sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _rss_mb(pid: int | None = None) -> float:
    with open(f"/proc/{pid or os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def stranger(tpch_db, tmp_path_factory):
    """A gateway with small per-user caps (2 running, 3 queued) and small result buffers, on loopback."""
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.gateway.policy import GatewayPolicy
    from sloctl.serving.local import LocalServer

    log_dir = tmp_path_factory.mktemp("gateway-logs")
    policy = GatewayPolicy(max_run_time_s=20.0, client_timeout_s=30.0, user_max_running=2, user_max_queued=3)
    options = GatewayOptions(cluster_sizes=(1, 1), router="least-queued", log_dir=log_dir, policy=policy,
                             worker_memory_limit="1GB", buffer_bytes=4 << 20, user_buffer_bytes=8 << 20,
                             plan_timeout_s=2.0)
    before, files = _sha256(tpch_db), set(tpch_db.parent.iterdir())
    gateway = Gateway(tpch_db, options).start()
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, client, log_dir
    finally:
        gateway.close()
    assert _sha256(tpch_db) == before, "the warehouse file changed"
    assert set(tpch_db.parent.iterdir()) <= files, "a file appeared beside the warehouse"


def _connect(client, user: str):
    import trino

    return trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), user=user).cursor()


def _serves_next(client, user: str = "alice") -> None:
    cur = _connect(client, user)
    cur.execute("SELECT count(*) FROM nation")
    assert cur.fetchall() == [[25]]


def _post(client, sql: str, user: str) -> dict:
    answer = client.post("/v1/statement", content=sql.encode(), headers={"X-Trino-User": user})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _final(client, doc: dict, user: str) -> dict:
    while "nextUri" in doc:
        doc = client.get(doc["nextUri"], headers={"X-Trino-User": user}).json()
    return doc


class HealthProbe:
    """Polls ``/healthz`` on its own connection every 20 ms and keeps the slowest answer's time."""

    def __init__(self, client) -> None:
        import httpx

        self.http = httpx.Client(base_url=str(client.base_url), timeout=30.0)
        self.worst_s = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            assert self.http.get("/healthz").status_code == 200
            self.worst_s = max(self.worst_s, time.perf_counter() - t)
            self.answers += 1
            time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self.http.get("/healthz")
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(5)
        self.http.close()


def _in_list(n_bytes: int) -> str:
    values, size, i = [], 0, 0
    while size < n_bytes:
        item = str(1_000_000 + i)
        values.append(item)
        size += len(item) + 1
        i += 1
    return f"SELECT count(*) FROM lineitem WHERE l_orderkey IN ({','.join(values)})"


def test_healthz_answers_while_hostile_texts_are_planned_or_refused(stranger):
    """Slow-to-parse texts run in planner processes: the event loop keeps answering within 100 ms."""
    gateway, client, _ = stranger
    hostile = [
        _in_list(990_000),  # a 1 MB IN list (just under max_query_length): seconds of sqlglot work
        "SELECT " + "(" * 1000 + "1" + ")" * 1000,  # deep nesting
        "SELECT " + " + ".join(["1"] * 60_000),  # a long arithmetic chain
        "PREPARE p FROM " + " " * 20_000 + "SELECT 1" + " ;" * 20_000 + " x",
        "EXECUTE IMMEDIATE '" + "''" * 30_000 + "' USING " + "1, " * 10_000,
        "SET SESSION slo_s = " + "'" * 50_000,
    ]
    with HealthProbe(client) as probe:
        for sql in hostile:
            t = time.monotonic()
            doc = _final(client, _post(client, sql, "mallory"), "mallory")
            assert time.monotonic() - t < gateway.options.plan_timeout_s + 3.0
            if "error" in doc:  # refused with a Trino error, never a 500 or a traceback
                assert doc["error"]["errorName"] and doc["error"]["message"]
    assert probe.answers >= 10
    assert probe.worst_s < 0.1, f"/healthz took {probe.worst_s * 1000:.0f} ms while hostile texts were planned"
    _serves_next(client)


def test_a_text_past_the_planning_budget_fails_and_the_planner_is_replaced(stranger):
    gateway, client, _ = stranger
    before = gateway.planner.status()
    doc = _final(client, _post(client, _in_list(4 << 20)[:900_000] + ")", "mallory"), "mallory")
    assert doc["error"]["errorName"] in ("EXCEEDED_TIME_LIMIT", "QUERY_TEXT_TOO_LARGE", "SYNTAX_ERROR")
    after = gateway.planner.status()
    if doc["error"]["errorName"] == "EXCEEDED_TIME_LIMIT":
        assert after["timed_out"] == before["timed_out"] + 1 and after["replaced"] == before["replaced"] + 1
    _serves_next(client)


def test_a_users_running_and_queued_queries_are_capped(stranger, wait_until):
    """Queries posted and never read hold their user's running slots; past running + queued they are refused."""
    gateway, client, _ = stranger
    big = "SELECT l_comment FROM lineitem"  # more pages than a query may hold: its worker waits for the reader
    docs = [_post(client, big, "mallory") for _ in range(300)]
    states = [gateway.get(d["id"]) for d in docs]
    refused = [q for q in states if q.error is not None and q.error.name == "QUERY_QUEUE_FULL"]
    assert len(refused) == 300 - 2 - 3
    assert sum(c["running"] for c in gateway.status()["clusters"]) <= 2  # the workers hold 2 of them, not 300
    assert "user_max_running 2" in refused[0].error.message and "user_max_queued 3" in refused[0].error.message
    assert sum(q.user_slot for q in states) == 2
    assert sum(len(w) for w in gateway.user_waiting.values()) == 3
    _serves_next(client, "alice")  # another user is not held back by mallory's caps
    # reading one of mallory's results to the end lets one waiting query start
    first = next(d for d, q in zip(docs, states, strict=True) if q.user_slot)
    assert _final(client, first, "mallory")["stats"]["state"] == "FINISHED"
    wait_until(lambda: sum(len(w) for w in gateway.user_waiting.values()) == 2, "a waiting query to start")
    for d in docs:  # DELETE frees each query: running, waiting or finished with unread pages
        client.delete(d["nextUri"], headers={"X-Trino-User": "mallory"}) if "nextUri" in d else None
    wait_until(lambda: not gateway.user_running and not gateway.user_waiting, "every slot to be free")
    wait_until(lambda: not gateway.user_bytes, "every held page to be freed")
    assert all(q.done.is_set() for q in states)
    _serves_next(client, "mallory")


def test_a_value_larger_than_a_page_fails_the_query_and_the_gateway_stays_small(stranger):
    """A single 200 MB value never reaches the gateway: its worker cuts pages by bytes and refuses it."""
    gateway, client, _ = stranger
    base = _rss_mb()
    doc = _final(client, _post(client, "SELECT repeat('x', 200000000) AS v", "mallory"), "mallory")
    assert doc["error"]["errorName"] == "EXCEEDED_LOCAL_MEMORY_LIMIT"
    assert str(gateway.page_bytes) in doc["error"]["message"] or "memory" in doc["error"]["message"]
    q = gateway.get(doc["id"])
    assert len(q.attempts) == 1  # the query's own fault: not retried on the other cluster
    assert _rss_mb() - base < 50, "the gateway's memory grew with the value"
    _serves_next(client)


def test_held_result_bytes_are_bounded_per_query(stranger, wait_until):
    gateway, client, _ = stranger
    doc = _post(client, "SELECT l_comment, l_shipinstruct FROM lineitem", "bob")
    q = gateway.get(doc["id"])
    wait_until(lambda: q.pages_received >= 1, "the first pages")
    time.sleep(0.5)  # the worker would send more now if it were not held back
    assert q.held_bytes <= gateway.options.buffer_bytes
    assert all(len(p.json) <= gateway.page_bytes for p in q.pages.values())
    client.delete(doc["nextUri"], headers={"X-Trino-User": "bob"})
    wait_until(lambda: q.done.is_set() and q.held_bytes == 0, "DELETE to free the pages")


def test_a_bad_session_property_is_a_trino_error_not_a_bare_400(stranger):
    _, client, _ = stranger
    answer = client.post("/v1/statement", content=b"SELECT 1",
                         headers={"X-Trino-User": "alice", "X-Trino-Session": "slo_s=abc"})
    assert answer.status_code == 200
    doc = _final(client, answer.json(), "alice")
    assert doc["error"]["errorName"] == "INVALID_SESSION_PROPERTY" and "slo_s" in doc["error"]["message"]
    _serves_next(client)
