"""The controller runtime over HTTP: route latency at a steady rate, admit/release throughput.

Trains a tiny Iconq+ model on the synthetic log of ``tests/conftest.py``,
registers it into a temporary SQLite registry and starts the real server
(``create_app`` under uvicorn, as ``sloctl serve`` runs it) in a subprocess on
a free loopback port, so that client and server do not share a GIL. Then:

* **route**: 4 clusters (sizes 1, 1, 2, 2) hold 64 running queries; every
  tick routes a new query through ``/v1/route`` and completes the oldest
  through ``/v1/complete``, so the pool stays at 64. Ticks are sent open-loop
  at a steady rate (default 100/s for 10 s); client latency is measured from
  each request's scheduled send time (no coordinated omission). Target:
  p99 of the server-side ``decision_ms`` under 15 ms at 100 req/s.
* **admit/release**: a few keep-alive clients call ``/v1/admit`` then
  ``/v1/release`` as fast as they can (5 s). Target: at least 1,000 req/s.

With ``--profile`` it also times the ASGI app in process (no sockets) layer by
layer, to say where an admit/release request's time goes.

Run: ``.venv/bin/python benchmarks/bench_runtime.py [--json] [--profile]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np

TOKEN = "bench-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CLUSTER_SIZES = (1, 1, 2, 2)
ROUTE_TARGET_P99_MS = 15.0
ADMIT_TARGET_PER_S = 1000.0


# -- setup ---------------------------------------------------------------------------
def synthetic_log() -> Any:
    """The synthetic query log of the test suite (processor-sharing simulation, 12 templates)."""
    from sloctl.datasets.querylog import validate_log

    path = Path(__file__).resolve().parents[1] / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_sloctl_test_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return validate_log(module.synthetic_log(), source="synthetic log")


def _cfg(tracking_uri: str, state_db: str) -> Any:
    from sloctl.config import load_config

    base = load_config()
    return dataclasses.replace(
        base, registry=dataclasses.replace(base.registry, tracking_uri=tracking_uri),
        iconq=dataclasses.replace(base.iconq, max_epochs=3),
        serve=dataclasses.replace(base.serve, cluster_sizes=CLUSTER_SIZES, state_db=state_db))


def prepare(folder: Path) -> dict[str, str]:
    """Train and register a tiny Iconq+ model; write the templates log. Returns the server's arguments."""
    from sloctl.datasets.querylog import write_log
    from sloctl.registry.store import register
    from sloctl.training.pipeline import train_iconq

    log = synthetic_log()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    cfg = _cfg(uri, str(folder / "state.db"))
    register(train_iconq(log, cfg.stage, cfg.iconq), log, name="iconq", tracking_uri=uri, experiment="bench")
    templates = write_log(log, folder / "templates.parquet")
    return {"tracking_uri": uri, "state_db": str(folder / "state.db"), "templates": str(templates)}


def serve(tracking_uri: str, state_db: str, templates: str, port: int) -> None:
    """The server side (run in a subprocess): the app as ``sloctl serve`` builds it."""
    import torch
    import uvicorn

    from sloctl.serving.controller import load_templates_table
    from sloctl.serving.runtime.app import create_app

    torch.set_num_threads(1)
    app = create_app(_cfg(tracking_uri, state_db), token=TOKEN, templates=load_templates_table(templates))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> dict[str, Any]:
    import httpx

    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=5) as client:
        while True:
            try:
                ready = client.get("/readyz")
                if ready.status_code == 200 and ready.json()["router"] == "iconq":
                    return ready.json()
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the runtime did not become ready (router iconq) on {url}")
            time.sleep(0.2)


# -- workloads -----------------------------------------------------------------------
class RawConnection:
    """One keep-alive HTTP/1.1 connection speaking just enough to POST JSON (a cheap load generator).

    httpx's AsyncClient is not used for the open-loop driver: its connection
    pool does work proportional to the requests waiting in it on every
    request, so once a backlog forms the client saturates a core and measures
    itself, not the server.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        self.reader, self.writer = reader, writer
        self.head = (f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
                     "Content-Type: application/json\r\n").encode()

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, port)

    async def post(self, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        body = json.dumps(payload).encode()
        self.writer.write(b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s"
                          % (path.encode(), self.head, len(body), body))
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
        return int(head[9:12]), json.loads(await self.reader.readexactly(length))

    def close(self) -> None:
        self.writer.close()


async def route_workload(port: int, templates: list[str], *, rate_per_s: float, duration_s: float, running: int,
                         slo_s: float, seed: int, connections: int = 32) -> dict[str, Any]:
    """Open-loop route + complete-oldest at ``rate_per_s``, the pool held at ``running`` queries."""
    rng = np.random.default_rng(seed)
    conns: asyncio.Queue[RawConnection] = asyncio.Queue()
    for _ in range(connections):
        conns.put_nowait(await RawConnection.open(port))

    async def route(conn: RawConnection, qid: int) -> tuple[int, Any]:
        return await conn.post("/v1/route", {"query_id": qid, "template": str(rng.choice(templates)),
                                             "slo_s": slo_s})

    async def spread() -> list[int]:
        import httpx

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as probe:
            return [len(c["running"]) for c in (await probe.get("/v1/clusters")).json()["clusters"]]

    conn = await conns.get()
    for qid in range(running):  # prefill (also warms the per-template feature cache)
        status, body = await route(conn, qid)
        assert status == 200, body
    conns.put_nowait(conn)
    before = await spread()
    n = int(rate_per_s * duration_s)
    decision_ms: list[float] = []
    client_ms: list[float] = []
    errors: Counter[str] = Counter()
    pool = deque(range(running))  # routed and not yet completed, oldest first

    async def tick(i: int, scheduled: float) -> None:
        conn = await conns.get()  # waiting for a free connection counts in the client latency
        try:
            status, body = await route(conn, running + i)
            if status != 200:
                errors[f"/v1/route {status}: {str(body)[:80]}"] += 1
                return
            client_ms.append((time.perf_counter() - scheduled) * 1e3)
            decision_ms.append(body["decision_ms"])
            pool.append(running + i)
            if len(pool) > running:
                status, body = await conn.post("/v1/complete", {"query_id": pool.popleft(),
                                                                "latency_s": float(rng.uniform(0.1, 2.0))})
                if status != 200:
                    errors[f"/v1/complete {status}: {str(body)[:80]}"] += 1
        finally:
            conns.put_nowait(conn)

    t0 = time.perf_counter()
    tasks = []
    for i in range(n):
        scheduled = t0 + i / rate_per_s
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        tasks.append(asyncio.create_task(tick(i, scheduled)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    while not conns.empty():
        conns.get_nowait().close()
    return {"offered_per_s": rate_per_s, "routes": len(decision_ms), "errors": dict(errors),
            "achieved_per_s": len(decision_ms) / elapsed, "duration_s": elapsed,
            "decision_ms": _percentiles(decision_ms), "client_ms": _percentiles(client_ms),
            "running_per_cluster_before": before, "running_per_cluster_after": await spread()}


async def admit_workload(port: int, *, clients: int, duration_s: float, client: str = "httpx") -> dict[str, Any]:
    """``clients`` keep-alive loops of admit then release, as fast as they go.

    ``client`` is ``httpx`` (one ``AsyncClient`` per loop) or ``raw`` (:class:`RawConnection`, nearly free on
    the client side, so the server's own ceiling shows).
    """
    import httpx

    counts = {"requests": 0, "admitted": 0, "dropped": 0, "errors": 0}
    latencies: list[float] = []
    if client == "httpx":
        sessions = [httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=30)
                    for _ in range(clients)]
        for s in sessions:  # open the connections before the clock starts
            await s.get("/healthz")

        def poster(s: httpx.AsyncClient):
            async def post(path: str, payload: dict[str, Any]) -> tuple[int, Any]:
                r = await s.post(path, json=payload)
                return r.status_code, r.json()
            return post

        posts = [poster(s) for s in sessions]
    else:
        sessions = [await RawConnection.open(port) for _ in range(clients)]
        posts = [s.post for s in sessions]

    async def loop(post, stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            status, body = await post("/v1/admit", {"class": "high", "budget_ms": 1000})
            latencies.append((time.perf_counter() - started) * 1e3)
            counts["requests"] += 1
            if status != 200:
                counts["errors"] += 1
                continue
            if not body["admitted"]:
                counts["dropped"] += 1
                continue
            counts["admitted"] += 1
            status, _ = await post("/v1/release", {"lease_id": body["lease_id"]})
            counts["requests"] += 1
            counts["errors"] += int(status != 200)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(loop(post, t0 + duration_s) for post in posts))
        elapsed = time.perf_counter() - t0
    finally:
        for s in sessions:
            await s.aclose() if client == "httpx" else s.close()
    return {**counts, "client": client, "clients": clients, "duration_s": elapsed,
            "per_s": counts["requests"] / elapsed, "latency_ms": _percentiles(latencies)}


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    a = np.asarray(values)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def measured(pid: int, workload) -> dict[str, Any]:
    """Run ``workload`` (a coroutine) and add the CPU both sides spent on it."""
    server0, client0, wall0 = _cpu_s(pid), time.process_time(), time.perf_counter()
    out = asyncio.run(workload)
    wall = time.perf_counter() - wall0
    out["server_cpu_per_wall"] = (_cpu_s(pid) - server0) / wall
    out["client_cpu_per_wall"] = (time.process_time() - client0) / wall
    return out


# -- in-process profile ----------------------------------------------------------------
def asgi_profile(info: dict[str, str], n: int = 2000) -> dict[str, float]:
    """Microseconds per admit/release request through each layer of the app, called directly (no sockets).

    Layers: the full app (admission middleware + FastAPI + timing middleware);
    the inner FastAPI app only; the inner app without its ``@app.middleware("http")``
    layer; bare FastAPI apps with a pydantic body and no middleware (a sync
    endpoint with and without a sync bearer-token dependency, and an async
    endpoint: each sync callable is a thread-pool round trip); and the endpoint
    bodies' own work.
    The server's per-request CPU minus the full app's is the HTTP server's share (uvicorn, h11, sockets).
    """
    from fastapi import Depends, FastAPI, Header
    from pydantic import BaseModel

    from sloctl.serving.controller import load_templates_table
    from sloctl.serving.runtime import Runtime
    from sloctl.serving.runtime.app import create_app

    folder = Path(tempfile.mkdtemp(prefix="sloctl-bench-asgi-"))
    cfg = _cfg(info["tracking_uri"], str(folder / "state.db"))
    app = create_app(cfg, token=TOKEN, templates=load_templates_table(info["templates"]), watch=False)

    class Body(BaseModel):
        klass: str = "high"

    def admit(body: Body) -> dict[str, Any]:
        return {"admitted": True, "class": body.klass}

    async def admit_async(body: Body) -> dict[str, Any]:
        return {"admitted": True, "class": body.klass}

    def token(authorization: str | None = Header(default=None)) -> None:
        if authorization != f"Bearer {TOKEN}":
            raise ValueError("unauthorised")

    bare, bare_async, bare_dep = FastAPI(), FastAPI(), FastAPI()
    for target, endpoint, deps in ((bare, admit, []), (bare_async, admit_async, []),
                                   (bare_dep, admit, [Depends(token)])):
        endpoint.__annotations__["body"] = Body  # a local class: the string annotation would not resolve
        target.post("/v1/admit", dependencies=deps)(endpoint)
        target.post("/v1/release", dependencies=deps)(endpoint)

    last_body: list[bytes] = [b""]

    async def call(target: Any, path: str, body: bytes) -> int:
        sent = False
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             (b"authorization", f"Bearer {TOKEN}".encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        await target(scope, receive, send)
        last_body[0] = b"".join(chunks)
        return status

    def release_body() -> bytes:
        """The lease of the admit just answered (bare apps answer anything: any id will do)."""
        lease = json.loads(last_body[0] or b"{}").get("lease_id") or "bare"
        return json.dumps({"lease_id": lease, "class": "high"}).encode()

    async def per_request_us(target: Any) -> float:
        for _ in range(100):  # warm up
            await call(target, "/v1/admit", b'{"class": "high"}')
            await call(target, "/v1/release", release_body())
        started = time.perf_counter()
        for _ in range(n):
            assert await call(target, "/v1/admit", b'{"class": "high"}') == 200
            assert await call(target, "/v1/release", release_body()) == 200
        return (time.perf_counter() - started) / (2 * n) * 1e6

    async def run_all() -> dict[str, float]:
        async with app.fastapi.router.lifespan_context(app.fastapi):
            full = await per_request_us(app)
            inner = await per_request_us(app.fastapi)
            # The same inner app without its @app.middleware("http") timing layer (rebuilt on the next call).
            app.fastapi.user_middleware.clear()
            app.fastapi.middleware_stack = None
            no_timing = await per_request_us(app.fastapi)
        rt = Runtime(cfg, None, str(folder / "state2.db")).start()
        started = time.perf_counter()
        for _ in range(n):
            with rt.lock:
                rt.admission.try_acquire("high", rt.now_s())
            with rt.lock:
                rt.admission.release("high", rt.now_s(), ok=True, within_slo=True)
        work = (time.perf_counter() - started) / (2 * n) * 1e6
        rt.close()
        return {"full_app_us": full, "inner_fastapi_us": inner, "inner_without_timing_middleware_us": no_timing,
                "bare_fastapi_with_sync_token_dependency_us": await per_request_us(bare_dep),
                "bare_fastapi_us": await per_request_us(bare),
                "bare_async_fastapi_us": await per_request_us(bare_async), "endpoint_work_us": work}

    return asyncio.run(run_all())


# -- main ------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description="Controller runtime over HTTP: route latency, admit throughput.")
    parser.add_argument("--rate", type=float, default=100.0, help="route ticks per second (open loop)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of routing")
    parser.add_argument("--running", type=int, default=64, help="running queries held in the pool")
    parser.add_argument("--slo", type=float, default=5.0,
                        help="SLO of every routed query (s); 5 s spreads the pool over all four clusters, a loose "
                             "one lets the router pack it onto the cheapest")
    parser.add_argument("--admit-clients", type=int, default=4)
    parser.add_argument("--admit-duration", type=float, default=5.0)
    parser.add_argument("--profile", action="store_true", help="also time the ASGI app in process, layer by layer")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve", nargs=4, metavar=("TRACKING_URI", "STATE_DB", "TEMPLATES", "PORT"),
                        help=argparse.SUPPRESS)  # the server subprocess
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve[:3], int(args.serve[3]))
        return

    import pandas as pd

    say = (lambda *a, **k: None) if args.json else (lambda *a, **k: print(*a, **k, flush=True))
    with tempfile.TemporaryDirectory(prefix="sloctl-bench-runtime-") as tmp:
        say("training a tiny Iconq+ model and registering it ...")
        info = prepare(Path(tmp))
        templates = pd.read_parquet(info["templates"])["template"].unique().tolist()
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, __file__, "--serve", info["tracking_uri"], info["state_db"],
                                 info["templates"], str(port)])
        try:
            _wait_ready(url, proc)
            say(f"server up on {url} (pid {proc.pid}), router iconq; {os.cpu_count()} CPUs, load average "
                f"{os.getloadavg()[0]:.2f} (other processes skew every number here)")
            routed = measured(proc.pid, route_workload(port, templates, rate_per_s=args.rate,
                                                      duration_s=args.duration, running=args.running,
                                                      slo_s=args.slo, seed=args.seed))
            admitted = {client: measured(proc.pid, admit_workload(port, clients=args.admit_clients,
                                                                  duration_s=args.admit_duration, client=client))
                        for client in ("httpx", "raw")}
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        profile = asgi_profile(info) if args.profile else None

    d, c, a = routed["decision_ms"], routed["client_ms"], admitted["httpx"]
    result = {"route": routed, "admit_release": admitted, "profile": profile,
              "targets": {"route_decision_p99_ms": {"target": ROUTE_TARGET_P99_MS, "value": d["p99"],
                                                    "ok": d["p99"] < ROUTE_TARGET_P99_MS},
                          "admit_release_per_s": {"target": ADMIT_TARGET_PER_S, "value": a["per_s"],
                                                  "ok": a["per_s"] >= ADMIT_TARGET_PER_S}}}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"\n/v1/route + /v1/complete, {len(CLUSTER_SIZES)} clusters {CLUSTER_SIZES}, {args.running} running, "
          f"SLO {args.slo:g} s (running per cluster before/after: {routed['running_per_cluster_before']} / "
          f"{routed['running_per_cluster_after']})")
    print(f"{'':24}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    print(f"{'server decision_ms':24}{d['p50']:9.2f}{d['p99']:9.2f}{d['max']:9.2f}")
    print(f"{'client route latency':24}{c['p50']:9.2f}{c['p99']:9.2f}{c['max']:9.2f}")
    print(f"offered {routed['offered_per_s']:.0f} routes/s, achieved {routed['achieved_per_s']:.1f} routes/s "
          f"({routed['routes']} routes, errors: {routed['errors'] or 'none'}); CPU per wall second: server "
          f"{routed['server_cpu_per_wall']:.2f}, client {routed['client_cpu_per_wall']:.2f}")
    print(f"\n/v1/admit + /v1/release, {args.admit_clients} keep-alive clients, {args.admit_duration:g} s")
    print(f"{'client':8}{'req/s':>8}{'admitted':>10}{'dropped':>9}{'errors':>8}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'server CPU':>12}{'client CPU':>12}{'server us/req':>15}")
    for name, r in admitted.items():
        print(f"{name:8}{r['per_s']:8.0f}{r['admitted']:10d}{r['dropped']:9d}{r['errors']:8d}"
              f"{r['latency_ms']['p50']:8.2f}{r['latency_ms']['p99']:8.2f}{r['server_cpu_per_wall']:12.2f}"
              f"{r['client_cpu_per_wall']:12.2f}{r['server_cpu_per_wall'] / r['per_s'] * 1e6:15.0f}")
    if profile:
        print("\nin process (ASGI called directly), per admit/release request (us):")
        for k, v in profile.items():
            print(f"  {k.removesuffix('_us'):36}{v:8.0f}")
    t = result["targets"]
    print(f"\nroute decision p99 {d['p99']:.2f} ms (target < {ROUTE_TARGET_P99_MS:g} ms at {args.rate:g} req/s): "
          f"{'OK' if t['route_decision_p99_ms']['ok'] else 'MISSED'}")
    print(f"admit/release {a['per_s']:.0f} req/s with httpx clients (target >= {ADMIT_TARGET_PER_S:g} req/s): "
          f"{'OK' if t['admit_release_per_s']['ok'] else 'MISSED'}")


if __name__ == "__main__":
    main()
