"""The gateway's HTTP face: the Trino client REST protocol on FastAPI (see :mod:`sloctl.serving._gateway_trino`).

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
import time
import urllib.parse
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from sloctl.serving._gateway_trino import column, error_doc, stats_doc

__all__ = ["create_gateway_app", "parse_session"]


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


def create_gateway_app(gateway: Any) -> Any:
    """A FastAPI app serving ``gateway`` (a started :class:`~sloctl.serving.gateway.Gateway`)."""
    app = FastAPI(title="sloctl SLO gateway (Trino protocol)", version="1")
    started = time.time()

    def bad(message: str, field: str, status: int = 400) -> JSONResponse:
        return JSONResponse({"error": message, "field": field}, status_code=status)

    def uri(request: Request, path: str) -> str:
        return str(request.base_url).rstrip("/") + path

    def document(request: Request, q: Any, page: int = 0) -> dict[str, Any]:
        """The ``QueryResults`` document of ``q`` now: its state, or result page ``page``, or its error."""
        now = gateway.now_s()
        end = q.end_s if q.end_s is not None else now
        placed = q.attempts[0]["arrival_s"] if q.attempts else end
        extra = {"class": q.klass, "template": q.template, "slo_s": q.slo_s, "outcome": q.outcome,
                 "attempts": len(q.attempts), "cluster_id": q.attempts[-1]["cluster_id"] if q.attempts else None,
                 "router": gateway.router_kind()}
        state = q.state
        rows = q.data or []
        size = gateway.options.page_rows
        more = state == "FINISHED" and (page + 1) * size < len(rows)
        doc: dict[str, Any] = {"id": q.query_id, "infoUri": uri(request, f"/v1/query/{q.query_id}"),
                               "stats": stats_doc("RUNNING" if more else state,
                                                  elapsed_ms=int(1000 * (end - q.submitted_s)),
                                                  queued_ms=int(1000 * max(0.0, placed - q.submitted_s)),
                                                  rows=len(rows), extra=extra),
                               "warnings": []}
        if state == "FAILED":
            doc["error"] = error_doc(q.error)
        elif state == "FINISHED":
            doc["columns"] = [column(name, kind) for name, kind in (q.columns or [])]
            doc["data"] = rows[page * size:(page + 1) * size]
            if more:  # token t >= 1 is page t - 1
                doc["nextUri"] = uri(request, f"/v1/statement/executing/{q.query_id}/{q.slug}/{page + 2}")
        else:
            phase = "queued" if state == "QUEUED" else "executing"
            doc["nextUri"] = uri(request, f"/v1/statement/{phase}/{q.query_id}/{q.slug}/0")
        return doc

    @app.post("/v1/statement")
    async def statement(request: Request) -> Any:
        sql = (await request.body()).decode("utf-8", errors="replace").strip()
        if not sql:
            return bad("SQL statement is empty", "body")
        user = request.headers.get("x-trino-user") or request.headers.get("x-presto-user")
        if not user:
            return bad("The X-Trino-User header is required (the Trino client sends it).", "x-trino-user")
        try:
            session = parse_session(request.headers.get("x-trino-session"))
        except ValueError as exc:
            return bad(str(exc), "x-trino-session")
        tags = [t.strip() for t in (request.headers.get("x-trino-client-tags") or "").split(",") if t.strip()]
        slo_header = request.headers.get("x-sloctl-slo-s")
        slo_s = None
        if slo_header is not None:
            try:
                slo_s = float(slo_header)
            except ValueError:
                return bad(f"The X-Sloctl-Slo-S header must be a number of seconds > 0, got {slo_header!r}.",
                           "x-sloctl-slo-s")
        try:
            q = gateway.submit(sql, user=user, tags=tags,
                               source=request.headers.get("x-trino-source"), session=session, slo_s=slo_s)
        except ValueError as exc:
            field = "x-sloctl-slo-s" if slo_header is not None else "x-trino-session"
            return bad(str(exc), field)
        return document(request, q)

    async def wait(q: Any) -> None:
        deadline = time.monotonic() + gateway.options.max_wait_s
        while not q.done.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    @app.get("/v1/statement/{phase}/{query_id}/{slug}/{token}")
    async def next_page(phase: str, query_id: str, slug: str, token: int, request: Request) -> Any:
        q = gateway.get(query_id)
        if q is None or q.slug != slug:
            return bad(f"unknown query {query_id!r} (finished results are kept {gateway.options.result_ttl_s:g} s)",
                       "query_id", 404)
        if token < 0:
            return bad(f"the page token must be >= 0, got {token}", "token")
        if token == 0:  # a poll: wait for news, then the state or the first page
            await wait(q)
        return document(request, q, max(0, token - 1))

    @app.delete("/v1/statement/{phase}/{query_id}/{slug}/{token}")
    async def cancel(phase: str, query_id: str, slug: str, token: int) -> Response:
        q = gateway.get(query_id)
        if q is None or q.slug != slug:
            return bad(f"unknown query {query_id!r}", "query_id", 404)
        gateway.cancel(query_id)
        return Response(status_code=204)

    @app.get("/v1/query/{query_id}")
    async def query_info(query_id: str) -> Any:
        q = gateway.get(query_id)
        if q is None:
            return bad(f"unknown query {query_id!r}", "query_id", 404)
        return q.summary()

    @app.get("/v1/info")
    async def info() -> Any:
        return {"nodeVersion": {"version": "sloctl-gateway"}, "environment": "sloctl", "coordinator": True,
                "starting": False, "uptime": f"{time.time() - started:.0f}s"}

    @app.get("/v1/gateway")
    async def status() -> Any:
        return gateway.status()

    @app.get("/healthz")
    async def healthz() -> Any:
        return {"ok": True}

    @app.get("/readyz")
    async def readyz() -> Any:
        view = gateway.status()
        ready = any(c["ready"] for c in view["clusters"])
        return JSONResponse({"ready": ready, "router": view["router"], "model": view["model"],
                             "slots": view["slots"]}, status_code=200 if ready else 503)

    return app
