"""TrinoClusterPool against a coordinator that speaks Trino's client protocol: sloctl's own SLO gateway."""

from __future__ import annotations

import datetime
import decimal
import itertools
import threading
import time

import pytest
from fastapi import Request  # module level: FastAPI resolves the handlers' string annotations here

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.pool import CANCELLED, QueryRequest, RawPage
from sloctl.datasets.trino_pool import TrinoBackend, TrinoClusterPool

#: Runs for many seconds on SF 0.01: something to cancel (tests/serving/test_gateway.py).
LONG_SQL = "SELECT count(*) FROM range(5000000000) t(i) WHERE i % 7 = 3"
#: Runs for a fraction of a second: something to overlap.
MEDIUM_SQL = "SELECT count(*) FROM range(150000000) t(i) WHERE i % 7 = 3"

_ids = itertools.count(1)


class _Results:
    """A pool's completions, gathered by query id (tests share one pool)."""

    def __init__(self, pool: TrinoClusterPool) -> None:
        self.pool = pool
        self.seen = {}

    def wait(self, query_id: int, timeout_s: float = 60.0):
        deadline = time.monotonic() + timeout_s
        while query_id not in self.seen:
            assert time.monotonic() < deadline, f"query {query_id} did not complete within {timeout_s} s"
            for done in self.pool.completions(timeout_s=0.1):
                self.seen[done.query_id] = done
        return self.seen.pop(query_id)

    def run(self, sql: str, cluster_id: str = "t1", **fields):
        query_id = next(_ids)
        fields.setdefault("headers", {"X-Trino-User": "tester"})
        self.pool.submit(cluster_id, QueryRequest(query_id, sql, **fields))
        return self.wait(query_id)


@pytest.fixture(scope="module")
def coordinator(tpch_db, tmp_path_factory):
    """The stand-in coordinator: a gateway on two size-1 DuckDB clusters, served on loopback."""
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    gateway = Gateway(
        tpch_db,
        GatewayOptions(
            cluster_sizes=(1, 1),
            router="least-queued",
            log_dir=tmp_path_factory.mktemp("trino-pool-logs"),
            scratch_memory_limit="32MB",
        ),
    ).start()
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, f"http://127.0.0.1:{client.base_url.port}"
    finally:
        gateway.close()


@pytest.fixture(scope="module")
def pool(coordinator):
    _, url = coordinator
    with TrinoClusterPool({"t1": TrinoBackend(url, size=1, user="tester", max_running=4)}) as pool:
        assert pool.spin_up(1, cluster_id="t1") == "t1"
        pool.wait_ready("t1", timeout_s=30)
        yield pool, _Results(pool)


def _idle(gateway) -> bool:
    return all(c["running"] == 0 for c in gateway.status()["clusters"])


def _cancel_everything(gateway) -> None:
    for query_id, q in list(gateway.queries.items()):
        if not q.done.is_set():
            gateway.cancel(query_id)


def _duckdb_rows(db, sql):
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return [list(row) for row in con.execute(sql).fetchall()]
    finally:
        con.close()


def _typed(value, kind: str):
    """A Trino JSON value as DuckDB's Python client gives it (the types TPC-H answers in)."""
    if value is None:
        return None
    if kind.startswith("decimal"):
        return decimal.Decimal(value)
    if kind == "date":
        return datetime.date.fromisoformat(value)
    return value


def test_spin_up_attaches_the_coordinator_once_it_has_started(pool, coordinator):
    pool, _ = pool
    (info,) = pool.clusters()
    assert info.cluster_id == "t1" and info.state == "ready" and info.size == 1 and info.pid is None
    assert info.requested_s <= info.ready_s <= time.monotonic()
    with pytest.raises(ClusterPoolError, match="'cluster_id' 't1' is already in use"):
        pool.spin_up(1, cluster_id="t1")
    with pytest.raises(ClusterPoolError, match="'size' parameter must be 1 for Trino backend 't1'"):
        pool.spin_up(2, cluster_id="t1")
    with pytest.raises(ClusterPoolError, match="'cluster_id' parameter must name a configured Trino backend"):
        pool.spin_up(1, cluster_id="elsewhere")
    with pytest.raises(ClusterPoolError, match="free Trino backend of size 1"):
        pool.spin_up(1)


def test_backends_are_validated_naming_the_field(coordinator):
    _, url = coordinator
    with pytest.raises(ClusterPoolError, match=r"'backends\['x'\].url' parameter must be a coordinator's base URL"):
        TrinoClusterPool({"x": TrinoBackend("localhost:8080", size=1)})
    with pytest.raises(ClusterPoolError, match=r"'backends\['x'\].max_running' parameter must be an integer >= 1"):
        TrinoClusterPool({"x": TrinoBackend(url, size=1, max_running=0)})
    with pytest.raises(ClusterPoolError, match=r"'backends\['x'\]' parameter must hold TrinoBackend's fields"):
        TrinoClusterPool({"x": {"url": url, "size": 1, "port": 8080}})
    with pytest.raises(ClusterPoolError, match="'backends' parameter must map cluster ids"):
        TrinoClusterPool({})
    configured = TrinoClusterPool({"x": {"url": url, "size": 2}})  # as a configuration file holds it
    assert configured.backends["x"] == TrinoBackend(url, size=2)
    configured.close()


def test_a_coordinator_that_never_answers_fails_to_start():
    from sloctl.serving.local import free_port

    backend = TrinoBackend(
        f"http://127.0.0.1:{free_port()}", size=1, start_timeout_s=0.5, poll_interval_s=0.1, connect_timeout_s=0.5
    )
    with TrinoClusterPool({"gone": backend}) as pool:
        pool.spin_up(1)
        with pytest.raises(ClusterPoolError, match="failed to start.*did not start within 0.5 s"):
            pool.wait_ready("gone", timeout_s=10)
        assert pool.clusters()[0].state == "failed"
        with pytest.raises(ClusterPoolError, match="is failed; queries need a ready cluster"):
            pool.submit("gone", QueryRequest(1, "SELECT 1"))


def test_requests_are_checked_before_they_leave(pool):
    pool, _ = pool
    with pytest.raises(ClusterPoolError, match="'fetch' and 'stream' parameters"):
        pool.submit("t1", QueryRequest(1, "SELECT 1", fetch=True, stream=True))
    with pytest.raises(ClusterPoolError, match="'headers' parameter must hold the client's X-Trino-\\* headers only"):
        pool.submit("t1", QueryRequest(1, "SELECT 1", headers={"Authorization": "Basic eA=="}))
    with pytest.raises(ClusterPoolError, match="'pages' parameter of credit"):
        pool.credit("t1", 1, 0)
    with pytest.raises(ClusterPoolError, match="Unknown cluster 'nope'"):
        pool.submit("nope", QueryRequest(1, "SELECT 1"))


def test_all_22_tpch_queries_return_the_rows_duckdb_returns(pool, tpch_db, tpch_templates):
    _, results = pool
    for template in tpch_templates:
        done = results.run(template.sql, fetch=True)
        assert done.status == "ok", (template.name, done.error)
        kinds = [kind for _, kind in done.columns]
        got = [[_typed(v, k) for v, k in zip(row, kinds, strict=True)] for row in done.data]
        assert got == _duckdb_rows(tpch_db, template.sql), template.name
        assert done.rows == len(done.data) and done.start_s <= done.end_s


def test_columns_carry_trinos_type_names_and_rows_its_json(pool, tpch_templates):
    _, results = pool
    q3 = next(t.sql for t in tpch_templates if t.name == "tpch-q03")
    kinds = dict(results.run(q3, fetch=True).columns)
    assert kinds["l_orderkey"] == "bigint" and kinds["o_orderdate"] == "date"
    assert kinds["revenue"].startswith("decimal(")
    done = results.run(
        "SELECT 1.5::DOUBLE AS x, TRUE AS b, 'ab' AS s, DATE '2024-03-01' AS d, 42::BIGINT AS n, "
        "12.50::DECIMAL(10,2) AS m, NULL::INTEGER AS missing",
        fetch=True,
    )
    assert done.columns == (
        ("x", "double"),
        ("b", "boolean"),
        ("s", "varchar"),
        ("d", "date"),
        ("n", "bigint"),
        ("m", "decimal(10,2)"),
        ("missing", "integer"),
    )
    assert done.data == [[1.5, True, "ab", "2024-03-01", 42, "12.50", None]]


def test_a_stream_fetches_the_next_page_only_when_credited(pool, coordinator):
    gateway, _ = coordinator
    pool, results = pool
    n = 3 * gateway.options.page_rows + 7
    pages, arrived = [], threading.Event()

    def on_page(columns, page):
        pages.append((columns, page))
        arrived.set()

    query_id = next(_ids)
    pool.submit(
        "t1",
        QueryRequest(
            query_id,
            f"SELECT i FROM range({n}) t(i) ORDER BY i",
            stream=True,
            buffer_pages=1,
            raw_pages=True,
            on_page=on_page,
            headers={"X-Trino-User": "tester"},
        ),
    )
    for expected in range(1, 5):
        assert arrived.wait(30), f"page {expected} did not arrive"
        arrived.clear()
        time.sleep(0.3)  # time enough to fetch another page, were it allowed to
        assert len(pages) == expected
        pool.credit("t1", query_id)
    done = results.wait(query_id)
    assert done.status == "ok" and done.rows == n and done.data is None
    assert done.columns == (("i", "bigint"),) and all(columns == done.columns for columns, _ in pages)
    assert all(isinstance(page, RawPage) for _, page in pages)
    assert [row[0] for _, page in pages for row in page.rows()] == list(range(n))


def test_the_clients_headers_go_along_and_session_changes_come_back(pool, coordinator):
    gateway, _ = coordinator
    _, results = pool
    cat = gateway.catalog.name
    scoped = {
        "X-Trino-User": "alice",
        "X-Trino-Catalog": cat,
        "X-Trino-Schema": "information_schema",
        "X-Trino-Session": "template=my-template",
        "X-Trino-Client-Tags": "high",
    }
    sql = "SELECT table_name FROM tables WHERE table_name = 'lineitem'"
    assert results.run(sql, fetch=True, headers=scoped).data == [["lineitem"]]  # the schema came along
    (q,) = [q for q in gateway.queries.values() if q.text == sql]
    assert (q.user, q.klass, q.template) == ("alice", "high", "my-template")

    done = results.run("SET SESSION slo_s = 5", fetch=True)
    assert done.status == "ok" and done.response_headers == {"X-Trino-Set-Session": "slo_s=5"}
    done = results.run(f"USE {cat}.information_schema", fetch=True)
    assert done.response_headers == {"X-Trino-Set-Catalog": cat, "X-Trino-Set-Schema": "information_schema"}
    added = results.run("PREPARE p1 FROM SELECT ? + 1", fetch=True).response_headers["X-Trino-Added-Prepare"]
    prepared = {"X-Trino-User": "tester", "X-Trino-Prepared-Statement": added}
    assert results.run("EXECUTE p1 USING 41", fetch=True, headers=prepared).data == [[42]]
    done = results.run("DEALLOCATE PREPARE p1", fetch=True, headers=prepared)
    assert done.response_headers == {"X-Trino-Deallocated-Prepare": "p1"}
    assert results.run("SELECT 1", fetch=True).response_headers is None  # nothing changed: nothing to carry


def test_a_trino_error_comes_back_with_its_name_code_and_type(pool):
    from sloctl.serving.gateway.trino import ERRORS

    pool, results = pool
    done = results.run("SELECT no_such_column FROM nation", fetch=True)
    assert done.status == "error" and done.error.startswith("COLUMN_NOT_FOUND: ") and "no_such_column" in done.error
    assert done.trino_error["errorName"] == "COLUMN_NOT_FOUND"
    assert (done.trino_error["errorCode"], done.trino_error["errorType"]) == ERRORS["COLUMN_NOT_FOUND"]
    assert done.columns is None and done.data is None
    refused = results.run("SELECT 1", fetch=True, headers={"X-Trino-User": "u", "X-Trino-Prepared-Statement": "x"})
    assert refused.status == "error" and "HTTP 400" in refused.error and "Prepared-Statement" in refused.error
    assert pool.clusters()[0].state == "ready"  # the query's fault, not the coordinator's


def test_a_consumer_that_raises_stops_its_query(pool):
    _, results = pool

    def on_page(columns, rows):
        raise RuntimeError("no room")

    done = results.run("SELECT i FROM range(10) t(i)", stream=True, on_page=on_page)
    assert done.status == "error" and done.error == "on_page raised RuntimeError: no room"


def test_a_page_larger_than_the_bound_fails_its_query(coordinator):
    _, url = coordinator
    with TrinoClusterPool({"small": TrinoBackend(url, size=1, user="tester", max_page_bytes=512)}) as pool:
        pool.spin_up(1)
        pool.wait_ready("small", timeout_s=30)
        done = _Results(pool).run("SELECT i FROM range(3000) t(i)", cluster_id="small", fetch=True)
        assert done.status == "error" and "max_page_bytes" in done.error
        assert pool.clusters()[0].state == "ready"


def test_cancel_deletes_the_query_on_the_coordinator(pool, coordinator, wait_until):
    gateway, _ = coordinator
    pool, results = pool
    query_id = next(_ids)
    pool.submit("t1", QueryRequest(query_id, LONG_SQL, stream=True, headers={"X-Trino-User": "tester"}))
    wait_until(lambda: not _idle(gateway), "the query to run on the coordinator's cluster", 30)
    asked = time.monotonic()
    pool.cancel("t1", query_id)
    done = results.wait(query_id, timeout_s=15)
    assert done.status == "error" and done.error == CANCELLED and done.end_s - asked < 5
    wait_until(lambda: _idle(gateway), "the coordinator to stop the query", 30)
    pool.cancel("t1", query_id)  # already over: left alone


def test_a_timeout_cancels_the_query_there_and_ends_as_timeout(pool, coordinator, wait_until):
    gateway, _ = coordinator
    _, results = pool
    started = time.monotonic()
    done = results.run(LONG_SQL, fetch=True, timeout_s=1.5)
    assert done.status == "timeout" and 1.0 < done.end_s - done.start_s < 5 and done.end_s - started >= 1.5
    wait_until(lambda: _idle(gateway), "the coordinator to stop the query", 30)


def test_attempts_overlap_up_to_max_running_and_queue_beyond(coordinator, pool, wait_until):
    gateway, url = coordinator
    _, results = pool
    first, second = next(_ids), next(_ids)
    for query_id in (first, second):  # two long queries, both running on the coordinator before either is stopped
        results.pool.submit("t1", QueryRequest(query_id, LONG_SQL, fetch=True, headers={"X-Trino-User": "tester"}))
    wait_until(lambda: sum(c["running"] for c in gateway.status()["clusters"]) == 2, "both queries to run", 30)
    for query_id in (first, second):
        results.pool.cancel("t1", query_id)
    a, b = results.wait(first), results.wait(second)
    assert a.status == b.status == "error" and a.error == b.error == CANCELLED
    assert a.start_s < b.end_s and b.start_s < a.end_s  # both ran at once, on this process's clock

    with TrinoClusterPool({"one": TrinoBackend(url, size=1, user="tester", max_running=1)}) as single:
        single.spin_up(1)
        single.wait_ready("one", timeout_s=30)
        queued = _Results(single)
        first, second, third = next(_ids), next(_ids), next(_ids)
        for query_id, sql, timeout in ((first, MEDIUM_SQL, None), (second, MEDIUM_SQL, None), (third, "SELECT 1", 0.2)):
            single.submit("one", QueryRequest(query_id, sql, fetch=True, timeout_s=timeout))
        assert single.health("one")["queued"] >= 1
        late = queued.wait(third)  # waited for a slot past its timeout: never forwarded
        assert late.status == "timeout" and late.start_s == late.end_s
        a, b = queued.wait(first), queued.wait(second)
        assert a.status == b.status == "ok" and b.start_s >= a.end_s  # one at a time
    wait_until(lambda: _idle(gateway), "the coordinator to be idle", 30)


def test_tear_down_cancels_what_runs_there_and_the_coordinator_may_be_attached_again(coordinator, wait_until):
    gateway, url = coordinator
    with TrinoClusterPool({"t2": TrinoBackend(url, size=1, user="tester")}) as pool:
        pool.spin_up(1)
        pool.wait_ready("t2", timeout_s=30)
        query_id = next(_ids)
        pool.submit("t2", QueryRequest(query_id, LONG_SQL, stream=True, buffer_pages=1))
        wait_until(lambda: not _idle(gateway), "the query to run on the coordinator's cluster", 30)
        pool.tear_down("t2")
        done = _Results(pool).wait(query_id, timeout_s=15)
        assert done.status == "error" and "torn down" in done.error
        assert pool.clusters()[0].state == "stopped"
        wait_until(lambda: _idle(gateway), "the coordinator to stop the query", 30)
        assert pool.spin_up(1) == "t2"  # a torn-down backend is free again
        assert pool.wait_ready("t2", timeout_s=30).state == "ready"
        assert _Results(pool).run("SELECT 7", cluster_id="t2", fetch=True).data == [[7]]


def test_health_reports_the_coordinator(pool):
    pool, _ = pool
    health = pool.health("t1")
    assert health["ok"] is True and health["starting"] is False and health["error"] == ""
    assert 0 < health["latency_s"] < 5 and health["state"] == "ready"
    assert {"running", "queued"} <= set(health)


def test_explain_is_none_when_the_coordinator_cannot_plan(pool):
    pool, _ = pool
    # the stand-in plans DuckDB's way: it refuses Trino's `EXPLAIN (FORMAT JSON)` as a syntax error
    assert pool.explain("t1", "SELECT count(*) FROM nation", timeout_s=10) is None
    assert pool.explain("t1", "SELECT no_such_column FROM nation", timeout_s=10) is None
    with pytest.raises(ClusterPoolError, match="'timeout_s' parameter of explain"):
        pool.explain("t1", "SELECT 1", timeout_s=0)


@pytest.fixture
def scripted():
    """A coordinator that answers as a real Trino does where the stand-in cannot: it starts slowly, answers one
    503, and plans `EXPLAIN (FORMAT JSON)` into one `Query Plan` row. ``state`` says what it was asked."""
    from fastapi import FastAPI, Response

    from sloctl.serving.local import LocalServer

    app = FastAPI()
    state = {"info": 0, "info_status": 200, "posts": [], "polls": 0}

    @app.get("/readyz")
    def readyz():
        return {"ready": True}

    @app.get("/v1/info")
    def info():
        state["info"] += 1
        if state["info_status"] != 200:
            return Response(status_code=state["info_status"])
        return {"coordinator": True, "starting": state["info"] < 3}

    @app.post("/v1/statement")
    async def statement(request: Request):
        state["posts"].append(((await request.body()).decode(), request.headers.get("x-trino-user")))
        if len(state["posts"]) == 1:
            return Response(status_code=503)  # Trino's clients try again
        return {
            "id": "q1",
            "nextUri": f"{str(request.base_url).rstrip('/')}/v1/statement/executing/q1/s/1",
            "stats": {"state": "QUEUED"},
        }

    @app.get("/v1/statement/executing/q1/s/1")
    def page():
        state["polls"] += 1
        return {
            "id": "q1",
            "columns": [{"name": "Query Plan", "type": "varchar"}],
            "data": [['{"0": {}}']],
            "stats": {"state": "FINISHED"},
        }

    with LocalServer(app) as client:
        yield f"http://127.0.0.1:{client.base_url.port}", state


def test_a_trino_shaped_coordinator_starts_retries_plans_and_fails_its_health_checks(scripted):
    url, state = scripted
    with TrinoClusterPool({"s": TrinoBackend(url, size=1, poll_interval_s=0.05, health_failures=2)}) as pool:
        pool.spin_up(1)
        assert pool.wait_ready("s", timeout_s=10).state == "ready" and state["info"] == 3  # said "starting" twice
        assert pool.explain("s", "SELECT 1", timeout_s=10) == '{"0": {}}'
        assert state["posts"] == [("EXPLAIN (FORMAT JSON) SELECT 1", "sloctl")] * 2 and state["polls"] == 1
        state["info_status"] = 500
        assert pool.health("s")["ok"] is False and pool.clusters()[0].state == "ready"  # once may be a blip
        health = pool.health("s")
        assert health["state"] == "failed" and "HTTP 500" in health["error"]
        assert "failed 2 health check(s) in a row" in pool.clusters()[0].failure


def test_a_coordinator_that_stops_mid_query_fails_its_cluster(coordinator, wait_until):
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    gateway, _ = coordinator
    server = LocalServer(create_gateway_app(gateway))
    client = server.__enter__()
    try:
        backend = TrinoBackend(
            f"http://127.0.0.1:{client.base_url.port}", size=1, user="tester", retries=2, connect_timeout_s=1.0
        )
        with TrinoClusterPool({"doomed": backend}) as pool:
            pool.spin_up(1)
            pool.wait_ready("doomed", timeout_s=30)
            query_id = next(_ids)
            pool.submit("doomed", QueryRequest(query_id, LONG_SQL, fetch=True))
            wait_until(lambda: not _idle(gateway), "the query to run on the coordinator's cluster", 30)
            server.__exit__()
            done = _Results(pool).wait(query_id, timeout_s=30)
            assert done.status == "error" and "stopped" in done.error
            (info,) = pool.clusters()
            assert info.state == "failed" and "stopped answering" in info.failure
            health = pool.health("doomed")
            assert health["ok"] is False and health["starting"] is None and health["error"]
            with pytest.raises(ClusterPoolError, match="is failed"):
                pool.submit("doomed", QueryRequest(next(_ids), "SELECT 1"))
            pool.tear_down("doomed")
            assert pool.clusters()[0].state == "stopped"
    finally:
        if server.thread.is_alive():
            server.__exit__()
        _cancel_everything(gateway)
        wait_until(lambda: _idle(gateway), "the coordinator's clusters to be idle", 30)
