"""A live warehouse of PostgreSQL servers behind the cluster-pool interface.

:class:`PostgresClusterPool` is a :class:`~sloctl.datasets.pool.ClusterPool`
whose clusters are existing PostgreSQL servers (or read replicas), each
configured once as a :class:`PostgresBackend` under its cluster id. It does
for the SLO gateway what :class:`~sloctl.datasets.duckdb_pool.DuckDBClusterPool`
does, with these rules:

* **Attaching.** ``spin_up(size, cluster_id=...)`` attaches the configured
  server of that id (``size`` must be its configured size) and returns at
  once; a background thread connects and the cluster is ``ready`` after a
  ``SELECT 1`` (``failed``, with ``failure`` set, if that fails).
  ``tear_down`` interrupts its queries (they end as ``error``, "cluster torn
  down while the query ran (backend c1 stopped by tear_down)") and closes its
  connections; nothing happens to the server itself.
* **Connections.** psycopg 3 connections, at most ``pool_connections`` per
  server, opened on demand and kept. Every query runs on a thread of its own;
  one that finds no free connection waits for one, and its ``start_s`` is when
  it starts on the server. ``start_s`` and ``end_s`` are ``time.monotonic()``
  read in this process right around the execution (the gateway's clock).
* **Read only.** Each attempt is one statement (the extended query protocol
  refuses a second), whose first keyword is one of
  :data:`~sloctl.datasets.pg_dialect.RUNNABLE`, in a ``READ ONLY``
  transaction that is rolled back afterwards; sessions also default to
  ``default_transaction_read_only``. A refused statement ends as ``error``
  ``"PermissionException: ..."``. A read-only transaction does not stop what
  a privileged role may do outside the database (``pg_read_file``,
  ``pg_terminate_backend``): every attach, and :meth:`~PostgresClusterPool.check_role`,
  checks the role (:mod:`~sloctl.datasets.pg_roles`) and refuses a
  superuser, a member of ``pg_signal_backend`` and the like, or an owner of
  what it serves, naming what to revoke, unless the backend's
  ``allow_privileged_role`` says otherwise. :func:`create_reader_role` makes
  a role that may only read.
* **Timeouts and cancels.** ``timeout_s`` is the attempt's
  ``statement_timeout`` (``SET LOCAL``; a streamed query is held to the same
  deadline across its fetches and its waits for credit); SQLSTATE 57014 from
  it ends the attempt as ``timeout`` (censored). :meth:`~PostgresClusterPool.cancel`
  sends PostgreSQL's cancel request (repeated until the query ends, as one
  that lands before the statement starts is lost); the query ends as
  ``error`` with the error :data:`~sloctl.datasets.pool.CANCELLED`.
* **Results.** ``fetch`` sends the result whole; ``stream`` reads it through a
  server-side cursor, ``FETCH page_rows`` at a time, never more than
  ``buffer_pages`` pages ahead of :meth:`~PostgresClusterPool.credit`
  (``EXPLAIN`` and ``SHOW``, which no cursor takes, are read whole, then paged).
  Columns are ``(name, DuckDB type name)`` and values JSON values in the
  DuckDB worker's conventions (:mod:`sloctl.datasets._pg_values`), so the
  gateway's type mapping applies as it is; server errors are named after the
  DuckDB exception of the same kind (``ParserException: ...``), and those
  that are the query's own fault carry Trino's error object
  (:attr:`~sloctl.datasets.pool.QueryCompletion.trino_error`, by SQLSTATE:
  :data:`TRINO_ERRORS`).
* **A server that dies.** A query whose connection breaks while the server no
  longer accepts connections ends as ``error`` ``"backend c1 stopped:
  <psycopg's message>"``, the cluster becomes ``failed`` with ``failure``
  saying why, and every other query on it ends the same way; the gateway
  tears it down. A broken connection to a server that still answers (an
  administrator's ``pg_terminate_backend``) fails that query only.

Unlike the DuckDB pool it has no CPU budgets or pinning (``cores`` is empty,
``cpu_budget`` NaN, ``pid`` None, nothing is ever ``oversubscribed``), no
scratch catalog, and ``on_page`` runs on the query's own thread. It adds
:meth:`~PostgresClusterPool.health` (reachability, latency, replica lag) and
:func:`postgres_plan_features`.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import select
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets import _pg_values
from sloctl.datasets.pg_dialect import CURSOR_KINDS, RUNNABLE, statement_kind
from sloctl.datasets.pg_roles import RoleCheck, create_reader_role, inspect_role
from sloctl.datasets.pool import CANCELLED, ClusterInfo, QueryCompletion, QueryRequest, RawPage, drain

if TYPE_CHECKING:
    import psycopg

__all__ = ["TRINO_ERRORS", "PostgresBackend", "PostgresClusterPool", "RoleCheck", "create_reader_role",
           "postgres_plan_features", "trino_error"]

_TORN_DOWN = "cluster torn down while the query ran"
_CANCEL_TRIES, _CANCEL_EVERY_S = 100, 0.05  # a cancel request that lands before its statement starts is lost
#: TCP keepalives, so that a server that vanishes without closing its sockets is noticed in about 25 s.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
#: Every session's settings: read only by default, and the text formats the values are read in.
_SESSION = (
    "SELECT set_config('default_transaction_read_only', 'on', false), "
    "set_config('DateStyle', 'ISO, YMD', false), set_config('IntervalStyle', 'postgres', false), "
    "set_config('TimeZone', 'UTC', false)"
)
_LAG = (
    "SELECT pg_is_in_recovery(), CASE WHEN pg_is_in_recovery() "
    "THEN extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 END"
)


#: Trino's name, code and type for a server error, by SQLSTATE (exact code first, then its two-character class).
#: Only errors that are the query's own fault are here: the gateway does not retry them elsewhere. A cancel
#: (57014) is the pool's (``CANCELLED``) or the attempt's timeout; one from another session may be retried.
TRINO_ERRORS: dict[str, tuple[str, int, str]] = {
    "42601": ("SYNTAX_ERROR", 1, "USER_ERROR"),
    "42P01": ("TABLE_NOT_FOUND", 46, "USER_ERROR"),
    "3F000": ("SCHEMA_NOT_FOUND", 45, "USER_ERROR"),
    "42703": ("COLUMN_NOT_FOUND", 47, "USER_ERROR"),
    "42883": ("FUNCTION_NOT_FOUND", 6, "USER_ERROR"),
    "42704": ("NOT_FOUND", 5, "USER_ERROR"),
    "42P06": ("SCHEMA_ALREADY_EXISTS", 49, "USER_ERROR"),
    "42P07": ("TABLE_ALREADY_EXISTS", 50, "USER_ERROR"),
    "42701": ("DUPLICATE_COLUMN_NAME", 54, "USER_ERROR"),
    "42702": ("AMBIGUOUS_NAME", 62, "USER_ERROR"),
    "42725": ("AMBIGUOUS_FUNCTION_CALL", 32, "USER_ERROR"),
    "42804": ("TYPE_MISMATCH", 58, "USER_ERROR"),
    "42501": ("PERMISSION_DENIED", 4, "USER_ERROR"),
    "25006": ("PERMISSION_DENIED", 4, "USER_ERROR"),
    "22012": ("DIVISION_BY_ZERO", 8, "USER_ERROR"),
    "22003": ("NUMERIC_VALUE_OUT_OF_RANGE", 19, "USER_ERROR"),
    "22P02": ("INVALID_CAST_ARGUMENT", 9, "USER_ERROR"),
    "21000": ("SUBQUERY_MULTIPLE_ROWS", 28, "USER_ERROR"),
    "0A000": ("NOT_SUPPORTED", 13, "USER_ERROR"),
    "53200": ("EXCEEDED_LOCAL_MEMORY_LIMIT", 131079, "INSUFFICIENT_RESOURCES"),
    # classes: syntax error or access rule violation, data exception, feature not supported
    "42": ("SYNTAX_ERROR", 1, "USER_ERROR"),
    "22": ("INVALID_FUNCTION_ARGUMENT", 7, "USER_ERROR"),
    "0A": ("NOT_SUPPORTED", 13, "USER_ERROR"),
}


def trino_error(exc: BaseException) -> dict[str, Any] | None:
    """Trino's ``error`` object for a PostgreSQL server error, by its SQLSTATE (:data:`TRINO_ERRORS`), or ``None``.

    ``None`` for errors without a SQLSTATE (a broken connection) or of a
    class that is not the query's own fault (a lost connection, a conflict,
    a server shutting down): those may succeed on another backend.
    """
    code = getattr(exc, "sqlstate", None) or ""
    found = (TRINO_ERRORS.get(code) or TRINO_ERRORS.get(code[:2])) if code else None
    if found is None:
        return None
    name, number, kind = found
    diag = getattr(exc, "diag", None)
    message = (diag.message_primary if diag is not None else None) or _line(exc)
    return {"errorName": name, "errorCode": number, "errorType": kind,
            "message": f"{message} (PostgreSQL SQLSTATE {code})"}


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _positive_s(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < math.inf


def _ms(seconds: float | None) -> int:
    """``statement_timeout`` in whole milliseconds: at least 1 (0 would mean none); ``None`` -> 0 (none)."""
    return 0 if seconds is None else max(1, math.ceil(seconds * 1000))


def _line(exc: BaseException) -> str:
    """An exception's message on one line (psycopg's carry the statement and a caret below)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@dataclass(frozen=True)
class PostgresBackend:
    """One PostgreSQL server (or read replica) that a :class:`PostgresClusterPool` may attach as a cluster.

    Attributes:
        url: libpq connection URL or string (``postgresql://reader@db1:5432/tpch``), of a role that may only read.
        size: the cluster's size as routing and scaling policies see it; ``spin_up`` must ask for this one.
        pool_connections: the most connections, so queries running at once, the pool opens to it.
        connect_timeout_s: how long opening one connection may take (libpq rounds it up to whole seconds, >= 2).
        allow_privileged_role: attach even when the role holds more than it should
            (:func:`~sloctl.datasets.pg_roles.inspect_role`); the check's findings are then warnings.

    Raises:
        ClusterPoolError: a field is out of range (the message names it).
    """

    url: str = field(repr=False)
    size: int = 1
    pool_connections: int = 4
    connect_timeout_s: float = 10.0
    allow_privileged_role: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ClusterPoolError(
                "The 'url' parameter of PostgresBackend must be a libpq URL or connection string "
                f"such as 'postgresql://reader@db1:5432/tpch', got {self.url!r}."
            )
        for name in ("size", "pool_connections"):
            if not _positive_int(getattr(self, name)):
                raise ClusterPoolError(
                    f"The '{name}' parameter of PostgresBackend must be an integer >= 1, got {getattr(self, name)!r}."
                )
        if not _positive_s(self.connect_timeout_s):
            raise ClusterPoolError(
                f"The 'connect_timeout_s' parameter of PostgresBackend must be > 0 seconds, "
                f"got {self.connect_timeout_s!r}."
            )
        if not isinstance(self.allow_privileged_role, bool):
            raise ClusterPoolError(
                "The 'allow_privileged_role' parameter of PostgresBackend must be true or false, "
                f"got {self.allow_privileged_role!r}."
            )


class _Ended(Exception):
    """An attempt ended without a server error: cancelled, timed out, or its cluster went."""

    def __init__(self, status: str, error: str) -> None:
        super().__init__(error or status)
        self.status, self.error = status, error


@dataclass
class _Run:
    request: QueryRequest
    credits: int
    cancelled: bool = False
    ended: bool = False  # its completion is out
    conn: Any = None  # the connection while its statements may be running on the server
    cancel_lock: threading.Lock = field(default_factory=threading.Lock)  # a cancel never outlives ``conn``


@dataclass
class _Cluster:
    cluster_id: str
    backend: PostgresBackend
    requested_s: float
    state: str = "starting"
    ready_s: float | None = None
    failure: str = ""
    stopping: bool = False  # tear_down asked for it: what ends now is no failure
    idle: list = field(default_factory=list)  # open connections nobody uses
    busy: set = field(default_factory=set)
    opened: int = 0  # idle + busy + being opened
    runs: dict[int, _Run] = field(default_factory=dict)


@dataclass
class _Outcome:
    status: str = "ok"
    error: str = ""
    start_s: float | None = None
    end_s: float | None = None
    rows: int = 0
    columns: tuple[tuple[str, str], ...] | None = None
    data: list[list] | None = None
    trino_error: dict[str, Any] | None = None


def _stale(conn: psycopg.Connection) -> bool:
    """An idle connection the server has closed (or written to: it never should): not worth a query."""
    if conn.closed or conn.broken:
        return True
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class PostgresClusterPool:
    """:class:`~sloctl.datasets.pool.ClusterPool` over PostgreSQL servers (see the module docstring).

    Args:
        backends: the servers ``spin_up`` may attach, ``{cluster_id:
            PostgresBackend}``; a value may also be a mapping of its fields
            (``{"c1": {"url": "postgresql://...", "size": 2}}``, as in YAML).
        application_name: the ``application_name`` of the pool's sessions
            (``pg_stat_activity``); health checks add `` health``.

    Raises:
        ClusterPoolError: ``backends`` is empty or holds a bad entry (named).

    Example::

        pool = PostgresClusterPool({"c1": PostgresBackend("postgresql://reader@db1/tpch", size=4)})
        pool.wait_ready(pool.spin_up(4, cluster_id="c1"))
        pool.submit("c1", QueryRequest(1, "SELECT count(*) FROM lineitem", fetch=True))
    """

    def __init__(
        self, backends: Mapping[str, PostgresBackend | Mapping[str, Any]], *, application_name: str = "sloctl"
    ) -> None:
        self.backends = backends
        self.application_name = application_name
        self.backends_ = self._validated(backends)
        if not isinstance(application_name, str) or not application_name:
            raise ClusterPoolError(
                f"The 'application_name' parameter must be a non-empty string, got {application_name!r}."
            )
        self._completions: queue.Queue[QueryCompletion] = queue.Queue()
        self._clusters: dict[str, _Cluster] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._health: dict[str, tuple[threading.Lock, list]] = {}  # cluster id -> (lock, [connection or None])
        #: the last role check of each backend (:meth:`check_role`, and every attach)
        self.roles_: dict[str, RoleCheck] = {}

    @staticmethod
    def _validated(backends: Any) -> dict[str, PostgresBackend]:
        if not isinstance(backends, Mapping) or not backends:
            raise ClusterPoolError(
                "The 'backends' parameter must be a non-empty mapping {cluster_id: "
                f"PostgresBackend}}, got {backends!r}."
            )
        out: dict[str, PostgresBackend] = {}
        for cluster_id, backend in backends.items():
            if not isinstance(cluster_id, str) or not cluster_id:
                raise ClusterPoolError(
                    f"The 'backends' parameter's keys must be non-empty cluster ids, got {cluster_id!r}."
                )
            if isinstance(backend, Mapping):
                try:
                    backend = PostgresBackend(**backend)
                except TypeError as exc:
                    raise ClusterPoolError(
                        f"The 'backends' parameter's entry {cluster_id!r} must hold the fields "
                        f"of PostgresBackend (url, size, pool_connections, connect_timeout_s, "
                        f"allow_privileged_role): "
                        f"{exc}."
                    ) from None
            if not isinstance(backend, PostgresBackend):
                raise ClusterPoolError(
                    f"The 'backends' parameter's entry {cluster_id!r} must be a PostgresBackend "
                    f"or a mapping of its fields, got {type(backend).__name__}."
                )
            out[cluster_id] = backend
        return out

    # -- connections ---------------------------------------------------------------------------------------------
    def _connect(self, backend: PostgresBackend, on_open: Any = None) -> psycopg.Connection:
        """A session for queries: read only by default, values read as :mod:`._pg_values` needs them.

        ``on_open(conn)`` runs first, on the session as its role opens it (the role check).
        """
        import psycopg

        conn = psycopg.connect(
            backend.url,
            autocommit=True,
            connect_timeout=max(2, math.ceil(backend.connect_timeout_s)),
            application_name=self.application_name,
            **_KEEPALIVES,
        )
        try:
            if on_open is not None:
                on_open(conn)
            _pg_values.use_text_loaders(conn)
            conn.execute(_SESSION)
            conn.autocommit = False
            conn.read_only = True  # psycopg opens each transaction with BEGIN READ ONLY
        except BaseException:
            conn.close()
            raise
        return conn

    def _acquire(self, cluster: _Cluster, run: _Run | None, deadline: float | None = None) -> psycopg.Connection | None:
        """A connection of ``cluster`` for one attempt, waiting for a free one.

        Returns ``None`` when the cluster stops or fails, the run is cancelled
        or ``deadline`` passes first. Raises ``psycopg.Error`` when a new
        connection cannot be opened.
        """
        stale = []
        try:
            with self._cond:
                while True:
                    if cluster.stopping or cluster.state != "ready" or (run is not None and run.cancelled):
                        return None
                    if cluster.idle:
                        conn = cluster.idle.pop()
                        if _stale(conn):
                            stale.append(conn)
                            cluster.opened -= 1
                            continue
                        cluster.busy.add(conn)
                        return conn
                    if cluster.opened < cluster.backend.pool_connections:
                        cluster.opened += 1
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return None
                    self._cond.wait(remaining)
        finally:
            for conn in stale:
                with contextlib.suppress(Exception):
                    conn.close()
        try:
            conn = self._connect(cluster.backend)
        except BaseException:
            with self._cond:
                cluster.opened -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            if not (cluster.stopping or cluster.state != "ready" or (run is not None and run.cancelled)):
                cluster.busy.add(conn)
                return conn
            cluster.opened -= 1
            self._cond.notify_all()
        conn.close()
        return None

    def _release(self, cluster: _Cluster, conn: psycopg.Connection) -> None:
        """End the attempt's transaction and hand the connection back (or close it when it broke)."""
        import psycopg

        if not (conn.closed or conn.broken):
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
        with self._cond:
            cluster.busy.discard(conn)
            keep = not (conn.closed or conn.broken) and cluster.state == "ready" and not cluster.stopping
            if keep:
                cluster.idle.append(conn)
            else:
                cluster.opened -= 1
            self._cond.notify_all()
        if not keep:
            with contextlib.suppress(Exception):
                conn.close()

    def _probe(self, backend: PostgresBackend) -> str:
        """``""`` when the server accepts a new session and answers ``SELECT 1``, else why not."""
        import psycopg

        try:
            with psycopg.connect(
                backend.url,
                autocommit=True,
                application_name=f"{self.application_name} probe",
                connect_timeout=max(2, math.ceil(backend.connect_timeout_s)),
                **_KEEPALIVES,
            ) as conn:
                conn.execute("SELECT 1").fetchone()
        except psycopg.Error as exc:
            return _line(exc)
        return ""

    def _mark_failed(self, cluster: _Cluster, failure: str) -> None:
        """The server is gone: the cluster fails (once), its idle connections go, waiting queries end."""
        with self._cond:
            if cluster.state in ("starting", "ready") and not cluster.stopping:
                cluster.state, cluster.failure = "failed", failure
            idle = self._take_idle(cluster)
        _close_all(idle)

    def _take_idle(self, cluster: _Cluster) -> list[psycopg.Connection]:
        """The cluster's idle connections, taken out of its pool (lock held; close them after releasing it)."""
        idle, cluster.idle = cluster.idle, []
        cluster.opened -= len(idle)
        self._cond.notify_all()
        return idle

    def _lost(self, cluster: _Cluster, exc: BaseException) -> str:
        """The error of a query whose connection broke: probe the server, fail the cluster if it is gone."""
        with self._cond:
            failed = cluster.state == "failed"
        if not failed:
            why = self._probe(cluster.backend)
            if not why:
                return f"backend {cluster.cluster_id} closed the connection: {_pg_values.error_text(exc)}"
            self._mark_failed(cluster, f"{_line(exc)} (a new connection failed too: {why})")
        return f"backend {cluster.cluster_id} stopped: {_line(exc)}"

    def _connect_failed(self, cluster: _Cluster, exc: psycopg.Error) -> str:
        """The error of a query that could not open a connection; no answer at all fails the cluster."""
        if exc.sqlstate:  # the server answered (too many clients, starting up): this query's bad luck
            return f"backend {cluster.cluster_id} refused a connection: {_pg_values.error_text(exc)}"
        self._mark_failed(cluster, f"could not connect: {_line(exc)}")
        return f"backend {cluster.cluster_id} stopped: could not connect: {_line(exc)}"

    def _why_not(self, cluster: _Cluster, run: _Run) -> str:
        """Why a run got no connection (called with the cluster stopping, failed, or the run cancelled)."""
        with self._cond:
            return self._why_not_locked(cluster, run)

    # -- ClusterPool ---------------------------------------------------------------------------------------------
    def spin_up(self, size: int, *, cluster_id: str | None = None) -> str:
        """Attach the configured server ``cluster_id`` (or the first free one of ``size``); return its id at once.

        It becomes ``ready`` once a connection answers ``SELECT 1`` (see :meth:`wait_ready`).

        Raises:
            ClusterPoolError: ``cluster_id`` is not configured or already attached, ``size`` is not its
                configured size, no configured server of ``size`` is free, or the pool is closed.
        """
        if not _positive_int(size):
            raise ClusterPoolError(f"The 'size' parameter must be an integer >= 1, got {size!r}.")
        with self._cond:
            if self._closed:
                raise ClusterPoolError("The pool is closed.")
            live = {cid for cid, c in self._clusters.items() if c.state != "stopped"}
            if cluster_id is None:
                free = [cid for cid, b in self.backends_.items() if b.size == size and cid not in live]
                if not free:
                    raise ClusterPoolError(
                        f"No configured backend of size {size} is free (configured: "
                        f"{_listing(self.backends_)}; attached: {', '.join(sorted(live)) or 'none'})."
                    )
                cluster_id = free[0]
            backend = self.backends_.get(cluster_id)
            if backend is None:
                raise ClusterPoolError(
                    f"The 'cluster_id' parameter of spin_up must name a configured backend "
                    f"({_listing(self.backends_)}), got {cluster_id!r}."
                )
            if size != backend.size:
                raise ClusterPoolError(
                    f"The 'size' parameter of spin_up must be {backend.size} for backend "
                    f"{cluster_id!r} (its configured size), got {size}."
                )
            if cluster_id in live:
                raise ClusterPoolError(f"The 'cluster_id' {cluster_id!r} is already in use.")
            cluster = _Cluster(cluster_id=cluster_id, backend=backend, requested_s=time.monotonic())
            self._clusters[cluster_id] = cluster
        threading.Thread(target=self._attach, args=(cluster,), daemon=True, name=f"sloctl-pg-{cluster_id}").start()
        return cluster_id

    def _attach(self, cluster: _Cluster) -> None:
        import psycopg

        try:
            conn = self._connect(cluster.backend, lambda c: self._admit(cluster.cluster_id, cluster.backend, c))
            conn.execute("SELECT 1").fetchone()
            conn.rollback()
        except (psycopg.Error, ClusterPoolError) as exc:
            refused = isinstance(exc, ClusterPoolError)
            with self._cond:
                if not cluster.stopping:
                    cluster.state = "failed"
                    cluster.failure = str(exc) if refused else f"could not attach: {_line(exc)}"
                self._cond.notify_all()
            return
        with self._cond:
            attached = not cluster.stopping and cluster.state == "starting"
            if attached:
                cluster.idle.append(conn)
                cluster.opened += 1
                cluster.state, cluster.ready_s = "ready", time.monotonic()
            self._cond.notify_all()
        if not attached:
            conn.close()

    def _admit(self, cluster_id: str, backend: PostgresBackend, conn: psycopg.Connection) -> RoleCheck:
        """Check the role of ``conn`` (a fresh session); keep the result; raise when the backend must not run."""
        check = inspect_role(conn, cluster_id, allowed=backend.allow_privileged_role)
        with self._cond:
            self.roles_[cluster_id] = check
        if check.refused:
            raise ClusterPoolError(check.refusal())
        return check

    def check_role(self, cluster_id: str, timeout_s: float | None = None) -> RoleCheck | None:
        """Connect to the server configured as ``cluster_id`` and check its role (:mod:`~sloctl.datasets.pg_roles`).

        Attaching checks again (every ``spin_up``), so a role that gains a
        privilege later is refused at its next attach.

        Args:
            cluster_id: a configured backend.
            timeout_s: how long connecting may take (default: the backend's ``connect_timeout_s``).

        Returns:
            The check (its :meth:`~RoleCheck.notes` are the operator's warnings), or ``None`` when no
            session can be opened now (the attach checks it once the server answers).

        Raises:
            ClusterPoolError: ``cluster_id`` is not configured, or its role holds a privilege it must not and
                ``allow_privileged_role`` is off (the message names the role and what to revoke).
        """
        import psycopg

        backend = self.backends_.get(cluster_id)
        if backend is None:
            raise ClusterPoolError(
                f"The 'cluster_id' parameter of check_role must name a configured backend "
                f"({_listing(self.backends_)}), got {cluster_id!r}."
            )
        wait_s = backend.connect_timeout_s if timeout_s is None else min(timeout_s, backend.connect_timeout_s)
        try:
            conn = psycopg.connect(
                backend.url,
                autocommit=True,
                application_name=f"{self.application_name} role check",
                connect_timeout=max(2, math.ceil(wait_s)),
                **_KEEPALIVES,
            )
        except psycopg.Error:
            return None
        try:
            return self._admit(cluster_id, backend, conn)
        except psycopg.Error:
            return None
        finally:
            conn.close()

    def wait_ready(self, cluster_id: str, timeout_s: float | None = None) -> ClusterInfo:
        """Block until the cluster is ready.

        Raises:
            ClusterPoolError: it failed to attach, or was not ready after ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            cluster = self._get(cluster_id)
            while cluster.state == "starting":
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ClusterPoolError(f"Cluster {cluster_id!r} was not ready after {timeout_s} s.")
                self._cond.wait(remaining)
            if cluster.state != "ready":
                raise ClusterPoolError(f"Cluster {cluster_id!r} failed to start ({cluster.failure or cluster.state}).")
            return self._info(cluster)

    def submit(self, cluster_id: str, request: QueryRequest) -> None:
        """Start ``request`` on a thread of its own; its completion comes through :meth:`completions`.

        A ``stream`` request's pages go to ``request.on_page`` (see
        :class:`~sloctl.datasets.pool.QueryRequest`); let more come with :meth:`credit`.

        Raises:
            ClusterPoolError: the request is malformed (the field is named), the cluster is unknown or not
                ready, or ``query_id`` is already running on it.
        """
        if request.stream:
            if request.fetch:
                raise ClusterPoolError(
                    "The 'fetch' and 'stream' parameters of a QueryRequest exclude each other: "
                    "a streamed result comes through 'on_page'."
                )
            for name in ("page_rows", "buffer_pages"):
                if not _positive_int(getattr(request, name)):
                    raise ClusterPoolError(
                        f"The '{name}' parameter of a QueryRequest must be an integer >= 1, "
                        f"got {getattr(request, name)!r}."
                    )
        for name in ("timeout_s", "stream_timeout_s"):
            value = getattr(request, name)
            if value is not None and not _positive_s(value):
                raise ClusterPoolError(
                    f"The '{name}' parameter of a QueryRequest must be > 0 seconds or None, got {value!r}."
                )
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state != "ready" or cluster.stopping:
                raise ClusterPoolError(f"Cluster {cluster_id!r} is {cluster.state}; queries need a ready cluster.")
            if request.query_id in cluster.runs:
                raise ClusterPoolError(
                    f"The 'query_id' {request.query_id!r} is already running on cluster {cluster_id!r}."
                )
            run = _Run(request, credits=request.buffer_pages)
            cluster.runs[request.query_id] = run
        threading.Thread(
            target=self._run, args=(cluster, run), daemon=True, name=f"sloctl-pg-{cluster_id}-q{request.query_id}"
        ).start()

    def credit(self, cluster_id: str, query_id: int, pages: int = 1) -> None:
        """Let streamed query ``query_id`` send ``pages`` more pages (call it once per page consumed).

        A query that already ended (or does not stream) is left alone: its completion says how it ended.
        """
        if not _positive_int(pages):
            raise ClusterPoolError(f"The 'pages' parameter of credit must be an integer >= 1, got {pages!r}.")
        with self._cond:
            run = self._get(cluster_id).runs.get(query_id)
            if run is not None and run.request.stream:
                run.credits += pages
                self._cond.notify_all()

    def cancel(self, cluster_id: str, query_id: int) -> None:
        """Interrupt ``query_id`` on ``cluster_id``; it completes as ``error`` (``pool.CANCELLED``).

        A query that already finished (or never ran there) is left alone.
        """
        with self._cond:
            cluster = self._get(cluster_id)
            run = cluster.runs.get(query_id)
            if run is None or run.cancelled or cluster.state != "ready":
                return
            run.cancelled = True
            self._cond.notify_all()
        self._interrupt(run)

    def _interrupt(self, run: _Run) -> None:
        """Send the server cancel requests for ``run`` until it ends (on a thread: each one is a connection)."""

        def repeat() -> None:
            for _ in range(_CANCEL_TRIES):
                with self._cond:
                    if run.ended:
                        return
                with run.cancel_lock:
                    if run.conn is not None:
                        with contextlib.suppress(Exception):
                            run.conn.cancel_safe(timeout=5.0)
                time.sleep(_CANCEL_EVERY_S)

        threading.Thread(target=repeat, daemon=True, name=f"sloctl-pg-cancel-q{run.request.query_id}").start()

    def explain(self, cluster_id: str, sql: str, timeout_s: float = 5.0) -> str | None:
        """``EXPLAIN (FORMAT JSON) sql`` on ``cluster_id``, in a read-only transaction.

        Returns:
            PostgreSQL's JSON plan as text (what :func:`postgres_plan_features`
            and :func:`~sloctl.datasets.plan_features.features_from_postgres_plan`
            read), or ``None`` when the statement cannot be planned (or is not
            one query) or no plan came within ``timeout_s`` (waiting for a free
            connection included).

        Raises:
            ClusterPoolError: ``timeout_s`` is not > 0, the cluster is unknown or not ready, or its server
                died before it answered.
        """
        import psycopg

        if not _positive_s(timeout_s):
            raise ClusterPoolError(f"The 'timeout_s' parameter of explain must be > 0 seconds, got {timeout_s!r}.")
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state != "ready":
                raise ClusterPoolError(f"Cluster {cluster_id!r} is {cluster.state}; EXPLAIN needs a ready cluster.")
        if statement_kind(sql) not in CURSOR_KINDS:
            return None
        deadline = time.monotonic() + timeout_s
        try:
            conn = self._acquire(cluster, None, deadline)
        except psycopg.Error as exc:
            conn, why = None, self._connect_failed(cluster, exc)
        else:
            why = ""
        plan = None
        if conn is not None:
            try:
                cur = conn.cursor()
                with conn.pipeline():
                    cur.execute(f"SET LOCAL statement_timeout = {_ms(max(1e-3, deadline - time.monotonic()))}")
                    cur.execute("EXPLAIN (FORMAT JSON) " + sql)
                row = cur.fetchone()
                if row is not None:
                    plan = row[0] if isinstance(row[0], str) else json.dumps(row[0])
            except psycopg.Error as exc:
                if conn.closed or conn.broken:
                    why = self._lost(cluster, exc)
            finally:
                self._release(cluster, conn)
        with self._cond:
            if cluster.state != "ready" or cluster.stopping:
                raise ClusterPoolError(
                    f"Cluster {cluster_id!r} is {cluster.state} "
                    f"({cluster.failure or why or 'torn down'}); its EXPLAIN was lost."
                )
        return plan

    def health(self, cluster_id: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """Probe the server configured as ``cluster_id`` (attached or not) on a session of its own.

        ``latency_s`` is one ``SELECT 1`` round trip (the time to failure when
        it failed); on a standby (``pg_is_in_recovery()``) ``replica_lag_s`` is
        ``now() - pg_last_xact_replay_timestamp()``, which also grows while the
        primary writes nothing. The cluster's state is left as it is.

        Returns:
            ``{"ok": bool, "latency_s": float, "in_recovery": bool | None,
            "replica_lag_s": float | None, "error": str}``, and ``"role"``
            (:meth:`RoleCheck.to_doc`) once the backend's role was checked.

        Raises:
            ClusterPoolError: ``cluster_id`` is not configured, or ``timeout_s`` is not > 0.
        """
        out = self._health_check(cluster_id, timeout_s)
        with self._cond:
            check = self.roles_.get(cluster_id)
        if check is not None:
            out["role"] = check.to_doc()
        return out

    def _health_check(self, cluster_id: str, timeout_s: float) -> dict[str, Any]:
        """:meth:`health` without the role: the probe itself."""
        import psycopg

        backend = self.backends_.get(cluster_id)
        if backend is None:
            raise ClusterPoolError(
                f"The 'cluster_id' parameter of health must name a configured backend "
                f"({_listing(self.backends_)}), got {cluster_id!r}."
            )
        if not _positive_s(timeout_s):
            raise ClusterPoolError(f"The 'timeout_s' parameter of health must be > 0 seconds, got {timeout_s!r}.")
        with self._cond:
            lock, slot = self._health.setdefault(cluster_id, (threading.Lock(), [None]))
        with lock:
            started = time.monotonic()
            try:
                conn = slot[0]
                if conn is None or conn.closed or conn.broken:
                    conn = slot[0] = psycopg.connect(
                        backend.url,
                        autocommit=True,
                        application_name=f"{self.application_name} health",
                        connect_timeout=max(2, math.ceil(min(timeout_s, backend.connect_timeout_s))),
                        **_KEEPALIVES,
                    )
                conn.execute(f"SET statement_timeout = {_ms(timeout_s)}")
                started = time.monotonic()
                conn.execute("SELECT 1").fetchone()
                latency_s = time.monotonic() - started
                in_recovery, lag = conn.execute(_LAG).fetchone()
            except psycopg.Error as exc:
                if slot[0] is not None:
                    with contextlib.suppress(Exception):
                        slot[0].close()
                slot[0] = None
                return {
                    "ok": False,
                    "latency_s": time.monotonic() - started,
                    "in_recovery": None,
                    "replica_lag_s": None,
                    "error": _line(exc),
                }
        return {
            "ok": True,
            "latency_s": latency_s,
            "in_recovery": bool(in_recovery),
            "replica_lag_s": None if lag is None else max(0.0, float(lag)),
            "error": "",
        }

    def completions(self, timeout_s: float | None = None) -> list[QueryCompletion]:
        """Completions since the last call, waiting up to ``timeout_s`` for the first."""
        return drain(self._completions, timeout_s)

    def tear_down(self, cluster_id: str, timeout_s: float = 15.0) -> None:
        """Detach the cluster: interrupt its queries (they end as ``error``), close its connections.

        A query still running after ``timeout_s`` ends here; its connection
        is closed when its thread lets go of it.
        """
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state == "stopped":
                return
            cluster.stopping = True
            runs = list(cluster.runs.values())
            idle = self._take_idle(cluster)
        _close_all(idle)
        for run in runs:
            self._interrupt(run)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while cluster.runs and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
            t = time.monotonic()
            for run in list(cluster.runs.values()):
                run.ended = True
                self._completions.put(
                    QueryCompletion(
                        query_id=run.request.query_id,
                        cluster_id=cluster_id,
                        start_s=t,
                        end_s=t,
                        status="error",
                        error=f"{_TORN_DOWN} (backend {cluster_id} stopped by tear_down)",
                    )
                )
            cluster.runs.clear()
            cluster.state = "stopped"
            self._cond.notify_all()
        self._close_health(cluster_id)

    def clusters(self) -> list[ClusterInfo]:
        """Every cluster this pool attached, in attach order."""
        with self._cond:
            return [self._info(c) for c in self._clusters.values()]

    def close(self) -> None:
        """Tear down every cluster and close every connection."""
        with self._cond:
            self._closed = True
        for cluster_id in list(self._clusters):
            self.tear_down(cluster_id)
        for cluster_id in list(self._health):
            self._close_health(cluster_id)

    def __enter__(self) -> PostgresClusterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one attempt ---------------------------------------------------------------------------------------------
    def _run(self, cluster: _Cluster, run: _Run) -> None:
        """The thread of one query: run it, then hand in its completion (whatever happened)."""
        try:
            out = self._attempt(cluster, run)
        except Exception as exc:  # a fault of the pool itself: the caller still hears how the query ended
            out = _Outcome(status="error", error=f"{type(exc).__name__}: {exc}")
        end_s = time.monotonic() if out.end_s is None else out.end_s
        start_s = end_s if out.start_s is None else out.start_s
        ok = out.status == "ok"
        done = QueryCompletion(
            query_id=run.request.query_id,
            cluster_id=cluster.cluster_id,
            start_s=start_s,
            end_s=end_s,
            status=out.status,
            error=out.error,
            rows=out.rows,
            columns=out.columns if ok else None,
            data=out.data if ok else None,
            trino_error=None if ok else out.trino_error,
        )
        with self._cond:
            if run.ended:  # tear_down gave up on it and answered already
                return
            run.ended = True
            if cluster.runs.get(run.request.query_id) is run:
                del cluster.runs[run.request.query_id]
            self._completions.put(done)
            self._cond.notify_all()

    def _attempt(self, cluster: _Cluster, run: _Run) -> _Outcome:
        import psycopg

        request = run.request
        kind = statement_kind(request.sql)
        if kind not in RUNNABLE:
            return _ended(
                _Outcome(
                    status="error",
                    error=(
                        f"PermissionException: the pool runs one {', '.join(RUNNABLE)} statement per request, "
                        f"got {kind or 'no statement'}"
                    ),
                )
            )
        try:
            conn = self._acquire(cluster, run)
        except psycopg.Error as exc:
            return _ended(_Outcome(status="error", error=self._connect_failed(cluster, exc)))
        if conn is None:
            return _ended(_Outcome(status="error", error=self._why_not(cluster, run)))
        out = _Outcome()
        try:
            with run.cancel_lock:
                run.conn = conn
            self._check_live(cluster, run)
            if request.stream and kind in CURSOR_KINDS:
                self._stream(cluster, run, conn, out)
            else:
                self._execute(cluster, run, conn, out)
        except _Ended as end:
            out.status, out.error = end.status, end.error
        except psycopg.Error as exc:
            out.status, out.error = self._ended_by(cluster, run, conn, exc)
            if out.status == "error" and out.error == _pg_values.error_text(exc):  # the server's verdict on it
                out.trino_error = trino_error(exc)
        finally:
            out.end_s = time.monotonic()
            with run.cancel_lock:
                run.conn = None
            self._release(cluster, conn)
        return out

    def _check_live(self, cluster: _Cluster, run: _Run) -> None:
        """Raise :class:`_Ended` when the run was cancelled or its cluster stopped or failed."""
        with self._cond:
            self._check_live_locked(cluster, run)

    def _check_live_locked(self, cluster: _Cluster, run: _Run) -> None:
        if run.cancelled or cluster.stopping or cluster.state != "ready":
            raise _Ended("error", self._why_not_locked(cluster, run))

    def _why_not_locked(self, cluster: _Cluster, run: _Run) -> str:
        if cluster.stopping or cluster.state == "stopped":
            return f"{_TORN_DOWN} (backend {cluster.cluster_id} stopped by tear_down)"
        if cluster.state == "failed":
            return f"backend {cluster.cluster_id} stopped: {cluster.failure}"
        return CANCELLED

    def _ended_by(self, cluster: _Cluster, run: _Run, conn: psycopg.Connection, exc: psycopg.Error) -> tuple[str, str]:
        """``(status, error)`` of an attempt the server (or the connection) ended with ``exc``."""
        import psycopg

        with self._cond:
            stopping, cancelled = cluster.stopping, run.cancelled
        if stopping:
            return "error", f"{_TORN_DOWN} (backend {cluster.cluster_id} stopped by tear_down)"
        if conn.closed or conn.broken:
            return "error", self._lost(cluster, exc)
        if isinstance(exc, psycopg.errors.QueryCanceled):
            if cancelled:
                return "error", CANCELLED
            if "statement timeout" in str(exc):
                return "timeout", ""
        return "error", _pg_values.error_text(exc)

    def _execute(self, cluster: _Cluster, run: _Run, conn: psycopg.Connection, out: _Outcome) -> None:
        """Run the statement in one round trip (BEGIN READ ONLY, the timeout, the statement); keep what was asked."""
        request = run.request
        cur = conn.cursor()
        with conn.pipeline():  # the extended protocol: one statement only
            cur.execute(f"SET LOCAL statement_timeout = {_ms(request.timeout_s)}")
            out.start_s = time.monotonic()
            cur.execute(request.sql)
        if not (request.fetch or request.stream):
            out.rows = max(cur.rowcount, 0)
            return
        rows = cur.fetchall() if cur.description is not None else []
        out.columns = _pg_values.column_types(cur.description, rows)
        encode = _pg_values.encoders([c.type_code for c in cur.description or ()])
        if request.fetch:
            out.rows, out.data = len(rows), _pg_values.json_rows(rows, encode)
            return
        # EXPLAIN or SHOW, streamed: read whole (no cursor takes them), then paged as a cursor's result
        deadline = None if request.timeout_s is None else out.start_s + request.timeout_s
        for i in range(0, len(rows), request.page_rows):
            page = rows[i : i + request.page_rows]
            self._send_page(cluster, run, out.columns, page, encode, deadline)
            if i == 0 and request.stream_timeout_s is not None and deadline is not None:
                deadline = out.start_s + max(request.stream_timeout_s, request.timeout_s or 0.0)
            out.rows += len(page)

    def _stream(self, cluster: _Cluster, run: _Run, conn: psycopg.Connection, out: _Outcome) -> None:
        """Read the result through a server-side cursor, a page per ``FETCH``, within the credit."""
        request = run.request
        cur = conn.cursor()
        cur.execute(f"SET LOCAL statement_timeout = {_ms(request.timeout_s)}")
        named = conn.cursor(name=f"sloctl_q{request.query_id}")
        out.start_s = time.monotonic()
        deadline = None if request.timeout_s is None else out.start_s + request.timeout_s
        named.execute(request.sql)  # DECLARE: plans the query; the FETCHes run it
        encode = _pg_values.encoders([c.type_code for c in named.description or ()])
        while True:
            self._check_live(cluster, run)
            if deadline is not None:  # each FETCH is a statement of its own: it gets what is left
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    raise _Ended("timeout", "")
                cur.execute(f"SET LOCAL statement_timeout = {_ms(left_s)}")
            rows = named.fetchmany(request.page_rows)
            if out.columns is None:
                out.columns = _pg_values.column_types(named.description, rows)
            if not rows:
                return
            self._send_page(cluster, run, out.columns, rows, encode, deadline)
            if out.rows == 0 and request.stream_timeout_s is not None and deadline is not None:
                # rows have left: the attempt can no longer be retried, so only the longer bound holds from here
                deadline = out.start_s + max(request.stream_timeout_s, request.timeout_s or 0.0)
            out.rows += len(rows)
            if len(rows) < request.page_rows:
                return

    def _send_page(
        self,
        cluster: _Cluster,
        run: _Run,
        columns: tuple[tuple[str, str], ...],
        rows: list,
        encode: dict,
        deadline: float | None,
    ) -> None:
        """Hand one page to ``on_page`` once the consumer's credit allows (without ``on_page``: drop it)."""
        request = run.request
        if request.on_page is None:
            return
        page = RawPage(_pg_values.page_json(rows, encode), len(rows))
        with self._cond:
            while run.credits <= 0:
                self._check_live_locked(cluster, run)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise _Ended("timeout", "")
                self._cond.wait(remaining)
            self._check_live_locked(cluster, run)
            run.credits -= 1
        try:
            request.on_page(columns, page if request.raw_pages else page.rows())
        except Exception as exc:  # the consumer cannot take the rest: stop the query, say why
            raise _Ended("error", f"on_page raised {type(exc).__name__}: {exc}") from exc

    # -- internals -----------------------------------------------------------------------------------------------
    def _get(self, cluster_id: str) -> _Cluster:
        try:
            return self._clusters[cluster_id]
        except KeyError:
            raise ClusterPoolError(
                f"Unknown cluster {cluster_id!r} (known: {', '.join(self._clusters) or 'none'})."
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
            running=len(c.runs),
            oversubscribed=False,
            failure=c.failure,
        )

    def _close_health(self, cluster_id: str) -> None:
        with self._cond:
            entry = self._health.get(cluster_id)
        if entry is None:
            return
        lock, slot = entry
        with lock:
            if slot[0] is not None:
                with contextlib.suppress(Exception):
                    slot[0].close()
                slot[0] = None


def _close_all(connections: list[psycopg.Connection]) -> None:
    """Close each connection, whatever state its server is in."""
    for conn in connections:
        with contextlib.suppress(Exception):
            conn.close()


def _ended(out: _Outcome) -> _Outcome:
    """``out`` of an attempt that never reached the server: it starts and ends now."""
    out.start_s = out.end_s = time.monotonic()
    return out


def _listing(backends: Mapping[str, PostgresBackend]) -> str:
    return ", ".join(f"{cid!r} (size {b.size})" for cid, b in backends.items())


def postgres_plan_features(plan: str | list[Any] | dict[str, Any]) -> dict[str, float]:
    """A few numbers of PostgreSQL's ``EXPLAIN (FORMAT JSON)`` plan (what :meth:`PostgresClusterPool.explain` gives).

    The analogue of what DuckDB's plan gives
    (:func:`~sloctl.datasets.plan_features.features_from_plan`), small: the
    optimizer's cost and row estimate at the root, and the plan's shape as
    :func:`~sloctl.datasets.plan_features.features_from_postgres_plan` counts
    it (that function gives the full engine-plan vector).

    Args:
        plan: the plan as text, or parsed (``[{"Plan": {...}}]``, ``{"Plan": {...}}`` or the root node).

    Returns:
        ``{"total_cost", "startup_cost", "plan_rows", "nodes", "depth", "joins", "scans", "tables"}``.

    Raises:
        ValueError: ``plan`` is not such a plan.
    """
    from sloctl.datasets.plan_features import features_from_postgres_plan

    try:
        doc = json.loads(plan) if isinstance(plan, str) else plan
        if isinstance(doc, list):
            doc = doc[0]
        root = doc.get("Plan", doc)
        total, startup, rows = (float(root[k]) for k in ("Total Cost", "Startup Cost", "Plan Rows"))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        shown = plan if len(repr(plan)) < 120 else f"{repr(plan)[:117]}..."
        raise ValueError(
            "The 'plan' parameter of postgres_plan_features must be PostgreSQL's EXPLAIN (FORMAT JSON) "
            f'output ([{{"Plan": {{"Total Cost": ..., ...}}}}]), got {shown!r}.'
        ) from exc
    shape = features_from_postgres_plan(root)
    return {
        "total_cost": total,
        "startup_cost": startup,
        "plan_rows": rows,
        "nodes": shape["f_nodes"],
        "depth": shape["f_depth"],
        "joins": shape["f_joins"],
        "scans": shape["f_scans"],
        "tables": shape["f_tables"],
    }
