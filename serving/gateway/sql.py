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

import math
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_QUERY_LENGTH", "SESSION_PROPERTIES", "Statement", "check_statement", "strip_terminator",
           "trino_names", "validate_session_value"]

#: Trino's ``query.max-length`` default, in characters.
DEFAULT_MAX_QUERY_LENGTH = 1_000_000

#: Session properties a client may set (``SET SESSION`` or ``X-Trino-Session``): the gateway's own.
SESSION_PROPERTIES = {
    "slo_s": "the query's SLO, seconds",
    "template": "the template the query belongs to (its latency model's name for it)",
    "query_class": "the class asked for (only one the user may use)",
}

#: The range of ``slo_s`` (seconds): a millisecond to a day; a value outside it is a mistake, not an SLO.
SLO_RANGE_S = (0.001, 86_400.0)
#: The longest ``template`` / ``query_class`` value, characters.
MAX_NAME_LENGTH = 128


def _slo_s(value: str) -> str:
    try:
        slo_s = float(value)
    except ValueError:
        slo_s = float("nan")
    low, high = SLO_RANGE_S
    if not (math.isfinite(slo_s) and low <= slo_s <= high):
        raise ValueError(f"The session property 'slo_s' must be a number of seconds from {low:g} to {high:g} "
                         f"(e.g. SET SESSION slo_s = 2.5), got {value[:80]!r}.")
    return value.strip()


def _name(prop: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not 0 < len(value) <= MAX_NAME_LENGTH or not value.isprintable():
            raise ValueError(f"The session property {prop!r} must be a name of 1 to {MAX_NAME_LENGTH} printable "
                             f"characters (no control characters), got {value[:80]!r}.")
        return value
    return check


_VALIDATORS: dict[str, Callable[[str], str]] = {
    "slo_s": _slo_s, "template": _name("template"), "query_class": _name("query_class")}


def validate_session_value(name: str, value: str) -> str:
    """``value`` of session property ``name`` as the gateway keeps it, checked once for every way in.

    ``SET SESSION`` and the ``X-Trino-Session`` header both pass here, so a
    value the gateway would choke on later (``slo_s = 'abc'``, a 5e-324 s
    SLO, a template name with a NUL byte) is refused when it is set, naming
    the property and the form it takes.

    Raises:
        ValueError: ``name`` is not one of :data:`SESSION_PROPERTIES`, or
            ``value`` does not have its form.
    """
    check = _VALIDATORS.get(name)
    if check is None:
        raise ValueError(f"Session property {name!r} does not exist on the sloctl gateway (known: "
                         f"{', '.join(SESSION_PROPERTIES)}); engine settings cannot be changed.")
    return check(value)


_ALLOWED = {"SELECT", "EXPLAIN"}
# Linear by construction: the caller strips the terminator first (strip_terminator), so no lazy group has to
# find where the value ends, and every quantifier is possessive (nothing to backtrack into).
_SET_SESSION = re.compile(r"\s*+SET\s++SESSION\s++([A-Za-z_][\w.]*+)\s*+=\s*+(.*)", re.IGNORECASE | re.DOTALL)
_RESET_SESSION = re.compile(r"\s*+RESET\s++SESSION\s++([A-Za-z_][\w.]*+)", re.IGNORECASE)


def strip_terminator(text: str) -> str:
    """``text`` without trailing white space and one trailing ``;`` (and the white space before it).

    Done in code so that no pattern needs a ``\\s*;?\\s*$`` tail after a lazy group (a
    quadratic backtracking trap on long runs of spaces).
    """
    text = text.rstrip()
    return text[:-1].rstrip() if text.endswith(";") else text


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
    bare = strip_terminator(sql)
    match = _SET_SESSION.fullmatch(bare)
    if match:
        name, value = match.group(1).lower(), _literal(match.group(2).strip())
        try:
            value = validate_session_value(name, value)
        except ValueError as exc:
            return Statement("refused", "INVALID_SESSION_PROPERTY", str(exc))
        return Statement("set_session", name=name, value=urllib.parse.quote(value, safe=""))
    match = _RESET_SESSION.fullmatch(bare)
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
