"""The managed pool: route → start billing → complete → autoscale, written once (AutoSLO §2, §5, §6).

A :class:`ManagedPool` owns the clusters a router may use (each a
:class:`~sloctl.control.router.ClusterState` with its
:class:`~sloctl.control.billing.BillingTimer`, plus when it was spun up,
when it is ready, when it was last routed to, and whether it is retired or
torn down) and the queries running on them. Its methods are the one control
step every driver runs:

* :meth:`ManagedPool.scale` — at an arrival, the autoscaler (§6) looks at
  :meth:`ManagedPool.views` and its actions are applied (spin up, tear down,
  retire the others); a size selection it ran in the background is logged
  (``sizing`` events) before the spin-up it led to;
* :meth:`ManagedPool.route` — the router (§5) chooses among the routable
  clusters, the chosen cluster's billing timer starts (§2) and the query is
  recorded as running;
* :meth:`ManagedPool.complete` — the timer stops, the router forgets the
  query and the autoscaler's completion window records it;
* :meth:`ManagedPool.cost` / :meth:`ManagedPool.cost_by_cluster` — price ×
  size × active time.

A driver supplies only the clock (the times it passes in) and the world:
the warehouse simulator decides completion times by processor sharing, the
live runner observes them from real DuckDB clusters, the HTTP runtime is told
them, and the autoscaler's what-if simulation takes them from the latency
predictor. What differs between drivers is a hook: a
:class:`ClusterBackend` starts and stops clusters (names them and says when
they are ready), and ``clamp_late_events`` keeps billing times non-decreasing
for a driver that observes events late.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from sloctl.control.billing import BillingTimer
from sloctl.control.router import ClusterState, Query, RouteDecision
from sloctl.core.errors import ClusterPoolError

__all__ = [
    "ClusterBackend",
    "ClusterView",
    "ManagedCluster",
    "ManagedPool",
    "RunningQuery",
    "ScalingAction",
]


@dataclass
class ClusterView:
    """A cluster as the autoscaler sees it."""

    cluster_id: str
    size: int
    ready: bool
    spun_up_s: float
    last_routed_s: float | None
    running: int
    state: ClusterState | None = None


@dataclass(frozen=True)
class ScalingAction:
    """``spin_up`` (size), ``tear_down`` (cluster id) or ``retire_others`` (vertical: stop routing to the rest)."""

    kind: str
    size: int | None = None
    cluster_id: str | None = None
    reason: str = ""  # who asked: "plan" (a scheduled spin-up), "trigger", "size-selector", "queue@N", "idle", ...


@dataclass
class ManagedCluster:
    """One cluster of the pool: its billing state and where it is in its life.

    Attributes:
        state: what routers see (id, size, billing timer, price).
        spun_up_s: when it was requested (the teardown trigger's lifetime).
        ready_s: from when it takes queries; ``-inf`` from the start, ``None``
            while starting with no known ready time (see
            :meth:`ManagedPool.mark_ready`).
        last_routed_s: when a query was last routed to it.
        retired: no longer routed to (vertical scaling), still billed.
        torn_down: gone; its cost stays in the bill.
        running: how many queries run on it.
        timer_s: the last time its timer was given (the late-observation clamp).
    """

    state: ClusterState
    spun_up_s: float = 0.0
    ready_s: float | None = -math.inf
    last_routed_s: float | None = None
    retired: bool = False
    torn_down: bool = False
    running: int = 0
    timer_s: float = -math.inf

    @property
    def cluster_id(self) -> str:
        return self.state.cluster_id

    @property
    def size(self) -> int:
        return self.state.size

    def is_ready(self, now_s: float) -> bool:
        return self.ready_s is not None and self.ready_s <= now_s


@dataclass
class RunningQuery:
    """A query routed by the pool and not yet complete."""

    query: Query
    cluster_id: str
    predicted_s: float
    routed_s: float


class ClusterBackend(Protocol):
    """The part of scaling that belongs to the driver's world: really starting and stopping clusters."""

    def spin_up(self, size: int, now_s: float) -> tuple[str, float | None]:
        """Start a cluster of ``size``; returns its id and when it is ready (``None``: it will say).

        Raises:
            ClusterPoolError: the world refuses (the pool records it and goes on).
        """

    def tear_down(self, cluster_id: str, now_s: float) -> None:
        """Stop ``cluster_id`` (it runs no query)."""


class ManagedPool:
    """Clusters, their billing timers and the running queries, behind the one control step.

    Args:
        router: the :class:`~sloctl.control.router.Router`; may be replaced
            between calls (the runtime swaps models).
        autoscaler: optional :class:`~sloctl.control.autoscaler.Autoscaler`
            (anything with ``on_arrival(query, clusters, now_s)``, ``force`` and ``on_completion``;
            ``take_events``, if it has one, adds to :attr:`events`).
        price_per_unit_s, minimum_s: billing of clusters the pool creates.
        backend: starts and stops clusters for the autoscaler's actions.
        clamp_late_events: give each billing timer ``max(t, the last time it
            was given)`` instead of ``t``, and count every routing decision as
            seen by every timer (cost-aware routers read them all at
            ``now_s``). For a driver that observes completions late (the
            live runner): a late completion would otherwise move a timer
            backwards. It over-bills by at most the observation delay.
        keep: ids of clusters that scaling actions never tear down nor
            retire (the HTTP runtime's clusters added by hand: an operator's
            to retire); :attr:`keep` may change between calls.
    """

    def __init__(self, router: Any, *, autoscaler: Any = None, price_per_unit_s: float = 1.0,
                 minimum_s: float = 60.0, backend: ClusterBackend | None = None,
                 clamp_late_events: bool = False, keep: Iterable[str] = ()) -> None:
        self.router = router
        self.autoscaler = autoscaler
        self.price_per_unit_s = price_per_unit_s
        self.minimum_s = minimum_s
        self.backend = backend
        self.clamp_late_events = clamp_late_events
        self.keep: set[str] = set(keep)
        self.clusters: dict[str, ManagedCluster] = {}
        self.running: dict[int, RunningQuery] = {}
        self.events: list[dict[str, Any]] = []
        self.latest_s = -math.inf  # the latest time routed at or handed to a timer
        self._newest: str | None = None

    # -- the cluster set --------------------------------------------------------------
    def add_cluster(self, cluster_id: str, size: int, *, spun_up_s: float = 0.0,
                    ready_s: float | None = -math.inf) -> ManagedCluster:
        """Add a cluster with a fresh (paused) billing timer; replaces an idle one of that id in place."""
        state = ClusterState(cluster_id, size, BillingTimer(self.minimum_s), self.price_per_unit_s)
        return self.add_state(state, spun_up_s=spun_up_s, ready_s=ready_s)

    def add_state(self, state: ClusterState, *, spun_up_s: float = 0.0,
                  ready_s: float | None = -math.inf) -> ManagedCluster:
        """Add a cluster with its own state (e.g. a copy of a live timer, for a what-if run)."""
        current = self.clusters.get(state.cluster_id)
        if current is not None and current.running:
            raise ValueError(f"The cluster {state.cluster_id!r} of ManagedPool must be idle to be replaced, "
                             f"got {current.running} running queries.")
        cluster = ManagedCluster(state, spun_up_s=spun_up_s, ready_s=ready_s)
        self.clusters[state.cluster_id] = cluster
        return cluster

    def remove_cluster(self, cluster_id: str) -> ManagedCluster:
        """Forget an idle cluster altogether (its cost leaves :meth:`cost_by_cluster`)."""
        cluster = self._cluster(cluster_id)
        if cluster.running:
            raise ValueError(f"The cluster {cluster_id!r} of ManagedPool must be idle to be removed, "
                             f"got {cluster.running} running queries.")
        return self.clusters.pop(cluster_id)

    def mark_ready(self, cluster_id: str, now_s: float) -> None:
        """A starting cluster reported ready at ``now_s``."""
        self._cluster(cluster_id).ready_s = now_s
        self.events.append({"t": now_s, "event": "ready", "cluster_id": cluster_id})

    def starting(self) -> list[str]:
        """Clusters started with no known ready time that have not reported ready yet."""
        return [cid for cid, c in self.clusters.items() if c.ready_s is None and not c.torn_down]

    def routable(self, now_s: float) -> list[ClusterState]:
        """Ready clusters that are neither retired nor torn down.

        When every ready cluster is retired before its replacement is ready,
        the retired ones keep serving.
        """
        active = [c.state for c in self.clusters.values() if c.is_ready(now_s) and not c.retired and not c.torn_down]
        if not active:
            active = [c.state for c in self.clusters.values() if c.is_ready(now_s) and not c.torn_down]
        return active

    def views(self, now_s: float) -> list[ClusterView]:
        """Every cluster not torn down, as the autoscaler sees it."""
        return [ClusterView(cid, c.state.size, c.is_ready(now_s) and not c.retired, c.spun_up_s, c.last_routed_s,
                            c.running, c.state)
                for cid, c in self.clusters.items() if not c.torn_down]

    # -- the step ---------------------------------------------------------------------
    def scale(self, query: Query, now_s: float, *, force: bool = False) -> list[ScalingAction]:
        """Run the autoscaler for an arriving query and apply its actions (§6).

        Args:
            query: the arrival (the autoscaler's windows record it).
            now_s: the driver's time.
            force: also scale regardless of the triggers (the size-selector
                experiment); an autoscaler sizing in the background applies
                the forced spin-up at a later arrival, once its job is done.
        """
        if self.autoscaler is None:
            return []
        actions = self.autoscaler.on_arrival(query, self.views(now_s), now_s)
        if force:
            actions = actions + self.autoscaler.force(now_s, self.views(now_s))
        take_events = getattr(self.autoscaler, "take_events", None)  # background sizings it finished
        if take_events is not None:
            self.events.extend(take_events())
        self.apply(actions, now_s)
        return actions

    def apply(self, actions: list[ScalingAction], now_s: float) -> None:
        """Spin up, tear down or retire, in order; each lands in :attr:`events`.

        A spin-up the backend refuses is recorded (``refused``) and a
        ``retire_others`` after it in the same list is skipped: there is no
        new cluster to keep. A tear-down of a cluster that still runs
        queries, or of one in :attr:`keep`, is ignored; ``retire_others``
        leaves the clusters in :attr:`keep` routable.
        """
        refused = False
        for action in actions:
            if action.kind == "spin_up":
                if self.backend is None:
                    raise ValueError("The 'backend' parameter of ManagedPool must be set to spin clusters up, "
                                     "got None.")
                try:
                    cid, ready_s = self.backend.spin_up(action.size, now_s)
                except ClusterPoolError as exc:
                    self.events.append({"t": now_s, "event": "refused", "size": action.size, "why": str(exc)})
                    refused = True
                    continue
                self.add_cluster(cid, action.size, spun_up_s=now_s, ready_s=ready_s)
                event = {"t": now_s, "event": "spin_up", "cluster_id": cid, "size": action.size,
                         "reason": action.reason}
                if ready_s is not None:
                    event["ready_s"] = ready_s
                self.events.append(event)
                self._newest = cid
            elif action.kind == "tear_down":
                cluster = self._cluster(action.cluster_id)
                if cluster.running or action.cluster_id in self.keep:
                    continue
                cluster.torn_down = True
                if self.backend is not None:
                    self.backend.tear_down(action.cluster_id, now_s)
                self.events.append({"t": now_s, "event": "tear_down", "cluster_id": action.cluster_id,
                                    "reason": action.reason})
            elif action.kind == "retire_others":
                if refused:
                    continue
                for cid, cluster in self.clusters.items():
                    if cid != self._newest and cid not in self.keep:
                        cluster.retired = True
                self.events.append({"t": now_s, "event": "retire_others", "keep": self._newest})
            else:
                raise ValueError(f"The 'kind' of a ScalingAction must be spin_up, tear_down or retire_others, "
                                 f"got {action.kind!r}.")

    def route(self, query: Query, now_s: float) -> RouteDecision:
        """Route ``query`` (§5), start the chosen cluster's billing (§2) and record it as running.

        Raises:
            ValueError: the query is already running, or the router chose a
                cluster the pool does not hold.
        """
        if query.query_id in self.running:
            raise ValueError(f"The query {query.query_id} routed by ManagedPool must not be running already.")
        decision = self.router.route(query, self.routable(now_s), now_s)
        cluster = self.clusters.get(decision.cluster_id)
        if cluster is None:
            raise ValueError(f"Router {getattr(self.router, 'name', self.router)!r} chose unknown cluster "
                             f"{decision.cluster_id!r} (clusters: {', '.join(self.clusters)}).")
        self.latest_s = max(self.latest_s, now_s)
        if self.clamp_late_events:  # the router may have read every timer at now_s
            for c in self.clusters.values():
                c.timer_s = max(c.timer_s, now_s)
        cluster.state.timer.query_arrived(self._timer_time(cluster, now_s))
        cluster.last_routed_s = now_s
        cluster.running += 1
        self.running[query.query_id] = RunningQuery(query, cluster.cluster_id, float(decision.predicted_s), now_s)
        return decision

    def restore(self, query: Query, cluster_id: str, predicted_s: float, *, timer_s: float | None = None) -> None:
        """Record a query already running on ``cluster_id`` without routing it.

        Args:
            query: the query.
            cluster_id: where it runs.
            predicted_s: its predicted latency.
            timer_s: start the cluster's billing timer at this time (a restart
                reconciling its running queries); ``None`` when the timer
                already counts it (a what-if copy of live timers).
        """
        cluster = self._cluster(cluster_id)
        if timer_s is not None:
            cluster.state.timer.query_arrived(self._timer_time(cluster, timer_s))
        cluster.running += 1
        self.running[query.query_id] = RunningQuery(query, cluster_id, predicted_s, query.arrival_s)

    def complete(self, query_id: int, end_s: float) -> RunningQuery:
        """``query_id`` ended at ``end_s``: stop billing it, tell the router and the autoscaler.

        Returns:
            The query's record (query, cluster, prediction, routing time).
        """
        record = self.running.pop(query_id, None)
        if record is None:
            raise ValueError(f"The query {query_id} completed in ManagedPool must be running, got an unknown id.")
        cluster = self.clusters[record.cluster_id]
        cluster.running -= 1
        cluster.state.timer.query_finished(self._timer_time(cluster, end_s))
        self.router.on_complete(query_id, end_s)
        if self.autoscaler is not None:
            self.autoscaler.on_completion(record.query, end_s)
        return record

    # -- the bill ---------------------------------------------------------------------
    def cost(self, cluster_id: str, now_s: float) -> float:
        """``price × size × active time`` of one cluster up to ``now_s``."""
        s = self._cluster(cluster_id).state
        return s.price_per_unit_s * s.size * s.timer.active_s(now_s)

    def total_cost(self, now_s: float) -> float:
        """The bill of every cluster ever held (torn-down ones included) up to ``now_s``."""
        return sum(self.cost(cid, now_s) for cid in self.clusters)

    def cost_by_cluster(self, horizon_s: float) -> dict[str, float]:
        """Each cluster's bill up to ``horizon_s`` (far enough ahead to close every open window)."""
        return {cid: self.cost(cid, horizon_s) for cid in self.clusters}

    def usage_by_cluster(self, horizon_s: float) -> dict[str, dict[str, float]]:
        """Where each cluster's bill up to ``horizon_s`` went (:meth:`BillingTimer.usage`), with its size and cost."""
        out = {}
        for cid, c in self.clusters.items():
            s = c.state
            out[cid] = {"size": float(s.size), "cost": self.cost(cid, horizon_s), **s.timer.usage(horizon_s),
                        "torn_down": float(c.torn_down)}
        return out

    # -- helpers ----------------------------------------------------------------------
    def _cluster(self, cluster_id: str) -> ManagedCluster:
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            raise ValueError(f"The 'cluster_id' of ManagedPool must name one of its clusters "
                             f"({', '.join(self.clusters) or 'none'}), got {cluster_id!r}.")
        return cluster

    def _timer_time(self, cluster: ManagedCluster, t: float) -> float:
        if self.clamp_late_events:
            t = max(t, cluster.timer_s)
        cluster.timer_s = max(cluster.timer_s, t)
        self.latest_s = max(self.latest_s, t)
        return t
