"""Event-driven warehouse simulation: routed queries on an emulated world.

Arrivals come from a workload; the router (a ``control`` policy) chooses a
cluster for each, seeing only its own predictor; when each query really ends
is decided by the :class:`~sloctl.simulation.emulator.WarehouseEmulator`
(processor sharing with calibrated interference). Billing timers follow every
start and end. The same seed gives the same run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sloctl.control.billing import BillingTimer
from sloctl.control.router import ClusterState, Query

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.control.router import Router
    from sloctl.simulation.emulator import WarehouseEmulator

__all__ = ["SimulationResult", "WarehouseSimulator"]


@dataclass
class SimulationResult:
    """Per-query outcomes and the bill."""

    queries: pd.DataFrame
    cost: float
    cost_by_cluster: dict[str, float]

    @property
    def violation_rate(self) -> float:
        return float(self.queries["violated"].mean()) if len(self.queries) else 0.0


@dataclass
class _Cluster:
    state: ClusterState
    remaining: dict[int, float]
    last_s: float = 0.0


class WarehouseSimulator:
    """Runs one workload through a router on emulated clusters.

    Args:
        world: the emulated warehouse (decides real completion times).
        clusters: ``(cluster_id, size)`` of the active clusters.
        router: the routing policy under test.
        price_per_unit_s: price of one size unit per second.
        minimum_s: billing minimum window (``m``).
        seed: seed of the service-time noise.
    """

    def __init__(self, world: WarehouseEmulator, clusters: list[tuple[str, int]], router: Router, *,
                 price_per_unit_s: float = 1.0, minimum_s: float = 60.0, seed: int = 0) -> None:
        self.world = world
        self.router = router
        self.rng = np.random.default_rng(seed)
        self.clusters = {cid: _Cluster(ClusterState(cid, size, BillingTimer(minimum_s), price_per_unit_s), {})
                         for cid, size in clusters}

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

    def run(self, queries: list[Query]) -> SimulationResult:
        """Simulate until every query has finished."""
        import pandas as pd

        pending = sorted(queries, key=lambda q: (q.arrival_s, q.query_id))
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
                records[qid_done]["end_s"] = t_done
                continue
            query = pending[i]
            i += 1
            active = [c.state for c in self.clusters.values()]
            decision = self.router.route(query, active, query.arrival_s)
            cluster = self.clusters[decision.cluster_id]
            self._advance(cluster, query.arrival_s)
            cluster.remaining[query.query_id] = self.world.service_s(query.template, cluster.state.size, self.rng)
            cluster.state.timer.query_arrived(query.arrival_s)
            records[query.query_id] = {"query_id": query.query_id, "template": query.template,
                                       "cluster_id": decision.cluster_id, "cluster_size": cluster.state.size,
                                       "arrival_s": query.arrival_s, "slo_s": query.slo_s,
                                       "predicted_s": decision.predicted_s}
        frame = pd.DataFrame(list(records.values()))
        if len(frame):
            frame["latency_s"] = frame["end_s"] - frame["arrival_s"]
            frame["violated"] = frame["latency_s"] > frame["slo_s"]
        end = max((r["end_s"] for r in records.values()), default=0.0) + 1e9
        cost_by_cluster = {cid: c.state.price_per_unit_s * c.state.size * c.state.timer.active_s(end)
                           for cid, c in self.clusters.items()}
        return SimulationResult(frame, float(sum(cost_by_cluster.values())), cost_by_cluster)
