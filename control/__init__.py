"""Decision policies shared by live and simulated runs, and the interfaces they drive."""

from __future__ import annotations

from sloctl.control.pool import ClusterInfo, ClusterPool, QueryCompletion, QueryRequest

__all__ = ["ClusterInfo", "ClusterPool", "QueryCompletion", "QueryRequest"]
