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

__all__ = ["TrinoError", "column", "error_doc", "stats_doc", "trino_type"]

_SIMPLE = {
    "BOOLEAN": "boolean", "TINYINT": "tinyint", "SMALLINT": "smallint", "INTEGER": "integer", "BIGINT": "bigint",
    "UTINYINT": "smallint", "USMALLINT": "integer", "UINTEGER": "bigint", "UBIGINT": "decimal(20,0)",
    "HUGEINT": "decimal(38,0)", "UHUGEINT": "decimal(39,0)", "FLOAT": "real", "DOUBLE": "double",
    "VARCHAR": "varchar", "DATE": "date", "TIME": "time(6)", "TIMESTAMP": "timestamp(6)",
    "TIMESTAMP_S": "timestamp(0)", "TIMESTAMP_MS": "timestamp(3)", "TIMESTAMP_NS": "timestamp(9)",
    "TIMESTAMP WITH TIME ZONE": "timestamp(6) with time zone", "TIME WITH TIME ZONE": "time(6) with time zone",
    "BLOB": "varbinary", "UUID": "uuid", "JSON": "json", "INTERVAL": "varchar", "NULL": "varchar",
}
_DECIMAL = re.compile(r"^DECIMAL\((\d+),\s*(\d+)\)$")


def trino_type(duckdb_type: str) -> str:
    """The Trino type name of a DuckDB type (``DECIMAL(15,2)`` → ``decimal(15,2)``; unknown ones: ``varchar``)."""
    name = duckdb_type.strip().upper()
    if name in _SIMPLE:
        return _SIMPLE[name]
    match = _DECIMAL.match(name)
    if match:
        return f"decimal({int(match.group(1))},{int(match.group(2))})"
    if name.endswith("[]"):
        return f"array({trino_type(duckdb_type.strip()[:-2])})"
    return "varchar"


def _signature(type_name: str) -> dict[str, Any]:
    """``typeSignature`` of a Trino type name as its client parses it (``rawType`` and ``arguments``)."""
    if type_name.startswith("array(") and type_name.endswith(")"):
        return {"rawType": "array", "arguments": [{"kind": "TYPE", "value": _signature(type_name[6:-1])}]}
    match = re.match(r"^(decimal|timestamp|time)\(([\d,]+)\)( with time zone)?$", type_name)
    if match:
        raw = match.group(1) + (match.group(3) or "")
        return {"rawType": raw, "arguments": [{"kind": "LONG", "value": int(v)} for v in match.group(2).split(",")]}
    if type_name == "varchar":  # unbounded, as Trino spells it: the longest length
        return {"rawType": "varchar", "arguments": [{"kind": "LONG", "value": 2147483647}]}
    return {"rawType": type_name, "arguments": []}


def column(name: str, duckdb_type: str) -> dict[str, Any]:
    """One entry of ``columns``: name, Trino type and its signature."""
    type_name = trino_type(duckdb_type)
    return {"name": name, "type": type_name, "typeSignature": _signature(type_name)}


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
    "FUNCTION_NOT_FOUND": (6, "USER_ERROR"),
    "INVALID_FUNCTION_ARGUMENT": (7, "USER_ERROR"),
    "DIVISION_BY_ZERO": (8, "USER_ERROR"),
    "INVALID_CAST_ARGUMENT": (9, "USER_ERROR"),
    "NOT_SUPPORTED": (13, "USER_ERROR"),
    "INVALID_SESSION_PROPERTY": (14, "USER_ERROR"),
    "NUMERIC_VALUE_OUT_OF_RANGE": (19, "USER_ERROR"),
    "GENERIC_INTERNAL_ERROR": (65536, "INTERNAL_ERROR"),
    "NO_NODES_AVAILABLE": (65542, "INTERNAL_ERROR"),
    "SERVER_SHUTTING_DOWN": (65545, "INTERNAL_ERROR"),
    "REMOTE_HOST_GONE": (65561, "INTERNAL_ERROR"),
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
