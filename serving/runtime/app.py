"""``sloctl serve``: the controller runtime over HTTP (FastAPI).

Endpoints (all JSON; mutating ones need ``Authorization: Bearer TOKEN``, the OpenAPI ``bearer`` scheme):

* ``POST /v1/predict`` — a query's latency on a cluster size given neighbours (by template, or its SQL text
  for a model trained on text and catalog features), or a batch of queries (``queries``);
* ``POST /v1/route`` / ``POST /v1/complete`` — the Query Router and its feedback;
* ``GET /v1/clusters`` — the pool, running queries, accrued cost;
  ``PUT`` / ``DELETE /v1/clusters/{id}`` — a cluster spun up or retired (e.g. by the autoscaler);
* ``POST /v1/admit`` / ``POST /v1/release`` — admission decisions: a lease on a credit, released by its id;
* ``GET /v1/retry-policy`` and ``GET /v1/retry-policy/envoy?service=S`` — retry budgets, each network's by
  ``&network=NAME`` (registered as ``retry-policy-NAME``);
* ``GET /v1/execution-config`` — the Policy Tuner's scheduled spin-ups and autoscaler knobs, what of it is
  in force, the next scheduled spin-up and those enacted (the runtime enacts it, ``docs/serving.md``);
* ``GET /metrics``, ``GET /healthz``, ``GET /readyz``, and ``GET /`` (status page).

Every error is an RFC 9457 problem document (``application/problem+json``:
``type``, ``title``, ``status``, ``detail``, and ``field`` naming the field at
fault; a 422 lists ``errors``); the input is never echoed. Non-finite numbers
(``NaN``, ``Infinity``, ``1e400``) are refused in every body field. Requests
pass :class:`~sloctl.serving.front.FrontDoor` first (auth, body limits, the
public budget); authenticated work is then admitted by the same
:class:`~sloctl.serving.runtime.admission.AdmissionMiddleware` the runtime offers
users. ``/docs`` is off (no CDN here): the spec is ``/openapi.json``.
"""

from __future__ import annotations

import hmac
import html
import threading
import time
from collections import Counter
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from sloctl.control.credits import CreditController, LeaseError
from sloctl.core.kinds import ModelKind, RouterKind
from sloctl.serving.front import PROBLEM_JSON, FrontDoor, FrontSettings, check_token, problem
from sloctl.serving.runtime.admission import AdmissionMiddleware, AdmissionSettings
from sloctl.serving.runtime.envoy import envoy_route_config
from sloctl.serving.runtime.runtime import RequestRefused, Runtime, RuntimeConfig

__all__ = ["MAX_NAME_CHARS", "MAX_NEIGHBOURS", "Name", "create_app"]

#: ``?network=NAME`` on the retry-policy endpoints: the policy registered as ``retry-policy-NAME``.
_NETWORK = Query(None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                 description="The network whose policy to serve (registered as retry-policy-NETWORK); "
                             "omitted: serve.retry_uri.")

MAX_NEIGHBOURS = 256  # the schema's bound; serve.predict_max_neighbours may set a lower one
MAX_NAME_CHARS = 200  # longest template or service name; a class 64, a holder 128, a lease id 64
MAX_SQL_CHARS = 100_000  # longest query text /v1/predict parses (its body limit bounds a batch's)
MAX_BATCH = 10_000  # the schema's bound; serve.predict_max_batch sets the one in force


def _printable(value: str) -> str:
    """A name as sent, or a ``ValueError`` (a 422 naming the field) when it holds a control character.

    NUL and the other C0/C1 controls are never part of a template, class,
    holder or service name; refused here, they never reach the template
    table, the state store or a log line.
    """
    for i, ch in enumerate(value):
        if ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            raise ValueError(f"must not hold control characters (U+0000-U+001F, U+007F-U+009F), "
                             f"got U+{ord(ch):04X} at position {i}")
    return value


#: A name from a client: printable, 1 to ``max_length`` characters.
Name = Annotated[str, AfterValidator(_printable)]
_CLUSTER_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # a leading "_" is the runtime's own (``_retired``)


class _Body(BaseModel):
    """Every request body: non-finite numbers (NaN, Infinity, 1e400) are refused with the field's name."""

    model_config = ConfigDict(allow_inf_nan=False, populate_by_name=True)


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True)


class _Named(_Body):
    """A query named by its template (one the model was trained on) or given as SQL text."""

    template: Name | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    sql: str | None = Field(default=None, min_length=1, max_length=MAX_SQL_CHARS,
                            description="The query's text, for a model trained on text and catalog features "
                                        "(`sloctl train iconq --features text+catalog`).")

    @model_validator(mode="after")
    def _one_name(self) -> Any:
        if (self.template is None) == (self.sql is None):
            raise ValueError("give the query's template or its sql text (exactly one)")
        return self


class Neighbour(_Named):
    offset_s: float = Field(ge=-86400, le=86400, description="Arrival relative to the query (negative: before).")


class BatchQuery(_Named):
    cluster_size: int = Field(ge=1, le=1024)
    cluster_id: Name | None = Field(default=None, min_length=1, max_length=64,
                                    description="Queries of a batch that share a cluster id run together (each "
                                                "other's neighbours); default: the query runs alone.")
    arrival_s: float = Field(default=0.0, ge=-86400, le=86400, description="When it arrives (seconds; only the "
                                                                            "order and gaps within a cluster matter).")
    catalog: Name | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    schema_: Name | None = Field(default=None, alias="schema", min_length=1, max_length=MAX_NAME_CHARS)


class PredictBody(_Body):
    """One query with its neighbours (``template`` or ``sql``), or a batch (``queries``)."""

    template: Name | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    sql: str | None = Field(default=None, min_length=1, max_length=MAX_SQL_CHARS,
                            description="The query's text instead of a template (a model trained on text and "
                                        "catalog features).")
    catalog: Name | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS,
                                 description="Catalog of the tables the SQL text leaves unqualified.")
    schema_: Name | None = Field(default=None, alias="schema", min_length=1, max_length=MAX_NAME_CHARS,
                                 description="Schema of the tables the SQL text leaves unqualified.")
    cluster_size: int | None = Field(default=None, ge=1, le=1024)
    neighbours: list[Neighbour] = Field(default_factory=list, max_length=MAX_NEIGHBOURS)
    queries: list[BatchQuery] | None = Field(default=None, min_length=1, max_length=MAX_BATCH,
                                             description="A batch: each query with its cluster and arrival "
                                                         "(serve.predict_max_batch at most).")

    @model_validator(mode="before")
    @classmethod
    def _count_first(cls, data: Any) -> Any:
        # the count before any item is validated: a long list costs nothing to refuse
        if isinstance(data, dict):
            if isinstance(data.get("neighbours"), list) and len(data["neighbours"]) > MAX_NEIGHBOURS:
                raise ValueError(f"neighbours: at most {MAX_NEIGHBOURS} items, got {len(data['neighbours'])}")
            if isinstance(data.get("queries"), list) and len(data["queries"]) > MAX_BATCH:
                raise ValueError(f"queries: at most {MAX_BATCH} items, got {len(data['queries'])}")
        return data

    @model_validator(mode="after")
    def _one_form(self) -> Any:
        if self.queries is not None:
            if self.template is not None or self.sql is not None or self.cluster_size is not None or self.neighbours:
                raise ValueError("give one query (template or sql, cluster_size, neighbours) or a batch (queries), "
                                 "not both")
            return self
        if (self.template is None) == (self.sql is None):
            raise ValueError("give the query's template or its sql text (exactly one), or a batch (queries)")
        if self.cluster_size is None:
            raise ValueError("cluster_size: required with one query (template or sql)")
        return self


class RouteBody(_Body):
    query_id: int = Field(ge=0, le=2**62)
    template: Name = Field(min_length=1, max_length=MAX_NAME_CHARS)
    slo_s: float = Field(gt=0, le=86400)


class CompleteBody(_Body):
    query_id: int = Field(ge=0, le=2**62)
    latency_s: float = Field(ge=0, le=86400)
    status: Literal["ok", "error", "timeout"] = Field(
        default="ok", description="As in the query log: ok, error (the query failed) or timeout.")


class ClusterBody(_Body):
    size: int = Field(ge=1, le=1024)


class AdmitBody(_Body):
    klass: Name = Field(default="high", alias="class", min_length=1, max_length=64)
    budget_ms: float = Field(default=1000.0, gt=0, le=86_400_000)
    holder: Name = Field(default="anonymous", min_length=1, max_length=128,
                        description="Who holds the lease (recorded; a release naming another holder is refused).")
    ttl_s: float | None = Field(default=None, gt=0, le=86_400,
                                description="Lease lifetime (default serve.lease_ttl_s, at most "
                                            "serve.lease_max_ttl_s); an expired lease's credit is reclaimed.")


class ReleaseBody(_Body):
    lease_id: Name = Field(min_length=1, max_length=64, description="The id /v1/admit returned.")
    holder: Name | None = Field(default=None, min_length=1, max_length=128)
    ok: bool = True
    within_slo: bool = True


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str
    field: str | None = None


class Prediction(_Out):
    latency_s: float
    isolated_latency_s: float


class PredictOut(_Out):
    latency_s: float | None = Field(default=None, description="One query's prediction (null for a batch).")
    isolated_latency_s: float | None = None
    predictions: list[Prediction] | None = Field(default=None, description="A batch's, in the order of queries.")
    model: str | None
    model_version: str | None = None
    fallback: bool
    note: str | None = None


class RouteOut(_Out):
    query_id: int
    cluster_id: str
    cluster_size: int
    predicted_latency_s: float | None
    model: str
    model_version: str | None
    fallback: bool
    guard: str | None
    decision_ms: float
    explanation: dict[str, dict[str, float]]


class CompleteOut(_Out):
    query_id: int
    cluster_id: str
    violated: bool
    predicted_latency_s: float | None


class ClusterOut(_Out):
    cluster_id: str
    size: int
    running: list[int]
    accrued_cost: float
    origin: str | None
    retired: bool


class StateOut(_Out):
    """Where the runtime's state lives and this replica's part in it."""

    store: str  # "sqlite" (one runtime) or "redis" (shared by replicas)
    replica: str  # this process's name (unique per start)
    leads_scaling: bool  # this replica enacts scheduled spin-ups and the reactive autoscaler


class ClustersOut(_Out):
    clusters: list[ClusterOut]
    starting: list[dict[str, Any]]
    total_cost: float
    completed: int
    violation_rate: float
    model: str
    reconciled: dict[str, Any]
    events: list[dict[str, Any]]
    state: StateOut
    drift_calibration: dict[str, Any] | None = None


class PutClusterOut(_Out):
    cluster_id: str
    size: int
    changed: bool


class DeleteClusterOut(_Out):
    cluster_id: str
    retired: bool


class AdmitOut(_Out):
    admitted: bool
    klass: str = Field(alias="class")
    credits: int
    in_flight: int
    policy: str
    lease_id: str | None = None
    holder: str | None = None
    expires_in_s: float | None = None
    retry_after_s: int | None = None


class ReleaseOut(_Out):
    released: bool
    lease_id: str
    klass: str = Field(alias="class")
    in_flight: int


class RetryPolicyOut(_Out):
    retries: dict[str, Any]
    predicted: dict[str, Any]
    source: str


class _EnvoyOut(_Out):
    """Envoy v3 configuration: the keys sloctl writes are typed; any other Envoy field passes through."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")


class EnvoyRouteOut(_EnvoyOut):
    """One route: ``class-<class>`` matches the class header exactly; the last, ``default-<class>``, any call."""

    name: str
    match: dict[str, Any] = Field(description="Envoy RouteMatch: prefix, and the class header for class routes.")
    route: dict[str, Any] = Field(description="Envoy RouteAction: cluster, timeout and retry_policy (num_retries, "
                                              "per_try_timeout, retry_back_off, retry_on).")


class EnvoyVirtualHostOut(_EnvoyOut):
    name: str = Field(description="The service the sidecar fronts.")
    domains: list[str]
    routes: list[EnvoyRouteOut]


class EnvoyRouteConfigOut(_EnvoyOut):
    """An Envoy v3 ``RouteConfiguration`` for calls into one service (what ``sloctl sidecar sync`` writes)."""

    name: str = Field(description="The route configuration's name (what the sidecar's RDS names).")
    virtual_hosts: list[EnvoyVirtualHostOut]


class SpinupOut(_Out):
    time_s: float = Field(description="When, in the Policy Tuner's (compressed) day seconds.")
    real_time: str | None = Field(default=None, description="HH:MM of the real day (with a time scale).")
    size: int
    mode: str


class InForceOut(_Out):
    since: str
    start_sizes: list[int]
    start_sizes_applied: bool
    start_sizes_note: str | None
    autoscaler: dict[str, Any] | None
    reactive: str | None
    day_start: str
    plan_clock: str
    spinup_delay_s: float
    max_clusters: int
    upcoming: int = Field(description="Scheduled spin-ups still to come.")


class NextSpinupOut(_Out):
    at: str
    size: int
    mode: str


class EnactedOut(_Out):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    at: str
    cluster_id: str
    size: int
    mode: str
    scheduled_at: str
    ready_at: str | None = None
    source: str


class MissedOut(_Out):
    at: str
    size: int
    mode: str


class ExecutionConfigOut(_Out):
    """The execution-config in force: its registered document (as ``sloctl tune policy`` wrote it) and what the
    runtime made of it (``source``, ``in_force``, ``next_spinup``, ``enacted``, ``missed``)."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    kind: str
    version: int = Field(description="Schema version of the document.")
    target_date: str | None
    start_sizes: list[int]
    spinups: list[SpinupOut]
    autoscaler: dict[str, Any] | None
    knobs: dict[str, Any]
    predicted: dict[str, Any] = Field(description="Validation violation rate and cost of the plan (and knobs).")
    time_scale: dict[str, Any]
    router: str | None
    strategy: str | None
    budget: int | None
    order: str | None
    forecasts: dict[str, Any]
    history: dict[str, Any]
    evaluated: int | None
    simulations: int | None
    trials: list[dict[str, Any]]
    provenance: dict[str, str]
    source: str = Field(description="The registry URI and version it came from.")
    in_force: InForceOut
    next_spinup: NextSpinupOut | None
    enacted: list[EnactedOut]
    missed: list[MissedOut]


class HealthOut(_Out):
    ok: bool


class SlotOut(_Out):
    uri: str
    version: str | None
    loaded: bool
    error: str | None
    swaps: int
    load_failures: int


class ReadyOut(_Out):
    ready: bool
    router: str
    router_guard: dict[str, Any] | None
    models: dict[str, SlotOut]
    leases: dict[str, int]


class _Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.decisions = Counter("sloctl_decisions", "Decisions by endpoint and outcome.", ["endpoint", "outcome"],
                                 registry=self.registry)
        self.latency = Histogram("sloctl_endpoint_latency_seconds", "Server-side latency per endpoint.",
                                 ["endpoint"], registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0))
        self.violations = Gauge("sloctl_violation_rate", "Violation rate of completed queries.",
                                registry=self.registry)
        self.cost = Gauge("sloctl_accrued_cost", "Accrued cost of the pool.", registry=self.registry)
        self.version = Gauge("sloctl_model_version", "Registry version in use (0: none).", ["slot"],
                             registry=self.registry)
        self.guard = Gauge("sloctl_router_guard_fallbacks", "Queries the Iconq+ router's guard placed by load "
                           "since the router was built, by reason.", ["reason"], registry=self.registry)
        self.scaling = Counter("sloctl_scaling_events", "Cluster scaling events of the execution-config in force "
                               "(start, spin_up, ready, tear_down, ...), by who decided them.", ["event", "origin"],
                               registry=self.registry)
        self.scaling_seen: dict[tuple[str, str], int] = {}  # what the counter already holds of the runtime's counts
        self.load_failures = Counter("sloctl_model_load_failures", "Registry versions that failed to load, by slot.",
                                     ["slot"], registry=self.registry)
        self.failures_seen: dict[str, int] = {}
        self.leases = Gauge("sloctl_admission_leases", "Admission leases outstanding.", registry=self.registry)
        self.lease_events = Gauge("sloctl_admission_lease_events", "Admission lease events since the start "
                                  "(granted, released, expired, refused).", ["event"], registry=self.registry)


def _error(status: int, message: str, field: str | None = None, **extensions: Any) -> JSONResponse:
    return JSONResponse(problem(status, message, field=field, **extensions), status_code=status,
                        media_type=PROBLEM_JSON)


def _field(loc: tuple | list) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header") and len(parts) > 1:
        parts = parts[1:]
    return ".".join(parts) or "body"


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for problem answers."""
    why = {401: "missing or wrong bearer token", 404: "not found (query, cluster, lease, policy)",
           408: "the body did not arrive in time", 409: "conflict with the runtime's state",
           413: "body too large", 422: "invalid request (the field is named)",
           503: "overloaded (Retry-After) or no budget left for unauthenticated requests"}
    return {code: {"model": Problem, "description": why[code]} for code in codes}


def create_app(cfg: RuntimeConfig, *, token: str | None, templates: Any = None, state_db: str | None = None,
               watch: bool = True, clock: Any = None) -> Any:
    """The ASGI app (wrapped in the self-protecting admission middleware).

    Args:
        cfg: the :class:`~sloctl.config.SloctlConfig`.
        token: bearer token for mutating endpoints (None: no auth, for local experiments only).
        templates: plan features per template (see :func:`~sloctl.serving.controller.load_templates_table`).
        state_db: SQLite file (default ``cfg.serve.state_db``).
        watch: poll the registry aliases every ``cfg.serve.watch_interval_s``
            (and enact the execution-config's spin-ups that fall due between route calls).
        clock: the runtime's wall clock (seconds since the Unix epoch; default
            :func:`time.time`); tests pass a fake.
    """

    holder: dict[str, Any] = {}
    metrics = _Metrics()
    stop = threading.Event()

    def runtime() -> Runtime:
        return holder["runtime"]

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        holder["runtime"] = Runtime(cfg, templates, state_db or cfg.serve.state_db, clock=clock or time.time).start()
        thread = None
        if watch:
            def loop() -> None:
                while not stop.wait(cfg.serve.watch_interval_s):
                    holder["runtime"].refresh()

            thread = threading.Thread(target=loop, name="sloctl-alias-watcher", daemon=True)
            thread.start()
        yield
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
        holder["runtime"].close()

    token = check_token(token)
    serve = cfg.serve
    app = FastAPI(title="sloctl controller runtime", version="0.2.0", lifespan=lifespan, docs_url=None,
                  redoc_url=None)
    bearer = HTTPBearer(auto_error=False, description="serve.token or $SLOCTL_TOKEN")
    expected = None if token is None else token.encode()

    async def require_token(credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
        # the front door already refused a wrong token; checked again so the app never trusts its wrapper
        if expected is None:
            return
        if credentials is None or not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise _Unauthorized()

    auth = [Depends(require_token)]

    @app.exception_handler(RequestRefused)
    async def refused(request: Request, exc: RequestRefused) -> JSONResponse:
        return _error(exc.status, str(exc), exc.field)

    @app.exception_handler(_Unauthorized)
    async def unauthorized(request: Request, exc: Exception) -> JSONResponse:
        response = _error(401, "missing or wrong bearer token", "authorization")
        response.headers["www-authenticate"] = "Bearer"
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": _field(e.get("loc", ())), "message": str(e.get("msg", "invalid"))[:300]}
                  for e in exc.errors()[:20]]  # never the input: it may be huge, or not encodable (NaN)
        first = errors[0] if errors else {"field": "body", "message": "invalid request"}
        return _error(422, f"{first['field']}: {first['message']}", first["field"], errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = _error(exc.status_code, str(exc.detail))
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error ({type(exc).__name__})")

    @app.post("/v1/predict", response_model=PredictOut, response_model_exclude_none=False,
              responses=_errors(408, 413, 422, 503))
    def predict(body: PredictBody) -> dict[str, Any]:
        # a plain def: FastAPI runs it on a worker thread, so parsing SQL text never blocks the event loop
        batch = body.queries is not None
        if batch and len(body.queries) > serve.predict_max_batch:
            raise RequestRefused(f"at most {serve.predict_max_batch} queries (serve.predict_max_batch), "
                                 f"got {len(body.queries)}", field="queries")
        if len(body.neighbours) > serve.predict_max_neighbours:
            raise RequestRefused(f"at most {serve.predict_max_neighbours} neighbours (serve.predict_max_neighbours), "
                                f"got {len(body.neighbours)}", field="neighbours")
        rt = runtime()
        kind = rt.latency_model()
        if kind == RouterKind.ROUND_ROBIN:
            metrics.decisions.labels("predict", "no_model").inc()
            return {"latency_s": None, "isolated_latency_s": None, "model": None, "fallback": True,
                    "note": "no latency model is loaded (or no template table: no templates_log and none in "
                            "the model bundle); nothing to predict with"}
        predictor = rt.slots[kind].value
        queries = _batch_rows(body) if batch else _what_if_rows(body)
        if not batch:
            for name in [body.template, *(n.template for n in body.neighbours)]:
                if name is not None:
                    rt.check_template(name, kind)
        else:
            for name in {q["template"] for q in queries if q["template"] is not None}:
                rt.check_template(name, kind)
            largest = max(Counter(q["cluster_id"] for q in queries).values())
            if largest - 1 > serve.predict_max_neighbours:
                raise RequestRefused(f"at most {serve.predict_max_neighbours + 1} queries of a batch may share a "
                                     f"cluster (serve.predict_max_neighbours + 1), got {largest}", field="queries")
        frame = _predict_frame(rt, kind, predictor, queries)
        seconds, stage_s = predictor.predict_with_isolated(frame, neighbours="all")
        metrics.decisions.labels("predict", "ok").inc()
        out = {"model": kind, "model_version": rt.slots[kind].version, "fallback": kind != ModelKind.ICONQ}
        if batch:
            return {**out, "predictions": [{"latency_s": float(a), "isolated_latency_s": float(b)}
                                           for a, b in zip(seconds, stage_s, strict=True)]}
        return {**out, "latency_s": float(seconds[0]), "isolated_latency_s": float(stage_s[0])}

    # route and complete run on the event loop, like admit: they hold the runtime's lock throughout anyway, and a
    # worker-thread hop per call costs more CPU than the decision itself when replicas share a machine's cores
    @app.post("/v1/route", dependencies=auth, response_model=RouteOut, responses=_errors(401, 409, 413, 422, 503))
    async def route(body: RouteBody) -> dict[str, Any]:
        out = runtime().route(body.query_id, body.template, body.slo_s)
        metrics.decisions.labels("route", out["model"]).inc()
        return out

    @app.post("/v1/complete", dependencies=auth, response_model=CompleteOut,
              responses=_errors(401, 404, 413, 422))
    async def complete(body: CompleteBody) -> dict[str, Any]:
        rt = runtime()
        out = rt.complete(body.query_id, body.latency_s, body.status)
        metrics.violations.set(rt.violations / rt.completed if rt.completed else 0.0)
        if rt.history:  # a repeated call as a replica's first completion leaves none
            metrics.cost.set(rt.history[-1]["cost"])  # the cost complete persisted before reporting
        metrics.decisions.labels("complete", "violated" if out["violated"] else "met").inc()
        return out

    @app.get("/v1/clusters", response_model=ClustersOut, responses=_errors(503))
    def clusters() -> dict[str, Any]:
        return runtime().clusters_view()

    @app.put("/v1/clusters/{cluster_id}", dependencies=auth, response_model=PutClusterOut,
             responses=_errors(401, 409, 413, 422, 503))
    def put_cluster(body: ClusterBody, cluster_id: str = Path(min_length=1, max_length=64,
                                                               pattern=_CLUSTER_ID)) -> dict[str, Any]:
        return runtime().put_cluster(cluster_id, body.size)

    @app.delete("/v1/clusters/{cluster_id}", dependencies=auth, response_model=DeleteClusterOut,
                responses=_errors(401, 404, 409, 422, 503))
    def delete_cluster(cluster_id: str = Path(min_length=1, max_length=64, pattern=_CLUSTER_ID)) -> dict[str, Any]:
        return runtime().delete_cluster(cluster_id)

    # Admission is on the hot path of every protected request: async handlers (no worker-thread hop) and a
    # lock of its own, never the router's (which a routing decision holds for milliseconds).
    @app.post("/v1/admit", dependencies=auth, response_model=AdmitOut, responses=_errors(401, 413, 422, 503))
    async def admit(body: AdmitBody) -> dict[str, Any]:
        rt = runtime()
        if body.ttl_s is not None and body.ttl_s > serve.lease_max_ttl_s:
            raise RequestRefused(f"ttl_s must be at most {serve.lease_max_ttl_s} (serve.lease_max_ttl_s), got "
                                f"{body.ttl_s}", field="ttl_s")
        with rt.admission_lock:
            _check_class(rt, body.klass)
            now = rt.now_s()
            lease = rt.leases.acquire(body.klass, body.holder, now, body.ttl_s)
            credits, in_flight = rt.admission.credits, rt.admission.in_flight
        metrics.decisions.labels("admit", "admitted" if lease else "dropped").inc()
        out = {"admitted": lease is not None, "class": body.klass, "credits": credits, "in_flight": in_flight,
               "policy": rt.admission_source}
        if lease is None:
            return {**out, "retry_after_s": 1}
        return {**out, "lease_id": lease.lease_id, "holder": lease.holder, "expires_in_s": lease.expires_s - now}

    @app.post("/v1/release", dependencies=auth, response_model=ReleaseOut, responses=_errors(401, 404, 409, 413, 422))
    async def release(body: ReleaseBody) -> dict[str, Any]:
        rt = runtime()
        with rt.admission_lock:
            try:
                lease = rt.leases.release(body.lease_id, rt.now_s(), holder=body.holder, ok=body.ok,
                                          within_slo=body.within_slo)
            except LeaseError as exc:
                status, field = (409, "holder") if exc.reason == "holder" else (404, "lease_id")
                raise RequestRefused(str(exc), status=status, field=field) from None
            return {"released": True, "lease_id": lease.lease_id, "class": lease.klass,
                    "in_flight": rt.admission.in_flight}

    @app.get("/v1/retry-policy", response_model=RetryPolicyOut, responses=_errors(404, 503))
    def retry_policy(network: str | None = _NETWORK) -> Any:
        rt = runtime()
        slot = rt.retry_slot(network)
        if slot.value is None:
            return _error(404, f"no retry policy registered at {slot.uri} (run `sloctl retry optimise`)")
        doc = slot.value.to_doc()  # a RetryPolicy
        return {"retries": doc["retries"], "predicted": doc["predicted"], "source": f"{slot.uri} v{slot.version}"}

    @app.get("/v1/retry-policy/envoy", response_model=EnvoyRouteConfigOut, responses=_errors(404, 422, 503))
    def retry_policy_envoy(service: Annotated[Name, Query(min_length=1, max_length=MAX_NAME_CHARS)],
                           network: str | None = _NETWORK) -> Any:
        rt = runtime()
        slot = rt.retry_slot(network)
        if slot.value is None:
            return _error(404, f"no retry policy registered at {slot.uri} (run `sloctl retry optimise`)")

        try:
            return envoy_route_config(slot.value, service=service)
        except ValueError as exc:
            return _error(422, str(exc), "service")

    @app.get("/v1/execution-config", response_model=ExecutionConfigOut, response_model_exclude_unset=True,
             responses=_errors(404, 503))
    def execution_config() -> Any:
        rt = runtime()
        view = rt.execution_view()  # the ExecutionPlan's document, source, in_force, next_spinup, enacted, missed
        if view is None:
            slot = rt.slots["execution"]
            return _error(404, f"no execution configuration registered at {slot.uri} (run `sloctl tune policy`)")
        return view

    @app.get("/metrics")
    def prometheus() -> Response:
        from prometheus_client import generate_latest

        rt = runtime()
        for name, slot in rt.slots.items():
            metrics.version.labels(name).set(float(slot.version or 0))
        guard = rt.guard_summary()
        for reason in ("error", "support"):
            metrics.guard.labels(reason).set(float(guard["fallbacks"][reason]) if guard else 0.0)
        with rt.lock:  # one scrape at a time moves the counter up to the runtime's counts
            for key, count in rt.enactor.counts.items():
                metrics.scaling.labels(*key).inc(count - metrics.scaling_seen.get(key, 0))
                metrics.scaling_seen[key] = count
            for name, slot in rt.slots.items():
                metrics.load_failures.labels(name).inc(slot.load_failures - metrics.failures_seen.get(name, 0))
                metrics.failures_seen[name] = slot.load_failures
            metrics.cost.set(rt.report_cost(rt.now_s()))
        with rt.admission_lock:
            rt.leases.reclaim(rt.now_s())
            metrics.leases.set(rt.leases.outstanding)
            for event, count in rt.leases.counts.items():
                metrics.lease_events.labels(event).set(count)
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/healthz", response_model=HealthOut)
    def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/readyz", response_model=ReadyOut, responses=_errors(503))
    def readyz() -> Any:
        rt = holder.get("runtime")
        if rt is None:
            return _error(503, "starting")
        return {"ready": True, "router": rt.router_kind, "router_guard": rt.guard_summary(),
                "models": {n: s.status() for n, s in rt.slots.items()},
                "leases": {"outstanding": rt.leases.outstanding, **rt.leases.counts,
                           "credits": rt.admission.credits, "floor": rt.admission.min_credits,
                           "in_flight": rt.admission.in_flight}}

    @app.get("/", response_class=HTMLResponse)
    def status_page() -> str:
        return _status_html(runtime())

    def openapi() -> dict[str, Any]:
        # FastAPI files every error model under application/json; ours are application/problem+json
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                 description="The sloctl controller runtime (docs/serving.md).")
            for item in schema.get("paths", {}).values():
                for operation in item.values():
                    for code, response in operation.get("responses", {}).items():
                        content = response.get("content", {})
                        if code[:1] in "45" and "application/json" in content:
                            content[PROBLEM_JSON] = content.pop("application/json")
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    credits = CreditController(initial_credits=serve.max_in_flight, min_credits=serve.max_in_flight,
                               max_credits=serve.max_in_flight)
    credits.bound_history(serve.history_limit)
    protected = AdmissionMiddleware(app, credits, AdmissionSettings(
        classes=("high", "low"), default_class="high", default_budget_ms=10_000.0, exempt_paths=(), concurrency=8))

    def needs_auth(route: Any) -> bool:
        return any(d.dependency is require_token for d in getattr(route, "dependencies", ()))

    front = FrontDoor(app, protected, app.routes, needs_auth, token,
                      FrontSettings(max_body_bytes=serve.max_body_bytes, body_timeout_s=serve.body_timeout_s,
                                    public_max_in_flight=serve.public_max_in_flight,
                                    large_body_paths=("/v1/predict",),
                                    large_body_bytes=max(serve.predict_max_body_bytes, serve.max_body_bytes)),
                      lambda label, seconds: metrics.latency.labels(label).observe(seconds))
    front.fastapi = app  # the inner app, for OpenAPI and tests
    front.admission = protected
    return front


class _Unauthorized(Exception):
    pass


def _check_class(rt: Runtime, klass: str) -> None:
    known = [c.name for c in rt.admission.classes] if rt.admission.classes else None
    if known and klass not in known:
        raise RequestRefused(f"unknown class {klass!r} (classes: {', '.join(known)})", field="class")


def _what_if_rows(body: PredictBody) -> list[dict[str, Any]]:
    """One query at 0 and its neighbours at their offsets, all on one cluster, as batch rows."""
    items = [(body.template, body.sql, 0.0), *((n.template, n.sql, n.offset_s) for n in body.neighbours)]
    zero = min(offset for _, _, offset in items)
    return [{"template": name, "sql": sql, "cluster_size": body.cluster_size, "cluster_id": "what-if",
             "arrival_s": offset - zero, "catalog": body.catalog, "schema": body.schema_}
            for name, sql, offset in items]


def _batch_rows(body: PredictBody) -> list[dict[str, Any]]:
    """A batch's queries as rows; a query without a cluster id runs alone."""
    return [{"template": q.template, "sql": q.sql, "cluster_size": q.cluster_size,
             "cluster_id": q.cluster_id if q.cluster_id is not None else f"alone-{i}", "arrival_s": q.arrival_s,
             "catalog": q.catalog, "schema": q.schema_} for i, q in enumerate(body.queries)]


def _predict_frame(rt: Runtime, kind: str, predictor: Any, queries: list[dict[str, Any]]) -> Any:
    """The log-shaped frame of ``queries``: features from the template table, or from SQL text as training
    built them; a model that cannot read SQL refuses it with what to train (422, field ``sql``)."""
    import pandas as pd

    from sloctl.core.errors import FeatureError
    from sloctl.models.predictor import queries_frame

    rows = pd.DataFrame(queries)
    try:
        frame = queries_frame(rows, rt.templates_for(kind), source="request", sql=predictor.sql_features)
        predictor.check_features(frame)
    except FeatureError as exc:
        raise RequestRefused(str(exc), status=422, field="sql") from None
    except ValueError as exc:
        raise RequestRefused(str(exc).removeprefix("request: "), status=422, field="queries") from None
    return frame


def _status_html(rt: Runtime) -> str:
    view = rt.clusters_view()
    esc = html.escape
    cluster_rows = "".join(
        f"<tr><td>{esc(c['cluster_id'])}</td><td>{c['size']}</td><td>{len(c['running'])}</td>"
        f"<td>{c['accrued_cost']:.1f}</td></tr>" for c in view["clusters"])
    def predicted(d: dict) -> str:
        return "" if d["predicted_s"] is None else f"{d['predicted_s']:.3f}"

    decision_rows = "".join(
        f"<tr><td>{d['t']:.2f}</td><td>{d['query_id']}</td><td>{esc(str(d['template']))}</td>"
        f"<td>{esc(d['cluster_id'])}</td><td>{esc(d['model'])}</td><td>{predicted(d)}</td></tr>"
        for d in reversed(rt.decisions))
    points = list(rt.history)
    svg = _sparkline([p["vr"] for p in points], "VR") + _sparkline([p["cost"] for p in points], "cost")
    models = "".join(f"<li>{esc(n)}: {esc(s.uri)} v{esc(str(s.version))}"
                     f"{' — ' + esc(s.error) if s.error else ''}</li>" for n, s in rt.slots.items())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>sloctl</title>"
            f"<meta http-equiv='refresh' content='5'><style>body{{font-family:sans-serif;margin:2em}}"
            f"td,th{{padding:2px 10px;text-align:right}}</style></head><body>"
            f"<h1>sloctl controller runtime</h1><p>router: <b>{esc(view['model'])}</b>; completed "
            f"{view['completed']}; violation rate {view['violation_rate']:.3f}; total cost "
            f"{view['total_cost']:.1f}</p><ul>{models}</ul>"
            f"<h2>Clusters</h2><table><tr><th>cluster</th><th>size</th><th>running</th><th>cost</th></tr>"
            f"{cluster_rows}</table><h2>VR and cost over time</h2>{svg}"
            f"<h2>Recent decisions</h2><table><tr><th>t (s)</th><th>query</th><th>template</th><th>cluster</th>"
            f"<th>model</th><th>predicted (s)</th></tr>{decision_rows}</table></body></html>")


def _sparkline(values: list[float], label: str, width: int = 400, height: int = 60) -> str:
    if len(values) < 2:
        return f"<p>{label}: not enough completions yet</p>"
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    pts = " ".join(f"{i * width / (len(values) - 1):.1f},{height - (v - lo) / span * height:.1f}"
                   for i, v in enumerate(values))
    return (f"<p>{label} ({lo:.3g} – {hi:.3g})</p><svg width='{width}' height='{height}'>"
            f"<polyline fill='none' stroke='black' points='{pts}'/></svg>")
