"""A live app with real bottlenecks — CPU, memory bandwidth, a lock — under bounded open-loop load (issue 21).

The app (:func:`build_app`) serves three endpoints on loopback:

* ``/cpu`` — pure compute: SHA-256 rounds over a 64 KiB buffer (cache
  resident; ``hashlib`` releases the GIL, so requests use every core);
* ``/mem`` — memory bandwidth: ``copies`` streaming ``numpy.copyto`` of an
  array of ``mem_mb`` MiB (default 1 GiB, about twice the last-level cache
  this machine reports) into another; each copy reads and writes the array;
* ``/lock`` — a critical section: ``lock_writes`` (8) SQLite transactions
  (WAL, ``synchronous=FULL``: each commit waits for an fsync, so the section
  is bounded by the disk, not a core) while holding one shared lock (FIFO
  ``asyncio.Lock``; the writes run on a worker thread).

Three controls, one at a time, each in a fresh ``uvicorn`` process:

* ``none`` — the bare app;
* ``single-queue`` — :class:`~sloctl.control.admission_baselines.SingleQueueAdmission`
  (Breakwater-like AIMD on the server's queueing delay, blind to the
  endpoint) behind :class:`ControllerMiddleware`;
* ``svalinn`` — :class:`~sloctl.serving.runtime.admission.AdmissionMiddleware` around
  one :class:`~sloctl.control.admission.Svalinn`: its credits, its
  m_semaphore around ``/mem`` (:class:`~sloctl.serving.runtime.admission.AsyncMSemaphore`,
  waits only within the request's budget) and an AQM before the lock.

:func:`measure_resources` first measures what the machine offers: each
endpoint's isolated service time (sequential requests over HTTP) and the
memory bandwidth of one and of two concurrent copy streams.
:func:`live_experiment` then runs seeded open-loop Poisson load per endpoint
(a memory-and-lock flood beside a moderate CPU load) for every control and
seed; every run is bounded — arrivals stop at ``duration_s``, requests still
out ``grace_s`` later are cancelled and counted as timed out, and a server
that does not start within ``start_timeout_s`` is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from starlette.requests import Request  # at module level: FastAPI resolves the handlers' annotations here

from sloctl.control.admission import InFlightRequest, MemoryGate, RequestProfile, Svalinn
from sloctl.control.aqm import BottleneckAQM, DelayBudget
from sloctl.control.credits import ClassShare, CreditController
from sloctl.control.msemaphore import EpsilonGreedyTuner
from sloctl.serving.local import free_port, stop_process

__all__ = ["CONTROLS", "ENDPOINTS", "AppConfig", "ControllerMiddleware", "build_app", "live_experiment",
           "measure_bandwidth", "measure_resources", "open_loop"]

ENDPOINTS = ("/cpu", "/mem", "/lock")
CONTROLS = ("none", "single-queue", "svalinn")
_ENV = "SLOCTL_ADMISSION_LIVE"
_CHUNK = b"\x5a" * 65536


def _hash_rounds(rounds: int) -> int:
    h = hashlib.sha256()
    for _ in range(rounds):
        h.update(_CHUNK)
    return h.digest()[0]


def llc_bytes() -> int | None:
    """The last-level cache the kernel reports for CPU 0 (bytes), or None."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            with open(f"{base}/{entry}/level") as f:
                level = int(f.read())
            with open(f"{base}/{entry}/size") as f:
                size = f.read().strip()
            factor = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1], 1)
            value = int(size.rstrip("KMG")) * factor
            if best is None or level > best[0]:
                best = (level, value)
    except (OSError, ValueError):
        return None
    return best[1] if best else None


class AppConfig(dict):
    """The app's settings (a plain dict, so that it travels to the server process as JSON)."""

    @classmethod
    def make(cls, control: str = "none", *, mem_mb: int = 1024, copies: int = 2, cpu_rounds: int = 120,
             lock_writes: int = 8, slo_s: Mapping[str, float] | None = None,
             isolated_s: Mapping[str, float] | None = None, max_bandwidth_bytes_per_s: float = 1e10,
             seed: int = 0, server_cores: int = 1) -> AppConfig:
        if control not in CONTROLS:
            raise ValueError(f"The 'control' parameter must be one of {', '.join(CONTROLS)}, got {control!r}.")
        for name, value in (("mem_mb", mem_mb), ("copies", copies), ("cpu_rounds", cpu_rounds),
                            ("lock_writes", lock_writes), ("server_cores", server_cores)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"The '{name}' parameter must be an integer >= 1, got {value!r}.")
        return cls(control=control, mem_mb=mem_mb, copies=copies, cpu_rounds=cpu_rounds, lock_writes=lock_writes,
                   slo_s=dict(slo_s or dict.fromkeys(ENDPOINTS, 1.0)),
                   isolated_s=dict(isolated_s or dict.fromkeys(ENDPOINTS, 0.0)),
                   max_bandwidth_bytes_per_s=float(max_bandwidth_bytes_per_s), seed=seed,
                   server_cores=server_cores)


class ControllerMiddleware:
    """ASGI adapter for any :class:`~sloctl.control.admission.AdmissionController` that decides at arrival
    (here the single-queue baseline): ``on_arrival`` → 503 on refusal; at completion ``on_dequeue("cpu")``
    with the server's queueing delay (time at the server beyond the endpoint's isolated service time) and
    ``on_complete``; ``tick`` at most every ``tick_s``."""

    def __init__(self, app: Callable, controller: Any, profiles: Mapping[str, RequestProfile],
                 isolated_s: Mapping[str, float], tick_s: float = 0.005) -> None:
        self.app, self.controller, self.profiles = app, controller, dict(profiles)
        self.isolated_s, self.tick_s = dict(isolated_s), tick_s
        self._last_tick = time.monotonic()

    async def __call__(self, scope: Any, receive: Callable, send: Callable) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path not in self.profiles:
            await self.app(scope, receive, send)
            return
        now = time.monotonic()
        if now - self._last_tick >= self.tick_s:
            self.controller.tick(now)
            self._last_tick = now
        req = InFlightRequest(self.profiles[path], now)
        if not self.controller.on_arrival(req, now) or not self.controller.on_enqueue(req, "cpu", 0, now):
            self.controller.on_drop(req, now, partial=False)
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": b'{"error": "overloaded", "reason": "no_credit"}'})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            done = time.monotonic()
            req.core_s = done - now
            self.controller.on_dequeue(req, "cpu", max(0.0, req.core_s - self.isolated_s.get(path, 0.0)), done)
            self.controller.on_complete(req, done)


class ServerClock:
    """The outermost ASGI layer of the live app: how long each request spent inside the server process.

    It times every request to ``paths`` from the moment the server hands it to the app to the end of its
    response, apart by outcome (``200`` or not), and answers ``GET /stats`` itself (past every control)
    with ``{path: {"ok", "other", "p50_s", "p99_s"}}`` over the ``200`` answers. Beside the client's
    latencies, which count from the scheduled send time, it shows how much of a tail is the server's."""

    def __init__(self, app: Callable, paths: Sequence[str] = ENDPOINTS) -> None:
        self.app = app
        self.ok_s: dict[str, list[float]] = {p: [] for p in paths}
        self.other = dict.fromkeys(paths, 0)

    async def __call__(self, scope: Any, receive: Callable, send: Callable) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        if path == "/stats":
            body = json.dumps(self.stats()).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if path not in self.ok_s:
            await self.app(scope, receive, send)
            return
        start, status = time.monotonic(), 500

        async def watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if status == 200:
                self.ok_s[path].append(time.monotonic() - start)
            else:
                self.other[path] += 1

    def stats(self) -> dict[str, dict[str, Any]]:
        out = {}
        for path, times in self.ok_s.items():
            ordered = sorted(times)
            out[path] = {"ok": len(ordered), "other": self.other[path],
                         "p50_s": statistics.median(ordered) if ordered else None,
                         "p99_s": _p99(ordered)}
        return out


def _p99(ordered: Sequence[float]) -> float | None:
    """The 99th percentile of sorted samples (nearest rank), None without any."""
    return ordered[min(len(ordered) - 1, int(math.ceil(0.99 * len(ordered))) - 1)] if ordered else None


def build_app(config: Mapping[str, Any]) -> Any:
    """The three-endpoint app under ``config["control"]`` (see :class:`AppConfig`), inside a :class:`ServerClock`."""
    return ServerClock(_controlled_app(config))


def _controlled_app(config: Mapping[str, Any]) -> Any:
    import numpy as np
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    from sloctl.control.admission_baselines import SingleQueueAdmission
    from sloctl.serving.runtime.admission import (
        AdmissionMiddleware,
        AdmissionSettings,
        AsyncMSemaphore,
        MSemaphoreDropped,
    )

    control = config["control"]
    n = config["mem_mb"] * 1024 * 1024 // 8
    src = np.ones(n)
    dst = np.empty(n)
    dst[:] = 0.0  # touch every page now, not during the first request
    lock = asyncio.Lock()
    app = FastAPI(title="sloctl admission live app")
    msem = lock_aqm = svalinn = None
    classes = tuple(p.strip("/") for p in ENDPOINTS)
    if control == "svalinn":
        credits = CreditController(initial_credits=32, min_credits=4, max_credits=512, experiment_s=0.05,
                                   warmup_s=0.02, classes=[ClassShare(c, 1) for c in classes], seed=config["seed"])
        # Arms 1..the server's cores, as Svalinn.for_server builds it: one core streams at most one copy at a
        # time, and a second copy only halves the core every other request gets (issue 21).
        tuner = EpsilonGreedyTuner(config.get("server_cores", 1), config["max_bandwidth_bytes_per_s"],
                                   initial_capacity=1, interval_s=0.01, seed=config["seed"])
        expected = {c: config["isolated_s"]["/" + c] for c in classes}
        svalinn = Svalinn(credits, BottleneckAQM("server", servers=64),
                          MemoryGate(1, tuner, initial_hold_s=expected["mem"]), expected)
        msem = AsyncMSemaphore.around(svalinn.memory_, interval_s=0.01)
        lock_aqm = BottleneckAQM("lock", servers=1, initial_hold_s=expected["lock"], count_in_service=True)

    def copy() -> float:
        for _ in range(config["copies"]):
            np.copyto(dst, src)
        return float(dst[0])

    import sqlite3
    import tempfile

    folder = config.get("work_dir") or tempfile.mkdtemp(prefix="sloctl-admission-live-")
    db = sqlite3.connect(os.path.join(folder, "writes.db"), check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS writes (v BLOB)")
    payload = os.urandom(4096)

    def busy_lock() -> int:
        for _ in range(config["lock_writes"]):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO writes (v) VALUES (?)", (payload,))
            db.execute("COMMIT")
        return 1

    def refuse(reason: str) -> Any:
        return JSONResponse({"error": "overloaded", "reason": reason}, status_code=503, headers={"retry-after": "1"})

    @app.get("/cpu")
    async def cpu() -> Any:
        return {"value": await run_in_threadpool(_hash_rounds, config["cpu_rounds"])}

    @app.get("/mem")
    async def mem(request: Request) -> Any:
        if msem is None:
            return {"value": await run_in_threadpool(copy)}
        budget = getattr(request.state, "sloctl_budget", None)
        try:
            await msem.acquire(budget)
        except MSemaphoreDropped:
            return refuse("m_semaphore")
        start = time.monotonic()
        try:
            value = await run_in_threadpool(copy)
        finally:
            msem.release(time.monotonic() - start)
        msem.record_bytes(2.0 * src.nbytes * config["copies"])
        return {"value": value}

    @app.get("/lock")
    async def locked(request: Request) -> Any:
        budget = getattr(request.state, "sloctl_budget", None)
        if lock_aqm is not None and isinstance(budget, DelayBudget):
            if lock_aqm.should_drop(budget):
                return refuse("lock_budget")
            lock_aqm.joined()
        queued = time.monotonic()
        async with lock:
            if lock_aqm is not None and isinstance(budget, DelayBudget):
                lock_aqm.left(time.monotonic() - queued, budget)
            start = time.monotonic()
            try:
                value = await run_in_threadpool(busy_lock)
            finally:
                if lock_aqm is not None and isinstance(budget, DelayBudget):
                    lock_aqm.observe_hold(time.monotonic() - start)
                    lock_aqm.released()
        return {"value": value}

    @app.get("/healthz")
    async def healthz() -> Any:
        return {"ok": True}

    if control == "svalinn":
        settings = AdmissionSettings(classes=classes, default_class="cpu", concurrency=64)
        return AdmissionMiddleware(app, settings=settings, svalinn=svalinn)
    if control == "single-queue":
        profiles = {p: RequestProfile(p, "be", config["slo_s"][p]) for p in ENDPOINTS}
        target = min(config["slo_s"][p] - config["isolated_s"][p] for p in ENDPOINTS) / 2
        return ControllerMiddleware(app, SingleQueueAdmission(target_delay_s=max(target, 1e-4)), profiles,
                                    config["isolated_s"])
    return app


def __getattr__(name: str) -> Any:  # ``uvicorn sloctl.experiments.admission_live:app`` builds it from the env
    if name == "app":
        return build_app(json.loads(os.environ[_ENV]))
    raise AttributeError(name)


# -- the machine -------------------------------------------------------------------------------------------


def measure_bandwidth(*, mem_mb: int = 1024, streams: int = 1, duration_s: float = 1.0) -> float:
    """Memory bandwidth (bytes/s, reads + writes) of ``streams`` threads each copying its own ``mem_mb`` MiB
    array into another for about ``duration_s``."""
    import numpy as np

    n = mem_mb * 1024 * 1024 // 8
    pairs = [(np.ones(n), np.zeros(n)) for _ in range(streams)]
    moved = [0.0] * streams
    for src, dst in pairs:
        np.copyto(dst, src)  # fault every page in before timing
    start = time.monotonic()
    deadline = start + duration_s

    def run(i: int) -> None:
        src, dst = pairs[i]
        while time.monotonic() < deadline:
            np.copyto(dst, src)  # releases the GIL: the streams run in parallel
            moved[i] += 2.0 * src.nbytes

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(moved) / (time.monotonic() - start)


# -- the load --------------------------------------------------------------------------------------------


async def open_loop(base_url: str, rates_per_s: Mapping[str, float], *, duration_s: float,
                    slo_s: Mapping[str, float], seed: int = 0, max_in_flight: int = 64,
                    grace_s: float = 5.0) -> dict[str, Any]:
    """Seeded open-loop Poisson load per endpoint, bounded: arrivals stop at ``duration_s``; whatever is
    still out ``grace_s`` later is cancelled (``timed_out``). Latency counts from the scheduled send time.
    At most ``max_in_flight`` requests per endpoint are outstanding (one more is ``client_dropped``), so
    that a flood on one endpoint cannot stop the client from sending to another.

    Each request names its endpoint as its class (``x-priority``) and carries its SLO (``x-slo-budget-ms``).
    Returns per endpoint ``{"sent", "ok", "good", "refused", "client_dropped", "timed_out", "errors",
    "goodput_per_s", "p50_s", "p99_s"}`` and ``elapsed_s``.
    """
    import httpx

    rng = random.Random(seed)
    schedule: list[tuple[float, str]] = []
    for path, rate in rates_per_s.items():
        if rate <= 0:
            continue
        t = rng.expovariate(rate)
        while t < duration_s:
            schedule.append((t, path))
            t += rng.expovariate(rate)
    schedule.sort()
    keys = ("sent", "ok", "good", "refused", "client_dropped", "timed_out", "errors")
    counts = {p: dict.fromkeys(keys, 0) for p in rates_per_s}
    latencies: dict[str, list[float]] = {p: [] for p in rates_per_s}
    in_flight = dict.fromkeys(rates_per_s, 0)
    total = max_in_flight * len(rates_per_s)
    limits = httpx.Limits(max_connections=total, max_keepalive_connections=total)
    headers = {p: {"x-priority": p.strip("/"), "x-slo-budget-ms": f"{slo_s[p] * 1e3:.3f}"} for p in rates_per_s}
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=duration_s + grace_s) as client:

        async def one(at: float, path: str) -> None:
            try:
                response = await client.get(path, headers=headers[path])
            except httpx.HTTPError:
                counts[path]["errors"] += 1
                return
            finally:
                in_flight[path] -= 1
            latency = time.monotonic() - start - at
            if response.status_code == 200:
                counts[path]["ok"] += 1
                latencies[path].append(latency)
                counts[path]["good"] += latency <= slo_s[path]
            elif response.status_code == 503:
                counts[path]["refused"] += 1
            else:
                counts[path]["errors"] += 1

        tasks: dict[asyncio.Task, str] = {}
        for at, path in schedule:
            delay = at - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            counts[path]["sent"] += 1
            if in_flight[path] >= max_in_flight:
                counts[path]["client_dropped"] += 1
                continue
            in_flight[path] += 1
            tasks[asyncio.create_task(one(at, path))] = path
        left = max(0.0, start + duration_s + grace_s - time.monotonic())
        _, pending = await asyncio.wait(list(tasks), timeout=left) if tasks else (set(), set())
        for task in pending:
            task.cancel()
            counts[tasks[task]]["timed_out"] += 1
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    out: dict[str, Any] = {}
    for path, c in counts.items():
        lat = sorted(latencies[path])
        out[path] = {**c, "goodput_per_s": c["good"] / duration_s,
                     "p50_s": statistics.median(lat) if lat else math.nan,
                     "p99_s": _p99(lat) if lat else math.nan}
    return {"endpoints": out, "elapsed_s": time.monotonic() - start}


def split_cores(available: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(client cores, server cores)``: the server gets the upper half of ``available`` (at least one core),
    the load generator the rest; ``None`` with fewer than two cores (nothing to split)."""
    cores = sorted(int(c) for c in available)
    if len(cores) < 2:
        return None
    k = max(1, len(cores) // 2)
    return tuple(cores[:-k]), tuple(cores[-k:])


@contextlib.contextmanager
def _pinned(cores: Sequence[int] | None) -> Iterator[None]:
    """Run this process on ``cores`` inside the block (nothing with ``None``); its affinity comes back after,
    also after an error."""
    if cores is None:
        yield
        return
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


class _Server:
    """One ``uvicorn`` process serving the app under ``config`` on a free loopback port.

    ``cores``: pin the server process to these CPUs (set right after it is
    started, before it imports anything, so every thread it makes inherits
    them); ``None`` leaves it where the OS puts it.
    """

    def __init__(self, config: Mapping[str, Any], start_timeout_s: float = 60.0,
                 cores: Sequence[int] | None = None) -> None:
        self.config, self.start_timeout_s = dict(config), start_timeout_s
        self.cores = tuple(cores) if cores else None

    def __enter__(self) -> str:
        import subprocess
        import sys

        import httpx

        port = free_port()
        env = {**os.environ, _ENV: json.dumps(self.config), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "sloctl.experiments.admission_live:app",
                                      "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if self.cores is not None:
            os.sched_setaffinity(self.proc.pid, self.cores)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    return base
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"the live admission app did not start within {self.start_timeout_s:g} s: "
                                   f"{self.proc.stderr.read().decode()[-2000:] if self.proc.stderr else ''}")
            time.sleep(0.1)

    def __exit__(self, *exc: Any) -> None:
        stop_process(self.proc)


def measure_resources(*, mem_mb: int = 1024, copies: int = 2, cpu_rounds: int = 120, lock_writes: int = 8,
                      requests: int = 20, bandwidth_s: float = 1.0, start_timeout_s: float = 60.0,
                      server_cores: Sequence[int] | None = None) -> dict[str, Any]:
    """What the machine offers: memory bandwidth of 1 and 2 copy streams, and each endpoint's isolated
    service time over HTTP (median of ``requests`` sequential requests to the bare app, pinned to
    ``server_cores`` when given)."""
    import httpx

    out: dict[str, Any] = {"llc_bytes": llc_bytes(), "cpus": os.cpu_count(), "mem_mb": mem_mb, "copies": copies,
                           "bandwidth_bytes_per_s": {str(k): measure_bandwidth(mem_mb=mem_mb, streams=k,
                                                                               duration_s=bandwidth_s)
                                                     for k in (1, 2)}}
    import tempfile

    config = AppConfig.make("none", mem_mb=mem_mb, copies=copies, cpu_rounds=cpu_rounds, lock_writes=lock_writes)
    isolated = {}
    with tempfile.TemporaryDirectory(prefix="sloctl-admission-live-") as work_dir, \
            _Server({**config, "work_dir": work_dir}, start_timeout_s, server_cores) as base, \
            httpx.Client(base_url=base, timeout=60) as client:
        for path in ENDPOINTS:
            client.get(path)  # warm
            times = []
            for _ in range(requests):
                t0 = time.monotonic()
                client.get(path).raise_for_status()
                times.append(time.monotonic() - t0)
            isolated[path] = statistics.median(times)
    out["isolated_s"] = isolated
    return out


def live_experiment(*, duration_s: float = 60.0, seeds: Sequence[int] = (0, 1, 2), controls: Sequence[str] = CONTROLS,
                    mem_mb: int = 1024, copies: int = 2, cpu_rounds: int = 120, lock_writes: int = 8,
                    cpu_load: float = 0.25, flood: float = 2.0, max_rate_per_s: float = 100.0,
                    slo_multiple: float = 5.0, slo_floor_s: float = 0.02,
                    grace_s: float = 5.0, start_timeout_s: float = 60.0, calibration_requests: int = 20,
                    bandwidth_s: float = 1.0, split: bool = True, cpu_alone: bool = True,
                    on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Measure the machine, then every control under the same seeded load, per seed.

    ``split`` (default): the load generator (this process) and the server run on separate cores
    (:func:`split_cores` of the CPUs this process may use; on 2 cores one each), so that the client's
    HTTP work does not compete with the server it measures; the affinity is restored at the end. The
    server's cores then count as ``cores`` in the rates below. Without ``split`` (or on one core) both
    share every core, as before 2026-12-03.

    ``cpu_alone`` (default): per seed, first a reference run of the bare app with ``/cpu``'s load only
    (no flood, no control, the same arrivals): the latency ``/cpu`` gets with the server to itself at
    its offered rate, the best any control could give it under the flood.

    ``on_progress(done, total)``: ``(0, total)`` once the machine is measured, then after each
    run; ``total`` = seeds × (controls + the reference run).

    Rates: ``/cpu`` at ``cpu_load`` × (cores ÷ its isolated time); ``/mem`` and ``/lock`` each at
    ``flood`` × (1 ÷ its isolated time) — a flood of each; every rate at most ``max_rate_per_s`` (Python's
    HTTP stack costs about a millisecond of CPU per request on each side: a few hundred requests per
    second take a core by themselves, and a short critical section would ask for thousands). SLO per
    endpoint: ``slo_multiple`` × its isolated time, at least ``slo_floor_s``.

    Returns:
        ``{"resources", "slo_s", "rates_per_s", "runs": [{"control", "seed", "endpoints": {...},
        "elapsed_s", "server"}], "cpu_alone": [{"seed", "endpoints", "server"}], "summary": {control:
        {endpoint: {"goodput_per_s" (mean), "p99_s" (worst)}}, "cpu_alone": ...}, "cpu_goodput_ratio":
        {"vs_none", "vs_single_queue", "svalinn_cpu_p99_within_slo", "cpu_alone_p99_s"} per seed,
        "bound_s", "elapsed_s"}``. ``server`` is the app's own :class:`ServerClock` figures for the run.
    """
    for name, value in (("duration_s", duration_s), ("cpu_load", cpu_load), ("flood", flood)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"The '{name}' parameter of live_experiment must be > 0, got {value!r}.")
    unknown = [c for c in controls if c not in CONTROLS]
    if unknown:
        raise ValueError(f"The 'controls' parameter must hold only {', '.join(CONTROLS)}, got {unknown!r}.")
    began = time.monotonic()
    cores_split = split_cores(os.sched_getaffinity(0)) if split and hasattr(os, "sched_getaffinity") else None
    server_cores = cores_split[1] if cores_split is not None else None
    with _pinned(cores_split[0] if cores_split is not None else None):
        per_run_bound = start_timeout_s + duration_s + grace_s + 15.0  # + the server's stop (≤ 10 s) and the client
        resources = measure_resources(mem_mb=mem_mb, copies=copies, cpu_rounds=cpu_rounds, lock_writes=lock_writes,
                                      requests=calibration_requests, bandwidth_s=bandwidth_s,
                                      start_timeout_s=start_timeout_s, server_cores=server_cores)
        resources["client_cores"] = list(cores_split[0]) if cores_split is not None else None
        resources["server_cores"] = list(server_cores) if server_cores is not None else None
        isolated = resources["isolated_s"]
        cores = len(server_cores) if server_cores is not None else (os.cpu_count() or 1)
        slo = {p: max(slo_multiple * isolated[p], slo_floor_s) for p in ENDPOINTS}
        rates = {"/cpu": cpu_load * cores / isolated["/cpu"], "/mem": flood / isolated["/mem"],
                 "/lock": flood / isolated["/lock"]}
        rates = {p: min(r, max_rate_per_s) for p, r in rates.items()}
        max_bw = max(resources["bandwidth_bytes_per_s"].values())
        runs = []
        import tempfile

        alone_runs: list[dict[str, Any]] = []
        total = len(seeds) * (len(controls) + bool(cpu_alone))

        def one_run(control: str, seed: int, run_rates: Mapping[str, float]) -> dict[str, Any]:
            config = AppConfig.make(control, mem_mb=mem_mb, copies=copies, cpu_rounds=cpu_rounds,
                                    lock_writes=lock_writes, slo_s=slo, isolated_s=isolated,
                                    max_bandwidth_bytes_per_s=max_bw, seed=seed, server_cores=cores)
            with tempfile.TemporaryDirectory(prefix="sloctl-admission-live-") as work_dir, \
                    _Server({**config, "work_dir": work_dir}, start_timeout_s, server_cores) as base:
                result = asyncio.run(open_loop(base, run_rates, duration_s=duration_s, slo_s=slo, seed=seed,
                                               grace_s=grace_s))
                result["server"] = _server_stats(base)
            if on_progress is not None:
                on_progress(len(runs) + len(alone_runs) + 1, total)
            return result

        if on_progress is not None:
            on_progress(0, total)
        for seed in seeds:
            if cpu_alone:
                alone_runs.append({"seed": seed, **one_run("none", seed, {"/cpu": rates["/cpu"]})})
            for control in controls:
                runs.append({"control": control, "seed": seed, **one_run(control, seed, rates)})
    def summarize(mine: Sequence[Mapping[str, Any]], paths: Sequence[str]) -> dict[str, Any]:
        return {p: {"goodput_per_s": statistics.mean(r["endpoints"][p]["goodput_per_s"] for r in mine),
                    "p99_s": max(r["endpoints"][p]["p99_s"] for r in mine)} for p in paths}

    summary: dict[str, Any] = {c: summarize([r for r in runs if r["control"] == c], ENDPOINTS) for c in controls}
    if alone_runs:
        summary["cpu_alone"] = summarize(alone_runs, ("/cpu",))
    ratios = []
    for seed in seeds:
        good = {r["control"]: r["endpoints"]["/cpu"]["goodput_per_s"] for r in runs if r["seed"] == seed}
        row: dict[str, Any] = {"seed": seed}
        if "svalinn" in good:
            for base_name in ("none", "single-queue"):
                if base_name in good:
                    row["vs_" + base_name.replace("-", "_")] = (good["svalinn"] / good[base_name]
                                                                if good[base_name] else math.inf)
            row["svalinn_cpu_p99_within_slo"] = next(
                r["endpoints"]["/cpu"]["p99_s"] for r in runs if r["seed"] == seed and r["control"] == "svalinn"
            ) <= slo["/cpu"]
        alone = [r["endpoints"]["/cpu"]["p99_s"] for r in alone_runs if r["seed"] == seed]
        if alone:
            row["cpu_alone_p99_s"] = alone[0]
            row["cpu_alone_p99_within_slo"] = alone[0] <= slo["/cpu"]
        ratios.append(row)
    return {"resources": resources, "slo_s": slo, "rates_per_s": rates, "duration_s": duration_s,
            "seeds": list(seeds), "controls": list(controls), "runs": runs, "cpu_alone": alone_runs,
            "summary": summary,
            "cpu_goodput_ratio": ratios, "bound_s": resources_bound(start_timeout_s, calibration_requests,
                                                                   bandwidth_s)
            + per_run_bound * (len(runs) + len(alone_runs)),
            "elapsed_s": time.monotonic() - began,
            "world": ("live: uvicorn on loopback, this machine, seeded open-loop load; "
                      + (f"server on cores {list(server_cores)}, load generator on {list(cores_split[0])}"
                         if cores_split is not None else "server and load generator sharing every core"))}


def _server_stats(base: str) -> dict[str, Any] | None:
    """The app's :class:`ServerClock` figures (None if the server no longer answers)."""
    import httpx

    try:
        return httpx.get(base + "/stats", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None


def resources_bound(start_timeout_s: float, requests: int, bandwidth_s: float) -> float:
    """An upper bound on :func:`measure_resources`' wall time with sane service times (< 2 s per request)."""
    return 2 * bandwidth_s + 5.0 + start_timeout_s + 10.0 + len(ENDPOINTS) * (requests + 1) * 2.0
