"""Placement without a latency model, and the wrapper the gateway's managed pool routes through.

The model-based routers (Iconq+, Stage + cost) and round-robin are in
:mod:`sloctl.control.router`.

* :class:`RandomRouter`: a seeded uniform pick among the ready clusters
  (Trino Gateway's default within a routing group).
* :class:`LeastQueuedRouter`: the cluster with the fewest running plus
  queued queries (Trino Gateway's load-based router; the gateway has no
  per-cluster queue, so it counts the attempts running there).
* :class:`PackingRouter`: first fit by running queries per size unit (the
  end-to-end experiment's Queue@N and RAIS baselines).
* :class:`GatewayRouter`: what :class:`~sloctl.control.managed.ManagedPool`
  routes with. It hands a query to the inner router (Iconq+, Stage or a
  baseline), except that a template the inner router's table does not know
  is placed by :class:`LeastQueuedRouter`, and a retry never goes to the
  cluster that just failed it while another cluster is ready
  (``exclude``, set for one call).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from sloctl.control.router import ClusterState, Query, RouteDecision

__all__ = ["GatewayRouter", "LeastQueuedRouter", "PackingRouter", "RandomRouter"]


class RandomRouter:
    """Uniform random placement, seeded."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        if not clusters:
            raise ValueError("No active cluster to route to.")
        return RouteDecision(self._rng.choice(clusters).cluster_id, float("nan"), {})

    def on_complete(self, query_id: int, now_s: float) -> None:
        return None


class LeastQueuedRouter:
    """Fewest running + queued queries (ties: the larger cluster, then the first).

    Args:
        running_of: the number of queries running on a cluster now.
    """

    name = "least-queued"

    def __init__(self, running_of: Callable[[str], int]) -> None:
        self.running_of = running_of

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        if not clusters:
            raise ValueError("No active cluster to route to.")
        best = min(clusters, key=lambda c: (self.running_of(c.cluster_id), -c.size))
        return RouteDecision(best.cluster_id, float("nan"), {})

    def on_complete(self, query_id: int, now_s: float) -> None:
        return None


class PackingRouter:
    """First fit: the oldest cluster below ``pack_n`` running queries per size unit, else the least loaded.

    Packing leaves extra clusters idle once a peak passes, so the teardown
    trigger can retire them (round-robin would keep every cluster busy).
    """

    name = "packing"

    def __init__(self, pack_n: int = 1) -> None:
        self.pack_n = pack_n
        self._on: dict[int, str] = {}
        self._running: dict[str, int] = {}

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        if not clusters:
            raise ValueError("No active cluster to route to.")
        load = {c.cluster_id: self._running.get(c.cluster_id, 0) / c.size for c in clusters}
        free = [c for c in clusters if load[c.cluster_id] < self.pack_n]
        chosen = free[0] if free else min(clusters, key=lambda c: load[c.cluster_id])
        self._on[query.query_id] = chosen.cluster_id
        self._running[chosen.cluster_id] = self._running.get(chosen.cluster_id, 0) + 1
        return RouteDecision(chosen.cluster_id, float("nan"), {})

    def on_complete(self, query_id: int, now_s: float) -> None:
        cid = self._on.pop(query_id, None)
        if cid is not None:
            self._running[cid] -= 1


class GatewayRouter:
    """The inner router, with a load-based pick for unknown templates and an exclusion for retries.

    Args:
        inner: the router in force (replaced on a hot swap, :meth:`swap`).
        known: whether the inner router can place a template (``None``: every one).
        fallback: the router for the others.
    """

    def __init__(self, inner: object, known: Callable[[str], bool] | None, fallback: object) -> None:
        self.inner = inner
        self.known = known
        self.fallback = fallback
        self.exclude: frozenset[str] = frozenset()
        self._by_inner: set[int] = set()

    @property
    def name(self) -> str:
        return getattr(self.inner, "name", "router")

    def swap(self, inner: object, known: Callable[[str], bool] | None, committed: set[int]) -> None:
        """A new inner router; ``committed``: the running queries it already holds (re-committed)."""
        self.inner, self.known, self._by_inner = inner, known, set(committed)

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        allowed = [c for c in clusters if c.cluster_id not in self.exclude] or clusters
        if self.known is None or self.known(query.template):
            self._by_inner.add(query.query_id)
            return self.inner.route(query, allowed, now_s)
        return self.fallback.route(query, allowed, now_s)

    def on_complete(self, query_id: int, now_s: float) -> None:
        if query_id in self._by_inner:
            self._by_inner.discard(query_id)
            self.inner.on_complete(query_id, now_s)
        else:
            self.fallback.on_complete(query_id, now_s)
