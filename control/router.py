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
* :class:`RouterGuard`: the Iconq+ router's safety net. It falls back to
  load-based placement (fewest running queries per size unit) while the
  model's recent error is high, or where the model's pick would take a
  cluster past the concurrency its training log ever showed (its support).
* :class:`ShadowRoundRobinRouter`: round-robin placements while the Iconq+
  router's inference runs on every arrival and completion, so that a live
  comparison charges both sides the same predictor CPU time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from scipy.special import ndtr

from sloctl.control.billing import BillingTimer

__all__ = [
    "ClusterState",
    "GuardState",
    "IconqRouter",
    "Query",
    "RoundRobinRouter",
    "RouteDecision",
    "RouterGuard",
    "ShadowRoundRobinRouter",
    "Router",
    "StageCostRouter",
    "TIE_BREAKS",
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
    query, violations before / after, and marginal cost. ``fallback`` is
    ``None`` when the model decided, else why the :class:`RouterGuard` placed
    the query by load instead (``"error"`` or ``"support"``).
    """

    cluster_id: str
    predicted_s: float
    explanation: dict[str, dict[str, float]] = field(default_factory=dict)
    fallback: str | None = None


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


#: Where the guard places a query the model is not trusted with: ``"protect"`` by load among the clusters with no
#: query past its SLO (when every cluster has one, on the one with the largest share of late queries, so that the
#: others can recover); ``"load"`` by load alone (the rule before 2026-12-03).
GUARD_PLACEMENTS = ("protect", "load")

#: How the Iconq+ router breaks a tie of marginal violations and cost: ``"load"`` fewest running queries per size
#: unit, then least added latency; ``"latency"`` least added latency alone (the rule before 2026-12-02).
TIE_BREAKS = ("load", "latency")


def _cost_before(cluster: ClusterState, now_s: float, drain_s: float) -> float:
    return cluster.price_per_unit_s * cluster.size * cluster.timer.projected_active_s(now_s, drain_s)


def _cost_after(cluster: ClusterState, now_s: float, drain_s: float) -> float:
    return cluster.price_per_unit_s * cluster.size * cluster.timer.projected_with_arrival(now_s, drain_s)


@dataclass(frozen=True)
class RouterGuard:
    """When the Iconq+ router stops trusting its model (settings; see :class:`GuardState`).

    A router that trusts a wrong model does worse than round-robin: when the
    model under-predicts, the router piles queries onto the cluster it thinks
    is cheap, the cluster's concurrency rises past anything the model was
    trained on, and the under-prediction grows with it. Two checks catch it:

    * **error**: the median of actual / predicted latency (predicted at
      routing time) over the last ``window`` finished queries exceeds
      ``max_ratio`` (once ``min_samples`` have finished);
    * **support**: the model's pick is a cluster of size ``s`` already
      running more queries than the training log ever showed running on a
      size-``s`` cluster when a query arrived (``support[s]``; sizes the log
      lacks scale from the nearest smaller size it has, else are not
      checked).

    Either one places the query without the model's predictions, by
    ``placement``:

    * ``"protect"`` (default): on the cluster with the fewest running
      queries per size unit among the clusters where no running query is
      past its SLO yet (observed, not predicted); when every cluster has a
      late query, on the one with the largest share of late queries (ties:
      the more loaded per size unit). An overloaded pool then keeps its
      other clusters recoverable instead of spreading the overload evenly,
      which makes every query late. See docs/control.md.
    * ``"load"``: on the cluster with the fewest running queries per size
      unit (ties: the larger cluster, then the order given), the rule
      before 2026-12-03.

    The model still tracks the query, so its error keeps being measured and
    the guard lets go once the error falls back.

    Attributes:
        max_ratio: median actual / predicted above which the model is not trusted.
        window: finished queries in the moving window.
        min_samples: finished queries needed before the error check can fire.
        support: training log's largest running count per size; ``None`` or
            empty turns the support check off.
        placement: ``"protect"`` or ``"load"`` (above).
    """

    max_ratio: float = 2.0
    window: int = 32
    min_samples: int = 8
    support: Mapping[int, int] | None = None
    placement: str = "protect"

    def __post_init__(self) -> None:
        if not self.max_ratio > 1.0:
            raise ValueError(f"The 'max_ratio' parameter must be > 1, got {self.max_ratio!r}.")
        if self.window < 1 or not 1 <= self.min_samples <= self.window:
            raise ValueError(f"Expected window >= 1 and 1 <= min_samples <= window, got window={self.window!r}, "
                             f"min_samples={self.min_samples!r}.")
        for size, count in (self.support or {}).items():
            if int(size) < 1 or int(count) < 0:
                raise ValueError(f"The 'support' parameter maps sizes >= 1 to running counts >= 0, got "
                                 f"{size!r}: {count!r}.")
        if self.placement not in GUARD_PLACEMENTS:
            raise ValueError(f"The 'placement' parameter must be one of {', '.join(GUARD_PLACEMENTS)}, "
                             f"got {self.placement!r}.")
        if self.support is not None:  # int keys once, not on every routing decision
            object.__setattr__(self, "support", {int(k): int(v) for k, v in self.support.items()})

    def limit(self, size: int) -> float:
        """Most running queries the training log showed on a cluster of ``size`` (inf: unchecked)."""
        support = self.support
        if not support:
            return float("inf")
        if size in support:
            return float(support[size])
        smaller = [s for s in support if s < size]
        if not smaller:
            return float("inf")
        nearest = max(smaller)
        return float(int(support[nearest] * size / nearest))


class GuardState:
    """A :class:`RouterGuard` at work: the moving error window and how often it fired."""

    def __init__(self, settings: RouterGuard) -> None:
        self.settings = settings
        self._ratios: deque[float] = deque(maxlen=settings.window)
        self._pending: dict[int, tuple[float, float]] = {}
        self.routes = 0
        self.fallbacks = {"error": 0, "support": 0}
        self._median: float | None = None  # of _ratios, until the next completion changes them

    def error_high(self) -> bool:
        """Whether the recent median actual / predicted exceeds ``max_ratio``."""
        if len(self._ratios) < self.settings.min_samples:
            return False
        return self.recent_ratio() > self.settings.max_ratio  # type: ignore[operator]

    def recent_ratio(self) -> float | None:
        if self._median is None and self._ratios:
            self._median = float(np.median(self._ratios))
        return self._median

    def placed(self, query_id: int, arrival_s: float, predicted_s: float, fallback: str | None) -> None:
        self.routes += 1
        if fallback is not None:
            self.fallbacks[fallback] += 1
        if predicted_s > 0 and np.isfinite(predicted_s):
            self._pending[query_id] = (arrival_s, predicted_s)

    def finished(self, query_id: int, now_s: float) -> None:
        pending = self._pending.pop(query_id, None)
        if pending is not None:
            arrival, predicted = pending
            self._ratios.append(max(now_s - arrival, 0.0) / predicted)
            self._median = None

    def summary(self) -> dict[str, Any]:
        """Routes, fallbacks by reason, the fallback rate and the window's median actual / predicted."""
        fired = sum(self.fallbacks.values())
        return {"routes": self.routes, "fallbacks": dict(self.fallbacks),
                "fallback_rate": fired / self.routes if self.routes else 0.0,
                "recent_ratio": self.recent_ratio()}


def _observe(model: Any, query_id: int, now_s: float) -> None:
    """Tell a drift-calibrated model (:mod:`sloctl.models.drift`) that a query ended, before it is forgotten."""
    observe = getattr(model, "observe_completion", None)
    if observe is not None:
        observe(query_id, now_s)


def load_based(clusters: list[ClusterState], running: Mapping[str, int]) -> ClusterState:
    """The cluster with the fewest running queries per size unit (ties: larger, then first)."""
    return min(clusters, key=lambda c: ((running[c.cluster_id] + 1) / c.size, -c.size))


def protect_based(clusters: list[ClusterState], running: Mapping[str, int], late: Mapping[str, int]
                  ) -> ClusterState:
    """The guard's ``"protect"`` placement (see :class:`RouterGuard`).

    Args:
        clusters: the active clusters.
        running: running queries per cluster id.
        late: how many of them are already past their SLO.
    """
    on_time = [c for c in clusters if late[c.cluster_id] == 0]
    if on_time:
        return load_based(on_time, running)
    return max(clusters, key=lambda c: (late[c.cluster_id] / max(running[c.cluster_id], 1),
                                        running[c.cluster_id] / c.size))


@dataclass(frozen=True)
class _Scored:
    """One placement the Iconq+ router weighs: what it adds (violations, cost, latency) and the cluster's state."""

    cluster: ClusterState
    added: float  # marginal predicted violations
    wakes: int  # 1: the cluster's billing timer has paused, so this placement opens a new minimum window
    cost: float  # marginal billed cost
    band: float  # costs within this of the cheapest count as equal (cost_tolerance minimum windows)
    load: float  # running queries per size unit with this query
    latency: float  # added predicted latency, the query's and its neighbours'


class IconqRouter:
    """Concurrency-aware, cost-aware routing (AutoSLO Algorithm 1).

    Args:
        model: an :class:`~sloctl.models.online.OnlinePredictor` (Iconq+).
        slo_margin: count a query as violating once its predicted latency
            exceeds ``(1 - slo_margin) × SLO``; 0 is the paper's rule. A
            margin hedges against neighbours that have not arrived yet, which
            a prediction made at routing time cannot see.
        cost_tolerance: marginal costs within this many minimum billing
            windows above the cheapest count as equal (between placements
            that both wake a paused cluster, or both extend a running one:
            waking a cluster is never a tie with packing onto a running one).
        violation_spread: ``σ``, the spread (log space) of actual /
            predicted latency. Above 0, violations are counted softly: a
            query counts ``Φ((log predicted − log((1 − slo_margin) × SLO)) / σ)``,
            0.5 exactly at the hard rule's threshold, so that a query far past
            it counts almost 1 and one just below it almost 0.5. 0 is the hard
            count (the paper's rule).
        count_quantum: soft marginal violations closer than this count as
            equal (ties go on to cost, then added latency).
        guard: when to distrust the model and place by load
            (:class:`RouterGuard`); ``None``: always trust it (the paper's
            router). ``guard_state.summary()`` says how often it fired.
        tie_break: among placements whose marginal violations and costs tie,
            ``"load"`` takes the cluster with the fewest running queries per
            size unit (then the least added latency); ``"latency"`` the
            least added latency the model predicts. On equal clusters, where
            cost never separates them, the load rule is join-the-shortest-
            queue wherever the model sees no difference in violations, so a
            model that misjudges interference cannot stack queries there.
    """

    name = "iconq+cost"

    def __init__(self, model: OnlineModel, slo_margin: float = 0.0, cost_tolerance: float = 0.0,
                 guard: RouterGuard | None = None, violation_spread: float = 0.0, count_quantum: float = 0.25,
                 tie_break: str = "load") -> None:
        if not (violation_spread >= 0 and np.isfinite(violation_spread)):
            raise ValueError(f"The 'violation_spread' parameter must be a finite number >= 0, "
                             f"got {violation_spread!r}.")
        if not count_quantum > 0:
            raise ValueError(f"The 'count_quantum' parameter must be > 0, got {count_quantum!r}.")
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"The 'tie_break' parameter must be one of {', '.join(TIE_BREAKS)}, got {tie_break!r}.")
        self.model = model
        self.slo_margin = slo_margin
        self.cost_tolerance = cost_tolerance
        self.violation_spread = violation_spread
        self.count_quantum = count_quantum
        self.tie_break = tie_break
        self.guard = guard
        self.guard_state = GuardState(guard) if guard is not None else None

    def route(self, query: Query, clusters: list[ClusterState], now_s: float) -> RouteDecision:
        if not clusters:
            raise ValueError("No active cluster to route to.")
        state = self.guard_state
        if state is not None and state.error_high():
            return self._place_by_load(query, clusters, now_s, "error", {})
        best, explanation = self._model_choice(query, clusters, now_s)
        if state is not None and len(self.model.running_on(best.cluster_id)) > state.settings.limit(best.size):
            return self._place_by_load(query, clusters, now_s, "support", explanation)
        predicted = self.model.commit(query.query_id, query.template, query.arrival_s, query.slo_s,
                                      best.cluster_id, best.size, now_s)
        if state is not None:
            state.placed(query.query_id, query.arrival_s, predicted, None)
        return RouteDecision(best.cluster_id, predicted, explanation)

    def _place_by_load(self, query: Query, clusters: list[ClusterState], now_s: float, reason: str,
                       explanation: dict[str, dict[str, float]]) -> RouteDecision:
        queries = {c.cluster_id: self.model.running_on(c.cluster_id) for c in clusters}
        running = {cid: len(rs) for cid, rs in queries.items()}
        if self.guard_state.settings.placement == "protect":
            late = {cid: sum(1 for r in rs if now_s - r.arrival_s > r.slo_s) for cid, rs in queries.items()}
            chosen = protect_based(clusters, running, late)
        else:
            chosen = load_based(clusters, running)
        predicted = self.model.commit(query.query_id, query.template, query.arrival_s, query.slo_s,
                                      chosen.cluster_id, chosen.size, now_s)
        self.guard_state.placed(query.query_id, query.arrival_s, predicted, reason)
        return RouteDecision(chosen.cluster_id, predicted, explanation, fallback=reason)

    def _model_choice(self, query: Query, clusters: list[ClusterState], now_s: float
                      ) -> tuple[ClusterState, dict[str, dict[str, float]]]:
        """Algorithm 1: fewest marginal violations, then lowest marginal cost (within the tolerance)."""
        sizes = {c.cluster_id: c.size for c in clusters}
        options = self.model.counterfactuals(query.template, query.arrival_s, sizes, now_s)
        explanation: dict[str, dict[str, float]] = {}
        scored = []
        for c in clusters:
            cf = options[c.cluster_id]
            running = self.model.running_on(c.cluster_id)
            slo = np.array([r.slo_s for r in running]) * (1.0 - self.slo_margin)
            arrival = np.array([r.arrival_s for r in running])
            elapsed = now_s - arrival
            before_s = np.maximum(cf.running_before_s, elapsed) if len(running) else cf.running_before_s
            v_before = self._violations(before_s, slo)
            v_after = (self._violations(cf.running_after_s, slo)
                       + self._violations(np.array([cf.query_s]), np.array([query.slo_s * (1.0 - self.slo_margin)])))
            drain_before = float(np.max(arrival + before_s)) if len(running) else now_s
            drain_after = max(float(np.max(arrival + cf.running_after_s)) if len(running) else now_s,
                              now_s + cf.query_s)
            marginal_cost = _cost_after(c, now_s, drain_after) - _cost_before(c, now_s, drain_before)
            marginal_latency = cf.query_s + float(np.sum(cf.running_after_s - before_s)) if len(running) else cf.query_s
            band = self.cost_tolerance * c.price_per_unit_s * c.timer.minimum_s
            added = v_after - v_before
            load = (len(running) + 1) / c.size
            wakes = 0 if c.timer.is_running else 1  # its timer paused: a placement opens a new minimum window
            explanation[c.cluster_id] = {"predicted_s": cf.query_s, "violations_before": v_before,
                                         "violations_after": v_after, "marginal_cost": marginal_cost,
                                         "wakes": wakes}
            scored.append(_Scored(c, added, wakes, marginal_cost, band, load, marginal_latency))
        return self._pick(scored), explanation

    def _pick(self, scored: list[_Scored]) -> ClusterState:
        """Algorithm 1's choice: fewest marginal violations, then least marginal cost, then the tie break.

        Among the placements with the fewest added violations, one that
        wakes a cluster whose billing timer has paused (a full minimum window)
        never ties with one that only extends a running cluster's drain: the
        cost band (``cost_tolerance`` windows above the cheapest) applies
        between placements of the same kind, so the tolerance and the tie
        break can never turn a window's real cost into a spread, and a
        cluster nobody needs goes idle and can be torn down.
        """
        soft = self.violation_spread > 0

        def violations(row: _Scored) -> float:
            return round(row.added / self.count_quantum) if soft else row.added

        fewest = min(violations(r) for r in scored)
        rows = [r for r in scored if violations(r) == fewest]
        wakes = min(r.wakes for r in rows)
        rows = [r for r in rows if r.wakes == wakes]
        cheapest = min(r.cost for r in rows)
        rows = [r for r in rows if r.cost <= cheapest + r.band + 1e-12]
        if self.tie_break == "load":
            return min(rows, key=lambda r: (r.load, r.latency, r.cost)).cluster
        return min(rows, key=lambda r: (r.latency, r.cost)).cluster

    def _violations(self, predicted_s: np.ndarray, threshold_s: np.ndarray) -> float:
        """Queries predicted past their threshold: a count, or with ``violation_spread`` a soft count."""
        if len(predicted_s) == 0:
            return 0
        if self.violation_spread <= 0:
            return int(np.sum(predicted_s > threshold_s))
        z = (np.log(np.maximum(predicted_s, 1e-12)) - np.log(threshold_s)) / self.violation_spread
        return float(np.sum(ndtr(z)))

    def on_complete(self, query_id: int, now_s: float) -> None:
        if self.guard_state is not None:
            self.guard_state.finished(query_id, now_s)
        _observe(self.model, query_id, now_s)
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
        _observe(self.model, query_id, now_s)
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
