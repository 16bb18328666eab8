"""Event-driven warehouse simulation: routed (and autoscaled) queries on an emulated world.

Arrivals come from a workload; the router (a ``control`` policy) chooses a
cluster for each, seeing only its own predictor; an optional autoscaler may
spin clusters up (ready after the spin-up delay) or tear them down. When each
query really ends is decided by the
:class:`~sloctl.simulation.emulator.WarehouseEmulator` (processor sharing with
calibrated interference). Billing timers follow every start and end. The same
seed gives the same run.

Routing, billing, completions and scaling are the control step of
:class:`~sloctl.control.managed.ManagedPool`, the same one the live runner and
the runtime call; the simulator supplies the clock (the next arrival or
emulated completion) and the emulated world (service times, processor sharing,
spin-up ids and delays).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sloctl.control.managed import ManagedPool
from sloctl.control.router import Query

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.control.autoscaler import Autoscaler
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
    usage: dict[str, dict[str, float]] = field(default_factory=dict)  # per cluster: billed, busy, windows

    def cost_since(self, index: int) -> float:
        """Cost billed after the arrival with this index (needs ``mark_at``)."""
        return self.cost - self.cost_marks[index]

    @property
    def violation_rate(self) -> float:
        return float(self.queries["violated"].mean()) if len(self.queries) else 0.0


@dataclass
class _Sharing:
    """One emulated cluster: the work left of each running query, as of ``last_s``."""

    size: int
    remaining: dict[int, float]
    last_s: float = 0.0


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

    The simulator is its pool's :class:`~sloctl.control.managed.ClusterBackend`
    (:meth:`spin_up`, :meth:`tear_down`): spun-up clusters are named
    ``auto{n}-s{size}`` and are ready after the autoscaler's spin-up delay.
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
        self.pool = ManagedPool(router, autoscaler=autoscaler, price_per_unit_s=price_per_unit_s,
                                minimum_s=minimum_s, backend=self)
        self._shares: dict[str, _Sharing] = {}
        for cid, size in clusters:
            self.pool.add_cluster(cid, size, spun_up_s=0.0, ready_s=0.0)
            self._shares[cid] = _Sharing(size, {}, last_s=0.0)
        self._ids = itertools.count(1)
        self.events = self.pool.events

    # -- the emulated world: the pool's backend and processor sharing ---------------------------
    def spin_up(self, size: int, now_s: float) -> tuple[str, float]:
        """A new emulated cluster, ready after the autoscaler's spin-up delay ``δ``."""
        cid = f"auto{next(self._ids)}-s{size}"
        self._shares[cid] = _Sharing(size, {}, last_s=now_s)
        return cid, now_s + self.autoscaler.config.spinup_delay_s

    def tear_down(self, cluster_id: str, now_s: float) -> None:
        return None

    def _advance(self, cluster: _Sharing, t: float) -> None:
        k = len(cluster.remaining)
        if k:
            rate = self.world.rate(k, cluster.size)
            for qid in cluster.remaining:
                cluster.remaining[qid] -= (t - cluster.last_s) * rate
        cluster.last_s = t

    def _next_completion(self, cluster: _Sharing) -> tuple[float, int | None]:
        if not cluster.remaining:
            return math.inf, None
        qid = min(cluster.remaining, key=cluster.remaining.__getitem__)
        rate = self.world.rate(len(cluster.remaining), cluster.size)
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
            for cid, cluster in self._shares.items():
                t, qid = self._next_completion(cluster)
                if t < t_done:
                    t_done, cid_done, qid_done = t, cid, qid
            if math.isinf(t_arrival) and math.isinf(t_done):
                break
            if t_done <= t_arrival:
                cluster = self._shares[cid_done]
                self._advance(cluster, t_done)
                del cluster.remaining[qid_done]
                self.pool.complete(qid_done, t_done)
                records[qid_done]["end_s"] = t_done
                continue
            query = pending[i]
            now = query.arrival_s
            if i in self.mark_at:
                self.cost_marks[i] = self.pool.total_cost(now)
            if self.autoscaler is not None:
                self.pool.scale(query, now, force=self.force_scaling_at is not None and i == self.force_scaling_at)
            i += 1
            decision = self.pool.route(query, now)
            cluster = self._shares[decision.cluster_id]
            self._advance(cluster, now)
            cluster.remaining[query.query_id] = self.world.service_s(query.template, cluster.size, self.rng)
            records[query.query_id] = {"query_id": query.query_id, "template": query.template,
                                       "cluster_id": decision.cluster_id, "cluster_size": cluster.size,
                                       "arrival_s": now, "slo_s": query.slo_s, "predicted_s": decision.predicted_s}
        frame = pd.DataFrame(list(records.values()))
        if len(frame):
            frame["latency_s"] = frame["end_s"] - frame["arrival_s"]
            frame["violated"] = frame["latency_s"] > frame["slo_s"]
        end = max((r["end_s"] for r in records.values()), default=0.0) + 1e9
        cost_by_cluster = self.pool.cost_by_cluster(end)
        return SimulationResult(frame, float(sum(cost_by_cluster.values())), cost_by_cluster, self.events,
                                self.cost_marks, self.pool.usage_by_cluster(end))
