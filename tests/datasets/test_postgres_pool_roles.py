"""A PostgreSQL backend's role: what the pool refuses at attach, the reader role it can make, errors by SQLSTATE."""

from __future__ import annotations

import pytest

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.postgres_pool import PostgresBackend, PostgresClusterPool, create_reader_role, trino_error

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def db(postgres_server):
    """A database with a table to serve and one to hide; returns its superuser URL."""
    url = postgres_server.create_database("pool_roles")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE served (i int)")
        conn.execute("INSERT INTO served VALUES (1), (2), (3)")
        conn.execute("CREATE TABLE hidden (secret text)")
    return url


def _as(url: str, role: str) -> str:
    return url.replace("postgres@", f"{role}@", 1)


def _admin(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _pool(url: str, **options) -> PostgresClusterPool:
    return PostgresClusterPool({"b": {"url": url, "pool_connections": 1, **options}})


def test_a_reader_role_reads_what_it_was_granted_and_nothing_else(db):
    reader = create_reader_role(db, "pr_reader", "s3cret", ["served"])
    assert reader.startswith("postgresql://pr_reader:s3cret@")
    with psycopg.connect(reader) as conn:
        assert conn.execute("SELECT count(*) FROM served").fetchone() == (3,)
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM hidden")
    with _pool(reader) as pool:
        check = pool.check_role("b")
        assert check.role == "pr_reader" and check.held == () and check.warnings == () and not check.refused


def test_making_the_reader_again_takes_away_what_was_granted_to_it_since(db):
    create_reader_role(db, "pr_again", None, ["served"])
    _admin(db, "GRANT pg_signal_backend TO pr_again")
    with _pool(_as(db, "pr_again")) as pool, pytest.raises(ClusterPoolError, match="pg_signal_backend"):
        pool.check_role("b")
    create_reader_role(db, "pr_again", None, ["served"])
    with _pool(_as(db, "pr_again")) as pool:
        assert pool.check_role("b").held == ()


def test_a_membership_through_a_group_names_the_group_to_revoke(db):
    create_reader_role(db, "pr_member", None, ["served"])
    _admin(db, "CREATE ROLE pr_ops NOLOGIN", "GRANT pg_read_server_files TO pr_ops", "GRANT pr_ops TO pr_member")
    with _pool(_as(db, "pr_member")) as pool, pytest.raises(ClusterPoolError) as caught:
        pool.check_role("b")
    message = str(caught.value)
    assert "'pr_member'" in message and "pg_read_server_files through pr_ops" in message
    assert "REVOKE pr_ops FROM pr_member;" in message


def test_an_owner_of_a_served_table_is_refused_and_told_to_reassign(db):
    _admin(db, "CREATE ROLE pr_owner LOGIN", "CREATE TABLE owned_here (i int)",
           "ALTER TABLE owned_here OWNER TO pr_owner")
    with _pool(_as(db, "pr_owner")) as pool, pytest.raises(ClusterPoolError) as caught:
        pool.check_role("b")
    assert "table public.owned_here" in str(caught.value) and "REASSIGN OWNED BY pr_owner" in str(caught.value)


def test_a_role_that_may_write_by_default_gets_a_warning_not_a_refusal(db):
    _admin(db, "CREATE ROLE pr_plain LOGIN", "GRANT SELECT ON served TO pr_plain")
    with _pool(_as(db, "pr_plain")) as pool:
        check = pool.check_role("b")
        assert check.held == () and not check.refused
        assert check.notes() == [f"backend 'b': {check.warnings[0]}"]
        assert "ALTER ROLE pr_plain SET default_transaction_read_only = on;" in check.warnings[0]


def test_every_attach_checks_so_a_role_granted_more_later_fails_to_come_back(db):
    create_reader_role(db, "pr_later", None, ["served"])
    with _pool(_as(db, "pr_later")) as pool:
        pool.wait_ready(pool.spin_up(1, cluster_id="b"), timeout_s=20)
        _admin(db, "ALTER ROLE pr_later SUPERUSER")
        try:
            pool.tear_down("b")
            pool.spin_up(1, cluster_id="b")
            with pytest.raises(ClusterPoolError, match="ALTER ROLE pr_later NOSUPERUSER;"):
                pool.wait_ready("b", timeout_s=20)
            assert pool.health("b")["role"]["held"][0].startswith("SUPERUSER")
        finally:
            _admin(db, "ALTER ROLE pr_later NOSUPERUSER")


def test_the_override_attaches_a_superuser_and_keeps_saying_so(db):
    with _pool(db, allow_privileged_role=True) as pool:
        info = pool.wait_ready(pool.spin_up(1, cluster_id="b"), timeout_s=20)
        assert info.state == "ready"
        role = pool.health("b")["role"]
        assert role["allowed"] is True and role["role"] == "postgres" and "ALTER ROLE postgres NOSUPERUSER;" in (
            role["revoke"])
        assert pool.roles_["b"].notes()[0].startswith("backend 'b': allow_privileged_role is on")
    with pytest.raises(ClusterPoolError, match="'allow_privileged_role' parameter of PostgresBackend"):
        PostgresBackend(db, allow_privileged_role="yes")


def test_bad_arguments_to_create_reader_role_are_named(db):
    with pytest.raises(ValueError, match="'role' parameter"):
        create_reader_role(db, "Robert'); DROP TABLE served;--", None, ["served"])
    with pytest.raises(ValueError, match="'role' parameter"):
        create_reader_role(db, "pg_mine", None, ["served"])
    with pytest.raises(ValueError, match="'tables' parameter"):
        create_reader_role(db, "pr_x", None, ["served; DROP TABLE served"])
    with pytest.raises(ValueError, match="'admin_url' parameter"):
        create_reader_role("host=127.0.0.1 dbname=x", "pr_x", None, ["served"])


class _ServerError(Exception):
    def __init__(self, sqlstate: str | None, message: str = "it failed") -> None:
        super().__init__(message)
        self.sqlstate, self.diag = sqlstate, None


@pytest.mark.parametrize(("code", "name"), [
    ("42P07", "TABLE_ALREADY_EXISTS"), ("3F000", "SCHEMA_NOT_FOUND"), ("42P01", "TABLE_NOT_FOUND"),
    ("42703", "COLUMN_NOT_FOUND"), ("42883", "FUNCTION_NOT_FOUND"), ("42601", "SYNTAX_ERROR"),
    ("42501", "PERMISSION_DENIED"), ("22012", "DIVISION_BY_ZERO"), ("21000", "SUBQUERY_MULTIPLE_ROWS"),
    ("42P18", "SYNTAX_ERROR"), ("2201B", "INVALID_FUNCTION_ARGUMENT"), ("0A001", "NOT_SUPPORTED"),
])
def test_server_errors_take_trinos_name_from_their_sqlstate(code, name):
    doc = trino_error(_ServerError(code, "relation already exists"))
    assert doc["errorName"] == name and doc["errorType"] == "USER_ERROR"
    assert doc["message"] == f"relation already exists (PostgreSQL SQLSTATE {code})"


@pytest.mark.parametrize("code", [None, "08006", "57014", "40001", "57P01"])
def test_errors_that_are_not_the_querys_fault_carry_no_trino_error(code):
    assert trino_error(_ServerError(code)) is None
    assert trino_error(_ServerError("53200"))["errorType"] == "INSUFFICIENT_RESOURCES"
