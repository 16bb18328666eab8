"""Slow clients against a server: authenticated latency idle and with 1,000 slow-header connections open.

Starts the real controller runtime (``sloctl serve`` in a subprocess, with a
bearer token, an empty temporary registry: round-robin routing) unless
``--url`` points at a running server (``sloctl gateway`` with
``--auth-header 'Authorization: Basic ...'``, say). Then, side by side:

1. **idle**: authenticated requests (``--method``/``--path``/``--body``, by
   default ``GET /v1/clusters`` with the token) paced at ``--rate`` per second
   on one kept-alive connection for ``--duration`` seconds;
2. **loaded**: the same while a second process holds ``--slow`` connections
   without a token from ``--sources`` loopback addresses (127.0.0.2 on), each
   sending a request head a byte every ``--trickle`` seconds and reconnecting
   whenever the server closes it (so about ``--slow`` stay open throughout);
3. **idle again** (drift check).

It prints p50/p99 of each phase, the errors, how many slow connections were
open and how many the server closed, and ``p99 loaded / p99 idle`` against the
target (< 3). ``--baseline`` starts the runtime as it ran before the guard
(uvicorn's ``limit_concurrency = 1024``, no head or body deadline) for a
before/after comparison.

Run: ``.venv/bin/python benchmarks/bench_slow_clients.py [--json] [--baseline] [--url URL --auth-header H]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

TOKEN = "bench-token-0123456789abcdef"
TARGET_RATIO = 3.0


# -- the server --------------------------------------------------------------------------
def _config(folder: Path) -> Path:
    path = folder / "sloctl.yaml"
    path.write_text(f"registry:\n  tracking_uri: sqlite:///{folder / 'mlflow.db'}\n"
                    f"serve:\n  state_db: {folder / 'state.db'}\n")
    return path


def start_server(folder: Path, port: int, *, baseline: bool) -> subprocess.Popen:
    """``sloctl serve`` (or the pre-guard baseline) on a free loopback port, logging into ``folder``."""
    env = {**os.environ, "SLOCTL_TOKEN": TOKEN, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    config = _config(folder)
    if baseline:
        command = [sys.executable, __file__, "--serve-baseline", str(config), str(port)]
    else:
        command = [str(Path(sys.executable).parent / "sloctl"), "serve", "--config", str(config), "--port", str(port)]
    with open(folder / "server.log", "w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=folder)


def serve_baseline(config: str, port: int) -> None:
    """The runtime as ``sloctl serve`` ran it before the guard: shared ``limit_concurrency``, no deadlines."""
    import uvicorn

    from sloctl.config import load_config
    from sloctl.serving._http_guard import raise_nofile_limit
    from sloctl.serving.runtime.app import create_app

    raise_nofile_limit()
    cfg = load_config(Path(config))
    uvicorn.run(create_app(cfg, token=TOKEN), host="127.0.0.1", port=port, log_level="warning", http="h11",
                limit_concurrency=1024, timeout_keep_alive=cfg.serve.keep_alive_s,
                h11_max_incomplete_event_size=cfg.serve.max_header_bytes)


def wait_ready(url: str, proc: subprocess.Popen | None, timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not become ready on {url}")
        time.sleep(0.2)


# -- the slow clients (a separate process, so that the measuring client has its own GIL) ---------------
def slow_clients(host: str, port: int, n: int, sources: list[str], trickle_s: float, path: str,
                 counters: Any, stop: Any) -> None:
    """Hold ``n`` slow-header connections (no token): ``counters`` = [open, connects, closed by the server]."""
    from sloctl.serving._http_guard import raise_nofile_limit

    raise_nofile_limit()

    async def one(i: int) -> None:
        source = sources[i % len(sources)]
        await asyncio.sleep(i * 0.002)  # a ramp: 1,000 connects over 2 s
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            except OSError:
                await asyncio.sleep(trickle_s)
                continue
            counters[0] += 1
            counters[1] += 1
            opened = time.monotonic()
            try:
                writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode())
                while not stop.is_set():
                    try:
                        await asyncio.wait_for(reader.read(4096), timeout=trickle_s)
                        break  # an answer (408) or EOF: the server closed it
                    except TimeoutError:
                        writer.write(b"x")
                        await writer.drain()
                if not stop.is_set():
                    counters[2] += 1
            except OSError:
                counters[2] += 1
            finally:
                counters[0] -= 1
                writer.close()
            if time.monotonic() - opened < trickle_s:  # refused at once: back off before trying again
                await asyncio.sleep(trickle_s)

    async def main() -> None:
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


# -- the measuring client ----------------------------------------------------------------
def measure(url: str, headers: dict[str, str], method: str, path: str, body: str | None, *, rate_per_s: float,
            duration_s: float, warmup: int = 20) -> dict[str, Any]:
    """Paced authenticated requests on one kept-alive connection; latency per request and errors."""
    import httpx

    latency_ms: list[float] = []
    errors: Counter[str] = Counter()
    content = body.encode() if body is not None else None
    if content is not None:
        headers = {"content-type": "application/json", **headers}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for _ in range(warmup):
            client.request(method, path, content=content)
        interval = 1.0 / rate_per_s
        start = time.perf_counter()
        next_at = start
        while next_at - start < duration_s:
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            began = time.perf_counter()
            try:
                status = client.request(method, path, content=content).status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            latency_ms.append((time.perf_counter() - began) * 1e3)
            if not (isinstance(status, int) and status < 400):
                errors[str(status)] += 1
            next_at += interval
    a = np.asarray(latency_ms)
    return {"requests": len(a), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max()), "errors": dict(errors)}


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process (Linux /proc; NaN where unknown)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(args: argparse.Namespace, url: str, headers: dict[str, str], say: Any, server_pid: int | None = None
        ) -> dict[str, Any]:
    parts = urlsplit(url)
    sources = [f"127.0.0.{2 + i}" for i in range(args.sources)]

    def phase(attacker_pid: int | None = None) -> dict[str, Any]:
        """One measured phase, with the CPU the server (and the slow clients) spent per wall second."""
        cpu0, slow0, wall0 = _cpu_s(server_pid), _cpu_s(attacker_pid), time.perf_counter()
        out = measure(url, headers, args.method, args.path, args.body, rate_per_s=args.rate,
                      duration_s=args.duration)
        wall = time.perf_counter() - wall0
        out["server_cpu_per_wall"] = (_cpu_s(server_pid) - cpu0) / wall
        if attacker_pid is not None:
            out["slow_clients_cpu_per_wall"] = (_cpu_s(attacker_pid) - slow0) / wall
        return out

    say(f"idle: {args.method} {args.path} at {args.rate:g}/s for {args.duration:g} s ...")
    idle = phase()
    counters = mp.Array("q", 3, lock=False)
    stop = mp.Event()
    attacker = mp.Process(target=slow_clients, args=(parts.hostname, parts.port, args.slow, sources, args.trickle,
                                                     args.path, counters, stop), daemon=True)
    attacker.start()
    deadline = time.monotonic() + 15
    while counters[0] < 0.95 * args.slow and time.monotonic() < deadline:
        time.sleep(0.1)
    say(f"loaded: {counters[0]} slow-header connections open from {len(sources)} address(es) "
        f"({sources[0]}..{sources[-1]}) ...")
    samples: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.1):
            samples.append(int(counters[0]))

    sampler = threading.Thread(target=sample, daemon=True)
    connects0, closed0 = int(counters[1]), int(counters[2])
    sampler.start()
    loaded = phase(attacker.pid)
    sampling.set()
    sampler.join()
    slow = {"target": args.slow, "open_min": min(samples), "open_mean": float(np.mean(samples)),
            "open_max": max(samples), "connects_during": int(counters[1]) - connects0,
            "closed_by_server_during": int(counters[2]) - closed0}
    stop.set()
    attacker.join(timeout=30)
    if attacker.is_alive():
        attacker.kill()
    say("idle again ...")
    after = phase()
    ratio = loaded["p99_ms"] / idle["p99_ms"]
    return {"url": url, "request": f"{args.method} {args.path}", "idle": idle, "loaded": loaded, "idle_after": after,
            "slow_clients": slow, "sources": len(sources), "ratio_p99": ratio,
            "target": {"ratio_p99_below": TARGET_RATIO, "ok": ratio < TARGET_RATIO and not loaded["errors"]},
            "cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description="Authenticated latency idle and with slow-header connections open.")
    parser.add_argument("--url", help="a running server (default: start `sloctl serve` on a free loopback port)")
    parser.add_argument("--token", default=None, help=f"bearer token for --url (default: {TOKEN!r} for the "
                                                      "started server)")
    parser.add_argument("--auth-header", default=None, help="a whole header instead of the bearer token, e.g. "
                                                            "'Authorization: Basic dXNlcjpwYXNz'")
    parser.add_argument("--method", default="GET")
    parser.add_argument("--path", default="/v1/clusters", help="the authenticated request (default: a view, "
                                                               "sent with the token: authenticated work)")
    parser.add_argument("--body", default=None, help="a JSON body for --method POST")
    parser.add_argument("--slow", type=int, default=1000, help="slow-header connections to hold")
    parser.add_argument("--sources", type=int, default=16, help="loopback addresses they come from (127.0.0.2 "
                                                                "on); 1,000 over 16 stay under the default "
                                                                "per-client cap of 64")
    parser.add_argument("--trickle", type=float, default=1.0, help="seconds between a slow client's header bytes")
    parser.add_argument("--rate", type=float, default=100.0, help="authenticated requests per second")
    parser.add_argument("--duration", type=float, default=12.0, help="seconds per phase (longer than the "
                                                                     "header timeout, so slow ones are cut)")
    parser.add_argument("--baseline", action="store_true", help="start the runtime as it was before the guard")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--serve-baseline", nargs=2, metavar=("CONFIG", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_baseline:
        serve_baseline(args.serve_baseline[0], int(args.serve_baseline[1]))
        return

    from sloctl.serving._http_guard import raise_nofile_limit
    from sloctl.serving.local import free_port, stop_process

    raise_nofile_limit()
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    if args.auth_header:
        name, _, value = args.auth_header.partition(":")
        headers = {name.strip(): value.strip()}
    else:
        headers = {"Authorization": f"Bearer {args.token or TOKEN}"}
    if args.url:
        result = run(args, args.url.rstrip("/"), headers, say)
    else:
        with tempfile.TemporaryDirectory(prefix="sloctl-bench-slow-") as tmp:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc = start_server(Path(tmp), port, baseline=args.baseline)
            try:
                wait_ready(url, proc)
                say(f"{'baseline runtime' if args.baseline else 'sloctl serve'} on {url} (pid {proc.pid}); "
                    f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
                result = run(args, url, headers, say, server_pid=proc.pid)
            finally:
                stop_process(proc)
        result["server"] = "baseline (limit_concurrency 1024, no deadlines)" if args.baseline else "sloctl serve"
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"\n{result['request']} on {result['url']}, {args.rate:g}/s for {args.duration:g} s per phase")
    print(f"{'':34}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'server CPU':>11}  errors")
    for name, key in (("idle", "idle"), (f"{args.slow} slow-header connections", "loaded"),
                      ("idle again", "idle_after")):
        m = result[key]
        print(f"{name:34}{m['p50_ms']:9.2f}{m['p99_ms']:9.2f}{m['max_ms']:9.2f}{m['server_cpu_per_wall']:11.2f}  "
              f"{m['errors'] or '-'}")
    print(f"the slow clients' own CPU during the loaded phase: {result['loaded']['slow_clients_cpu_per_wall']:.2f} "
          f"(on this machine's {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f})")
    s = result["slow_clients"]
    print(f"slow connections open during the loaded phase: min {s['open_min']}, mean {s['open_mean']:.0f}, max "
          f"{s['open_max']} ({result['sources']} source addresses); the server closed "
          f"{s['closed_by_server_during']} and they reconnected {s['connects_during']} times meanwhile")
    print(f"p99 loaded / p99 idle = {result['ratio_p99']:.2f} (target < {TARGET_RATIO:g}): "
          f"{'ok' if result['target']['ok'] else 'MISSED'}")


if __name__ == "__main__":
    main()
