"""Query routers: where an arriving query runs (AutoSLO §5, Algorithm 1).

All routers share one small interface — :meth:`route` returns a
:class:`RouteDecision` with its explanation, :meth:`on_complete` forgets a
finished query — and run unchanged in simulation and live.

* :class:`IconqRouter` (Algorithm 1): for every active cluster, predict with
  Iconq+ what every latency would be if the query joined it (one batched,
  incremental inference over all clusters), apply the monotonicity guard,
  count SLO violations before and after, project the billing cost before and
  after, and pick the cluster with the fewest marginal violations, then the
  lowest marginal cost.
* :class:`StageCostRouter`: concurrency-unaware baseline — a cluster where
  the query's isolated (Stage) latency meets its SLO, cheapest marginal cost
  first.
* :class:`RoundRobinRouter`: cycles through the clusters.
* :class:`ShadowRoundRobinRouter`: round-robin placements while the Iconq+
  router's inference runs on every arrival and completion, so that a live
  comparison charges both sides the same predictor CPU time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sloctl.control.billing import BillingTimer

__all__ = [
    "ClusterState",
    "IconqRouter",
    "Query",
    "RoundRobinRouter",
    "RouteDecision",
    "ShadowRoundRobinRouter",
    "Router",
    "StageCostRouter",
]


@dataclass(frozen=True)
class Query:
    """An arriving query: its id, template, arrival time and latency SLO (seconds)."""

    query_id: int
    template: str
    arrival_s: float
    slo_s: float


@dataclass
class ClusterState:
    """An active cluster as policies see it."""

    cluster_id: str
    size: int
    timer: BillingTimer
    price_per_unit_s: float = 1.0


@dataclass
class RouteDecision:
    """The chosen cluster and why.

    ``explanation`` maps each cluster id to its predicted latency for the
    query, violations before / after, and marginal cost.
    """

    cluster_id: str
    predicted_s: float
    explanation: dict[str, dict[str, float]] = field(default_factory=dict)


class Router(Protocol):
    """What a router offers to a simulator or a live driver."""

    name: str

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        """Choose a cluster for ``query`` among ``clusters`` (all ready)."""

    def on_complete(self, query_id: int, now_s: float) -> None:
        """``query_id`` has finished."""


class OnlineModel(Protocol):
    """The predictor interface routers use (see :class:`sloctl.models.online.OnlinePredictor`)."""

    def counterfactuals(self, template: str, arrival_s: float, clusters: dict[str, int], now_s: float) -> Any: ...
    def commit(self, query_id: int, template: str, arrival_s: float, slo_s: float, cluster_id: str, size: int,
               now_s: float) -> float: ...
    def complete(self, query_id: int) -> None: ...
    def isolated_s(self, template: str, size: int) -> float: ...
    def running_on(self, cluster_id: str) -> list[Any]: ...


def _cost_before(cluster: ClusterState, now_s: float, drain_s: float) -> float:
    return cluster.price_per_unit_s * cluster.size * cluster.timer.projected_active_s(now_s, drain_s)


def _cost_after(cluster: ClusterState, now_s: float, drain_s: float) -> float:
    return cluster.price_per_unit_s * cluster.size * cluster.timer.projected_with_arrival(now_s, drain_s)


class IconqRouter:
    """Concurrency-aware, cost-aware routing (AutoSLO Algorithm 1).

    Args:
        model: an :class:`~sloctl.models.online.OnlinePredictor` (Iconq+).
        slo_margin: count a query as violating once its predicted latency
            exceeds ``(1 - slo_margin) × SLO``; 0 is the paper's rule. A
            margin hedges against neighbours that have not arrived yet, which
            a prediction made at routing time cannot see.
    """

    name = "iconq+cost"

    def __init__(self, model: OnlineModel, slo_margin: float = 0.0, cost_tolerance: float = 0.0) -> None:
        self.model = model
        self.slo_margin = slo_margin
        self.cost_tolerance = cost_tolerance

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        if not clusters:
            raise ValueError("No active cluster to route to.")
        sizes = {c.cluster_id: c.size for c in clusters}
        options = self.model.counterfactuals(query.template, query.arrival_s, sizes, now_s)
        best, best_key, explanation = None, None, {}
        for c in clusters:
            cf = options[c.cluster_id]
            running = self.model.running_on(c.cluster_id)
            slo = np.array([r.slo_s for r in running]) * (1.0 - self.slo_margin)
            arrival = np.array([r.arrival_s for r in running])
            elapsed = now_s - arrival
            before_s = np.maximum(cf.running_before_s, elapsed) if len(running) else cf.running_before_s
            v_before = int(np.sum(before_s > slo))
            v_after = int(np.sum(cf.running_after_s > slo)) + int(cf.query_s > query.slo_s * (1.0 - self.slo_margin))
            drain_before = float(np.max(arrival + before_s)) if len(running) else now_s
            drain_after = max(float(np.max(arrival + cf.running_after_s)) if len(running) else now_s,
                              now_s + cf.query_s)
            marginal_cost = _cost_after(c, now_s, drain_after) - _cost_before(c, now_s, drain_before)
            marginal_latency = cf.query_s + float(np.sum(cf.running_after_s - before_s)) if len(running) else cf.query_s
            quantum = self.cost_tolerance * c.price_per_unit_s * c.timer.minimum_s
            cost_key = round(marginal_cost / quantum) if quantum > 0 else marginal_cost
            key = (v_after - v_before, cost_key, marginal_latency)
            explanation[c.cluster_id] = {"predicted_s": cf.query_s, "violations_before": v_before,
                                         "violations_after": v_after, "marginal_cost": marginal_cost}
            if best_key is None or key < best_key:
                best, best_key = c, key
        predicted = self.model.commit(query.query_id, query.template, query.arrival_s, query.slo_s,
                                      best.cluster_id, best.size, now_s)
        return RouteDecision(best.cluster_id, predicted, explanation)

    def on_complete(self, query_id: int, now_s: float) -> None:
        self.model.complete(query_id)


class StageCostRouter:
    """Concurrency-unaware baseline: meet the SLO by isolated latency, then cheapest.

    Args:
        model: anything with ``isolated_s(template, size)`` plus the
            :class:`OnlineModel` bookkeeping (a Stage-only
            :class:`~sloctl.models.online.OnlinePredictor`).
    """

    name = "stage+cost"

    def __init__(self, model: OnlineModel) -> None:
        self.model = model

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        if not clusters:
            raise ValueError("No active cluster to route to.")
        explanation, scored = {}, []
        for c in clusters:
            predicted = self.model.isolated_s(query.template, c.size)
            running = self.model.running_on(c.cluster_id)
            drain_before = max((r.arrival_s + r.predicted_s for r in running), default=now_s)
            marginal_cost = (_cost_after(c, now_s, max(drain_before, now_s + predicted))
                             - _cost_before(c, now_s, drain_before))
            meets = predicted <= query.slo_s
            explanation[c.cluster_id] = {"predicted_s": predicted, "meets_slo": float(meets),
                                         "marginal_cost": marginal_cost}
            scored.append(((not meets, marginal_cost if meets else predicted), c))
        best = min(scored, key=lambda item: item[0])[1]
        predicted = self.model.commit(query.query_id, query.template, query.arrival_s, query.slo_s,
                                      best.cluster_id, best.size, now_s)
        return RouteDecision(best.cluster_id, predicted, explanation)

    def on_complete(self, query_id: int, now_s: float) -> None:
        self.model.complete(query_id)


class RoundRobinRouter:
    """Cycles through the active clusters in order."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        if not clusters:
            raise ValueError("No active cluster to route to.")
        chosen = clusters[self._next % len(clusters)]
        self._next += 1
        return RouteDecision(chosen.cluster_id, float("nan"), {})

    def on_complete(self, query_id: int, now_s: float) -> None:
        return None


class ShadowRoundRobinRouter:
    """Round-robin placements, with ``router``'s inference done (and ignored) on every arrival.

    On a machine where the router shares cores with the clusters (two cores
    here), the Iconq+ router's own CPU time slows the queries it routes;
    this baseline pays the same cost, so a comparison with it isolates the
    quality of the router's decisions. Its decisions are round-robin's, its
    explanation the router's would-be one.
    """

    name = "round-robin+inference"

    def __init__(self, router: IconqRouter) -> None:
        self.router = router
        self._rr = RoundRobinRouter()

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        chosen = self._rr.route(query, clusters, now_s).cluster_id
        model = self.router.model
        options = model.counterfactuals(query.template, query.arrival_s, {c.cluster_id: c.size for c in clusters},
                                        now_s)
        size = next(c.size for c in clusters if c.cluster_id == chosen)
        predicted = model.commit(query.query_id, query.template, query.arrival_s, query.slo_s, chosen, size, now_s)
        return RouteDecision(chosen, predicted, {cid: {"predicted_s": cf.query_s} for cid, cf in options.items()})

    def on_complete(self, query_id: int, now_s: float) -> None:
        self.router.on_complete(query_id, now_s)
