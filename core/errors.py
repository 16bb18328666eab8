"""The exceptions sloctl raises for bad input and refused requests.

Every error subclasses a built-in so that callers may catch ``ValueError`` or
``RuntimeError`` without importing sloctl; messages name the field, the rule
and the value that broke it.
"""

from __future__ import annotations

__all__ = [
    "ClusterPoolError",
    "ConfigError",
    "FeatureError",
    "QueryLogError",
    "SloctlError",
    "TraceFormatError",
    "WorkloadError",
]


class SloctlError(Exception):
    """Base class of every error sloctl raises on purpose."""


class ConfigError(SloctlError, ValueError):
    """A configuration file has an unknown key, a wrong type or a bad value."""


class QueryLogError(SloctlError, ValueError):
    """A query log does not follow the documented schema."""


class FeatureError(SloctlError, ValueError):
    """A model needs features (plan, SQL text, catalog) that a request or log cannot give."""


class TraceFormatError(SloctlError, ValueError):
    """A trace or access-log file is not in the format asked for, or in none that sloctl reads."""


class WorkloadError(SloctlError, ValueError):
    """A workload cannot be built from the given parameters."""


class ClusterPoolError(SloctlError, RuntimeError):
    """A cluster pool refused a request (too many cores, unknown cluster, ...)."""


class SyncError(SloctlError, RuntimeError):
    """A sidecar sync could not reach ``sloctl serve``, or it refused (``status``: its HTTP status, or None)."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
