"""The gateway's HTTP face: the Trino client REST protocol on FastAPI (see :mod:`sloctl.serving.gateway.trino`).

``POST /v1/statement`` admits the query (:meth:`~sloctl.serving.gateway.Gateway.submit`)
and answers at once; the client then follows ``nextUri``. Each ``GET`` waits
up to ``max_wait_s`` for the query to change, then answers its state, or
its columns and a page of rows, or its error. ``DELETE`` on a ``nextUri``
cancels it. ``GET /v1/gateway`` shows the gateway's own state (clusters,
router in force, policy, counts, queues); ``GET /v1/query/{id}`` one query's
attempts.

Errors of the request itself (no SQL, no user, a bad SLO) answer ``400``
with ``{"error", "field"}``, as the runtime does; errors of the query are
Trino error documents, which the client raises as ``TrinoQueryError`` /
``TrinoUserError`` naming the Trino error (``QUERY_QUEUE_FULL``, ...).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import time
import urllib.parse
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from sloctl.core.errors import ClusterPoolError
from sloctl.serving.gateway.backends import backend_from_doc
from sloctl.serving.gateway.dialect import Session, parse_prepared
from sloctl.serving.gateway.trino import column, error_doc, stats_doc, trino_column

__all__ = ["FIRST_ANSWER_WAIT_S", "create_gateway_app", "parse_session", "render_metrics"]

#: How long ``POST /v1/statement`` waits for the first page or the end before it answers (seconds).
FIRST_ANSWER_WAIT_S = 0.05
#: How long a poll that has its page waits for the query's end before it answers (seconds).
END_GRACE_S = 0.002


def parse_session(header: str | None) -> dict[str, str]:
    """``X-Trino-Session: a=1,b=x%2Cy`` → ``{"a": "1", "b": "x,y"}``.

    Raises:
        ValueError: an entry is not ``name=value``.
    """
    out: dict[str, str] = {}
    for part in (header or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(f"The X-Trino-Session header must hold name=value pairs, got {part!r}.")
        name, value = part.split("=", 1)
        out[urllib.parse.unquote(name.strip())] = urllib.parse.unquote(value.strip())
    return out


async def _read_body(request: Request, limit_bytes: int) -> bytes | None:
    """The body, or ``None`` once it is longer than ``limit_bytes`` (never read past the limit)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def create_gateway_app(gateway: Any, auth: Any = None) -> Any:
    """A FastAPI app serving ``gateway`` (a started :class:`~sloctl.serving.gateway.Gateway`).

    Args:
        gateway: the gateway.
        auth: a :class:`~sloctl.serving.gateway.auth.GatewayAuth` (password
            file and/or JWT); ``None``: no authentication, the user is the
            ``X-Trino-User`` header (``sloctl gateway`` allows that on loopback only).
    """
    from sloctl.serving.gateway.auth import AuthError, GatewayAuth, may_read

    app = FastAPI(title="sloctl SLO gateway (Trino protocol)", version="1")
    started = time.time()
    auth = auth if auth is not None else GatewayAuth.off()

    def bad(message: str, field: str, status: int = 400, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)

    async def principal_of(request: Request) -> Any:
        """The authenticated principal, or a 401/403/400 response.

        A password check (bcrypt, tens of milliseconds) runs on a worker
        thread, never on the event loop that serves every other client.
        """
        check = functools.partial(auth.authenticate, request.headers.get("authorization"),
                                  trino_user=request.headers.get("x-trino-user")
                                  or request.headers.get("x-presto-user"),
                                  secure=request.url.scheme == "https")
        try:
            return await run_in_threadpool(check) if auth.enabled else check()
        except AuthError as exc:  # 401 (credentials), 403 (impersonation, plain HTTP), 400 (no user)
            return bad(exc.message, exc.field or "authorization", exc.status, exc.headers())

    async def owned(request: Request, query_id: str, slug: str | None = None) -> Any:
        """``(principal, query)`` when the caller may see the query, else an error response (404: never say whose)."""
        principal = await principal_of(request)
        if isinstance(principal, Response):
            return principal
        q = gateway.get(query_id)
        if q is None or (slug is not None and q.slug != slug) or not may_read(principal, q.user):
            return bad(f"unknown query {query_id!r} (finished results are kept {gateway.options.result_ttl_s:g} s)",
                       "query_id", 404)
        return principal, q

    def uri(request: Request, path: str) -> str:
        return str(request.base_url).rstrip("/") + path

    def document(request: Request, q: Any, index: int) -> tuple[dict[str, Any], str | None]:
        """The ``QueryResults`` document of ``q`` now: its state, result page ``index`` (JSON text), or its error.

        Reading page ``index`` frees the pages before it at the gateway and
        lets the worker send more (results stream, the buffer stays bounded).
        """
        now = gateway.now_s()
        rows = gateway.page(q, index)
        done = q.done.is_set()
        end = q.end_s if q.end_s is not None else now
        placed = q.attempts[0]["arrival_s"] if q.attempts else end
        extra = {"class": q.klass, "template": q.template, "slo_s": q.slo_s if math.isfinite(q.slo_s) else None,
                 "outcome": q.outcome,
                 "attempts": len(q.attempts), "cluster_id": q.attempts[-1]["cluster_id"] if q.attempts else None,
                 "router": gateway.router_kind()}
        next_index = index + 1 if rows is not None else index
        # a finished query whose pages were all read (or freed) has no more to give, whatever the index asked
        more = q.state != "FAILED" and (not done or (next_index < q.pages_received and (rows is not None or q.pages)))
        state = q.state if not more else ("QUEUED" if q.state == "QUEUED" else "RUNNING")
        doc: dict[str, Any] = {"id": q.query_id, "infoUri": uri(request, f"/v1/query/{q.query_id}"),
                               "stats": stats_doc(state, elapsed_ms=int(1000 * (end - q.submitted_s)),
                                                  queued_ms=int(1000 * max(0.0, placed - q.submitted_s)),
                                                  rows=q.rows, extra=extra),
                               "warnings": []}
        if q.state == "FAILED":
            doc["error"] = error_doc(q.error)
            return doc, None
        if q.columns is not None:
            render = trino_column if q.trino_types else column  # a trino backend's types are Trino's already
            doc["columns"] = [render(name, kind) for name, kind in q.columns]
        if more:  # token t >= 1 asks for page t - 1
            phase = "queued" if state == "QUEUED" else "executing"
            doc["nextUri"] = uri(request, f"/v1/statement/{phase}/{q.query_id}/{q.slug}/{next_index + 1}")
        return doc, None if rows is None else rows.json

    def respond(request: Request, q: Any, index: int) -> Response:
        """The document as JSON; the rows go in as the worker wrote them (never decoded at the gateway)."""
        doc, data = document(request, q, index)
        body = json.dumps(doc, allow_nan=False)
        if data is not None:
            body = f'{body[:-1]}, "data": {data}}}'
        return Response(body, media_type="application/json", headers=dict(q.headers))

    @app.post("/v1/statement")
    async def statement(request: Request) -> Any:
        principal = await principal_of(request)
        if isinstance(principal, Response):
            return principal
        limit = gateway.options.max_query_length
        body = await _read_body(request, 4 * limit)  # UTF-8: at most 4 bytes a character
        if body is None or len(text := body.decode("utf-8", errors="replace")) > limit:
            return bad(f"The query text is longer than the gateway's limit of {limit} characters "
                       "(max_query_length, Trino's query.max-length).", "body", 413)
        sql = text.strip()
        if not sql:
            return bad("SQL statement is empty", "body")
        try:
            session = parse_session(request.headers.get("x-trino-session"))
        except ValueError as exc:
            return bad(str(exc), "x-trino-session")
        try:
            prepared = parse_prepared(request.headers.get("x-trino-prepared-statement"))
        except ValueError as exc:
            return bad(str(exc), "x-trino-prepared-statement")
        trino = Session(catalog=(request.headers.get("x-trino-catalog") or "").lower() or None,
                        schema=(request.headers.get("x-trino-schema") or "").lower() or None, prepared=prepared,
                        user=principal.user or "", admin=bool(principal.is_admin))
        tags = [t.strip() for t in (request.headers.get("x-trino-client-tags") or "").split(",") if t.strip()]
        slo_header = request.headers.get("x-sloctl-slo-s")
        slo_s = None
        if slo_header is not None:
            try:
                slo_s = float(slo_header)
            except ValueError:
                return bad(f"The X-Sloctl-Slo-S header must be a number of seconds > 0, got {slo_header!r}.",
                           "x-sloctl-slo-s")
        # what a trino backend gets: the client's X-Trino-* headers, the user the gateway authenticated
        forward = {k: v for k, v in request.headers.items() if k.lower().startswith("x-trino-")
                   and k.lower() not in ("x-trino-user", "x-trino-original-user", "x-trino-routing-group")}
        forward["X-Trino-User"] = principal.user or "sloctl"
        group = request.headers.get("x-trino-routing-group") or None
        # the text is parsed and translated in a planner process, waited for on a worker thread: a text whose
        # planning is slow (or aimed at a parser's worst case) never holds the event loop that serves the others
        verdict = await run_in_threadpool(gateway.plan_text, sql, trino)
        postgres = await run_in_threadpool(gateway.postgres_text_of, sql, verdict)
        try:
            q = gateway.submit(sql, user=principal.user, tags=tags,
                               source=request.headers.get("x-trino-source"), session=session, slo_s=slo_s,
                               trino=trino, forward=forward, group=group, verdict=verdict, postgres=postgres)
        except ValueError as exc:
            field = "x-sloctl-slo-s" if slo_header is not None else "x-trino-session"
            return bad(str(exc), field)
        # a query that ends quickly answers in this first document (one round trip, as a Trino client allows)
        await wait(q, 0, min(gateway.options.max_wait_s, FIRST_ANSWER_WAIT_S))
        return respond(request, q, 0)

    async def wait(q: Any, index: int, limit_s: float) -> None:
        """Until page ``index`` is there or the query ended, at most ``limit_s``.

        Looks often at first (a short query answers within a millisecond or
        two), then every 5 ms. Once the page is there, a query that is about
        to end gets :data:`END_GRACE_S` more, so that its last document says
        so and the client needs no further round trip.
        """
        now = time.monotonic()
        deadline, pause, seen = now + limit_s, 0.0002, None
        while not q.done.is_set() and now < deadline:
            if index in q.pages:
                seen = seen if seen is not None else now
                if now - seen >= END_GRACE_S or len(q.pages) > 1:
                    return
            await asyncio.sleep(pause)
            pause = min(0.005, pause * 1.5)
            now = time.monotonic()

    @app.get("/v1/statement/{phase}/{query_id}/{slug}/{token}")
    async def next_page(phase: str, query_id: str, slug: str, token: int, request: Request) -> Any:
        found = await owned(request, query_id, slug)
        if isinstance(found, Response):
            return found
        _, q = found
        if token < 0:
            return bad(f"the page token must be >= 0, got {token}", "token")
        gateway.touch(q)
        index = max(0, token - 1)
        await wait(q, index, gateway.options.max_wait_s)
        return respond(request, q, index)

    @app.delete("/v1/statement/{phase}/{query_id}/{slug}/{token}")
    async def cancel(phase: str, query_id: str, slug: str, token: int, request: Request) -> Response:
        found = await owned(request, query_id, slug)
        if isinstance(found, Response):
            return found
        gateway.cancel(query_id)
        return Response(status_code=204)

    @app.get("/v1/query")
    async def query_list(request: Request, state: str | None = None, limit: int = 100) -> Any:
        """The caller's queries (an admin's: everyone's), newest first, as Trino's query list; ``?state=RUNNING``."""
        principal = await principal_of(request)
        if isinstance(principal, Response):
            return principal
        if not 1 <= limit <= 10_000:
            return bad(f"limit must be in [1, 10000], got {limit}", "limit")
        if state is not None and state.upper() not in ("QUEUED", "RUNNING", "FINISHED", "FAILED"):
            return bad(f"state must be QUEUED, RUNNING, FINISHED or FAILED, got {state!r}", "state")
        found = [q for q in list(gateway.queries.values())
                 if may_read(principal, q.user) and (state is None or q.state == state.upper())]
        live = [{"queryId": q.query_id, "state": q.state, "query": q.text or q.sql,
                 "user": q.user, "queryClass": q.klass, "template": q.template, "outcome": q.outcome,
                 "errorName": q.error.name if q.error is not None else None, "rows": q.rows,
                 "elapsedTimeMillis": int(1000 * ((q.end_s if q.end_s is not None else gateway.now_s())
                                                  - q.submitted_s)),
                 "submitted": gateway.wall_base + q.submitted_s, "attempts": len(q.attempts),
                 "self": uri(request, f"/v1/query/{q.query_id}")}
                for q in sorted(found, key=lambda q: q.submitted_s, reverse=True)[:limit]]
        # the history holds what the gateway no longer does (older queries, queries of an earlier run)
        mine = None if principal.is_admin else principal.user
        held = {d["queryId"] for d in live}
        stored = await run_in_threadpool(gateway.history_rows, user=mine, state=state and state.upper(),
                                         limit=limit)
        old = [{"queryId": r["query_id"], "state": r["state"], "query": r.get("sql"), "user": r.get("user"),
                "queryClass": r.get("class"), "template": r.get("template"), "outcome": r.get("outcome"),
                "errorName": r.get("error_name"), "rows": r.get("rows"),
                "elapsedTimeMillis": None if r.get("elapsed_s") is None else int(1000 * r["elapsed_s"]),
                "submitted": r["submitted_at"].timestamp() if r.get("submitted_at") else None,
                "attempts": len(r.get("attempts") or []), "self": uri(request, f"/v1/query/{r['query_id']}")}
               for r in stored if r["query_id"] not in held]
        return sorted(live + old, key=lambda d: d["submitted"] or 0.0, reverse=True)[:limit]

    @app.get("/v1/query/{query_id}")
    async def query_info(query_id: str, request: Request) -> Any:
        if gateway.get(query_id) is None and gateway.history is not None:  # an earlier run's, or expired here
            principal = await principal_of(request)
            if isinstance(principal, Response):
                return principal
            row = await run_in_threadpool(gateway.history.get, query_id)
            if row is not None and may_read(principal, row.get("user") or ""):
                return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
        found = await owned(request, query_id)
        if isinstance(found, Response):
            return found
        return found[1].summary()

    @app.get("/v1/info")
    async def info() -> Any:
        return {"nodeVersion": {"version": "sloctl-gateway"}, "environment": "sloctl", "coordinator": True,
                "starting": False, "uptime": f"{time.time() - started:.0f}s"}

    async def admin(request: Request) -> Any:
        """The principal of an admin request, or the refusal; one rule per mode (docs/gateway.md).

        Authentication on: a user in ``--admin-user``, for every admin route.
        Off (loopback only): the read views ``GET /v1/gateway`` and ``GET
        /metrics`` stay open to any local user, and the backends (their list
        too: it names every engine address) and every write need the admin
        token the gateway wrote to ``LOG_DIR/admin.token``, sent as
        ``X-Sloctl-Admin-Token``.
        """
        from sloctl.serving.gateway.auth import ADMIN_TOKEN_HEADER, check_admin_token

        open_view = request.method == "GET" and request.url.path in ("/v1/gateway", "/metrics")
        if not auth.enabled and not open_view:
            try:
                check_admin_token(request.headers.get(ADMIN_TOKEN_HEADER), gateway.options.log_dir)
            except AuthError as exc:
                return bad(exc.message, exc.field or ADMIN_TOKEN_HEADER.lower(), exc.status, exc.headers())
            return auth.principal(request.headers.get("x-trino-user") or "admin")
        principal = await principal_of(request)
        if isinstance(principal, Response) or not auth.enabled or principal.is_admin:
            return principal
        return bad("This view is for the gateway's admin role.", "authorization", 403)

    @app.get("/v1/gateway")
    async def status(request: Request) -> Any:
        denied = await admin(request)
        if isinstance(denied, Response):
            return denied
        return gateway.status()

    @app.get("/v1/gateway/backends")
    async def backends_list(request: Request) -> Any:
        denied = await admin(request)
        if isinstance(denied, Response):
            return denied
        return gateway.backends_view()

    @app.post("/v1/gateway/backends")
    async def backends_add(request: Request) -> Any:
        """Add a backend (``{name, kind, size, url, group, options}``) or re-activate a drained one."""
        denied = await admin(request)
        if isinstance(denied, Response):
            return denied
        body = await _read_body(request, 64 * 1024)
        try:
            doc = json.loads(body or b"")
        except ValueError:
            return bad("The body must be a JSON backend entry {name, kind, size, url, group}.", "body")
        try:
            spec = backend_from_doc(doc, "backend")
            return await run_in_threadpool(gateway.add_backend, spec)
        except AuthError as exc:  # a URL outside the operator's allow-list
            return bad(exc.message, exc.field or "url", exc.status)
        except (ValueError, ClusterPoolError) as exc:
            return bad(str(exc), "body", 409 if "new or drained" in str(exc) else 400)

    @app.post("/v1/gateway/backends/{name}/drain")
    async def backends_drain(name: str, request: Request) -> Any:
        denied = await admin(request)
        if isinstance(denied, Response):
            return denied
        try:
            return gateway.drain_backend(name)
        except KeyError:
            return bad(f"unknown backend {name!r}", "name", 404)

    @app.delete("/v1/gateway/backends/{name}")
    async def backends_remove(name: str, request: Request) -> Any:
        """Drain ``name`` and forget it once nothing runs there (``state``: ``draining`` until then)."""
        denied = await admin(request)
        if isinstance(denied, Response):
            return denied
        try:
            return gateway.drain_backend(name, remove=True)
        except KeyError:
            return bad(f"unknown backend {name!r}", "name", 404)

    @app.get("/metrics")
    async def metrics(request: Request) -> Any:
        denied = await admin(request)
        if isinstance(denied, Response):
            return denied
        body = render_metrics(gateway.status()) + gateway.log.metrics_text().decode()  # the log's own counters
        return Response(body, media_type="text/plain; version=0.0.4")

    @app.get("/healthz")
    async def healthz() -> Any:
        return {"ok": True}

    @app.get("/readyz")
    async def readyz() -> Any:
        view = gateway.status()
        ready = any(c["ready"] for c in view["clusters"]) and not view["draining"]
        return JSONResponse({"ready": ready, "draining": view["draining"], "router": view["router"],
                             "model": view["model"]}, status_code=200 if ready else 503)

    return app


def render_metrics(view: dict[str, Any]) -> str:
    """The gateway's queries, queues, attempt latencies and clusters in Prometheus' text format (the log adds its
    own), written by ``prometheus_client`` from the ``/v1/gateway`` view."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    def families() -> Any:
        queries = CounterMetricFamily("sloctl_gateway_queries", "Queries by what happened to them.", labels=["event"])
        for name, value in view["counts"].items():
            queries.add_metric([name], value)
        yield queries
        outcomes = CounterMetricFamily("sloctl_gateway_query_outcomes", "Ended queries by class, Trino state and "
                                       "outcome (admitted, deferred, shed, session, or the Trino error name).",
                                       labels=["class", "state", "outcome"])
        for o in view.get("outcomes", []):
            outcomes.add_metric([o["class"], o["state"], o["outcome"]], o["queries"])
        yield outcomes
        queue = GaugeMetricFamily("sloctl_gateway_queue_length", "Queries deferred by the SLO gate, by class.",
                                  labels=["class"])
        for klass, n in view.get("waiting", {}).items():
            queue.add_metric([klass], n)
        yield queue
        yield GaugeMetricFamily("sloctl_gateway_queries_running", "Queries running on a cluster now.",
                                value=view.get("queries_running", 0))
        yield GaugeMetricFamily("sloctl_gateway_admission_active", "1 when admission acts on a loaded latency model.",
                                value=int(bool(view.get("admission_active"))))
        hist = view.get("attempt_latency")
        if hist:
            latency = HistogramMetricFamily("sloctl_gateway_attempt_seconds", "Attempt latency (placement to end), "
                                            "by status.", labels=["status"])
            for status, counts in hist["counts"].items():
                bounds = [*(repr(float(b)) for b in hist["bounds_s"]), "+Inf"]
                latency.add_metric([status], list(zip(bounds, counts, strict=True)), hist["sums_s"][status])
            yield latency
        ready = GaugeMetricFamily("sloctl_gateway_cluster_ready", "Each cluster: 1 taking queries, 0 starting or torn "
                                  "down.", labels=["cluster", "size"])
        running = GaugeMetricFamily("sloctl_gateway_cluster_running", "Attempts running on each cluster.",
                                    labels=["cluster"])
        for c in view["clusters"]:
            ready.add_metric([c["cluster_id"], str(c["size"])], int(bool(c["ready"])))
            running.add_metric([c["cluster_id"]], c["running"])
        yield from (ready, running)
        yield CounterMetricFamily("sloctl_gateway_worker_restarts", "Cluster workers replaced after they died.",
                                  value=view.get("restarts_total", 0))
        yield GaugeMetricFamily("sloctl_gateway_ready_clusters", "Clusters taking queries now.",
                                value=sum(bool(c["ready"]) for c in view["clusters"]))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(type("GatewayView", (), {"collect": staticmethod(families)})())
    return generate_latest(registry).decode()
