"""``sloctl serve``: the controller runtime over HTTP (FastAPI).

Endpoints (all JSON; mutating ones need ``Authorization: Bearer TOKEN``):

* ``POST /v1/predict`` — a query's latency on a cluster size given neighbours;
* ``POST /v1/route`` / ``POST /v1/complete`` — the Query Router and its feedback;
* ``GET /v1/clusters`` — the pool, running queries, accrued cost;
  ``PUT`` / ``DELETE /v1/clusters/{id}`` — a cluster spun up or retired (e.g. by the autoscaler);
* ``POST /v1/admit`` / ``POST /v1/release`` — admission decisions (credits);
* ``GET /v1/retry-policy`` and ``GET /v1/retry-policy/envoy?service=S`` — retry budgets;
* ``GET /v1/execution-config`` — the Policy Tuner's scheduled spin-ups and autoscaler knobs, what of it is
  in force, the next scheduled spin-up and those enacted (the runtime enacts it, ``docs/serving.md``);
* ``GET /metrics``, ``GET /healthz``, ``GET /readyz``, and ``GET /`` (status page).

Bad bodies get 422 with FastAPI's JSON naming the field; refused requests a
4xx with ``{"error": ..., "field": ...}``. The app protects itself with the
same :class:`~sloctl.serving.admission.AdmissionMiddleware` it offers users.
"""

from __future__ import annotations

import html
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from sloctl.control.credits import CreditController
from sloctl.serving.admission import AdmissionMiddleware, AdmissionSettings
from sloctl.serving.envoy import envoy_route_config
from sloctl.serving.runtime import Runtime, RuntimeError_

__all__ = ["create_app"]


class Neighbour(BaseModel):
    template: str = Field(min_length=1, max_length=200)
    offset_s: float = Field(ge=-86400, le=86400, description="Arrival relative to the query (negative: before).")


class PredictBody(BaseModel):
    template: str = Field(min_length=1, max_length=200)
    cluster_size: int = Field(ge=1, le=1024)
    neighbours: list[Neighbour] = Field(default_factory=list, max_length=256)


class RouteBody(BaseModel):
    query_id: int = Field(ge=0, le=2**62)
    template: str = Field(min_length=1, max_length=200)
    slo_s: float = Field(gt=0, le=86400)


class CompleteBody(BaseModel):
    query_id: int = Field(ge=0, le=2**62)
    latency_s: float = Field(ge=0, le=86400)
    status: Literal["ok", "failed", "timeout"] = "ok"


class ClusterBody(BaseModel):
    size: int = Field(ge=1, le=1024)


class AdmitBody(BaseModel):
    klass: str = Field(default="high", alias="class", min_length=1, max_length=64)
    budget_ms: float = Field(default=1000.0, gt=0, le=86_400_000)


class ReleaseBody(BaseModel):
    klass: str = Field(default="high", alias="class", min_length=1, max_length=64)
    ok: bool = True
    within_slo: bool = True


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


def _error(status: int, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, **({"field": field} if field else {})}, status_code=status)


def create_app(cfg: Any, *, token: str | None, templates: Any = None, state_db: str | None = None,
               watch: bool = True, clock: Any = None) -> Any:
    """The ASGI app (wrapped in the self-protecting admission middleware).

    Args:
        cfg: the :class:`~sloctl.config.SloctlConfig`.
        token: bearer token for mutating endpoints (None: no auth, for local experiments only).
        templates: plan features per template (see :func:`~sloctl.serving.runtime.load_templates_table`).
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
        holder["runtime"] = Runtime(cfg, templates, state_db or cfg.serve.state_db, clock=clock or time.time)
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

    app = FastAPI(title="sloctl controller runtime", version="0.1.0", lifespan=lifespan)

    async def require_token(authorization: str | None = Header(default=None)) -> None:
        if token is None:
            return
        if authorization != f"Bearer {token}":
            raise _Unauthorized()

    @app.exception_handler(RuntimeError_)
    async def refused(request: Request, exc: RuntimeError_) -> JSONResponse:
        return _error(exc.status, str(exc), exc.field)

    @app.exception_handler(_Unauthorized)
    async def unauthorized(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": "missing or wrong bearer token", "field": "authorization"}, status_code=401,
                            headers={"www-authenticate": "Bearer"})

    @app.post("/v1/predict")
    def predict(body: PredictBody) -> dict[str, Any]:
        rt = runtime()
        kind = rt.latency_model()
        if kind == "round-robin":
            metrics.decisions.labels("predict", "no_model").inc()
            return {"latency_s": None, "isolated_latency_s": None, "model": None, "fallback": True,
                    "note": "no latency model is loaded (or no template table: no templates_log and none in "
                            "the model bundle); nothing to predict with"}
        for name in [body.template, *(n.template for n in body.neighbours)]:
            rt.check_template(name, kind)
        frame = _what_if(rt.templates_for(kind), body)
        predictor = rt.slots[kind].value
        latency = float(predictor.predict(frame, neighbours="all")[0])
        metrics.decisions.labels("predict", "ok").inc()
        return {"latency_s": latency, "isolated_latency_s": float(predictor.stage.predict(frame)[0]), "model": kind,
                "model_version": rt.slots[kind].version, "fallback": kind != "iconq"}

    @app.post("/v1/route", dependencies=[Depends(require_token)])
    def route(body: RouteBody) -> dict[str, Any]:
        out = runtime().route(body.query_id, body.template, body.slo_s)
        metrics.decisions.labels("route", out["model"]).inc()
        return out

    @app.post("/v1/complete", dependencies=[Depends(require_token)])
    def complete(body: CompleteBody) -> dict[str, Any]:
        rt = runtime()
        out = rt.complete(body.query_id, body.latency_s, body.status)
        view = rt.clusters_view()
        metrics.violations.set(view["violation_rate"])
        metrics.cost.set(view["total_cost"])
        metrics.decisions.labels("complete", "violated" if out["violated"] else "met").inc()
        return out

    @app.get("/v1/clusters")
    def clusters() -> dict[str, Any]:
        return runtime().clusters_view()

    @app.put("/v1/clusters/{cluster_id}", dependencies=[Depends(require_token)])
    def put_cluster(body: ClusterBody, cluster_id: str = Path(min_length=1, max_length=64,
                                                               pattern=r"^[A-Za-z0-9_.-]+$")) -> dict[str, Any]:
        return runtime().put_cluster(cluster_id, body.size)

    @app.delete("/v1/clusters/{cluster_id}", dependencies=[Depends(require_token)])
    def delete_cluster(cluster_id: str = Path(min_length=1, max_length=64,
                                             pattern=r"^[A-Za-z0-9_.-]+$")) -> dict[str, Any]:
        return runtime().delete_cluster(cluster_id)

    # Admission is on the hot path of every protected request: async handlers (no worker-thread hop) and a
    # lock of its own, never the router's (which a routing decision holds for milliseconds).
    @app.post("/v1/admit", dependencies=[Depends(require_token)])
    async def admit(body: AdmitBody) -> dict[str, Any]:
        rt = runtime()
        with rt.admission_lock:
            _check_class(rt, body.klass)
            now = rt.now_s()
            admitted = rt.admission.try_acquire(body.klass, now)
            credits, in_flight = rt.admission.credits, rt.admission.in_flight
        metrics.decisions.labels("admit", "admitted" if admitted else "dropped").inc()
        return {"admitted": admitted, "class": body.klass, "credits": credits, "in_flight": in_flight,
                "policy": rt.admission_source, **({} if admitted else {"retry_after_s": 1})}

    @app.post("/v1/release", dependencies=[Depends(require_token)])
    async def release(body: ReleaseBody) -> dict[str, Any]:
        rt = runtime()
        with rt.admission_lock:
            _check_class(rt, body.klass)
            if rt.admission.in_flight_of(body.klass) <= 0:
                raise RuntimeError_(f"class {body.klass!r} holds no credit to release", status=409, field="class")
            rt.admission.release(body.klass, rt.now_s(), ok=body.ok, within_slo=body.within_slo)
            return {"released": True, "class": body.klass, "in_flight": rt.admission.in_flight}

    @app.get("/v1/retry-policy")
    def retry_policy() -> Any:
        rt = runtime()
        slot = rt.slots["retry"]
        if slot.value is None:
            return _error(404, f"no retry policy registered at {slot.uri} (run `sloctl retry optimise`)")
        doc = slot.value.to_doc()  # a RetryPolicy
        return {"retries": doc["retries"], "predicted": doc["predicted"], "source": f"{slot.uri} v{slot.version}"}

    @app.get("/v1/retry-policy/envoy")
    def retry_policy_envoy(service: str = Query(min_length=1, max_length=200)) -> Any:
        rt = runtime()
        slot = rt.slots["retry"]
        if slot.value is None:
            return _error(404, f"no retry policy registered at {slot.uri} (run `sloctl retry optimise`)")

        try:
            return envoy_route_config(slot.value, service=service)
        except ValueError as exc:
            return _error(422, str(exc), "service")

    @app.get("/v1/execution-config")
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
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/readyz")
    def readyz() -> Any:
        rt = holder.get("runtime")
        if rt is None:
            return _error(503, "starting")
        return {"ready": True, "router": rt.router_kind, "router_guard": rt.guard_summary(),
                "models": {n: s.status() for n, s in rt.slots.items()}}

    @app.get("/", response_class=HTMLResponse)
    def status_page() -> str:
        return _status_html(runtime())

    credits = CreditController(initial_credits=cfg.serve.max_in_flight, min_credits=cfg.serve.max_in_flight,
                               max_credits=cfg.serve.max_in_flight)
    protected = AdmissionMiddleware(app, credits, AdmissionSettings(
        classes=("high", "low"), default_class="high", default_budget_ms=10_000.0,
        exempt_paths=("/healthz", "/readyz", "/metrics", "/", "/openapi.json", "/docs"), concurrency=8))
    protected.fastapi = app  # the inner app, for OpenAPI and tests
    return _Timed(protected, metrics)


class _Unauthorized(Exception):
    pass


class _Timed:
    """Plain ASGI wrapper recording each request's server-side latency (cheaper than a Starlette middleware)."""

    def __init__(self, app: Any, metrics: _Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.fastapi = app.fastapi

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            path = scope.get("path", "")
            label = path if path.startswith("/v1/") and not path.startswith("/v1/clusters/") else "other"
            self.metrics.latency.labels(label).observe(time.perf_counter() - started)


def _check_class(rt: Runtime, klass: str) -> None:
    known = [c.name for c in rt.admission.classes] if rt.admission.classes else None
    if known and klass not in known:
        raise RuntimeError_(f"unknown class {klass!r} (classes: {', '.join(known)})", field="class")


def _what_if(templates: Any, body: PredictBody) -> Any:
    """A log-shaped frame: the query at 0 and its neighbours at their offsets, all on one cluster."""
    import pandas as pd

    by_name = templates.set_index("template", drop=False)
    items = [(body.template, 0.0), *((n.template, n.offset_s) for n in body.neighbours)]
    zero = min(offset for _, offset in items)
    rows = []
    for i, (name, offset) in enumerate(items):
        row = by_name.loc[name].to_dict()
        row.update(query_id=i, cluster_id="what-if", cluster_size=body.cluster_size, arrival_s=offset - zero,
                   start_s=offset - zero, end_s=float("nan"))
        rows.append(row)
    return pd.DataFrame(rows)


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
