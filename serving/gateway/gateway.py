"""The SLO gateway: SQL clients connect to sloctl, which admits, routes, retries and learns from every query.

:class:`Gateway` sits in front of DuckDB clusters (a
:class:`~sloctl.datasets.duckdb_pool.DuckDBClusterPool`) and serves the Trino
client protocol (:func:`sloctl.serving.gateway.app.create_gateway_app`;
``sloctl gateway``). Each query goes through:

1. **Classification.** Its class comes from the client tags
   (``X-Trino-Client-Tags``; the first tag the policy names), else from
   ``X-Trino-Source``, else the policy's default class. Its SLO from the
   session property ``slo_s`` (or the header ``X-Sloctl-Slo-S``), else its
   template's row in the SLO table, else its class's ``slo_s``. Its template
   is the router table's template whose SQL hash matches the text (the
   session property ``template`` names one explicitly); other texts are
   ``sql-<hash>``.
2. **Admission** (:meth:`Gateway.submit`). The router's predictor is asked
   what the query's latency would be on each ready cluster. When none is
   predicted to meet the SLO (within the router's margin), a class with
   ``defer`` waits in its bounded queue (released by priority and share
   when a completion or a new cluster makes a cluster meet it; shed with
   ``EXCEEDED_TIME_LIMIT`` after ``max_defer_s``, or at once with
   ``QUERY_QUEUE_FULL`` when its queue is full); a class without ``defer`` is
   placed anyway, and as every placement it is an arrival the autoscaler's
   spin-up trigger judges.
3. **Placement.** The one control step of :class:`~sloctl.control.managed.ManagedPool`
   (autoscaler at the arrival, route, billing, completion), with the router
   :func:`~sloctl.registry.routers.build_router` builds for the model in
   force (or a baseline: ``random``, ``least-queued``).
4. **Retries.** An attempt that times out or fails for a reason other than
   the query itself (a cluster stopped under it, an engine fault) is
   retried on another ready cluster, up to its class's ``k``; the SLO clock
   runs from the client's submission through every attempt, and each
   attempt is a row of the query log.
5. **Learning.** Every attempt is appended to a query log in the schema of
   :mod:`sloctl.datasets.querylog` (``log_dir``: one Parquet file per
   gateway run, rewritten atomically): exact arrival, start and end on the
   cluster (so concurrency is exact), ``timeout`` rows censored at the
   timeout. ``sloctl train iconq --log LOG_DIR`` trains on it; with
   ``model_uri`` the gateway follows the registry alias and hot-swaps the
   model (:meth:`Gateway.refresh`, every ``watch_interval_s``).

All times are seconds on the gateway's clock: ``time.monotonic()`` minus its
start.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import queue
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloctl.control.attempts import AttemptOutcome, after_attempt
from sloctl.control.managed import ManagedPool, ScalingAction
from sloctl.control.placement import GatewayRouter, LeastQueuedRouter, RandomRouter
from sloctl.control.policies import AdmissionPolicy, RetryPolicy
from sloctl.control.router import Query
from sloctl.control.slo_gate import SloGate, predicted_to_meet
from sloctl.core.config import RouterSection
from sloctl.core.errors import ClusterPoolError
from sloctl.core.kinds import RouterKind
from sloctl.datasets.plan_features import sql_hash
from sloctl.datasets.pool import CANCELLED, QueryCompletion, QueryRequest, RawPage
from sloctl.serving.controller import LATENCY, Controller, ModelSlot, PoolBackend
from sloctl.serving.gateway.auth import check_backend_url
from sloctl.serving.gateway.backends import BackendSpec, build_pool, engine_pool, postgres_text
from sloctl.serving.gateway.dialect import Catalog, Plan, Session
from sloctl.serving.gateway.log import AttemptLog
from sloctl.serving.gateway.planner import DEFAULT_PLAN_TIMEOUT_S, Planner
from sloctl.serving.gateway.policy import GatewayPolicy
from sloctl.serving.gateway.sql import (
    DEFAULT_MAX_QUERY_LENGTH,
    SESSION_PROPERTIES,
    SLO_RANGE_S,
    trino_names,
    validate_session_value,
)
from sloctl.serving.gateway.trino import TrinoError, error

__all__ = ["ROUTERS", "Gateway", "GatewayOptions", "GatewayQuery"]

#: Placement policies the gateway can run: sloctl's router and the two Trino Gateway baselines.
ROUTERS = ("sloctl", "least-queued", "random")

#: DuckDB errors that come from the query itself (retrying elsewhere cannot help), as Trino names them, by the
#: exception class the worker names ("<class>: message"): the class's Trino name, then, where DuckDB's class is
#: coarser than Trino's names (its exceptions carry no subtype), refinements by the message's first line: the
#: first whose (start, phrase) it has gives the name. Plain string tests: a message can quote the client's text.
_USER_ERRORS: dict[str, tuple[str, tuple[tuple[str, str, str], ...]]] = {
    "ParserException": ("SYNTAX_ERROR", ()), "SyntaxException": ("SYNTAX_ERROR", ()),
    "BinderException": ("SYNTAX_ERROR", (
        ("Binder Error: Referenced column ", " not found", "COLUMN_NOT_FOUND"),
        ("Binder Error: No function matches", "", "FUNCTION_NOT_FOUND"))),
    "CatalogException": ("NOT_FOUND", (
        ("Catalog Error: Table with name ", " already exists", "TABLE_ALREADY_EXISTS"),
        ("Catalog Error: View with name ", " already exists", "TABLE_ALREADY_EXISTS"),
        ("Catalog Error: Schema with name ", " already exists", "SCHEMA_ALREADY_EXISTS"),
        ("Catalog Error: ", " already exists", "ALREADY_EXISTS"),
        ("Catalog Error: Table with name ", " because schema ", "SCHEMA_NOT_FOUND"),
        ("Catalog Error: Schema with name ", " does not exist", "SCHEMA_NOT_FOUND"),
        ("Catalog Error: Table with name ", " does not exist", "TABLE_NOT_FOUND"),
        ("Catalog Error: View with name ", " does not exist", "TABLE_NOT_FOUND"),
        ("Catalog Error: ", "Function with name ", "FUNCTION_NOT_FOUND"),
        ("Catalog Error: Type with name ", " does not exist", "TYPE_NOT_FOUND"))),
    "ConversionException": ("INVALID_CAST_ARGUMENT", ()),
    "InvalidInputException": ("INVALID_FUNCTION_ARGUMENT", (
        ("Invalid Input Error: Cannot change configuration option", "", "PERMISSION_DENIED"),  # the sandbox's lock
        ("", "Division by zero", "DIVISION_BY_ZERO"))),  # the translation's guard (serving/gateway/dialect.py)
    "NotImplementedException": ("NOT_SUPPORTED", ()),
    "OutOfRangeException": ("NUMERIC_VALUE_OUT_OF_RANGE", ()),
    "InvalidTypeException": ("TYPE_MISMATCH", ()), "TypeMismatchException": ("TYPE_MISMATCH", ()),
    "DependencyException": ("SCHEMA_NOT_EMPTY", ()), "ConstraintException": ("CONSTRAINT_VIOLATION", ()),
    # the worker's sandbox refused it (file access, COPY, ATTACH, INSTALL, a locked setting)
    "PermissionException": ("PERMISSION_DENIED", ()),
    # the worker's memory_limit: the query's failure, never the cluster's, and never retried
    "OutOfMemoryException": ("EXCEEDED_LOCAL_MEMORY_LIMIT", ()),
}

#: The cluster id of the ``memory`` catalog's scratch worker (never routed to, never autoscaled).
SCRATCH = "scratch"

#: Upper bounds (seconds) of the attempt-latency histogram's buckets (Prometheus' ``le``).
ATTEMPT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Histogram:
    """Counts of observations at or below each bound, per label (Prometheus' cumulative histogram)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts: dict[str, list[int]] = {}
        self.sums: dict[str, float] = {}

    def observe(self, value: float, label: str) -> None:
        counts = self.counts.setdefault(label, [0] * (len(self.bounds) + 1))
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                counts[i] += 1
        counts[-1] += 1  # +Inf
        self.sums[label] = self.sums.get(label, 0.0) + value

    def doc(self) -> dict[str, Any]:
        return {"bounds_s": list(self.bounds), "counts": {k: list(v) for k, v in self.counts.items()},
                "sums_s": dict(self.sums)}


def _rows_json(rows: list[list[Any]]) -> str:
    """Rows the gateway makes itself (local answers, a result sent whole) as the JSON text of a page."""
    return json.dumps(rows, allow_nan=False, default=str)


def _query_error(message: str) -> TrinoError | None:
    """The Trino error of an attempt that failed through its own fault, or ``None`` (retry may help).

    ``message`` is the worker's ``"<DuckDB exception class>: <text>"``; the
    class picks the entry of :data:`_USER_ERRORS`, its first refinement that
    matches the text (if any) the name.
    """
    entry = _USER_ERRORS.get(message.split(":", 1)[0])
    if entry is None:
        return None
    name, refinements = entry
    # DuckDB's "Did you mean ...?" may name a table of another user of the memory catalog (dialect.scratch_table)
    message = "\n".join(line for line in message.split("\n") if not line.startswith('Did you mean "u'))
    first = message.split(":", 1)[-1].strip().split("\n", 1)[0]
    name = next((refined for start, phrase, refined in refinements if first.startswith(start) and phrase in first),
                name)
    if name == "PERMISSION_DENIED":
        message = f"Access Denied: {message}"
    elif name == "EXCEEDED_LOCAL_MEMORY_LIMIT":
        message = f"Query exceeded the cluster worker's memory limit: {message}"
    return error(name, message)


@dataclass(frozen=True)
class GatewayOptions:
    """How the gateway runs.

    Attributes:
        cluster_sizes: the DuckDB clusters to start (``c0``, ``c1``, ...).
        router: ``sloctl`` (the model's router), ``least-queued`` or ``random``.
        admission: defer and shed by predicted SLO misses (needs a latency model).
        retries: retry failed and timed-out attempts on another cluster.
        router_cfg: the ``router:`` settings (margin, cost tolerance, billing).
        policy: the classes (:class:`~sloctl.serving.gateway.policy.GatewayPolicy`).
        slo_table: SLO per template, seconds.
        log_dir: folder of the query log (``None``: none written).
        tracking_uri: MLflow store of the aliases below (``None``: no registry).
        model_uri, fallback_uri: Iconq+ and Stage aliases, hot-swapped.
        admission_uri, retry_uri: admission-policy and retry-policy aliases.
        watch_interval_s: how often the aliases are polled (``None``: only on :meth:`Gateway.refresh`).
        pool_options: CPU-budget options of the DuckDB pool (``WarehouseConfig.pool_options()``).
        autoscaler: the AutoSLO autoscaler's knobs (an
            :class:`~sloctl.control.autoscaler.AutoscalerConfig`, mode ``add``),
            run at every placement over the model's router; its spin-ups start
            real clusters. ``None``: the pool stays as started.
        page_rows: rows per result page.
        max_wait_s: how long a client's poll waits for news.
        result_ttl_s: a finished query's result is dropped this long after it ended.
        seed: the random router's seed.
        max_query_length: longest query text, in characters (Trino's
            ``query.max-length``); longer texts are refused before parsing.
        buffer_pages: result pages a query may hold at the gateway before its
            worker waits for the client to read them (results stream: memory
            does not grow with the result).
        worker_memory_limit: each cluster worker's DuckDB ``memory_limit``
            (``"2GB"``, as ``sloctl gateway``'s default); a query that needs
            more fails with ``EXCEEDED_LOCAL_MEMORY_LIMIT``, and the worker
            runs under an operating-system bound a margin above it
            (:mod:`sloctl.datasets.memory_bound`). ``None``: DuckDB's default
            (80% of RAM) and no operating-system bound: only for a caller
            that bounds the workers itself.
        worker_temp_limit: each worker's spill limit (``max_temp_directory_size``).
        restart_workers: replace a cluster whose worker died.
        explain_timeout_s: how long the query log's ``EXPLAIN`` (on a worker) may take.
        drain_grace_s: on shutdown, how long running queries may take to finish
            before they are cancelled.
        catalog: the Trino catalog name of the warehouse (``None``: the
            database file's stem, non-word characters as ``_``).
        backends: the clusters as backends of any kind
            (:class:`~sloctl.serving.gateway.backends.BackendSpec`: ``duckdb``
            workers, ``trino`` coordinators, ``postgresql`` servers, each in a
            routing group); when given, ``cluster_sizes`` is not used. Empty:
            DuckDB workers ``c0``, ``c1``, ... of ``cluster_sizes``.
        allowed_urls: the addresses a backend added through the admin API may
            have (matched by scheme, host and port; ``allowed_urls:`` of the
            backends file). ``None``: the URLs of ``backends`` (with none, only
            ``duckdb`` backends may be added).
        history_url: the query history's database (an SQLAlchemy URL:
            ``sqlite:///PATH`` or ``postgresql://...``; :mod:`~sloctl.serving.gateway.history`).
            ``None``: ``<log_dir>/history.sqlite`` when there is a ``log_dir``, else no history.
        history_retention_hours: how long the history keeps a query.
        health_interval_s: how often each ``trino`` and ``postgresql``
            backend's health check runs; one that fails leaves routing (its
            running attempts are retried elsewhere within their class's
            budget) and comes back when it answers again.
        plan_timeout_s: how long one text may take to plan (parse and
            translate, in a planner process: :mod:`~sloctl.serving.gateway.planner`);
            past it the query fails with ``EXCEEDED_TIME_LIMIT`` and the planner is replaced.
        plan_processes: planner processes (texts planned at once).
        buffer_bytes: result bytes (encoded pages) a query may hold at the
            gateway; a DuckDB worker cuts its pages at ``buffer_bytes /
            buffer_pages`` bytes, and a single row larger than that fails the
            query with ``EXCEEDED_LOCAL_MEMORY_LIMIT``.
        user_buffer_bytes: result bytes all of one user's queries may hold at
            the gateway; past it that user's workers wait for the user to read.
        scratch_memory_limit: the ``memory`` catalog: one scratch worker per
            gateway whose in-memory database clients may write (``CREATE
            TABLE memory.default.t AS ...``), bounded by this DuckDB size,
            cleared at restart; the warehouse stays read-only. ``None``: no
            memory catalog.
    """

    cluster_sizes: tuple[int, ...] = (1, 1)
    router: str = "sloctl"
    admission: bool = True
    retries: bool = True
    router_cfg: RouterSection = field(default_factory=RouterSection)
    policy: GatewayPolicy = field(default_factory=GatewayPolicy)
    slo_table: Mapping[str, float] = field(default_factory=dict)
    log_dir: str | Path | None = None
    tracking_uri: str | None = None
    model_uri: str | None = None
    fallback_uri: str | None = None
    admission_uri: str | None = None
    retry_uri: str | None = None
    watch_interval_s: float | None = None
    pool_options: Mapping[str, Any] | None = None
    autoscaler: Any = None  # AutoscalerConfig: the AutoSLO autoscaler's knobs (None: a fixed pool)
    page_rows: int = 1000
    max_wait_s: float = 1.0
    result_ttl_s: float = 300.0
    seed: int = 0
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH
    buffer_pages: int = 4
    worker_memory_limit: str | None = "2GB"
    worker_temp_limit: str | None = None
    restart_workers: bool = True
    explain_timeout_s: float = 5.0
    drain_grace_s: float = 30.0
    catalog: str | None = None
    scratch_memory_limit: str | None = "256MB"
    plan_timeout_s: float = DEFAULT_PLAN_TIMEOUT_S
    plan_processes: int = 2
    buffer_bytes: int = 16 << 20
    user_buffer_bytes: int = 64 << 20
    backends: tuple[BackendSpec, ...] = ()
    allowed_urls: tuple[str, ...] | None = None
    health_interval_s: float = 2.0
    history_url: str | None = None
    history_retention_hours: float = 24.0

    def validate(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"The 'router' option of the gateway must be one of {', '.join(ROUTERS)}, "
                             f"got {self.router!r}.")
        if not self.cluster_sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                         for s in self.cluster_sizes):
            raise ValueError(f"The 'cluster_sizes' option of the gateway must list integers >= 1, "
                             f"got {list(self.cluster_sizes)!r}.")
        if self.scratch_memory_limit is not None and not re.fullmatch(
                r"\s*\d+(\.\d+)?\s*(b|kb|kib|mb|mib|gb|gib|tb|tib)\s*", self.scratch_memory_limit, re.IGNORECASE):
            raise ValueError(f"The 'scratch_memory_limit' option of the gateway must be a DuckDB size such as "
                             f"'256MB' (or None: no memory catalog), got {self.scratch_memory_limit!r}.")
        if self.catalog is not None and not re.fullmatch(r"[a-z_][a-z0-9_]*", self.catalog):
            raise ValueError(f"The 'catalog' option of the gateway must be a lower-case Trino identifier "
                             f"([a-z_][a-z0-9_]*), got {self.catalog!r}.")
        for name in ("page_rows", "max_query_length", "buffer_pages", "plan_processes", "buffer_bytes",
                     "user_buffer_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"The '{name}' option of the gateway must be >= 1, got {getattr(self, name)!r}.")
        seen: set[str] = set()
        for i, spec in enumerate(self.backends):
            spec.validate(f"backends[{i}]")
            if spec.name in seen:
                raise ValueError(f"The 'backends[{i}].name' option of the gateway must be unique, got {spec.name!r} "
                                 f"twice.")
            seen.add(spec.name)
        if self.buffer_bytes < 1024 * self.buffer_pages:
            raise ValueError(f"The 'buffer_bytes' option of the gateway must allow at least 1 KB a page "
                             f"({1024 * self.buffer_pages} for buffer_pages {self.buffer_pages}), "
                             f"got {self.buffer_bytes!r}.")
        for name in ("max_wait_s", "result_ttl_s", "explain_timeout_s", "drain_grace_s", "health_interval_s",
                     "history_retention_hours", "plan_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"The '{name}' option of the gateway must be > 0, got {getattr(self, name)!r}.")
        bad = {t: s for t, s in self.slo_table.items() if not (isinstance(s, int | float) and s > 0)}
        if bad:
            template, slo = next(iter(bad.items()))
            raise ValueError(f"The 'slo_table' option of the gateway must map templates to SLOs > 0 s, "
                             f"got {slo!r} for {template!r}.")


@dataclass(eq=False)
class GatewayQuery:
    """One client query and everything that happened to it.

    ``outcome`` is ``admitted`` (placed at once), ``deferred`` (placed after
    waiting in its class's queue) or ``shed``; ``None`` while it waits.
    ``state`` is the Trino state: ``QUEUED``, ``RUNNING``, ``FINISHED`` or
    ``FAILED``.
    """

    query_id: str
    sql: str
    template: str
    sql_hash: str
    klass: str
    slo_s: float
    submitted_s: float
    user: str = ""
    state: str = "QUEUED"
    outcome: str | None = None
    forced: bool = False  # placed although no cluster was predicted to meet its SLO
    deferred_s: float = 0.0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    columns: list[tuple[str, str]] | None = None
    names: tuple[str | None, ...] | None = None  # the Trino output names (dialect.Plan.names)
    text: str = ""  # the client's text, as sent (``sql`` is what the clusters run)
    error: TrinoError | None = None
    end_s: float | None = None
    cancelled: bool = False
    polled_s: float = 0.0  # when its client last asked about it (gateway clock)
    rows: int = 0  # rows received so far
    pages: dict[int, RawPage] = field(default_factory=dict)  # received, not yet read past: index -> JSON rows
    pages_received: int = 0
    streaming_attempt: int | None = None  # the attempt whose pages the client gets (no retry once one arrived)
    headers: tuple[tuple[str, str], ...] = ()  # Trino session changes the answer carries (X-Trino-Set-Session, ...)
    forward: Mapping[str, str] | None = None  # the client's X-Trino-* headers, for a trino backend
    group: str | None = None  # the routing group its attempts run in (None: any backend)
    trino_types: bool = False  # its columns' types are Trino's own (a trino backend answered), not DuckDB's
    pg_sql: str | None = None  # its text for a postgresql backend (translated once, off the event loop)
    pg_error: str | None = None  # why no postgresql backend can run it (the translation refused it)
    held_bytes: int = 0  # bytes of the result pages it holds at the gateway
    owed_credits: int = 0  # pages its worker may send once its user's buffer has room again
    user_slot: bool = False  # it holds one of its user's running slots (policy user_max_running)
    scratch: bool = False  # it runs on the memory catalog's worker
    page_error: TrinoError | None = None  # a page broke the gateway's byte bound: the query fails with this
    slug: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    done: threading.Event = field(default_factory=threading.Event)
    changed: threading.Event = field(default_factory=threading.Event)
    page_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def data(self) -> list[list[Any]]:
        """The rows still held at the gateway (pages the client has not read past), in order."""
        with self.page_lock:
            return [row for index in sorted(self.pages) for row in self.pages[index].rows()]

    @property
    def latency_s(self) -> float | None:
        """From the client's submission to the end of its last attempt (``None`` until it ends)."""
        return None if self.end_s is None else self.end_s - self.submitted_s

    @property
    def violated(self) -> bool | None:
        """Finished past its SLO, or failed (shed queries count: they never met it); ``None`` while running."""
        if not self.done.is_set():
            return None
        if self.state != "FINISHED":
            return True
        return bool(math.isfinite(self.slo_s) and self.latency_s > self.slo_s)

    def summary(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "class": self.klass, "template": self.template, "slo_s": self.slo_s,
                "state": self.state, "outcome": self.outcome, "forced": self.forced,
                "deferred_s": self.deferred_s, "latency_s": self.latency_s, "violated": self.violated,
                "attempts": [dict(a) for a in self.attempts],
                "error": None if self.error is None else self.error.name}


class Gateway:
    """The gateway's state and its dispatcher (see the module docstring).

    Args:
        db_path: the DuckDB database every cluster opens read-only.
        options: :class:`GatewayOptions`.
        predictor: a latency model to route with when no registry alias is
            followed (tests, experiments); ``model_uri`` replaces it once loaded.
        templates: the template table (plan features); ``None``: the model bundle's.
        autoscaler: an autoscaler object run at every placement (anything
            with ``on_arrival``, ``on_completion`` and ``force``, as
            :class:`~sloctl.control.managed.ManagedPool` takes); overrides
            ``options.autoscaler``.
    """

    def __init__(self, db_path: str | Path, options: GatewayOptions | None = None, *, predictor: Any = None,
                 templates: Any = None, autoscaler: Any = None) -> None:
        self.db_path = Path(db_path)
        self.options = options or GatewayOptions()
        self.predictor = predictor
        self.templates = templates
        self.autoscaler = autoscaler
        self.started = False

    # -- life cycle ------------------------------------------------------------------
    def start(self) -> Gateway:
        """Start the clusters, wait until they are ready, load the models, start the dispatcher."""
        opts = self.options
        opts.validate()
        if not self.db_path.is_file():
            raise ValueError(f"The gateway's database {self.db_path} does not exist.")
        self.lock = threading.RLock()
        self.policy_base = opts.policy
        self.policy = opts.policy
        self.queries: dict[str, GatewayQuery] = {}
        self.attempts: dict[int, tuple[GatewayQuery, str]] = {}  # attempt id -> (query, cluster)
        # the SLO gate (control/slo_gate.py): defer or shed from a predicted miss; the policy in force decides
        self.gate = SloGate(opts.policy.classes, lambda name: self.policy.klass(name))
        self.counts = {"submitted": 0, "admitted": 0, "deferred": 0, "shed": 0, "forced": 0, "retries": 0,
                       "cancelled": 0, "finished": 0, "failed": 0, "refused": 0, "abandoned": 0,
                       "run_time_exceeded": 0, "memory_exceeded": 0}
        self.counts["user_queue_full"] = 0
        self.user_running: dict[str, int] = {}  # user -> queries holding one of its running slots
        self.user_waiting: dict[str, deque[GatewayQuery]] = {}  # user -> queries waiting for a slot
        self.user_bytes: dict[str, int] = {}  # user -> result bytes held at the gateway
        self.user_owing: dict[str, set[GatewayQuery]] = {}  # user -> queries whose credits wait for room
        self._starting_waiting = False
        self._bytes_lock = threading.Lock()
        self._attempt_ids = itertools.count(1)
        self._query_ids = itertools.count(1)
        self.outcomes: dict[tuple[str, str, str], int] = {}  # (class, state, outcome or error name) -> queries
        self.attempt_latency = Histogram(ATTEMPT_BUCKETS_S)  # seconds, every attempt that ended
        self._stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime())
        self.log = AttemptLog(self.db_path, opts.log_dir, self._stamp, explain=self._explain)
        self.history = None
        if opts.history_url is not None or opts.log_dir is not None:
            from sloctl.serving.gateway.history import QueryHistory

            self.history = QueryHistory(opts.history_url, retention_hours=opts.history_retention_hours,
                                        path_default=None if opts.log_dir is None
                                        else Path(opts.log_dir) / "history.sqlite")
        self._history_queue: queue.Queue = queue.Queue(maxsize=100_000)
        self._history_lock = threading.Lock()  # one writer at a time: a query's rows are written in order
        self._removing: set[str] = set()  # draining backends to forget once drained
        self._stop = threading.Event()
        self.dispatch_errors: deque[str] = deque(maxlen=20)
        self._looked_s = -math.inf  # when deferred queries were last asked about
        self._abandon_looked_s = -math.inf  # when queries were last checked for a client that stopped polling
        pool_options = dict(opts.pool_options or {})
        if opts.worker_memory_limit is not None:
            pool_options["memory_limit"] = opts.worker_memory_limit
        if opts.worker_temp_limit is not None:
            pool_options["temp_dir_limit"] = opts.worker_temp_limit
        self.draining = False
        self.restarts: list[dict[str, Any]] = []
        self.catalog = Catalog(opts.catalog or re.sub(r"\W", "_", self.db_path.name.split(".duckdb")[0]).lower(),
                               scratch=opts.scratch_memory_limit is not None)
        self.scratch_attempts: dict[int, GatewayQuery] = {}  # attempts on the memory catalog's worker
        self.planner = Planner(self.catalog, processes=opts.plan_processes, timeout_s=opts.plan_timeout_s).start()
        specs = opts.backends or tuple(BackendSpec(f"c{i}", "duckdb", size)
                                       for i, size in enumerate(opts.cluster_sizes))
        #: every backend by name: what it is (BackendSpec) and where it stands (active, unhealthy, draining, drained)
        self.backends: dict[str, BackendSpec] = {spec.name: spec for spec in specs}
        self.backend_state: dict[str, str] = {spec.name: "active" for spec in specs}
        self.backend_health: dict[str, dict[str, Any]] = {}
        self.health_rounds = 0  # health-check rounds run so far (an event says in which one a backend left)
        self.pool = build_pool(self.db_path, specs, pool_options)
        try:
            ids = [spec.name for spec in specs]
            for spec in specs:
                self.pool.spin_up(spec.size, cluster_id=spec.name)
            if opts.scratch_memory_limit is not None:
                self.pool.spin_up(1, cluster_id=SCRATCH, scratch_catalog=self.catalog.name,
                                  memory_limit=opts.scratch_memory_limit)
            for cid in [*ids, *([SCRATCH] if opts.scratch_memory_limit is not None else [])]:
                self.pool.wait_ready(cid, timeout_s=120.0)
        except BaseException:
            self.pool.close()
            self.planner.close()
            raise
        self.base = time.monotonic()
        self.wall_base = time.time()  # the gateway clock's zero on the wall clock (the history's timestamps)
        self.load_based = LeastQueuedRouter(self.running_on)
        self.autoscaler_note = "off" if self.autoscaler is None and opts.autoscaler is None else "given"
        self.managed = ManagedPool(None, price_per_unit_s=opts.router_cfg.price_per_unit_s,
                                   minimum_s=opts.router_cfg.minimum_s, backend=PoolBackend(self.pool, len(ids)),
                                   clamp_late_events=True)
        for spec in specs:
            self.managed.add_cluster(spec.name, spec.size)
        self.router = GatewayRouter(None, None, self.load_based)
        self.managed.router = self.router
        self.control = Controller(self.managed, opts.router_cfg, templates=self.templates, given=self.predictor)
        if opts.tracking_uri is not None:
            for name, uri, kind in (("iconq", opts.model_uri, LATENCY), ("stage", opts.fallback_uri, LATENCY),
                                    ("admission", opts.admission_uri, AdmissionPolicy.kind),
                                    ("retry", opts.retry_uri, RetryPolicy.kind)):
                if uri:
                    self.control.add_slot(name, uri, opts.tracking_uri, kind)
        self._template_of("", None)  # load the TPC-H names once, not on a client's first query
        self.swaps = 0
        self.refresh(force=True)
        self.started = True
        self._threads = [threading.Thread(target=self._dispatch, daemon=True, name="sloctl-gateway-dispatch")]
        if self.log.path is not None:
            import pandas  # noqa: F401  (the first flush must not pay the import)
            import pyarrow.parquet  # noqa: F401

            self._threads.append(threading.Thread(target=self._flusher, daemon=True, name="sloctl-gateway-log"))
        if opts.watch_interval_s is not None and self.slots:
            self._threads.append(threading.Thread(target=self._watch, daemon=True, name="sloctl-gateway-watch"))
        self._threads.append(threading.Thread(target=self._health, daemon=True, name="sloctl-gateway-health"))
        if self.history is not None:
            self._threads.append(threading.Thread(target=self._history_writer, daemon=True,
                                                  name="sloctl-gateway-history"))
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        """Stop the dispatcher, fail what still runs, write the log, stop the clusters."""
        if not self.started:
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        with self.lock:
            now = self.now_s()
            for _, q in self.gate.drain():
                self._finish(q, now, error("NO_NODES_AVAILABLE", "The sloctl gateway shut down while the query "
                                           "waited."), "shed")
            waiting = [q for queue_ in self.user_waiting.values() for q in queue_]
            self.user_waiting.clear()
            for q in waiting:
                if not q.done.is_set():
                    self._finish(q, now, error("NO_NODES_AVAILABLE", "The sloctl gateway shut down while the "
                                               "query waited for its user's running queries."), "shed")
        self.control.close()
        with contextlib.suppress(Exception):  # plan the texts while the workers still run (failures are counted)
            self.flush_log()
        self.pool.close()
        self.planner.close()
        with self.lock:
            for attempt_id, (_, cid) in list(self.attempts.items()):
                self._attempt_ended(attempt_id, QueryCompletion(attempt_id, cid, time.monotonic(), time.monotonic(),
                                                                "error", "gateway shut down"), retry=False)
        # the rows of attempts cut by the shutdown too; never raises (a failure is printed and counted)
        self.log.flush(self._table(), router=self.router_kind(), final=True)
        if self.history is not None:
            self._write_history()  # what the writer had not written yet, then close the store
            self.history.close()
        self.started = False

    def drain(self, grace_s: float | None = None) -> dict[str, int]:
        """Stop taking queries; let running and waiting ones finish within ``grace_s``, then cancel the rest.

        New statements fail with ``SERVER_SHUTTING_DOWN`` from the first
        moment; the HTTP server keeps serving result pages meanwhile (the
        caller stops it after this returns). Returns how many finished and
        how many were cancelled.
        """
        grace_s = self.options.drain_grace_s if grace_s is None else grace_s
        with self.lock:
            self.draining = True
            pending = [q for q in self.queries.values() if not q.done.is_set()]
        deadline = time.monotonic() + grace_s
        for q in pending:
            q.done.wait(max(0.0, deadline - time.monotonic()))
        cancelled = 0
        with self.lock:
            for q in pending:
                if not q.done.is_set():
                    cancelled += 1
                    self._cancel_locked(q, error("SERVER_SHUTTING_DOWN", (
                        f"The sloctl gateway shut down: the query did not finish within the drain grace of "
                        f"{grace_s:g} s.")), q.outcome or "cancelled")
        return {"finished": len(pending) - cancelled, "cancelled": cancelled}

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now_s(self) -> float:
        return time.monotonic() - self.base

    # -- models ------------------------------------------------------------------------
    def refresh(self, *, force: bool = False) -> dict[str, bool]:
        """Poll the aliases; rebuild the router on a new latency model, re-read the class policy.

        Running attempts move over to the new model (re-committed at their
        arrival), as in the runtime. Never raises for a bad version: the last
        good one stays (``slots[...].error`` says why).
        """
        swapped = self.control.poll()
        with self.lock:
            if force or swapped.get("iconq") or swapped.get("stage"):
                self._build_router()
            if force or swapped.get("admission") or swapped.get("retry"):
                policy = self.policy_base
                for name in ("admission", "retry"):
                    slot = self.slots.get(name)
                    if slot is not None and slot.value is not None:
                        source = f"{slot.uri} v{slot.version}"
                        policy = (policy.with_admission(slot.value, source) if name == "admission"
                                  else policy.with_retries(slot.value, source))
                self.policy = policy
        return swapped

    @property
    def slots(self) -> dict[str, ModelSlot]:
        """The registry aliases followed, by name (iconq, stage, admission, retry)."""
        return self.control.slots

    @property
    def built(self) -> Any:
        """The model router in force (``registry.routers.BuiltRouter``); ``None`` for random and least-queued."""
        return self.control.built

    @property
    def model_source(self) -> str | None:
        """Where the latency model came from (``iconq:models:/... vN``, ``given``); ``None``: no model."""
        return None if self.control.built is None else self.control.choice.source

    def _build_router(self) -> None:
        opts = self.options
        committed: set[int] = set()
        if opts.router == RouterKind.RANDOM:
            inner, known = RandomRouter(opts.seed), None
        elif opts.router == RouterKind.LEAST_QUEUED:
            inner, known = self.load_based, None
        else:  # running attempts move over to the new model
            self.control.given = self.predictor  # a caller may hand the gateway another model, then refresh
            built, committed = self.control.build_router(self.control.latency_model(), self.now_s())
            inner = built.router
            known = None if built.templates is None else set(built.templates["template"]).__contains__
        self.router.swap(inner, known, committed)
        self.control.warm(self.now_s())
        self._build_autoscaler(inner)
        self.swaps += 1

    def _build_autoscaler(self, inner: Any) -> None:
        """The AutoSLO autoscaler over the router in force (:meth:`Controller.build_autoscaler`).

        Its spin-up trigger and size selector read the router's predictor:
        without a latency model there is none, and :meth:`status` says so.
        """
        if self.autoscaler is not None:  # given by the caller
            self.managed.autoscaler = self.autoscaler
            if hasattr(self.autoscaler, "router") and hasattr(inner, "model"):
                self.autoscaler.router = inner
            return
        if self.options.autoscaler is None:
            return
        self.control.build_autoscaler(self.options.autoscaler, inner, without_model="off")
        self.autoscaler_note = self.control.reactive

    def router_kind(self) -> str:
        """``iconq``, ``stage``, ``round-robin`` (no model yet), ``least-queued`` or ``random``."""
        return self.built.kind if self.built is not None else RouterKind(self.options.router)

    def _watch(self) -> None:
        while not self._stop.wait(self.options.watch_interval_s):
            with contextlib.suppress(Exception):  # the watcher must not die; the slots record errors
                self.refresh()

    # -- classification ----------------------------------------------------------------
    def _template_of(self, sql: str, named: str | None) -> tuple[str, str]:
        digest = sql_hash(sql)
        if named:
            return named, digest
        table = self.built.templates if self.built is not None else self.templates
        if table is not None:
            match = table.loc[table["sql_hash"] == digest, "template"]
            if len(match):
                return str(match.iloc[0]), digest
        by_hash = getattr(self, "_known_hashes", None)
        if by_hash is None:
            from sloctl.datasets.tpc import load_templates

            try:
                by_hash = {sql_hash(t.sql): t.name for t in load_templates("tpch")}
            except Exception:  # no tpch extension: names from the router's table only
                by_hash = {}
            self._known_hashes = by_hash
        return by_hash.get(digest, f"sql-{digest[:12]}"), digest

    def classify(self, tags: list[str], source: str | None, user: str = "") -> str:
        """The first client tag naming a class ``user`` may use, else the source if it does, else the user's default.

        Which classes a user may use comes from the policy's ``users`` rules
        (every class without rules), so a stranger cannot tag itself into a
        more important class.
        """
        allowed = self.policy.allowed(user)
        for tag in tags:
            if tag in allowed:
                return tag
        if source and source in allowed:
            return source
        return allowed[0]

    # -- the entry point -------------------------------------------------------------
    def submit(self, sql: str, *, user: str = "", tags: list[str] | None = None, source: str | None = None,
               session: Mapping[str, str] | None = None, slo_s: float | None = None,
               trino: Session | None = None, forward: Mapping[str, str] | None = None,
               group: str | None = None, verdict: Plan | None = None,
               postgres: tuple[str | None, str | None] | None = None) -> GatewayQuery:
        """Translate, then admit (place, defer or shed) one client query; returns at once.

        The text is planned first (:func:`~sloctl.serving.gateway.dialect.plan`
        in the client's Trino session ``trino``, a parse that runs nothing):
        empty, comment-only, multi-statement and non-read texts come back
        already failed with a Trino error; session statements (``SET
        SESSION``, ``USE``, ``PREPARE``, ``SHOW CATALOGS``, ...) come back
        finished with their answer and the session change in
        :attr:`GatewayQuery.headers`.

        ``forward`` holds the client's ``X-Trino-*`` headers, sent on with
        the text to a ``trino`` backend; ``group`` a routing group the client
        asked for (``X-Trino-Routing-Group``), else its class's. ``verdict``:
        the text's plan when the caller already has it (:meth:`plan_text`,
        which the HTTP door calls on a worker thread); else it is planned here.
        ``postgres``: its PostgreSQL text, or why it has none
        (:meth:`postgres_text_of`, also called off the event loop); else it is
        translated when a PostgreSQL backend is first chosen.

        A session property with a bad value (``X-Trino-Session``) fails the
        query with ``INVALID_SESSION_PROPERTY``; a user with
        ``user_max_running`` queries running waits in its own queue, and one
        with ``user_max_queued`` waiting too is refused with ``QUERY_QUEUE_FULL``.

        Raises:
            ValueError: a bad ``slo_s`` argument (the ``X-Sloctl-Slo-S`` header), or
                a text longer than ``max_query_length`` (the caller answers 413).
        """
        if len(sql) > self.options.max_query_length:
            raise ValueError(f"The query text is {len(sql)} characters long; the gateway takes at most "
                             f"{self.options.max_query_length} (max_query_length).")
        session = dict(session or {})
        low, high = SLO_RANGE_S
        if slo_s is not None and not (math.isfinite(slo_s) and low <= slo_s <= high):
            raise ValueError(f"The SLO (X-Sloctl-Slo-S) must be a number of seconds from {low:g} to "
                             f"{high:g}, got {slo_s!r}.")
        bad_session = None
        for name, value in session.items():
            if name not in SESSION_PROPERTIES:
                continue  # a Trino session property a trino backend gets with the text; the gateway's own only
            try:
                session[name] = validate_session_value(name, value)
            except ValueError as exc:
                bad_session, session = str(exc), {}
                break
        if slo_s is None and "slo_s" in session:
            slo_s = float(session["slo_s"])
        if verdict is None:
            verdict = self.plan_text(sql, trino)
        with self.lock:
            now = self.now_s()
            klass = self.classify(tags or [], session.get("query_class", source), user)
            template, digest = self._template_of(verdict.template_sql or sql, session.get("template"))
            if slo_s is None:
                slo_s = self.options.slo_table.get(template, self.policy.klass(klass).slo_s)
            qid = f"{self._stamp}_{next(self._query_ids):05d}_sloctl"
            q = GatewayQuery(qid, verdict.sql or sql, template, digest, klass,
                             float("nan") if slo_s is None else float(slo_s), now, user=user, polled_s=now,
                             names=verdict.names, headers=verdict.headers, text=sql,
                             forward=dict(forward) if forward else None,
                             group=group or self.policy.klass(klass).group)
            if postgres is not None:
                q.pg_sql, q.pg_error = postgres
            self.queries[qid] = q
            self.counts["submitted"] += 1
            self._remember(q, submitted=True)
            if self.draining:
                self._finish(q, now, error("SERVER_SHUTTING_DOWN", "The sloctl gateway is shutting down: it takes "
                                           "no new queries."), "refused")
            elif bad_session is not None:
                self.counts["refused"] += 1
                self._finish(q, now, error("INVALID_SESSION_PROPERTY", bad_session), "refused")
            elif q.group is not None and q.group not in self.groups() and verdict.kind == "query":
                self.counts["refused"] += 1
                self._finish(q, now, error("NO_NODES_AVAILABLE", f"Routing group {q.group!r} has no backend "
                                           f"(groups: {', '.join(sorted(self.groups()))})."), "refused")
            elif verdict.kind == "refused":
                self.counts["refused"] += 1
                self._finish(q, now, error(verdict.error_name, verdict.message), "refused")
            elif verdict.kind == "local":
                q.columns = list(verdict.columns)
                self._add_page(q, None, list(verdict.columns), [list(r) for r in verdict.rows])
                self._finish(q, now, None, "session")
            else:
                q.scratch = verdict.target == "scratch"
                self._user_gate(q, now)
            return q

    def plan_text(self, sql: str, trino: Session | None = None) -> Plan:
        """``sql`` planned in the client's session by a planner process, within ``plan_timeout_s`` (blocking)."""
        return self.planner.plan(sql, trino)

    def postgres_text_of(self, sql: str, verdict: Plan) -> tuple[str | None, str | None] | None:
        """``(text, None)`` for a PostgreSQL backend, or ``(None, why not)``; ``None`` when no backend needs it.

        sqlglot's translation is parsing too: the door calls this on a worker
        thread, after :meth:`plan_text` has bounded the text (its token and
        nesting limits), never on the event loop or under the gateway lock.
        """
        if verdict.kind != "query" or verdict.target == "scratch" or not any(
                spec.kind == "postgresql" for spec in list(self.backends.values())):
            return None
        try:
            return postgres_text(sql), None
        except ValueError as exc:
            return None, str(exc)

    # -- per-user limits (Trino resource groups' hardConcurrencyLimit and maxQueued, per user) --------
    def _user_gate(self, q: GatewayQuery, now: float) -> None:
        """Run ``q`` if its user has a running slot free, else queue it in the user's queue, else refuse it."""
        user = q.user
        if self.user_running.get(user, 0) < self.policy.user_max_running:
            self._user_start(q, now)
            return
        waiting = self.user_waiting.setdefault(user, deque())
        if len(waiting) >= self.policy.user_max_queued:
            if not waiting:
                del self.user_waiting[user]
            self.counts["refused"] += 1
            self.counts["user_queue_full"] += 1
            self._finish(q, now, error("QUERY_QUEUE_FULL", (
                f"Too many queued queries for user {user!r}: {self.user_running.get(user, 0)} running "
                f"(user_max_running {self.policy.user_max_running}) and {len(waiting)} queued "
                f"(user_max_queued {self.policy.user_max_queued}).")), "refused")
            return
        waiting.append(q)

    def _user_start(self, q: GatewayQuery, now: float) -> None:
        q.user_slot = True
        self.user_running[q.user] = self.user_running.get(q.user, 0) + 1
        if q.scratch:
            self._run_scratch(q, now)
        else:
            self._admit(q, now)

    def _user_done(self, q: GatewayQuery) -> None:
        """``q`` ended: free its user's slot and start that user's next waiting queries (lock held)."""
        if q.user_slot:
            q.user_slot = False
            left = self.user_running.get(q.user, 1) - 1
            if left > 0:
                self.user_running[q.user] = left
            else:
                self.user_running.pop(q.user, None)
        if self._starting_waiting:  # a query started below ended at once: the loop there picks up the rest
            return
        self._starting_waiting = True
        try:
            waiting = self.user_waiting.get(q.user)
            while waiting and self.user_running.get(q.user, 0) < self.policy.user_max_running:
                nxt = waiting.popleft()
                if not nxt.done.is_set():
                    self._user_start(nxt, self.now_s())
            if waiting is not None and not waiting:
                self.user_waiting.pop(q.user, None)
        finally:
            self._starting_waiting = False

    def _run_scratch(self, q: GatewayQuery, now: float) -> None:
        """A statement on the ``memory`` catalog: straight to the scratch worker (no routing, not logged)."""
        attempt_id = next(self._attempt_ids)
        q.outcome, q.state = "scratch", "RUNNING"
        q.attempts.append({"attempt": 1, "attempt_id": attempt_id, "cluster_id": SCRATCH, "arrival_s": now,
                           "predicted_s": None, "status": "running", "fallback": None})
        self.scratch_attempts[attempt_id] = q
        timeout = self.policy.run_time_s(q.klass)
        try:
            self.pool.submit(SCRATCH, QueryRequest(
                attempt_id, q.sql, timeout_s=timeout, stream=True, page_rows=self.options.page_rows,
                buffer_pages=self.options.buffer_pages, page_bytes=self.page_bytes, raw_pages=True,
                on_page=lambda columns, rows, q=q, a=attempt_id: self._add_page(q, a, columns, rows)))
        except ClusterPoolError as exc:
            self.scratch_attempts.pop(attempt_id, None)
            self._finish(q, now, error("NO_NODES_AVAILABLE", f"The memory catalog's worker is gone: {exc}"),
                         "failed")

    def _scratch_ended(self, attempt_id: int, done: QueryCompletion) -> None:
        q = self.scratch_attempts.pop(attempt_id)
        end = done.end_s - self.base
        q.attempts[-1].update(status=done.status, error=done.error or None, start_s=done.start_s - self.base,
                              end_s=end)
        if q.done.is_set():
            return
        if q.page_error is not None:
            self._finish(q, end, q.page_error, "failed")
        elif done.status == "ok":
            if q.columns is None:
                q.columns = trino_names(q.names, [(str(n), str(t)) for n, t in done.columns or ()])
            if q.rows == 0 and [t for _, t in q.columns or []] in ([], ["BOOLEAN"]):
                q.columns = [("result", "BOOLEAN")]  # DDL (DROP, CREATE TABLE): Trino's clients get `true`
                self._add_page(q, attempt_id, q.columns, [[True]])
            self._finish(q, end, None, "scratch")
        elif done.status == "timeout":
            self._finish(q, end, error("EXCEEDED_TIME_LIMIT", f"Query exceeded the maximum run time of "
                                       f"{self.policy.run_time_s(q.klass):g} s."), "failed")
        else:
            err = _query_error(done.error) or error("GENERIC_INTERNAL_ERROR", done.error or "failed")
            if err.name == "EXCEEDED_LOCAL_MEMORY_LIMIT":
                err = error(err.name, f"The memory catalog is full (its limit is "
                                      f"{self.options.scratch_memory_limit}): {done.error}")
            self._finish(q, end, err, "failed")

    def _admit(self, q: GatewayQuery, now: float) -> None:
        verdict = self.gate.on_arrival(q, q.klass, not self.options.admission or self._meets(q, now))
        if verdict in ("admit", "force"):
            q.outcome, q.forced = "admitted", verdict == "force"
            self.counts["admitted"] += 1
            self.counts["forced"] += verdict == "force"
            self._place(q, now)
        elif verdict == "shed":
            limit = self.policy.klass(q.klass).queue_limit
            self._finish(q, now, error("QUERY_QUEUE_FULL", (
                f"Query shed by the sloctl gateway: no cluster is predicted to meet its SLO of {q.slo_s:.3g} s and "
                f"the queue of class {q.klass!r} is full ({limit} waiting).")), "shed")

    def _meets(self, q: GatewayQuery, now: float) -> bool:
        """Whether some ready cluster is predicted to finish ``q`` within what is left of its SLO.

        Without a latency model, an SLO or a known template, there is no
        prediction to act on: the query is admitted.
        """
        built = self.built
        if built is None or built.online is None or not math.isfinite(q.slo_s) or (
                self.router.known is not None and not self.router.known(q.template)):
            return True
        clusters = {c.cluster_id: c.size for c in self.managed.routable(now)}
        return predicted_to_meet(built.online, built.kind, q.template, q.slo_s - (now - q.submitted_s), clusters,
                                 now, built.slo_margin or 0.0)

    def _router_slo(self, q: GatewayQuery, now: float) -> float:
        if not math.isfinite(q.slo_s):
            return 1e6  # no SLO: routers place it by cost and added latency alone
        return max(q.slo_s - (now - q.submitted_s), 1e-3)

    def _place(self, q: GatewayQuery, now: float, exclude: frozenset[str] = frozenset()) -> None:
        """Run the control step for one attempt of ``q`` and hand it to the chosen cluster."""
        self._refresh_ready(now)
        if not self.managed.routable(now):
            self._finish(q, now, error("NO_NODES_AVAILABLE", "The sloctl gateway has no ready cluster."), "failed")
            return
        barred = self._barred(q)
        open_ids = {c.cluster_id for c in self.managed.routable(now)} - barred
        if not open_ids:
            where = f"in routing group {q.group!r}" if q.group is not None else "that takes queries"
            self._finish(q, now, error("NO_NODES_AVAILABLE", f"The sloctl gateway has no ready backend {where} "
                                       f"(unhealthy, draining or drained: {sorted(barred) or 'none'})."), "failed")
            return
        attempt_id = next(self._attempt_ids)
        query = Query(attempt_id, q.template, now, self._router_slo(q, now))
        # a retry avoids the cluster that failed unless it is the only one left; barred backends never run it
        self.router.exclude = barred | exclude if open_ids - exclude else barred
        try:
            if self.managed.autoscaler is not None:
                self.managed.scale(query, now)
            decision = self.managed.route(query, now)
        finally:
            self.router.exclude = frozenset()
        cid = decision.cluster_id
        # an attempt never runs past the query's maximum run time (Trino's query.max-run-time)
        left = self.policy.run_time_s(q.klass) - (now - q.submitted_s)
        timeout = max(1e-3, min(self.policy.timeout_s(q.klass), left))
        q.attempts.append({"attempt": len(q.attempts) + 1, "attempt_id": attempt_id, "cluster_id": cid,
                           "arrival_s": now, "predicted_s": None if not math.isfinite(decision.predicted_s)
                           else float(decision.predicted_s), "status": "running", "fallback": decision.fallback})
        self.attempts[attempt_id] = (q, cid)
        q.state = "RUNNING"
        q.changed.set()
        kind = self.kind_of(cid)
        sql, headers = q.sql, None
        if kind == "trino":  # forwarded as the client sent it, in the client's session
            sql, headers = q.text, q.forward
        elif kind == "postgresql":
            try:
                if q.pg_error is not None:
                    raise ValueError(q.pg_error)
                if q.pg_sql is None:  # a caller that did not translate it first (submit without the door)
                    q.pg_sql = postgres_text(q.text)
                sql = q.pg_sql
            except ValueError as exc:  # the query's own fault: no backend of this kind can run it
                t = time.monotonic()
                why = str(exc)
                denied = why.startswith("Access Denied: ")  # the deny list refused it: a permission, not a gap
                self._attempt_ended(attempt_id, QueryCompletion(
                    attempt_id, cid, t, t, "error", f"PermissionException: {why.removeprefix('Access Denied: ')}"
                    if denied else f"NotImplementedException: not runnable on PostgreSQL: {why}"))
                return
        try:
            self.pool.submit(cid, QueryRequest(
                attempt_id, sql, timeout_s=timeout, stream=True, page_rows=self.options.page_rows,
                buffer_pages=self.options.buffer_pages, page_bytes=self.page_bytes,
                stream_timeout_s=max(timeout, left), headers=headers, raw_pages=True,
                on_page=lambda columns, rows, q=q, a=attempt_id, k=kind: self._add_page(
                    q, a, columns, rows, trino_types=k == "trino")))
        except ClusterPoolError as exc:  # the cluster went away between the decision and the hand-over
            t = time.monotonic()
            self._attempt_ended(attempt_id, QueryCompletion(attempt_id, cid, t, t, "error", f"cluster gone: {exc}"))

    # -- result pages --------------------------------------------------------------------
    def _add_page(self, q: GatewayQuery, attempt_id: int | None, columns: Any, rows: RawPage | list[list[Any]], *,
                  trino_types: bool = False) -> None:
        """A page of ``q``'s result arrived (from the pool's reader thread: only the query's own lock is taken).

        The first page commits the query to its attempt: rows the client may
        already have read cannot be taken back, so a later failure is not retried.
        """
        page = rows if isinstance(rows, RawPage) else RawPage(_rows_json(rows), len(rows))
        size = len(page.json)
        limit = self.page_bytes
        if attempt_id is not None and size > limit:  # an engine that does not cut its pages by bytes
            q.page_error = error("EXCEEDED_LOCAL_MEMORY_LIMIT", (
                f"Query exceeded the gateway's result buffer: a page of {page.count} row(s) is {size} bytes, "
                f"more than the {limit} bytes a page may hold (buffer_bytes {self.options.buffer_bytes} / "
                f"buffer_pages {self.options.buffer_pages})."))
            raise MemoryError(q.page_error.message)  # the pool cancels the attempt; it ends with page_error
        with q.page_lock:
            if q.done.is_set() and q.error is not None:
                return  # a page in flight when the query was cancelled or failed: nobody will read it
            if q.streaming_attempt is None:
                q.streaming_attempt = attempt_id
            elif q.streaming_attempt != attempt_id:
                return  # a page of an attempt the query moved away from
            if q.columns is None and columns is not None:
                q.trino_types = trino_types
                q.columns = [(str(n), str(t)) for n, t in columns] if trino_types else trino_names(
                    q.names, [(str(n), str(t)) for n, t in columns])
            if page.count:
                q.pages[q.pages_received] = page
                q.pages_received += 1
                q.rows += page.count
                q.held_bytes += size
                held = True
            else:
                held = False
        if held:
            with self._bytes_lock:
                self.user_bytes[q.user] = self.user_bytes.get(q.user, 0) + size
        q.changed.set()

    @property
    def page_bytes(self) -> int:
        """The most bytes one result page may hold: ``buffer_bytes / buffer_pages``."""
        return self.options.buffer_bytes // self.options.buffer_pages

    def _drop_pages(self, q: GatewayQuery, below: int | None = None) -> list[int]:
        """Free ``q``'s pages (those before index ``below``; all when ``None``); returns the freed indexes."""
        with q.page_lock:
            freed = [i for i in q.pages if below is None or i < below]
            size = 0
            for i in freed:
                size += len(q.pages.pop(i).json)
            q.held_bytes -= size
        if size:
            with self._bytes_lock:
                left = self.user_bytes.get(q.user, 0) - size
                if left > 0:
                    self.user_bytes[q.user] = left
                else:
                    self.user_bytes.pop(q.user, None)
        return freed

    def _let_go(self, q: GatewayQuery) -> None:
        """Nobody will read ``q``'s result any more: free its pages and its user's running slot (lock held)."""
        self._drop_pages(q)
        self._user_done(q)

    def _credit(self, q: GatewayQuery, pages: int) -> None:
        """Let ``q``'s worker send ``pages`` more, now if its user's buffer has room, else once it has."""
        owed: list[tuple[GatewayQuery, int]] = []
        with self._bytes_lock:
            q.owed_credits += pages
            self.user_owing.setdefault(q.user, set()).add(q)
            if self.user_bytes.get(q.user, 0) < self.options.user_buffer_bytes:
                for other in self.user_owing.pop(q.user, set()):
                    owed.append((other, other.owed_credits))
                    other.owed_credits = 0
        for other, n in owed:
            attempt = other.streaming_attempt
            if n <= 0 or attempt is None or other.done.is_set():
                continue
            with self.lock:
                placed = self.attempts.get(attempt) or (
                    (other, SCRATCH) if attempt in self.scratch_attempts else None)
            if placed is not None:
                with contextlib.suppress(ClusterPoolError, AttributeError):
                    self.pool.credit(placed[1], attempt, n)

    def page(self, q: GatewayQuery, index: int) -> RawPage | None:
        """Page ``index`` of ``q``'s result (its rows as JSON text), freeing the pages before it (the client read
        past them).

        ``None`` when it has not arrived yet (or was freed). Each freed page
        lets the worker send one more: the buffer per query stays at
        ``buffer_pages``.
        """
        freed = self._drop_pages(q, index)
        with q.page_lock:
            rows = q.pages.get(index)
        if rows is not None and q.done.is_set() and index >= q.pages_received - 1:
            freed += self._drop_pages(q)  # the last page: its client has it and will not come back for it
        if freed and q.done.is_set() and q.user_slot and not q.pages:
            with self.lock:  # its last pages were read: its user's slot is free
                self._user_done(q)
        elif freed and q.streaming_attempt is not None and not q.done.is_set():
            self._credit(q, len(freed))
        return rows

    def touch(self, q: GatewayQuery) -> None:
        """Its client asked about ``q`` now (the client timeout counts from here)."""
        q.polled_s = self.now_s()

    # -- completions -------------------------------------------------------------------
    def _dispatch(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.pool.completions(timeout_s=0.05)
            except Exception:
                done = []
            try:
                self._dispatch_once(done)
            except Exception as exc:  # never let the dispatcher die: every running query would hang
                import traceback

                self.dispatch_errors.append(f"{type(exc).__name__}: {exc} | "
                                            + " ".join(traceback.format_exc().split())[-600:])

    def _dispatch_once(self, done: list[QueryCompletion]) -> None:
        """Completions, dead clusters, deferred queries, expired results: one look, under the lock."""
        with self.lock:
            for completion in sorted(done, key=lambda c: c.end_s):
                if completion.query_id in self.attempts:
                    self._attempt_ended(completion.query_id, completion)
                elif completion.query_id in self.scratch_attempts:
                    self._scratch_ended(completion.query_id, completion)
            now = self.now_s()
            ready = len(self.managed.routable(now))
            self._check_clusters(now)
            if any(state == "draining" for state in self.backend_state.values()):
                self._settle_drains()
            # deferred queries are asked again when a query ended or a cluster became ready, else every 0.1 s
            # (each look is a model inference per waiting class)
            changed = bool(done) or len(self.managed.routable(now)) != ready
            self._release(now, look=changed or now - self._looked_s >= 0.1)
            self._expire(now)
            if now - self._abandon_looked_s >= 0.5:
                self._abandon_looked_s = now
                self._abandon(now)

    def _flusher(self) -> None:
        while not self._stop.wait(1.0):
            if self.log.dirty:
                with contextlib.suppress(Exception):  # counted and printed by the log; retried at the next tick
                    self.flush_log()

    def _explain(self, sql: str) -> str | None:
        """``EXPLAIN (FORMAT JSON)`` of one statement, on a ready cluster's sandboxed worker, time-bounded.

        The worker plans one ``SELECT`` and nothing else (``None`` for any other text).

        The query log's plan features come from here: the gateway process
        never plans or runs client SQL itself. Never takes :attr:`lock`.
        """
        ready = [info.cluster_id for info in self.pool.clusters()
                 if info.state == "ready" and info.cluster_id != SCRATCH and self.kind_of(info.cluster_id) == "duckdb"]
        if ready:
            return self.pool.explain(ready[0], sql, timeout_s=self.options.explain_timeout_s)
        if self._plans_on_postgres():  # the log's text is the client's Trino text: PostgreSQL plans its translation
            backend = next(i.cluster_id for i in self.pool.clusters()
                           if i.state == "ready" and self.kind_of(i.cluster_id) == "postgresql")
            try:
                translated = postgres_text(sql)
            except ValueError:
                return None
            return self.pool.explain(backend, translated, timeout_s=self.options.explain_timeout_s)
        scratch = next((i for i in self.pool.clusters() if i.cluster_id == SCRATCH and i.state == "ready"), None)
        if scratch is None:
            raise ClusterPoolError("no ready DuckDB cluster to plan the query on")
        # engine backends only: the memory catalog's worker plans it, the warehouse's tables named by its catalog
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(sql, read="duckdb")
        for table in tree.find_all(exp.Table):
            if not table.catalog:
                table.set("catalog", exp.to_identifier(self.catalog.name))
                if not table.db:
                    table.set("db", exp.to_identifier("main"))
        return self.pool.explain(SCRATCH, tree.sql(dialect="duckdb"), timeout_s=self.options.explain_timeout_s)

    def _refresh_ready(self, now: float) -> None:
        starting = self.managed.starting()
        if starting:
            for info in self.pool.clusters():
                if info.cluster_id in starting and info.state == "ready":
                    self.managed.mark_ready(info.cluster_id, now)

    def _check_clusters(self, now: float) -> None:
        """A cluster whose worker stopped: fail its attempts (they are retried), replace it.

        The cluster leaves the pool, and with ``restart_workers`` a new one of
        its size is spun up in its place; it joins the pool (and ``/readyz``)
        once its worker is ready.
        """
        self._refresh_ready(now)
        infos = {info.cluster_id: info for info in self.pool.clusters()}
        scratch = infos.get(SCRATCH)
        if scratch is not None and scratch.state in ("stopped", "failed") and not self._stop.is_set():
            t = time.monotonic()  # the memory catalog's worker died: its tables are gone; start an empty one
            why = f"the memory catalog's worker stopped ({scratch.state})"
            for attempt_id in list(self.scratch_attempts):
                self._scratch_ended(attempt_id, QueryCompletion(attempt_id, SCRATCH, t, t, "error", why))
            with contextlib.suppress(ClusterPoolError):
                self.pool.spin_up(1, cluster_id=SCRATCH, scratch_catalog=self.catalog.name,
                                  memory_limit=self.options.scratch_memory_limit)
            self.restarts.append({"t": now, "cluster_id": SCRATCH, "replacement": SCRATCH,
                                  "why": getattr(scratch, "failure", "") or scratch.state})
        for cid, cluster in list(self.managed.clusters.items()):
            info = infos.get(cid)
            if cluster.torn_down or info is None or info.state not in ("stopped", "failed"):
                continue
            engine = self.kind_of(cid) != "duckdb"
            if engine and self.backend_state.get(cid) in ("unhealthy", "drained"):
                continue  # already out of routing; the health check brings it back
            t = time.monotonic()
            if engine:  # a server the gateway does not start: out of routing until its health check passes
                self.backend_state[cid] = "unhealthy"
                self.managed.events.append({"t": now, "event": "unhealthy", "cluster_id": cid,
                                            "why": getattr(info, "failure", "") or info.state,
                                            "round": self.health_rounds})
            for attempt_id, (_, on) in list(self.attempts.items()):
                if on == cid:
                    self._attempt_ended(attempt_id, QueryCompletion(attempt_id, cid, t, t, "error",
                                                                    f"cluster {cid} stopped while the query ran"))
            if engine:
                continue
            self.managed.apply([ScalingAction("tear_down", cluster_id=cid)], now)
            if self.options.restart_workers and not self._stop.is_set() and not self.draining:
                before = set(self.managed.clusters)
                self.managed.apply([ScalingAction("spin_up", size=cluster.size)], now)
                new = sorted(set(self.managed.clusters) - before)
                self.restarts.append({"t": now, "cluster_id": cid, "replacement": new[0] if new else None,
                                      "why": getattr(info, "failure", "") or info.state})

    def _abandon(self, now: float) -> None:
        """Cancel queries whose client stopped polling (Trino's ``query.client.timeout``) and drop their results."""
        limit = self.policy.client_timeout_s
        for q in [q for q in self.queries.values() if now - q.polled_s > limit]:
            if q.done.is_set():
                if q.pages:
                    self._let_go(q)
                continue
            self.counts["abandoned"] += 1
            self._cancel_locked(q, error("ABANDONED_QUERY", (
                f"Query was abandoned: its client did not poll for {now - q.polled_s:.0f} s "
                f"(client_timeout_s {limit:g} s).")), "abandoned")

    def _attempt_ended(self, attempt_id: int, done: QueryCompletion, *, retry: bool = True) -> None:
        q, cid = self.attempts.pop(attempt_id)
        end = done.end_s - self.base
        record = self.managed.complete(attempt_id, end)
        attempt = q.attempts[-1]
        attempt.update(status=done.status, error=done.error or None, start_s=done.start_s - self.base, end_s=end)
        self.attempt_latency.observe(end - attempt["arrival_s"], done.status)
        self._log_attempt(q, record, done)
        now = self.now_s()
        if q.done.is_set():  # cancelled, abandoned or shut down while it ran
            return
        kind = self.kind_of(cid)
        if q.page_error is not None:  # a page broke the byte bound: the query's own fault, never retried
            self.counts["memory_exceeded"] += 1
            self._finish(q, end, q.page_error, q.outcome)
            return
        if done.status == "ok":
            if q.columns is None and done.columns is not None:
                q.trino_types = kind == "trino"
                q.columns = [(str(n), str(t)) for n, t in done.columns] if q.trino_types else trino_names(
                    q.names, [(str(n), str(t)) for n, t in done.columns])
            if done.data:  # a pool that sends the result whole (not streamed)
                self._add_page(q, attempt_id, done.columns, list(done.data))
            self._finish(q, end, None, q.outcome)
            return
        err = _query_error(done.error) if done.status == "error" else None
        if done.status == "error" and done.trino_error and done.trino_error.get("errorType") == "USER_ERROR":
            e = done.trino_error  # a Trino backend's own verdict on the query: the client gets it as it was
            err = TrinoError(str(e.get("errorName", "GENERIC_USER_ERROR")), int(e.get("errorCode", 0)), "USER_ERROR",
                             str(e.get("message", done.error)))
        run_time = self.policy.run_time_s(q.klass)
        k = self.policy.klass(q.klass).retries if self.options.retries else 0
        streamed = q.streaming_attempt is not None  # rows may have reached the client: no retry
        outcome = after_attempt(done.status, query_fault=err is not None, elapsed_s=now - q.submitted_s,
                                max_run_time_s=run_time, attempts=len(q.attempts), retry_limit=k, streamed=streamed,
                                may_retry=retry and not self.draining)
        if outcome == AttemptOutcome.QUERY_FAULT:  # retrying elsewhere cannot help
            self.counts["memory_exceeded"] += err.name == "EXCEEDED_LOCAL_MEMORY_LIMIT"
        elif outcome == AttemptOutcome.RUN_TIME_EXCEEDED:
            self.counts["run_time_exceeded"] += 1
            err = error("EXCEEDED_TIME_LIMIT", (
                f"Query exceeded the maximum run time of {run_time:g} s (class {q.klass!r}, max_run_time_s); "
                f"it was cancelled on cluster {cid} and is not retried."))
        elif outcome == AttemptOutcome.RETRY:
            self.counts["retries"] += 1
            self._place(q, now, exclude=frozenset({cid}))
            return
        elif outcome == AttemptOutcome.TIMED_OUT:
            err = error("EXCEEDED_TIME_LIMIT", (
                f"Query exceeded the attempt timeout of {self.policy.timeout_s(q.klass):g} s on cluster {cid} "
                f"after {len(q.attempts)} attempt(s) (class {q.klass!r} retries at most {k} time(s))."))
        else:
            err = error("REMOTE_HOST_GONE" if "stopped" in done.error or "gone" in done.error
                        or "torn down" in done.error or "exited" in done.error else "GENERIC_INTERNAL_ERROR",
                        f"Query failed on cluster {cid} after {len(q.attempts)} attempt(s) (class {q.klass!r} "
                        f"retries at most {k} time(s)){' after its first rows were sent' if streamed else ''}: "
                        f"{done.error}")
        self._finish(q, end, err, q.outcome)

    def _finish(self, q: GatewayQuery, end_s: float, err: TrinoError | None, outcome: str | None) -> None:
        q.end_s = end_s
        q.error = err
        q.outcome = outcome
        q.state = "FINISHED" if err is None else "FAILED"
        if outcome == "shed":
            self.counts["shed"] += 1
        self.counts["finished" if err is None else "failed"] += 1
        key = (q.klass, q.state, err.name if err is not None else (outcome or ""))
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self._remember(q)
        q.done.set()
        q.changed.set()
        if not q.pages:  # a finished query holding unread pages keeps its user's slot until they are read
            self._user_done(q)
        with self._bytes_lock:
            owing = self.user_owing.get(q.user)
            if owing is not None:
                owing.discard(q)
                if not owing:
                    del self.user_owing[q.user]

    def _release(self, now: float, *, look: bool = True) -> None:
        """Deferred queries: shed the expired, place those a cluster is now predicted to meet.

        Classes are tried by priority, then by fewest releases per unit of
        share; within a class in arrival order.
        """
        for klass, q in self.gate.expire(now):
            q.deferred_s = now - q.submitted_s
            self._finish(q, now, error("EXCEEDED_TIME_LIMIT", (
                f"Query shed by the sloctl gateway: it waited {q.deferred_s:.2f} s (class {klass!r} waits at "
                f"most {self.policy.klass(klass).max_defer_s:g} s) and no cluster was predicted to meet its SLO of "
                f"{q.slo_s:.3g} s.")), "shed")
        if not look or not self.gate.has_waiting():
            return
        self._looked_s = now

        def place(klass: str, q: GatewayQuery) -> None:
            q.outcome, q.deferred_s = "deferred", now - q.submitted_s
            self.counts["deferred"] += 1
            self._place(q, now)

        self.gate.release(lambda q: self._meets(q, now), place)

    def _expire(self, now: float) -> None:
        ttl = self.options.result_ttl_s
        for qid in [qid for qid, q in self.queries.items() if q.end_s is not None and now - q.end_s > ttl]:
            q = self.queries.pop(qid)
            self._let_go(q)

    # -- client actions ----------------------------------------------------------------
    def get(self, query_id: str) -> GatewayQuery | None:
        with self.lock:
            return self.queries.get(query_id)

    def cancel(self, query_id: str) -> bool:
        """Cancel a query (``DELETE`` on its ``nextUri``): leave its queue, or interrupt its attempt."""
        with self.lock:
            q = self.queries.get(query_id)
            if q is not None and q.done.is_set():  # its result is no longer wanted: free it now
                self._let_go(q)
            if q is None or q.done.is_set():
                return q is not None
            q.cancelled = True
            self.counts["cancelled"] += 1
            self._cancel_locked(q, error("USER_CANCELED", "Query was canceled by the client."),
                                q.outcome or "cancelled")
        return True

    def _cancel_locked(self, q: GatewayQuery, err: TrinoError, outcome: str) -> None:
        """Fail ``q`` with ``err``, take it out of its queue, interrupt its attempts, drop its pages (lock held)."""
        self.gate.remove(q)
        running = [(aid, cid) for aid, (other, cid) in self.attempts.items() if other is q] + [
            (aid, SCRATCH) for aid, other in self.scratch_attempts.items() if other is q]
        waiting = self.user_waiting.get(q.user)
        if waiting is not None and q in waiting:
            waiting.remove(q)
        self._finish(q, self.now_s(), err, outcome)
        self._let_go(q)  # after _finish: a page still in flight sees the query failed and is not kept
        for attempt_id, cid in running:  # the worker answers with a completion; nothing here waits for it
            with contextlib.suppress(ClusterPoolError):
                self.pool.cancel(cid, attempt_id)

    # -- the query history ----------------------------------------------------------------
    def _remember(self, q: GatewayQuery, *, submitted: bool = False) -> None:
        """Queue ``q``'s history row (its text and client at submission; state, error and attempts at the end)."""
        if self.history is None:
            return
        doc: dict[str, Any] = {"query_id": q.query_id, "state": q.state, "outcome": q.outcome,
                               "routing_group": q.group}
        if submitted:
            doc.update(user=q.user, sql=q.text or q.sql, template=q.template, **{"class": q.klass},
                       submitted_at=self.wall_base + q.submitted_s,
                       slo_s=q.slo_s if math.isfinite(q.slo_s) else None)
        if q.end_s is not None:
            doc.update(ended_at=self.wall_base + q.end_s, elapsed_s=q.end_s - q.submitted_s, rows=q.rows,
                       error_name=None if q.error is None else q.error.name,
                       error_message=None if q.error is None else q.error.message,
                       attempts=[{**a, "backend_kind": self.kind_of(a["cluster_id"])} for a in q.attempts])
        with contextlib.suppress(queue.Full):  # a history that cannot keep up loses rows, never queries
            self._history_queue.put_nowait(doc)

    def _history_writer(self) -> None:
        pruned_s = -math.inf
        while not self._stop.wait(0.2):
            self._write_history()
            if time.monotonic() - pruned_s > 60.0:
                pruned_s = time.monotonic()
                with contextlib.suppress(Exception):
                    self.history.prune()

    def _write_history(self) -> None:
        # the writer thread and a reader (history_rows) both drain the queue: taken in turn, so a query's
        # submission row never lands after its end row
        with self._history_lock:
            while True:
                try:
                    doc = self._history_queue.get_nowait()
                except queue.Empty:
                    return
                self.history.record_query(doc, safe=True)

    def history_rows(self, *, user: str | None = None, state: str | None = None, limit: int = 100
                     ) -> list[dict[str, Any]]:
        """Queries of the history (newest first, each with its attempts); empty without a history."""
        if self.history is None:
            return []
        self._write_history()
        return self.history.list_queries(user=user, state=state, limit=limit)

    # -- backends ---------------------------------------------------------------------
    def kind_of(self, cluster_id: str) -> str:
        """``duckdb``, ``trino`` or ``postgresql``: the engine behind a cluster (spin-ups are DuckDB workers)."""
        spec = self.backends.get(cluster_id)
        return "duckdb" if spec is None else spec.kind

    def _plans_on_postgres(self) -> bool:
        """Whether the query log's plan features come from PostgreSQL's plans: backends of that kind, no DuckDB one.

        A gateway with a DuckDB worker plans there (DuckDB's plan); one in
        front of PostgreSQL servers only asks them (``EXPLAIN (FORMAT JSON)``
        of the translated text), so the features describe the engine that ran.
        """
        kinds = {spec.kind for spec in self.backends.values()}
        return "postgresql" in kinds and "duckdb" not in kinds

    def _barred(self, q: GatewayQuery) -> frozenset[str]:
        """Clusters ``q`` may not run on: backends out of routing, and those outside its routing group."""
        out = {name for name, state in self.backend_state.items() if state != "active"}
        if q.group is not None:
            out |= {cid for cid in self.managed.clusters
                    if (self.backends[cid].group if cid in self.backends else "default") != q.group}
        return frozenset(out)

    def groups(self) -> set[str]:
        """The routing groups of the backends (``default`` holds the autoscaler's spin-ups)."""
        return {spec.group for spec in self.backends.values()} | {"default"}

    def _health(self) -> None:
        """Every ``health_interval_s``: check each engine backend; take failing ones out, bring answering ones back."""
        while not self._stop.wait(self.options.health_interval_s):
            with contextlib.suppress(Exception):  # the checker must not die
                self.check_backends()

    def check_backends(self) -> dict[str, dict[str, Any]]:
        """One round of health checks (engine backends; DuckDB workers report through their pool)."""
        with self.lock:
            self.health_rounds += 1
            names = [n for n, spec in self.backends.items()
                     if spec.kind != "duckdb" and self.backend_state.get(n) in ("active", "unhealthy")]
        out = {}
        for name in names:  # network calls: outside the lock
            try:
                health = dict(self.pool.health(name))
            except Exception as exc:  # a check that cannot run is a failed check
                health = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            health["checked_s"] = self.now_s()
            out[name] = health
            stranded: list[int] = []
            back = False
            with self.lock:
                self.backend_health[name] = health
                state = self.backend_state.get(name)
                now = self.now_s()
                if state == "active" and not health.get("ok"):
                    self.backend_state[name] = "unhealthy"
                    self.managed.events.append({"t": now, "event": "unhealthy", "cluster_id": name,
                                                "why": health.get("error", ""), "round": self.health_rounds})
                    t = time.monotonic()
                    stranded = [aid for aid, (_, on) in self.attempts.items() if on == name]
                    for attempt_id in stranded:  # retried elsewhere within their class's budget
                        self._attempt_ended(attempt_id, QueryCompletion(
                            attempt_id, name, t, t, "error", f"backend {name} stopped: failed its health check"))
                back = state == "unhealthy" and bool(health.get("ok"))
            for attempt_id in stranded:  # best effort, outside the lock: the backend may not answer
                with contextlib.suppress(Exception):
                    self.pool.cancel(name, attempt_id)
            if back:
                self._reattach(name)
        return out

    def _reattach(self, name: str) -> None:
        """An unhealthy engine backend answered again: attach it anew (outside the lock), route to it once ready."""
        spec = self.backends[name]
        info = next((i for i in self.pool.clusters() if i.cluster_id == name), None)
        attached = info is not None and info.state == "ready"
        if not attached:
            with contextlib.suppress(ClusterPoolError):
                if info is not None and info.state != "stopped":
                    self.pool.tear_down(name)
            try:
                self.pool.spin_up(spec.size, cluster_id=name)
            except ClusterPoolError as exc:
                with self.lock:
                    self.backend_health[name] = {**self.backend_health.get(name, {}), "ok": False, "error": str(exc)}
                return
        with self.lock:
            if self.backend_state.get(name) != "unhealthy":  # drained or removed meanwhile
                return
            if not attached:
                self.managed.clusters[name].ready_s = None  # routable again once the pool says ready
            self.backend_state[name] = "active"
            self.managed.events.append({"t": self.now_s(), "event": "healthy", "cluster_id": name})

    def backends_view(self) -> list[dict[str, Any]]:
        """What ``GET /v1/gateway/backends`` answers: each backend, its state, health and running attempts."""
        with self.lock:
            return [{**spec.public(), "state": self.backend_state.get(name, "active"),
                     "running": self.running_on(name), "health": self.backend_health.get(name)}
                    for name, spec in self.backends.items()]

    def add_backend(self, spec: BackendSpec) -> dict[str, Any]:
        """Add (or re-activate) a backend at run time; it takes queries once it is ready.

        Raises:
            ValueError: a bad entry, or a name in use by another backend that is not drained.
            AuthError: (403) its URL is not in ``options.allowed_urls``.
        """
        spec.validate("backend")
        allowed = self.options.allowed_urls
        check_backend_url(spec.url, [b.url for b in self.options.backends if b.url] if allowed is None else allowed)
        # an engine's pool is made (and its role checked: a connection and a few catalog queries) outside the
        # gateway lock, which every query's placement takes
        new_pool = engine_pool(spec) if spec.kind != "duckdb" else None
        try:
            self._add_backend_locked(spec, new_pool)
        except BaseException:
            if new_pool is not None:
                with contextlib.suppress(Exception):
                    new_pool.close()
            raise
        return next(b for b in self.backends_view() if b["name"] == spec.name)

    def _add_backend_locked(self, spec: BackendSpec, new_pool: Any) -> None:
        with self.lock:
            old = self.backends.get(spec.name)
            if old is not None and self.backend_state.get(spec.name) != "drained":
                raise ValueError(f"The 'name' field must name a new or drained backend, got {spec.name!r} "
                                 f"({self.backend_state.get(spec.name)}).")
            if spec.name in self.managed.clusters and old is None:
                raise ValueError(f"The 'name' field must not be a cluster the gateway started, got {spec.name!r}.")
            if old is not None and old.kind != "duckdb" and spec.name in self.pool.pools:
                self.pool.remove(spec.name)
            if spec.kind == "duckdb":
                self.pool.own(spec.name, "duckdb")
            else:
                self.pool.add(spec.name, new_pool, (spec.name,))
            self.backends[spec.name] = spec
            self.pool.spin_up(spec.size, cluster_id=spec.name)
            self.backend_state[spec.name] = "active"
            self.managed.add_cluster(spec.name, spec.size, spun_up_s=self.now_s(), ready_s=None)
            self.managed.events.append({"t": self.now_s(), "event": "backend_added", "cluster_id": spec.name})

    def drain_backend(self, name: str, *, remove: bool = False) -> dict[str, Any]:
        """Stop placing queries on ``name``; once its running attempts end it is drained (``remove``: forgotten).

        Raises:
            KeyError: no such backend.
        """
        with self.lock:
            if name not in self.backends:
                raise KeyError(name)
            if self.backend_state[name] != "drained":
                self.backend_state[name] = "draining"
            if remove:
                self._removing.add(name)
            self.managed.events.append({"t": self.now_s(), "event": "drain", "cluster_id": name, "remove": remove})
            self._settle_drains()
        views = [b for b in self.backends_view() if b["name"] == name]
        return views[0] if views else {"name": name, "state": "removed"}

    def _settle_drains(self) -> None:
        """Draining backends with nothing running: stop them; those asked to be removed leave the list (lock held)."""
        removing = self._removing
        for name in [n for n, state in self.backend_state.items() if state == "draining" and not self.running_on(n)]:
            self.backend_state[name] = "drained"
            cluster = self.managed.clusters.get(name)
            if cluster is not None and not cluster.torn_down:  # stops it (a DuckDB worker) or lets it go; billed so far
                with contextlib.suppress(ClusterPoolError):
                    self.managed.apply([ScalingAction("tear_down", cluster_id=name)], self.now_s())
            if self.kind_of(name) != "duckdb":
                with contextlib.suppress(ClusterPoolError):
                    self.pool.remove(name)
            self.managed.events.append({"t": self.now_s(), "event": "drained", "cluster_id": name})
        for name in [n for n in removing if self.backend_state.get(n) == "drained"]:
            removing.discard(name)
            del self.backends[name]
            del self.backend_state[name]
            self.backend_health.pop(name, None)

    def running_on(self, cluster_id: str) -> int:
        return self.managed.clusters[cluster_id].running if cluster_id in self.managed.clusters else 0

    # -- the query log -----------------------------------------------------------------
    def _log_attempt(self, q: GatewayQuery, record: Any, done: QueryCompletion) -> None:
        cluster = self.managed.clusters[record.cluster_id]
        arrival = record.query.arrival_s
        end = done.end_s - self.base
        start = min(max(done.start_s - self.base, arrival), end)
        self.log.append({
            "query_id": record.query.query_id, "template": q.template, "sql_hash": q.sql_hash,
            "cluster_id": record.cluster_id, "cluster_size": cluster.size, "arrival_s": arrival,
            "start_s": start, "end_s": end, "latency_s": end - arrival, "status": done.status,
            "slo_s": q.slo_s if math.isfinite(q.slo_s) else float("nan"),
            "oversubscribed": bool(done.oversubscribed), "gateway_query": q.query_id, "query_class": q.klass,
            "attempt": int(q.attempts[-1]["attempt"]), "error": done.error or "", "cancelled": done.error == CANCELLED},
            q.text if self._plans_on_postgres() else q.sql)

    @property
    def log_rows(self) -> list[dict[str, Any]]:
        """The logged attempts (rows of :meth:`query_log`, before plan features are filled in)."""
        return self.log.rows

    def _table(self) -> Any:
        return self.built.templates if self.built is not None else self.templates

    def query_log(self) -> Any:
        """The attempts so far as a validated query log (a DataFrame)."""
        return self.log.frame(self._table())

    def flush_log(self) -> Path | None:
        """Rewrite this run's log file (atomically); ``None`` without ``log_dir`` or rows."""
        return self.log.flush(self._table(), router=self.router_kind())

    # -- views ------------------------------------------------------------------------
    def cost(self, cluster_id: str | None = None) -> float:
        """The bill so far (one cluster's, or the total), without moving any billing timer.

        ``ManagedPool.cost`` advances a timer to the time it is read at; a
        completion observed after that (the worker's end is in the past) would
        then move it backwards. The gateway reads the timers' copies.
        """
        with self.lock:
            now = self.now_s()
            ids = [cluster_id] if cluster_id is not None else list(self.managed.clusters)
            return sum(s.price_per_unit_s * s.size * s.timer.copy().active_s(now)
                       for s in (self.managed.clusters[cid].state for cid in ids))

    def status(self) -> dict[str, Any]:
        """What ``GET /v1/gateway`` answers: clusters, router, policy, counts, waiting queries."""
        with self.lock:
            now = self.now_s()
            slots = {name: slot.status() for name, slot in self.slots.items()}
            return {
                "router": self.router_kind(), "model": self.model_source, "swaps": self.swaps,
                "slo_margin": None if self.built is None else self.built.slo_margin,
                "admission": self.options.admission, "retries": self.options.retries,
                # admission acts only with a latency model to predict misses; without one every query is admitted
                "admission_active": bool(self.options.admission and self.built is not None
                                         and self.built.online is not None),
                "catalog": self.catalog.name,
                "queries_running": sum(q.state == "RUNNING" for q in self.queries.values()),
                "queries_queued": sum(q.state == "QUEUED" for q in self.queries.values()),
                "outcomes": [{"class": k, "state": s, "outcome": o, "queries": n}
                             for (k, s, o), n in sorted(self.outcomes.items())],
                "attempt_latency": self.attempt_latency.doc(),
                "autoscaler": self.autoscaler_note, "dispatch_errors": list(self.dispatch_errors),
                "policy": self.policy.to_doc(), "slots": slots, "counts": dict(self.counts),
                "waiting": self.gate.waiting(), "planner": self.planner.status(),
                "users": {"running": sum(self.user_running.values()),
                          "queued": sum(len(w) for w in self.user_waiting.values()),
                          "result_bytes": sum(self.user_bytes.values())},
                "clusters": [{"cluster_id": cid, "size": c.size, "running": c.running,
                              "ready": c.is_ready(now) and not c.torn_down, "torn_down": c.torn_down,
                              "cost": self.cost(cid)} for cid, c in self.managed.clusters.items()],
                "total_cost": self.cost(), "log": None if self.log.path is None
                else str(self.log.path), "logged_attempts": len(self.log),
                "log_errors": dict(self.log.errors), "log_last_error": self.log.last_error,
                "draining": self.draining, "restarts": list(self.restarts)[-20:], "restarts_total": len(self.restarts),
                "limits": {"max_query_length": self.options.max_query_length,
                           "max_run_time_s": self.policy.max_run_time_s,
                           "client_timeout_s": self.policy.client_timeout_s,
                           "attempt_timeout_s": self.policy.attempt_timeout_s,
                           "page_rows": self.options.page_rows, "buffer_pages": self.options.buffer_pages,
                           "worker_memory_limit": self.options.worker_memory_limit,
                           "buffer_bytes": self.options.buffer_bytes,
                           "user_buffer_bytes": self.options.user_buffer_bytes,
                           "user_max_running": self.policy.user_max_running,
                           "user_max_queued": self.policy.user_max_queued,
                           "plan_timeout_s": self.options.plan_timeout_s,
                           "worker_temp_limit": self.options.worker_temp_limit},
                "events": list(self.managed.events)[-50:]}
