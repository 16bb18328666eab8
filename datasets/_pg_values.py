"""PostgreSQL results in the DuckDB worker's terms: column types, JSON values, error names.

The SLO gateway reads a cluster's result as the DuckDB worker
(:mod:`sloctl.datasets._cluster_worker`) writes it: columns as ``(name,
DuckDB type)`` pairs, which it maps to Trino's types, and rows of JSON values
(decimals, dates and times as text, NaN and infinities as ``"NaN"`` /
``"Infinity"`` / ``"-Infinity"``, intervals as Trino's ``D HH:MM:SS.mmm``,
bytes as base64). This module gives a PostgreSQL result the same shape:

* :func:`duckdb_type`: a column's type OID (``cursor.description``) as
  DuckDB spells the equivalent type (``int4`` -> ``INTEGER``, ``numeric(15,2)``
  -> ``DECIMAL(15,2)``, ``text`` -> ``VARCHAR``, ``int4[]`` -> ``INTEGER[]``;
  any other type: ``VARCHAR``, its value as text);
* :func:`use_text_loaders`: numerics, dates, times, timestamps, JSON and
  UUIDs come from the server as PostgreSQL's own text (no Python object is
  made; ``infinity`` and BC dates pass as they are);
* :func:`encoders` / :func:`page_json` / :func:`json_rows`: the rest as the
  worker encodes it;
* :func:`error_text`: a server error named after the DuckDB exception the
  gateway knows (a syntax error is a ``ParserException``, a write refused by
  the read-only transaction a ``PermissionException``), so that it is
  treated as the client's fault and not retried.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sloctl.datasets._cluster_worker import _interval_text, _json_value, _page_json

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "DECIMAL_WIDTH",
    "column_types",
    "duckdb_type",
    "encoders",
    "error_text",
    "json_rows",
    "page_json",
    "use_text_loaders",
]

#: DuckDB's (and Trino's) widest decimal; a ``numeric`` without declared precision is spelled this wide.
DECIMAL_WIDTH = 38

#: Type OID -> DuckDB's name of the equivalent type (``numeric``, 1700, is built from its precision and scale).
_NAMES = {
    16: "BOOLEAN",
    17: "BLOB",
    18: "VARCHAR",
    19: "VARCHAR",
    20: "BIGINT",
    21: "SMALLINT",
    23: "INTEGER",
    25: "VARCHAR",
    26: "UINTEGER",
    114: "JSON",
    700: "FLOAT",
    701: "DOUBLE",
    1042: "VARCHAR",
    1043: "VARCHAR",
    1082: "DATE",
    1083: "TIME",
    1114: "TIMESTAMP",
    1184: "TIMESTAMP WITH TIME ZONE",
    1186: "INTERVAL",
    1266: "TIME WITH TIME ZONE",
    2950: "UUID",
    3802: "JSON",
}
_NUMERIC = 1700
#: Types read as the server's text (no Python object): PostgreSQL's text is already the JSON value.
_AS_TEXT = ("numeric", "date", "time", "timestamp", "timestamptz", "timetz", "json", "jsonb", "uuid")
#: ``2020-01-01 12:00:00+05:30`` -> local part and offset (PostgreSQL writes ``+HH[:MM[:SS]]``).
_OFFSET = re.compile(r"^(.*\d)([+-])(\d\d)(?::(\d\d))?(?::\d\d)?$")


def use_text_loaders(conn: psycopg.Connection) -> None:
    """Read the types of :data:`_AS_TEXT` (and arrays of them) as PostgreSQL's text on ``conn``."""
    from psycopg.types.string import TextLoader

    for name in _AS_TEXT:
        conn.adapters.register_loader(name, TextLoader)


def _element_oid(oid: int) -> int | None:
    """The element type of array type ``oid``, or ``None`` when ``oid`` is no (known) array type."""
    import psycopg

    info = psycopg.postgres.types.get(oid)
    return info.oid if info is not None and info.oid != oid else None


def _scale_of(values: Any) -> int:
    """The most digits after the point among decimal texts (lists walked; ``NaN``, ``Infinity`` ignored)."""
    if isinstance(values, str):
        point = values.find(".")
        return len(values) - point - 1 if point >= 0 else 0
    if isinstance(values, list | tuple):
        return max((_scale_of(v) for v in values if v is not None), default=0)
    return 0


def duckdb_type(type_code: int, precision: int | None, scale: int | None, values: Sequence[Any] = ()) -> str:
    """DuckDB's spelling of a PostgreSQL column type.

    A ``numeric`` with declared precision is ``DECIMAL(p,s)`` (``p`` at most
    :data:`DECIMAL_WIDTH`); one without (what ``sum``, ``avg`` and, since
    PostgreSQL 14, ``extract`` return) is ``DECIMAL(38,s)``, ``s`` the largest
    scale among ``values`` (the column's values known when the columns are
    sent: the whole result when fetched, the first page when streamed).

    Args:
        type_code: the type OID (``cursor.description[i].type_code``).
        precision: the declared precision (``numeric`` only), or ``None``.
        scale: the declared scale, or ``None``.
        values: the column's values, as loaded (numerics as text).

    Returns:
        e.g. ``"INTEGER"``, ``"DECIMAL(15,2)"``, ``"VARCHAR[]"``; ``"VARCHAR"`` for any other type.
    """
    element = _element_oid(type_code)
    if element is not None:
        return duckdb_type(element, None, None, [v for array in values if array is not None for v in array]) + "[]"
    if type_code == _NUMERIC:
        if precision:
            p = min(precision, DECIMAL_WIDTH)
            return f"DECIMAL({p},{min(scale or 0, p)})"
        return f"DECIMAL({DECIMAL_WIDTH},{min(_scale_of(list(values)), DECIMAL_WIDTH)})"
    return _NAMES.get(type_code, "VARCHAR")


def column_types(description: Sequence[Any] | None, rows: Sequence[Sequence[Any]]) -> tuple[tuple[str, str], ...]:
    """``(name, DuckDB type)`` of each column of a result (``cursor.description``; ``rows``: its rows known so far).

    Only numerics without declared precision and arrays read ``rows`` (see :func:`duckdb_type`).
    """
    out = []
    for i, column in enumerate(description or ()):
        code = column.type_code
        needs_values = (code == _NUMERIC and not column.precision) or _element_oid(code) is not None
        out.append(
            (
                column.name,
                duckdb_type(code, column.precision, column.scale, [row[i] for row in rows] if needs_values else ()),
            )
        )
    return tuple(out)


def _offset_text(value: str, sep: str) -> str:
    """``...12:00:00+05:30`` / ``+00`` as the worker writes a time zone offset: ``sep`` then ``+HH:MM``."""
    match = _OFFSET.match(value)
    if match is None:  # infinity, BC: the server's text as it is
        return value
    local, sign, hours, minutes = match.groups()
    return f"{local}{sep}{sign}{hours}:{minutes or '00'}"


def _encoder(type_code: int) -> Callable[[Any], Any] | None:
    """How a value of PostgreSQL type ``type_code`` becomes the worker's JSON value; ``None``: as it is."""
    element = _element_oid(type_code)
    if element is not None:
        inner = _encoder(element)
        if inner is None:
            return None

        def each(value: Any) -> Any:  # multi-dimensional arrays are lists of lists
            return [None if v is None else each(v) if isinstance(v, list) else inner(v) for v in value]

        return each
    if type_code == 1184:  # Trino's timestamp with time zone: local time, a space, the offset
        return lambda v: _offset_text(v, " ")
    if type_code == 1266:
        return lambda v: _offset_text(v, "")
    if type_code == 1186:
        return _interval_text
    if type_code in _NAMES or type_code == _NUMERIC:
        return None
    return _json_value  # a type without a DuckDB counterpart (VARCHAR): its text


def encoders(type_codes: Sequence[int]) -> dict[int, Callable[[Any], Any]]:
    """The encoder of each column that needs one (``{index: function}``), by the columns' type OIDs."""
    out = {}
    for i, code in enumerate(type_codes):
        f = _encoder(code)
        if f is not None:
            out[i] = f
    return out


def _encoded(rows: Sequence[Sequence[Any]], encode: dict[int, Callable[[Any], Any]]) -> list:
    if not encode:
        return list(rows)
    return [[encode[i](v) if i in encode and v is not None else v for i, v in enumerate(row)] for row in rows]


def page_json(rows: Sequence[Sequence[Any]], encode: dict[int, Callable[[Any], Any]]) -> str:
    """A page of rows as the JSON text of a :class:`~sloctl.datasets.pool.RawPage` (the worker's encoding)."""
    return _page_json(_encoded(rows, encode))


def json_rows(rows: Sequence[Sequence[Any]], encode: dict[int, Callable[[Any], Any]]) -> list[list]:
    """Rows as lists of JSON values (``QueryCompletion.data``), as the worker makes a fetched result."""
    return [[_json_value(v) for v in row] for row in _encoded(rows, encode)]


#: SQLSTATE -> the DuckDB exception whose name the gateway reads as the client's fault.
_DUCKDB_ERRORS = {
    "42601": "ParserException",
    "42P01": "CatalogException",
    "3F000": "CatalogException",
    "42883": "CatalogException",
    "42703": "BinderException",
    "42501": "PermissionException",
    "25006": "PermissionException",
    "22P02": "ConversionException",
    "22003": "OutOfRangeException",
    "22012": "InvalidInputException",
    "0A000": "NotImplementedException",
    "53200": "OutOfMemoryException",
}
#: ... by SQLSTATE class where the code itself is not listed.
_DUCKDB_CLASSES = {"42": "BinderException", "22": "InvalidInputException"}


def error_text(exc: psycopg.Error) -> str:
    """A server's error as ``Name: message (PostgreSQL Class, SQLSTATE code)``.

    ``Name`` is the DuckDB exception of the same kind (``ParserException``
    for a syntax error, ``PermissionException`` for a write refused by the
    read-only transaction, ``CatalogException`` for an unknown table, ...)
    where there is one, else psycopg's class name.
    """
    code = getattr(exc, "sqlstate", None) or ""
    diag = getattr(exc, "diag", None)
    message = (diag.message_primary if diag is not None else None) or (str(exc).strip().splitlines() or [""])[0]
    name = _DUCKDB_ERRORS.get(code) or _DUCKDB_CLASSES.get(code[:2]) or type(exc).__name__
    return f"{name}: {message} (PostgreSQL {type(exc).__name__}, SQLSTATE {code or 'none'})"
