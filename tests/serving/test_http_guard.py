"""The guarded h11 protocol: slow heads and bodies are closed, one peer cannot hold every connection."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time

import pytest

from sloctl.core.errors import ConfigError
from sloctl.serving._http_guard import REASONS, GuardSettings, guard_options
from sloctl.serving.local import LocalServer, server_options

STRANGER = "127.0.0.2"  # all of 127/8 is loopback on Linux: a second peer address on this machine
OTHER = "127.0.0.3"


def _app():
    """A tiny ASGI app: /readyz, /echo (reads the body), /hold (never reads it, answers after 2 s)."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b"ok"
        if scope["path"] == "/echo":
            body, more = b"", True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
        elif scope["path"] == "/hold":
            await asyncio.sleep(2)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def _server(**limits) -> LocalServer:
    return LocalServer(_app(), options=guard_options(**{"header_timeout_s": 30.0, "body_timeout_s": 30.0, **limits}))


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    out = b""
    try:
        while chunk := sock.recv(4096):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length body (its head and body may come in several reads)."""
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = sock.recv(4096)
        assert chunk, f"the server closed the connection mid-response: {out[:200]!r}"
        out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    return head + b"\r\n\r\n" + body


def _wait(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _refused(port: int, source: str) -> bool:
    """Whether a new connection from ``source`` is closed (reset) without an answer to its request."""
    try:
        with _connect(port, source) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            return _read_to_close(sock) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _get(port: int, source: str, path: str = "/") -> bytes:
    with _connect(port, source) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        return _read_to_close(sock)


def test_incomplete_head_gets_408_and_is_closed_after_the_header_timeout():
    with (server := _server(header_timeout_s=0.3)) as client:
        port = client.base_url.port
        guard = server.guard
        with _connect(port, STRANGER) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")  # the blank line never comes
            answer = _read_to_close(sock)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer
        assert b"urn:sloctl:problem:request-timeout" in answer
        _wait(lambda: guard.connections(STRANGER) == 0)
        assert guard.stats()["closed"]["header_timeout"] == 1


def test_trickled_head_is_closed_although_bytes_keep_coming():
    with (server := _server(header_timeout_s=0.3)) as client:
        port = client.base_url.port
        with _connect(port, STRANGER) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n")
            closed = False
            for _ in range(200):  # a header byte every 50 ms, for up to 10 s
                try:
                    sock.sendall(b"X")
                except OSError:
                    closed = True
                    break
                sock.settimeout(0.05)
                try:
                    sock.recv(4096)  # the 408, or b"" once closed
                except TimeoutError:
                    continue
                except ConnectionResetError:
                    pass
                closed = True
                break
        assert closed
        assert server.guard.stats()["closed"]["header_timeout"] == 1


def test_new_connection_that_sends_nothing_is_closed_without_an_answer():
    with (server := _server(header_timeout_s=0.3)) as client:
        port = client.base_url.port
        with _connect(port, STRANGER) as sock:
            assert _read_to_close(sock) == b""
        assert server.guard.stats()["closed"]["idle"] == 1


def test_kept_alive_connection_outlives_the_header_timeout_between_requests():
    with (server := _server(header_timeout_s=0.3, keep_alive_s=5)) as client:
        first = client.get("/")
        time.sleep(0.6)  # idle for twice the head timeout: keep-alive governs, not the head deadline
        second = client.get("/")
        assert first.status_code == second.status_code == 200
        assert server.guard.stats()["closed"] == dict.fromkeys(REASONS, 0)


def test_partial_pipelined_head_is_cut_after_the_answer_before_it():
    with (server := _server(header_timeout_s=0.3, keep_alive_s=5)) as client:
        port = client.base_url.port
        with _connect(port, STRANGER) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n")
            answer = _read_to_close(sock)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408 " in answer
        assert server.guard.stats()["closed"]["header_timeout"] == 1


@pytest.mark.parametrize("path", ["/echo", "/hold"])
def test_incomplete_body_gets_408_and_is_closed_after_the_body_timeout(path):
    """Whether the app reads the body (/echo) or not (/hold), the connection does not outlive the deadline."""
    with (server := _server(body_timeout_s=0.3)) as client:
        port = client.base_url.port
        with _connect(port, STRANGER) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789".encode())
            answer = _read_to_close(sock)
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"field": "body"' in answer
        assert server.guard.stats()["closed"]["body_timeout"] == 1
        assert client.post("/echo", content=b"x" * 1000).content == b"x" * 1000  # whole bodies are served


def test_connection_beyond_the_per_client_cap_is_closed_while_other_peers_are_served():
    with (server := _server(max_connections_per_client=3, trusted_clients=())) as client:
        port = client.base_url.port
        guard = server.guard
        held = [_connect(port, STRANGER) for _ in range(3)]
        _wait(lambda: guard.connections(STRANGER) == 3)
        assert _refused(port, STRANGER)
        assert guard.stats()["closed"]["per_client"] == 1
        assert _get(port, OTHER).startswith(b"HTTP/1.1 200 ")
        for sock in held:
            sock.close()
        _wait(lambda: guard.connections(STRANGER) == 0)
        assert STRANGER not in guard.per_client
        assert _get(port, STRANGER).startswith(b"HTTP/1.1 200 ")  # the peer's count was released


def test_trusted_clients_are_exempt_from_the_per_client_cap():
    with (server := _server(max_connections_per_client=2, trusted_clients=("127.0.0.0/30",))) as client:
        port = client.base_url.port
        guard = server.guard
        held = [_connect(port, STRANGER) for _ in range(4)]
        _wait(lambda: guard.connections(STRANGER) == 4)
        assert _get(port, STRANGER).startswith(b"HTTP/1.1 200 ")
        for sock in held:
            sock.close()
        _wait(lambda: guard.connections(STRANGER) == 0)
        assert guard.stats()["closed"]["per_client"] == 0


def test_connection_beyond_the_server_cap_is_closed():
    with (server := _server(max_connections=3)) as client:
        port = client.base_url.port
        guard = server.guard
        client.get("/")  # the client's own kept-alive connection is one of the three
        held = [_connect(port, STRANGER), _connect(port, OTHER)]
        _wait(lambda: guard.stats()["open"] == 3)
        assert _refused(port, "127.0.0.4")
        assert guard.stats()["closed"]["max_connections"] == 1
        for sock in held:
            sock.close()
        _wait(lambda: guard.stats()["open"] == 1)


def test_closures_are_exported_as_prometheus_counters():
    from prometheus_client import CollectorRegistry, generate_latest

    with (server := _server(header_timeout_s=0.3)) as client:
        port = client.base_url.port
        with _connect(port, STRANGER) as sock:
            _read_to_close(sock)
        registry = CollectorRegistry()
        registry.register(server.guard.collector())
        text = generate_latest(registry).decode()
    assert 'sloctl_http_closed_total{reason="idle"} 1.0' in text
    assert 'sloctl_http_closed_total{reason="body_timeout"} 0.0' in text and "sloctl_http_connections" in text


def test_server_options_follow_the_serve_section():
    from sloctl.config import load_config

    serve = dataclasses.replace(load_config().serve, header_timeout_s=2.5, max_connections_per_client=7,
                                trusted_clients=("10.0.0.0/8",))
    options = server_options(serve)
    settings = options["http"].guard.settings
    assert (settings.header_timeout_s, settings.body_timeout_s, settings.max_connections_per_client,
            settings.max_connections, settings.trusted_clients) == (2.5, serve.body_timeout_s, 7,
                                                                    serve.max_connections, ("10.0.0.0/8",))
    assert options["limit_concurrency"] is None and options["timeout_keep_alive"] == serve.keep_alive_s
    assert server_options(serve)["http"].guard is not settings  # one guard per server


def test_bad_limits_are_refused_naming_the_field():
    from sloctl.config import load_config

    with pytest.raises(ConfigError, match="serve.trusted_clients"):
        dataclasses.replace(load_config().serve, trusted_clients=("localhost",))
    with pytest.raises(ConfigError, match="serve.header_timeout_s"):
        dataclasses.replace(load_config().serve, header_timeout_s=0.0)
    with pytest.raises(ValueError, match="'max_connections_per_client' parameter"):
        GuardSettings(max_connections_per_client=0)


def test_runtime_serves_authenticated_requests_while_a_stranger_holds_slow_heads(tmp_path, empty_registry_uri,
                                                                                 sim_log):
    """The controller runtime behind server_options: a stranger's slow heads are capped and cut; /v1/admit is 200."""
    from sloctl.config import load_config
    from sloctl.serving.runtime.app import create_app

    token = "guard-token-0123456789abcdef"
    base = load_config()
    cfg = dataclasses.replace(
        base, registry=dataclasses.replace(base.registry, tracking_uri=empty_registry_uri),
        serve=dataclasses.replace(base.serve, state_db=str(tmp_path / "state.db"), header_timeout_s=3.0,
                                  max_connections_per_client=16, max_connections=64))
    templates = sim_log.drop_duplicates("template").reset_index(drop=True)
    server = LocalServer(create_app(cfg, token=token, templates=templates), options=server_options(cfg.serve))
    with server as client:
        port = client.base_url.port
        slow = []
        for _ in range(40):  # more than the peer's cap; the extra ones are closed at accept
            with contextlib.suppress(OSError):  # a refused one may be reset already
                sock = _connect(port, STRANGER)
                slow.append(sock)
                sock.sendall(b"POST /v1/admit HTTP/1.1\r\nHost: t\r\n")
        auth = {"Authorization": f"Bearer {token}"}
        for _ in range(5):
            admitted = client.post("/v1/admit", json={"class": "high"}, headers=auth)
            assert admitted.status_code == 200, admitted.text
            assert client.post("/v1/release", json={"lease_id": admitted.json()["lease_id"]},
                               headers=auth).status_code == 200
        closed = server.guard.stats
        # a connection is counted closed a moment before the peer's tally drops: wait for both
        _wait(lambda: closed()["closed"]["per_client"] + closed()["closed"]["header_timeout"] == 40
              and server.guard.connections(STRANGER) == 0)
        assert closed()["closed"]["per_client"] == 24
        for sock in slow:
            sock.close()


@pytest.mark.parametrize("trickle", [False, True], ids=["one-read", "in-pieces"])
def test_oversized_head_gets_431_and_the_server_keeps_serving(trickle):
    with (server := _server()) as client:
        port = client.base_url.port
        head = b"GET / HTTP/1.1\r\nHost: t\r\nX-Filler: " + b"a" * 60_000 + b"\r\n\r\n"
        with _connect(port, STRANGER) as sock:
            if trickle:
                for start in range(0, len(head), 8192):
                    with contextlib.suppress(OSError):  # the server may close before the rest is sent
                        sock.sendall(head[start:start + 8192])
            else:
                with contextlib.suppress(OSError):
                    sock.sendall(head)
            answer = _read_to_close(sock)
        assert answer.startswith(b"HTTP/1.1 431 ") and b'"field": "headers"' in answer
        assert b"16384 bytes" in answer
        assert server.guard.closed["header_too_large"] == 1
        assert _get(port, STRANGER).startswith(b"HTTP/1.1 200 ")
        assert client.get("/echo").status_code == 200


def test_head_just_under_the_limit_is_served_and_a_kept_alive_oversized_one_is_not():
    with _server() as client:
        port = client.base_url.port
        with _connect(port) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Filler: " + b"a" * 15_000 + b"\r\n\r\n")
            first = _read_response(sock)  # all of it: its head and body may arrive in separate reads
            assert first.startswith(b"HTTP/1.1 200 ")
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Filler: " + b"a" * 40_000 + b"\r\n\r\n")
            assert _read_to_close(sock).startswith(b"HTTP/1.1 431 ")
