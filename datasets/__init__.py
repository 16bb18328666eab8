"""Logs, workloads and features: where everything sloctl learns comes from.

Heavy libraries (duckdb, pandas) load on first use of the functions below.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Catalog",
    "DuckDBClusterPool",
    "ENGINE_PLAN_FEATURES",
    "PLAN_FEATURES",
    "PlanFeaturizer",
    "TEXT_FEATURES",
    "Template",
    "TextFeaturizer",
    "Workload",
    "WorkloadQuery",
    "base_workload",
    "build_workload",
    "collect",
    "contour_workload",
    "ensure_database",
    "feature_source",
    "fingerprint",
    "import_executions",
    "import_redset",
    "isolated_workload",
    "load_templates",
    "merge_logs",
    "phased_workload",
    "read_log",
    "text_features",
    "validate_log",
    "write_log",
]

_WHERE = {
    "Catalog": "sql_features",
    "DuckDBClusterPool": "duckdb_pool",
    "ENGINE_PLAN_FEATURES": "plan_features",
    "PLAN_FEATURES": "plan_features",
    "PlanFeaturizer": "plan_features",
    "TEXT_FEATURES": "sql_features",
    "TextFeaturizer": "sql_features",
    "feature_source": "sql_features",
    "fingerprint": "sql_features",
    "import_executions": "executions",
    "text_features": "sql_features",
    "Template": "tpc",
    "ensure_database": "tpc",
    "load_templates": "tpc",
    "Workload": "workloads",
    "WorkloadQuery": "workloads",
    "base_workload": "workloads",
    "build_workload": "workloads",
    "contour_workload": "workloads",
    "isolated_workload": "workloads",
    "phased_workload": "workloads",
    "collect": "collect",
    "import_redset": "redset",
    "merge_logs": "merge",
    "read_log": "querylog",
    "validate_log": "querylog",
    "write_log": "querylog",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"sloctl.datasets.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'sloctl.datasets' has no attribute {name!r}")
