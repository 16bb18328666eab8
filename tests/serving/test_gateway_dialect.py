"""Trino SQL to DuckDB without a server: plans, parameters, catalog views, type names (issue 36)."""

from __future__ import annotations

import datetime
import json
import re

import pytest

from sloctl.datasets.duckdb_types import DuckType, parse_type
from sloctl.serving.gateway.dialect import Catalog, Session, parse_prepared, plan
from sloctl.serving.gateway.trino import column, trino_type

CAT = Catalog("tpch")


def _run(db, sql):
    import duckdb

    con = duckdb.connect(str(db), read_only=True, config={"integer_division": True})
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_execute_binds_parameters_in_order_and_keeps_the_template_text(tpch_db):
    text = "SELECT count(*) FROM lineitem WHERE l_quantity > ? AND l_comment <> '?' AND l_shipdate < ?"
    got = plan("EXECUTE q1 USING 45, DATE '1995-01-01'", CAT, Session(prepared={"q1": text}))
    assert got.kind == "query" and got.template_sql == text
    assert _run(tpch_db, got.sql) == _run(tpch_db, "SELECT count(*) FROM lineitem WHERE l_quantity > 45 "
                                                   "AND l_shipdate < DATE '1995-01-01'")
    immediate = plan("EXECUTE IMMEDIATE 'SELECT ?, ''?''' USING ARRAY[1, 2]", CAT)
    assert _run(tpch_db, immediate.sql) == [([1, 2], "?")]


@pytest.mark.parametrize("text, name", [
    ("EXECUTE IMMEDIATE 'SELECT ? + ?' USING 1", "INVALID_PARAMETER_USAGE"),
    ("EXECUTE nope USING 1", "NOT_FOUND"),
    ("DEALLOCATE PREPARE nope", "NOT_FOUND"),
    ("SELECT ?", "INVALID_PARAMETER_USAGE"),
    ("SELECT * FROM hive.web.pages", "CATALOG_NOT_FOUND"),
    ("USE hive.web", "CATALOG_NOT_FOUND"),
    ("INSERT INTO nation VALUES (1, 'x', 1, 'y')", "PERMISSION_DENIED"),
    ("DROP TABLE nation", "PERMISSION_DENIED"),
    ("SELECT 1; SELECT 2", "NOT_SUPPORTED"),
    ("SELEC 1", "SYNTAX_ERROR"),
    ("-- only a comment", "SYNTAX_ERROR"),
])
def test_refusals_carry_trinos_error_names(text, name):
    got = plan(text, CAT)
    assert got.kind == "refused" and got.error_name == name, got


def test_session_statements_answer_with_trinos_headers():
    prepare = plan("PREPARE q FROM SELECT * FROM nation WHERE n_name = ?", CAT)
    (header, value), = prepare.headers
    assert header == "X-Trino-Added-Prepare"
    assert parse_prepared(value) == {"q": "SELECT * FROM nation WHERE n_name = ?"}
    assert plan("DEALLOCATE PREPARE q", CAT, Session(prepared={"q": "SELECT 1"})).headers == (
        ("X-Trino-Deallocated-Prepare", "q"),)
    assert plan("USE tpch.main", CAT).headers == (("X-Trino-Set-Catalog", "tpch"), ("X-Trino-Set-Schema", "main"))
    assert plan("USE main", CAT).headers == (("X-Trino-Set-Schema", "main"),)
    assert plan("SET SESSION slo_s = 2", CAT).headers == (("X-Trino-Set-Session", "slo_s=2"),)
    assert plan("SHOW CATALOGS LIKE 'sys%'", CAT).rows == (("system",),)
    scratch = Catalog("tpch", scratch=True)
    assert plan("USE memory.default", scratch).headers == (("X-Trino-Set-Catalog", "memory"),
                                                           ("X-Trino-Set-Schema", "default"))
    in_memory = plan("CREATE TABLE t AS SELECT * FROM tpch.main.nation", scratch,
                     Session(catalog="memory", schema="default"))
    assert in_memory.target == "scratch" and 'memory."default"."u.t"' in in_memory.sql  # the anonymous user's
    assert plan("USE memory.default", CAT).error_name == "CATALOG_NOT_FOUND"  # no memory catalog offered


def test_catalog_views_have_trinos_layout_and_type_names(tpch_db):
    rows = _run(tpch_db, plan("SELECT table_catalog, column_name, data_type, is_nullable FROM "
                              "information_schema.columns WHERE table_name = 'orders' ORDER BY ordinal_position",
                              CAT).sql)
    assert rows[0] == ("tpch", "o_orderkey", "bigint", "NO")
    assert ("tpch", "o_totalprice", "decimal(15,2)", "NO") in rows and ("tpch", "o_orderdate", "date", "NO") in rows
    assert sorted(_run(tpch_db, plan("SHOW SCHEMAS", CAT).sql)) == [("information_schema",), ("main",)]
    # the session's schema: unqualified names resolve there, CTE names stay what they are
    in_schema = plan("SELECT count(*) FROM tables WHERE table_name = 'nation'", CAT,
                     Session(catalog="tpch", schema="information_schema"))
    assert _run(tpch_db, in_schema.sql) == [(1,)]
    cte = plan("WITH nation AS (SELECT 1 AS x) SELECT * FROM nation", CAT, Session(schema="main"))
    assert _run(tpch_db, cte.sql) == [(1,)]


def test_unnamed_columns_and_format_follow_trino(tpch_db):
    got = plan("SELECT count(*), n_name, n_regionkey + 1 AS r FROM nation GROUP BY n_name, n_regionkey", CAT)
    assert got.names == (None, "n_name", "r")
    assert _run(tpch_db, plan("SELECT format('%s|%3d|%.1f|%2$s%%', 'a', 7, 2.71)", CAT).sql) == [("a|  7|2.7|7%",)]


def test_duckdb_text_that_is_not_trino_runs_as_written(tpch_db):
    got = plan("SELECT 170141183460469231731687303715884105727::HUGEINT AS h, i FROM range(2) t(i)", CAT)
    assert got.kind == "query" and got.names == ("h", "i")
    assert len(_run(tpch_db, got.sql)) == 2


@pytest.mark.parametrize("duck, trino", [
    ("DECIMAL(15,2)", "decimal(15,2)"), ("INTEGER[]", "array(integer)"), ("INTEGER[3]", "array(integer)"),
    ("MAP(VARCHAR, DOUBLE)", "map(varchar, double)"),
    ('STRUCT(x INTEGER, "y z" VARCHAR[])', 'row(x integer, "y z" array(varchar))'),
    ("INTERVAL", "interval day to second"), ("TIMESTAMP WITH TIME ZONE", "timestamp(6) with time zone"),
    ("ENUM('a', 'b')", "varchar"), ("HUGEINT", "decimal(38,0)"), ("STRUCT(a INTERVAL)[]", "array(row(a interval "
                                                                                          "day to second))"),
])
def test_duckdb_types_have_trinos_names_and_signatures(duck, trino):
    assert trino_type(duck) == trino
    signature = column("c", duck)["typeSignature"]
    assert signature["rawType"] == re.sub(r"\(\d+(,\d+)?\)", "", trino).split("(")[0]


def test_type_trees_and_worker_encodings():
    from sloctl.datasets._cluster_worker import _page_json, encoders

    ints = DuckType("LIST", (DuckType("INTEGER"),))
    assert parse_type("STRUCT(a INTEGER, b MAP(VARCHAR, INTEGER[]))") == DuckType(
        "STRUCT", (DuckType("INTEGER"), DuckType("MAP", (DuckType("VARCHAR"), ints))), ("a", "b"))
    with pytest.raises(ValueError):
        parse_type("STRUCT(a INTEGER")
    columns = [["s", "STRUCT(x INTEGER, i INTERVAL)"], ["h", "HUGEINT"], ["l", "INTERVAL[]"]]
    rows = [[{"x": 1, "i": datetime.timedelta(days=-1, seconds=7200)}, 2**100, [datetime.timedelta(hours=1)]]]
    assert json.loads(_page_json(rows, encoders(columns))) == [[[1, "-0 22:00:00.000"], str(2**100),
                                                                ["0 01:00:00.000"]]]


# -- input never becomes SQL text (issue 51) ------------------------------------------------------------
def test_every_parameter_form_of_the_trino_client_binds_as_a_literal(tpch_db):
    """What trino.dbapi sends for str, int, float, bool, None, date, datetime, Decimal, bytes, list, dict, UUID."""
    params = ("'it''s'", "-42", "2.5e0", "true", "NULL", "DATE '2024-02-29'", "TIMESTAMP '2024-02-29 01:02:03.000'",
              "DECIMAL '12.50'", "X'00ff'", "ARRAY[1,2]", "MAP(ARRAY['k'], ARRAY[1])",
              "UUID '12345678-1234-5678-1234-567812345678'")
    text = "SELECT " + ", ".join("?" for _ in params)
    got = plan(f"EXECUTE IMMEDIATE '{text}' USING " + ", ".join(params), CAT)
    assert got.kind == "query", got
    row, = _run(tpch_db, got.sql)
    assert row[:5] == ("it's", -42, 2.5, True, None) and row[5] == datetime.date(2024, 2, 29)
    assert float(row[7]) == 12.5 and row[8] == b"\x00\xff" and row[9] == [1, 2] and row[10] == {"k": 1}


def test_parameters_bind_by_their_position_in_the_text(tpch_db):
    got = plan("EXECUTE q USING 2, 3", CAT, Session(prepared={"q": "SELECT n_nationkey FROM nation ORDER BY 1 "
                                                                    "OFFSET ? LIMIT ?"}))
    assert _run(tpch_db, got.sql) == [(2,), (3,), (4,)]


@pytest.mark.parametrize("using", ["(SELECT 1)", "abs(1)", "n_name", "1 -- note", "1; DROP TABLE x",
                                   "1) UNION (SELECT 2", "CAST(n_name AS varchar)", "ARRAY[n_name]", "'a' || 'b'"])
def test_a_parameter_that_is_not_a_literal_is_refused(using):
    got = plan(f"EXECUTE q USING {using}", CAT, Session(prepared={"q": "SELECT ? FROM nation"}))
    assert (got.kind, got.error_name) == ("refused", "INVALID_PARAMETER_USAGE"), got


def test_a_wrong_parameter_count_names_both_counts():
    got = plan("EXECUTE q USING 1, 2", CAT, Session(prepared={"q": "SELECT ?"}))
    assert got.error_name == "INVALID_PARAMETER_USAGE"
    assert got.message == "Incorrect number of parameters: expected 1 but found 2"


def test_header_names_are_quoted_through_the_syntax_tree_or_refused():
    hostile = 'main" ; DROP TABLE x; --'
    got = plan("SELECT * FROM nation", CAT, Session(schema=hostile))
    assert got.kind == "query" and '"main"" ; DROP TABLE x; --".nation' in got.sql
    assert "DROP" not in got.sql.replace('"main"" ; DROP TABLE x; --"', "")
    shown = plan("SHOW TABLES", CAT, Session(schema="it's"))
    assert "table_schema = 'it''s'" in shown.sql
    for session, header in ((Session(schema="a\r\nb"), "X-Trino-Schema"), (Session(catalog="x\x00"), "X-Trino-Catalog"),
                            (Session(schema="s" * 200), "X-Trino-Schema")):
        refused = plan("SELECT 1", CAT, session)
        assert refused.kind == "refused" and header in refused.message
    assert plan('USE "a\nb"', CAT).kind == "refused"  # a name in USE goes back as a response header


def test_like_patterns_are_reescaped(tpch_db):
    got = plan("SHOW TABLES LIKE 'na''%' ESCAPE '\\'", CAT)
    assert "LIKE 'na''%' ESCAPE '\\'" in got.sql
    assert _run(tpch_db, plan("SHOW TABLES LIKE 'nat%'", CAT).sql) == [("nation",)]


@pytest.mark.parametrize("value", ["'abc'", "5e-324", "0", "-1", "'NaN'", "'inf'", "90000"])
def test_an_slo_outside_its_range_is_refused_when_set(value):
    got = plan(f"SET SESSION slo_s = {value}", CAT)
    assert got.error_name == "INVALID_SESSION_PROPERTY" and "'slo_s'" in got.message and "seconds" in got.message


def test_session_values_are_checked_once_for_every_way_in():
    from sloctl.serving.gateway.sql import validate_session_value

    assert validate_session_value("slo_s", "0.001") == "0.001"
    assert plan("SET SESSION slo_s = 0.25;", CAT).headers == (("X-Trino-Set-Session", "slo_s=0.25"),)
    assert plan("SET SESSION template = 'q1'", CAT).headers == (("X-Trino-Set-Session", "template=q1"),)
    for name, value in (("template", "a\x00b"), ("query_class", ""), ("query_class", "c" * 129), ("threads", "1")):
        with pytest.raises(ValueError, match=name):
            validate_session_value(name, value)


# -- refusals and engine errors that say what happened (issue 51) ---------------------------------------
@pytest.mark.parametrize("text, name, words", [
    ("CREATE SCHEMA memory.x", "NOT_SUPPORTED", ("CREATE SCHEMA", "'memory'")),
    ("CREATE SCHEMA tpch.x", "PERMISSION_DENIED", ("CREATE SCHEMA", "'tpch'")),
    ("CREATE INDEX i ON memory.default.t (a)", "NOT_SUPPORTED", ("CREATE INDEX", "'memory'")),
    ("INSERT INTO nation SELECT * FROM memory.default.t", "PERMISSION_DENIED", ("INSERT", "'tpch'", "read-only")),
    ("CREATE TABLE nation2 AS SELECT 1", "PERMISSION_DENIED", ("CREATE TABLE", "'tpch'", "memory.default")),
    ("ALTER TABLE memory.default.t RENAME TO u", "PERMISSION_DENIED", ("ALTER", "not allowed")),
])
def test_refusals_name_the_statement_the_catalog_and_the_rule(text, name, words):
    got = plan(text, Catalog("tpch", scratch=True))
    assert got.error_name == name, got
    assert all(w in got.message for w in words), got.message


#: One statement per refinement of the gateway's engine-error table, with the Trino name it must get.
ENGINE_ERRORS = [
    ("CREATE TABLE t (a INT)", "TABLE_ALREADY_EXISTS"), ("CREATE VIEW v AS SELECT 2", "TABLE_ALREADY_EXISTS"),
    ("CREATE SCHEMA s", "SCHEMA_ALREADY_EXISTS"), ("CREATE MACRO m(x) AS x", "ALREADY_EXISTS"),
    ("SELECT * FROM nope.t", "SCHEMA_NOT_FOUND"), ("CREATE TABLE nope.t (a INT)", "SCHEMA_NOT_FOUND"),
    ("SELECT * FROM nope", "TABLE_NOT_FOUND"), ("DROP VIEW nope", "TABLE_NOT_FOUND"),
    ("SELECT nofn(1)", "FUNCTION_NOT_FOUND"), ("SELECT 1::nosuchtype", "TYPE_NOT_FOUND"),
    ("SELECT zz FROM t", "COLUMN_NOT_FOUND"), ("SELECT sum(1, 2, 3)", "FUNCTION_NOT_FOUND"),
    ("SELECT 'x'::INT", "INVALID_CAST_ARGUMENT"), ("SET threads = 2", "PERMISSION_DENIED"),
    ("SELECT error('Division by zero')", "DIVISION_BY_ZERO"), ("SELECT 1 +", "SYNTAX_ERROR"),
    ("SELECT 2147483647::INT + 1", "NUMERIC_VALUE_OUT_OF_RANGE"),
    ("INSERT INTO u VALUES (1), (1)", "CONSTRAINT_VIOLATION"), ("DROP SCHEMA s", "SCHEMA_NOT_EMPTY"),
]


@pytest.mark.parametrize("text, name", ENGINE_ERRORS)
def test_engine_errors_map_to_trinos_names_by_class(text, name):
    import duckdb

    from sloctl.serving.gateway.gateway import _query_error

    con = duckdb.connect(config={"lock_configuration": False})
    con.execute("CREATE TABLE t (a INT); CREATE VIEW v AS SELECT 1; CREATE SCHEMA s; CREATE TABLE s.x (a INT); "
                "CREATE TABLE u (a INT PRIMARY KEY); CREATE MACRO m(x) AS x; SET lock_configuration = true")
    with pytest.raises(duckdb.Error) as caught:
        con.execute(text)
    got = _query_error(f"{type(caught.value).__name__}: {caught.value}")
    assert got is not None and got.name == name, (text, str(caught.value)[:200])
