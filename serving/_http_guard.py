"""Slow and greedy HTTP clients cannot hold a server's connections: a guarded h11 protocol for uvicorn.

uvicorn's h11 protocol has no request-head timeout and no body timeout, and
its only connection cap, ``limit_concurrency``, is shared by every client:
1,100 connections trickling a header byte a second made every authenticated
request of ``sloctl serve`` answer 503 (issue 33). :func:`guard_options`
gives both servers (``sloctl serve``, ``sloctl gateway``) a protocol that,
per connection:

1. **Head timeout.** A new connection must deliver a complete request head
   within ``header_timeout_s`` of being accepted (as nginx's
   ``client_header_timeout``); a later request on a kept-alive connection
   within ``header_timeout_s`` of its first byte. Beyond, it gets 408 (or
   nothing, when it sent nothing) and is closed.
2. **Body timeout.** A request body must be complete within
   ``body_timeout_s`` of its head; beyond, 408 (when no answer was started)
   and the connection is closed. The runtime's
   :class:`~sloctl.serving.front.FrontDoor` answers the same 408 when it reads
   the body; this deadline also holds for apps that never read it.
3. **Connection caps.** A new connection from a peer address that already
   holds ``max_connections_per_client`` is closed at once (peers in
   ``trusted_clients`` are exempt: a reverse proxy, local drivers), and so is
   one beyond ``max_connections`` open in all (below the descriptor limit,
   so ``accept`` itself never fails).
4. **Head size.** A request head longer than uvicorn's
   ``h11_max_incomplete_event_size`` (``serve.max_header_bytes``, 16 KiB by
   default) gets 431 and the connection is closed, whether it trickles in or
   arrives in one read (h11 itself only bounds a head it is still waiting
   for, so a 60 KB head sent at once would otherwise pass).
5. **Keep-alive** is uvicorn's own (``timeout_keep_alive``), untouched.

Nothing a single stranger can fill alone is shared with authenticated work,
so uvicorn's ``limit_concurrency`` (which answers *every* request 503 once
connections reach it) stays off; requests in progress are bounded by the app
(the front door's public lane and the admission middleware). What the guard
closed is counted by reason in :attr:`HttpGuard.closed`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import struct
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from sloctl.serving.front import PROBLEM_JSON, problem

__all__ = ["REASONS", "GuardSettings", "GuardedH11Protocol", "HttpGuard", "guard_options", "guarded_protocol",
           "raise_nofile_limit"]

#: why the guard closed a connection: no byte within the head timeout, an incomplete head, an incomplete
#: body, the peer's connection cap, the server's connection cap, a request head over the size limit
REASONS = ("idle", "header_timeout", "body_timeout", "per_client", "max_connections", "header_too_large")


class _BoundedHeadConnection(h11.Connection):
    """An h11 server connection that refuses a request head longer than ``max_head_bytes``, however it arrives.

    h11's ``max_incomplete_event_size`` is checked only while a head is
    incomplete: a head delivered whole in one read is parsed at any length.
    Before each event of a new request this looks at what is buffered: more
    than ``max_head_bytes`` with no blank line (the head's end) inside the
    limit is refused with h11's own error (status hint 431).
    """

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.head_too_large = False

    def next_event(self) -> Any:
        if self.their_state is h11.IDLE:
            data = self.trailing_data[0]
            limit = self.max_head_bytes
            if len(data) > limit and data.find(b"\n\r\n", 0, limit + 3) < 0 and data.find(b"\n\n", 0, limit + 2) < 0:
                self.head_too_large = True
                raise h11.RemoteProtocolError(f"request head longer than {limit} bytes", error_status_hint=431)
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.head_too_large = exc.error_status_hint == 431  # h11's own limit on an incomplete head
            raise


@dataclass(frozen=True)
class GuardSettings:
    """The limits of :class:`HttpGuard` (from the ``serve:`` section).

    Attributes:
        header_timeout_s: time a request head has to arrive in full (408 and close beyond).
        body_timeout_s: time a request body has after its head (408 and close beyond).
        max_connections_per_client: connections one peer address may hold at once.
        max_connections: connections open at once in all.
        trusted_clients: addresses or networks exempt from the per-client cap.
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 5.0
    max_connections_per_client: int = 64
    max_connections: int = 4096
    trusted_clients: tuple[str, ...] = ("127.0.0.1", "::1")

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"The '{name}' parameter of GuardSettings must be > 0, got {value!r}.")
        for name in ("max_connections_per_client", "max_connections"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"The '{name}' parameter of GuardSettings must be an int >= 1, got {value!r}.")
        for address in self.trusted_clients:
            try:
                ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ValueError(f"The 'trusted_clients' parameter of GuardSettings must list IP addresses or "
                                 f"networks, got {address!r}.") from None


class HttpGuard:
    """One server's connection bookkeeping: connections per peer address and closures by reason.

    Every method runs on the server's event loop; :meth:`stats` may be read from any thread.
    """

    def __init__(self, settings: GuardSettings) -> None:
        self.settings = settings
        self.open = 0
        self.per_client: dict[str, int] = {}
        self.closed = dict.fromkeys(REASONS, 0)
        self._trusted = [ipaddress.ip_network(a, strict=False) for a in settings.trusted_clients]

    def trusted(self, peer: str) -> bool:
        """Whether ``peer`` is exempt from the per-client cap."""
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self._trusted)

    def admit(self, peer: str | None) -> str | None:
        """Count a new connection from ``peer``, or return the reason to refuse it (``None``: a Unix socket)."""
        s = self.settings
        if self.open >= s.max_connections:
            return "max_connections"
        if peer is not None and self.per_client.get(peer, 0) >= s.max_connections_per_client \
                and not self.trusted(peer):
            return "per_client"
        self.open += 1
        if peer is not None:
            self.per_client[peer] = self.per_client.get(peer, 0) + 1
        return None

    def release(self, peer: str | None) -> None:
        """A connection counted by :meth:`admit` has ended."""
        self.open -= 1
        if peer is not None:
            left = self.per_client.get(peer, 0) - 1
            if left > 0:
                self.per_client[peer] = left
            else:
                self.per_client.pop(peer, None)

    def note(self, reason: str) -> None:
        self.closed[reason] += 1

    def connections(self, peer: str) -> int:
        """Connections ``peer`` holds now."""
        return self.per_client.get(peer, 0)

    def stats(self) -> dict[str, Any]:
        """Open connections, distinct peers, and connections closed by reason (see :data:`REASONS`)."""
        return {"open": self.open, "clients": len(self.per_client), "closed": dict(self.closed)}

    def collector(self) -> Any:
        """A prometheus collector: ``sloctl_http_closed_total{reason}`` and ``sloctl_http_connections``.

        Register it on an app's registry: ``registry.register(guard.collector())``.
        """
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        guard = self

        class _Collector:
            def collect(self):
                closed = CounterMetricFamily("sloctl_http_closed", "Connections the server closed, by reason.",
                                             labels=["reason"])
                for reason, count in guard.closed.items():
                    closed.add_metric([reason], count)
                yield closed
                yield GaugeMetricFamily("sloctl_http_connections", "HTTP connections open.", value=guard.open)

        return _Collector()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the head and body deadlines and the connection caps of :attr:`guard`.

    Use :func:`guarded_protocol` to bind a guard: uvicorn builds one instance
    per connection from the class it is given.
    """

    guard: HttpGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _BoundedHeadConnection(self.config.h11_max_incomplete_event_size or 16384)  # nothing read yet
        self._peer: str | None = None
        self._counted = False
        self._head_timer: Any = None
        self._body_timer: Any = None
        self._head_bytes = False  # some of the current head has arrived

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) else None
        refused = self.guard.admit(self._peer)
        if refused is not None:  # refused before any per-connection set-up: a flood of them stays cheap
            self.guard.note(refused)
            self.transport = transport
            _reset(transport)
            return
        self._counted = True
        super().connection_made(transport)
        self._arm_head()  # a new connection that never sends a whole head is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head()
        self._cancel_body()
        if self._counted:
            self._counted = False
            self.guard.release(self._peer)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # the first bytes of a new head on a kept-alive connection
            self._head_bytes = True
            if self._head_timer is None:
                self._arm_head()
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()  # a pipelined request may have been read just now

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse; a head over the size limit gets 431 instead."""
        if not getattr(self.conn, "head_too_large", False):
            super().send_400_response(msg)
            return
        self.guard.note("header_too_large")
        limit = self.conn.max_head_bytes
        detail = f"the request head is longer than the server's limit of {limit} bytes (serve.max_header_bytes)"
        payload = json.dumps(problem(431, detail, field="headers", kind="request-header-fields-too-large",
                                     title="Request Header Fields Too Large")).encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: "
                             + PROBLEM_JSON.encode() + b"\r\ncontent-length: " + str(len(payload)).encode()
                             + b"\r\nconnection: close\r\n\r\n" + payload)
        self.transport.close()

    def _follow(self) -> None:
        """Move the deadlines along with the client's side of the exchange."""
        state = self.conn.their_state
        if state is h11.IDLE:  # between requests: no body is due; a buffered partial head is
            self._cancel_body()
            if self._head_timer is None and not self.transport.is_closing() and self.conn.trailing_data[0]:
                self._head_bytes = True
                self._arm_head()
            return
        self._cancel_head()
        self._head_bytes = False
        if state is h11.SEND_BODY:
            if self._body_timer is None and not self.transport.is_closing():
                self._body_timer = self.loop.call_later(self.guard.settings.body_timeout_s, self._body_timed_out)
        else:
            self._cancel_body()

    def _arm_head(self) -> None:
        self._head_timer = self.loop.call_later(self.guard.settings.header_timeout_s, self._head_timed_out)

    def _cancel_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if not self._head_bytes:
            self.guard.note("idle")
        else:
            self.guard.note("header_timeout")
            detail = f"the request head did not arrive within {self.guard.settings.header_timeout_s:g} s"
            payload = json.dumps(problem(408, detail, field="headers")).encode()
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: " + PROBLEM_JSON.encode()
                                 + b"\r\ncontent-length: " + str(len(payload)).encode()
                                 + b"\r\nconnection: close\r\n\r\n" + payload)
        self.transport.close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        self.guard.note("body_timeout")
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and self.conn.our_state is h11.SEND_RESPONSE:
            detail = f"the request body did not arrive within {self.guard.settings.body_timeout_s:g} s"
            payload = json.dumps(problem(408, detail, field="body")).encode()
            headers = [*self.server_state.default_headers, (b"content-type", PROBLEM_JSON.encode()),
                       (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]
            try:
                for event in (h11.Response(status_code=408, headers=headers, reason=b"Request Timeout"),
                              h11.Data(data=payload), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:
                pass
        if cycle is not None:  # the app's receive() sees a disconnect; whatever it sends now is dropped
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


def _reset(transport: Any) -> None:
    """Close at once with a TCP reset (no FIN handshake, no TIME_WAIT left on the server)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # stops reading at once; connection_lost follows


def guarded_protocol(guard: HttpGuard) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` subclass bound to ``guard`` (uvicorn's ``http=``; ``cls.guard`` reads it back)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})


def guard_options(*, header_timeout_s: float = 10.0, body_timeout_s: float = 5.0,
                  max_connections_per_client: int = 64, max_connections: int = 4096,
                  trusted_clients: tuple[str, ...] = ("127.0.0.1", "::1"), keep_alive_s: int = 5,
                  max_header_bytes: int = 16384) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments for a server that slow or greedy clients cannot hold (module docstring).

    Args:
        header_timeout_s: time a request head has to arrive in full.
        body_timeout_s: time a request body has after its head.
        max_connections_per_client: connections one peer address may hold (``trusted_clients`` exempt).
        max_connections: connections open at once in all (keep it below the descriptor limit,
            see :func:`raise_nofile_limit`).
        trusted_clients: addresses or networks exempt from the per-client cap.
        keep_alive_s: idle kept-alive connections are closed after this (uvicorn's ``timeout_keep_alive``).
        max_header_bytes: largest request head (431 and the connection closed beyond).

    Returns:
        ``http`` (the guarded protocol class; ``options["http"].guard`` is its :class:`HttpGuard`),
        ``ws`` off, no ``limit_concurrency``, the keep-alive and head-size limits.
    """
    settings = GuardSettings(header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
                             max_connections_per_client=max_connections_per_client,
                             max_connections=max_connections, trusted_clients=tuple(trusted_clients))
    return {"http": guarded_protocol(HttpGuard(settings)), "ws": "none", "limit_concurrency": None,
            "timeout_keep_alive": keep_alive_s, "h11_max_incomplete_event_size": max_header_bytes}


def raise_nofile_limit() -> int:
    """Raise the soft open-file limit to the hard one (1,000+ sockets exceed the common 1,024); the new soft limit.

    Returns -1 where the platform has no ``resource`` module.
    """
    try:
        import resource
    except ImportError:  # Windows
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    target = hard if hard != infinite else 65536  # macOS: an infinite hard limit, a finite kernel cap
    if soft == infinite or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target
