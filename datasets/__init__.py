"""Logs, workloads and features: where everything sloctl learns comes from.

Heavy libraries (duckdb, pandas) load on first use of the functions below.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DuckDBClusterPool",
    "PLAN_FEATURES",
    "PlanFeaturizer",
    "Template",
    "Workload",
    "WorkloadQuery",
    "base_workload",
    "build_workload",
    "collect",
    "contour_workload",
    "ensure_database",
    "import_redset",
    "isolated_workload",
    "load_templates",
    "merge_logs",
    "phased_workload",
    "read_log",
    "validate_log",
    "write_log",
]

_WHERE = {
    "DuckDBClusterPool": "duckdb_pool",
    "PLAN_FEATURES": "plan_features",
    "PlanFeaturizer": "plan_features",
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
