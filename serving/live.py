"""Query routers on live DuckDB clusters: the same router runs live unchanged.

:func:`run_live` spins up real clusters (:class:`~sloctl.datasets.duckdb_pool.DuckDBClusterPool`),
replays queries open-loop at their arrival times, and runs the same control
step as the simulator (:class:`~sloctl.control.managed.ManagedPool`: a router
from :mod:`sloctl.control.router` chooses where each query runs, billing
timers follow every start and end, the autoscaler scales); this module only
supplies the run clock and the real clusters. The live comparisons built on
it are in :mod:`sloctl.experiments.live_warehouse`.

All times are seconds on one run clock whose zero is a start instant taken
after every cluster is ready (a short lead ahead, so the first arrival is not
late by construction).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.control.autoscaler import Autoscaler, RelativeAutoscalerSettings, autoscaler_for
from sloctl.control.background import BackgroundSizer
from sloctl.control.managed import ManagedPool
from sloctl.control.router import IconqRouter, Query, RouteDecision
from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.duckdb_pool import DuckDBClusterPool
from sloctl.datasets.pool import QueryRequest
from sloctl.datasets.slo import isolated_medians, slo_baselines
from sloctl.datasets.tpc import Template, load_templates
from sloctl.datasets.workloads import base_workload
from sloctl.models.online import OnlinePredictor
from sloctl.serving.controller import PoolBackend

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.control.autoscaler import Autoscaler
    from sloctl.control.router import Router
    from sloctl.models.predictor import LatencyPredictor

__all__ = ["HttpRouter", "LiveResult", "live_setup", "run_live", "run_live_through_service",
           "torch_threads"]

#: Lead time between "every cluster is ready" and the run clock's zero.
_LEAD_S = 0.05
#: How long a spin-up may take before the run is abandoned.
_SPIN_UP_TIMEOUT_S = 120.0
#: Poll interval while queries are in flight and no arrival is due.
_POLL_S = 0.5

_COLUMNS = ["query_id", "template", "cluster_id", "cluster_size", "arrival_s", "routed_s", "start_s", "end_s",
            "latency_s", "slo_s", "violated", "status", "predicted_s", "control_s"]


@dataclass
class LiveResult:
    """Per-query outcomes of a live run and its bill.

    Attributes:
        queries: one row per query (columns ``query_id, template, cluster_id,
            cluster_size, arrival_s, routed_s, start_s, end_s, latency_s,
            slo_s, violated, status, predicted_s, control_s``), in arrival
            order; ``routed_s`` is when the router decided (``arrival_s``
            plus the dispatch lag), ``control_s`` the wall time of the
            arrival's control step (autoscaler and router).
        cost: total bill, ``Σ price × size × active time``.
        cost_by_cluster: the bill of each cluster.
        violation_rate: fraction of queries that violated their SLO.
        events: scaling events in order (``spin_up``, ``ready``, ``sizing``,
            ``force``, ...), each with its run-clock time ``t``.
        cost_marks: the bill up to each marked arrival (``mark_at``), by
            arrival index, as the simulator's ``cost_marks``.
    """

    queries: pd.DataFrame
    cost: float
    cost_by_cluster: dict[str, float]
    violation_rate: float
    events: list[dict[str, Any]] = field(default_factory=list)
    cost_marks: dict[int, float] = field(default_factory=dict)

    def cost_since(self, index: int) -> float:
        """Cost billed after the arrival with this index (it must be in ``mark_at``).

        Raises:
            ValueError: the arrival was not marked.
        """
        if index not in self.cost_marks:
            raise ValueError(f"The 'index' of LiveResult.cost_since must be a marked arrival "
                             f"(mark_at: {sorted(self.cost_marks)}), got {index!r}.")
        return self.cost - self.cost_marks[index]


def _validate(queries: list[Query], clusters: list[tuple[str, int]], sql_by_template: dict[str, str],
              price_per_unit_s: float, timeout_s: float | None, autoscaler: Autoscaler | None,
              force_scaling_at: int | None, mark_at: tuple[int, ...]) -> None:
    if not clusters:
        raise ValueError("The 'clusters' parameter of run_live must name at least one (cluster_id, size), got none.")
    ids = [cid for cid, _ in clusters]
    if len(set(ids)) != len(ids):
        raise ValueError(f"The 'clusters' parameter of run_live must have distinct cluster ids, got {ids}.")
    query_ids = [q.query_id for q in queries]
    if len(set(query_ids)) != len(query_ids):
        raise ValueError("The 'queries' parameter of run_live must have distinct query ids.")
    missing = sorted({q.template for q in queries} - set(sql_by_template))
    if missing:
        raise ValueError(f"The 'sql_by_template' parameter of run_live has no SQL for template {missing[0]!r}.")
    if not (math.isfinite(price_per_unit_s) and price_per_unit_s >= 0):
        raise ValueError(f"The 'price_per_unit_s' parameter of run_live must be >= 0, got {price_per_unit_s!r}.")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"The 'timeout_s' parameter of run_live must be > 0 or None, got {timeout_s!r}.")
    if force_scaling_at is not None:
        if autoscaler is None:
            raise ValueError("The 'force_scaling_at' parameter of run_live needs an autoscaler to force, got None.")
        if not 0 <= force_scaling_at < len(queries):
            raise ValueError(f"The 'force_scaling_at' parameter of run_live must index an arrival "
                             f"(0 to {len(queries) - 1}), got {force_scaling_at!r}.")
    bad = [k for k in mark_at if not 0 <= k < len(queries)]
    if bad:
        raise ValueError(f"The 'mark_at' parameter of run_live must index arrivals (0 to {len(queries) - 1}), "
                         f"got {bad[0]!r}.")


def run_live(
    db_path: str | Path,
    queries: list[Query],
    clusters: list[tuple[str, int]],
    router: Router,
    *,
    price_per_unit_s: float = 1.0,
    minimum_s: float = 60.0,
    timeout_s: float | None = 60.0,
    sql_by_template: dict[str, str],
    on_progress: Callable[[int, int], None] | None = None,
    autoscaler: Autoscaler | None = None,
    warmup_s: float = 0.0,
    background_sizing: bool = True,
    pool_options: Mapping[str, Any] | None = None,
    force_scaling_at: int | None = None,
    mark_at: tuple[int, ...] = (),
) -> LiveResult:
    """Route ``queries`` live onto fresh DuckDB clusters and bill them.

    Arrivals are dispatched open-loop at ``query.arrival_s`` whatever is
    running. At each arrival the router sees every cluster's
    :class:`~sloctl.control.router.ClusterState` and ``now_s``, the run-clock
    time of the decision (the scheduled arrival plus the dispatch lag). A
    query's latency runs from its scheduled arrival to its measured end.

    Billing timers need non-decreasing times. Events are handed to them in
    the order they are observed: an arrival at the moment it is routed, a
    completion when the pool reports it, with the end time the worker
    measured. A completion observed late carries an end slightly earlier than
    the last time its timer has seen — a later arrival on that cluster, or a
    routing decision, since cost-aware routers read every cluster's timer at
    ``now_s``. Its end is then clamped, for the timer only, to that last time,
    which over-bills by at most the observation delay (a few milliseconds);
    the row and the router keep the measured end.

    Args:
        db_path: the DuckDB database every cluster opens read-only.
        queries: the arrivals (``arrival_s`` on the run clock, SLOs in seconds).
        clusters: ``(cluster_id, size)`` of the clusters to spin up; they need
            ``Σ size`` free cores (else :class:`~sloctl.core.errors.ClusterPoolError`).
        router: the routing policy, used exactly as in simulation.
        price_per_unit_s: price of one size unit per second.
        minimum_s: billing minimum window (``m``).
        timeout_s: per-query timeout (``None``: none); a timed-out query is
            censored and counts as violated, as does one that failed.
        sql_by_template: the SQL text of every template in ``queries``.
        on_progress: called with ``(finished, total)`` after each completion.
        autoscaler: optional :class:`~sloctl.control.autoscaler.Autoscaler`,
            consulted at every arrival exactly as in simulation; its spin-ups
            start real cluster processes (ready after process start plus
            ``warmup_s``; a size that does not fit on the machine is refused
            and recorded), its teardowns stop them, and a vertical
            ``retire_others`` stops routing to the other clusters once the
            new one is ready (the same :class:`~sloctl.control.managed.ManagedPool`
            step as in simulation).
        warmup_s: warm-up delay of every spin-up.
        background_sizing: run the autoscaler's Spinup Size Selector on a
            worker thread (:class:`~sloctl.control.background.BackgroundSizer`,
            AutoSLO §6): routing goes on while it simulates, and the first
            arrival after it finishes applies its spin-up (``sizing`` events
            record the decision and queue times; a final ``sizer`` event, if a
            job ran, counts jobs, coalesced triggers and errors, and whether a
            result came too late to apply). ``False`` runs it inside the
            arrival step, as the simulator does. Ignored if the autoscaler
            already has a sizer.
        pool_options: CPU-budget options of the DuckDB pool
            (``WarehouseConfig.pool_options()``: sizes as cgroup CPU budgets
            beside a core reserved for the controller); ``None`` pins whole
            cores.
        force_scaling_at: index (in arrival order) of the arrival at which
            to force one scaling decision, whatever the triggers say (the
            size-selector experiment, AutoSLO §8.5; needs ``autoscaler``).
            A ``force`` event records it. With ``background_sizing`` the
            forced Spinup Size Selector runs on the sizer's worker like a
            triggered one (:meth:`~sloctl.control.autoscaler.Autoscaler.force`):
            the arrival is routed at once and the first arrival after the job
            finishes applies its spin-up (a ``sizing`` event whose
            ``triggered_s`` is the forced arrival's time). Without it, or in
            ``horizontal`` mode, the decision is made inside that arrival's step.
        mark_at: indices of arrivals at which to record the bill so far
            (``LiveResult.cost_marks``, read at the arrival's routing time,
            before it is routed; :meth:`LiveResult.cost_since`).

    Returns:
        The per-query rows, the bill, the violation rate, the scaling events
        and the marked bills.

    Raises:
        ClusterPoolError: the clusters do not fit on this machine, one failed
            to start, or one died with queries in flight.
    """
    import pandas as pd


    _validate(queries, clusters, sql_by_template, price_per_unit_s, timeout_s, autoscaler, force_scaling_at, mark_at)
    pending = sorted(queries, key=lambda q: (q.arrival_s, q.query_id))
    records: dict[int, dict[str, Any]] = {}
    marks = set(mark_at)
    cost_marks: dict[int, float] = {}

    with DuckDBClusterPool(db_path, warmup_s=warmup_s, **dict(pool_options or {})) as pool, \
            _background_sizer(autoscaler if background_sizing else None) as sizer:
        for cid, size in clusters:
            pool.spin_up(size, cluster_id=cid)
        for cid, _ in clusters:
            pool.wait_ready(cid, timeout_s=_SPIN_UP_TIMEOUT_S)
        # completions are observed late: clamp billing times (see the docstring)
        managed = ManagedPool(router, autoscaler=autoscaler, price_per_unit_s=price_per_unit_s, minimum_s=minimum_s,
                              backend=PoolBackend(pool, len(clusters)), clamp_late_events=True)
        for cid, size in clusters:
            managed.add_cluster(cid, size)
        base = time.monotonic() + _LEAD_S

        control_s: dict[int, float] = {}  # per query: the arrival's control step, wall seconds

        def refresh_ready(now_s: float) -> None:
            starting = managed.starting()
            if not starting:
                return
            for info in pool.clusters():
                if info.cluster_id in starting and info.state == "ready":
                    managed.mark_ready(info.cluster_id, now_s)

        def finish(done: Any) -> None:
            end = done.end_s - base
            record = managed.complete(done.query_id, end)
            query, cid = record.query, record.cluster_id
            latency = end - query.arrival_s
            records[query.query_id] = {
                "query_id": query.query_id, "template": query.template, "cluster_id": cid,
                "cluster_size": managed.clusters[cid].size, "arrival_s": query.arrival_s, "routed_s": record.routed_s,
                "start_s": done.start_s - base, "end_s": end, "latency_s": latency, "slo_s": query.slo_s,
                "violated": bool(done.status != "ok" or latency > query.slo_s), "status": done.status,
                "predicted_s": record.predicted_s, "control_s": control_s.pop(query.query_id),
            }
            if on_progress is not None:
                on_progress(len(records), len(pending))

        i = 0
        while i < len(pending) or managed.running:
            now_s = time.monotonic() - base
            if i < len(pending) and pending[i].arrival_s <= now_s:
                # completions already reported come first: the router should see them
                for done in sorted(pool.completions(timeout_s=0), key=lambda c: c.end_s):
                    if done.query_id in managed.running:
                        finish(done)
                query, index = pending[i], i
                i += 1
                now_s = time.monotonic() - base
                if index in marks:  # before scaling and routing, as the simulator marks
                    cost_marks[index] = managed.total_cost(now_s)
                if autoscaler is not None:
                    refresh_ready(now_s)
                started = time.perf_counter()
                if autoscaler is not None:
                    forced = index == force_scaling_at
                    if forced:
                        managed.events.append({"t": now_s, "event": "force", "index": index})
                    managed.scale(query, now_s, force=forced)
                decision = managed.route(query, now_s)
                control_s[query.query_id] = time.perf_counter() - started
                pool.submit(decision.cluster_id, QueryRequest(query.query_id, sql_by_template[query.template],
                                                              timeout_s))
                continue
            wait = max(0.0, pending[i].arrival_s - now_s) if i < len(pending) else _POLL_S
            batch = pool.completions(timeout_s=wait)
            for done in sorted(batch, key=lambda c: c.end_s):
                if done.query_id in managed.running:
                    finish(done)
            if not batch and managed.running:
                _check_alive(pool, {r.cluster_id for r in managed.running.values()})
        if sizer is not None and sizer.submitted:  # modes without a size selector never submit
            unapplied = sizer.close()
            managed.events.append({"t": time.monotonic() - base, "event": "sizer", "submitted": sizer.submitted,
                                   "coalesced": sizer.coalesced, "errors": len(sizer.errors),
                                   "unapplied": unapplied is not None})

    frame = pd.DataFrame([records[q.query_id] for q in pending], columns=_COLUMNS)
    horizon = (managed.latest_s if math.isfinite(managed.latest_s) else 0.0) + 1e6
    cost_by_cluster = managed.cost_by_cluster(horizon)
    violation_rate = float(frame["violated"].mean()) if len(frame) else 0.0
    return LiveResult(frame, float(sum(cost_by_cluster.values())), cost_by_cluster, violation_rate, managed.events,
                      cost_marks)


@contextlib.contextmanager
def _background_sizer(autoscaler: Autoscaler | None) -> Iterator[BackgroundSizer | None]:
    """Give ``autoscaler`` a :class:`BackgroundSizer` for the run, and take it back (its worker stopped) after.

    Yields ``None`` (nothing changed) for anything but an
    :class:`~sloctl.control.autoscaler.Autoscaler` without a sizer; a caller's
    own sizer stays the caller's to close.
    """
    if not isinstance(autoscaler, Autoscaler) or autoscaler.sizer is not None:
        yield None
        return
    sizer = BackgroundSizer()
    autoscaler.sizer = sizer
    try:
        yield sizer
    finally:
        autoscaler.sizer = None
        sizer.close()


def _check_alive(pool: Any, busy: set[str]) -> None:
    """Raise if a cluster with queries in flight is gone (their completions will never come)."""
    for info in pool.clusters():
        if info.cluster_id in busy and info.state != "ready":
            raise ClusterPoolError(f"Cluster {info.cluster_id!r} is {info.state} with queries in flight.")


def live_setup(log: pd.DataFrame) -> tuple[dict[str, str], dict[str, float], list[str], float, pd.DataFrame]:
    """SQL per TPC-H template, SLO references, usable templates, time unit ℓ̄ and feature table."""
    import numpy as np


    sql = {t.name: t.sql for t in load_templates("tpch")}
    slo_ref = slo_baselines(log, 1)
    isolated = isolated_medians(log, 1)
    templates = sorted(t for t in slo_ref if t in sql and t in isolated)
    if not templates:
        raise ValueError("The log has no TPC-H template with an isolated run on size 1; "
                         "collect an isolated workload on size 1 first.")
    mean_iso = float(np.mean([isolated[t] for t in templates]))
    table = log.drop_duplicates("template").set_index("template", drop=False).loc[templates].reset_index(drop=True)
    return sql, slo_ref, templates, mean_iso, table


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` intra-op torch threads, then restore the setting.

    The router runs in this process, on the same cores as the clusters. With
    more than one thread, a small Iconq+ inference waits on its thread pool
    (routing p90 ~200 ms against ~5 ms with one thread on a 2-core machine),
    and every late decision delays every later arrival.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class HttpRouter:
    """The Query Router of a running ``sloctl serve``, behind the local :class:`~sloctl.control.router.Router` API.

    Each decision is the service's (``POST /v1/route``); completions go back
    with ``POST /v1/complete``. Clusters the local pool spins up or retires are
    announced first (``PUT``/``DELETE /v1/clusters/{id}``), so the service
    routes only onto live clusters. A local shadow of the running queries
    (``model``, an :class:`~sloctl.models.online.OnlinePredictor`) mirrors the
    service's decisions for the autoscaler's what-if simulations.
    """

    name = "service"

    def __init__(self, client: Any, token: str | None, model: Any) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.model = model
        self.known: dict[str, int] = {}
        self.arrival: dict[int, float] = {}

    def _sync(self, clusters: list[Any]) -> None:
        if not self.known:
            self.known = {c["cluster_id"]: c["size"] for c in self.client.get("/v1/clusters").json()["clusters"]}
        active = {c.cluster_id: c.size for c in clusters}
        for cid in [c for c in self.known if c not in active]:
            if self.client.delete(f"/v1/clusters/{cid}", headers=self.headers).status_code in (200, 404):
                del self.known[cid]
        for cid, size in active.items():
            if self.known.get(cid) != size:
                self.client.put(f"/v1/clusters/{cid}", json={"size": size}, headers=self.headers).raise_for_status()
                self.known[cid] = size

    def route(self, query: Query, clusters: list[Any], now_s: float) -> Any:

        self._sync(clusters)
        response = self.client.post("/v1/route", json={"query_id": query.query_id, "template": query.template,
                                                       "slo_s": query.slo_s}, headers=self.headers)
        if response.status_code != 200:
            raise ValueError(f"the service refused to route query {query.query_id}: {response.text[:300]}")
        body = response.json()
        size = {c.cluster_id: c.size for c in clusters}[body["cluster_id"]]
        local = self.model.commit(query.query_id, query.template, query.arrival_s, query.slo_s, body["cluster_id"],
                                  size, now_s)
        self.arrival[query.query_id] = query.arrival_s
        predicted = body["predicted_latency_s"]
        return RouteDecision(body["cluster_id"], local if predicted is None else predicted, body["explanation"])

    def on_complete(self, query_id: int, now_s: float) -> None:
        latency = max(0.0, now_s - self.arrival.pop(query_id, now_s))
        self.client.post("/v1/complete", json={"query_id": query_id, "latency_s": latency},
                         headers=self.headers).raise_for_status()
        self.model.complete(query_id)


def run_live_through_service(url: str, token: str | None, db_path: str | Path, log: pd.DataFrame,
                             predictor: LatencyPredictor, *, load: float = 0.85, kappa: float = 2.0,
                             copies: int = 2, seed: int = 0, autoscale: bool = True, warmup_s: float = 1.0,
                             on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Replay a seeded BaseWorkload against real DuckDB clusters, routed by the service at ``url``.

    The local pool starts with one size-1 cluster; with ``autoscale`` the
    AutoSLO autoscaler (planning with ``predictor``) adds one when its trigger
    fires, and the service learns of it before its first query. The result
    holds ``placements``: one row per query (cluster, start, end, violated)
    in run-clock seconds, as the placement timeline plots them.
    """
    import json
    import os

    import httpx


    sql, slo_ref, templates, mean_iso, table = live_setup(log)
    workload = base_workload([Template(t, sql[t]) for t in templates], load / mean_iso, copies, seed=seed)
    queries = [Query(i, q.template, q.arrival_s, kappa * slo_ref[q.template]) for i, q in enumerate(workload.queries)]
    minimum_s = 5.0 * mean_iso
    with httpx.Client(base_url=url, timeout=30) as client, torch_threads(1):
        router = HttpRouter(client, token, OnlinePredictor(predictor, table))
        autoscaler = None
        if autoscale:
            free = len(os.sched_getaffinity(0)) - 1
            sizes = tuple(s for s in (1, 2) if s <= max(free, 1))
            cfg = RelativeAutoscalerSettings()
            config = cfg.config(mean_iso, candidate_sizes=sizes, spinup_delay_s=warmup_s + 0.1, max_clusters=2)
            autoscaler = autoscaler_for(config, router, lambda model: IconqRouter(model), minimum_s=minimum_s)
        outcome = run_live(db_path, queries, [("c0", 1)], router, minimum_s=minimum_s, sql_by_template=sql,
                           on_progress=on_progress, autoscaler=autoscaler, warmup_s=warmup_s)
        service = client.get("/v1/clusters").json()
    placed = outcome.queries[["query_id", "template", "cluster_id", "cluster_size", "arrival_s", "start_s", "end_s",
                              "violated"]]
    return {"queries": len(queries), "vr": outcome.violation_rate, "cost": outcome.cost,
            "spin_ups": sum(e["event"] == "spin_up" for e in outcome.events), "events": outcome.events,
            "placements": json.loads(placed.to_json(orient="records")),
            "service": {"violation_rate": service["violation_rate"], "total_cost": service["total_cost"],
                        "model": service["model"]}}
