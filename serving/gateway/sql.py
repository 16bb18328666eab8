"""What the SLO gateway accepts as a statement, checked before anything runs.

The gateway process never executes client SQL: it only *parses* it with
DuckDB's parser (``duckdb.extract_statements``, which builds the syntax tree
and runs nothing) to decide, in this order:

1. Text longer than ``max_length`` characters (Trino's ``query.max-length``,
   1,000,000 by default) is refused before it is parsed (HTTP 413).
2. ``SET SESSION name = value`` and ``RESET SESSION name`` are Trino session
   statements: the gateway answers them itself with the
   ``X-Trino-Set-Session`` / ``X-Trino-Clear-Session`` headers, so the value
   lives in the client's session and travels with each later query; no
   engine setting ever changes.
3. Empty or comment-only text is a ``SYNTAX_ERROR`` at once.
4. More than one statement is refused (``NOT_SUPPORTED``): one statement per
   request, as Trino.
5. Only read statements run: ``SELECT`` (with ``WITH``, ``VALUES``, ``SHOW``,
   ``DESCRIBE``, ``SUMMARIZE``, which DuckDB parses as ``SELECT``) and
   ``EXPLAIN``. Every other kind (``SET``, ``PRAGMA``, ``COPY``, ``ATTACH``,
   ``INSTALL``/``LOAD``, ``CREATE``, ``INSERT``, ``CALL``, ...) is refused with
   ``PERMISSION_DENIED`` naming the statement kind.

What a read statement may touch is then the cluster worker's business: its
DuckDB is sandboxed (external access off, configuration locked, a memory
limit; :mod:`sloctl.datasets._cluster_worker`).
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_QUERY_LENGTH", "SESSION_PROPERTIES", "Statement", "check_statement", "trino_names"]

#: Trino's ``query.max-length`` default, in characters.
DEFAULT_MAX_QUERY_LENGTH = 1_000_000

#: Session properties a client may set (``SET SESSION`` or ``X-Trino-Session``): the gateway's own.
SESSION_PROPERTIES = {
    "slo_s": "the query's SLO, seconds",
    "template": "the template the query belongs to (its latency model's name for it)",
    "query_class": "the class asked for (only one the user may use)",
}

_ALLOWED = {"SELECT", "EXPLAIN"}
_SET_SESSION = re.compile(r"^\s*SET\s+SESSION\s+([A-Za-z_][\w.]*)\s*=\s*(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_RESET_SESSION = re.compile(r"^\s*RESET\s+SESSION\s+([A-Za-z_][\w.]*)\s*;?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Statement:
    """The verdict on one request's text.

    Attributes:
        kind: ``query`` (run it on a cluster), ``set_session``,
            ``reset_session`` or ``refused``.
        error_name: the Trino error of a refused text (``SYNTAX_ERROR``,
            ``NOT_SUPPORTED``, ``PERMISSION_DENIED``, ``INVALID_SESSION_PROPERTY``).
        message: why it was refused.
        name, value: the session property of ``set_session`` / ``reset_session``.
    """

    kind: str
    error_name: str = ""
    message: str = ""
    name: str = ""
    value: str = ""

    @property
    def refused(self) -> bool:
        return self.kind == "refused"


def _literal(text: str) -> str:
    """A ``SET SESSION`` value as its string: quoted literals unquoted, others as written."""
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    return text


#: What the gateway's scratch worker (the ``memory`` catalog) runs besides reads.
SCRATCH_WRITES = frozenset({"CREATE", "INSERT", "DELETE", "UPDATE", "DROP"})


def check_statement(sql: str, writes: bool = False) -> Statement:
    """Decide what to do with ``sql`` (length already checked by the caller; see the module docstring).

    ``writes``: the text is for the scratch worker, which also runs :data:`SCRATCH_WRITES`.
    """
    match = _SET_SESSION.match(sql)
    if match:
        name, value = match.group(1).lower(), _literal(match.group(2).strip())
        if name not in SESSION_PROPERTIES:
            return Statement("refused", "INVALID_SESSION_PROPERTY",
                             f"Session property {name!r} does not exist on the sloctl gateway (known: "
                             f"{', '.join(SESSION_PROPERTIES)}); engine settings cannot be changed.")
        return Statement("set_session", name=name, value=urllib.parse.quote(value, safe=""))
    match = _RESET_SESSION.match(sql)
    if match:
        return Statement("reset_session", name=match.group(1).lower())
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        return Statement("refused", "SYNTAX_ERROR", " ".join(f"{type(exc).__name__}: {exc}".split()))
    if not statements:
        return Statement("refused", "SYNTAX_ERROR",
                         "line 1:1: the query text holds no statement (it is empty or only comments).")
    if len(statements) > 1:
        return Statement("refused", "NOT_SUPPORTED",
                         f"The sloctl gateway runs one statement per request; the text holds {len(statements)}.")
    kind = statements[0].type.name
    if kind not in _ALLOWED and not (writes and kind in SCRATCH_WRITES):
        label = {"LOAD": "INSTALL/LOAD", "SET": "SET/PRAGMA/USE"}.get(kind, kind)
        return Statement("refused", "PERMISSION_DENIED",
                         f"Access Denied: {label} statements are not allowed by the sloctl gateway (it runs "
                         f"read-only SELECT and EXPLAIN statements; session settings: SET SESSION "
                         f"{'|'.join(SESSION_PROPERTIES)} = ...).")
    return Statement("query")


def trino_names(names: tuple[str | None, ...] | None, columns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``columns`` (name, DuckDB type) with Trino's names: an unnamed expression is ``_colN`` (N its position).

    DuckDB names such a column after its expression (``count_star()``,
    ``(1 + 2)``); Trino clients expect ``_col0``, ``_col1``, ... ``names`` are
    the statement's output names as written (``None`` for an unnamed
    expression; :func:`~sloctl.serving.gateway.dialect.plan` finds them); when
    they are not known, DuckDB's names stay.
    """
    if names is None or len(names) != len(columns):
        return columns
    return [(f"_col{i}" if given is None else name, kind)
            for i, (given, (name, kind)) in enumerate(zip(names, columns, strict=True))]
