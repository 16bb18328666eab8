"""Fixed-length plan features from DuckDB's ``EXPLAIN (FORMAT JSON)``.

Stage and Iconq+ (AutoSLO §4) see a query only through these numbers, so
they describe the plan's shape (operator counts, depth), what it reads
(tables, scans, estimated rows and bytes) and what it computes (joins,
aggregates, sorts, windows). Cardinalities are the optimizer's estimates,
taken log1p to tame their range. The vector is cached per query text.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "PLAN_FEATURES",
    "PLAN_FEATURE_VERSION",
    "PlanFeaturizer",
    "features_from_plan",
    "sql_hash",
]

PLAN_FEATURE_VERSION = "1"

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

#: Feature names, in vector order. Redset imports fill the ones they know.
PLAN_FEATURES: tuple[str, ...] = (
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


def sql_hash(sql: str) -> str:
    """A stable 16-hex-digit SHA-256 prefix of a query text."""
    return hashlib.sha256(sql.strip().encode()).hexdigest()[:16]


def _card(node: dict[str, Any]) -> float:
    raw = node.get("extra_info", {}).get("Estimated Cardinality")
    try:
        return float(raw)
    except (TypeError, ValueError):
        return 0.0


def features_from_plan(plan: list[dict[str, Any]] | dict[str, Any]) -> dict[str, float]:
    """Turn one parsed ``EXPLAIN (FORMAT JSON)`` plan into the feature dict.

    Args:
        plan: the JSON plan (a list of root operators, or one root).

    Returns:
        ``{name: value}`` for every name in :data:`PLAN_FEATURES`.
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
    out = {
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
    delim = ops.get("LEFT_DELIM_JOIN", 0) + ops.get("RIGHT_DELIM_JOIN", 0) + ops.get("DELIM_JOIN", 0)
    for op in COUNTED_OPERATORS:
        out[f"f_op_{op.lower()}"] = float(delim if op == "DELIM_JOIN" else ops.get(op, 0))
    return out


class PlanFeaturizer:
    """Plan features for query texts, computed once per text.

    Args:
        con: a DuckDB connection to the database the queries run on (plans
            depend on its tables and statistics).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self._cache: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def __call__(self, sql: str) -> dict[str, float]:
        """Features of ``sql`` (EXPLAIN runs only on the first call per text)."""
        key = sql_hash(sql)
        with self._lock:
            cached = self._cache.get(key)
            if cached is None:
                import duckdb

                try:
                    rows = self.con.execute("EXPLAIN (FORMAT JSON) " + sql).fetchall()
                    cached = features_from_plan(json.loads(rows[0][1]))
                except duckdb.Error:
                    # The query cannot be planned (it will fail as an error row): unknown.
                    cached = {name: math.nan for name in PLAN_FEATURES}
                self._cache[key] = cached
        return dict(cached)

    @property
    def cache_size(self) -> int:
        """How many distinct query texts have been explained."""
        return len(self._cache)
