"""The gateway's deny list: every entry refused in every spelling, on the DuckDB plan and the PostgreSQL text."""

from __future__ import annotations

import pytest

from sloctl.serving.gateway.backends import postgres_text
from sloctl.serving.gateway.denylist import DENIED_FUNCTIONS, DENIED_PREFIXES, denial_for, denied_call, denied_in_text
from sloctl.serving.gateway.dialect import Catalog, plan

CAT = Catalog("tpch")
#: One name per entry: the exact names, and a member of each family.
ENTRIES = [*DENIED_FUNCTIONS, *(f"{prefix}dir" for prefix in DENIED_PREFIXES)]


def test_the_list_holds_what_a_stranger_would_reach_for_first():
    must = {"pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_read_file", "pg_read_binary_file",
            "pg_ls_dir", "pg_ls_waldir", "pg_stat_file", "lo_import", "lo_export", "set_config", "dblink",
            "dblink_exec", "pg_rotate_logfile", "pg_switch_wal", "pg_create_restore_point", "pg_promote",
            "pg_advisory_lock", "pg_notify", "query_to_xml", "read_text", "read_blob", "read_csv", "read_csv_auto",
            "read_parquet", "read_json_auto", "glob", "sniff_csv", "parquet_metadata", "duckdb_secrets", "getenv"}
    assert {name for name in must if denial_for(name) is None} == set()
    assert all(reason.startswith("it ") for reason in [*DENIED_FUNCTIONS.values(), *DENIED_PREFIXES.values()])


@pytest.mark.parametrize("name", ENTRIES)
def test_every_entry_is_refused_as_a_scalar_a_table_function_and_schema_qualified(name):
    import sqlglot

    for text in (f"SELECT {name}('x')", f"SELECT * FROM {name}('x')", f"SELECT pg_catalog.{name.upper()}(1, 2)"):
        refused = plan(text, CAT)
        assert refused.kind == "refused" and refused.error_name == "PERMISSION_DENIED", (text, refused)
        assert f"function {name} is not allowed" in refused.message and "acts outside the query" in refused.message
        with pytest.raises(ValueError, match=f"function {name} is not allowed"):
            postgres_text(text)
        assert denied_in_text(text).function == name
    try:
        tree = sqlglot.parse_one(f"SELECT a FROM t WHERE {name}(a) IS NULL", read="trino")
    except sqlglot.errors.ParseError:  # a name sqlglot reads as an operator (glob): the text check covers it
        return
    assert denied_call(tree).function == name


def test_a_message_names_the_function_and_why():
    refused = plan("SELECT pg_terminate_backend(pid) FROM pg_stat_activity", CAT)
    assert refused.message == ("Access Denied: function pg_terminate_backend is not allowed by the sloctl gateway: "
                               "it acts outside the query (it ends other sessions).")
    assert "deny-list entry pg_ls_*" in plan("SELECT pg_ls_logdir()", CAT).message


@pytest.mark.parametrize("text", [
    'SELECT "PG_READ_FILE"(\'/etc/hostname\')',
    "SELECT pg_read_file /* a comment */ ('/etc/hostname')",
    "SELECT * FROM (SELECT pid FROM pg_stat_activity) s WHERE Pg_Terminate_Backend(s.pid)",
    "EXPLAIN SELECT pg_reload_conf()",
    "SELECT 1 UNION ALL SELECT count(*) FROM read_csv_auto('/etc/passwd')",
])
def test_quoting_case_comments_and_nesting_do_not_hide_a_call(text):
    refused = plan(text, CAT)
    assert refused.kind == "refused" and refused.error_name == "PERMISSION_DENIED", refused


@pytest.mark.parametrize("text", [
    "SELECT 'pg_terminate_backend(1)' AS quoted",
    "SELECT 1 AS pg_terminate_backend",
    "SELECT current_setting('threads')",
    "SELECT pg_backend_pid()",
    "SELECT count(*) FROM nation",
])
def test_names_that_are_not_calls_and_harmless_functions_pass(text):
    assert plan(text, CAT).kind == "query"
    assert denied_in_text(text) is None


def test_postgresql_text_keeps_its_own_catalog_schemas_and_drops_the_gateways():
    assert postgres_text("SELECT table_name FROM information_schema.tables") == (
        "SELECT table_name FROM information_schema.tables")
    assert postgres_text("SELECT rolname FROM tpch.pg_catalog.pg_roles") == "SELECT rolname FROM pg_catalog.pg_roles"
    assert postgres_text("SELECT count(*) FROM tpch.main.nation") == "SELECT COUNT(*) FROM nation"
