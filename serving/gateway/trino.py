"""The Trino client REST protocol, as the SLO gateway speaks it: types, result pages, errors.

What an unmodified Trino client (the ``trino`` Python package's DB-API and
SQLAlchemy dialect, the JDBC driver, the CLI) expects from a coordinator:

* ``POST /v1/statement`` with the SQL as the body answers a first
  ``QueryResults`` document: ``id``, ``infoUri``, ``nextUri``, ``stats``;
* the client follows ``nextUri`` (``GET``) until a document has none; a
  document carries ``columns`` (name, type and ``typeSignature``) once the
  result is known, and ``data`` (a page of rows as JSON values);
* a failed query answers a document with ``error`` (``message``,
  ``errorCode``, ``errorName``, ``errorType``, ``failureInfo``);
* ``DELETE nextUri`` cancels the query (``204``).

The Trino client maps each value by its column's ``typeSignature``
(``trino/mapper.py``): this module turns DuckDB's type names into Trino's
(``DECIMAL(15,2)`` → ``decimal(15,2)``, ``TIMESTAMP`` → ``timestamp(6)``, ...)
so that decimals, dates and timestamps come back as Python ``Decimal``,
``date`` and ``datetime``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sloctl.datasets.duckdb_types import DuckType, parse_type

__all__ = ["SIMPLE_TYPES", "TrinoError", "column", "error_doc", "stats_doc", "trino_type"]

#: DuckDB type names with one Trino name each (the rest are built: decimals, arrays, maps, rows).
SIMPLE_TYPES = {
    "BOOLEAN": "boolean", "TINYINT": "tinyint", "SMALLINT": "smallint", "INTEGER": "integer", "BIGINT": "bigint",
    "UTINYINT": "smallint", "USMALLINT": "integer", "UINTEGER": "bigint", "UBIGINT": "decimal(20,0)",
    "HUGEINT": "decimal(38,0)", "UHUGEINT": "decimal(38,0)", "FLOAT": "real", "DOUBLE": "double",
    "VARCHAR": "varchar", "DATE": "date", "TIME": "time(6)", "TIMESTAMP": "timestamp(6)",
    "TIMESTAMP_S": "timestamp(0)", "TIMESTAMP_MS": "timestamp(3)", "TIMESTAMP_NS": "timestamp(9)",
    "TIMESTAMP WITH TIME ZONE": "timestamp(6) with time zone", "TIME WITH TIME ZONE": "time(6) with time zone",
    "BLOB": "varbinary", "UUID": "uuid", "JSON": "json", "INTERVAL": "interval day to second",
    "NULL": "varchar", "\"NULL\"": "varchar",
}
# Linear patterns (possessive quantifiers, applied with fullmatch): type names come from backends, but a backend's
# type names can carry a client's column names.
_NAMED = re.compile(r"[a-z_][a-z0-9_]*+")
_PARAMETRIC = re.compile(r"(decimal|timestamp|time)\(([\d,]++)\)( with time zone)?+")
_TYPE_CALL = re.compile(r"([a-z][a-z ]*+)\((.*)\)(\s++with time zone)?+", re.DOTALL)
_ROW_FIELD = re.compile(r'("(?:[^"]|"")++"|[A-Za-z_][A-Za-z0-9_]*+)\s++(.+)', re.DOTALL)
_DIGITS = re.compile(r"\d++")


def _trino_name(t: DuckType) -> str:
    if t.name in SIMPLE_TYPES:
        return SIMPLE_TYPES[t.name]
    if t.name == "DECIMAL" and len(t.params) == 2:
        return f"decimal({t.params[0]},{t.params[1]})"
    if t.name in ("LIST", "ARRAY"):
        return f"array({_trino_name(t.children[0])})"
    if t.name == "MAP":
        return f"map({_trino_name(t.children[0])}, {_trino_name(t.children[1])})"
    if t.name == "STRUCT":
        fields = ", ".join(f"{n if _NAMED.fullmatch(n) else chr(34) + n.replace(chr(34), chr(34) * 2) + chr(34)} "
                           f"{_trino_name(c)}" for n, c in zip(t.fields, t.children, strict=True))
        return f"row({fields})"
    return "varchar"  # ENUM, BIT, UNION, VARINT, ...: their text


def trino_type(duckdb_type: str) -> str:
    """The Trino type name of a DuckDB type (``DECIMAL(15,2)`` → ``decimal(15,2)``; others: ``varchar``)."""
    try:
        return _trino_name(parse_type(duckdb_type.strip()))
    except ValueError:
        return "varchar"


def _signature_of(t: DuckType) -> dict[str, Any]:
    """``typeSignature`` of a type as the Trino client parses it (``rawType`` and ``arguments``)."""
    if t.name in ("LIST", "ARRAY"):
        return {"rawType": "array", "arguments": [{"kind": "TYPE", "value": _signature_of(t.children[0])}]}
    if t.name == "MAP":
        return {"rawType": "map", "arguments": [{"kind": "TYPE", "value": _signature_of(c)} for c in t.children]}
    if t.name == "STRUCT":
        return {"rawType": "row", "arguments": [
            {"kind": "NAMED_TYPE", "value": {"fieldName": {"name": n}, "typeSignature": _signature_of(c)}}
            for n, c in zip(t.fields, t.children, strict=True)]}
    name = _trino_name(t)
    match = _PARAMETRIC.fullmatch(name)
    if match:
        raw = match.group(1) + (match.group(3) or "")
        return {"rawType": raw, "arguments": [{"kind": "LONG", "value": int(v)} for v in match.group(2).split(",")]}
    if name == "varchar":  # unbounded, as Trino spells it: the longest length
        return {"rawType": "varchar", "arguments": [{"kind": "LONG", "value": 2147483647}]}
    return {"rawType": name, "arguments": []}


def column(name: str, duckdb_type: str) -> dict[str, Any]:
    """One entry of ``columns``: name, Trino type and its signature."""
    try:
        tree = parse_type(duckdb_type.strip())
    except ValueError:
        tree = DuckType("VARCHAR")
    return {"name": name, "type": _trino_name(tree), "typeSignature": _signature_of(tree)}


def _split_args(text: str) -> list[str]:
    """``a, b(c, d), e`` → ``["a", "b(c, d)", "e"]`` (commas inside parentheses or quotes stay)."""
    out, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [a for a in out if a]


def trino_signature(trino_type: str) -> dict[str, Any]:
    """``typeSignature`` of a type Trino spelled (``decimal(15,2)``, ``array(varchar)``, ``row(a bigint)``, ...).

    What a Trino coordinator behind the gateway answered is passed on as it
    is; the client's row mapper reads ``rawType`` and the arguments.
    """
    text = trino_type.strip()
    m = _TYPE_CALL.fullmatch(text)
    if m is None:
        return {"rawType": text, "arguments": []}
    raw, inner, zone = m.group(1).strip(), m.group(2), m.group(3)
    raw = raw + (" with time zone" if zone else "")
    args = _split_args(inner)
    if raw in ("array", "map"):
        return {"rawType": raw, "arguments": [{"kind": "TYPE", "value": trino_signature(a)} for a in args]}
    if raw == "row":
        fields = []
        for a in args:
            named = _ROW_FIELD.fullmatch(a)
            name, kind = (named.group(1).strip('"').replace('""', '"'), named.group(2)) if named else (None, a)
            value: dict[str, Any] = {"typeSignature": trino_signature(kind)}
            if name is not None:
                value["fieldName"] = {"name": name}
            fields.append({"kind": "NAMED_TYPE", "value": value})
        return {"rawType": "row", "arguments": fields}
    if all(_DIGITS.fullmatch(a) for a in args):
        return {"rawType": raw, "arguments": [{"kind": "LONG", "value": int(a)} for a in args]}
    return {"rawType": raw, "arguments": []}


def trino_column(name: str, trino_type: str) -> dict[str, Any]:
    """One entry of ``columns`` for a column whose type a Trino backend named (passed on unchanged)."""
    return {"name": name, "type": trino_type, "typeSignature": trino_signature(trino_type)}


@dataclass(frozen=True)
class TrinoError:
    """A failure as a Trino client sees it (Trino's standard error names and codes).

    Attributes:
        name: ``errorName`` (``QUERY_QUEUE_FULL``, ``EXCEEDED_TIME_LIMIT``, ``USER_CANCELED``, ...).
        code: ``errorCode``.
        type: ``errorType``: ``USER_ERROR``, ``INSUFFICIENT_RESOURCES``, ``INTERNAL_ERROR`` or ``EXTERNAL``.
        message: the one line the client shows.
    """

    name: str
    code: int
    type: str
    message: str


#: The Trino error names the gateway answers with (Trino's StandardErrorCode values).
ERRORS = {
    "SYNTAX_ERROR": (1, "USER_ERROR"),
    "ABANDONED_QUERY": (2, "USER_ERROR"),
    "USER_CANCELED": (3, "USER_ERROR"),
    "PERMISSION_DENIED": (4, "USER_ERROR"),
    "NOT_FOUND": (5, "USER_ERROR"),
    "FUNCTION_NOT_FOUND": (6, "USER_ERROR"),
    "INVALID_FUNCTION_ARGUMENT": (7, "USER_ERROR"),
    "DIVISION_BY_ZERO": (8, "USER_ERROR"),
    "INVALID_CAST_ARGUMENT": (9, "USER_ERROR"),
    "ALREADY_EXISTS": (12, "USER_ERROR"),
    "NOT_SUPPORTED": (13, "USER_ERROR"),
    "INVALID_SESSION_PROPERTY": (14, "USER_ERROR"),
    "CONSTRAINT_VIOLATION": (16, "USER_ERROR"),
    "NUMERIC_VALUE_OUT_OF_RANGE": (19, "USER_ERROR"),
    "SCHEMA_NOT_EMPTY": (34, "USER_ERROR"),
    "QUERY_TEXT_TOO_LARGE": (35, "USER_ERROR"),
    "TYPE_NOT_FOUND": (43, "USER_ERROR"),
    "CATALOG_NOT_FOUND": (44, "USER_ERROR"),
    "SCHEMA_NOT_FOUND": (45, "USER_ERROR"),
    "TABLE_NOT_FOUND": (46, "USER_ERROR"),
    "COLUMN_NOT_FOUND": (47, "USER_ERROR"),
    "SCHEMA_ALREADY_EXISTS": (49, "USER_ERROR"),
    "TABLE_ALREADY_EXISTS": (50, "USER_ERROR"),
    "TYPE_MISMATCH": (58, "USER_ERROR"),
    "INVALID_PARAMETER_USAGE": (80, "USER_ERROR"),
    "GENERIC_INTERNAL_ERROR": (65536, "INTERNAL_ERROR"),
    "NO_NODES_AVAILABLE": (65541, "INTERNAL_ERROR"),
    "SERVER_SHUTTING_DOWN": (65545, "INTERNAL_ERROR"),
    "REMOTE_HOST_GONE": (65558, "INTERNAL_ERROR"),
    "QUERY_QUEUE_FULL": (131074, "INSUFFICIENT_RESOURCES"),
    "EXCEEDED_TIME_LIMIT": (131075, "INSUFFICIENT_RESOURCES"),
    "EXCEEDED_LOCAL_MEMORY_LIMIT": (131079, "INSUFFICIENT_RESOURCES"),
}


def error(name: str, message: str) -> TrinoError:
    """A :class:`TrinoError` of one of :data:`ERRORS`."""
    code, kind = ERRORS[name]
    return TrinoError(name, code, kind, message)


def error_doc(err: TrinoError) -> dict[str, Any]:
    """The ``error`` member of a failed query's document."""
    return {"message": err.message, "errorCode": err.code, "errorName": err.name, "errorType": err.type,
            "failureInfo": {"type": f"sloctl.gateway.{err.name}", "message": err.message, "suppressed": [],
                            "stack": []}}


def stats_doc(state: str, *, elapsed_ms: int, queued_ms: int, rows: int = 0, extra: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    """``stats`` of a document: Trino's fields (the client reads ``state``), plus the gateway's own under ``sloctl``."""
    return {"state": state, "queued": state == "QUEUED", "scheduled": state not in ("QUEUED",), "nodes": 1,
            "totalSplits": 1, "queuedSplits": 0, "runningSplits": int(state == "RUNNING"),
            "completedSplits": int(state == "FINISHED"), "cpuTimeMillis": 0, "wallTimeMillis": elapsed_ms,
            "queuedTimeMillis": queued_ms, "elapsedTimeMillis": elapsed_ms, "processedRows": rows,
            "processedBytes": 0, "physicalInputBytes": 0, "peakMemoryBytes": 0, "spilledBytes": 0,
            **({"sloctl": extra} if extra else {})}
