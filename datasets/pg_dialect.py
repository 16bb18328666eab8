"""Trino SQL for PostgreSQL, and what kind of statement a text holds.

:func:`trino_to_postgres` translates what a Trino client sends (the SLO
gateway's dialect) into PostgreSQL's with sqlglot, so that a
:class:`~sloctl.datasets.postgres_pool.PostgresClusterPool` can run it.
:func:`statement_kind` reads a statement's first keyword past comments and
parentheses: the pool runs only the kinds in :data:`RUNNABLE`.
"""

from __future__ import annotations

import re

__all__ = ["CURSOR_KINDS", "RUNNABLE", "statement_kind", "trino_to_postgres"]

#: Statement kinds a PostgreSQL cluster runs for a client (first keywords). Every attempt runs in a
#: ``READ ONLY`` transaction besides; this list keeps out what that allows and still reaches outside the
#: database (``COPY ... TO`` a file, ``DO``, session commands).
RUNNABLE = ("SELECT", "WITH", "VALUES", "TABLE", "EXPLAIN", "SHOW")
#: The kinds a server-side cursor (``DECLARE ... CURSOR FOR``) takes: those stream in bounded memory.
CURSOR_KINDS = ("SELECT", "WITH", "VALUES", "TABLE")

_MAX_SHOWN = 200  # characters of a statement quoted in an error


def _plain(message: str) -> str:
    """sqlglot's message on one line, without the terminal codes that underline the bad token."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", message).split())


def _shown(sql: str) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def trino_to_postgres(sql: str) -> str:
    """Translate one Trino statement into PostgreSQL's dialect (``sqlglot``, read ``trino``, write ``postgres``).

    Constructs PostgreSQL has no counterpart for are refused rather than
    passed on half-translated (sqlglot's ``unsupported_level`` is ``RAISE``).
    A trailing ``;`` is dropped.

    Args:
        sql: one statement in Trino's dialect.

    Returns:
        The statement in PostgreSQL's dialect, without a trailing ``;``.

    Raises:
        ValueError: ``sql`` is not a string holding exactly one statement that
            sqlglot can parse as Trino and write as PostgreSQL (the message
            quotes the statement).
    """
    if not isinstance(sql, str) or not sql.strip():
        raise ValueError(f"The 'sql' parameter of trino_to_postgres must be one Trino statement, got {sql!r}.")
    import sqlglot
    from sqlglot.errors import ErrorLevel, SqlglotError

    try:
        out = [
            s
            for s in sqlglot.transpile(sql, read="trino", write="postgres", unsupported_level=ErrorLevel.RAISE)
            if s.strip()
        ]
    except SqlglotError as exc:
        raise ValueError(
            f"The 'sql' parameter of trino_to_postgres must be a Trino statement that can be written "
            f"in PostgreSQL's dialect; {_shown(sql)!r} cannot: {_plain(str(exc))}"
        ) from exc
    if len(out) != 1:
        raise ValueError(
            f"The 'sql' parameter of trino_to_postgres must hold exactly one statement, got {len(out)} "
            f"in {_shown(sql)!r}."
        )
    return out[0]


def statement_kind(sql: str) -> str:
    """The first keyword of ``sql``, upper case, past whitespace, comments and opening parentheses.

    PostgreSQL's comments: ``-- ...`` to the end of the line and ``/* ...
    */``, which nest. A text that starts with anything but a word (or holds
    only comments) has the kind ``""``.

    Args:
        sql: a statement.

    Returns:
        e.g. ``"SELECT"`` for ``"/* q1 */ (SELECT 1)"``.
    """
    i, n = 0, len(sql)
    while i < n:
        if sql[i].isspace() or sql[i] == "(":
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif sql.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if sql.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        else:
            break
    start = i
    while i < n and (sql[i].isalpha() or sql[i] == "_"):
        i += 1
    return sql[start:i].upper()
