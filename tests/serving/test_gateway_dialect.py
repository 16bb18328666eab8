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
    assert in_memory.target == "scratch" and 'memory."default".t' in in_memory.sql
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
