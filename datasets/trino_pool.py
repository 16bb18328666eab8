"""Trino coordinators as clusters: the cluster-pool interface over Trino's client REST protocol.

Each cluster is one Trino coordinator, configured up front as a
:class:`TrinoBackend` under the cluster id the pool knows it by. ``spin_up``
attaches it (nothing is started: the coordinator runs on its own) and a
background thread polls ``GET /v1/info`` until it answers ``"starting":
false``; then the cluster is ``ready``. Each query goes to the coordinator as
``POST /v1/statement`` and is followed page by page through ``nextUri``, as a
Trino client does (https://trino.io/docs/current/develop/client-protocol.html),
with the client's ``X-Trino-*`` headers (:attr:`QueryRequest.headers`) on
every request; ``DELETE`` on the query's ``nextUri`` cancels it there. The
``X-Trino-*`` headers of the answers (session changes: ``X-Trino-Set-Session``,
``X-Trino-Added-Prepare``, ``X-Trino-Set-Catalog``, ...) and Trino's own
``error`` object come back on the completion
(:attr:`QueryCompletion.response_headers`, :attr:`QueryCompletion.trino_error`).

Start and end of each attempt are read on this process's monotonic clock:
the start when the ``POST`` was sent, the end when the last
page was read or the error, cancel or timeout arrived, so that a query log
keeps concurrency on one clock whatever the coordinators' clocks say.

Every request has an HTTP timeout, every answer a bound on its size
(:attr:`TrinoBackend.max_page_bytes`), and every backend a bound on the
queries forwarded to it at once (:attr:`TrinoBackend.max_running`; the rest
wait in the pool, in submission order). A request that fails in transit is
tried again a few times; after that the coordinator counts as stopped: the
cluster becomes ``failed`` and its queries end as ``error`` with "stopped" in
the error, as they do when a DuckDB worker dies. A coordinator that dies while
idle is noticed by :meth:`TrinoClusterPool.health`, which a front door calls
on an interval.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.pool import CANCELLED, ClusterInfo, QueryCompletion, QueryRequest, RawPage, drain

__all__ = ["TrinoBackend", "TrinoClusterPool"]

_TORN_DOWN = "cluster torn down while the query ran"
#: Answers a Trino client tries again (the coordinator is starting, overloaded, or behind a proxy that is).
_RETRY_STATUS = frozenset({429, 502, 503, 504})
#: Request headers never forwarded: the spooling protocol's results are not inline pages, the only kind read here.
_DROPPED = frozenset({"x-trino-query-data-encoding"})
#: The fields of a Trino ``error`` object kept on the completion.
_ERROR_FIELDS = ("errorName", "errorCode", "errorType", "message", "errorLocation")
_DEFAULT_USER = "sloctl"


@dataclass(frozen=True)
class TrinoBackend:
    """One Trino coordinator the pool may attach as a cluster.

    Attributes:
        url: the coordinator's base URL, ``http://host:port`` or
            ``https://host:port`` (no path).
        size: the cluster's size in the pool's units: what ``spin_up`` must
            ask for, and what routers and cost models weigh it by.
        user: the ``X-Trino-User`` of a request that names none (``None``:
            ``"sloctl"``), and of health checks.
        max_running: the most queries forwarded to it at once; more wait in
            the pool, in submission order.
        headers: sent with every request (``Authorization``, a default
            ``X-Trino-Catalog`` / ``X-Trino-Schema``, ...); a query's own
            :attr:`QueryRequest.headers` take precedence.
        auth: ``(user, password)`` for HTTP basic authentication (Trino
            accepts it over HTTPS only).
        connect_timeout_s: the most a connection may take to open.
        request_timeout_s: the most one request may take to answer (a Trino
            coordinator answers a ``nextUri`` poll within about a second).
        max_page_bytes: the most bytes one answer (one page of rows) may
            hold; a larger one fails its query.
        retries: how often a request that failed in transit (connection
            refused or reset, no answer in ``request_timeout_s``, HTTP 429,
            502, 503 or 504) is tried again, after 0.1 s, 0.2 s, ..., before
            the coordinator counts as stopped. A ``POST`` is tried again only
            when it never reached the coordinator (a second one could start
            the query twice).
        start_timeout_s: how long after ``spin_up`` the coordinator may take
            to answer ``GET /v1/info`` with ``"starting": false``; then the
            cluster fails.
        poll_interval_s: how often ``/v1/info`` is asked meanwhile.
        health_failures: consecutive failed :meth:`TrinoClusterPool.health`
            checks after which a ready cluster counts as failed.
    """

    url: str
    size: int
    user: str | None = None
    max_running: int = 8
    headers: Mapping[str, str] | None = None
    auth: tuple[str, str] | None = None
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    max_page_bytes: int = 32 * 1024 * 1024
    retries: int = 3
    start_timeout_s: float = 120.0
    poll_interval_s: float = 0.5
    health_failures: int = 3

    def validate(self, cluster_id: str) -> None:
        """Check every field; ``cluster_id`` names the backend in the message.

        Raises:
            ClusterPoolError: a field is out of range, naming it, the rule and the value.
        """
        where = f"backends[{cluster_id!r}]"
        parts = urllib.parse.urlsplit(self.url) if isinstance(self.url, str) else None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise ClusterPoolError(
                f"The '{where}.url' parameter must be a coordinator's base URL such as "
                f"'http://host:8080' (http or https, no path), got {self.url!r}."
            )
        for name in ("size", "max_running", "max_page_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ClusterPoolError(f"The '{where}.{name}' parameter must be an integer >= 1, got {value!r}.")
        for name in ("retries", "health_failures"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ClusterPoolError(f"The '{where}.{name}' parameter must be an integer >= 0, got {value!r}.")
        for name in ("connect_timeout_s", "request_timeout_s", "start_timeout_s", "poll_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ClusterPoolError(
                    f"The '{where}.{name}' parameter must be a number of seconds > 0, got {value!r}."
                )
        if self.user is not None and (not isinstance(self.user, str) or not self.user):
            raise ClusterPoolError(
                f"The '{where}.user' parameter must be a non-empty string or None, got {self.user!r}."
            )
        if self.headers is not None:
            _check_headers(f"{where}.headers", self.headers, trino_only=False)
        if self.auth is not None and not (
            isinstance(self.auth, tuple) and len(self.auth) == 2 and all(isinstance(v, str) for v in self.auth)
        ):
            raise ClusterPoolError(
                f"The '{where}.auth' parameter must be a (user, password) pair of strings or "
                f"None, got {type(self.auth).__name__}."
            )


def _check_headers(name: str, headers: Any, *, trino_only: bool) -> None:
    """Refuse anything but a mapping of header names to one-line strings (and, for a query, ``X-Trino-*`` only)."""
    if not isinstance(headers, Mapping):
        raise ClusterPoolError(
            f"The '{name}' parameter must map header names to strings, got {type(headers).__name__}."
        )
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str) or any(c in key + value for c in "\r\n\0"):
            raise ClusterPoolError(
                f"The '{name}' parameter must map header names to one-line strings, got {key!r}: {value!r}."
            )
        if trino_only and not key.lower().startswith("x-trino-"):
            raise ClusterPoolError(
                f"The '{name}' parameter must hold the client's X-Trino-* headers only, got {key!r}."
            )


def _canonical(name: str) -> str:
    """``x-trino-set-session`` → ``X-Trino-Set-Session`` (how Trino spells its headers)."""
    return "-".join(part.capitalize() for part in name.split("-"))


class _End(Exception):
    """How an attempt ends, raised from wherever that is noticed."""

    def __init__(
        self, status: str, error: str, trino_error: dict[str, Any] | None = None, *, lost: bool = False
    ) -> None:
        super().__init__(error)
        self.status, self.error, self.trino_error, self.lost = status, error, trino_error, lost


@dataclass
class _Answer:
    """One HTTP answer, read whole (up to the page bound)."""

    status_code: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class _Attempt:
    request: QueryRequest
    submitted_s: float
    deadline_s: float
    start_s: float | None = None
    next_uri: str | None = None  # where the next page is, and where DELETE goes
    cancelled: bool = False
    deleted: bool = False  # a DELETE went out (at most one per attempt)
    forwarded: bool = False
    sent: int = 0  # pages handed to on_page
    credited: int = 0
    rows: int = 0
    columns: tuple[tuple[str, str], ...] | None = None
    data: list[list] | None = None
    response_headers: dict[str, list[str]] = field(default_factory=dict)  # lower-case name -> values, in order


@dataclass
class _Cluster:
    cluster_id: str
    backend: TrinoBackend
    client: Any  # httpx.Client
    requested_s: float
    state: str = "starting"
    ready_s: float | None = None
    failure: str = ""
    attempts: dict[int, _Attempt] = field(default_factory=dict)  # submitted, not yet completed
    waiting: deque[int] = field(default_factory=deque)  # submitted, not yet forwarded, in order
    forwarded: int = 0  # attempts holding one of max_running slots
    health_failed: int = 0  # consecutive failed health checks
    threads: list[threading.Thread] = field(default_factory=list)


class TrinoClusterPool:
    """:class:`~sloctl.datasets.pool.ClusterPool` over real Trino coordinators.

    Behaves as :class:`~sloctl.datasets.DuckDBClusterPool` does for what a
    front door uses (``spin_up``, ``wait_ready``, ``submit`` with ``fetch`` or
    ``stream``, ``credit``, ``explain``, ``cancel``, ``completions``,
    ``tear_down``, ``clusters``, ``close``), with these differences: the
    clusters and their sizes are the configured backends (a coordinator is
    attached, not started, and ``tear_down`` leaves it running); ``page_rows``
    is the coordinator's to choose (a page is what one ``nextUri`` answer
    holds); a query's ``timeout_s`` counts from :meth:`submit`, time waiting
    for one of ``max_running`` slots included (one that never got a slot
    ends with ``start_s == end_s``); each query runs on a thread of its own,
    which also calls its ``on_page``; ``explain`` returns Trino's JSON plan,
    not DuckDB's; ``cpu_budget`` is NaN and ``cores`` empty.

    Args:
        backends: cluster id → :class:`TrinoBackend` (or a mapping of its
            fields, as a configuration file holds them), e.g.
            ``{"east": TrinoBackend("http://trino-east:8080", size=4)}``.

    Raises:
        ClusterPoolError: no backends, or a backend's field is out of range
            (the message names it, e.g. ``backends['east'].url``).
    """

    def __init__(self, backends: Mapping[str, TrinoBackend | Mapping[str, Any]]) -> None:
        self.backends = backends
        self._validate()
        self._completions: queue.Queue[QueryCompletion] = queue.Queue()
        self._clusters: dict[str, _Cluster] = {}
        self._retired: list[_Cluster] = []  # torn down and attached again: closed with the pool
        self._cond = threading.Condition()
        self._closed = False

    def _validate(self) -> None:
        if not isinstance(self.backends, Mapping) or not self.backends:
            raise ClusterPoolError(
                f"The 'backends' parameter must map cluster ids to TrinoBackend, and name at "
                f"least one, got {self.backends!r}."
            )
        checked: dict[str, TrinoBackend] = {}
        for cluster_id, backend in self.backends.items():
            if not isinstance(cluster_id, str) or not cluster_id:
                raise ClusterPoolError(
                    f"The 'backends' parameter's keys must be non-empty cluster ids, got {cluster_id!r}."
                )
            if isinstance(backend, Mapping):
                try:
                    backend = TrinoBackend(**backend)
                except TypeError as exc:
                    raise ClusterPoolError(
                        f"The 'backends[{cluster_id!r}]' parameter must hold TrinoBackend's "
                        f"fields (url, size, user, max_running, ...): {exc}."
                    ) from None
            if not isinstance(backend, TrinoBackend):
                raise ClusterPoolError(
                    f"The 'backends[{cluster_id!r}]' parameter must be a TrinoBackend, got {type(backend).__name__}."
                )
            backend.validate(cluster_id)
            checked[cluster_id] = backend
        self.backends = checked

    # -- ClusterPool -------------------------------------------------------
    def spin_up(self, size: int, *, cluster_id: str | None = None) -> str:
        """Attach a configured coordinator; it becomes ``ready`` once ``/v1/info`` says it has started.

        Args:
            size: the cluster's size; must be its backend's ``size``.
            cluster_id: which backend (``None``: the first one of that size
                that is not attached, or was torn down).

        Returns:
            The cluster id, at once (poll :meth:`wait_ready` or :meth:`clusters`).

        Raises:
            ClusterPoolError: the pool is closed, the id is not configured,
                the size is not the backend's, or the backend is in use.
        """
        import httpx

        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ClusterPoolError(f"The 'size' parameter must be an integer >= 1, got {size!r}.")
        with self._cond:
            if self._closed:
                raise ClusterPoolError("The pool is closed.")
            if cluster_id is None:
                free = [
                    cid
                    for cid, b in self.backends.items()
                    if b.size == size and (cid not in self._clusters or self._clusters[cid].state == "stopped")
                ]
                if not free:
                    sizes = ", ".join(f"{cid}: {b.size}" for cid, b in self.backends.items())
                    raise ClusterPoolError(
                        f"The 'size' parameter asks for a free Trino backend of size {size}, but "
                        f"none is configured or free (backends: {sizes})."
                    )
                cluster_id = free[0]
            backend = self.backends.get(cluster_id)
            if backend is None:
                raise ClusterPoolError(
                    f"The 'cluster_id' parameter must name a configured Trino backend "
                    f"({', '.join(self.backends)}), got {cluster_id!r}."
                )
            if size != backend.size:
                raise ClusterPoolError(
                    f"The 'size' parameter must be {backend.size} for Trino backend "
                    f"{cluster_id!r} ({backend.url}), got {size}."
                )
            old = self._clusters.get(cluster_id)
            if old is not None and old.state != "stopped":
                raise ClusterPoolError(f"The 'cluster_id' {cluster_id!r} is already in use.")
            client = httpx.Client(
                timeout=httpx.Timeout(backend.request_timeout_s, connect=backend.connect_timeout_s),
                limits=httpx.Limits(
                    max_connections=backend.max_running + 4, max_keepalive_connections=backend.max_running + 4
                ),
                auth=backend.auth,
                follow_redirects=False,
            )
            cluster = _Cluster(cluster_id, backend, client, requested_s=time.monotonic())
            if old is not None:
                self._retired.append(old)
            self._clusters[cluster_id] = cluster
            self._start(cluster, self._watch_start, cluster)
        return cluster_id

    def wait_ready(self, cluster_id: str, timeout_s: float | None = None) -> ClusterInfo:
        """Block until the coordinator has started.

        Raises:
            ClusterPoolError: the cluster is unknown, failed (its ``failure``
                says why) or torn down, or not ready after ``timeout_s``.
        """
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            cluster = self._get(cluster_id)
            while cluster.state == "starting":
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ClusterPoolError(f"Cluster {cluster_id!r} was not ready after {timeout_s} s.")
                self._cond.wait(min(remaining, 1.0))
            if cluster.state != "ready":
                raise ClusterPoolError(f"Cluster {cluster_id!r} failed to start ({cluster.failure or cluster.state}).")
            return self._info(cluster)

    def submit(self, cluster_id: str, request: QueryRequest) -> None:
        """Forward ``request`` to the coordinator on a thread of its own, once one of its slots is free.

        A ``stream`` request's pages go to ``request.on_page`` (see
        :class:`~sloctl.datasets.pool.QueryRequest`) from that thread; let
        more come with :meth:`credit`. ``request.headers`` go with every
        request of the query, over the backend's ``headers``, except
        ``X-Trino-Query-Data-Encoding`` (the pool reads inline pages, not
        Trino's spooled segments).

        Raises:
            ClusterPoolError: the cluster is unknown or not ready, the query id
                already runs there, or the request's fields are inconsistent.
        """
        if request.stream:
            if request.fetch:
                raise ClusterPoolError(
                    "The 'fetch' and 'stream' parameters of a QueryRequest exclude each other: "
                    "a streamed result comes through 'on_page'."
                )
            for name in ("page_rows", "buffer_pages"):
                value = getattr(request, name)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ClusterPoolError(
                        f"The '{name}' parameter of a QueryRequest must be an integer >= 1, got {value!r}."
                    )
        if request.headers is not None:
            _check_headers("headers", request.headers, trino_only=True)
        timeout = request.timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise ClusterPoolError(
                f"The 'timeout_s' parameter of a QueryRequest must be > 0 seconds or None, got {timeout!r}."
            )
        now = time.monotonic()
        attempt = _Attempt(
            request,
            submitted_s=now,
            deadline_s=now + timeout if timeout is not None else math.inf,
            data=[] if request.fetch else None,
        )
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state != "ready":
                raise ClusterPoolError(f"Cluster {cluster_id!r} is {cluster.state}; queries need a ready cluster.")
            if request.query_id in cluster.attempts:
                raise ClusterPoolError(f"The 'query_id' {request.query_id!r} already runs on cluster {cluster_id!r}.")
            cluster.attempts[request.query_id] = attempt
            cluster.waiting.append(request.query_id)
            self._start(cluster, self._run, cluster, attempt)

    def credit(self, cluster_id: str, query_id: int, pages: int = 1) -> None:
        """Let streamed query ``query_id`` fetch ``pages`` more pages (call it once per page consumed).

        A query that already ended, or does not stream, is left alone.

        Raises:
            ClusterPoolError: ``pages`` is not an integer >= 1, or the cluster is unknown.
        """
        if isinstance(pages, bool) or not isinstance(pages, int) or pages < 1:
            raise ClusterPoolError(f"The 'pages' parameter of credit must be an integer >= 1, got {pages!r}.")
        with self._cond:
            attempt = self._get(cluster_id).attempts.get(query_id)
            if attempt is not None and attempt.request.stream:
                attempt.credited += pages
                self._cond.notify_all()

    def explain(
        self, cluster_id: str, sql: str, timeout_s: float = 5.0, *, headers: Mapping[str, str] | None = None
    ) -> str | None:
        """``EXPLAIN (FORMAT JSON) sql`` on the coordinator of ``cluster_id``, on the calling thread.

        It plans and runs nothing, so it takes none of the backend's
        ``max_running`` slots.

        Args:
            cluster_id: the cluster.
            sql: one statement.
            timeout_s: give up (and cancel it there) after this long.
            headers: ``X-Trino-*`` headers to send (catalog, schema, user, ...).

        Returns:
            The plan text (Trino's ``Query Plan`` column; the last column of
            each row when the coordinator answers more), or ``None`` when the
            coordinator could not plan it or took longer than ``timeout_s``.

        Raises:
            ClusterPoolError: the cluster is unknown, not ready, or stopped
                answering before it planned.
        """
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
            raise ClusterPoolError(f"The 'timeout_s' parameter of explain must be > 0 seconds, got {timeout_s!r}.")
        if headers is not None:
            _check_headers("headers", headers, trino_only=True)
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state != "ready":
                raise ClusterPoolError(f"Cluster {cluster_id!r} is {cluster.state}; EXPLAIN needs a ready cluster.")
        now = time.monotonic()
        attempt = _Attempt(
            QueryRequest(-1, "EXPLAIN (FORMAT JSON) " + sql, timeout_s=timeout_s, fetch=True, headers=headers),
            submitted_s=now,
            deadline_s=now + timeout_s,
            data=[],
            forwarded=True,
        )
        try:
            self._follow(cluster, attempt)
        except _End as end:
            if end.lost:
                raise ClusterPoolError(
                    f"Cluster {cluster_id!r} is {cluster.state} ({cluster.failure or 'torn down'}); "
                    "its EXPLAIN was lost."
                ) from None
            return None
        finally:
            self._delete(cluster, attempt)
        rows = attempt.data or []
        plans = [str(row[-1]) for row in rows if isinstance(row, list) and row and row[-1] is not None]
        return "\n".join(plans) if plans else None

    def cancel(self, cluster_id: str, query_id: int) -> None:
        """Interrupt ``query_id``: ``DELETE`` on the coordinator; it completes as ``error`` (``pool.CANCELLED``).

        Returns at once (the ``DELETE`` goes out on a thread of its own). A
        query that already finished, or never ran there, is left alone.

        Raises:
            ClusterPoolError: the cluster is unknown.
        """
        with self._cond:
            cluster = self._get(cluster_id)
            attempt = cluster.attempts.get(query_id)
            if attempt is None or cluster.state != "ready":
                return
            attempt.cancelled = True
            self._cond.notify_all()
            if attempt.next_uri is not None and not attempt.deleted:
                self._start(cluster, self._delete, cluster, attempt)

    def completions(self, timeout_s: float | None = None) -> list[QueryCompletion]:
        """Completions since the last call, waiting up to ``timeout_s`` for the first."""
        return drain(self._completions, timeout_s)

    def tear_down(self, cluster_id: str) -> None:
        """Detach the coordinator: its queries are cancelled there and end as ``error``; it keeps running.

        Raises:
            ClusterPoolError: the cluster is unknown.
        """
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state == "stopped":
                return
            cluster.state = "stopped"
            self._cond.notify_all()
            for attempt in cluster.attempts.values():
                if attempt.next_uri is not None and not attempt.deleted:
                    self._start(cluster, self._delete, cluster, attempt)

    def health(self, cluster_id: str) -> dict[str, Any]:
        """Ask the coordinator ``GET /v1/info`` now (within its ``connect_timeout_s`` and ``request_timeout_s``).

        ``health_failures`` failed checks in a row fail a ready cluster (its
        queries end as ``error``, "stopped"); a check that passes resets the count.

        Returns:
            ``{"ok", "latency_s", "starting", "error", "state", "running",
            "queued"}``: ``ok`` when it answered ``"starting": false``;
            ``latency_s`` the round trip; ``starting`` what it said (``None``
            without an answer); ``error`` why not ok (else ``""``); ``state``
            the cluster's state after the check; ``running`` the queries
            forwarded to it, ``queued`` those waiting for a slot.

        Raises:
            ClusterPoolError: the cluster is unknown.
        """
        with self._cond:
            cluster = self._get(cluster_id)
        probe = self._probe(cluster)
        with self._cond:
            if cluster is self._clusters.get(cluster_id):
                cluster.health_failed = 0 if probe["ok"] else cluster.health_failed + 1
                if cluster.state == "ready" and cluster.health_failed >= max(1, cluster.backend.health_failures):
                    self._fail(
                        cluster,
                        f"coordinator {cluster.backend.url} failed {cluster.health_failed} health "
                        f"check(s) in a row: {probe['error']}",
                    )
            return {**probe, "state": cluster.state, "running": cluster.forwarded, "queued": len(cluster.waiting)}

    def clusters(self) -> list[ClusterInfo]:
        """Every cluster attached, in the order of their first ``spin_up``."""
        with self._cond:
            return [self._info(c) for c in self._clusters.values()]

    def close(self, timeout_s: float = 10.0) -> None:
        """Detach every coordinator, wait up to ``timeout_s`` for the pool's threads, close the connections."""
        with self._cond:
            self._closed = True
        for cluster_id in list(self._clusters):
            self.tear_down(cluster_id)
        deadline = time.monotonic() + timeout_s
        for cluster in [*self._retired, *self._clusters.values()]:
            for thread in list(cluster.threads):
                thread.join(max(0.0, deadline - time.monotonic()))
            cluster.client.close()

    def __enter__(self) -> TrinoClusterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------
    def _get(self, cluster_id: str) -> _Cluster:
        try:
            return self._clusters[cluster_id]
        except KeyError:
            raise ClusterPoolError(
                f"Unknown cluster {cluster_id!r} (attached: {', '.join(self._clusters) or 'none'})."
            ) from None

    @staticmethod
    def _info(c: _Cluster) -> ClusterInfo:
        return ClusterInfo(
            cluster_id=c.cluster_id,
            size=c.backend.size,
            cores=(),
            state=c.state,
            requested_s=c.requested_s,
            ready_s=c.ready_s,
            running=len(c.attempts),
            oversubscribed=False,
            failure=c.failure,
        )

    def _start(self, cluster: _Cluster, target: Any, *args: Any) -> None:
        """Run ``target(*args)`` on a daemon thread the pool joins on :meth:`close` (called under the lock)."""
        cluster.threads = [t for t in cluster.threads if t.is_alive()]
        thread = threading.Thread(
            target=target,
            args=args,
            daemon=True,
            name=f"sloctl-trino-{cluster.cluster_id}-{target.__name__.strip('_')}",
        )
        cluster.threads.append(thread)
        thread.start()

    def _fail(self, cluster: _Cluster, why: str) -> None:
        """The coordinator stopped answering: the cluster fails (called under the lock)."""
        if cluster.state in ("starting", "ready"):
            cluster.state, cluster.failure = "failed", why
            self._cond.notify_all()

    def _headers(self, backend: TrinoBackend, given: Mapping[str, str] | None) -> dict[str, str]:
        """The backend's headers, then the query's over them (names compared without case)."""
        merged: dict[str, tuple[str, str]] = {"x-trino-user": ("X-Trino-User", backend.user or _DEFAULT_USER)}
        for source in (backend.headers or {}, given or {}):
            for name, value in source.items():
                if name.lower() not in _DROPPED:
                    merged[name.lower()] = (name, value)
        return dict(merged.values())

    def _probe(self, cluster: _Cluster) -> dict[str, Any]:
        """``GET /v1/info`` once: ``{"ok", "latency_s", "starting", "error"}``."""
        import httpx

        started = time.monotonic()
        try:
            answer = self._http(
                cluster,
                "GET",
                cluster.backend.url + "/v1/info",
                self._headers(cluster.backend, None),
                None,
                cluster.backend.request_timeout_s,
            )
        except (httpx.HTTPError, _End) as exc:
            return {
                "ok": False,
                "latency_s": time.monotonic() - started,
                "starting": None,
                "error": f"{type(exc).__name__}: {exc}" if not isinstance(exc, _End) else exc.error,
            }
        latency = time.monotonic() - started
        try:
            doc = json.loads(answer.body) if answer.status_code == 200 else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return {
                "ok": False,
                "latency_s": latency,
                "starting": None,
                "error": f"GET /v1/info answered HTTP {answer.status_code}: {answer.body[:200]!r}",
            }
        starting = bool(doc.get("starting", False))
        return {
            "ok": not starting,
            "latency_s": latency,
            "starting": starting,
            "error": "the coordinator is starting" if starting else "",
        }

    def _watch_start(self, cluster: _Cluster) -> None:
        """Poll ``/v1/info`` until the coordinator has started (ready) or ``start_timeout_s`` passed (failed)."""
        deadline = cluster.requested_s + cluster.backend.start_timeout_s
        while True:
            probe = self._probe(cluster)
            with self._cond:
                if cluster.state != "starting":  # torn down meanwhile
                    return
                if probe["ok"]:
                    cluster.state, cluster.ready_s = "ready", time.monotonic()
                    self._cond.notify_all()
                    return
                if time.monotonic() >= deadline:
                    self._fail(
                        cluster,
                        f"coordinator {cluster.backend.url} did not start within "
                        f"{cluster.backend.start_timeout_s:g} s (start_timeout_s): {probe['error']}",
                    )
                    return
                self._cond.wait(min(cluster.backend.poll_interval_s, max(0.0, deadline - time.monotonic())))

    def _http(
        self, cluster: _Cluster, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout_s: float
    ) -> _Answer:
        """One request; the answer read whole, refused past ``max_page_bytes``."""
        import httpx

        backend = cluster.backend
        timeout = httpx.Timeout(timeout_s, connect=min(backend.connect_timeout_s, timeout_s))
        with cluster.client.stream(method, url, headers=headers, content=body, timeout=timeout) as response:
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > backend.max_page_bytes:
                    raise _End(
                        "error",
                        f"coordinator {backend.url} answered {method} with more than "
                        f"{backend.max_page_bytes} bytes (max_page_bytes)",
                    )
                chunks.append(chunk)
            return _Answer(
                response.status_code, [(k.lower(), v) for k, v in response.headers.multi_items()], b"".join(chunks)
            )

    def _check(self, cluster: _Cluster, attempt: _Attempt) -> None:
        """Raise :class:`_End` when the attempt must stop now (called under the lock)."""
        if attempt.cancelled:
            raise _End("error", CANCELLED)
        if cluster.state == "stopped":
            raise _End("error", _TORN_DOWN, lost=True)
        if cluster.state != "ready":
            raise _End(
                "error", f"cluster {cluster.cluster_id} stopped while the query ran: {cluster.failure}", lost=True
            )
        if time.monotonic() >= attempt.deadline_s:
            raise _End("timeout", f"query exceeded its timeout of {attempt.deadline_s - attempt.submitted_s:g} s")

    def _request(self, cluster: _Cluster, attempt: _Attempt, method: str, url: str) -> _Answer:
        """One request of the query, tried again on failures in transit; the coordinator stopped after ``retries``."""
        import httpx

        backend = cluster.backend
        headers = self._headers(backend, attempt.request.headers)
        body = None
        if method == "POST":
            body = attempt.request.sql.encode()
            headers.setdefault("Content-Type", "text/plain; charset=utf-8")
        tries, delay_s, why = 0, 0.1, ""
        while True:
            with self._cond:
                self._check(cluster, attempt)
            remaining = attempt.deadline_s - time.monotonic()
            capped = remaining < backend.request_timeout_s  # the query's deadline comes first
            try:
                answer = self._http(
                    cluster, method, url, headers, body, min(backend.request_timeout_s, max(remaining, 0.001))
                )
                if answer.status_code not in _RETRY_STATUS:
                    return answer
                why = f"HTTP {answer.status_code}"
            except httpx.TimeoutException as exc:
                if capped:
                    continue  # the deadline passed: _check says so
                if method == "POST" and not isinstance(exc, httpx.ConnectTimeout):
                    why, tries = f"{type(exc).__name__}: {exc}", backend.retries  # it may run there: never twice
                else:
                    why = f"{type(exc).__name__}: {exc}"
            except httpx.HTTPError as exc:
                if method == "POST" and not isinstance(exc, httpx.ConnectError):
                    why, tries = f"{type(exc).__name__}: {exc}", backend.retries
                else:
                    why = f"{type(exc).__name__}: {exc}"
            tries += 1
            with self._cond:
                if tries > backend.retries:
                    self._fail(
                        cluster,
                        f"coordinator {backend.url} stopped answering ({method} "
                        f"{urllib.parse.urlsplit(url).path}: {why or 'no answer'})",
                    )
                    self._check(cluster, attempt)
                    raise _End("error", f"cluster {cluster.cluster_id} stopped while the query ran: {why}", lost=True)
                self._cond.wait(delay_s)  # cancel and tear_down wake it
            delay_s *= 2

    def _document(self, cluster: _Cluster, attempt: _Attempt, method: str, answer: _Answer) -> dict[str, Any]:
        """The ``QueryResults`` document of an answer; its ``X-Trino-*`` headers kept for the completion."""
        for name, value in answer.headers:
            if name.startswith("x-trino-"):
                values = attempt.response_headers.setdefault(name, [])
                if value not in values:
                    values.append(value)
        if answer.status_code != 200:
            text = answer.body[:500].decode("utf-8", errors="replace").strip()
            raise _End(
                "error", f"coordinator {cluster.backend.url} answered HTTP {answer.status_code} to {method}: {text}"
            )
        try:
            doc = json.loads(answer.body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise _End(
                "error",
                f"coordinator {cluster.backend.url} answered {method} with no QueryResults document: "
                f"{answer.body[:200]!r}",
            )
        return doc

    def _follow(self, cluster: _Cluster, attempt: _Attempt) -> None:
        """Wait for a slot, ``POST`` the query and follow ``nextUri`` to the end; raise :class:`_End` unless ok."""
        request = attempt.request
        with self._cond:
            while not attempt.forwarded:  # in submission order, at most max_running at once
                self._check(cluster, attempt)
                if cluster.waiting[0] == request.query_id and cluster.forwarded < cluster.backend.max_running:
                    cluster.waiting.popleft()
                    cluster.forwarded += 1
                    attempt.forwarded = True
                    break
                self._cond.wait(min(1.0, max(0.001, attempt.deadline_s - time.monotonic())))
        method = "POST"
        attempt.start_s = time.monotonic()  # the coordinator has it from here (its answer may wait for news)
        answer = self._request(cluster, attempt, method, cluster.backend.url + "/v1/statement")
        while True:
            doc = self._document(cluster, attempt, method, answer)
            with self._cond:
                attempt.next_uri = doc.get("nextUri") if isinstance(doc.get("nextUri"), str) else None
                self._check(cluster, attempt)
            error = doc.get("error")
            if error is not None:
                fields = {k: error[k] for k in _ERROR_FIELDS if isinstance(error, dict) and k in error}
                raise _End("error", f"{fields.get('errorName', 'ERROR')}: {fields.get('message', error)}", fields)
            if attempt.columns is None and isinstance(doc.get("columns"), list):
                attempt.columns = tuple((str(c.get("name")), str(c.get("type"))) for c in doc["columns"])
            rows = doc.get("data")
            if rows is not None:
                if not isinstance(rows, list):
                    raise _End(
                        "error",
                        f"coordinator {cluster.backend.url} sent its rows in another encoding "
                        "(the pool reads inline JSON pages only)",
                    )
                self._take(cluster, attempt, rows)
            if attempt.next_uri is None:
                return
            if request.stream and request.on_page is not None:
                with self._cond:  # backpressure: at most buffer_pages pages the consumer has not let go
                    while attempt.sent - attempt.credited >= request.buffer_pages:
                        self._check(cluster, attempt)
                        self._cond.wait(min(1.0, max(0.001, attempt.deadline_s - time.monotonic())))
            method = "GET"
            answer = self._request(cluster, attempt, method, attempt.next_uri)

    def _take(self, cluster: _Cluster, attempt: _Attempt, rows: list) -> None:
        """One page of rows: kept (``fetch``), handed on (``stream``) or only counted."""
        request = attempt.request
        attempt.rows += len(rows)
        if request.fetch:
            attempt.data.extend(rows)
            return
        if not request.stream or not rows:
            return
        if request.stream_timeout_s is not None and attempt.sent == 0:
            with self._cond:  # the first page has left: the longer bound holds from now on
                attempt.deadline_s = attempt.submitted_s + max(
                    request.stream_timeout_s, attempt.deadline_s - attempt.submitted_s
                )
        if request.on_page is None:
            return
        page = RawPage(json.dumps(rows, separators=(",", ":")), len(rows)) if request.raw_pages else rows
        with self._cond:
            attempt.sent += 1
        try:
            request.on_page(attempt.columns or (), page)
        except Exception as exc:  # the consumer cannot take the rest: stop the query, say why
            raise _End("error", f"on_page raised {type(exc).__name__}: {exc}") from None

    def _delete(self, cluster: _Cluster, attempt: _Attempt) -> None:
        """``DELETE`` on the query's ``nextUri`` once, when it may still run there; errors are the coordinator's."""
        import httpx

        with self._cond:
            uri = attempt.next_uri
            if uri is None or attempt.deleted or cluster.state == "failed":
                return
            attempt.deleted = True
        backend = cluster.backend
        with contextlib.suppress(httpx.HTTPError, _End):
            self._http(
                cluster,
                "DELETE",
                uri,
                self._headers(backend, attempt.request.headers),
                None,
                min(backend.request_timeout_s, 10.0),
            )

    def _run(self, cluster: _Cluster, attempt: _Attempt) -> None:
        """One attempt from submission to completion (its own thread)."""
        request = attempt.request
        status, error, trino_error = "ok", "", None
        try:
            self._follow(cluster, attempt)
        except _End as end:
            status, error, trino_error = end.status, end.error, end.trino_error
        except Exception as exc:  # never leave a query without its completion
            status, error = "error", f"{type(exc).__name__}: {exc}"
        end_s = time.monotonic()
        if status != "ok":
            self._delete(cluster, attempt)
        with self._cond:
            cluster.attempts.pop(request.query_id, None)
            with contextlib.suppress(ValueError):
                cluster.waiting.remove(request.query_id)
            if attempt.forwarded:
                cluster.forwarded -= 1
            self._cond.notify_all()
        ok = status == "ok"
        headers = {_canonical(k): ",".join(v) for k, v in attempt.response_headers.items()}
        self._completions.put(
            QueryCompletion(
                query_id=request.query_id,
                cluster_id=cluster.cluster_id,
                start_s=attempt.start_s if attempt.start_s is not None else end_s,
                end_s=end_s,
                status=status,
                error=error,
                rows=attempt.rows,
                columns=(attempt.columns or ()) if ok and (request.fetch or request.stream) else None,
                data=attempt.data if ok and request.fetch else None,
                response_headers=headers or None,
                trino_error=trino_error,
            )
        )
