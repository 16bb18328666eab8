"""Runtime replicas on one Redis under a bounded loopback load, and an audit of what they left (issue 20).

:func:`start_replicas` starts ``sloctl serve`` processes that share one
``state.url``; :func:`drive` sends them a bounded load of route/complete and
admit/release pairs from one asyncio process over keep-alive connections (a
hand-written HTTP/1.1 client: a load generator that costs the servers' two
cores as little as possible), each pair's two calls to different replicas;
a call whose replica dies is sent again, unchanged, to another one (route,
complete and release are idempotent or refuse a repeat with 404/409, never
double-count). :func:`audit` then reads Redis directly: nothing left running,
no lease outstanding, the counters equal to the completions acknowledged,
and the bill equal to the windows it charged, each route inside one.

Used by ``tests/serving/test_replicas.py`` and ``benchmarks/bench_replicas.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ReplicaLoad", "Replica", "audit", "drive", "start_replicas", "write_config"]


@dataclass
class Replica:
    """One ``sloctl serve`` process."""

    port: int
    process: subprocess.Popen
    log: Path
    alive: bool = True

    def kill(self) -> None:
        """kill -9: no shutdown, no goodbye."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.alive = False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.alive = False


def write_config(path: Path, *, state_url: str, prefix: str, tracking_uri: str, cluster_sizes: tuple[int, ...],
                 minimum_s: float = 0.05, lease_ttl_s: float = 2.0, templates_log: str | None = None) -> Path:
    """A config file for replicas of one fleet (YAML; only what differs from the defaults)."""
    lines = [f"state:\n  url: {state_url}\n  key_prefix: {prefix}",
             f"registry:\n  tracking_uri: {tracking_uri}",
             f"router:\n  minimum_s: {minimum_s}",
             "serve:", f"  cluster_sizes: [{', '.join(map(str, cluster_sizes))}]", "  watch_interval_s: 0.25",
             f"  lease_ttl_s: {lease_ttl_s}", "  max_in_flight: 4096", "  max_connections: 4096"]
    if templates_log:
        lines.append(f"  templates_log: {templates_log}")
    path.write_text("\n".join(lines) + "\n")
    return path


def start_replicas(n: int, config: Path, token: str, folder: Path, *, timeout_s: float = 120.0,
                   one_thread: bool = True) -> list[Replica]:
    """Start ``n`` ``sloctl serve`` processes on free loopback ports and wait until each answers ``/healthz``."""
    from sloctl.serving.local import free_port

    env = {**os.environ, "SLOCTL_TOKEN": token}
    if one_thread:  # a replica is one Python process: one torch thread each, as on a machine of their own
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    sloctl = str(Path(sys.executable).parent / "sloctl")
    replicas = []
    for i in range(n):
        port = free_port()
        log = folder / f"replica{i}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sloctl, "serve", "--config", str(config), "--port", str(port)], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, cwd=folder)
        replicas.append(Replica(port, proc, log))
    deadline = time.monotonic() + timeout_s
    for r in replicas:
        while not _healthy(r.port):
            if r.process.poll() is not None or time.monotonic() > deadline:
                for other in replicas:
                    other.stop()
                raise RuntimeError(f"replica on port {r.port} did not start: {r.log.read_text()[-2000:]}")
            time.sleep(0.2)
    return replicas


def _healthy(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# -- the load --------------------------------------------------------------------------------------------------
class _Conn:
    """One keep-alive HTTP/1.1 connection to a replica (just what the runtime's JSON API needs)."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        data = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {self.token}\r\n"
                          f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"connection" and value.strip().lower() == b"close":
                self.writer = None
        payload = await self.reader.readexactly(length) if length else b""
        return status, json.loads(payload) if payload else None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@dataclass
class ReplicaLoad:
    """What the load generator saw."""

    statuses: Counter = field(default_factory=Counter)  # (path, status) -> count
    routed: dict[int, str] = field(default_factory=dict)  # query id -> the cluster it was told
    completed: set[int] = field(default_factory=set)
    leases_granted: int = 0
    leases_released: int = 0
    dropped: int = 0
    resent: int = 0  # calls sent again to another replica after theirs died
    mismatched: int = 0  # a repeated route whose answer differed from the first (must be 0)
    wall_s: float = 0.0

    @property
    def server_errors(self) -> int:
        return sum(n for (_, status), n in self.statuses.items() if status >= 500)

    @property
    def pairs_per_s(self) -> float:
        return (len(self.completed) + self.leases_released) / self.wall_s if self.wall_s else 0.0


async def _drive(replicas: list[Replica], token: str, *, route_pairs: int, admit_pairs: int, workers: int,
                 seed: int, first_id: int, templates: list[str], kill_after: int | None,
                 duration_s: float | None, result: ReplicaLoad) -> None:
    rng = random.Random(seed)
    total = route_pairs + admit_pairs
    if total <= 1_000_000:
        order = [("route", first_id + i) for i in range(route_pairs)] + [("admit", i) for i in range(admit_pairs)]
        rng.shuffle(order)
        work = iter(order)
    else:  # a throughput run: pairs drawn as they are taken (a list of millions would cost the servers' CPU)
        work = (("route", first_id + i) if rng.random() * total < route_pairs else ("admit", i)
                for i in range(total))
    done = 0
    deadline = None if duration_s is None else time.monotonic() + duration_s

    async def call(conns: dict[int, _Conn], first: int, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        order = [(first + k) % len(replicas) for k in range(len(replicas))]
        for attempt, i in enumerate(order):
            if not replicas[i].alive and attempt < len(order) - 1:
                continue
            conn = conns.setdefault(i, _Conn(replicas[i].port, token))
            try:
                status, out = await conn.request(path, body)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                conn.close()
                conns.pop(i, None)
                if replicas[i].alive and replicas[i].process.poll() is None:
                    raise
                result.resent += 1
                continue
            result.statuses[(path, status)] += 1
            return status, out
        raise RuntimeError(f"no replica answered {path}")

    async def worker(w: int) -> None:
        nonlocal done
        conns: dict[int, _Conn] = {}
        i = w
        while deadline is None or time.monotonic() < deadline:
            item = next(work, None)
            if item is None:
                break
            kind, n = item
            a, b = i % len(replicas), (i + 1) % len(replicas)  # the pair's two calls go to different replicas
            i += 1
            if kind == "route":
                body = {"query_id": n, "template": templates[n % len(templates)], "slo_s": 5.0}
                status, out = await call(conns, a, "/v1/route", body)
                if status != 200:
                    continue
                if n in result.routed and result.routed[n] != out["cluster_id"]:
                    result.mismatched += 1
                result.routed[n] = out["cluster_id"]
                status, _ = await call(conns, b, "/v1/complete", {"query_id": n, "latency_s": 0.01, "status": "ok"})
                if status == 200:
                    result.completed.add(n)
            else:
                holder = f"w{w}-{n}"
                klass = "high" if n % 2 else "low"
                status, out = await call(conns, a, "/v1/admit", {"class": klass, "holder": holder})
                if status != 200:
                    continue
                if not out["admitted"]:
                    result.dropped += 1
                    continue
                result.leases_granted += 1
                status, _ = await call(conns, b, "/v1/release", {"lease_id": out["lease_id"], "holder": holder})
                if status == 200:
                    result.leases_released += 1
            done += 1
            if kill_after is not None and done == kill_after:
                replicas[0].kill()
        for conn in conns.values():
            conn.close()

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    result.wall_s = time.monotonic() - started


def drive(replicas: list[Replica], token: str, *, route_pairs: int, admit_pairs: int = 0, workers: int = 16,
          seed: int = 0, first_id: int = 0, templates: list[str] | None = None, kill_after: int | None = None,
          duration_s: float | None = None) -> ReplicaLoad:
    """Send the bounded load (shuffled route/complete and admit/release pairs) and return what came back.

    Args:
        replicas: the running replicas (each pair's calls go to two of them).
        token: their bearer token.
        route_pairs, admit_pairs: how many of each pair.
        workers: concurrent keep-alive clients.
        seed: the shuffle's seed.
        first_id: the first query id (ids are ``first_id + i``).
        templates: template names to cycle through (default ``t00``).
        kill_after: kill -9 the first replica once this many pairs are done.
        duration_s: stop taking new pairs after this long (a throughput run).
    """
    result = ReplicaLoad()
    asyncio.run(_drive(replicas, token, route_pairs=route_pairs, admit_pairs=admit_pairs, workers=workers,
                       seed=seed, first_id=first_id, templates=templates or ["t00"], kill_after=kill_after,
                       duration_s=duration_s, result=result))
    return result


# -- the audit --------------------------------------------------------------------------------------------------
def audit(redis_url: str, prefix: str, *, price_per_unit_s: float, reported_cost: float) -> dict[str, Any]:
    """What the replicas left in Redis, checked against itself and against the bill a replica reported.

    Returns a dict: ``running`` (queries still running), ``leases`` (outstanding), ``completed`` and
    ``violations`` (counters), ``billed_cost`` (price × Σ size × window length over every closed window and
    every open one up to its timer's last time), ``reported_cost``, ``routes_outside_windows`` (route events
    of the log whose time is in no window of their cluster), ``overlapping_windows``.
    """
    from sloctl.serving.runtime.state_redis import RedisStateStore, parse_events

    store = RedisStateStore(redis_url, prefix=prefix)
    r = store.r
    try:
        windows = {name.split(":", 2)[2]: store.billed_windows(name.split(":", 2)[2])
                   for name in r.scan_iter(store.key("billed:*"))}
        for name in r.scan_iter(store.key("timer:*")):
            t = r.hgetall(name)
            if t.get("start"):  # a window still open: billed up to its timer's last time
                windows.setdefault(name.split(":", 2)[2], []).append(
                    (float(t["start"]), float(t["now"]), int(float(t["size"]))))
        billed = price_per_unit_s * sum((b - a) * s for ws in windows.values() for a, b, s in ws)
        overlapping = sum(1 for ws in windows.values() for (_, e1, _), (s2, _, _) in zip(ws, ws[1:], strict=False)
                          if s2 < e1 - 1e-9)
        outside = 0
        for _, _, event in parse_events(r.xrange(store.key("log"))):
            if event[0] == "route":
                t, ws = float(event[3]), windows.get(event[2], [])
                outside += not any(a - 1e-6 <= t <= b + 1e-6 for a, b, _ in ws)
        completed, violations = store.counters()
        return {"running": r.hlen(store.key("running")), "leases": r.zcard(store.key("lease_exp")),
                "completed": completed, "violations": violations, "billed_cost": billed,
                "reported_cost": reported_cost, "routes_outside_windows": outside,
                "overlapping_windows": overlapping}
    finally:
        store.close()
