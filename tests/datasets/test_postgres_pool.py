"""PostgresClusterPool on a real PostgreSQL server: TPC-H as DuckDB answers it, streams, timeouts, a dying server."""

from __future__ import annotations

import datetime
import decimal
import itertools
import json
import math
import threading
import time

import pytest

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.pg_dialect import statement_kind, trino_to_postgres
from sloctl.datasets.pool import CANCELLED, QueryRequest, RawPage
from sloctl.datasets.postgres_pool import (
    PostgresBackend,
    PostgresClusterPool,
    create_reader_role,
    postgres_plan_features,
)

#: A throw-away server without a statement log (the engine's default logs every statement).
QUIET = {"log_statement": "none", "log_min_duration_statement": "-1"}
_ids = itertools.count(1)


def start_engine():
    from sloctl.datasets.postgres_engine import PostgresEngine, PostgresUnavailable

    try:
        return PostgresEngine(settings=QUIET).start()
    except (PostgresUnavailable, RuntimeError, OSError) as exc:
        pytest.skip(f"no PostgreSQL server can start here: {exc}")


class Done:
    """``done(query_id)``: wait for that query's completion, keeping the others that arrive meanwhile."""

    def __init__(self, pool):
        self.pool, self.seen = pool, {}

    def __call__(self, query_id, timeout_s=30.0):
        deadline = time.monotonic() + timeout_s
        while query_id not in self.seen:
            assert time.monotonic() < deadline, f"no completion for query {query_id}"
            for done in self.pool.completions(timeout_s=0.1):
                self.seen[done.query_id] = done
        return self.seen.pop(query_id)


class Pages:
    """An ``on_page`` that keeps every page; with ``auto_credit`` it lets the next one come at once."""

    def __init__(self, pool=None, cluster_id=None, query_id=None, auto_credit=False):
        self.pool, self.cluster_id, self.query_id, self.auto_credit = pool, cluster_id, query_id, auto_credit
        self.pages = []
        self.lock = threading.Lock()

    def __call__(self, columns, rows):
        with self.lock:
            self.pages.append((columns, rows))
        if self.auto_credit:
            self.pool.credit(self.cluster_id, self.query_id)

    def count(self):
        with self.lock:
            return len(self.pages)


@pytest.fixture(scope="module")
def server():
    engine = start_engine()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def tpch_url(server, tpch_db):
    """TPC-H on the server, as a role that may only read it (the pool refuses the superuser)."""
    from sloctl.experiments.postgres_log import load_tpch

    url = server.create_database("tpch")
    return create_reader_role(url, "tpch_reader", None, list(load_tpch(url, tpch_db)))


@pytest.fixture(scope="module")
def pg(tpch_url):
    """``(pool, done)``: clusters ``c1`` (3 connections), ``one`` (1 connection) and ``spare`` on the TPC-H server."""
    backends = {
        "c1": PostgresBackend(tpch_url, size=2, pool_connections=3),
        "one": {"url": tpch_url, "size": 1, "pool_connections": 1},
        "spare": PostgresBackend(tpch_url, size=3, pool_connections=1),
    }
    with PostgresClusterPool(backends) as pool:
        for cluster_id in ("c1", "one"):
            pool.spin_up(pool.backends_[cluster_id].size, cluster_id=cluster_id)
        for cluster_id in ("c1", "one"):
            pool.wait_ready(cluster_id, timeout_s=30)
        yield pool, Done(pool)


def _same(pg_value, duck_value) -> bool:
    """One value through the pool (JSON) against DuckDB's Python value: decimals and dates by value, floats
    approximately (PostgreSQL's numeric average against DuckDB's double)."""
    if duck_value is None or pg_value is None:
        return duck_value is None and pg_value is None
    if isinstance(duck_value, float):
        return math.isclose(float(decimal.Decimal(str(pg_value))), duck_value, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(duck_value, decimal.Decimal | int) and not isinstance(duck_value, bool):
        return decimal.Decimal(str(pg_value)) == duck_value
    if isinstance(duck_value, datetime.date):
        return pg_value == duck_value.isoformat()
    return pg_value == duck_value


def _sort_key(row) -> list[str]:
    """The same key for a row through the pool and DuckDB's: numbers by value, the rest as text."""
    out = []
    for value in row:
        try:
            out.append(format(float(value), ".9g"))
        except (TypeError, ValueError):
            out.append(str(value))
    return out


def _rows_match(pg_rows, duck_rows) -> bool:
    return len(pg_rows) == len(duck_rows) and all(
        len(p) == len(d) and all(_same(a, b) for a, b in zip(p, d, strict=True))
        for p, d in zip(pg_rows, duck_rows, strict=True)
    )


def test_all_22_tpch_queries_give_the_rows_and_types_duckdb_gives(pg, tpch_db, tpch_templates):
    import duckdb

    pool, done = pg
    ids = {}
    for template in tpch_templates:
        ids[template.name] = query_id = next(_ids)
        pool.submit("c1", QueryRequest(query_id, trino_to_postgres(template.sql), timeout_s=60, fetch=True))
    con = duckdb.connect(str(tpch_db), read_only=True)
    compared_types = 0
    for template in tpch_templates:
        got = done(ids[template.name], timeout_s=60)
        assert got.status == "ok", (template.name, got.error)
        cur = con.execute(template.sql)
        want = cur.fetchall()
        want_types = [(d[0], str(d[1])) for d in cur.description]
        assert len(got.columns) == len(want_types), template.name
        # an unaliased expression is named by each engine its own way (sum(l_quantity) / sum); the gateway renames it
        assert all(p == d for (p, _), (d, _) in zip(got.columns, want_types, strict=True) if d.isidentifier())
        for (_, pg_type), (_, duck_type) in zip(got.columns, want_types, strict=True):
            # PostgreSQL's numeric arithmetic where DuckDB's is double, its bigint sum of integers where DuckDB's
            # is a HUGEINT, and extract(year), numeric since PostgreSQL 14
            if duck_type in ("DOUBLE", "HUGEINT") or (duck_type == "BIGINT" and pg_type == "DECIMAL(38,0)"):
                continue
            assert pg_type == duck_type, template.name
            compared_types += 1
        rows = got.data
        if "ORDER BY" not in template.sql.upper():
            rows, want = sorted(rows, key=_sort_key), sorted(want, key=_sort_key)
        assert got.rows == len(want) and _rows_match(rows, want), template.name
    assert compared_types > 60  # most columns have the very type DuckDB names


def test_values_and_columns_follow_the_duckdb_workers_conventions(pg, tpch_db):
    from sloctl.datasets.duckdb_pool import DuckDBClusterPool

    pool, done = pg
    pg_sql = (
        "SELECT 1::int4 AS i, 2::int8 AS b, 3::int2 AS s, 1.5::numeric(15,2) AS d, 0.25::float8 AS f, "
        "'x'::text AS v, DATE '1995-03-15' AS day, TIMESTAMP '1995-03-15 12:30:00' AS ts, true AS ok, "
        "'NaN'::float8 AS nan, 'Infinity'::float8 AS inf, '-Infinity'::float8 AS ninf, NULL::int4 AS nothing, "
        "INTERVAL '1 day 02:03:04.5' AS span, ARRAY[1, 2]::int4[] AS list, 0.5::float4 AS r"
    )
    duck_sql = (
        "SELECT 1::INTEGER AS i, 2::BIGINT AS b, 3::SMALLINT AS s, 1.5::DECIMAL(15,2) AS d, 0.25::DOUBLE AS f, "
        "'x'::VARCHAR AS v, DATE '1995-03-15' AS day, TIMESTAMP '1995-03-15 12:30:00' AS ts, true AS ok, "
        "'NaN'::DOUBLE AS nan, 'Infinity'::DOUBLE AS inf, '-Infinity'::DOUBLE AS ninf, "
        "NULL::INTEGER AS nothing, INTERVAL '1 day 02:03:04.5' AS span, [1, 2]::INTEGER[] AS list, 0.5::REAL AS r"
    )
    fetched, streamed = next(_ids), next(_ids)
    pg_pages = Pages(pool, "c1", streamed, auto_credit=True)
    pool.submit("c1", QueryRequest(fetched, pg_sql, fetch=True))
    pool.submit("c1", QueryRequest(streamed, pg_sql, stream=True, raw_pages=True, on_page=pg_pages))
    with DuckDBClusterPool(tpch_db, memory_limit="256MB") as duck:
        cid = duck.spin_up(1)
        duck.wait_ready(cid, timeout_s=60)
        duck_done = Done(duck)
        duck_pages = Pages(duck, cid, 2, auto_credit=True)
        duck.submit(cid, QueryRequest(1, duck_sql, fetch=True))
        duck.submit(cid, QueryRequest(2, duck_sql, stream=True, raw_pages=True, on_page=duck_pages))
        want, want_streamed = duck_done(1), duck_done(2)
    got, got_streamed = done(fetched), done(streamed)
    assert got.status == want.status == "ok"
    assert got.columns == want.columns
    assert got.data == want.data
    assert got.data[0][3:12] == [
        "1.50",
        0.25,
        "x",
        "1995-03-15",
        "1995-03-15 12:30:00",
        True,
        "NaN",
        "Infinity",
        "-Infinity",
    ]
    assert got_streamed.columns == want_streamed.columns == want.columns
    assert isinstance(pg_pages.pages[0][1], RawPage)
    assert pg_pages.pages[0][1].rows() == duck_pages.pages[0][1].rows() == want.data


def test_pages_arrive_in_order_as_raw_json(pg):
    pool, done = pg
    query_id = next(_ids)
    pages = Pages(pool, "c1", query_id, auto_credit=True)
    pool.submit(
        "c1",
        QueryRequest(
            query_id,
            "SELECT i, i::numeric(10,2) AS d FROM generate_series(0, 2499) i ORDER BY i",
            stream=True,
            page_rows=1000,
            buffer_pages=1,
            raw_pages=True,
            on_page=pages,
        ),
    )
    got = done(query_id)
    assert got.status == "ok" and got.rows == 2500 and got.data is None
    assert got.columns == (("i", "INTEGER"), ("d", "DECIMAL(10,2)"))
    assert [page.count for _, page in pages.pages] == [1000, 1000, 500]
    rows = [row for _, page in pages.pages for row in page.rows()]
    assert rows[0] == [0, "0.00"] and [r[0] for r in rows] == list(range(2500))
    assert all(columns == got.columns for columns, _ in pages.pages)


def test_a_stream_sends_no_more_than_its_credit(pg, wait_until):
    pool, done = pg
    query_id = next(_ids)
    pages = Pages()
    pool.submit(
        "c1",
        QueryRequest(
            query_id,
            "SELECT i FROM generate_series(1, 100) i",
            stream=True,
            page_rows=10,
            buffer_pages=2,
            on_page=pages,
        ),
    )
    wait_until(lambda: pages.count() == 2, "the first two pages")
    time.sleep(0.3)
    assert pages.count() == 2 and query_id not in done.seen and pool.completions(timeout_s=0.0) == []
    pool.credit("c1", query_id, pages=3)
    wait_until(lambda: pages.count() == 5, "three more pages")
    time.sleep(0.3)
    assert pages.count() == 5
    pool.credit("c1", query_id, pages=10)
    got = done(query_id)
    assert got.status == "ok" and got.rows == 100 and pages.count() == 10
    assert [row for _, page in pages.pages for row in page] == [[i] for i in range(1, 101)]


def test_statement_timeout_ends_as_a_censored_timeout(pg):
    pool, done = pg
    slow, starved = next(_ids), next(_ids)
    pool.submit("c1", QueryRequest(slow, "SELECT pg_sleep(5)", timeout_s=0.3))
    # a stream whose consumer never gives credit is held to the same deadline
    pool.submit(
        "c1",
        QueryRequest(
            starved,
            "SELECT i FROM generate_series(1, 100) i",
            timeout_s=0.5,
            stream=True,
            page_rows=10,
            buffer_pages=1,
            on_page=Pages(),
        ),
    )
    got, stuck = done(slow), done(starved)
    assert got.status == "timeout" and got.error == "" and 0.25 <= got.end_s - got.start_s < 2.0
    assert stuck.status == "timeout" and stuck.rows == 10 and 0.45 <= stuck.end_s - stuck.start_s < 2.0


def test_cancel_ends_a_running_and_a_waiting_query_as_cancelled(pg):
    pool, done = pg
    running, waiting, first = next(_ids), next(_ids), next(_ids)
    pool.submit("c1", QueryRequest(running, "SELECT pg_sleep(10)"))
    pool.submit("one", QueryRequest(first, "SELECT pg_sleep(1)"))
    time.sleep(0.3)
    pool.submit("one", QueryRequest(waiting, "SELECT 1"))  # its cluster's one connection is taken
    time.sleep(0.2)
    pool.cancel("c1", running)
    pool.cancel("one", waiting)
    got, never = done(running), done(waiting)
    assert got.status == "error" and got.error == CANCELLED and got.end_s - got.start_s < 3.0
    assert never.status == "error" and never.error == CANCELLED and never.start_s == never.end_s
    assert done(first).status == "ok"
    pool.cancel("c1", running)  # ended already: left alone


def test_writes_are_refused(pg):
    pool, done = pg
    texts = {
        "CREATE TABLE evil (i int)": "PermissionException",  # not a query
        "WITH gone AS (DELETE FROM nation RETURNING 1) SELECT count(*) FROM gone": "PermissionException",  # read only
        "SELECT 1; DROP TABLE nation": "ParserException",  # one statement per request
        "COPY nation TO '/tmp/nation.csv'": "PermissionException",
    }
    ids = {text: next(_ids) for text in texts}
    for text, query_id in ids.items():
        pool.submit("c1", QueryRequest(query_id, text))
    for text, query_id in ids.items():
        got = done(query_id)
        assert got.status == "error" and got.error.startswith(texts[text] + ":"), (text, got.error)
    # a session setting changed by a statement goes with its transaction
    for _ in range(3):  # on every connection of the cluster
        pool.submit(
            "c1",
            QueryRequest(query_id := next(_ids), "SELECT set_config('default_transaction_read_only', 'off', false)"),
        )
        assert done(query_id).status == "ok"
    pool.submit(
        "c1",
        QueryRequest(query_id := next(_ids), "WITH gone AS (DELETE FROM nation RETURNING 1) SELECT count(*) FROM gone"),
    )
    assert done(query_id).error.startswith("PermissionException:")
    pool.submit("c1", QueryRequest(query_id := next(_ids), "SELECT count(*) FROM nation", fetch=True))
    assert done(query_id).data == [[25]]


def test_overlapping_queries_overlap_and_a_full_pool_queues(pg):
    pool, done = pg
    a, b, c, d = (next(_ids) for _ in range(4))
    for cluster_id, query_id in (("c1", a), ("c1", b), ("one", c), ("one", d)):
        pool.submit(cluster_id, QueryRequest(query_id, "SELECT pg_sleep(0.5)"))
    qa, qb, qc, qd = done(a), done(b), done(c), done(d)
    assert max(qa.start_s, qb.start_s) < min(qa.end_s, qb.end_s)  # three connections: both ran at once
    first, second = sorted((qc, qd), key=lambda q: q.start_s)  # one connection: one waited for the other
    assert second.start_s >= first.end_s and second.end_s - second.start_s >= 0.49
    assert all(q.status == "ok" and q.rows == 1 and q.data is None for q in (qa, qb, qc, qd))


def test_show_and_explain_statements_run_in_the_attempts_read_only_transaction(pg):
    pool, done = pg
    shown, read_only, planned = next(_ids), next(_ids), next(_ids)
    pool.submit("c1", QueryRequest(shown, "SHOW statement_timeout", timeout_s=2.5, fetch=True))
    pool.submit("c1", QueryRequest(read_only, "SHOW transaction_read_only", fetch=True))
    pages = Pages(pool, "c1", planned, auto_credit=True)
    pool.submit(
        "c1",
        QueryRequest(planned, "EXPLAIN SELECT * FROM nation", stream=True, page_rows=1, buffer_pages=1, on_page=pages),
    )
    assert done(shown).data == [["2500ms"]]
    assert done(read_only).data == [["on"]]
    got = done(planned)
    assert got.status == "ok" and got.columns == (("QUERY PLAN", "VARCHAR"),) and got.rows == pages.count() >= 1
    assert pages.pages[0][1][0][0].startswith("Seq Scan on nation")


def test_health_reports_a_primary(pg):
    pool, _ = pg
    health = pool.health("c1")
    assert health["ok"] is True and health["error"] == "" and 0 <= health["latency_s"] < 5
    assert health["in_recovery"] is False and health["replica_lag_s"] is None
    assert pool.health("spare")["ok"]  # configured, not attached
    with pytest.raises(ClusterPoolError, match="'cluster_id'"):
        pool.health("nope")


def test_explain_returns_a_json_plan_the_features_read(pg, tpch_templates):
    pool, _ = pg
    q3 = next(t for t in tpch_templates if t.name == "tpch-q03")
    plan = pool.explain("c1", trino_to_postgres(q3.sql))
    assert json.loads(plan)[0]["Plan"]["Node Type"]
    features = postgres_plan_features(plan)
    assert features["joins"] >= 2 and features["scans"] >= 3 and features["tables"] == 3
    assert features["total_cost"] > 0 and features["plan_rows"] >= 1 and features["nodes"] > features["scans"]
    assert pool.explain("c1", "DELETE FROM nation") is None
    assert pool.explain("c1", "SELECT * FROM no_such_table") is None
    with pytest.raises(ValueError, match="'plan'"):
        postgres_plan_features('{"not": "a plan"}')


def test_tear_down_ends_running_queries_and_the_cluster_comes_back(pg):
    pool, done = pg
    pool.wait_ready(pool.spin_up(3), timeout_s=30)  # the free backend of size 3: spare
    query_id = next(_ids)
    pool.submit("spare", QueryRequest(query_id, "SELECT pg_sleep(10)"))
    time.sleep(0.3)
    pool.tear_down("spare")
    got = done(query_id)
    assert got.status == "error" and "stopped" in got.error and "torn down" in got.error
    assert {c.cluster_id: c.state for c in pool.clusters()}["spare"] == "stopped"
    with pytest.raises(ClusterPoolError, match="stopped"):
        pool.submit("spare", QueryRequest(next(_ids), "SELECT 1"))
    info = pool.wait_ready(pool.spin_up(3, cluster_id="spare"), timeout_s=30)
    assert info.state == "ready" and info.cores == () and info.pid is None and math.isnan(info.cpu_budget)
    pool.tear_down("spare")


def test_a_server_stopped_mid_query_fails_its_cluster(wait_until):
    engine = start_engine()
    try:
        reader = create_reader_role(engine.url, "reader", None, [])
        with PostgresClusterPool({"db": PostgresBackend(reader, size=1, pool_connections=2)}) as pool:
            pool.wait_ready(pool.spin_up(1, cluster_id="db"), timeout_s=30)
            done = Done(pool)
            pool.submit("db", QueryRequest(1, "SELECT pg_sleep(30)"))
            pages = Pages()
            pool.submit(
                "db",
                QueryRequest(
                    2,
                    "SELECT i FROM generate_series(1, 100) i",
                    stream=True,
                    page_rows=10,
                    buffer_pages=1,
                    on_page=pages,
                ),
            )  # waits for credit after a page
            wait_until(lambda: pages.count() == 1, "the stream's first page")
            time.sleep(0.2)
            engine.stop()
            running, waiting = done(1), done(2)
            assert running.status == "error" and running.error.startswith("backend db stopped:"), running.error
            assert waiting.status == "error" and "stopped" in waiting.error and waiting.rows == 10
            (info,) = pool.clusters()
            assert info.state == "failed" and info.failure and info.running == 0
            with pytest.raises(ClusterPoolError, match="failed"):
                pool.submit("db", QueryRequest(3, "SELECT 1"))
            health = pool.health("db", timeout_s=2)
            assert health["ok"] is False and health["error"]
            pool.tear_down("db")
            assert pool.clusters()[0].state == "stopped"
    finally:
        engine.stop()


def test_spin_up_and_backends_refuse_what_the_config_does_not_say():
    refused = "postgresql://nobody@127.0.0.1:1/none"  # nothing listens on port 1
    pool = PostgresClusterPool({"c1": PostgresBackend(refused, size=2, connect_timeout_s=2)})
    with pytest.raises(ClusterPoolError, match="'size' parameter of spin_up must be 2"):
        pool.spin_up(3, cluster_id="c1")
    with pytest.raises(ClusterPoolError, match="'cluster_id' parameter of spin_up"):
        pool.spin_up(2, cluster_id="c9")
    with pytest.raises(ClusterPoolError, match="No configured backend of size 4"):
        pool.spin_up(4)
    assert pool.spin_up(2) == "c1"  # returns at once; attaching fails on its thread
    with pytest.raises(ClusterPoolError, match="failed to start"):
        pool.wait_ready("c1", timeout_s=30)
    assert pool.clusters()[0].failure.startswith("could not attach")
    pool.close()
    with pytest.raises(ClusterPoolError, match="'pool_connections'"):
        PostgresBackend(refused, pool_connections=0)
    with pytest.raises(ClusterPoolError, match="'url'"):
        PostgresBackend("")
    with pytest.raises(ClusterPoolError, match="'backends'"):
        PostgresClusterPool({"c1": {"url": refused, "sise": 2}})


def test_trino_to_postgres_translates_one_statement_or_names_it():
    assert trino_to_postgres("SELECT date_add('day', 1, d) FROM t;") == "SELECT d + INTERVAL '1 DAY' FROM t"
    with pytest.raises(ValueError, match="SELECT FROM WHERE"):
        trino_to_postgres("SELECT FROM WHERE (")
    with pytest.raises(ValueError, match="exactly one statement"):
        trino_to_postgres("SELECT 1; SELECT 2")
    assert statement_kind("/* a /* nested */ comment */ -- line\n ((select 1))") == "SELECT"
    assert statement_kind("-- only a comment") == ""
