"""Event-driven warehouse simulation: routed (and autoscaled) queries on an emulated world.

Arrivals come from a workload; the router (a ``control`` policy) chooses a
cluster for each, seeing only its own predictor; an optional autoscaler may
spin clusters up (ready after the spin-up delay) or tear them down. When each
query really ends is decided by the
:class:`~sloctl.simulation.emulator.WarehouseEmulator` (processor sharing with
calibrated interference). Billing timers follow every start and end. The same
seed gives the same run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sloctl.control.autoscaler import ClusterView
from sloctl.control.billing import BillingTimer
from sloctl.control.router import ClusterState, Query

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.control.autoscaler import Autoscaler, ScalingAction
    from sloctl.control.router import Router
    from sloctl.simulation.emulator import WarehouseEmulator

__all__ = ["SimulationResult", "WarehouseSimulator"]


@dataclass
class SimulationResult:
    """Per-query outcomes, the bill, and the scaling events."""

    queries: pd.DataFrame
    cost: float
    cost_by_cluster: dict[str, float]
    events: list[dict] = field(default_factory=list)
    cost_marks: dict[int, float] = field(default_factory=dict)

    def cost_since(self, index: int) -> float:
        """Cost billed after the arrival with this index (needs ``mark_at``)."""
        return self.cost - self.cost_marks[index]

    @property
    def violation_rate(self) -> float:
        return float(self.queries["violated"].mean()) if len(self.queries) else 0.0


@dataclass
class _Cluster:
    state: ClusterState
    remaining: dict[int, float]
    ready_s: float = 0.0
    spun_up_s: float = 0.0
    last_routed_s: float | None = None
    last_s: float = 0.0
    retired: bool = False
    torn_down: bool = False


class WarehouseSimulator:
    """Runs one workload through a router (and autoscaler) on emulated clusters.

    Args:
        world: the emulated warehouse (decides real completion times).
        clusters: ``(cluster_id, size)`` of the clusters active at time 0.
        router: the routing policy under test.
        price_per_unit_s: price of one size unit per second.
        minimum_s: billing minimum window (``m``).
        seed: seed of the service-time noise.
        autoscaler: optional :class:`~sloctl.control.autoscaler.Autoscaler`.
        force_scaling_at: index of the arrival at which to force one scaling
            decision (the size-selector experiment).
        mark_at: arrival indices at which to record the cost billed so far.
    """

    def __init__(self, world: WarehouseEmulator, clusters: list[tuple[str, int]], router: Router, *,
                 price_per_unit_s: float = 1.0, minimum_s: float = 60.0, seed: int = 0,
                 autoscaler: Autoscaler | None = None, force_scaling_at: int | None = None,
                 mark_at: tuple[int, ...] = ()) -> None:
        self.world = world
        self.router = router
        self.rng = np.random.default_rng(seed)
        self.price_per_unit_s = price_per_unit_s
        self.minimum_s = minimum_s
        self.autoscaler = autoscaler
        self.force_scaling_at = force_scaling_at
        self.mark_at = set(mark_at)
        self.cost_marks: dict[int, float] = {}
        self.clusters = {cid: self._new_cluster(cid, size, 0.0, 0.0) for cid, size in clusters}
        self._ids = itertools.count(1)
        self.events: list[dict] = []

    def _new_cluster(self, cid: str, size: int, now_s: float, ready_s: float) -> _Cluster:
        state = ClusterState(cid, size, BillingTimer(self.minimum_s), self.price_per_unit_s)
        return _Cluster(state, {}, ready_s=ready_s, spun_up_s=now_s, last_s=now_s)

    def _advance(self, cluster: _Cluster, t: float) -> None:
        k = len(cluster.remaining)
        if k:
            rate = self.world.rate(k, cluster.state.size)
            for qid in cluster.remaining:
                cluster.remaining[qid] -= (t - cluster.last_s) * rate
        cluster.last_s = t

    def _next_completion(self, cluster: _Cluster) -> tuple[float, int | None]:
        if not cluster.remaining:
            return math.inf, None
        qid = min(cluster.remaining, key=cluster.remaining.__getitem__)
        rate = self.world.rate(len(cluster.remaining), cluster.state.size)
        return cluster.last_s + max(cluster.remaining[qid], 0.0) / rate, qid

    def _views(self, now_s: float) -> list[ClusterView]:
        return [ClusterView(cid, c.state.size, c.ready_s <= now_s and not c.retired, c.spun_up_s, c.last_routed_s,
                            len(c.remaining), c.state)
                for cid, c in self.clusters.items() if not c.torn_down]

    def _apply(self, actions: list[ScalingAction], now_s: float) -> None:
        for action in actions:
            if action.kind == "spin_up":
                cid = f"auto{next(self._ids)}-s{action.size}"
                delay = self.autoscaler.config.spinup_delay_s
                self.clusters[cid] = self._new_cluster(cid, action.size, now_s, now_s + delay)
                self.events.append({"t": now_s, "event": "spin_up", "cluster_id": cid, "size": action.size,
                                    "ready_s": now_s + delay})
                self._newest = cid
            elif action.kind == "tear_down":
                cluster = self.clusters[action.cluster_id]
                cluster.torn_down = True
                self.events.append({"t": now_s, "event": "tear_down", "cluster_id": action.cluster_id})
            elif action.kind == "retire_others":
                for cid, cluster in self.clusters.items():
                    if cid != self._newest:
                        cluster.retired = True
                self.events.append({"t": now_s, "event": "retire_others", "keep": self._newest})

    def run(self, queries: list[Query]) -> SimulationResult:
        """Simulate until every query has finished."""
        import pandas as pd

        pending = sorted(queries, key=lambda q: (q.arrival_s, q.query_id))
        by_id = {q.query_id: q for q in pending}
        records: dict[int, dict] = {}
        i = 0
        while True:
            t_arrival = pending[i].arrival_s if i < len(pending) else math.inf
            t_done, cid_done, qid_done = math.inf, None, None
            for cid, cluster in self.clusters.items():
                t, qid = self._next_completion(cluster)
                if t < t_done:
                    t_done, cid_done, qid_done = t, cid, qid
            if math.isinf(t_arrival) and math.isinf(t_done):
                break
            if t_done <= t_arrival:
                cluster = self.clusters[cid_done]
                self._advance(cluster, t_done)
                del cluster.remaining[qid_done]
                cluster.state.timer.query_finished(t_done)
                self.router.on_complete(qid_done, t_done)
                if self.autoscaler is not None:
                    self.autoscaler.on_completion(by_id[qid_done], t_done)
                records[qid_done]["end_s"] = t_done
                continue
            query = pending[i]
            now = query.arrival_s
            if i in self.mark_at:
                self.cost_marks[i] = sum(c.state.price_per_unit_s * c.state.size * c.state.timer.active_s(now)
                                         for c in self.clusters.values())
            if self.autoscaler is not None:
                actions = self.autoscaler.on_arrival(query, self._views(now))
                if self.force_scaling_at is not None and i == self.force_scaling_at:
                    actions = actions + self.autoscaler.force(now, self._views(now))
                self._apply(actions, now)
            i += 1
            active = [c.state for c in self.clusters.values()
                      if c.ready_s <= now and not c.retired and not c.torn_down]
            if not active:  # everything retired before the replacement is ready: keep using the old ones
                active = [c.state for c in self.clusters.values() if c.ready_s <= now and not c.torn_down]
            decision = self.router.route(query, active, now)
            cluster = self.clusters[decision.cluster_id]
            self._advance(cluster, now)
            cluster.remaining[query.query_id] = self.world.service_s(query.template, cluster.state.size, self.rng)
            cluster.state.timer.query_arrived(now)
            cluster.last_routed_s = now
            records[query.query_id] = {"query_id": query.query_id, "template": query.template,
                                       "cluster_id": decision.cluster_id, "cluster_size": cluster.state.size,
                                       "arrival_s": now, "slo_s": query.slo_s, "predicted_s": decision.predicted_s}
        frame = pd.DataFrame(list(records.values()))
        if len(frame):
            frame["latency_s"] = frame["end_s"] - frame["arrival_s"]
            frame["violated"] = frame["latency_s"] > frame["slo_s"]
        end = max((r["end_s"] for r in records.values()), default=0.0) + 1e9
        cost_by_cluster = {cid: c.state.price_per_unit_s * c.state.size * c.state.timer.active_s(end)
                           for cid, c in self.clusters.items()}
        return SimulationResult(frame, float(sum(cost_by_cluster.values())), cost_by_cluster, self.events,
                                self.cost_marks)
