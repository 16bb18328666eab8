"""The cluster-pool interface that routing and scaling policies drive.

A pool owns clusters of integer sizes: units of CPU budget (a cgroup's CPU
bandwidth, see :mod:`sloctl.datasets.cpu_budget`) or, where no budget can be
enforced, whole cores. Policies ask it to spin clusters up
and down and to run queries on them; completions come back with exact start
and end times on the monotonic clock (``time.monotonic()``, shared by every
process on the machine). The live DuckDB pool
(:class:`sloctl.datasets.DuckDBClusterPool`), the Trino pool (real Trino
coordinators, :class:`sloctl.datasets.trino_pool.TrinoClusterPool`) and
simulated pools implement it.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["CANCELLED", "ClusterInfo", "ClusterPool", "QueryCompletion", "QueryRequest", "QueryStatus", "RawPage",
           "drain"]

QueryStatus = Literal["ok", "timeout", "error"]

#: The error of a query stopped by :meth:`ClusterPool.cancel`.
CANCELLED = "cancelled by the client"


@dataclass(frozen=True)
class QueryRequest:
    """A query to run on one cluster.

    Attributes:
        query_id: the caller's id, echoed in the completion.
        sql: the query text.
        timeout_s: interrupt the query after this long (``None``: never).
        fetch: send the result back (``QueryCompletion.columns`` and
            ``data``), not only its row count (the SLO gateway's clients need it).
        stream: send the result page by page instead, through ``on_page``
            (exclusive with ``fetch``). The worker's memory stays bounded
            however large the result: it runs at most ``buffer_pages`` pages
            ahead of what the consumer let go with
            :meth:`~sloctl.datasets.DuckDBClusterPool.credit`. The completion
            (``data=None``) carries the column names and types and ``rows``,
            the rows sent; its ``end_s`` is when the last page was sent. A
            query that fails, times out or is cancelled mid-stream ends as
            such after the pages already sent.
        page_rows: the most rows in one page (``stream`` only).
        buffer_pages: pages the worker may send before the first credit
            (``stream`` only).
        page_bytes: the most bytes of JSON one page may hold (``stream``
            only; ``None``: no bound but ``page_rows``). A worker cuts a page
            that would be larger into smaller ones; a single row larger than
            this fails the query with ``OutOfMemoryException`` (the
            consumer's memory is bounded by bytes, not by rows).
        stream_timeout_s: once the first page has been sent, the query may
            run until this long after its start instead of ``timeout_s``
            (``stream`` only; ``None``: ``timeout_s`` throughout). Rows that
            left cannot be taken back, so a caller that retries on a timeout
            keeps ``timeout_s`` short and lets a streaming result run on.
        raw_pages: hand ``on_page`` each page as a :class:`RawPage` (the
            worker's JSON text and its row count), never decoded: a consumer
            that forwards JSON (the SLO gateway) passes it through as it is.
        on_page: called as ``on_page(columns, rows)`` once per page, in order,
            on the pool's reader thread of that cluster (keep it short: hand the
            rows on, then call ``credit``); ``columns`` are ``(name, type)``
            pairs, the same with every page; ``rows`` are lists of JSON values
            as in ``QueryCompletion.data``. An empty result makes no call. If
            ``on_page`` raises, the query is cancelled and ends as ``error``
            naming the exception. Without ``on_page`` the pool drops the pages
            and gives the credit back itself (only the row count is kept).
        headers: the client's Trino request headers (``X-Trino-User``,
            ``X-Trino-Catalog``, ``X-Trino-Schema``, ``X-Trino-Session``,
            ``X-Trino-Prepared-Statement``, ``X-Trino-Client-Tags``, ...), name
            to value, for a pool whose clusters speak Trino's protocol
            (:class:`~sloctl.datasets.trino_pool.TrinoClusterPool` sends them
            with every request of the query); ``None``: none. Pools that run
            the SQL themselves (DuckDB) ignore them.
    """

    query_id: int
    sql: str
    timeout_s: float | None = None
    fetch: bool = False
    stream: bool = False
    page_rows: int = 1000
    buffer_pages: int = 4
    stream_timeout_s: float | None = None
    page_bytes: int | None = None
    on_page: Callable[[tuple[tuple[str, str], ...], Any], None] | None = None
    raw_pages: bool = False
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class RawPage:
    """A page of a streamed result as the worker wrote it.

    Attributes:
        json: a JSON array of rows (each an array of JSON values).
        count: how many rows it holds.
    """

    json: str
    count: int

    def rows(self) -> list[list]:
        """The rows, decoded."""
        import json

        return json.loads(self.json)


@dataclass(frozen=True)
class QueryCompletion:
    """How a query ended. Times are ``time.monotonic()`` seconds.

    A ``timeout`` completion is censored: ``end_s - start_s`` is the time to
    failure, a lower bound on the query's latency. ``cpu_budget`` is the CPU
    the cluster was allowed, in cores (NaN when the pool does not say).
    ``columns`` (``(name, type)`` pairs, the engine's type names) and ``data``
    (rows of JSON values: decimals, dates and times as strings, NaN and
    infinities as ``"NaN"``/``"Infinity"``/``"-Infinity"``) are the result when
    the request asked to ``fetch`` it and the query was ok (a ``stream``ed
    query: ``columns`` only); else ``None``. A query cancelled by
    :meth:`ClusterPool.cancel` ends as ``error`` with the error
    :data:`CANCELLED`; one whose cluster died under it as ``error`` with
    ``"stopped"`` in the error.

    Two fields are set only by a pool whose clusters speak Trino's protocol
    (``None`` elsewhere): ``response_headers``, the ``X-Trino-*`` headers of
    the coordinator's answers that change the client's session
    (``X-Trino-Set-Session``, ``X-Trino-Clear-Session``,
    ``X-Trino-Added-Prepare``, ``X-Trino-Deallocated-Prepare``,
    ``X-Trino-Set-Catalog``, ``X-Trino-Set-Schema``, ...), each name once with
    its values joined by commas, as a Trino client reads them; and
    ``trino_error``, the coordinator's own ``error`` object of a failed
    query (``errorName``, ``errorCode``, ``errorType``, ``message``), so that
    a front door can hand the same error back to its client.
    """

    query_id: int
    cluster_id: str
    start_s: float
    end_s: float
    status: QueryStatus
    error: str = ""
    rows: int = 0
    oversubscribed: bool = False
    cpu_budget: float = float("nan")
    columns: tuple[tuple[str, str], ...] | None = None
    data: list[list] | None = None
    response_headers: Mapping[str, str] | None = None
    trino_error: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ClusterInfo:
    """A cluster's state as the pool sees it.

    ``cpu_budget`` is the CPU it may use, in cores; ``pid`` its worker process
    (``None`` where a pool has no process); ``failure`` why it failed or
    stopped on its own (e.g. ``"worker process 123 was killed by signal 9
    (SIGKILL)"``), else empty; ``memory_bound`` the bytes the operating system
    lets its worker hold (``None``: not bounded, or a pool without workers).
    """

    cluster_id: str
    size: int
    cores: tuple[int, ...]
    state: Literal["starting", "ready", "stopped", "failed"]
    requested_s: float
    ready_s: float | None
    running: int
    oversubscribed: bool
    cpu_budget: float = float("nan")
    pid: int | None = None
    failure: str = ""
    memory_bound: int | None = None


class ClusterPool(Protocol):
    """What a policy needs from a pool of warehouse clusters."""

    def spin_up(self, size: int, *, cluster_id: str | None = None) -> str:
        """Start a cluster of ``size`` cores; return its id at once."""

    def wait_ready(self, cluster_id: str, timeout_s: float | None = None) -> ClusterInfo:
        """Block until the cluster accepts queries."""

    def submit(self, cluster_id: str, request: QueryRequest) -> None:
        """Start ``request`` on a ready cluster without waiting for it."""

    def completions(self, timeout_s: float | None = None) -> list[QueryCompletion]:
        """Completions since the last call; waits up to ``timeout_s`` for one."""

    def tear_down(self, cluster_id: str) -> None:
        """Stop a cluster; queries still running on it end as ``error``."""

    def cancel(self, cluster_id: str, query_id: int) -> None:
        """Interrupt a running query; it completes as ``error`` (:data:`CANCELLED`)."""

    def clusters(self) -> list[ClusterInfo]:
        """Every cluster the pool has started, with its state."""

    def close(self) -> None:
        """Tear down every cluster."""


def drain(completions: queue.Queue, timeout_s: float | None = None) -> list[QueryCompletion]:
    """A pool's completion queue emptied, waiting up to ``timeout_s`` for the first (``ClusterPool.completions``)."""
    out: list[QueryCompletion] = []
    try:
        out.append(completions.get(timeout=timeout_s))
    except queue.Empty:
        return out
    while True:
        try:
            out.append(completions.get_nowait())
        except queue.Empty:
            return out
