"""The memory catalog's tables belong to whoever created them (issue 51, owned scratch)."""

from __future__ import annotations

import pytest

from sloctl.serving.gateway.dialect import Catalog, Session, plan, scratch_table


@pytest.fixture(scope="module")
def gateway(tpch_db, tmp_path_factory):
    """A gateway on one size-1 DuckDB cluster with its memory catalog (the scratch worker)."""
    from sloctl.serving.gateway import Gateway, GatewayOptions

    served = Gateway(tpch_db, GatewayOptions(cluster_sizes=(1,), router="least-queued",
                                             log_dir=tmp_path_factory.mktemp("scratch-logs"),
                                             scratch_memory_limit="32MB")).start()
    try:
        yield served
    finally:
        served.close()


def _run(gateway, sql: str, user: str, admin: bool = False):
    q = gateway.submit(sql, user=user, trino=Session(user=user, admin=admin))
    assert q.done.wait(60), sql
    return q


def _rows(gateway, sql: str, user: str, admin: bool = False) -> list[list]:
    q = _run(gateway, sql, user, admin)
    assert q.error is None, (sql, q.error)
    return q.data


def test_another_user_can_neither_see_nor_touch_a_memory_table(gateway):
    assert _rows(gateway, "CREATE TABLE memory.default.picks AS SELECT n_nationkey FROM nation "
                          "WHERE n_regionkey = 1", "ann") == [[5]]
    assert _rows(gateway, "INSERT INTO memory.default.picks VALUES (99)", "ann") == [[1]]
    for sql in ("SELECT count(*) FROM memory.default.picks", "UPDATE memory.default.picks SET n_nationkey = 0",
                "DELETE FROM memory.default.picks", "DROP TABLE memory.default.picks",
                "INSERT INTO memory.default.picks VALUES (1)"):
        q = _run(gateway, sql, "bob")
        assert q.error is not None and q.error.name == "TABLE_NOT_FOUND", (sql, q.error)
        assert scratch_table("ann", "") not in q.error.message  # no hint at the owner's table
    assert _rows(gateway, "SHOW TABLES FROM memory.default", "bob") == []
    assert _rows(gateway, "SELECT count(*) FROM memory.information_schema.tables", "bob") == [[0]]
    assert _rows(gateway, "SHOW TABLES FROM memory.default", "ann") == [["picks"]]
    assert _rows(gateway, "SELECT count(*) FROM memory.default.picks", "ann") == [[6]]  # all of it, still


def test_each_user_has_its_own_table_of_the_same_name(gateway):
    for user, value in (("cat", 1), ("dan", 2)):
        assert _rows(gateway, f"CREATE TABLE memory.default.mine AS SELECT {value} AS v", user) == [[1]]
    assert _rows(gateway, "SELECT v FROM memory.default.mine", "cat") == [[1]]
    assert _rows(gateway, "SELECT v FROM memory.default.mine", "dan") == [[2]]
    assert _rows(gateway, "DESCRIBE memory.default.mine", "dan")[0][:2] == ["v", "integer"]


def test_an_admin_reaches_a_users_tables_by_the_users_name(gateway):
    assert _rows(gateway, "CREATE TABLE memory.default.kept AS SELECT 7 AS v", "eve") == [[1]]
    assert _rows(gateway, 'SELECT v FROM memory."eve".kept', "root", admin=True) == [[7]]
    assert ["eve"] in _rows(gateway, "SHOW SCHEMAS FROM memory", "root", admin=True)
    q = _run(gateway, 'SELECT v FROM memory."eve".kept', "bob")
    assert q.error is not None and q.error.name == "SCHEMA_NOT_FOUND"


def test_table_functions_that_list_the_scratch_catalog_are_refused():
    got = plan("SELECT * FROM memory.default.t, duckdb_tables()", Catalog("tpch", scratch=True), Session(user="x"))
    assert got.error_name == "PERMISSION_DENIED" and "duckdb_tables" in got.message
    ok = plan("SELECT * FROM memory.default.t, range(3)", Catalog("tpch", scratch=True), Session(user="x"))
    assert ok.kind == "query"


def test_scratch_names_are_distinct_for_distinct_users():
    users = ["", "a", "a.b", "ab", "u", "é", "a\x00"]
    names = {scratch_table(u, "t") for u in users} | {scratch_table("a", "b.t")}
    assert len(names) == len(users) + 1
