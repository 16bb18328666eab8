"""AutoSLO end to end, live (issue 17, part 4): the runtime enacts the plan on budgeted DuckDB clusters.

One scenario of :func:`~sloctl.experiments.end_to_end.end_to_end_experiment`
(the first day, one ``κ``) runs again on the live warehouse:

* **AutoSLO through the runtime.** The scenario's tuned plan (its starting
  clusters, scheduled spin-ups, teardown timers, with the reactive knobs the
  simulation enacted it with) is registered as an ``execution-config``
  beside the Iconq+ model in an MLflow store, and a real ``sloctl serve``
  (a subprocess on a free loopback port, ``plan_epoch: load``,
  ``plan_clock: compressed``) enacts it. A driver (:func:`drive_through_runtime`)
  replays the scenario's arrivals, routes each with ``POST /v1/route``, runs it
  on the real cluster of that id, reports ``POST /v1/complete``, and keeps the
  real clusters in step with the runtime's (``GET /v1/clusters``: ready and
  starting clusters; :class:`ClusterMirror`). Every enacted spin-up (the
  runtime's ``enacted`` and scaling ``events``) and every real start and
  stop is logged in the result.
* **The best baseline from simulation** (the cheapest that met ``τ``, else the
  lowest VR) on the same arrivals, with :func:`~sloctl.serving.live.run_live`
  and the controller the simulation ran (fixed clusters round-robin, Queue@N
  with the packing router, or the RAIS emulation).

Time. The simulation's seconds are the grading log's; the live replay
multiplies every time of the scenario by ``time_scale`` (arrivals, plan
times, teardown timers, the trigger's window, the billing minimum, the
spin-up delay): with 1 the live day is the simulated one; below 1 the day is
shorter and, service times being what they are, the load is ``1 /
time_scale`` times the simulated load. SLOs are not scaled. Costs are
size-1 cluster-hours of the compressed day, as in simulation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloctl.control.autoscaler import AutoscalerConfig, RelativeAutoscalerSettings
from sloctl.control.billing import BillingTimer
from sloctl.control.router import Query, RoundRobinRouter
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup, ScheduledSpinups
from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.pool import QueryRequest
from sloctl.serving.local import free_port, stop_process

__all__ = ["ClusterMirror", "LiveEndToEndConfig", "RuntimeLog", "best_baseline",
           "cluster_core_units", "drive_through_runtime", "end_to_end_live", "scale_plan", "scaled_queries"]

#: How long the runtime may take to start and load its model.
_STARTUP_TIMEOUT_S = 180.0
#: How long a real cluster may take to start.
_SPIN_UP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LiveEndToEndConfig:
    """How the live replay runs.

    Attributes:
        kappa: the scenario's ``κ`` (its day is the first).
        time_scale: live seconds per simulated second; ``None``: 1, or less
            so that the day lasts at most ``max_day_s``.
        max_day_s: the longest live day ``time_scale=None`` allows.
        poll_s: how often the driver reads the runtime's cluster set.
        start_margin_s: the runtime's spin-up delay over the real warm-up
            (a process start), so its clusters are real when it routes to them.
        timeout_s: per-query timeout (a timed-out query is violated).
        budgets: sizes as CPU budgets beside the controller's reserved core
            (``warehouse.pool_options()``); else whole pinned cores.
        tracking_uri: the MLflow store to register in (``None``: a temporary
            one); in a store of yours the names get ``-e2e-live`` so no
            champion of yours moves.
        max_queries: replay only the day's first arrivals (a smoke run;
            ``None``: the whole day). Both approaches get the same ones.
    """

    kappa: float = 2.0
    time_scale: float | None = None
    max_day_s: float = 300.0
    poll_s: float = 0.25
    start_margin_s: float = 0.25
    timeout_s: float = 60.0
    budgets: bool = True
    tracking_uri: str | None = None
    max_queries: int | None = None

    def validate(self) -> None:
        if self.max_queries is not None and not self.max_queries >= 1:
            raise ValueError(f"The 'max_queries' parameter of LiveEndToEndConfig must be >= 1 or None, "
                             f"got {self.max_queries!r}.")
        for name in ("kappa", "max_day_s", "poll_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"The '{name}' parameter of LiveEndToEndConfig must be > 0, "
                                 f"got {getattr(self, name)!r}.")
        if self.time_scale is not None and not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"The 'time_scale' parameter of LiveEndToEndConfig must be > 0 or None, "
                             f"got {self.time_scale!r}.")
        if not self.start_margin_s >= 0:
            raise ValueError(f"The 'start_margin_s' parameter of LiveEndToEndConfig must be >= 0, "
                             f"got {self.start_margin_s!r}.")


# -- what to run live ---------------------------------------------------------------------------------------

def cluster_core_units(pool_options: Mapping[str, Any] | None) -> int:
    """Size units the cluster cores give without oversubscribing them (cores beside the reserved ones).

    With CPU budgets (``size_unit_cores``) a cluster of size N takes N ×
    ``size_unit_cores`` cores; pinned (``None``), N whole cores.
    """
    options = dict(pool_options or {})
    cores = len(os.sched_getaffinity(0)) - int(options.get("reserved_cores") or 0)
    if cores < 1:
        raise ValueError(f"No core is left for clusters: {len(os.sched_getaffinity(0))} usable, "
                         f"{options.get('reserved_cores')} reserved for the controller.")
    unit = options.get("size_unit_cores")
    return cores if unit is None else max(1, int(math.floor(cores / float(unit) + 1e-9)))


def best_baseline(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The cheapest baseline that met ``τ`` in simulation, else the one with the lowest VR."""
    others = {k: v for k, v in results.items() if k != "autoslo"}
    if not others:
        raise ValueError("The 'results' parameter of best_baseline must hold a baseline beside autoslo, got none.")
    meeting = [k for k, v in others.items() if v["meets_tau"]]
    if meeting:
        return min(meeting, key=lambda k: (others[k]["cost"], k))
    return min(others, key=lambda k: (others[k]["vr"], others[k]["cost"], k))


def scaled_queries(queries: Sequence[Query], time_scale: float) -> list[Query]:
    """The same arrivals at ``time_scale ×`` their times (SLOs unchanged: service times are not scaled)."""
    return [dataclasses.replace(q, arrival_s=q.arrival_s * time_scale) for q in queries]


def scale_plan(plan: ExecutionConfig, knobs: AutoscalerConfig | None, time_scale: float,
               spinup_delay_s: float) -> ExecutionConfig:
    """The plan in live seconds: spin-up times and the knobs' times × ``time_scale``, ``δ`` the live one.

    Args:
        plan: the tuned plan (simulated seconds).
        knobs: the reactive knobs the simulation enacted it with (``None``: the plan's own).
        time_scale: live seconds per simulated second.
        spinup_delay_s: the live ``δ`` (already in live seconds).
    """
    knobs = knobs if knobs is not None else plan.autoscaler
    live_knobs = None
    if knobs is not None:
        live_knobs = dataclasses.replace(knobs, window_s=knobs.window_s * time_scale,
                                         t_idle_s=knobs.t_idle_s * time_scale,
                                         t_min_lifetime_s=knobs.t_min_lifetime_s * time_scale,
                                         spinup_delay_s=spinup_delay_s)
    spinups = tuple(dataclasses.replace(s, time_s=s.time_s * time_scale) for s in plan.spinups)
    return ExecutionConfig(spinups=spinups, autoscaler=live_knobs, start_sizes=tuple(plan.start_sizes))


# -- the runtime's cluster set, mirrored by real clusters ----------------------------------------------------

class ClusterMirror:
    """Real clusters with the ids and sizes of the runtime's (ready and starting) clusters.

    :meth:`sync` stops each real cluster the runtime no longer holds once its
    queries have drained (the runtime retires busy clusters, the pool must
    not kill their queries), then starts a real cluster for every runtime
    cluster it has not got. A start the cluster cores cannot hold while a
    let-go cluster still drains is deferred to a later sync (its queries
    wait), never run oversubscribed. Every start, deferral and stop lands in
    :attr:`log`.

    Args:
        pool: a :class:`~sloctl.datasets.pool.ClusterPool` (``spin_up(size,
            cluster_id=)``, ``tear_down``, ``clusters()``).
        clock: the run clock, for the log.
    """

    def __init__(self, pool: Any, clock: Callable[[], float]) -> None:
        self.pool = pool
        self.clock = clock
        self.live: dict[str, int] = {}
        self.stopping: set[str] = set()
        self.deferred: set[str] = set()
        self.log: list[dict[str, Any]] = []

    @staticmethod
    def wanted(view: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
        """``{cluster_id: (size, "ready" | "starting")}`` of a ``GET /v1/clusters`` body."""
        out = {c["cluster_id"]: (int(c["size"]), "ready") for c in view.get("clusters", [])}
        out.update({c["cluster_id"]: (int(c["size"]), "starting") for c in view.get("starting", [])})
        return out

    def sync(self, view: Mapping[str, Any], busy: Callable[[str], int]) -> None:
        """Bring the real clusters in line with ``view`` (``busy(cid)``: queries running there)."""
        wanted = self.wanted(view)
        for cid in wanted:
            self.stopping.discard(cid)
        for cid in [c for c in self.live if c not in wanted]:
            self.stopping.add(cid)
        self.stop_drained(busy)  # first: a cluster let go frees its cores for the ones the runtime adds
        for cid, (size, state) in wanted.items():
            if cid in self.live:
                continue
            try:
                self.pool.spin_up(size, cluster_id=cid)
            except ClusterPoolError:
                if not self.stopping:
                    raise
                # the cores are still held by a cluster draining its last queries: start at a later sync
                # (queries routed to it are held until it is ready)
                if cid not in self.deferred:
                    self.deferred.add(cid)
                    self.log.append({"t": self.clock(), "event": "deferred", "cluster_id": cid, "size": size,
                                     "draining": sorted(self.stopping)})
                continue
            self.deferred.discard(cid)
            self.live[cid] = size
            self.log.append({"t": self.clock(), "event": "start", "cluster_id": cid, "size": size,
                             "runtime_state": state})

    def stop_drained(self, busy: Callable[[str], int]) -> None:
        """Stop the clusters the runtime let go that run nothing any more."""
        for cid in sorted(self.stopping):
            if busy(cid):
                continue
            self.pool.tear_down(cid)
            self.stopping.discard(cid)
            size = self.live.pop(cid)
            self.log.append({"t": self.clock(), "event": "stop", "cluster_id": cid, "size": size})

    def state(self, cluster_id: str) -> str | None:
        """The real cluster's state (``starting``, ``ready``, ``stopped``, ``failed``; ``None``: never started)."""
        for info in self.pool.clusters():
            if info.cluster_id == cluster_id:
                return info.state
        return None


class RuntimeLog:
    """The runtime's scaling events and enacted spin-ups, gathered across polls (its views keep only the last ones)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.enacted: list[dict[str, Any]] = []
        self._seen: set[tuple] = set()
        self._enacted_seen: set[tuple] = set()

    def add_clusters_view(self, view: Mapping[str, Any]) -> None:
        for event in view.get("events", []):
            key = (event.get("at"), event.get("event"), event.get("cluster_id"), event.get("origin"))
            if key not in self._seen:
                self._seen.add(key)
                self.events.append(dict(event))

    def add_execution_view(self, view: Mapping[str, Any]) -> None:
        for spinup in view.get("enacted", []):
            key = (spinup.get("at"), spinup.get("cluster_id"))
            if key not in self._enacted_seen:
                self._enacted_seen.add(key)
                self.enacted.append(dict(spinup))


# -- the driver ---------------------------------------------------------------------------------------------

def drive_through_runtime(client: Any, headers: Mapping[str, str], pool: Any, queries: Sequence[Query],
                          sql_by_template: Mapping[str, str], *, day_start_wall_s: float, minimum_s: float,
                          price_per_unit_s: float = 1.0, poll_s: float = 0.25, timeout_s: float | None = 60.0,
                          on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Replay ``queries`` through a running ``sloctl serve`` onto real clusters that mirror its pool.

    The run clock's zero is ``day_start_wall_s`` (the plan's day start, on
    the wall clock). At each arrival the runtime routes (``POST /v1/route``);
    the query runs on the real cluster of that id, held until that cluster is
    ready if the runtime routes to it first; its completion goes back with
    ``POST /v1/complete``. The cluster set is read every ``poll_s`` and
    whenever the runtime names a cluster the driver has not started. Billing
    is the simulator's (``price × size × active time``, a ``minimum_s``
    window), from routing to the measured end.

    Returns:
        ``vr``, ``cost`` (price × size × seconds), ``queries`` (rows),
        ``held`` (queries that waited for a real cluster), ``log`` (real
        starts and stops), ``start_lag_s`` (the run clock when the replay
        began: arrivals before it went out late), ``runtime_events``,
        ``enacted``, ``runtime`` (its own bill and violation rate) and
        ``oversubscribed`` rows.
    """
    pending = sorted(queries, key=lambda q: (q.arrival_s, q.query_id))
    base = time.monotonic() - (time.time() - day_start_wall_s)

    def now() -> float:
        return time.monotonic() - base

    mirror = ClusterMirror(pool, now)
    runtime_log = RuntimeLog()
    timers: dict[str, BillingTimer] = {}
    timer_t: dict[str, float] = {}
    sizes: dict[str, int] = {}
    running: dict[int, tuple[Query, str, float]] = {}
    held: dict[str, list[Query]] = {}
    records: dict[int, dict[str, Any]] = {}
    n_held = 0

    def busy(cid: str) -> int:
        return sum(1 for _, c, _ in running.values() if c == cid)

    def poll() -> None:
        view = client.get("/v1/clusters").json()
        runtime_log.add_clusters_view(view)
        mirror.sync(view, busy)
        for c in (*view.get("clusters", []), *view.get("starting", [])):
            sizes.setdefault(c["cluster_id"], int(c["size"]))

    def bill(cid: str, t: float, arrived: bool) -> None:
        timer = timers.setdefault(cid, BillingTimer(minimum_s))
        t = max(t, timer_t.get(cid, -math.inf))  # completions are observed late (see run_live)
        timer_t[cid] = t
        timer.query_arrived(t) if arrived else timer.query_finished(t)

    def submit(cid: str, query: Query) -> None:
        pool.submit(cid, QueryRequest(query.query_id, sql_by_template[query.template], timeout_s))

    def release_held() -> None:
        for cid in list(held):
            state = mirror.state(cid)
            if state == "ready":
                for query in held.pop(cid):
                    submit(cid, query)
            elif state in ("failed", "stopped"):
                raise ClusterPoolError(f"Cluster {cid!r} is {state} with {len(held[cid])} queries waiting for it.")

    def finish(done: Any) -> None:
        query, cid, routed = running.pop(done.query_id)
        end = done.end_s - base
        bill(cid, end, arrived=False)
        latency = end - query.arrival_s
        status = done.status if done.status in ("ok", "error", "timeout") else "error"
        client.post("/v1/complete", json={"query_id": query.query_id, "latency_s": max(latency, 0.0),
                                          "status": status}, headers=headers).raise_for_status()
        records[query.query_id] = {
            "query_id": query.query_id, "template": query.template, "cluster_id": cid,
            "cluster_size": sizes.get(cid, mirror.live.get(cid)), "arrival_s": query.arrival_s, "routed_s": routed,
            "start_s": done.start_s - base, "end_s": end, "latency_s": latency, "slo_s": query.slo_s,
            "violated": bool(done.status != "ok" or latency > query.slo_s), "status": done.status,
            "oversubscribed": bool(getattr(done, "oversubscribed", False))}
        mirror.stop_drained(busy)
        if on_progress is not None:
            on_progress(len(records), len(pending))

    poll()
    for cid in list(mirror.live):
        pool.wait_ready(cid, timeout_s=_SPIN_UP_TIMEOUT_S)
    last_poll = start_lag_s = now()  # arrivals due before this are dispatched late (latency counts from arrival)
    i = 0
    while i < len(pending) or running:
        t = now()
        if t - last_poll >= poll_s:
            poll()
            last_poll = t
        if held:
            release_held()
        if i < len(pending) and pending[i].arrival_s <= t:
            for done in sorted(pool.completions(timeout_s=0), key=lambda c: c.end_s):
                if done.query_id in running:
                    finish(done)
            query = pending[i]
            i += 1
            response = client.post("/v1/route", json={"query_id": query.query_id, "template": query.template,
                                                      "slo_s": query.slo_s}, headers=headers)
            if response.status_code != 200:
                raise ValueError(f"the runtime refused to route query {query.query_id}: {response.text[:300]}")
            cid = response.json()["cluster_id"]
            routed = now()
            if cid not in mirror.live:  # a cluster that became ready since the last poll
                poll()
                last_poll = routed
            bill(cid, routed, arrived=True)
            running[query.query_id] = (query, cid, routed)
            if mirror.state(cid) == "ready" and cid not in held:
                submit(cid, query)
            else:
                held.setdefault(cid, []).append(query)
                n_held += 1
            continue
        waits = [poll_s - (t - last_poll)]
        if i < len(pending):
            waits.append(pending[i].arrival_s - t)
        if held:
            waits.append(0.05)
        batch = pool.completions(timeout_s=max(0.0, min(waits)))
        for done in sorted(batch, key=lambda c: c.end_s):
            if done.query_id in running:
                finish(done)
        if not batch and running:  # a cluster that died with queries in flight would never report them
            for cid in {c for _, c, _ in running.values()} - set(held):
                state = mirror.state(cid)
                if state in ("failed", "stopped"):
                    raise ClusterPoolError(f"Cluster {cid!r} is {state} with queries in flight.")
    poll()
    runtime_log.add_execution_view(_execution_view(client))
    final = client.get("/v1/clusters").json()
    runtime_log.add_clusters_view(final)
    horizon = max([*timer_t.values(), 0.0]) + 1e6
    cost = sum(price_per_unit_s * sizes.get(cid, mirror.live.get(cid, 1)) * timer.active_s(horizon)
               for cid, timer in timers.items())
    rows = [records[q.query_id] for q in pending]
    vr = sum(r["violated"] for r in rows) / len(rows) if rows else 0.0
    return {"vr": vr, "cost": cost, "queries": rows, "held": n_held, "log": mirror.log, "start_lag_s": start_lag_s,
            "runtime_events": runtime_log.events, "enacted": runtime_log.enacted,
            "oversubscribed": sum(r["oversubscribed"] for r in rows),
            "runtime": {"total_cost": final.get("total_cost"), "violation_rate": final.get("violation_rate"),
                        "completed": final.get("completed"), "model": final.get("model")}}


def _execution_view(client: Any) -> dict[str, Any]:
    response = client.get("/v1/execution-config")
    return response.json() if response.status_code == 200 else {}


# -- the runtime as a subprocess -----------------------------------------------------------------------------

def register_bundle(folder: str | Path, *, tracking_uri: str, experiment: str, name: str) -> str:
    """Register a model bundle folder as ``name`` (alias ``champion``) so that ``sloctl serve`` loads it."""
    import json

    from mlflow import MlflowClient

    from sloctl.registry.pyfunc import LatencyPyfunc
    from sloctl.registry.store import connect, pip_requirements

    kind = json.loads((Path(folder) / "meta.json").read_text())["kind"]
    mlflow = connect(tracking_uri)
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"end-to-end-live-{name}"):
        mlflow.set_tags({"model_kind": kind, "source": str(folder), "used_for": "sloctl experiment end-to-end --live"})
        info = mlflow.pyfunc.log_model(name="model", python_model=LatencyPyfunc(), artifacts={"bundle": str(folder)},
                                       pip_requirements=pip_requirements(kind), registered_model_name=name)
    version = str(info.registered_model_version)
    MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).set_registered_model_alias(
        name, "champion", version)
    return version


@contextlib.contextmanager
def serve_subprocess(folder: Path, *, tracking_uri: str, experiment: str, model_uri: str, execution_uri: str,
                     spinup_delay_s: float, router: Mapping[str, Any], token: str,
                     cores: Sequence[int] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """``sloctl serve`` on a free loopback port with a config of its own; yields ``(url, process)``.

    The plan's day starts when it comes into force (``plan_epoch: load``) and
    its times are read as the compressed day's (``plan_clock: compressed``).
    With ``cores`` the process runs on them (the controller's reserved core).
    """
    import yaml

    port = free_port()
    config = {
        "registry": {"tracking_uri": tracking_uri, "experiment": experiment},
        "router": dict(router),
        "serve": {"host": "127.0.0.1", "port": port, "cluster_sizes": [1], "model_uri": model_uri,
                  "fallback_uri": "models:/stage-e2e-live-none@champion", "execution_uri": execution_uri,
                  "admission_uri": "models:/admission-e2e-live-none@champion",
                  "retry_uri": "models:/retry-e2e-live-none@champion",
                  "watch_interval_s": 0.2, "state_db": str(folder / "state.db"), "plan_epoch": "load",
                  "plan_clock": "compressed", "spinup_delay_s": float(spinup_delay_s)},
    }
    path = folder / "serve.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    stderr = open(folder / "serve.stderr", "w")  # noqa: SIM115 - closed below
    preexec = (lambda: os.sched_setaffinity(0, set(cores))) if cores else None
    env = {**os.environ, "SLOCTL_TOKEN": token}
    if cores:  # one intra-op thread per core it may use: more only wait on each other (serving.live.torch_threads)
        env["OMP_NUM_THREADS"] = str(len(cores))
    process = subprocess.Popen([sys.executable, "-m", "sloctl.cli", "serve", "--config", str(path)], cwd=folder,
                               env=env, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=preexec)
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        stop_process(process, timeout_s=20)
        stderr.close()


def _wait(what: str, check: Callable[[], Any], process: subprocess.Popen, folder: Path, timeout_s: float) -> Any:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"sloctl serve exited ({process.returncode}) while waiting for {what}: "
                               f"{(folder / 'serve.stderr').read_text()[-2000:]}")
        try:
            value = check()
            if value:
                return value
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"sloctl serve: no {what} after {timeout_s:g} s; its log: "
                               f"{(folder / 'serve.stderr').read_text()[-2000:]}")
        time.sleep(0.1)


def run_autoslo_through_runtime(db_path: str | Path, queries: Sequence[Query], plan: ExecutionConfig, *,
                                model_dir: str | Path, day: str, time_scale_doc: Mapping[str, float],
                                minimum_s: float, spinup_delay_s: float, router: Mapping[str, Any],
                                pool_options: Mapping[str, Any] | None, cfg: LiveEndToEndConfig,
                                experiment: str = "sloctl-e2e-live",
                                on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Register ``plan`` and the model, start ``sloctl serve``, and drive ``queries`` through it live.

    ``plan`` is in live seconds (:func:`scale_plan`); the runtime's ``δ`` is
    ``spinup_delay_s`` (the real warm-up plus ``cfg.start_margin_s``).
    """
    import httpx

    from sloctl.control.policies import ExecutionPlan
    from sloctl.datasets.duckdb_pool import DuckDBClusterPool
    from sloctl.registry.store import register_policy

    options = {**dict(pool_options or {}), "allow_oversubscribe": False}  # a plan that does not fit is refused
    router = {**_plain(router), "minimum_s": minimum_s}  # the runtime bills as the driver does
    reserved = None
    if options.get("size_unit_cores") is not None and options.get("reserved_cores"):
        reserved = sorted(os.sched_getaffinity(0))[:int(options["reserved_cores"])]
    warmup_s = max(spinup_delay_s - cfg.start_margin_s, 0.0)
    suffix = "" if cfg.tracking_uri is None else "-e2e-live"
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sloctl-e2e-live-")))
        tracking_uri = cfg.tracking_uri or f"sqlite:///{folder / 'mlflow.db'}"
        if cfg.tracking_uri is None:  # artifacts in the temporary folder too, not ./mlruns where the user stands
            from sloctl.registry.store import connect

            connect(tracking_uri).create_experiment(experiment, artifact_location=(folder / "artifacts").as_uri())
        model_name, plan_name = f"iconq{suffix}", f"execution-config{suffix}"
        model_version = register_bundle(model_dir, tracking_uri=tracking_uri, experiment=experiment, name=model_name)
        token = secrets.token_urlsafe(24)
        headers = {"Authorization": f"Bearer {token}"}
        url, process = stack.enter_context(serve_subprocess(
            folder, tracking_uri=tracking_uri, experiment=experiment, model_uri=f"models:/{model_name}@champion",
            execution_uri=f"models:/{plan_name}@champion", spinup_delay_s=spinup_delay_s, router=router,
            token=token, cores=reserved))
        client = stack.enter_context(httpx.Client(base_url=url, timeout=30))
        _wait("Iconq+ model loaded", lambda: client.get("/readyz").json().get("router") == "iconq", process, folder,
              _STARTUP_TIMEOUT_S)
        pool = stack.enter_context(DuckDBClusterPool(db_path, warmup_s=warmup_s, **options))
        # the plan's starting clusters, real before the plan comes into force (the runtime names them plan-c<i>-s<n>)
        for i, size in enumerate(plan.start_sizes):
            pool.spin_up(int(size), cluster_id=f"plan-c{i}-s{size}")
        for i, size in enumerate(plan.start_sizes):
            pool.wait_ready(f"plan-c{i}-s{size}", timeout_s=_SPIN_UP_TIMEOUT_S)
        document = ExecutionPlan(config=plan, target_date=day, time_scale=dict(time_scale_doc), router="iconq",
                                 provenance={"source": "sloctl experiment end-to-end --live"})
        plan_version = register_policy(document, tracking_uri=tracking_uri, experiment=experiment, name=plan_name)
        view = _wait("execution-config in force", lambda: _execution_view(client).get("in_force"), process, folder,
                     _STARTUP_TIMEOUT_S)
        import datetime as dt

        since = dt.datetime.fromisoformat(view["since"]).timestamp()
        prestarted = {f"plan-c{i}-s{size}": int(size) for i, size in enumerate(plan.start_sizes)}
        mirror_seed = _PrestartedPool(pool, prestarted)
        out = drive_through_runtime(client, headers, mirror_seed, queries, _sql(), day_start_wall_s=since,
                                    minimum_s=minimum_s, poll_s=cfg.poll_s, timeout_s=cfg.timeout_s,
                                    on_progress=on_progress)
        execution = _execution_view(client)
    out["registered"] = {"tracking_uri": "temporary" if cfg.tracking_uri is None else cfg.tracking_uri,
                         "model": f"models:/{model_name}/{model_version}",
                         "execution_config": f"models:/{plan_name}/{plan_version}"}
    out["in_force"] = execution.get("in_force")
    out["missed"] = execution.get("missed", [])
    out["pool"] = {"warmup_s": warmup_s, "runtime_spinup_delay_s": spinup_delay_s,
                   "budget_mode": getattr(pool, "budget_mode", None), "budget_note": getattr(pool, "budget_note", "")}
    return out


class _PrestartedPool:
    """A pool whose first ``spin_up`` of each pre-started id is already done (the plan's starting clusters)."""

    def __init__(self, pool: Any, prestarted: Mapping[str, int]) -> None:
        self._pool = pool
        self._prestarted = dict(prestarted)

    def spin_up(self, size: int, *, cluster_id: str | None = None) -> str:
        if cluster_id in self._prestarted and self._prestarted.pop(cluster_id) == size:
            return cluster_id
        return self._pool.spin_up(size, cluster_id=cluster_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def _plain(value: Any) -> Any:
    """``value`` as YAML-safe data (dataclasses and tuples to dicts and lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _sql() -> dict[str, str]:
    from sloctl.datasets.tpc import load_templates

    return {t.name: t.sql for t in load_templates("tpch")}


# -- the baseline, live --------------------------------------------------------------------------------------

def run_baseline_live(name: str, db_path: str | Path, queries: Sequence[Query], *, detail: Mapping[str, Any],
                      world: Mapping[str, Any], tuner: Any, rais: Mapping[str, Any], time_scale: float,
                      minimum_s: float, warmup_s: float, pool_options: Mapping[str, Any] | None,
                      timeout_s: float, on_progress: Callable[[int, int], None] | None = None,
                      max_units: int | None = None) -> dict[str, Any]:
    """One baseline of the simulation on the live warehouse, with the controller the simulation ran.

    ``max_units``: Queue@N adds no cluster past this many size units (the cluster cores').
    """
    from sloctl.control.autoscaler import QueueScaler
    from sloctl.control.placement import PackingRouter
    from sloctl.experiments.end_to_end import RaisScaler, RaisSetting
    from sloctl.serving.live import run_live

    delay_s = warmup_s
    autoscaler: Any = None
    router: Any = RoundRobinRouter()
    if name in ("fixed-peak", "fixed-2x-half"):
        clusters = [tuple(c) for c in detail["pools"][name]]
    elif name.startswith("queue@"):
        base: ExecutionConfig = detail["base"]
        knobs = scale_plan(base, None, time_scale, delay_s).autoscaler
        if knobs is not None and max_units is not None:
            knobs = dataclasses.replace(knobs, max_units=max_units)
        autoscaler = ScheduledSpinups([ScheduledSpinup(s.time_s * time_scale, s.size, s.mode) for s in base.spinups],
                                      QueueScaler(knobs, int(detail.get("queue_n", tuner.queue_n))),
                                      spinup_delay_s=delay_s,
                                      max_clusters=tuner.max_clusters, max_units=max_units)
        router = PackingRouter(tuner.pack_n)
        clusters = [(f"c{i}-s{s}", s) for i, s in enumerate(base.start_sizes)]
    elif name.startswith("rais-"):
        setting = RaisSetting(**rais["balanced" if name == "rais-balanced" else "performance"])
        hour_s = world["time_scale"]["hour_s"] * time_scale
        autoscaler = RaisScaler([f / time_scale for f in detail["forecast_per_s"]], hour_s,
                                dict(detail["capacity_per_s"]), setting, spinup_delay_s=delay_s,
                                hold_s=rais["hold_hours"] * hour_s)
        clusters = [("rais0", autoscaler.predicted_size(0.0))]
    else:
        raise ValueError(f"The 'name' parameter of run_baseline_live must be a baseline of the simulation, "
                         f"got {name!r}.")
    options = {**dict(pool_options or {}), "allow_oversubscribe": False}  # a plan that does not fit is refused
    out = run_live(db_path, list(queries), clusters, router, minimum_s=minimum_s, timeout_s=timeout_s,
                   sql_by_template=_sql(), on_progress=on_progress, autoscaler=autoscaler, warmup_s=warmup_s,
                   pool_options=options)
    events = [{k: v for k, v in e.items() if k in ("t", "event", "cluster_id", "size", "why")} for e in out.events]
    return {"vr": out.violation_rate, "cost": out.cost, "events": events, "clusters": [list(c) for c in clusters]}


# -- the experiment ------------------------------------------------------------------------------------------

def end_to_end_live(result: Any, db_path: str | Path, model_dir: str | Path, *, cfg: LiveEndToEndConfig,
                    router: Mapping[str, Any] | None = None, pool_options: Mapping[str, Any] | None = None,
                    tuner: Any = None,
                    on_progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """The ``live`` section: one scenario of ``result`` (an ``EndToEndResult``), run live.

    Args:
        result: the simulated experiment (its ``details`` carry the arrivals and the plan).
        db_path: the DuckDB database the grading log was collected on.
        model_dir: the Iconq+ bundle the simulation routed with.
        cfg: the scenario's ``κ``, the time scale, the store.
        router: the ``router:`` settings the runtime routes with (as the simulation did).
        pool_options: CPU-budget options of the DuckDB pools (``None``: pinned cores).
        tuner: the simulation's :class:`~sloctl.experiments.history.HistoryExperimentConfig`.
        on_progress: ``(approach, done, total)`` as queries finish.
    """
    from sloctl.experiments.end_to_end import EndToEndConfig

    cfg.validate()
    tuner = tuner or getattr(result, "tuner", None) or EndToEndConfig().tuner
    world = result.world
    first_day = result.scenarios[0]["day"]
    index = next((k for k, s in enumerate(result.scenarios)
                  if s["day"] == first_day and math.isclose(s["kappa"], cfg.kappa)), None)
    if index is None:
        kappas = sorted({s["kappa"] for s in result.scenarios})
        raise ValueError(f"The 'kappa' of the live run must be one the simulation ran ({kappas}), got {cfg.kappa!r}.")
    scenario, detail = result.scenarios[index], result.details[index]
    hour_s, mean_iso = world["time_scale"]["hour_s"], world["time_scale"]["mean_isolated_s"]
    arrivals = detail["arrivals"]
    day_s = max([q.arrival_s for q in arrivals] + [24 * hour_s])
    scale = cfg.time_scale if cfg.time_scale is not None else min(1.0, cfg.max_day_s / day_s)
    queries = scaled_queries(arrivals, scale)
    if cfg.max_queries is not None:
        queries = sorted(queries, key=lambda q: (q.arrival_s, q.query_id))[:cfg.max_queries]
    minimum_s = tuner.minimum_units * mean_iso * scale
    warmup_s = tuner.spinup_delay_units * mean_iso * scale  # the simulation's δ, in live seconds
    runtime_delay_s = warmup_s + cfg.start_margin_s
    relative = RelativeAutoscalerSettings()
    sim_knobs = None
    plan: ExecutionConfig = detail["plan"]
    max_units = cluster_core_units(pool_options)  # nothing runs oversubscribed: what does not fit is refused
    if tuner.max_units is not None:
        max_units = min(max_units, tuner.max_units)
    plan.check_fits(max_units, "AutoSLO's plan")
    plan_sizes = bool(result.world.get("autoslo_sizes_from_plan", False))
    if plan.autoscaler is not None:  # what the simulation enacted the plan with (IconqReactiveRunner)
        sim_knobs = dataclasses.replace(plan.autoscaler, tau_target=tuner.tau_target,
                                        candidate_sizes=tuple(plan.autoscaler.candidate_sizes if plan_sizes
                                                              else tuner.sizes),
                                        max_clusters=tuner.max_clusters, max_units=max_units)
        if result.world.get("tuner_layer", "queue") != "iconq":  # a plan tuned with another layer: defaults
            sim_knobs = dataclasses.replace(sim_knobs, window_s=relative.window_s * mean_iso, theta=relative.theta,
                                            tau_trigger=relative.tau_trigger, mu=relative.mu)
    live_plan = scale_plan(plan, sim_knobs, scale, runtime_delay_s)
    # the operator's own rule (issue 52): the tuned Queue@N, else the best baseline of the simulation
    baseline = "queue@tuned" if "queue@tuned" in scenario["results"] else best_baseline(scenario["results"])
    if baseline.startswith("queue@"):
        detail["base"].check_fits(max_units, "Queue@N's starting pool")
    elif baseline.startswith("fixed-"):
        ExecutionConfig(start_sizes=tuple(int(c[1]) for c in detail["pools"][baseline])).check_fits(
            max_units, f"The {baseline} pool")
    cost_unit_s = hour_s * scale

    def progress(name: str) -> Callable[[int, int], None] | None:
        return None if on_progress is None else (lambda done, total: on_progress(name, done, total))

    started = time.perf_counter()
    autoslo = run_autoslo_through_runtime(
        db_path, queries, live_plan, model_dir=model_dir, day=scenario["day"],
        time_scale_doc={"hour_s": hour_s * scale, "mean_isolated_s": mean_iso, "live_time_scale": scale},
        minimum_s=minimum_s, spinup_delay_s=runtime_delay_s, router=router or {}, pool_options=pool_options,
        cfg=cfg, on_progress=progress("autoslo"))
    autoslo_wall = time.perf_counter() - started
    started = time.perf_counter()
    base = run_baseline_live(baseline, db_path, queries, detail=detail, world=world, tuner=tuner,
                             rais=world.get("rais", {}), time_scale=scale, minimum_s=minimum_s, warmup_s=warmup_s,
                             pool_options=pool_options, timeout_s=cfg.timeout_s, on_progress=progress(baseline),
                             max_units=max_units)
    baseline_wall = time.perf_counter() - started
    tau = result.tau_target
    graded_live = (f"live: measured latencies on DuckDB clusters over {Path(db_path).name}"
                   f" ({'CPU budgets' if pool_options else 'pinned cores'}), arrivals × {scale:.4g}")

    def pair(name: str, live: Mapping[str, Any]) -> dict[str, Any]:
        sim = scenario["results"][name]
        vr, cost = float(live["vr"]), float(live["cost"]) / cost_unit_s
        return {"live": {"vr": vr, "cost": cost, "meets_tau": vr <= tau, "graded_by": graded_live},
                "simulation": {**sim, "graded_by": "simulation: the held-out grade log's world"}}

    enacted_spinups = [e for e in autoslo["runtime_events"] if e.get("event") == "spin_up"]
    return {
        "scenario": {"day": scenario["day"], "kappa": scenario["kappa"], "queries": len(queries),
                     "day_queries": len(arrivals),
                     "truncated": None if cfg.max_queries is None or len(queries) == len(arrivals) else
                     f"only the first {len(queries)} of {len(arrivals)} arrivals (max_queries)"},
        "baseline": baseline,
        "baseline_why": ("the operator's tuned Queue@N" if baseline == "queue@tuned" else
                         "cheapest baseline meeting τ in simulation"
                         if scenario["results"][baseline]["meets_tau"] else "lowest simulated VR (none met τ)"),
        "max_units": max_units,
        "time_scale": {"live_s_per_sim_s": scale, "load_vs_simulation": 1.0 / scale, "live_day_s": day_s * scale,
                       "hour_s": hour_s * scale, "minimum_s": minimum_s, "spinup_delay_s": runtime_delay_s,
                       "warmup_s": warmup_s, "cost_unit": "size-1 cluster-hours of the compressed day",
                       "slo": "unscaled (κ × the template's largest isolated latency on size 1)"},
        "results": {"autoslo": pair("autoslo", autoslo), baseline: pair(baseline, base)},
        "plan": {"start_sizes": list(live_plan.start_sizes),
                 "spinups": [{"time_s": s.time_s, "size": s.size, "mode": s.mode} for s in live_plan.spinups],
                 "autoscaler": dataclasses.asdict(live_plan.autoscaler) if live_plan.autoscaler else None},
        "autoslo": {"enacted": autoslo["enacted"], "spin_ups": enacted_spinups, "missed": autoslo["missed"],
                    "runtime_events": autoslo["runtime_events"], "real_clusters": autoslo["log"],
                    "held_for_real_cluster": autoslo["held"], "oversubscribed_rows": autoslo["oversubscribed"],
                    "start_lag_s": autoslo["start_lag_s"],
                    "runtime": {**autoslo["runtime"], "total_cost_units": (
                        autoslo["runtime"]["total_cost"] / cost_unit_s
                        if autoslo["runtime"].get("total_cost") is not None else None)},
                    "registered": autoslo["registered"], "pool": autoslo["pool"],
                    "wall_s": autoslo_wall},
        "baseline_run": {"name": baseline, "events": base["events"], "clusters": base["clusters"],
                         "wall_s": baseline_wall},
    }
