"""The SLO gateway through the real Trino client: rows, types, errors, cancellation (issue 22, part 1)."""

from __future__ import annotations

import datetime
import decimal
import time

import pytest

pytest.importorskip("trino")

#: A query that runs for many seconds on SF 0.01: something to cancel.
LONG_SQL = "SELECT count(*) FROM range(5000000000) t(i) WHERE i % 7 = 3"


@pytest.fixture(scope="module")
def served(tpch_db, tmp_path_factory):
    """A gateway on two size-1 DuckDB clusters (no model: least-queued placement), served on loopback."""
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    log_dir = tmp_path_factory.mktemp("gateway-logs")
    gateway = Gateway(tpch_db, GatewayOptions(cluster_sizes=(1, 1), router="least-queued", log_dir=log_dir)).start()
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, client, log_dir
    finally:
        gateway.close()


def _connect(client, **kwargs):
    import trino

    return trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), user="tester", **kwargs)


def _duckdb_rows(db, sql):
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return [list(row) for row in con.execute(sql).fetchall()]
    finally:
        con.close()


def test_trino_client_gets_duckdb_rows_with_typed_columns(served, tpch_db, tpch_templates):
    gateway, client, _ = served
    by_name = {t.name: t.sql for t in tpch_templates}
    cur = _connect(client).cursor()
    cur.execute(by_name["tpch-q03"])
    rows = cur.fetchall()
    assert rows == _duckdb_rows(tpch_db, by_name["tpch-q03"]) and len(rows) == 10
    types = {d[0]: d[1] for d in cur.description}
    assert types["l_orderkey"] == "bigint" and types["o_orderdate"] == "date"
    assert types["revenue"].startswith("decimal(")
    assert isinstance(rows[0][1], decimal.Decimal) and isinstance(rows[0][2], datetime.date)
    cur.execute("SELECT 1.5::DOUBLE AS x, TRUE AS b, 'ab' AS s, TIMESTAMP '2024-03-01 12:34:56.25' AS ts, "
                "42::BIGINT AS n, NULL::INTEGER AS missing")
    assert cur.fetchall() == [[1.5, True, "ab", datetime.datetime(2024, 3, 1, 12, 34, 56, 250000), 42, None]]
    assert [d[1] for d in cur.description] == ["double", "boolean", "varchar", "timestamp(6)", "bigint", "integer"]
    # the gateway recognised the TPC-H template by its text
    assert any(q.template == "tpch-q03" for q in gateway.queries.values())


def test_zoned_times_and_wide_integers_arrive_as_duckdb_gives_them(served, tpch_db):
    """Trino's encodings (trino/mapper.py): `timestamp with time zone` as 'local time ZONE', decimals as text."""
    _, client, _ = served
    sql = ("SELECT TIMESTAMPTZ '2024-03-01 12:34:56.25+02:00' AS tz, TIMETZ '10:00:00.5+02' AS ttz, "
           "170141183460469231731687303715884105727::HUGEINT AS big, 18446744073709551615::UBIGINT AS ubig")
    cur = _connect(client).cursor()
    cur.execute(sql)
    (tz, ttz, big, ubig), = cur.fetchall()
    (want_tz, want_ttz, want_big, want_ubig), = _duckdb_rows(tpch_db, sql)
    assert tz == want_tz and tz.utcoffset() is not None  # the same instant, zone attached
    assert ttz == want_ttz and ttz.utcoffset() == datetime.timedelta(hours=2)
    assert big == decimal.Decimal(want_big) == decimal.Decimal("170141183460469231731687303715884105727")
    assert ubig == decimal.Decimal(want_ubig)
    cur.execute("SELECT now() AS n")
    (now,), = cur.fetchall()
    assert now.utcoffset() is not None
    assert abs(now - datetime.datetime.now(datetime.UTC)) < datetime.timedelta(minutes=5)


def test_unnamed_columns_are_named_as_trino_names_them(served):
    _, client, _ = served
    cur = _connect(client).cursor()
    cur.execute("SELECT count(*), n_name, n_regionkey + 1, n_nationkey AS k FROM nation GROUP BY ALL ORDER BY k "
                "LIMIT 1")
    assert [d[0] for d in cur.description] == ["_col0", "n_name", "_col2", "k"]
    cur.fetchall()
    cur.execute("SELECT * FROM region ORDER BY r_regionkey LIMIT 1")  # a star: the table's own names
    assert [d[0] for d in cur.description] == ["r_regionkey", "r_name", "r_comment"]
    cur.fetchall()


@pytest.mark.parametrize("sql, name", [
    ("SELECT CAST('x' AS INTEGER)", "INVALID_CAST_ARGUMENT"),
    ("SELECT 2147483647::INTEGER + 1", "NUMERIC_VALUE_OUT_OF_RANGE"),
    ("SELECT no_such_function(1)", "FUNCTION_NOT_FOUND"),
])
def test_engine_errors_carry_trinos_names_and_codes(served, sql, name):
    import trino

    from sloctl.serving.gateway.trino import ERRORS

    _, client, _ = served
    cur = _connect(client).cursor()
    with pytest.raises(trino.exceptions.TrinoUserError) as caught:
        cur.execute(sql)
        cur.fetchall()
    assert caught.value.error_name == name and caught.value.error_code == ERRORS[name][0]


def test_all_22_tpch_queries_return_the_rows_duckdb_returns(served, tpch_db, tpch_templates):
    _, client, _ = served
    cur = _connect(client).cursor()
    for template in tpch_templates:
        cur.execute(template.sql)
        assert cur.fetchall() == _duckdb_rows(tpch_db, template.sql), template.name


def test_results_come_back_in_pages_the_client_follows(served):
    gateway, client, _ = served
    cur = _connect(client).cursor()
    n = 3 * gateway.options.page_rows + 7
    cur.execute(f"SELECT i FROM range({n}) t(i) ORDER BY i")
    assert [r[0] for r in cur.fetchall()] == list(range(n))


def test_sqlalchemy_dialect_runs_queries(served, tpch_db):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    _, client, _ = served
    engine = sqlalchemy.create_engine(f"trino://tester@127.0.0.1:{client.base_url.port}/memory")
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT n_name, n_nationkey FROM nation ORDER BY n_nationkey LIMIT 3"))
        assert [tuple(r) for r in rows] == [tuple(r) for r in _duckdb_rows(
            tpch_db, "SELECT n_name, n_nationkey FROM nation ORDER BY n_nationkey LIMIT 3")]
    engine.dispose()


def test_a_bad_query_is_a_trino_user_error_and_is_not_retried(served):
    import trino

    gateway, client, _ = served
    cur = _connect(client, client_tags=["high"]).cursor()
    with pytest.raises(trino.exceptions.TrinoUserError) as caught:
        cur.execute("SELECT no_such_column FROM nation")
        cur.fetchall()
    assert caught.value.error_name == "SYNTAX_ERROR" and "no_such_column" in caught.value.message
    failed = gateway.get(caught.value.query_id)
    assert failed.klass == "high" and len(failed.attempts) == 1


def test_bad_requests_get_400_naming_the_field(served):
    _, client, _ = served
    empty = client.post("/v1/statement", content=b"  ", headers={"X-Trino-User": "u"})
    assert empty.status_code == 400 and empty.json()["field"] == "body"
    nouser = client.post("/v1/statement", content=b"SELECT 1")
    assert nouser.status_code == 400 and nouser.json()["field"] == "x-trino-user"
    slo = client.post("/v1/statement", content=b"SELECT 1", headers={"X-Trino-User": "u", "X-Sloctl-Slo-S": "-1"})
    assert slo.status_code == 400 and slo.json()["field"] == "x-sloctl-slo-s"
    session = client.post("/v1/statement", content=b"SELECT 1",
                          headers={"X-Trino-User": "u", "X-Trino-Session": "slo_s=soon"})
    assert session.status_code == 400 and "slo_s" in session.json()["error"]
    assert client.get("/v1/statement/executing/nope/x/0", headers={"X-Trino-User": "u"}).status_code == 404
    # following a query needs its user (the Trino client sends X-Trino-User on every request)
    assert client.get("/v1/statement/executing/nope/x/0").status_code == 400


def test_delete_cancels_a_running_query_on_its_cluster(served, wait_until):
    gateway, client, _ = served
    first = client.post("/v1/statement", content=LONG_SQL.encode(), headers={"X-Trino-User": "u"}).json()
    qid = first["id"]
    wait_until(lambda: gateway.get(qid).state == "RUNNING", "the query to run")
    started = time.monotonic()
    assert client.delete(first["nextUri"], headers={"X-Trino-User": "u"}).status_code == 204
    doc = client.get(first["nextUri"], headers={"X-Trino-User": "u"}).json()
    assert doc["error"]["errorName"] == "USER_CANCELED" and "nextUri" not in doc
    # the attempt was interrupted on its cluster, not left running there
    wait_until(lambda: all(c["running"] == 0 for c in gateway.status()["clusters"]), "the cluster to be idle")
    assert time.monotonic() - started < 30
    logged = gateway.query_log()
    row = logged[logged["gateway_query"] == qid]
    assert list(row["status"]) == ["error"] and bool(row["cancelled"].iloc[0]), gateway.status()["dispatch_errors"]


def test_every_attempt_lands_in_a_valid_query_log(served, tpch_templates):
    from sloctl.datasets.querylog import read_log

    gateway, client, log_dir = served
    cur = _connect(client).cursor()
    cur.execute(tpch_templates[0].sql)
    cur.fetchall()
    path = gateway.flush_log()
    log = read_log(path)
    assert path.parent == log_dir and len(log) == len(gateway.log_rows)
    ok = log[log["template"] == tpch_templates[0].name]
    assert len(ok) >= 1 and (ok["status"] == "ok").all()
    assert (ok["start_s"] >= ok["arrival_s"]).all() and (ok["end_s"] >= ok["start_s"]).all()
    assert ok["f_nodes"].notna().all()  # plan features, from EXPLAIN


def test_reading_the_bill_while_a_completion_is_pending_does_not_break_the_gateway(served, wait_until):
    """The status view reads billing timers; a completion observed after it must still be processed."""
    gateway, client, _ = served
    with gateway.lock:  # the dispatcher waits: the query ends on its cluster, its completion is not handled yet
        q = gateway.submit("SELECT 7", user="u")
        wait_until(lambda: all(info.running == 0 for info in gateway.pool.clusters()), "the query to end there")
        gateway.status()  # reads every timer now, after the query's end
    assert q.done.wait(10) and q.state == "FINISHED" and q.data == [[7]]
    assert gateway.status()["dispatch_errors"] == []
