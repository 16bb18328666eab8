"""The fixed-length feature vector of a query: its engine plan, its SQL text, the catalog.

Stage and Iconq+ (AutoSLO §4) see a query only through these numbers
(:data:`PLAN_FEATURES`, version 2). The engine-plan columns
(:data:`ENGINE_PLAN_FEATURES`) describe the plan's shape (operator counts,
depth), what it reads (tables, scans, estimated rows and bytes) and what it
computes (joins, aggregates, sorts, windows), from DuckDB's
``EXPLAIN (FORMAT JSON)`` (:func:`features_from_plan`) or PostgreSQL's
(:func:`features_from_postgres_plan`); cardinalities are the optimizer's
estimates, taken log1p to tame their range. The text and catalog columns
(:data:`~sloctl.datasets.sql_features.TEXT_FEATURES`) need no engine. Any
column may be NaN (unknown); a log's ``f_source`` says which groups a row has.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from typing import TYPE_CHECKING, Any

from sloctl.datasets.sql_features import TEXT_FEATURES, Catalog, TextFeaturizer

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "ENGINE_PLAN_FEATURES",
    "PLAN_FEATURES",
    "PLAN_FEATURE_VERSION",
    "PlanFeaturizer",
    "features_from_plan",
    "features_from_postgres_plan",
    "plan_feature_version_on_read",
    "sql_hash",
]

#: "1": the engine-plan columns only; "2": they, then the text and catalog columns.
PLAN_FEATURE_VERSION = "2"
#: Versions that :func:`~sloctl.datasets.querylog.validate_log` upgrades to the current one on read
#: (their missing text and catalog columns become NaN).
_UPGRADED_ON_READ = frozenset({"1"})

#: Operators counted one column each (the most common ones in TPC-H/TPC-DS plans).
COUNTED_OPERATORS = (
    "PROJECTION",
    "SEQ_SCAN",
    "HASH_JOIN",
    "FILTER",
    "HASH_GROUP_BY",
    "PERFECT_HASH_GROUP_BY",
    "UNGROUPED_AGGREGATE",
    "TOP_N",
    "ORDER_BY",
    "WINDOW",
    "CTE",
    "CTE_SCAN",
    "CROSS_PRODUCT",
    "NESTED_LOOP_JOIN",
    "DELIM_JOIN",
    "UNION",
)

_JOINS = {"HASH_JOIN", "NESTED_LOOP_JOIN", "CROSS_PRODUCT", "PIECEWISE_MERGE_JOIN",
          "BLOCKWISE_NL_JOIN", "LEFT_DELIM_JOIN", "RIGHT_DELIM_JOIN", "DELIM_JOIN",
          "IE_JOIN", "ASOF_JOIN", "POSITIONAL_JOIN"}
_AGGREGATES = {"HASH_GROUP_BY", "PERFECT_HASH_GROUP_BY", "UNGROUPED_AGGREGATE",
               "SIMPLE_AGGREGATE", "STREAMING_WINDOW", "WINDOW"}
_SCANS = {"SEQ_SCAN", "TABLE_SCAN", "INDEX_SCAN"}
_BYTES_PER_VALUE = 8  # a rough width per projected column, for f_scan_mbytes

#: The columns an engine's plan gives, in vector order (version 1 had these only).
#: Redset imports fill the ones they know.
ENGINE_PLAN_FEATURES: tuple[str, ...] = (
    "f_nodes",
    "f_depth",
    "f_scans",
    "f_tables",
    "f_joins",
    "f_aggregates",
    "f_filters",
    "f_log_card_sum",
    "f_log_card_max",
    "f_log_scan_card",
    "f_log_join_card",
    "f_scan_mbytes",
    *(f"f_op_{op.lower()}" for op in COUNTED_OPERATORS),
)

#: The feature vector every model consumes: engine plan, then SQL text and catalog.
PLAN_FEATURES: tuple[str, ...] = (*ENGINE_PLAN_FEATURES, *TEXT_FEATURES)


def plan_feature_version_on_read(version: str) -> str:
    """The plan-feature version a log written with ``version`` has once read ("1" reads as the current one)."""
    return PLAN_FEATURE_VERSION if version in _UPGRADED_ON_READ else version


def sql_hash(sql: str) -> str:
    """A stable 16-hex-digit SHA-256 prefix of a query text."""
    return hashlib.sha256(sql.strip().encode()).hexdigest()[:16]


def _card(node: dict[str, Any]) -> float:
    raw = node.get("extra_info", {}).get("Estimated Cardinality")
    try:
        return float(raw)
    except (TypeError, ValueError):
        return 0.0


def _plan_summary(stats: dict[str, float], tables: set[str]) -> dict[str, float]:
    """The shape and cardinality columns of a plan walk (DuckDB's and PostgreSQL's share them)."""
    return {
        "f_nodes": float(stats["nodes"]),
        "f_depth": float(stats["depth"]),
        "f_scans": float(stats["scans"]),
        "f_tables": float(len(tables)),
        "f_joins": float(stats["joins"]),
        "f_aggregates": float(stats["aggregates"]),
        "f_filters": float(stats["filters"]),
        "f_log_card_sum": math.log1p(stats["card_sum"]),
        "f_log_card_max": math.log1p(stats["card_max"]),
        "f_log_scan_card": math.log1p(stats["scan_card"]),
        "f_log_join_card": math.log1p(stats["join_card"]),
        "f_scan_mbytes": stats["scan_bytes"] / 1e6,
    }


def features_from_plan(plan: list[dict[str, Any]] | dict[str, Any]) -> dict[str, float]:
    """Turn one parsed DuckDB ``EXPLAIN (FORMAT JSON)`` plan into the engine-plan features.

    Args:
        plan: the JSON plan (a list of root operators, or one root).

    Returns:
        ``{name: value}`` for every name in :data:`ENGINE_PLAN_FEATURES` (combine
        with :func:`~sloctl.datasets.sql_features.text_features` for the full
        :data:`PLAN_FEATURES`).
    """
    roots = plan if isinstance(plan, list) else [plan]
    ops: dict[str, int] = {}
    tables: set[str] = set()
    stats = dict(nodes=0, depth=0, scans=0, joins=0, aggregates=0, filters=0,
                 card_sum=0.0, card_max=0.0, scan_card=0.0, join_card=0.0, scan_bytes=0.0)
    stack = [(root, 1) for root in roots]
    while stack:
        node, depth = stack.pop()
        name = str(node.get("name", "")).strip().upper()
        info = node.get("extra_info", {}) or {}
        card = _card(node)
        ops[name] = ops.get(name, 0) + 1
        stats["nodes"] += 1
        stats["depth"] = max(stats["depth"], depth)
        stats["card_sum"] += card
        stats["card_max"] = max(stats["card_max"], card)
        if name in _SCANS:
            stats["scans"] += 1
            stats["scan_card"] += card
            projections = info.get("Projections") or []
            n_cols = len(projections) if isinstance(projections, list) else 1
            stats["scan_bytes"] += card * max(n_cols, 1) * _BYTES_PER_VALUE
            if "Table" in info:
                tables.add(str(info["Table"]))
            if info.get("Filters"):
                stats["filters"] += 1
        if name == "FILTER":
            stats["filters"] += 1
        if name in _JOINS:
            stats["joins"] += 1
            stats["join_card"] += card
        if name in _AGGREGATES:
            stats["aggregates"] += 1
        for child in node.get("children", []) or []:
            stack.append((child, depth + 1))
    out = _plan_summary(stats, tables)
    delim = ops.get("LEFT_DELIM_JOIN", 0) + ops.get("RIGHT_DELIM_JOIN", 0) + ops.get("DELIM_JOIN", 0)
    for op in COUNTED_OPERATORS:
        out[f"f_op_{op.lower()}"] = float(delim if op == "DELIM_JOIN" else ops.get(op, 0))
    return out


_PG_SCANS = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Tid Scan", "Tid Range Scan",
             "Sample Scan", "Foreign Scan"}
_PG_JOINS = {"Nested Loop", "Hash Join", "Merge Join"}
_PG_SORTS = {"Sort", "Incremental Sort"}


def features_from_postgres_plan(plan_json: str | list[Any] | dict[str, Any]) -> dict[str, float]:
    """The engine-plan features of PostgreSQL's ``EXPLAIN (FORMAT JSON)``.

    Mapping (PostgreSQL node -> feature): every node counts in ``f_nodes``
    and ``f_depth``; scans are the nodes that read a relation (Seq, Index,
    Index Only, Bitmap Heap, Tid, Tid Range, Sample, Foreign Scan) and
    ``f_tables`` counts their distinct ``Schema.Relation Name``; joins are
    Nested Loop, Hash Join and Merge Join (semi- and anti-joins included);
    aggregates are Aggregate and WindowAgg; ``f_filters`` counts nodes with a
    ``Filter``. Cardinalities are ``Plan Rows`` (``f_log_card_*`` over every
    node, ``f_log_scan_card`` over scans, ``f_log_join_card`` over joins);
    ``f_scan_mbytes`` is the scans' ``Plan Rows`` x ``Plan Width``. Operator
    columns: seq_scan = Seq Scan, hash_join = Hash Join, nested_loop_join =
    Nested Loop, hash_group_by = Aggregate with a Hashed, Mixed or Sorted
    strategy, ungrouped_aggregate = Aggregate with the Plain strategy,
    top_n = a Limit directly over a Sort, order_by = any other Sort,
    window = WindowAgg, cte = a sub-plan named ``CTE …``, cte_scan = CTE Scan,
    union = Append and Merge Append; projection, filter,
    perfect_hash_group_by, cross_product and delim_join have no PostgreSQL
    node and are 0.

    Args:
        plan_json: the EXPLAIN output as text, or parsed (``[{"Plan": …}]``,
            ``{"Plan": …}`` or the root node).

    Returns:
        ``{name: value}`` for every name in :data:`ENGINE_PLAN_FEATURES`.
    """
    doc = json.loads(plan_json) if isinstance(plan_json, str) else plan_json
    if isinstance(doc, list):
        doc = doc[0] if doc else {}
    root = doc.get("Plan", doc)
    ops = dict.fromkeys((f"f_op_{op.lower()}" for op in COUNTED_OPERATORS), 0.0)
    tables: set[str] = set()
    stats = dict(nodes=0, depth=0, scans=0, joins=0, aggregates=0, filters=0,
                 card_sum=0.0, card_max=0.0, scan_card=0.0, join_card=0.0, scan_bytes=0.0)
    stack: list[tuple[dict[str, Any], int, str]] = [(root, 1, "")]
    while stack:
        node, depth, parent = stack.pop()
        kind = str(node.get("Node Type", ""))
        try:
            rows = max(float(node.get("Plan Rows", 0.0)), 0.0)
            width = max(float(node.get("Plan Width", 0.0)), 0.0)
        except (TypeError, ValueError):
            rows, width = 0.0, 0.0
        stats["nodes"] += 1
        stats["depth"] = max(stats["depth"], depth)
        stats["card_sum"] += rows
        stats["card_max"] = max(stats["card_max"], rows)
        if kind in _PG_SCANS:
            stats["scans"] += 1
            stats["scan_card"] += rows
            stats["scan_bytes"] += rows * width
            if node.get("Relation Name"):
                schema = node.get("Schema")
                tables.add(f"{schema}.{node['Relation Name']}" if schema else str(node["Relation Name"]))
        if kind in _PG_JOINS:
            stats["joins"] += 1
            stats["join_card"] += rows
        if kind in ("Aggregate", "WindowAgg"):
            stats["aggregates"] += 1
        if node.get("Filter"):
            stats["filters"] += 1
        if kind == "Seq Scan":
            ops["f_op_seq_scan"] += 1
        elif kind == "Hash Join":
            ops["f_op_hash_join"] += 1
        elif kind == "Nested Loop":
            ops["f_op_nested_loop_join"] += 1
        elif kind == "Aggregate":
            plain = node.get("Strategy", "Plain") == "Plain"
            ops["f_op_ungrouped_aggregate" if plain else "f_op_hash_group_by"] += 1
        elif kind in _PG_SORTS:
            ops["f_op_top_n" if parent == "Limit" else "f_op_order_by"] += 1
        elif kind == "WindowAgg":
            ops["f_op_window"] += 1
        elif kind == "CTE Scan":
            ops["f_op_cte_scan"] += 1
        elif kind in ("Append", "Merge Append"):
            ops["f_op_union"] += 1
        if str(node.get("Subplan Name", "")).startswith("CTE "):
            ops["f_op_cte"] += 1
        for child in node.get("Plans", []) or []:
            stack.append((child, depth + 1, kind))
    return {**_plan_summary(stats, tables), **ops}


class PlanFeaturizer:
    """The full feature vector (:data:`PLAN_FEATURES`) of query texts, computed once per text.

    Engine-plan columns come from DuckDB's EXPLAIN on ``con``; text columns
    from the text (:class:`~sloctl.datasets.sql_features.TextFeaturizer`);
    catalog columns from ``catalog``, or, when none is given, from the
    tables of ``con`` (:meth:`Catalog.from_duckdb`, read on first use).

    Args:
        con: a DuckDB connection to the database the queries run on (plans
            depend on its tables and statistics).
        dialect: sqlglot's name of the texts' dialect.
        catalog: table statistics, or ``None`` (from ``con``).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, dialect: str = "duckdb",
                 catalog: Catalog | None = None) -> None:
        self.con = con
        self.dialect = dialect
        self.catalog = catalog
        self._text: TextFeaturizer | None = None
        self._cache: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def _text_features(self, sql: str) -> dict[str, float]:
        if self._text is None:
            import duckdb

            catalog = self.catalog
            if catalog is None:
                try:
                    catalog = Catalog.from_duckdb(self.con)
                except duckdb.Error:
                    catalog = None  # no statistics: the catalog columns stay unknown
            self._text = TextFeaturizer(self.dialect, catalog)
        return self._text(sql)

    def __call__(self, sql: str) -> dict[str, float]:
        """Features of ``sql`` (EXPLAIN and the parse run only on the first call per text)."""
        key = sql_hash(sql)
        with self._lock:
            cached = self._cache.get(key)
            if cached is None:
                import duckdb

                try:
                    rows = self.con.execute("EXPLAIN (FORMAT JSON) " + sql).fetchall()
                    plan = features_from_plan(json.loads(rows[0][1]))
                except duckdb.Error:
                    # The query cannot be planned (it will fail as an error row): unknown plan.
                    plan = dict.fromkeys(ENGINE_PLAN_FEATURES, math.nan)
                features = {**plan, **self._text_features(sql)}
                cached = {name: features[name] for name in PLAN_FEATURES}
                self._cache[key] = cached
        return dict(cached)

    @property
    def cache_size(self) -> int:
        """How many distinct query texts have been explained."""
        return len(self._cache)
