"""The runtime's front door: authenticate and bound every request before anything costly runs.

:class:`FrontDoor` is a plain ASGI wrapper that sits outside everything else
in :func:`sloctl.serving.runtime.app.create_app`. For each HTTP request, in order:

1. **Route.** The path is matched against the app's routes; the matched
   route's *template* (``/v1/clusters/{cluster_id}``) is the metrics label,
   so unknown paths cannot grow ``/metrics`` (they count as ``unmatched``).
2. **Auth.** A route that needs the bearer token and lacks it is answered
   401 at once: no body is read, no credit or queue slot is taken. The token
   is compared with :func:`hmac.compare_digest`.
3. **Lane.** An unauthenticated request to a public endpoint (``/v1/predict``,
   the ``GET`` views, unknown paths) takes a slot of the small public budget
   (``serve.public_max_in_flight``) before its body is read; with no slot
   free it gets 503 and the connection is closed. Authenticated work never
   waits for that budget.
4. **Body.** A declared ``content-length`` over ``serve.max_body_bytes`` gets
   413 before a byte is read; a body that grows past it while being read
   gets 413 too; a body not complete within ``serve.body_timeout_s`` gets 408.
   Error answers never echo the body, and close the connection.
5. **Self-protection.** Only then does authenticated work enter the
   self-protecting :class:`~sloctl.serving.runtime.admission.AdmissionMiddleware`
   (credits and the server AQM); work that frees resources
   (``/v1/complete``, ``/v1/release``) is never shed and skips it.

Every error answer is an RFC 9457 problem document (:func:`problem`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PROBLEM_JSON", "FrontDoor", "FrontSettings", "check_token", "problem", "send_problem"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PROBLEM_JSON = "application/problem+json"
MIN_TOKEN_LENGTH = 16

_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 413: "Content Too Large",
           422: "Unprocessable Content", 500: "Internal Server Error", 503: "Service Unavailable"}


def problem(status: int, detail: str, *, field: str | None = None, kind: str | None = None,
            **extensions: Any) -> dict[str, Any]:
    """An RFC 9457 problem document: ``type``, ``title``, ``status``, ``detail`` and extension members.

    ``type`` is ``urn:sloctl:problem:<kind>`` (default: the title in kebab case);
    ``field`` names the request field (body key, header, path parameter) at fault.
    """
    title = _TITLES.get(status, "Error")
    slug = kind or title.lower().replace(" ", "-")
    doc: dict[str, Any] = {"type": f"urn:sloctl:problem:{slug}", "title": title, "status": status, "detail": detail}
    if field is not None:
        doc["field"] = field
    doc.update(extensions)
    return doc


async def send_problem(send: Send, status: int, detail: str, *, close: bool = False,
                       headers: list[tuple[bytes, bytes]] | None = None, **fields: Any) -> None:
    """Answer a raw ASGI request with a problem document (``close``: ask the server to drop the connection)."""
    payload = json.dumps(problem(status, detail, **fields)).encode()
    out = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(payload)).encode()),
           *(headers or [])]
    if close:
        out.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": payload})


def check_token(token: str | None) -> str | None:
    """The bearer token, refused when it is blank or shorter than ``MIN_TOKEN_LENGTH`` characters."""
    if token is None:
        return None
    if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_LENGTH or token != token.strip():
        raise ValueError(f"The bearer token (SLOCTL_TOKEN or serve.token) must be at least {MIN_TOKEN_LENGTH} "
                         f"characters without surrounding whitespace, got {len(token or '')} characters "
                         "(try: openssl rand -hex 16).")
    return token


@dataclass(frozen=True)
class FrontSettings:
    """The limits of :class:`FrontDoor` (from the ``serve:`` section).

    Attributes:
        max_body_bytes: largest request body accepted (413 beyond).
        body_timeout_s: time allowed for a whole body to arrive (408 beyond).
        public_max_in_flight: unauthenticated requests in progress at once (503 beyond).
        exempt_paths: paths outside both budgets (health, readiness, metrics, status page, OpenAPI).
        unshed_paths: authenticated paths that free resources and are never shed.
        large_body_paths: paths whose authenticated callers may send up to
            ``large_body_bytes`` (a batch); strangers stay at ``max_body_bytes``.
    """

    max_body_bytes: int = 65536
    body_timeout_s: float = 5.0
    public_max_in_flight: int = 8
    exempt_paths: tuple[str, ...] = ("/healthz", "/readyz", "/metrics", "/", "/openapi.json")
    unshed_paths: tuple[str, ...] = ("/v1/complete", "/v1/release")
    large_body_paths: tuple[str, ...] = ()
    large_body_bytes: int = 65536


class _BodyTooLarge(Exception):
    pass


class FrontDoor:
    """ASGI wrapper: route, auth, lane, bounded body, then the protected or plain app (module docstring).

    Args:
        app: the inner app (FastAPI), called for public and exempt requests and unshed work.
        protected: the same app behind the self-protecting admission middleware (authenticated work).
        routes: the inner app's routes (matched here for the auth check and the metrics label).
        needs_auth: whether a matched route needs the bearer token.
        token: the bearer token (None: no auth, every request is authenticated work).
        settings: the limits.
        observe: ``observe(label, seconds)`` after every request (server-side latency by route template).
    """

    def __init__(self, app: Callable, protected: Callable, routes: list[Any], needs_auth: Callable[[Any], bool],
                 token: str | None, settings: FrontSettings, observe: Callable[[str, float], None]) -> None:
        self.app = app
        self.protected = protected
        self.routes = routes
        self.needs_auth = needs_auth
        self.expected = None if token is None else f"Bearer {token}".encode()
        self.settings = settings
        self.observe = observe
        self.public_in_flight = 0

    def _match(self, scope: Scope) -> Any:
        from starlette.routing import Match

        partial = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return route
            if match is Match.PARTIAL and partial is None:
                partial = route
        return partial

    def _authorized(self, scope: Scope) -> bool:
        if self.expected is None:
            return True
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                return hmac.compare_digest(value, self.expected)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        route = self._match(scope)
        label = getattr(route, "path", None) or "unmatched"
        try:
            await self._handle(scope, receive, send, route)
        finally:
            self.observe(label, time.perf_counter() - started)

    async def _handle(self, scope: Scope, receive: Receive, send: Send, route: Any) -> None:
        s = self.settings
        path = scope.get("path", "")
        authorized = self._authorized(scope)
        if route is not None and self.needs_auth(route) and not authorized:
            await send_problem(send, 401, "missing or wrong bearer token", field="authorization", close=True,
                               headers=[(b"www-authenticate", b"Bearer")])
            return
        limit = s.large_body_bytes if authorized and path in s.large_body_paths else s.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await send_problem(send, 413, f"the request body must be at most {limit} bytes, "
                               f"declared {declared}", field="body", close=True)
            return
        if path in s.exempt_paths:
            await self._run(self.app, scope, receive, send)
            return
        if not authorized:
            # an unauthenticated caller of a public endpoint: the small public budget, taken before the body is read
            if self.public_in_flight >= s.public_max_in_flight:
                await send_problem(send, 503, "too many unauthenticated requests in progress, retry later",
                                   kind="public-budget", close=True, retry_after_s=1,
                                   headers=[(b"retry-after", b"1")])
                return
            self.public_in_flight += 1
            try:
                await self._run(self.app, scope, receive, send, limit)
            finally:
                self.public_in_flight -= 1
            return
        inner = self.app if path in s.unshed_paths else self.protected
        await self._run(inner, scope, receive, send, limit)

    async def _run(self, app: Callable, scope: Scope, receive: Receive, send: Send,
                   limit: int | None = None) -> None:
        """Read the whole body (bounded in size and time), then hand the request to ``app``."""
        s = self.settings
        limit = s.max_body_bytes if limit is None else limit
        try:
            async with asyncio.timeout(s.body_timeout_s):
                body = await _read_body(receive, limit)
        except TimeoutError:
            await send_problem(send, 408, f"the request body did not arrive within {s.body_timeout_s:g} s",
                               field="body", close=True)
            return
        except _BodyTooLarge:
            await send_problem(send, 413, f"the request body must be at most {limit} bytes",
                               field="body", close=True)
            return
        if body is None:  # the client went away
            return
        sent = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
