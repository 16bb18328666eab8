"""The controller runtime's state: models hot-swapped from the registry, the routed pool, admission, retry budgets.

:class:`Runtime` holds everything the HTTP layer (:mod:`sloctl.serving.runtime.app`)
serves, behind one lock:

* **Models by alias.** Each :class:`ModelSlot` follows one registry alias
  (``models:/iconq@champion``, ...). :meth:`Runtime.refresh` (called by a
  background watcher) loads a new version when the alias moves; a failed load
  keeps the last good model and records the error. With no latency model at
  all the runtime still routes: Iconq+ first, then Stage (concurrency-unaware,
  ``StageCostRouter``), then round-robin; every answer names the one in use.
  The router is built by :func:`sloctl.registry.routers.build_router`, as the
  CLI's experiments build theirs: the SLO margin and the template table come
  from the model bundle unless the config (``router.slo_margin``,
  ``serve.templates_log``) names them.
* **The pool.** Clusters come from the config; ``route`` runs the Query
  Router and records the query as running, ``complete`` ends it. Billing
  timers give accrued cost. The step itself is
  :class:`~sloctl.control.managed.ManagedPool`'s, as in the simulator and the
  live runner; the runtime adds HTTP validation, its lock and persistence.
* **Durable state.** Running queries, accrued cost and the cluster set live
  in a :class:`~sloctl.serving.runtime.state.StateStore` (SQLite), written on every
  change; cost is written before it is reported. A restart reconciles:
  running queries are re-committed (those older than ``stale_after_s`` are
  dropped and counted), cost carries on from where it was, and the cluster
  set is the one in force before (clusters added or retired at runtime too).
* **Admission by lease.** ``/v1/admit`` hands out a
  :class:`~sloctl.control.credits.Lease` of the admission policy's credit
  pool (:class:`~sloctl.control.credits.LeasedCredits`): only that lease
  releases its credit, and an expired one is reclaimed.
* **The execution-config.** The Policy Tuner's plan in force is enacted on
  the pool (:class:`~sloctl.serving.runtime.execution.PlanEnactor`): its starting
  clusters, its scheduled spin-ups (checked at every route call and every
  refresh) and a reactive :class:`~sloctl.control.autoscaler.Autoscaler`
  with its knobs, which ``route`` drives as ``ManagedPool.scale`` does in
  simulation, its Spinup Size Selector on a
  :class:`~sloctl.control.background.BackgroundSizer`.
* **Replicas.** With ``state.url: redis://...`` the state lives in Redis
  (:class:`~sloctl.serving.runtime.state_redis.RedisStateStore`) and several
  runtimes serve one fleet: route and complete commit atomically there (the
  first answer for a ``query_id`` wins and a repeated call gets it back), the
  bill is the shared timers', leases are one book, and before each decision
  a replica applies the route-log events of the others to its own view of
  the pool. Scaling (the plan's spin-ups, the reactive autoscaler) is
  enacted by one replica at a time, the one holding the lead; the others
  adopt the cluster set it publishes.
* **Time.** ``clock`` (wall seconds, :func:`time.time` unless a test injects
  a fake) gives every time the runtime uses: ``now_s()`` counts from its
  start (``wall0``).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sloctl.control.credits import ClassShare, CreditController, LeasedCredits
from sloctl.control.managed import ManagedPool, RunningQuery
from sloctl.control.policies import AdmissionPolicy, ExecutionPlan, RetryPolicy
from sloctl.control.router import ClusterState, Query
from sloctl.core.config import RegistrySection, RouterSection, ServeSection, StateSection
from sloctl.core.kinds import RouterKind
from sloctl.serving.controller import LATENCY, Controller, ModelSlot, registered_names
from sloctl.serving.runtime.execution import PlanEnactor
from sloctl.serving.runtime.state import SqliteStateStore, StateStore
from sloctl.serving.runtime.state_redis import RedisStateStore

__all__ = ["RESERVED_PREFIX", "RequestRefused", "Runtime", "RuntimeConfig", "open_state_store"]

RESERVED_PREFIX = "_"  # cluster ids starting with it are the runtime's own (``_retired``): never a path's


class RuntimeConfig(Protocol):
    """The sections the runtime reads (a :class:`sloctl.config.SloctlConfig` has them)."""

    serve: ServeSection
    state: StateSection
    registry: RegistrySection
    router: RouterSection


class RequestRefused(ValueError):
    """A request the runtime refuses (unknown template, cluster or query); the HTTP layer answers 4xx."""

    def __init__(self, message: str, *, status: int = 422, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class _Running:
    """A running query as the runtime persists it: the pool's record, its arrival on the wall clock.

    Reads and writes go to the :class:`~sloctl.control.managed.RunningQuery`
    the pool holds (a new model re-predicts ``predicted_s``).
    """

    __slots__ = ("record", "wall0")

    def __init__(self, record: RunningQuery, wall0: float) -> None:
        self.record = record
        self.wall0 = wall0

    @property
    def query_id(self) -> int:
        return self.record.query.query_id

    @property
    def template(self) -> str:
        return self.record.query.template

    @property
    def cluster_id(self) -> str:
        return self.record.cluster_id

    @property
    def slo_s(self) -> float:
        return self.record.query.slo_s

    @property
    def arrival_s(self) -> float:
        """Arrival on the runtime clock (seconds since start)."""
        return self.record.query.arrival_s

    @property
    def arrival_wall(self) -> float:
        return self.wall0 + self.record.query.arrival_s

    @property
    def predicted_s(self) -> float:
        return self.record.predicted_s

    @predicted_s.setter
    def predicted_s(self, value: float) -> None:
        self.record.predicted_s = value


@dataclass
class Runtime:
    """All state behind the HTTP endpoints (see the module docstring)."""

    cfg: RuntimeConfig
    templates: Any  # pandas DataFrame (serve.templates_log): overrides the bundles' template tables; or None
    state_db: str
    stale_after_s: float = 3600.0
    decisions: deque = field(default_factory=lambda: deque(maxlen=50))
    history: deque = field(default_factory=lambda: deque(maxlen=500))
    clock: Callable[[], float] = time.time  # wall seconds; tests inject a fake
    store: StateStore | None = None  # default: state.url's store, else SqliteStateStore(state_db)

    def start(self) -> Runtime:
        """Open the state store, follow the registry's aliases, reconcile with the state before a restart."""
        serve, registry = self.cfg.serve, self.cfg.registry
        self.built = None  # the router in force (registry.routers.BuiltRouter), built at the first refresh
        self.lock = threading.RLock()
        self.admission_lock = threading.Lock()
        self.wall0 = self.clock()
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"  # unique per incarnation
        if self.store is None:
            self.store = open_state_store(self.cfg, self.state_db, replica=self.replica,
                                          answer_ttl_s=self.stale_after_s)
        self.shared = bool(getattr(self.store, "shared", False))
        self._lead = (-math.inf, not self.shared)  # (when last checked, monotonic; holds the scaling lead)
        self._synced = -math.inf  # when this replica last read the route log (monotonic)
        self._cost_read = (-math.inf, 0.0)  # (runtime time, total) of the last shared bill read for the history
        # the control step (route, bill, complete) and the cluster set; its router follows self.router.
        # Shared state: other replicas' events arrive late, so the local timers clamp (the bill is Redis's)
        self.pool = ManagedPool(None, price_per_unit_s=self.cfg.router.price_per_unit_s,
                                minimum_s=self.cfg.router.minimum_s, clamp_late_events=self.shared)
        self.control = Controller(self.pool, self.cfg.router, templates=self.templates)
        for name, uri, kind in (("iconq", serve.model_uri, LATENCY), ("stage", serve.fallback_uri, LATENCY),
                                ("admission", serve.admission_uri, AdmissionPolicy.kind),
                                ("retry", serve.retry_uri, RetryPolicy.kind),
                                ("execution", serve.execution_uri, ExecutionPlan.kind)):
            self.control.add_slot(name, uri, registry.tracking_uri, kind)
        self.origin: dict[str, str] = {}  # who brought each cluster: config, operator, plan, schedule, autoscaler
        self._log_id = self.store.last_event_id() if self.shared else None  # read before the state it follows
        saved = self.store.clusters()
        self.pool_restored = saved is not None  # the cluster set in force before a restart, not the config's
        configured = [(f"c{i}", size, "config") for i, size in enumerate(serve.cluster_sizes)]
        for cid, size, origin in saved if saved is not None else configured:
            self.pool.add_cluster(cid, size)
            self.origin[cid] = origin or "config"
            if origin == "operator":
                self.pool.keep.add(cid)
        self._saved_clusters = saved
        # PUT/DELETE /v1/clusters since the start (or before a restart): a plan then keeps the pool
        self.operator_changed_pool = self.store.meta("operator_changed_pool") == "1"
        self.enactor = PlanEnactor(serve, self.pool, self.wall0, remove=self._remove_cluster, origin=self.origin)
        self._plan_slot: tuple[Any, str | None] = (None, None)  # the execution slot's value and version in force
        self.violations = 0
        self.completed = 0
        self.reconciled = {"restored": 0, "dropped_stale": 0, "clusters": "state" if self.pool_restored
                           else "config"}
        self.cost_offset = self.store.costs()
        gone = [cid for cid in self.cost_offset if cid not in self.pool.clusters and cid != "_retired"]
        for cid in gone:  # clusters retired in an earlier run keep their cost
            self.cost_offset["_retired"] = self.cost_offset.get("_retired", 0.0) + self.cost_offset.pop(cid)
        if gone:
            self.store.save_costs([("_retired", self.cost_offset["_retired"])], delete=tuple(gone))
        self.admission = None
        self.leases: LeasedCredits | None = None
        self.networks: frozenset[str] = frozenset(serve.retry_networks)  # configured, then registered too
        self._networks_read = -math.inf  # when the registry's networks were last read (monotonic)
        self.refresh()
        self._reconcile()
        self._sync_clusters()
        self._catch_up()
        return self

    # -- time and models -------------------------------------------------------------
    def now_s(self) -> float:
        """The runtime clock: seconds since the runtime started."""
        return self.clock() - self.wall0

    def retry_slot(self, network: str | None = None) -> ModelSlot:
        """The retry policy of ``network`` (``models:/retry-policy-<network>@champion``); ``serve.retry_uri``'s if None.

        Policies are registered per network (``sloctl retry optimise``), so
        each network's sidecars ask for theirs by name. A slot is made only
        for a network registered in the registry or named in
        ``serve.retry_networks``, on its first request, and polled with the
        others from then on; any other name is refused without a trace
        (slots are polled for ever, so a client must not be able to add them).

        Raises:
            RequestRefused: (404, ``network``) a network neither registered nor configured.
        """
        if network is None:
            return self.slots["retry"]
        key = f"retry-{network}"
        slot = self.slots.get(key)
        if slot is not None:
            return slot
        if network not in self.networks and network not in self.read_networks(at_most_every_s=1.0):
            raise RequestRefused(f"no retry policy for network {network!r}: no {RetryPolicy.kind}-{network} is "
                                 f"registered (run `sloctl retry optimise`) and serve.retry_networks does not name it",
                                 status=404, field="network")
        with self.lock:
            slot = self.slots.get(key)
            if slot is None:
                slot = self.control.add_slot(key, f"models:/{RetryPolicy.kind}-{network}@champion",
                                             self.cfg.registry.tracking_uri, RetryPolicy.kind)
                slot.refresh()
        return slot

    def read_networks(self, *, at_most_every_s: float = 0.0) -> frozenset[str]:
        """The networks a retry policy may be served for: configured, and registered as ``retry-policy-NAME``.

        Reads the registry unless it was read less than ``at_most_every_s``
        ago (an unknown name in a request costs at most one read a second,
        however many names a client tries); an unreadable registry keeps the
        names known before.
        """
        now = time.monotonic()
        if now - self._networks_read < at_most_every_s:
            return self.networks
        self._networks_read = now
        try:
            found = registered_names(self.cfg.registry.tracking_uri, f"{RetryPolicy.kind}-")
        except Exception:  # registry unreachable: the slots report it; keep the names known
            return self.networks
        self.networks = frozenset(self.cfg.serve.retry_networks) | found
        return self.networks

    def refresh(self) -> dict[str, bool]:
        """Poll every alias; rebuild the router when a latency model changed, enact a new execution-config.

        Also the background look at the clock: scheduled spin-ups now due are
        enacted here when no route call came first; and the registry's retry
        networks are read again (:meth:`read_networks`).
        """
        swapped = self.control.poll()
        self.read_networks()
        with self.lock:
            if swapped["iconq"] or swapped["stage"] or self.built is None:
                self._build_router()
            if swapped["admission"] or self.admission is None:
                with self.admission_lock:
                    self._build_admission()
            if swapped["execution"]:
                self._take_plan()
            self.tick()
        if self.leases is not None:
            self.reclaim_leases()
        return swapped

    def tick(self) -> None:
        """Enact what the execution-config in force has due now (:class:`~.execution.PlanEnactor`)."""
        with self.lock:
            self._catch_up()
            if self.leads():
                self.enactor.tick(self.now_s())
            if hasattr(self, "cost_offset"):
                self._sync_clusters()

    # -- replicas (shared state) -------------------------------------------------------
    def leads(self) -> bool:
        """Whether this replica enacts scaling now (always, without shared state); the lead is renewed each second."""
        if not self.shared:
            return True
        checked, leading = self._lead
        if time.monotonic() - checked >= 1.0:
            leading = self.store.lead(ttl_s=max(5.0, 3 * self.cfg.serve.watch_interval_s))
            self._lead = (time.monotonic(), leading)
        return leading

    SYNC_S = 0.002  # a decision reads the route log first unless the last read is younger than this

    def _catch_up(self, *, unless_fresh: bool = False) -> None:
        """Apply the other replicas' route-log events to this replica's pool (shared state only).

        With ``unless_fresh``, skip the read when the last one (every commit
        returns the events since the one before) is under :attr:`SYNC_S` old:
        under load a replica's calls follow each other within that, so its
        view is that fresh at worst, at one Redis round trip per call.
        """
        if not self.shared or getattr(self, "built", None) is None:
            return
        if unless_fresh and time.monotonic() - self._synced < self.SYNC_S:
            return
        with self.lock:
            while self._absorb(self.store.events(self._log_id)):
                pass

    def _absorb(self, since: tuple[bool, list]) -> bool:
        """Apply route-log events ``(gap, events)``; True when there may be more (a full page).

        A gap (this replica's last event was trimmed from the log: it fell
        more than ``log_maxlen`` events behind) rebuilds the view from the
        shared state instead (:meth:`_resync`).
        """
        gap, events = since
        if gap:
            self._resync()
            return False
        for event_id, replica, e in events:
            self._log_id = event_id
            if replica == self.replica:
                continue  # this replica's own change: applied when it was made
            if e[0] == "route":
                self._apply_route(int(e[1]), json.loads(e[4]))
            elif e[0] == "complete" and int(e[1]) in self.pool.running:
                self.pool.complete(int(e[1]), float(e[3]) - self.wall0)
            elif e[0] == "clusters":
                self._apply_clusters([tuple(r) for r in json.loads(e[1])])
        self._synced = time.monotonic()
        return len(events) >= 1000

    def _resync(self) -> None:
        """Rebuild this replica's view of the pool from the shared state (after a gap in the route log)."""
        self._log_id = self.store.last_event_id()  # before the state: events after it are applied again, harmlessly
        saved = self.store.clusters()
        if saved is not None:
            self._apply_clusters(saved)
        shared = {qid: (template, cid, arrival_wall, slo_s, predicted)
                  for qid, template, cid, arrival_wall, slo_s, predicted in self.store.running()}
        now = self.now_s()
        for qid in [q for q, r in self.pool.running.items() if q not in shared or shared[q][1] != r.cluster_id]:
            self.pool.complete(qid, now)
        for qid, (template, cid, arrival_wall, slo_s, predicted) in shared.items():
            if qid not in self.pool.running:
                self._apply_route(qid, {"template": template, "cluster_id": cid, "arrival_wall": arrival_wall,
                                        "slo_s": slo_s, "predicted_s": predicted})
        self._synced = time.monotonic()
        self.reconciled["resyncs"] = self.reconciled.get("resyncs", 0) + 1

    def _apply_route(self, query_id: int, row: dict[str, Any]) -> None:
        """A query routed (here or by another replica) joins this replica's view of the pool."""
        cid = row["cluster_id"]
        mine = self.pool.running.get(query_id)
        if mine is not None:
            if mine.cluster_id == cid:
                return
            self.pool.complete(query_id, self.now_s())  # this replica lost the race for the id: the winner's stands
        if cid not in self.pool.clusters:
            self.pool.add_cluster(cid, int(row.get("size", 1)), spun_up_s=self.now_s())
            self.origin.setdefault(cid, "replica")
        arrival_s = float(row["arrival_wall"]) - self.wall0
        predicted = row.get("predicted_s")
        query = Query(query_id, row["template"], arrival_s, float(row["slo_s"]))
        self.pool.restore(query, cid, math.nan if predicted is None else float(predicted), timer_s=arrival_s)
        if self.online is not None:
            c = self.pool.clusters[cid].state
            self.pool.running[query_id].predicted_s = self.online.commit(
                query_id, query.template, arrival_s, query.slo_s, cid, c.size, self.now_s())

    def _apply_clusters(self, rows: list[tuple[str, int, str]]) -> None:
        """Adopt the cluster set another replica published (clusters still running queries here stay)."""
        now = self.now_s()
        wanted = {cid: (int(size), origin) for cid, size, origin in rows}
        for cid, (size, origin) in wanted.items():
            current = self.pool.clusters.get(cid)
            if current is None or (current.size != size and not current.running):
                self.pool.add_cluster(cid, size, spun_up_s=now)
            self.origin[cid] = origin or "config"
            if origin == "operator":
                self.pool.keep.add(cid)
        for cid in [c for c in self.pool.clusters if c not in wanted]:
            if not self.pool.clusters[cid].running:
                self.pool.remove_cluster(cid)
                self.pool.keep.discard(cid)
                self.origin.pop(cid, None)
        self._saved_clusters = list(rows)

    def _take_plan(self) -> None:
        """Put the execution slot's new plan in force; one that cannot be enacted leaves the last one in force.

        The first plan in force reshapes the pool to its ``start_sizes``
        unless an operator changed the pool by hand since the start; later
        plans keep the pool as it is (docs/serving.md, "Enacting the execution-config").
        """
        slot = self.slots["execution"]
        before = self.enactor.current
        now = self.now_s()
        self.enactor.tick(now)  # spin-ups of the old plan that are due now still happen
        try:
            if not isinstance(slot.value, ExecutionPlan):
                raise TypeError(f"expected an {ExecutionPlan.kind} document, got {type(slot.value).__name__}")
            if slot.value.config.autoscaler is not None:
                slot.value.config.autoscaler.validate()
            reshape = before is None and not self.operator_changed_pool and not self.pool_restored
            note = None if reshape else ("the pool was changed by hand (PUT/DELETE /v1/clusters)"
                                         if before is None and self.operator_changed_pool else
                                         "the pool is the one in force before the restart (state_db)"
                                         if before is None else "only the first plan in force sets the pool")
            self.enactor.take(slot.value, f"{slot.uri} v{slot.version}", now, reshape=reshape, not_reshaped=note)
        except Exception as exc:  # a plan that cannot be enacted: keep serving the last one
            slot.error = (f"version {slot.version} could not be enacted ({type(exc).__name__}: {str(exc)[:300]}); "
                          + (f"enacting {before.source}" if before is not None else "no execution-config in force"))
            slot.value, slot.version = self._plan_slot
            self.enactor.current = before
            return
        self._plan_slot = (slot.value, slot.version)
        self._build_autoscaler()

    def guard_summary(self) -> dict[str, Any] | None:
        """How often the Iconq+ router's guard placed by load since the router was built (``None``: no guard)."""
        state = getattr(self.router, "guard_state", None)
        return state.summary() if state is not None else None

    @property
    def slots(self) -> dict[str, ModelSlot]:
        """The registry aliases followed, by name (iconq, stage, admission, retry, execution, retry-<network>)."""
        return self.control.slots

    @property
    def router(self) -> Any:
        return self.built.router

    @property
    def online(self) -> Any:
        """The router's online predictor (``None`` for round-robin)."""
        return self.built.online

    @property
    def route_templates(self) -> Any:
        return self.built.templates

    @property
    def router_margin(self) -> Any:
        return self.built.margin

    @property
    def router_kind(self) -> RouterKind:
        """``iconq``, ``stage`` or ``round-robin``: the model routing now."""
        return self.built.kind

    @property
    def sizer(self) -> Any:
        return self.control.sizer

    def latency_model(self) -> str:
        """Which model routes now: iconq, stage or round-robin (the documented fallback order).

        A model routes when a template table is at hand: ``serve.templates_log``
        or the one in its bundle.
        """
        return self.control.latency_model().slot or RouterKind.ROUND_ROBIN

    def _build_router(self) -> None:
        """The router of the model in force, with the running queries re-committed on it."""
        self.built, _ = self.control.build_router(self.control.latency_model(), self.now_s())
        self.pool.router = self.built.router  # the pool's step routes with the router in force
        self._build_autoscaler()  # the reactive autoscaler reads the router's predictor

    def _build_autoscaler(self) -> None:
        """The reactive autoscaler of the plan in force (AutoSLO §6), attached to the pool; none without knobs.

        As in simulation (``simulation/batch.py``): the spin-up trigger
        (Algorithm 2) and the Spinup Size Selector (Algorithm 3, mode
        ``add``) over the router's predictor, plus the teardown trigger. With
        round-robin routing there is no predictor for the trigger: only the
        teardown trigger runs. The observation windows carry over when the
        knobs or the router change.
        """
        state = self.enactor.current
        knobs = state.plan.config.autoscaler if state else None
        self.control.build_autoscaler(knobs, self.router, without_model="teardown")
        if state:
            state.reactive = None if knobs is None else self.control.reactive

    def _build_admission(self) -> None:
        """The admission policy's credit pool, handed out as leases; a new policy starts a new pool."""
        serve = self.cfg.serve
        policy: AdmissionPolicy | None = self.slots["admission"].value
        if policy is not None:
            controller = policy.controller()
            self.admission_source = f"{self.slots['admission'].uri} v{self.slots['admission'].version}"
        else:
            controller = CreditController(classes=[ClassShare("high", 2), ClassShare("low", 1)])
            self.admission_source = f"library defaults (no {AdmissionPolicy.kind} registered)"
        controller.bound_history(serve.history_limit)
        self.admission = controller
        if self.leases is None:
            store = self.store.lease_store(self.wall0) if self.shared else None
            self.leases = LeasedCredits(controller, store, default_ttl_s=serve.lease_ttl_s,
                                        max_ttl_s=serve.lease_max_ttl_s, owner=self.replica if self.shared else "")
        else:
            self.leases.swap(controller)

    def reclaim_leases(self) -> int:
        """Return the credits of expired admission leases to the pool (the watcher calls it too)."""
        with self.admission_lock:
            return len(self.leases.reclaim(self.now_s()))

    def _reconcile(self) -> None:
        now_wall = self.clock()
        rows = self.store.running()
        with self.lock:
            for qid, template, cid, arrival_wall, slo_s, predicted in rows:
                if cid not in self.pool.clusters or now_wall - arrival_wall > self.stale_after_s:
                    if self.shared:  # ended for every replica, its billing too (a timeout: nobody completed it)
                        self.store.commit_complete(qid, now_wall - arrival_wall, "timeout", now_wall)
                    else:
                        self.store.remove_running(qid)
                    self.reconciled["dropped_stale"] += 1
                    continue
                arrival_s = arrival_wall - self.wall0
                self.pool.restore(Query(qid, template, arrival_s, slo_s), cid,
                                  float("nan") if predicted is None else predicted, timer_s=max(0.0, arrival_s))
                self.reconciled["restored"] += 1
            self._build_router()

    # -- routing ---------------------------------------------------------------------
    def templates_for(self, kind: str) -> Any:
        """The template table ``kind``'s model routes with: ``serve.templates_log``, else its bundle's."""
        return self.control.templates_for(None if kind == RouterKind.ROUND_ROBIN else kind)

    def check_template(self, template: str, kind: str | None = None) -> None:
        """Refuse a template missing from the table of ``kind``'s model (default: the router's)."""
        table = self.route_templates if kind is None else self.templates_for(kind)
        if table is not None and template not in table["template"].to_numpy():
            known = ", ".join(sorted(table["template"].unique())[:8])
            raise RequestRefused(f"unknown template {template!r} (known: {known}, ...)", field="template")

    @property
    def clusters(self) -> dict[str, ClusterState]:
        """The pool's clusters as routers see them, by id."""
        return {cid: c.state for cid, c in self.pool.clusters.items()}

    @property
    def running(self) -> dict[int, _Running]:
        """The running queries, by id (views of the pool's records)."""
        return {qid: _Running(r, self.wall0) for qid, r in self.pool.running.items()}

    @staticmethod
    def _first_answer(first: dict[str, Any], query_id: int, **request: Any) -> dict[str, Any]:
        """A repeated call's answer: the first one, if the call is the same one (else 409)."""
        asked = first.pop("request", None)
        if asked is not None and asked != request:
            said = ", ".join(f"{k} {v!r}" for k, v in asked.items())
            raise RequestRefused(f"query {query_id} was {'routed' if 'template' in asked else 'completed'} already "
                                f"with {said}; a repeated call must name the same", status=409, field="query_id")
        return first

    def route(self, query_id: int, template: str, slo_s: float) -> dict[str, Any]:
        """Route a query (the first answer again for a repeated ``query_id``: a client may retry anywhere)."""
        with self.lock:
            self._catch_up(unless_fresh=True)
            if query_id in self.pool.running or not self.shared:
                first = self.store.answer(query_id)
                if first is not None:
                    return self._first_answer(first, query_id, template=template, slo_s=slo_s)
                if query_id in self.pool.running:  # running from before answers were kept
                    raise RequestRefused(f"query {query_id} is already running", status=409, field="query_id")
            if self.router_kind != RouterKind.ROUND_ROBIN:
                self.check_template(template)
            now = self.now_s()
            leads = self.leads()
            if leads:
                self.enactor.tick(now)  # scheduled spin-ups due by now, clusters now ready
            if not self.pool.routable(now):
                raise RequestRefused("the pool has no ready cluster to route to", status=409)
            query = Query(query_id, template, now, slo_s)
            if self.pool.autoscaler is not None and leads:  # the reactive autoscaler at this arrival, as in simulation
                self.pool.scale(query, now)
                self.enactor.drain(now, "autoscaler")
            started = time.perf_counter()
            decision = self.pool.route(query, now)
            decision_ms = (time.perf_counter() - started) * 1e3
            cluster = self.pool.clusters[decision.cluster_id].state
            predicted = None if not np.isfinite(decision.predicted_s) else float(decision.predicted_s)
            out = {"query_id": query_id, "cluster_id": cluster.cluster_id, "cluster_size": cluster.size,
                   "predicted_latency_s": predicted, "model": self.router_kind,
                   "model_version": self._model_version(), "fallback": self.router_kind != RouterKind.ICONQ,
                   "guard": decision.fallback,
                   "decision_ms": decision_ms,
                   "explanation": {cid: {k: float(v) for k, v in e.items()} for cid, e in decision.explanation.items()}}
            kept = {**out, "request": {"template": template, "slo_s": slo_s}}
            if self.shared:
                row = {"template": template, "cluster_id": cluster.cluster_id, "size": cluster.size,
                       "arrival_wall": self.wall0 + now, "slo_s": slo_s, "predicted_s": predicted}
                log_id = self._log_id
                won, first, events = self.store.commit_route(query_id, kept, row, self.wall0 + now, cluster.size,
                                                             self.cfg.router.minimum_s, log_id)
                if not won:  # routed before (by another replica, or before it completed): the first answer stands
                    self.pool.complete(query_id, now)
                if self._absorb(events):
                    self._catch_up()
                if not won:
                    return self._first_answer(first, query_id, template=template, slo_s=slo_s)
            else:
                self.store.add_running((query_id, template, cluster.cluster_id, self.wall0 + now, slo_s, predicted),
                                       kept)
            self._sync_clusters()
            self.decisions.append({"t": now, "query_id": query_id, "template": template,
                                   "cluster_id": cluster.cluster_id, "model": self.router_kind,
                                   "predicted_s": predicted})
            return out

    def complete(self, query_id: int, latency_s: float, status: str) -> dict[str, Any]:
        """A routed query ended (the first answer again for a repeated call)."""
        with self.lock:
            now = self.now_s()
            if self.shared:  # no read first: the commit returns what the others did since this replica's last call
                outcome, answer, counters, events = self.store.commit_complete(query_id, latency_s, status,
                                                                               self.wall0 + now, self._log_id)
                if self._absorb(events):
                    self._catch_up()
                if outcome == "unknown":
                    raise RequestRefused(f"query {query_id} is not running", status=404, field="query_id")
                if outcome == "repeat":
                    return self._first_answer(answer, query_id, latency_s=latency_s, status=status)
                self.completed, self.violations = counters
                answer.pop("request", None)
                if query_id in self.pool.running:
                    self.pool.complete(query_id, now)
            else:
                if query_id not in self.pool.running:
                    first = self.store.done(query_id)
                    if first is not None:
                        return self._first_answer(first, query_id, latency_s=latency_s, status=status)
                    raise RequestRefused(f"query {query_id} is not running", status=404, field="query_id")
                r = self.pool.complete(query_id, now)
                violated = status != "ok" or latency_s > r.query.slo_s
                self.completed += 1
                self.violations += int(violated)
                answer = {"query_id": query_id, "cluster_id": r.cluster_id, "violated": violated,
                          "predicted_latency_s": None if not np.isfinite(r.predicted_s) else r.predicted_s}
                self.store.remove_running(query_id, {**answer, "request": {"latency_s": latency_s,
                                                                           "status": status}})
            self.history.append({"t": now, "vr": self.violations / self.completed, "cost": self._history_cost(now)})
            return answer

    def _history_cost(self, now: float) -> float:
        """The total cost for the history and ``sloctl_cost``: shared state reads the bill at most once a second
        (it is in Redis already; reading it settles every timer), one runtime persists it at every completion."""
        if not self.shared:
            return self.report_cost(now)
        at, cost = self._cost_read
        if now - at >= 1.0:
            at, cost = now, self.report_cost(now)
            self._cost_read = (at, cost)
        return cost

    @staticmethod
    def _check_name(cluster_id: str) -> None:
        if cluster_id.startswith(RESERVED_PREFIX):
            raise RequestRefused(f"cluster ids starting with {RESERVED_PREFIX!r} are reserved, got {cluster_id!r}",
                                field="cluster_id")

    def _operator_changed(self) -> None:
        if not self.operator_changed_pool:
            self.operator_changed_pool = True
            self.store.set_meta("operator_changed_pool", "1")

    def put_cluster(self, cluster_id: str, size: int) -> dict[str, Any]:
        """Add a cluster (or resize an idle one), e.g. after a spin-up."""
        self._check_name(cluster_id)
        with self.lock:
            current = self.pool.clusters.get(cluster_id)
            if current is not None and current.size == size:
                return {"cluster_id": cluster_id, "size": size, "changed": False}
            if current is not None:
                self._check_idle(cluster_id)
                self._retire_cost(cluster_id)
                self.store.save_costs([("_retired", self.cost_offset["_retired"])], delete=(cluster_id,))
            self.pool.add_cluster(cluster_id, size, spun_up_s=self.now_s())  # a fresh timer, in place of the old one
            self.pool.keep.add(cluster_id)  # the operator's: the plan and the autoscaler leave it alone
            self.origin[cluster_id] = "operator"
            self._operator_changed()
            self._sync_clusters()
            return {"cluster_id": cluster_id, "size": size, "changed": True}

    def delete_cluster(self, cluster_id: str) -> dict[str, Any]:
        """Retire an idle cluster (its accrued cost stays in the total)."""
        self._check_name(cluster_id)
        with self.lock:
            if cluster_id not in self.pool.clusters:
                raise RequestRefused(f"unknown cluster {cluster_id!r}", status=404, field="cluster_id")
            self._check_idle(cluster_id)
            self._remove_cluster(cluster_id)
            self._operator_changed()
            self._sync_clusters()
            return {"cluster_id": cluster_id, "retired": True}

    def _remove_cluster(self, cluster_id: str) -> None:
        """Take an idle cluster out of the pool for good; its accrued cost stays in the total."""
        self._retire_cost(cluster_id)
        self.pool.remove_cluster(cluster_id)
        self.pool.keep.discard(cluster_id)
        self.origin.pop(cluster_id, None)
        # only the retired total: reading every timer now could move one past a restart's reconciled times
        self.store.save_costs([("_retired", self.cost_offset.get("_retired", 0.0))], delete=(cluster_id,))

    def _sync_clusters(self) -> None:
        """Save the cluster set when it changed (who added or retired a cluster does not matter)."""
        rows = [(cid, c.size, self.origin.get(cid, "config")) for cid, c in self.pool.clusters.items()]
        if rows != self._saved_clusters:
            self.store.save_clusters(rows)
            self._saved_clusters = rows

    def _check_idle(self, cluster_id: str) -> None:
        busy = [qid for qid, r in self.pool.running.items() if r.cluster_id == cluster_id]
        if busy:
            raise RequestRefused(f"cluster {cluster_id!r} still runs {len(busy)} queries", status=409,
                                field="cluster_id")

    def _retire_cost(self, cluster_id: str) -> None:
        if self.shared:
            self.store.retire(cluster_id, self.wall0 + self.now_s())
            return
        self.cost_offset["_retired"] = self.cost_offset.get("_retired", 0.0) + self.cost(cluster_id, self.now_s())
        self.cost_offset.pop(cluster_id, None)

    def cost(self, cluster_id: str, now: float) -> float:
        """One cluster's accrued cost at ``now`` (this runtime's own timers and the offset a restart carried)."""
        return self.cost_offset.get(cluster_id, 0.0) + self.pool.cost(cluster_id, now)

    def costs(self, now: float) -> tuple[dict[str, float], float]:
        """Accrued cost of each cluster in the pool, and of retired clusters, at ``now``.

        With shared state the bill is the Redis timers' (every replica's
        queries), read in one round trip.
        """
        if self.shared:
            per, retired = self.store.bill(self.wall0 + now, list(self.pool.clusters))
            price = self.cfg.router.price_per_unit_s
            return {cid: price * per.get(cid, 0.0) for cid in self.pool.clusters}, price * retired
        return {cid: self.cost(cid, now) for cid in self.pool.clusters}, self.cost_offset.get("_retired", 0.0)

    def total_cost(self, now: float) -> float:
        per, retired = self.costs(now)
        return retired + sum(per.values())

    def _persist_costs(self, now: float) -> tuple[dict[str, float], float]:
        """The costs at ``now`` (:meth:`costs`), written to the state store first (shared: already in Redis)."""
        per, retired = self.costs(now)
        if not self.shared:
            self.store.save_costs([*per.items(), ("_retired", retired)])
        return per, retired

    def report_cost(self, now: float) -> float:
        """The total cost at ``now``, written to the state store before anyone is told (a crash cannot rewind it)."""
        with self.lock:
            per, retired = self._persist_costs(now)
            return retired + sum(per.values())

    def clusters_view(self) -> dict[str, Any]:
        """The pool: ready clusters (``clusters``), those still starting, and the recent scaling events."""
        with self.lock:
            self._catch_up()
            now = self.now_s()
            if self.leads():
                self.enactor.tick(now)
            self._sync_clusters()
            per, retired = self._persist_costs(now)
            total = retired + sum(per.values())
            if self.shared:
                self.completed, self.violations = self.store.counters()
            return {"clusters": [{"cluster_id": cid, "size": c.size, "running": sorted(
                qid for qid, r in self.pool.running.items() if r.cluster_id == cid),
                "accrued_cost": per[cid], "origin": self.origin.get(cid), "retired": c.retired}
                for cid, c in self.pool.clusters.items() if c.is_ready(now)],
                "starting": self.enactor.starting(now),
                "total_cost": total, "completed": self.completed,
                "violation_rate": self.violations / self.completed if self.completed else 0.0,
                "model": self.router_kind, "reconciled": dict(self.reconciled),
                "events": list(self.enactor.events)[-50:],
                "state": {"store": "redis" if self.shared else "sqlite", "replica": self.replica,
                          "leads_scaling": self.leads()},
                "drift_calibration": self._drift_state()}

    def _drift_state(self) -> dict[str, Any] | None:
        """The router's online drift calibration (router.drift_window_s), or None when it trusts the model as is."""
        calibration = getattr(getattr(self.router, "model", None), "calibration", None)
        return None if calibration is None else calibration.state()

    def execution_view(self) -> dict[str, Any] | None:
        """The execution-config in force and what it enacted (``GET /v1/execution-config``); ``None``: none."""
        with self.lock:
            if self.leads():
                self.enactor.tick(self.now_s())
            view = self.enactor.view()
            return None if view is None else {**self.enactor.current.plan.to_doc(), **view}

    def _model_version(self) -> str | None:
        slot = self.control.choice.slot
        return None if slot is None else self.slots[slot].version

    def close(self) -> None:
        self.control.close()  # a sizing job under way is waited for; its result is not applied
        with self.lock:
            self._persist_costs(self.now_s())
            self._sync_clusters()
            if self.shared:
                self.store.resign()  # another replica takes the scaling lead at its next look, not after the TTL
            self.store.close()


def open_state_store(cfg: RuntimeConfig, state_db: str, *, replica: str, answer_ttl_s: float) -> StateStore:
    """The store ``state.url`` names: Redis (``redis://``, ``rediss://``, ``unix://``) shared by replicas, else
    the SQLite file ``state_db`` (also ``sqlite:///PATH`` in ``state.url``)."""
    section = getattr(cfg, "state", None)
    url = getattr(section, "url", None)
    if url and url.split("://", 1)[0] in ("redis", "rediss", "unix"):
        return RedisStateStore(url, prefix=section.key_prefix, replica=replica, answer_ttl_s=answer_ttl_s)
    if url:  # StateSection allows only these schemes: this one is sqlite:///PATH
        state_db = url.removeprefix("sqlite:///")
    return SqliteStateStore(state_db, answer_ttl_s=answer_ttl_s)
