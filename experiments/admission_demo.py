"""A two-endpoint FastAPI app for live admission experiments, and an open-loop load generator.

``/mem`` copies a large NumPy array (the copy releases the GIL, so it competes
for memory bandwidth and worker threads, not for the interpreter); ``/cpu`` is
light work. Both run in the app's worker thread pool, so without control a
flood of ``/mem`` requests takes every worker and ``/cpu`` waits behind it —
the single-queue fallacy on a small scale. ``build_app(controlled=True)``
wraps the same handlers in :class:`~sloctl.serving.runtime.admission.AdmissionMiddleware`
and guards the copy with an :class:`~sloctl.serving.runtime.admission.AsyncMSemaphore`
(``try_acquire``: a copy that cannot start at once is dropped with 503); both
adapt one :class:`~sloctl.control.admission.Svalinn`, the object the simulator runs.

Run it with ``SLOCTL_ADMISSION_CONTROLLED=1 uvicorn sloctl.experiments.admission_demo:app``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from sloctl.control.admission import MemoryGate, Svalinn
from sloctl.control.aqm import BottleneckAQM
from sloctl.control.credits import ClassShare, CreditController
from sloctl.serving.runtime.admission import AdmissionMiddleware, AsyncMSemaphore

__all__ = ["FloodResult", "build_app", "run_load"]


def build_app(*, controlled: bool, mem_mb: int = 64, msem_capacity: int = 2, credits: int = 16) -> Any:
    """The demo app; ``controlled`` adds the admission middleware and the m_semaphore (one Svalinn behind both)."""
    import numpy as np
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool


    source = np.ones(mem_mb * 1024 * 1024 // 8)
    app = FastAPI(title="sloctl admission demo")
    svalinn = msem = None
    if controlled:
        controller = CreditController(initial_credits=credits, min_credits=2, max_credits=256,
                                      classes=[ClassShare("high", 2), ClassShare("low", 1)])
        svalinn = Svalinn(controller, BottleneckAQM("server", servers=4),
                          MemoryGate(msem_capacity, initial_hold_s=0.01))
        msem = AsyncMSemaphore.around(svalinn.memory_)

    def copy() -> float:
        return float(source.copy()[0])

    def light() -> int:
        return sum(range(200))

    @app.get("/mem")
    async def mem() -> Any:
        if msem is None:
            return {"value": await run_in_threadpool(copy)}
        if not msem.try_acquire():
            return JSONResponse({"error": "memory path busy", "reason": "m_semaphore"}, status_code=503,
                                headers={"retry-after": "1"})
        start = time.monotonic()
        try:
            value = await run_in_threadpool(copy)
        finally:
            msem.release(time.monotonic() - start)
        msem.record_bytes(source.nbytes)
        return {"value": value}

    @app.get("/cpu")
    async def cpu() -> Any:
        return {"value": await run_in_threadpool(light)}

    @app.get("/healthz")
    async def healthz() -> Any:
        return {"ok": True}

    if svalinn is not None:
        return AdmissionMiddleware(app, svalinn=svalinn)
    return app


def _app_from_env() -> Any:
    return build_app(controlled=os.environ.get("SLOCTL_ADMISSION_CONTROLLED", "0") == "1",
                     mem_mb=int(os.environ.get("SLOCTL_ADMISSION_MEM_MB", "64")))


def __getattr__(name: str) -> Any:  # ``uvicorn sloctl.experiments.admission_demo:app`` builds the app on demand
    if name == "app":
        return _app_from_env()
    raise AttributeError(name)


@dataclass(frozen=True)
class FloodResult:
    """Per path: requests sent, 200s, 200s within the SLO (goodput), and latency p99 of the 200s."""

    sent: dict[str, int]
    ok: dict[str, int]
    good: dict[str, int]
    dropped: dict[str, int]
    p99_s: dict[str, float]
    duration_s: float

    def goodput_per_s(self, path: str) -> float:
        return self.good[path] / self.duration_s


async def run_load(base_url: str, rates_per_s: dict[str, float], *, duration_s: float, slo_s: dict[str, float],
                   max_in_flight: int = 256, seed: int = 0, headers: dict[str, dict[str, str]] | None = None
                   ) -> FloodResult:
    """Open-loop Poisson load on each path for ``duration_s``; at most ``max_in_flight`` requests outstanding.

    A request that would exceed ``max_in_flight`` is counted as sent and dropped at the client (bounded
    load generator). Latency is measured from the scheduled send time.
    """
    import httpx

    rng = random.Random(seed)
    schedule: list[tuple[float, str]] = []
    for path, rate in rates_per_s.items():
        t = rng.expovariate(rate)
        while t < duration_s:
            schedule.append((t, path))
            t += rng.expovariate(rate)
    schedule.sort()
    sent = dict.fromkeys(rates_per_s, 0)
    ok = dict.fromkeys(rates_per_s, 0)
    good = dict.fromkeys(rates_per_s, 0)
    dropped = dict.fromkeys(rates_per_s, 0)
    latencies: dict[str, list[float]] = {p: [] for p in rates_per_s}
    in_flight = 0
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0) as client:
        start = time.monotonic()

        async def one(at: float, path: str) -> None:
            nonlocal in_flight
            try:
                response = await client.get(path, headers=(headers or {}).get(path))
            except httpx.HTTPError:
                dropped[path] += 1
                return
            finally:
                in_flight -= 1
            latency = time.monotonic() - start - at
            if response.status_code == 200:
                ok[path] += 1
                latencies[path].append(latency)
                good[path] += latency <= slo_s[path]
            else:
                dropped[path] += 1

        tasks = []
        for at, path in schedule:
            delay = at - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            sent[path] += 1
            if in_flight >= max_in_flight:
                dropped[path] += 1
                continue
            in_flight += 1
            tasks.append(asyncio.create_task(one(at, path)))
        await asyncio.gather(*tasks)
    p99 = {p: (sorted(v)[int(0.99 * (len(v) - 1))] if v else float("nan")) for p, v in latencies.items()}
    return FloodResult(sent=sent, ok=ok, good=good, dropped=dropped, p99_s=p99, duration_s=duration_s)


def live_admission_experiment(*, duration_s: float = 4.0, mem_rate_per_s: float = 150.0, cpu_rate_per_s: float = 100.0,
                              mem_mb: int = 64, slo_s: float = 0.25, seed: int = 0) -> dict[str, Any]:
    """The demo app run twice on a loopback port, without and with admission control, under the same load.

    Returns:
        ``{"without": {...}, "with": {...}}``, each with per-path goodput, p99 and drops.
    """
    import socket
    import subprocess
    import sys

    import httpx

    out: dict[str, Any] = {"duration_s": duration_s, "rates_per_s": {"/mem": mem_rate_per_s, "/cpu": cpu_rate_per_s},
                           "slo_s": slo_s, "mem_mb": mem_mb}
    for name, controlled in (("without", False), ("with", True)):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {**os.environ, "SLOCTL_ADMISSION_CONTROLLED": "1" if controlled else "0",
               "SLOCTL_ADMISSION_MEM_MB": str(mem_mb)}
        server = subprocess.Popen([sys.executable, "-m", "uvicorn", "sloctl.experiments.admission_demo:app", "--host",
                                   "127.0.0.1", "--port", str(port), "--log-level", "warning"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the demo app did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.1)
            result = asyncio.run(run_load(base, {"/mem": mem_rate_per_s, "/cpu": cpu_rate_per_s},
                                          duration_s=duration_s, slo_s={"/mem": slo_s, "/cpu": slo_s}, seed=seed))
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        out[name] = {p: {"sent": result.sent[p], "ok": result.ok[p], "dropped": result.dropped[p],
                         "goodput_per_s": result.goodput_per_s(p), "p99_s": result.p99_s[p]} for p in result.sent}
    return out
