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
    gateway = Gateway(tpch_db, GatewayOptions(cluster_sizes=(1, 1), router="least-queued", log_dir=log_dir,
                                              scratch_memory_limit="32MB")).start()
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, client, log_dir
    finally:
        gateway.close()


def _connect(client, **kwargs):
    import trino

    kwargs.setdefault("user", "tester")
    return trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), **kwargs)


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
    # a Trino timestamp literal takes the precision of its digits: DuckDB holds .25 as milliseconds
    assert [d[1] for d in cur.description] == ["double", "boolean", "varchar", "timestamp(3)", "bigint", "integer"]
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
    gateway, client, _ = served
    engine = sqlalchemy.create_engine(f"trino://tester@127.0.0.1:{client.base_url.port}/{gateway.catalog.name}")
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT n_name, n_nationkey FROM nation ORDER BY n_nationkey LIMIT 3"))
        assert [tuple(r) for r in rows] == [tuple(r) for r in _duckdb_rows(
            tpch_db, "SELECT n_name, n_nationkey FROM nation ORDER BY n_nationkey LIMIT 3")]
    engine.dispose()


def test_sqlalchemy_inspector_reflection_and_bound_values(served, tpch_db):
    """The trino SQLAlchemy dialect's reflection (information_schema in Trino's layout) and EXECUTE IMMEDIATE."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    gateway, client, _ = served
    engine = sqlalchemy.create_engine(f"trino://tester@127.0.0.1:{client.base_url.port}/{gateway.catalog.name}/main")
    try:
        inspector = sqlalchemy.inspect(engine)
        assert sorted(inspector.get_schema_names()) == ["information_schema", "main"]
        tables = inspector.get_table_names()
        assert tables == sorted(r[0] for r in _duckdb_rows(tpch_db, "SELECT table_name FROM duckdb_tables()"))
        assert inspector.has_table("lineitem") and not inspector.has_table("no_such_table")
        columns = inspector.get_columns("orders")
        assert [c["name"] for c in columns][:3] == ["o_orderkey", "o_custkey", "o_orderstatus"]
        kinds = {c["name"]: c["type"] for c in columns}
        assert isinstance(kinds["o_totalprice"], sqlalchemy.DECIMAL) and kinds["o_totalprice"].scale == 2
        assert isinstance(kinds["o_orderdate"], sqlalchemy.Date)
        nation = sqlalchemy.Table("nation", sqlalchemy.MetaData(), autoload_with=engine)
        query = (sqlalchemy.select(nation.c.n_name).where(nation.c.n_regionkey == 1)
                 .where(nation.c.n_name.like("%A%")).order_by(nation.c.n_name))
        with engine.connect() as conn:
            got = [r[0] for r in conn.execute(query)]
        assert got == [r[0] for r in _duckdb_rows(
            tpch_db, "SELECT n_name FROM nation WHERE n_regionkey = 1 AND n_name LIKE '%A%' ORDER BY n_name")]
        assert got  # the filter kept something: the bound values arrived
    finally:
        engine.dispose()


def test_pandas_reads_a_table_and_a_parameterized_query(served, tpch_db):
    pd = pytest.importorskip("pandas")
    sqlalchemy = pytest.importorskip("sqlalchemy")
    gateway, client, _ = served
    engine = sqlalchemy.create_engine(f"trino://tester@127.0.0.1:{client.base_url.port}/{gateway.catalog.name}/main")
    try:
        frame = pd.read_sql_table("region", engine)
        want = _duckdb_rows(tpch_db, "SELECT * FROM region")
        assert sorted(map(list, frame.itertuples(index=False))) == sorted(want)
        frame = pd.read_sql(sqlalchemy.text("SELECT count(*) AS n FROM lineitem WHERE l_quantity > :q"), engine,
                            params={"q": 45})
        assert int(frame["n"][0]) == _duckdb_rows(tpch_db, "SELECT count(*) FROM lineitem WHERE l_quantity > 45")[0][0]
    finally:
        engine.dispose()


@pytest.mark.parametrize("legacy", [False, True])
def test_execute_with_params_binds_as_trino_does(served, tpch_db, legacy):
    """`cursor.execute(sql, params)`: EXECUTE IMMEDIATE, or PREPARE / EXECUTE / DEALLOCATE with Trino's headers."""
    _, client, _ = served
    cur = _connect(client, legacy_prepared_statements=legacy).cursor()
    sql = "SELECT count(*), min(l_shipdate) FROM lineitem WHERE l_quantity > ? AND l_shipdate >= ? AND l_returnflag = ?"
    cur.execute(sql, [decimal.Decimal("30"), datetime.date(1995, 1, 1), "R"])
    want = _duckdb_rows(tpch_db, "SELECT count(*), min(l_shipdate) FROM lineitem WHERE l_quantity > 30 "
                                 "AND l_shipdate >= DATE '1995-01-01' AND l_returnflag = 'R'")
    assert cur.fetchall() == want
    cur.execute("SELECT ?, ?, ?, ?", [None, 2.5, "it's", True])
    assert cur.fetchall() == [[None, 2.5, "it's", True]]
    with pytest.raises(Exception, match="INVALID_PARAMETER_USAGE|Incorrect number of parameters"):
        cur.execute("SELECT ? + ?", [1])
        cur.fetchall()


def test_catalog_statements_answer_as_trino(served, tpch_db):
    """SHOW, DESCRIBE, USE and qualified names, in Trino's column names and type names."""
    gateway, client, _ = served
    cat = gateway.catalog.name
    cur = _connect(client).cursor()

    def rows(sql):
        cur.execute(sql)
        return cur.fetchall()

    assert rows("SHOW CATALOGS") == [[cat], ["system"], ["memory"]]
    assert rows(f"SHOW SCHEMAS FROM {cat}") == [["information_schema"], ["main"]]
    assert ["lineitem"] in rows("SHOW TABLES") and rows("SHOW TABLES LIKE 'nat%'") == [["nation"]]
    assert rows("SHOW COLUMNS FROM nation")[0] == ["n_nationkey", "integer", "", ""]
    assert [d[0] for d in cur.description] == ["Column", "Type", "Extra", "Comment"]
    assert rows(f"DESCRIBE {cat}.main.orders")[3] == ["o_totalprice", "decimal(15,2)", "", ""]
    (create,), = rows("SHOW CREATE TABLE region")
    assert create.startswith(f"CREATE TABLE {cat}.main.region (") and "r_name varchar" in create
    assert rows(f"SELECT count(*) FROM {cat}.main.lineitem") == _duckdb_rows(tpch_db, "SELECT count(*) FROM lineitem")
    assert ["approx_count_distinct"] in [r[:1] for r in rows("SHOW FUNCTIONS LIKE 'approx%'")]
    conn = _connect(client)
    use = conn.cursor()
    use.execute(f"USE {cat}.information_schema")
    use.fetchall()
    # the client took X-Trino-Set-Catalog / -Schema: unqualified names now resolve in information_schema
    use.execute("SELECT table_name FROM tables WHERE table_name = 'lineitem'")
    assert use.fetchall() == [["lineitem"]]
    import trino

    for sql, name in (("SELECT 1 FROM hive.default.t", "CATALOG_NOT_FOUND"), ("USE nowhere.main", "CATALOG_NOT_FOUND"),
                      ("INSERT INTO nation VALUES (1, 'X', 1, 'x')", "PERMISSION_DENIED")):
        with pytest.raises(trino.exceptions.TrinoUserError) as caught:
            rows(sql)
        assert caught.value.error_name == name


@pytest.mark.parametrize("trino_sql, duckdb_sql", [
    # dates and times
    ("SELECT date_add('day', 1, DATE '2020-02-28'), date_diff('day', DATE '2020-01-01', DATE '2020-03-01')",
     "SELECT DATE '2020-02-28' + INTERVAL 1 DAY, 60"),
    ("SELECT date_format(DATE '2021-07-04', '%Y-%m-%d'), year(DATE '2021-07-04'), day_of_week(DATE '2021-07-04')",
     "SELECT '2021-07-04', 2021, 7"),
    ("SELECT from_unixtime(0) = TIMESTAMP '1970-01-01 00:00:00 UTC'", "SELECT true"),
    # approximate aggregates
    ("SELECT approx_distinct(n_regionkey), approx_percentile(n_nationkey, 0.5) FROM nation",
     "SELECT approx_count_distinct(n_regionkey), approx_quantile(n_nationkey, 0.5) FROM nation"),
    # arrays and maps
    ("SELECT element_at(ARRAY[10, 20, 30], 2), cardinality(ARRAY[1, 2]), contains(ARRAY[1, 2], 2)",
     "SELECT 20, 2, true"),
    # strings and regular expressions
    ("SELECT regexp_like('abc', 'b.'), strpos('hello', 'l'), split_part('a,b,c', ',', 2)", "SELECT true, 3, 'b'"),
    ("SELECT format('%s-%05d %.2f', 'x', 42, 3.14159)", "SELECT 'x-00042 3.14'"),
    # JSON
    ("SELECT json_extract_scalar('{\"a\": {\"b\": 7}}', '$.a.b')", "SELECT '7'"),
    # integer arithmetic as Trino: truncating division
    ("SELECT 7 / 2, -7 / 2, 7 % 3", "SELECT 3, -3, 1"),
])
def test_trino_functions_are_translated(served, trino_sql, duckdb_sql, tpch_db):
    _, client, _ = served
    cur = _connect(client).cursor()
    cur.execute(trino_sql)
    assert cur.fetchall() == _duckdb_rows(tpch_db, duckdb_sql)


def test_division_by_zero_is_trinos_error(served):
    import trino

    from sloctl.serving.gateway.trino import ERRORS

    _, client, _ = served
    cur = _connect(client).cursor()
    with pytest.raises(trino.exceptions.TrinoUserError) as caught:
        cur.execute("SELECT 1 / 0")
        cur.fetchall()
    assert caught.value.error_name == "DIVISION_BY_ZERO" and caught.value.error_code == ERRORS["DIVISION_BY_ZERO"][0]
    cur.execute("SELECT n_nationkey / (n_regionkey + 1) FROM nation WHERE n_nationkey = 7")
    assert cur.fetchall() == [[7 // 4]]


def test_a_bad_query_is_a_trino_user_error_and_is_not_retried(served):
    import trino

    gateway, client, _ = served
    cur = _connect(client, client_tags=["high"]).cursor()
    with pytest.raises(trino.exceptions.TrinoUserError) as caught:
        cur.execute("SELECT no_such_column FROM nation")
        cur.fetchall()
    assert caught.value.error_name == "COLUMN_NOT_FOUND" and "no_such_column" in caught.value.message
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
    # a bad session property is the client's session, not its request: a Trino error the client can read
    session = client.post("/v1/statement", content=b"SELECT 1",
                          headers={"X-Trino-User": "u", "X-Trino-Session": "slo_s=soon"})
    assert session.status_code == 200 and session.json()["error"]["errorName"] == "INVALID_SESSION_PROPERTY"
    assert "slo_s" in session.json()["error"]["message"]
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


#: Every DuckDB type the gateway maps (docs/gateway.md, "Types"), with a value; NULL rides along in each.
TYPED_VALUES = [
    ("true", "BOOLEAN"), ("-7", "TINYINT"), ("300", "SMALLINT"), ("-70000", "INTEGER"), ("9000000000", "BIGINT"),
    ("170141183460469231731687303715884105727", "HUGEINT"), ("18446744073709551615", "UBIGINT"),
    ("250", "UTINYINT"), ("1.5", "FLOAT"), ("2.25", "DOUBLE"), ("12345.67", "DECIMAL(15,2)"),
    ("1234567890123456789012.5", "DECIMAL(30,1)"), ("'héllo'", "VARCHAR"), ("'2024-02-29'", "DATE"),
    ("'12:34:56.789'", "TIME"), ("'2024-02-29 12:34:56.123456'", "TIMESTAMP"),
    ("'2024-02-29 12:34:56'", "TIMESTAMP_S"), ("'2024-02-29 12:34:56.123'", "TIMESTAMP_MS"),
    ("'2024-02-29 12:34:56.123456+05:30'", "TIMESTAMPTZ"), ("'12:34:56+05:30'", "TIMETZ"),
    ("'\\xAA\\xBB'", "BLOB"), ("'5c2d4c2f-3e9d-4b0a-9a51-3d2f7b8f1c11'", "UUID"),
    ("INTERVAL '1 day 2 hours 3.5 seconds'", "INTERVAL"), ("[1, NULL, 3]", "INTEGER[]"),
    ("[[1], [2, 3]]", "INTEGER[][]"), ("{'x': 1, 'y': 'a'}", "STRUCT(x INTEGER, y VARCHAR)"),
    ("MAP {'k': 1.5, 'j': NULL}", "MAP(VARCHAR, DOUBLE)"), ("'b'", "ENUM('a', 'b')"),
    ("[{'d': DATE '2020-01-01'}]", "STRUCT(d DATE)[]"),
]


@pytest.mark.parametrize("literal, kind", TYPED_VALUES, ids=[k for _, k in TYPED_VALUES])
def test_every_type_round_trips_as_duckdb_gives_it(served, tpch_db, literal, kind):
    """Each value through the trino client equals DuckDB's own Python value (Trino's encodings, trino/mapper.py)."""
    _, client, _ = served
    sql = f"SELECT CAST({literal} AS {kind}) AS v, CAST(NULL AS {kind}) AS n"
    cur = _connect(client).cursor()
    cur.execute(sql)
    (got, null), = cur.fetchall()
    (want, _), = _duckdb_rows(tpch_db, sql)
    assert null is None
    if isinstance(want, dict) and kind.startswith("STRUCT"):
        want = tuple(want.values())  # Trino's row: the field values in order
    elif isinstance(want, list) and kind.startswith("STRUCT"):
        want, got = [tuple(v.values()) for v in want], [tuple(v) for v in got]
    if isinstance(got, decimal.Decimal) and isinstance(want, int):
        got = int(got)
    if kind == "INTERVAL":  # Trino's interval day to second holds milliseconds
        want = datetime.timedelta(milliseconds=want // datetime.timedelta(milliseconds=1))
    if kind == "FLOAT":
        assert got == pytest.approx(want)
        return
    assert got == want, (kind, got, want)


def test_metrics_query_list_and_admission_state(served):
    """Prometheus text (parsed by prometheus_client's own parser), GET /v1/query, and /v1/gateway's admission flag."""
    from prometheus_client.parser import text_string_to_metric_families

    gateway, client, _ = served
    cur = _connect(client, user="lister", client_tags=["high"]).cursor()
    cur.execute("SELECT count(*) FROM nation")
    cur.fetchall()
    view = client.get("/v1/gateway", headers={"X-Trino-User": "lister"}).json()
    assert view["admission"] is True and view["admission_active"] is False  # no latency model loaded: admits all
    assert view["catalog"] == gateway.catalog.name
    families = {f.name: f for f in text_string_to_metric_families(
        client.get("/metrics", headers={"X-Trino-User": "lister"}).text)}
    outcomes = [s for s in families["sloctl_gateway_query_outcomes"].samples if s.name.endswith("_total")]
    assert any(s.labels["class"] == "high" and s.labels["state"] == "FINISHED" and s.value >= 1 for s in outcomes)
    buckets = [s for s in families["sloctl_gateway_attempt_seconds"].samples if s.name.endswith("_bucket")]
    assert buckets and max(s.value for s in buckets if s.labels["le"] == "+Inf") >= 1
    assert {s.labels["cluster"] for s in families["sloctl_gateway_cluster_ready"].samples} == {"c0", "c1"}
    mine = client.get("/v1/query", headers={"X-Trino-User": "lister"}).json()
    assert mine[0]["query"] == "SELECT count(*) FROM nation" and mine[0]["state"] == "FINISHED"
    assert {q["user"] for q in mine} == {"lister"}  # a user lists its own queries only
    assert client.get("/v1/query?limit=0", headers={"X-Trino-User": "lister"}).status_code == 400


def test_memory_catalog_takes_scratch_tables_and_stays_bounded(served, tpch_db):
    """Trino's `memory` catalog: one writable in-memory database per gateway, joins with the warehouse, bounded."""
    import trino

    gateway, client, _ = served
    cur = _connect(client).cursor()

    def run(sql):
        cur.execute(sql)
        return cur.fetchall()

    assert ["memory"] in run("SHOW CATALOGS")
    assert run("CREATE TABLE memory.default.picks AS SELECT n_nationkey, n_name FROM nation WHERE n_regionkey = 1") \
        == [[5]]
    assert run("INSERT INTO memory.default.picks VALUES (99, 'NOWHERE')") == [[1]]
    assert run("SHOW TABLES FROM memory.default") == [["picks"]]
    joined = run("SELECT p.n_name, count(*) FROM memory.default.picks p JOIN customer ON c_nationkey = p.n_nationkey "
                 "GROUP BY 1 ORDER BY 1")
    assert joined == [list(r) for r in _duckdb_rows(
        tpch_db, "SELECT n_name, count(*) FROM nation JOIN customer ON c_nationkey = n_nationkey "
                 "WHERE n_regionkey = 1 GROUP BY 1 ORDER BY 1")]
    other = _connect(client, user="someone-else").cursor()  # a user's memory tables are its own
    with pytest.raises(trino.exceptions.TrinoUserError) as caught:
        other.execute("SELECT count(*) FROM memory.default.picks")
        other.fetchall()
    assert caught.value.error_name == "TABLE_NOT_FOUND"
    assert run("SELECT count(*) FROM memory.default.picks") == [[6]]
    for sql, name in (("CREATE TABLE nation_copy AS SELECT * FROM nation", "PERMISSION_DENIED"),
                      ("DELETE FROM nation", "PERMISSION_DENIED"),
                      ("CREATE TABLE memory.default.huge AS SELECT md5(CAST(x AS varchar)) AS h "
                       "FROM range(4000000) AS t(x)",  # 64 MB of digests, over the 32 MB
                       "EXCEEDED_LOCAL_MEMORY_LIMIT")):
        with pytest.raises(trino.exceptions.TrinoUserError if name == "PERMISSION_DENIED"
                           else trino.exceptions.TrinoQueryError) as caught:
            run(sql)
        assert caught.value.error_name == name, (sql, caught.value)
    assert run("DROP TABLE memory.default.picks") == [[True]]
    assert run("SHOW TABLES FROM memory.default") == []
    assert run("SELECT count(*) FROM nation") == [[25]]  # the warehouse untouched
