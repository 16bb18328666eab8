"""Features from a query's SQL text and the catalog's table statistics.

Logs imported from Trino, Snowflake, Redshift or PostgreSQL carry the SQL
text but rarely a plan, so these features need no engine: sqlglot parses each
distinct text once (in the log's dialect) and the parse tree gives counts of
what the query does (``f_t_*``); a :class:`Catalog` of table sizes adds how
much it reads (``f_c_*``). Counts alone hardly rank TPC-H latencies (Spearman
about 0 on SF 0.5); counts with the catalog's sizes rank them nearly as well
as the plan's cardinality estimates (0.50 against 0.59), which is why the
catalog travels with them.

:func:`fingerprint` is the template key of a text (literals replaced, comments
dropped), fast enough for millions of rows; :class:`TextFeaturizer` caches
features by it. :func:`feature_source` names which feature groups a row has
(the log's ``f_source`` column).
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.core.errors import QueryLogError

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "CATALOG_FEATURES",
    "Catalog",
    "TEXT_COUNT_FEATURES",
    "TEXT_FEATURES",
    "TextFeaturizer",
    "feature_source",
    "catalog_from_metadata",
    "catalog_metadata",
    "fingerprint",
    "load_catalog",
    "text_features",
]

#: Counts from the parse tree alone.
TEXT_COUNT_FEATURES: tuple[str, ...] = (
    "f_t_joins",
    "f_t_aggregates",
    "f_t_scans",
    "f_t_subqueries",
    "f_t_ctes",
    "f_t_windows",
    "f_t_predicates",
    "f_t_tables",
)
#: log1p of the rows and bytes of the tables read (sum over table references, largest table).
CATALOG_FEATURES: tuple[str, ...] = (
    "f_c_log_rows_sum",
    "f_c_log_rows_max",
    "f_c_log_bytes_sum",
    "f_c_log_bytes_max",
)
#: Every feature of this module, in vector order.
TEXT_FEATURES: tuple[str, ...] = (*TEXT_COUNT_FEATURES, *CATALOG_FEATURES)


# -- names -----------------------------------------------------------------------------------
_NAME_PART = re.compile(r'"((?:[^"]|"")*)"|`((?:[^`]|``)*)`|\[([^\]]*)\]|([^.]+)')


def _name_parts(name: str) -> tuple[str, ...]:
    """``'Cat."My Schema".T'`` -> ``('cat', 'my schema', 't')``: split on dots outside quotes, case-folded."""
    parts = []
    for match in _NAME_PART.finditer(name.strip()):
        quoted = match.group(1) or match.group(2) or match.group(3)
        part = quoted if quoted is not None else (match.group(4) or "").strip()
        if part:
            parts.append(part.replace('""', '"').lower())
    return tuple(parts)


class Catalog:
    """Table statistics: ``{table name -> (rows, bytes or NaN)}``.

    Names may be qualified (``catalog.schema.table``), quoted and in any case;
    :meth:`lookup` tries the exact qualified name first, then shorter suffixes
    of it, then the bare table name.

    Args:
        tables: ``{name: (rows, bytes)}``; ``bytes`` may be NaN (unknown).
    """

    def __init__(self, tables: Mapping[str, tuple[float, float]]) -> None:
        self.tables = dict(tables)
        self._exact: dict[str, tuple[float, float]] = {}
        self._last: dict[str, tuple[float, float]] = {}
        for name, stats in self.tables.items():
            parts = _name_parts(name)
            if parts:
                self._exact.setdefault(".".join(parts), stats)
                self._last.setdefault(parts[-1], stats)

    def __len__(self) -> int:
        return len(self.tables)

    def __repr__(self) -> str:
        return f"Catalog({len(self.tables)} tables)"

    def lookup(self, name: str | tuple[str, ...]) -> tuple[float, float] | None:
        """``(rows, bytes)`` of table ``name`` (a dotted name or its parts), or ``None`` when unknown."""
        parts = _name_parts(name) if isinstance(name, str) else tuple(p.lower() for p in name)
        for start in range(len(parts)):
            stats = self._exact.get(".".join(parts[start:]))
            if stats is not None:
                return stats
        return self._last.get(parts[-1]) if parts else None

    @property
    def has_bytes(self) -> bool:
        """Whether any table has a known size in bytes."""
        return any(not math.isnan(b) for _, b in self.tables.values())

    def to_rows(self) -> list[dict[str, Any]]:
        """One ``{"table", "rows", "bytes"}`` per table (``bytes`` ``None`` when unknown), in :meth:`from_rows` form."""
        return [{"table": name, "rows": rows, "bytes": None if math.isnan(size) else size}
                for name, (rows, size) in self.tables.items()]

    @classmethod
    def from_rows(cls, rows: list[Mapping[str, Any]], source: str = "catalog") -> Catalog:
        """The inverse of :meth:`to_rows`.

        Raises:
            QueryLogError: a row without a table name or with rows/bytes not a number >= 0, naming it.
        """
        tables: dict[str, tuple[float, float]] = {}
        for i, row in enumerate(rows):
            name = row.get("table") if isinstance(row, Mapping) else None
            if not isinstance(name, str) or not name.strip():
                raise QueryLogError(f"{source}: entry {i} must have a table name ('table'), got {row!r:.80}.")
            values = []
            for key in ("rows", "bytes"):
                value = row.get(key)
                value = math.nan if value is None and key == "bytes" else value
                if isinstance(value, bool) or not isinstance(value, int | float) or not (
                        math.isnan(value) and key == "bytes" or math.isfinite(value) and value >= 0):
                    raise QueryLogError(f"{source}: entry {i} ({name}): '{key}' must be a number >= 0, got {value!r}.")
                values.append(float(value))
            tables[name] = (values[0], values[1])
        return cls(tables)

    def to_csv(self, path: str | Path) -> Path:
        """Write the ``table,rows,bytes`` CSV :meth:`from_csv` reads (bytes empty when unknown)."""
        path = Path(path)
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["table", "rows", "bytes"])
            for name, (rows, size) in self.tables.items():
                writer.writerow([name, repr(rows), "" if math.isnan(size) else repr(size)])
        return path

    @classmethod
    def from_csv(cls, path: str | Path) -> Catalog:
        """Read a CSV with columns ``table``, ``rows`` and optionally ``bytes``.

        Raises:
            QueryLogError: the file is missing, a column is missing, or a value
                is not a number >= 0 (naming the column, the line and the value).
        """
        path = Path(path)
        if not path.is_file():
            raise QueryLogError(f"{path}: catalog file not found.")
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            columns = [c.strip().lower() for c in reader.fieldnames or []]
            for required in ("table", "rows"):
                if required not in columns:
                    raise QueryLogError(
                        f"{path}: missing catalog column '{required}' (expected a CSV header "
                        f"'table,rows[,bytes]': table name, row count, optional size in bytes).")
            tables: dict[str, tuple[float, float]] = {}
            for line, raw in enumerate(reader, start=2):
                row = {str(k).strip().lower(): v for k, v in raw.items() if k is not None}
                name = (row.get("table") or "").strip()
                if not name:
                    raise QueryLogError(f"{path}: column 'table' must name a table, got an empty value at line {line}.")
                rows = _number(path, "rows", row.get("rows"), line, required=True)
                size = _number(path, "bytes", row.get("bytes"), line, required=False)
                tables[name] = (rows, size)
        return cls(tables)

    @classmethod
    def from_duckdb(cls, con: duckdb.DuckDBPyConnection) -> Catalog:
        """Row counts (``estimated_size`` of ``duckdb_tables()``) of every table of ``con``.

        Bytes are estimated as rows times the row's width from the columns'
        types (fixed-width types at their size, strings and others at 16 bytes,
        DuckDB's inline string size).
        """
        widths: dict[tuple[str, str, str], float] = {}
        for database, schema, table, data_type in con.execute(
                "SELECT database_name, schema_name, table_name, data_type FROM duckdb_columns()").fetchall():
            key = (database, schema, table)
            widths[key] = widths.get(key, 0.0) + _type_width(str(data_type))
        tables: dict[str, tuple[float, float]] = {}
        for database, schema, table, rows in con.execute(
                "SELECT database_name, schema_name, table_name, estimated_size FROM duckdb_tables()").fetchall():
            rows = float(rows or 0)
            width = widths.get((database, schema, table))
            tables[f'"{database}"."{schema}"."{table}"'] = (rows, rows * width if width else math.nan)
        return cls(tables)


def load_catalog(path: str | Path) -> Catalog:
    """Table statistics from a ``table,rows[,bytes]`` CSV or a DuckDB database file (read-only).

    Raises:
        QueryLogError: the file is missing or not a readable catalog, naming it and the expected forms.
    """
    path = Path(path)
    if not path.is_file():
        raise QueryLogError(f"{path}: catalog file not found (expected a table,rows[,bytes] CSV or a .duckdb file).")
    if path.suffix.lower() in (".duckdb", ".db"):
        import duckdb

        try:
            con = duckdb.connect(str(path), read_only=True)
        except duckdb.Error as exc:
            raise QueryLogError(f"{path}: not a readable DuckDB database ({' '.join(str(exc).split())[:200]}).") \
                from exc
        try:
            return Catalog.from_duckdb(con)
        finally:
            con.close()
    return Catalog.from_csv(path)


#: The log metadata key that holds the catalog the log's ``f_c_*`` features were built from.
CATALOG_KEY = "catalog"


def catalog_metadata(catalog: Catalog) -> str:
    """``catalog`` as the JSON stored under a log's ``catalog`` metadata key."""
    import json

    return json.dumps(catalog.to_rows())


def catalog_from_metadata(metadata: Mapping[str, str], source: str = "log") -> Catalog | None:
    """The catalog a log's metadata records (``None``: it records none).

    Raises:
        QueryLogError: the value is not the JSON :func:`catalog_metadata` writes.
    """
    import json

    raw = metadata.get(CATALOG_KEY)
    if raw is None:
        return None
    try:
        rows = json.loads(raw)
    except ValueError as exc:
        raise QueryLogError(f"{source}: metadata 'catalog' is not JSON ({exc}).") from exc
    if not isinstance(rows, list):
        raise QueryLogError(f"{source}: metadata 'catalog' must be a JSON list of {{table, rows, bytes}}.")
    return Catalog.from_rows(rows, source=f"{source}: metadata 'catalog'")


def _number(path: Path, column: str, raw: str | None, line: int, *, required: bool) -> float:
    text = (raw or "").strip()
    if not text:
        if required:
            raise QueryLogError(f"{path}: column '{column}' must be a number >= 0, got an empty value at line {line}.")
        return math.nan
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise QueryLogError(f"{path}: column '{column}' must be a number >= 0, got {text!r} at line {line}.")
    return value


_WIDTHS = {"BOOLEAN": 1, "TINYINT": 1, "UTINYINT": 1, "SMALLINT": 2, "USMALLINT": 2, "INTEGER": 4,
           "UINTEGER": 4, "DATE": 4, "FLOAT": 4, "BIGINT": 8, "UBIGINT": 8, "DOUBLE": 8, "TIME": 8,
           "TIMESTAMP": 8, "TIMESTAMP WITH TIME ZONE": 8, "HUGEINT": 16, "UHUGEINT": 16, "UUID": 16,
           "INTERVAL": 16}


def _type_width(data_type: str) -> float:
    upper = data_type.upper()
    if upper.startswith("DECIMAL"):
        digits = re.findall(r"\d+", upper)
        precision = int(digits[0]) if digits else 18
        return 2 if precision <= 4 else 4 if precision <= 9 else 8 if precision <= 18 else 16
    return float(_WIDTHS.get(upper, 16))


# -- fingerprint ------------------------------------------------------------------------------
# One left-to-right scan finds what must not be read as SQL words: comments, string literals
# (standard with '' or \' escapes, dollar-quoted) and quoted identifiers. Regular expressions
# with few matches, then str methods: the fingerprint runs on every row of a log of millions.
_OPAQUE = re.compile(
    r"--[^\n]*|/\*.*?(?:\*/|\Z)"
    r"|'[^'\\]*(?:(?:\\.|'')[^'\\]*)*(?:'|\Z)"
    r'|"[^"]*(?:""[^"]*)*(?:"|\Z)'
    r"|`[^`]*(?:``[^`]*)*(?:`|\Z)"
    r"|\$(\w*)\$.*?(?:\$\1\$|\Z)",
    re.S,
)
_TOKEN = re.compile(r"[^\s(),;=<>!+*/%|\[\]{}:-]+|\S")
_LIST = re.compile(r"\?(?: , \?)+")
_TYPED = tuple((f" {word} ?", " ?") for word in ("date", "time", "timestamp", "interval"))


def fingerprint(sql: str) -> str:
    """The template key of a query text: 16 hex digits of SHA-256 of its normal form.

    The normal form drops comments, replaces literals (strings, numbers, and
    ``DATE '…'``, ``INTERVAL '…'`` …) with ``?`` (a list of them becomes one
    ``?``), puts one space between tokens and case-folds everything but quoted
    identifiers, so texts of one template that differ only in literals (or in
    spacing, case or comments) share a fingerprint. No parser: it runs on
    every row of a log of millions (repeated texts hit a cache).
    """
    # the cache holds its keys: texts up to 8 KiB, 32768 of them, at most 256 MiB
    return _cached_fingerprint(sql) if len(sql) <= 8192 else _fingerprint(sql)


@lru_cache(maxsize=1 << 15)
def _cached_fingerprint(sql: str) -> str:
    return _fingerprint(sql)


def _fingerprint(sql: str) -> str:
    quoted: list[str] = []

    def opaque(match: re.Match[str]) -> str:
        first = match.group(0)[0]
        if first in "-/":
            return " "
        if first in "\"`":
            quoted.append(match.group(0))
            return " \0 "  # stands for the identifier, whose case is kept (hashed below)
        return " ? "

    text = _OPAQUE.sub(opaque, sql).lower()
    tokens = _TOKEN.findall(text)
    text = " " + " ".join(["?" if token[0].isdigit() or token[0] == "." and token[1:2].isdigit() else token
                           for token in tokens])
    for typed, literal in _TYPED:
        if typed in text:
            text = text.replace(typed, literal)
    text = _LIST.sub("?", text).strip().rstrip(";").rstrip()
    if quoted:
        text += "\0" + "\0".join(quoted)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# -- features from the parse tree -----------------------------------------------------------------
def _nan_features() -> dict[str, float]:
    return dict.fromkeys(TEXT_FEATURES, math.nan)


def _statement(sql: str, dialect: str) -> Any | None:
    """The one statement of ``sql`` if it reads tables (a query or DML), else ``None``."""
    import sqlglot
    from sqlglot import exp

    if not sql or not sql.strip():
        return None
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except Exception:  # noqa: BLE001  (sqlglot raises many kinds on bad SQL; it is unknown, never an error)
        return None
    if len(statements) != 1:
        return None
    tree = statements[0]
    if isinstance(tree, exp.Query | exp.Insert | exp.Update | exp.Delete | exp.Merge):
        return tree
    if isinstance(tree, exp.Create) and isinstance(tree.expression, exp.Query):
        return tree
    return None


def _table_parts(table: Any) -> tuple[str, ...]:
    return tuple(part.lower() for part in (table.catalog, table.db, table.name) if part)


def _count(tree: Any) -> tuple[dict[str, float], list[tuple[str, ...]]]:
    """Counts of the parse tree and the base tables it reads (one entry per reference)."""
    from sqlglot import exp

    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    written = tree.this if isinstance(tree, exp.Insert | exp.Create) else None
    if isinstance(written, exp.Schema):
        written = written.this
    counts = dict.fromkeys(TEXT_COUNT_FEATURES, 0.0)
    reads: list[tuple[str, ...]] = []
    # depth-first, remembering whether we are inside a WHERE / HAVING / ON of the current query block
    stack: list[tuple[Any, bool]] = [(tree, False)]
    while stack:
        node, in_clause = stack.pop()
        parent = node.parent
        if isinstance(node, exp.Join):
            counts["f_t_joins"] += 1
        elif isinstance(node, exp.Table):
            if node is not written and isinstance(node.this, exp.Identifier):
                parts = _table_parts(node)
                if not (len(parts) == 1 and parts[0] in cte_names):
                    reads.append(parts)
        elif isinstance(node, exp.Window):
            if node.arg_key != "windows":  # WINDOW w AS (...) defines, it does not compute
                counts["f_t_windows"] += 1
        elif isinstance(node, exp.AggFunc):
            if not (isinstance(parent, exp.Window) and node.arg_key == "this"):
                counts["f_t_aggregates"] += 1
        elif isinstance(node, exp.CTE):
            counts["f_t_ctes"] += 1
        elif isinstance(node, exp.Query) and node is not tree and not isinstance(  # (a wrapper counts, not its query)
                parent, exp.SetOperation | exp.CTE | exp.Insert | exp.Create | exp.Subquery):
            counts["f_t_subqueries"] += 1
        if isinstance(node, exp.Query):
            in_clause = False  # a new query block: its SELECT list is not a predicate clause
        if in_clause and isinstance(node, exp.Predicate) and not isinstance(node, exp.SubqueryPredicate):
            counts["f_t_predicates"] += 1
        for key, value in node.args.items():
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, exp.Expression):
                    inner = in_clause or isinstance(node, exp.Where | exp.Having) or (
                        isinstance(node, exp.Join) and key == "on")
                    stack.append((child, inner))
    counts["f_t_scans"] = float(len(reads))
    counts["f_t_tables"] = float(len(set(reads)))
    return counts, reads


def _catalog_features(reads: list[tuple[str, ...]], catalog: Catalog | None) -> dict[str, float]:
    out = dict.fromkeys(CATALOG_FEATURES, math.nan)
    if catalog is None:
        return out
    stats = [s for s in (catalog.lookup(parts) for parts in reads) if s is not None]
    if reads and not stats:
        return out  # reads only tables the catalog does not know: unknown, not zero
    rows = [r for r, _ in stats]
    out["f_c_log_rows_sum"] = math.log1p(sum(rows))
    out["f_c_log_rows_max"] = math.log1p(max(rows, default=0.0))
    sizes = [b for _, b in stats if not math.isnan(b)]
    if sizes or (not stats and catalog.has_bytes):
        out["f_c_log_bytes_sum"] = math.log1p(sum(sizes))
        out["f_c_log_bytes_max"] = math.log1p(max(sizes, default=0.0))
    return out


def _qualified(parts: tuple[str, ...], qualify: tuple[str, ...]) -> tuple[str, ...]:
    """``parts`` of a table name completed with the session's ``(catalog, schema)`` (either may be empty)."""
    catalog, schema = (qualify + ("", ""))[:2]
    if len(parts) == 1 and schema:
        return (catalog, schema, *parts) if catalog else (schema, *parts)
    if len(parts) == 2 and catalog:
        return (catalog, *parts)
    return parts


def _check_dialect(dialect: str) -> None:
    from sqlglot.dialects.dialect import Dialect

    try:
        Dialect.get_or_raise(dialect)
    except ValueError as exc:
        raise ValueError(f"The 'dialect' parameter must be one of sqlglot's dialect names (trino, snowflake, "
                         f"redshift, postgres, bigquery, duckdb, ...), got {dialect!r}.") from exc


def text_features(sql: str, dialect: str = "duckdb", catalog: Catalog | None = None) -> dict[str, float]:
    """Features of one query text, from its parse tree and the catalog.

    Counts (``f_t_*``): joins (every JOIN, and each extra comma-separated FROM
    table), aggregate calls (not those computed as window functions), base-table
    references (``f_t_scans``, repeats included), sub-queries (derived tables,
    scalar, ``EXISTS`` / ``IN`` / ``ANY`` queries), CTEs, window functions,
    predicate atoms (comparisons, ``LIKE``, ``IN``, ``BETWEEN``, ``IS``) in
    ``WHERE`` / ``HAVING`` / ``ON``, and distinct base tables read
    (``f_t_tables``: CTE names and table functions excluded, aliases resolved).
    With a catalog (``f_c_*``): log1p of the rows and bytes of the tables read,
    summed over references and the largest; tables the catalog does not know
    are left out, and a query reading none it knows gets NaN.

    Args:
        sql: one statement (a query, or DML that reads tables).
        dialect: sqlglot's name of the SQL dialect.
        catalog: table statistics, or ``None`` (``f_c_*`` NaN).

    Returns:
        ``{name: value}`` for every name in :data:`TEXT_FEATURES`; all NaN when
        sqlglot cannot parse the text or it is not a query. Never raises on bad SQL.

    Raises:
        ValueError: ``dialect`` is not a sqlglot dialect.
    """
    _check_dialect(dialect)
    return _features(sql, dialect, catalog)


def _features(sql: str, dialect: str, catalog: Catalog | None,
              qualify: tuple[str, ...] = ()) -> dict[str, float]:
    tree = _statement(sql, dialect)
    if tree is None:
        return _nan_features()
    try:
        counts, reads = _count(tree)
    except RecursionError:  # a pathologically deep tree: unknown
        return _nan_features()
    if any(qualify):  # names the text leaves unqualified are in the session's catalog and schema
        reads = [_qualified(parts, qualify) for parts in reads]
    return {**counts, **_catalog_features(reads, catalog)}


class TextFeaturizer:
    """Text features of query texts, parsed once per :func:`fingerprint` (thread-safe).

    Args:
        dialect: sqlglot's name of the log's SQL dialect.
        catalog: table statistics for the ``f_c_*`` features, or ``None``.
        max_cache: keep at most this many fingerprints' features, the least
            recently used leaving first (a server's bound); ``None``: all of
            them (an import, whose distinct texts are the log's).
    """

    def __init__(self, dialect: str = "duckdb", catalog: Catalog | None = None, *,
                 max_cache: int | None = None) -> None:
        if max_cache is not None and max_cache < 1:
            raise ValueError(f"The 'max_cache' parameter must be None or >= 1, got {max_cache}.")
        self.dialect = dialect
        self.catalog = catalog
        self.max_cache = max_cache
        self.parsed = 0
        self.failed = 0
        self._cache: OrderedDict[Any, dict[str, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._checked = False

    def __call__(self, sql: str, qualify: tuple[str, str] = ("", "")) -> dict[str, float]:
        """Features of ``sql`` (see :func:`text_features`); ``parsed`` / ``failed`` count distinct texts.

        ``qualify`` is the session's ``(catalog, schema)`` (lower case, either
        may be empty) that completes the table names the text leaves unqualified.
        """
        key = fingerprint(sql) if not any(qualify) else (qualify, fingerprint(sql))
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and self.max_cache is not None:
                self._cache.move_to_end(key)
        if cached is None:
            if not self._checked:
                _check_dialect(self.dialect)
                self._checked = True
            features = _features(sql, self.dialect, self.catalog, qualify)
            with self._lock:
                cached = self._cache.get(key)
                if cached is None:
                    cached = self._cache[key] = features
                    if self.max_cache is not None and len(self._cache) > self.max_cache:
                        self._cache.popitem(last=False)
                    if all(math.isnan(features[name]) for name in TEXT_COUNT_FEATURES):
                        self.failed += 1
                    else:
                        self.parsed += 1
        return dict(cached)

    def sources(self, features: Mapping[str, float]) -> str:
        """The ``f_source`` of a row with these features (no engine plan: ``text``, ``text+catalog`` ...)."""
        return feature_source(features, plan_engine=None)

    @property
    def cache_size(self) -> int:
        """How many distinct fingerprints have been parsed."""
        return len(self._cache)


def feature_source(row_features: Mapping[str, float], plan_engine: str | None = "duckdb") -> str:
    """The ``f_source`` of a row: which feature groups it has (any value not NaN).

    Args:
        row_features: the row's features (missing names count as NaN).
        plan_engine: the engine whose plan gave the plan features, written as
            ``plan:<engine>``; ``None`` writes ``plan``.

    Returns:
        ``plan``, ``text`` and ``catalog``, in that order, joined by ``+``
        (e.g. ``plan:duckdb+text+catalog``), or ``none``.
    """
    from sloctl.datasets.plan_features import ENGINE_PLAN_FEATURES

    def known(names: tuple[str, ...]) -> bool:
        for name in names:
            value = row_features.get(name)
            if value is not None and not _isnan(value):
                return True
        return False

    groups = []
    if known(ENGINE_PLAN_FEATURES):
        groups.append("plan" if plan_engine is None else f"plan:{plan_engine}")
    if known(TEXT_COUNT_FEATURES):
        groups.append("text")
    if known(CATALOG_FEATURES):
        groups.append("catalog")
    return "+".join(groups) or "none"


def _isnan(value: Any) -> bool:
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True
