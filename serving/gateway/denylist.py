"""Functions the gateway refuses in any statement, on every engine: those that act outside the query.

A read-only query still calls functions, and some engines' functions reach
past the query that calls them: they end or cancel other sessions, read or
list files on the engine's host, reload the server's configuration, open
connections elsewhere, take locks that outlive the query, or run SQL given
as a string where no statement check sees it. Least-privilege engine roles
(docs/gateway.md, "Engine roles") and DuckDB's sandbox already stop most of
them; this list is defence in depth, checked by the gateway before any
engine sees the text, the same for DuckDB, PostgreSQL and Trino backends.

The list is kept here and only here: :data:`DENIED_FUNCTIONS` (exact names)
and :data:`DENIED_PREFIXES` (families such as ``pg_ls_*``, so that a new
member of a family is refused without an edit). Names match without regard
to case, schema-qualified (``pg_catalog.pg_terminate_backend(...)``) or not,
as scalar or table functions.

Left off on purpose:

* ``pg_sleep`` (and DuckDB's sleeps): it holds the caller's own connection
  for as long as the query's class allows, like any slow query; the
  statement timeout and ``max_run_time_s`` bound it.
* ``current_setting``: it reads a setting and changes nothing; PostgreSQL
  keeps the settings that name host paths (``data_directory``,
  ``config_file``, ...) from roles outside ``pg_read_all_settings``, and
  DuckDB's workers lock their configuration.
* ``pg_backend_pid``, ``pg_stat_activity`` and other views: reading them
  acts on nothing; what a role may see there is the role's business.

:func:`denied_call` checks a parsed sqlglot tree; :func:`denied_in_text`
checks text with DuckDB's tokenizer (what the gateway's DuckDB clusters will
parse); :meth:`Denial.message` is the refusal a client reads.
"""

from __future__ import annotations

import bisect
import re
import string
from dataclasses import dataclass
from typing import Any

__all__ = ["DENIED_FUNCTIONS", "DENIED_PREFIXES", "DENIED_RELATIONS", "Denial", "denial_for", "denied_call",
           "denied_in_text", "denied_relation"]

_SESSIONS = "it signals other sessions"
_HOST_FILES = "it reads or lists files on the engine's host"
_SERVER = "it changes the server's state for every session"
_ELSEWHERE = "it connects to other servers or reads data outside the served tables"
_SQL_TEXT = "it runs SQL given as a string, out of the gateway's statement check"
_LOCKS = "it takes locks that outlive the query and block other sessions"
_SETTINGS = "it changes the session's settings (limits the gateway set)"
_SECRETS = "it reveals credentials or the host's environment"

#: Exact function names (lower case) and why each is refused.
DENIED_FUNCTIONS: dict[str, str] = {
    # PostgreSQL: other sessions
    "pg_terminate_backend": "it ends other sessions",
    "pg_cancel_backend": "it cancels other sessions' queries",
    "pg_notify": _SESSIONS,
    "pg_log_backend_memory_contexts": "it writes to the server's log on another session's behalf",
    # PostgreSQL: the server and its files
    "pg_reload_conf": "it reloads the server's configuration",
    "pg_rotate_logfile": "it rotates the server's log file",
    "pg_rotate_logfile_old": "it rotates the server's log file",
    "pg_stat_file": _HOST_FILES,
    "pg_switch_wal": _SERVER,
    "pg_promote": _SERVER,
    "pg_backup_start": _SERVER,
    "pg_backup_stop": _SERVER,
    "pg_start_backup": _SERVER,
    "pg_stop_backup": _SERVER,
    "pg_drop_replication_slot": _SERVER,
    "pg_import_system_collations": _SERVER,
    "pg_stat_statements_reset": _SERVER,
    "lo_import": "it reads a file on the engine's host into the database",
    "lo_export": "it writes a file on the engine's host",
    # PostgreSQL: the session's own limits
    "set_config": _SETTINGS,
    # SQL in a string: the text inside is never checked
    "query_to_xml": _SQL_TEXT,
    "query_to_xmlschema": _SQL_TEXT,
    "query_to_xml_and_xmlschema": _SQL_TEXT,
    "cursor_to_xml": _SQL_TEXT,
    "cursor_to_xmlschema": _SQL_TEXT,
    "table_to_xml": _SQL_TEXT,
    "table_to_xmlschema": _SQL_TEXT,
    "table_to_xml_and_xmlschema": _SQL_TEXT,
    "schema_to_xml": _SQL_TEXT,
    "schema_to_xmlschema": _SQL_TEXT,
    "schema_to_xml_and_xmlschema": _SQL_TEXT,
    "database_to_xml": _SQL_TEXT,
    "database_to_xmlschema": _SQL_TEXT,
    "database_to_xml_and_xmlschema": _SQL_TEXT,
    "ts_stat": _SQL_TEXT,
    "query": _SQL_TEXT,  # DuckDB's query('...') and Trino connectors' system.query(query => '...')
    "query_table": _SQL_TEXT,
    "json_execute_serialized_sql": _SQL_TEXT,
    # DuckDB: the host's files (the workers' sandbox refuses them too)
    "glob": _HOST_FILES,
    "sniff_csv": _HOST_FILES,
    "delta_scan": _HOST_FILES,
    "st_read": _HOST_FILES,
    "st_read_meta": _HOST_FILES,
    # DuckDB: secrets and the environment
    "duckdb_secrets": _SECRETS,
    "which_secret": _SECRETS,
    "getenv": _SECRETS,
}

#: Families of functions, by prefix (lower case), and why each is refused.
DENIED_PREFIXES: dict[str, str] = {
    "pg_read_": _HOST_FILES,  # pg_read_file, pg_read_binary_file
    "pg_ls_": _HOST_FILES,  # pg_ls_dir, pg_ls_logdir, pg_ls_waldir, pg_ls_tmpdir, ...
    "pg_file_": "it writes, renames or deletes files on the engine's host",  # adminpack
    "pg_stat_reset": _SERVER,
    "pg_create_": _SERVER,  # restore points, replication slots
    "pg_copy_": _SERVER,  # pg_copy_physical_replication_slot, ...
    "pg_replication_": _SERVER,  # replication origins and slot advance
    "pg_logical_": "it reads or writes the server's change stream, past the table grants",
    "pg_wal_replay_": _SERVER,
    "pg_advisory_": _LOCKS,
    "pg_try_advisory_": _LOCKS,
    "dblink": _ELSEWHERE,  # dblink, dblink_exec, dblink_connect, ...
    "read_": _HOST_FILES,  # DuckDB: read_text, read_blob, read_csv, read_parquet, read_json, read_ndjson, ...
    "parquet_": _HOST_FILES,  # DuckDB: parquet_scan, parquet_metadata, parquet_schema, ...
    "iceberg_": _HOST_FILES,
    "sqlite_": _ELSEWHERE,  # DuckDB: sqlite_scan, sqlite_attach
    "postgres_": _ELSEWHERE,  # DuckDB: postgres_scan, postgres_query, postgres_execute, ...
    "mysql_": _ELSEWHERE,
}

_WORD = re.compile(r"[A-Za-z_\x80-\U0010ffff][\w$\x80-\U0010ffff]*")
_ENTRIES = (*DENIED_FUNCTIONS, *DENIED_PREFIXES)
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


#: PostgreSQL's views of other sessions: every gateway user shares the backend's one role, so through them a
#: user would read the other users' query text, their clients' addresses and who waits on whose locks.
DENIED_RELATIONS: dict[str, str] = {
    "pg_stat_activity": "it shows the other sessions of the gateway's role, with their query text",
    "pg_stat_statements": "it shows every session's statements",
    "pg_stat_statements_info": "it shows every session's statements",
    "pg_locks": "it shows the other sessions' locks",
    "pg_blocking_pids": "it shows which sessions block which",
    "pg_stat_ssl": "it shows the other sessions' connections",
    "pg_stat_gssapi": "it shows the other sessions' connections",
    "pg_prepared_statements": "it shows the session's prepared statements, the gateway's own among them",
}


def _base_name(name: str) -> str:
    """``name`` without its schema or quotes, in lower case (how the lists spell their entries)."""
    return name.strip().strip('"').rsplit(".", 1)[-1].strip().strip('"').lower()


def denied_relation(name: str) -> str | None:
    """The refusal message for reading the relation ``name`` (any case, optionally schema-qualified), or ``None``."""
    base = _base_name(name)
    reason = DENIED_RELATIONS.get(base)
    if reason is None:
        return None
    return f"Access Denied: relation {base} is not allowed by the sloctl gateway: {reason}."


@dataclass(frozen=True)
class Denial:
    """A denied call: the function as written (lower case), the list entry it matched and why.

    Attributes:
        function: the called name, without its schema.
        rule: the entry of the list: the name itself, or a prefix with ``*`` (``pg_ls_*``).
        reason: why the entry is on the list.
    """

    function: str
    rule: str
    reason: str

    @property
    def message(self) -> str:
        """The refusal as a client reads it (Trino's ``PERMISSION_DENIED`` wording)."""
        entry = "" if self.rule == self.function else f"; deny-list entry {self.rule}"
        return (f"Access Denied: function {self.function} is not allowed by the sloctl gateway: it acts outside "
                f"the query ({self.reason}{entry}).")


def denial_for(name: str) -> Denial | None:
    """The :class:`Denial` of calling a function named ``name`` (any case, optionally schema-qualified), or ``None``."""
    base = _base_name(name)
    if base in DENIED_FUNCTIONS:
        return Denial(base, base, DENIED_FUNCTIONS[base])
    for prefix, reason in DENIED_PREFIXES.items():
        if base.startswith(prefix):
            return Denial(base, f"{prefix}*", reason)
    return None


def denied_call(tree: Any) -> Denial | None:
    """The first denied function ``tree`` calls (scalar or table function, any schema), or ``None``.

    Args:
        tree: a parsed sqlglot expression (``sqlglot.parse_one(...)``).

    Returns:
        The :class:`Denial` of the first such call in the tree's walk order.
    """
    from sqlglot import exp

    for node in tree.walk():
        if isinstance(node, exp.Anonymous):
            names = [node.name]
        elif isinstance(node, exp.Func):
            names = [node.sql_name(), *type(node).sql_names()]
        else:
            continue
        for name in names:
            denial = denial_for(str(name))
            if denial is not None:
                return denial
    return None


def denied_in_text(text: str) -> Denial | None:
    """The first denied function that ``text`` calls, found with DuckDB's tokenizer (``name (`` pairs).

    Strings and comments are not calls, so a literal that spells a denied
    name passes. Only the tokens where an entry is spelled are looked at,
    so the cost stays linear in the text (DuckDB's tokenizer runs in C++ and
    executes nothing).
    """
    import duckdb

    low = text.translate(_ASCII_LOWER)  # the entries are ASCII; positions stay those of ``text``
    spelled: set[int] = set()
    for entry in _ENTRIES:
        at = low.find(entry)
        while at >= 0:
            spelled.update((at, at - 1))  # a name's token starts there, or at its opening quote
            at = low.find(entry, at + 1)
    if not spelled:
        return None
    names = (duckdb.token_type.identifier, duckdb.token_type.keyword)
    tokens = duckdb.tokenize(text)
    starts = [start for start, _ in tokens]
    for at in sorted(spelled):
        i = bisect.bisect_left(starts, at)
        if i + 1 >= len(tokens) or starts[i] != at or tokens[i][1] not in names:
            continue
        after = starts[i + 1]
        if text[after:after + 1] != "(":
            continue
        name = _token_name(text[at:after])
        denial = None if name is None else denial_for(name)
        if denial is not None:
            return denial
    return None


def _token_name(span: str) -> str | None:
    """The identifier at the start of a token's text (quoted or not); what follows it (comments, spaces) is not."""
    if span.startswith('"'):
        end = 1
        while True:
            end = span.find('"', end)
            if end < 0:
                return None
            if span[end + 1:end + 2] != '"':
                return span[1:end].replace('""', '"')
            end += 2
    m = _WORD.match(span)
    return m.group(0) if m else None
