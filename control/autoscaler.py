"""The Autoscaler (AutoSLO §6): observation windows, scaling triggers, and
the simulation-based Spinup Size Selector.

* :class:`ObservationWindows` keep the arrivals and completions of the last
  ``w`` seconds (§6.1).
* :func:`should_tear_down` is the teardown trigger (§6.2.1): no running
  query, nothing routed for ``T_idle``, and alive for ``T_min_lifetime``.
* :class:`SpinupTrigger` is Algorithm 2 (§6.2.2): the violation rate among
  queries that arrived since the cluster set last changed — completed ones
  with their real latency and, unless ``observed_only``, running ones with
  their predicted latency — must reach ``θ`` queries and exceed
  ``τ_trigger``; an in-flight flag stops it re-firing until the set changes.
  :class:`QueueTrigger` is the Queue@N baseline.
* :func:`find_best_spinup_size` is Algorithm 3 (§6.3): replay copies of the
  arrival window through the spin-up delay ``δ`` once, then for each
  candidate size and for doing nothing continue until ``μ`` queries that
  arrived after the new cluster is available have completed, with
  completions decided by the latency predictor; pick by BestWithTarget and
  return the largest size tied for best — or nothing unless some candidate
  strictly improves on doing nothing. Each what-if run routes, bills and
  completes through a :class:`~sloctl.control.managed.ManagedPool`, the
  same step the drivers run.
* :class:`Autoscaler` runs both triggers at every arrival. Its size
  selection runs inside the arrival step (the simulators: seeded, no thread
  timing) or, given a :class:`~sloctl.control.background.BackgroundSizer`,
  on a worker thread over a snapshot, as AutoSLO's background autoscaler
  does (the live drivers): routing never waits for it.

:class:`~sloctl.control.managed.ClusterView` and
:class:`~sloctl.control.managed.ScalingAction` (what the autoscaler reads and
returns) live with the pool in :mod:`sloctl.control.managed`.

The policies see only the router's predictor; they run unchanged in
simulation and live.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sloctl.control.background import BackgroundSizer
from sloctl.control.billing import BillingTimer, best_with_target
from sloctl.control.managed import ClusterView, ManagedPool, ScalingAction
from sloctl.control.router import ClusterState, Query

__all__ = [
    "ArrivalScaler",
    "Autoscaler",
    "AutoscalerConfig",
    "ObservationWindows",
    "QueueScaler",
    "QueueTrigger",
    "RelativeAutoscalerSettings",
    "SizingOutcome",
    "SpinupTrigger",
    "autoscaler_for",
    "decision_time",
    "find_best_spinup_size",
    "should_tear_down",
]


@dataclass(frozen=True)
class AutoscalerConfig:
    """Autoscaler parameters (names as in AutoSLO §6; the Policy Tuner tunes them).

    Attributes:
        window_s: ``w``, length of the observation windows.
        t_idle_s: ``T_idle``, idle time before a teardown.
        t_min_lifetime_s: ``T_min_lifetime``, minimum cluster lifetime.
        theta: ``θ``, queries needed before the spin-up trigger judges.
        tau_trigger: ``τ_trigger``, violation rate that fires the trigger.
        mu: ``μ``, completions simulated per candidate in the size selector.
        tau_target: ``τ``, the BestWithTarget violation-rate target.
        candidate_sizes: sizes the selector may add.
        spinup_delay_s: ``δ``, time from request to a ready cluster.
        max_clusters: never hold more clusters than this.
        max_units: never hold clusters whose sizes add up past this (the
            size units the cluster core can give without oversubscribing
            it, e.g. 4 for one core in budgets of 0.25); ``None``: no limit.
            Starting clusters count from the moment they are requested.
    """

    window_s: float = 600.0
    t_idle_s: float = 300.0
    t_min_lifetime_s: float = 1200.0
    theta: int = 10
    tau_trigger: float = 0.1
    mu: int = 20
    tau_target: float = 0.05
    candidate_sizes: tuple[int, ...] = (1, 2)
    spinup_delay_s: float = 300.0
    max_clusters: int = 4
    max_units: int | None = None

    def limit_met(self, n_clusters: int, units: int, size: int) -> str | None:
        """``"max_clusters"`` or ``"max_units"`` if one more cluster of ``size`` beside ``n_clusters`` holding
        ``units`` size units would pass that limit; ``None`` if it fits."""
        if n_clusters >= self.max_clusters:
            return "max_clusters"
        if self.max_units is not None and units + int(size) > self.max_units:
            return "max_units"
        return None

    def fits(self, clusters: Sequence[Any], size: int) -> bool:
        """Whether one more cluster of ``size`` fits beside ``clusters`` (views with a ``size``)."""
        units = sum(int(c.size) for c in clusters) if self.max_units is not None else 0
        return self.limit_met(len(clusters), units, size) is None

    def sizes_that_fit(self, clusters: Sequence[Any], sizes: Sequence[int] | None = None) -> tuple[int, ...]:
        """The sizes of ``sizes`` (default: the candidates) one more cluster beside ``clusters`` may have."""
        return tuple(s for s in (self.candidate_sizes if sizes is None else sizes) if self.fits(clusters, s))

    def validate(self) -> None:
        for name in ("window_s", "spinup_delay_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"The '{name}' parameter of AutoscalerConfig must be > 0, "
                                 f"got {getattr(self, name)!r}.")
        for name in ("theta", "mu", "max_clusters"):
            if getattr(self, name) < 1:
                raise ValueError(f"The '{name}' parameter of AutoscalerConfig must be >= 1, "
                                 f"got {getattr(self, name)!r}.")
        if not self.candidate_sizes or min(self.candidate_sizes) < 1:
            raise ValueError(f"The 'candidate_sizes' parameter of AutoscalerConfig must hold sizes >= 1, "
                             f"got {self.candidate_sizes!r}.")
        if self.max_units is not None and (isinstance(self.max_units, bool) or not isinstance(self.max_units, int)
                                           or self.max_units < 1):
            raise ValueError(f"The 'max_units' parameter of AutoscalerConfig must be an integer >= 1 or null, "
                             f"got {self.max_units!r}.")


@dataclass(frozen=True)
class RelativeAutoscalerSettings:
    """Autoscaler knobs in units of a workload's mean isolated latency ℓ̄ on size 1.

    AutoSLO's defaults (60 s billing minimum, 300 s spin-up, ...) are set
    against its queries' latencies; on a workload whose queries take
    milliseconds the same ratios are kept by scaling each knob by ℓ̄.
    :meth:`config` turns them into an :class:`AutoscalerConfig` in seconds.

    Attributes:
        minimum_s, spinup_delay_s, window_s, t_idle_s, t_min_lifetime_s:
            billing minimum ``m``, ``δ``, ``w``, ``T_idle``, ``T_min_lifetime``,
            each in units of ℓ̄.
        theta, tau_trigger, tau_target, mu, candidate_sizes: as in
            :class:`AutoscalerConfig` (no unit).
    """

    minimum_s: float = 5.0
    spinup_delay_s: float = 20.0
    window_s: float = 20.0
    t_idle_s: float = 50.0
    t_min_lifetime_s: float = 200.0
    theta: int = 10
    tau_trigger: float = 0.1
    tau_target: float = 0.05
    mu: int = 20
    candidate_sizes: tuple[int, ...] = (1, 2)

    def config(self, mean_iso: float, *, candidate_sizes: tuple[int, ...] | None = None,
               spinup_delay_s: float | None = None, max_clusters: int = 4,
               max_units: int | None = None) -> AutoscalerConfig:
        """The :class:`AutoscalerConfig` in seconds for a workload whose ℓ̄ is ``mean_iso``.

        Args:
            mean_iso: ℓ̄, seconds.
            candidate_sizes: overrides :attr:`candidate_sizes`.
            spinup_delay_s: overrides the spin-up delay, in seconds (not units).
            max_clusters: never hold more clusters than this.
            max_units: never hold more size units than this (``None``: no limit).
        """
        if not mean_iso > 0:
            raise ValueError(f"The 'mean_iso' parameter of RelativeAutoscalerSettings.config must be > 0, "
                             f"got {mean_iso!r}.")
        return AutoscalerConfig(
            window_s=self.window_s * mean_iso, t_idle_s=self.t_idle_s * mean_iso,
            t_min_lifetime_s=self.t_min_lifetime_s * mean_iso, theta=self.theta, tau_trigger=self.tau_trigger,
            mu=self.mu, tau_target=self.tau_target, candidate_sizes=candidate_sizes or self.candidate_sizes,
            spinup_delay_s=spinup_delay_s if spinup_delay_s is not None else self.spinup_delay_s * mean_iso,
            max_clusters=max_clusters, max_units=max_units)


@dataclass
class _Completed:
    query: Query
    latency_s: float


class ObservationWindows:
    """Trailing windows of arrivals and completions over the last ``window_s`` seconds (§6.1)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.arrivals: deque[Query] = deque()
        self.completions: deque[_Completed] = deque()
        self._done_at: deque[float] = deque()

    def _truncate(self, now_s: float) -> None:
        while self.arrivals and self.arrivals[0].arrival_s < now_s - self.window_s:
            self.arrivals.popleft()
        while self._done_at and self._done_at[0] < now_s - self.window_s:
            self._done_at.popleft()
            self.completions.popleft()

    def add_arrival(self, query: Query) -> None:
        self.arrivals.append(query)
        self._truncate(query.arrival_s)

    def add_completion(self, query: Query, end_s: float) -> None:
        self.completions.append(_Completed(query, end_s - query.arrival_s))
        self._done_at.append(end_s)
        self._truncate(end_s)


def should_tear_down(*, running: int, last_routed_s: float | None, spun_up_s: float, now_s: float,
                     t_idle_s: float, t_min_lifetime_s: float) -> bool:
    """Teardown trigger (§6.2.1): idle, unused for ``T_idle`` and older than ``T_min_lifetime``."""
    idle_since = spun_up_s if last_routed_s is None else last_routed_s
    return running == 0 and now_s - idle_since >= t_idle_s and now_s - spun_up_s >= t_min_lifetime_s


@dataclass
class SpinupTrigger:
    """Algorithm 2: fire when recent (observed + projected) SLO violations are too frequent.

    Args:
        theta: ``θ``.
        tau_trigger: ``τ_trigger``.
        observed_only: ignore running queries (the "Observed" baseline).
    """

    theta: int
    tau_trigger: float
    observed_only: bool = False
    known: frozenset[str] = field(default_factory=frozenset)
    t_change_s: float = -math.inf
    in_flight: bool = False
    suppressed_until_s: float = -math.inf

    def check(self, now_s: float, active: Sequence[str], running: Sequence[tuple[Query, float]],
              windows: ObservationWindows) -> bool:
        """Whether to spin up now.

        Args:
            now_s: current arrival time.
            active: ids of the active clusters (ready or starting).
            running: ``(query, predicted latency)`` of running queries.
            windows: the observation windows.
        """
        if frozenset(active) != self.known:
            self.known = frozenset(active)
            self.t_change_s = now_s
            self.in_flight = False
        recent_running = [] if self.observed_only else [
            (q, pred) for q, pred in running if q.arrival_s >= self.t_change_s]
        recent_done = [c for c in windows.completions if c.query.arrival_s >= self.t_change_s]
        n = len(recent_running) + len(recent_done)
        if n < self.theta or self.in_flight or now_s < self.suppressed_until_s:
            return False
        violations = sum(pred > q.slo_s for q, pred in recent_running)
        violations += sum(c.latency_s > c.query.slo_s for c in recent_done)
        if violations / n > self.tau_trigger:
            self.in_flight = True
            return True
        return False

    def suppress(self, until_s: float) -> None:
        """Do not fire again before ``until_s`` (after a do-nothing decision, Algorithm 3)."""
        self.suppressed_until_s = until_s
        self.in_flight = False


@dataclass
class QueueTrigger:
    """Queue@N baseline: fire when ``n`` or more queries are outstanding (once per cluster-set change)."""

    n: int
    known: frozenset[str] = field(default_factory=frozenset)
    in_flight: bool = False
    suppressed_until_s: float = -math.inf

    def check(self, now_s: float, active: Sequence[str], running: Sequence[tuple[Query, float]],
              windows: ObservationWindows) -> bool:
        if frozenset(active) != self.known:
            self.known = frozenset(active)
            self.in_flight = False
        if self.in_flight or now_s < self.suppressed_until_s or len(running) < self.n:
            return False
        self.in_flight = True
        return True

    def suppress(self, until_s: float) -> None:
        self.suppressed_until_s = until_s
        self.in_flight = False


@dataclass
class SizingOutcome:
    """What the size selector decided, and what it simulated for each option."""

    size: int | None                       # None: do nothing
    outcomes: dict[str, tuple[float, float]]  # option -> (violation rate, cost)


def _what_if_pool(router: Any, clusters: list[ClusterState]) -> ManagedPool:
    """A :class:`~sloctl.control.managed.ManagedPool` over copies of ``clusters``' billing timers.

    The queries ``router``'s predictor has running on them are already
    counted by the copied timers; the pool records them without restarting
    billing, so that their predicted completions go through the same step.
    """
    pool = ManagedPool(router)
    for c in clusters:
        pool.add_state(ClusterState(c.cluster_id, c.size, c.timer.copy(), c.price_per_unit_s))
        for r in router.model.running_on(c.cluster_id):
            pool.restore(Query(r.query_id, r.template, r.arrival_s, r.slo_s), c.cluster_id, r.predicted_s)
    return pool


class _Replay:
    """The arrival window replayed period after period (Algorithm 3's future arrivals), made as they are read.

    Copy ``k`` of window query ``j`` arrives ``shift + k × span`` after it, with
    id ``first_id + k × len(window) + j``; copies at or after ``until_s`` are
    left out, a period with none left ends the replay, and at most ``limit``
    are made. An option stops after ``μ`` completions, long before the
    ``limit``: only what it reads is built. :attr:`made` maps id to query.
    """

    def __init__(self, window: Sequence[Query], shift: float, span: float, until_s: float, first_id: int,
                 limit: int) -> None:
        self.window, self.shift, self.span, self.until_s = list(window), shift, span, until_s
        self.first_id, self.limit = first_id, limit
        self.made: dict[int, Query] = {}
        self._queue: list[Query] = []
        self._k = 0
        self._ended = False

    def query(self, i: int) -> Query | None:
        """The ``i``-th arrival (in the order made), or None past the end."""
        while i >= len(self._queue) and not self._ended:
            self._period()
        return self._queue[i] if i < len(self._queue) else None

    def _period(self) -> None:
        if len(self._queue) >= self.limit:
            self._ended = True
            return
        shift = self.shift + self._k * self.span
        base_id = self.first_id + self._k * len(self.window)
        batch = [Query(base_id + j, q.template, q.arrival_s + shift, q.slo_s) for j, q in enumerate(self.window)
                 if q.arrival_s + shift < self.until_s]
        self._k += 1
        if not batch:
            self._ended = True
            return
        batch = batch[:self.limit - len(self._queue)]
        self._queue.extend(batch)
        self.made.update((q.query_id, q) for q in batch)

    def all(self) -> list[Query]:
        """Every arrival (a finite ``until_s``, or up to the limit)."""
        while not self._ended:
            self._period()
        return list(self._queue)


def _arrival(arrivals: Sequence[Query] | _Replay, i: int) -> Query | None:
    if isinstance(arrivals, _Replay):
        return arrivals.query(i)
    return arrivals[i] if i < len(arrivals) else None


class _PredictedWorld:
    """The Workload Simulator: completions at arrival + predicted latency (AutoSLO §3).

    Routing, billing and completions are the :class:`ManagedPool` step; this
    world only says when the next predicted completion is.
    """

    def __init__(self, pool: ManagedPool, now_s: float) -> None:
        self.pool = pool
        self.now_s = now_s
        # each cluster's earliest predicted end, kept until a query is routed to it or ends on it (the
        # predictor changes only that cluster's predictions then): under a backlog the scan was the hot spot
        self._ends: dict[str, tuple[float, int | None]] = {}

    def _cluster_next(self, cid: str) -> tuple[float, int | None]:
        best = self._ends.get(cid)
        if best is None:
            best = (math.inf, None)
            for r in self.pool.router.model.running_on(cid):
                end = r.arrival_s + r.predicted_s
                if end < best[0]:
                    best = (end, r.query_id)
            self._ends[cid] = best
        return best

    def _next_completion(self) -> tuple[float, int | None, str | None]:
        best, where = (math.inf, None), None
        for cid in self.pool.clusters:
            end = self._cluster_next(cid)
            if end[0] < best[0]:
                best, where = end, cid
        return best[0], best[1], where

    def run_until(self, arrivals: Sequence[Query] | _Replay, stop: Callable[[], bool],
                  on_done: Callable[[Query | int, float], None], t_end: float = math.inf) -> None:
        """Process arrivals (sorted) and predicted completions until ``stop()`` or ``t_end``.

        A predicted end already in the past completes now: the world's clock
        never goes backwards.
        """
        i = 0
        while not stop():
            t_done, qid, where = self._next_completion()
            upcoming = _arrival(arrivals, i)
            t_arr = upcoming.arrival_s if upcoming is not None else math.inf
            t_next = min(t_done, t_arr)
            if math.isinf(t_next) or t_next > t_end:
                if not math.isinf(t_end):
                    self.now_s = t_end
                return
            self.now_s = max(self.now_s, t_next)
            if t_done <= t_arr:
                self._ends.pop(where, None)
                self.pool.complete(qid, self.now_s)
                on_done(qid, self.now_s)
            else:
                i += 1
                self._ends.pop(self.pool.route(upcoming, self.now_s).cluster_id, None)
        return


def _simulate_option(size: int | None, prep: ManagedPool, make_router: Callable[[Any], Any], arrivals: _Replay,
                     t_avail: float, mu: int, minimum_s: float, price_per_unit_s: float,
                     vertical: bool) -> tuple[float, float]:
    """Lines 13-29 of Algorithm 3 for one option: (violation rate, cost) after ``t_avail``."""
    sim_router = make_router(prep.router.model.fork())
    pool = _what_if_pool(sim_router, [c.state for c in prep.clusters.values()])
    if size is not None:
        new_id = f"__candidate_{size}"
        pool.add_state(ClusterState(new_id, size, BillingTimer(minimum_s), price_per_unit_s), ready_s=t_avail)
        if vertical:  # only the new cluster takes queries
            for cid, c in pool.clusters.items():
                c.retired = cid != new_id
    sim_clusters = [c.state for c in pool.clusters.values()]
    # cost as active × size × price: the order of the products is part of the seeded results
    cost_start = {c.cluster_id: c.timer.active_s(t_avail) * c.size * c.price_per_unit_s for c in sim_clusters}
    world = _PredictedWorld(pool, t_avail)
    late = arrivals.made  # the option's arrivals made so far (those routed, and the next one)
    violated: list[bool] = []
    completed = [0]

    def on_done(qid: int, t: float) -> None:
        q = late.get(qid)
        if q is not None:
            completed[0] += 1
            violated.append(t - q.arrival_s > q.slo_s)

    world.run_until(arrivals, stop=lambda: completed[0] >= mu, on_done=on_done)
    for c in sim_clusters:  # outstanding late arrivals count with their predicted latency (line 27)
        for r in sim_router.model.running_on(c.cluster_id):
            if r.query_id in late:
                violated.append(r.predicted_s > r.slo_s)
    vr = sum(violated) / len(violated) if violated else 0.0
    cost = sum(c.timer.active_s(world.now_s) * c.size * c.price_per_unit_s - cost_start[c.cluster_id]
               for c in sim_clusters)
    return vr, cost


def find_best_spinup_size(*, now_s: float, window: Sequence[Query], window_s: float, router: Any,
                          clusters: list[ClusterState], make_router: Callable[[Any], Any],
                          candidates: Sequence[int], delta_s: float, mu: int, tau_target: float,
                          minimum_s: float, price_per_unit_s: float = 1.0, vertical: bool = False,
                          max_arrivals: int = 5000) -> SizingOutcome:
    """Algorithm 3: which cluster size to add (or, ``vertical``, to have), if any.

    Args:
        now_s: decision time ``t_d``.
        window: the arrival window ``W^a`` (queries of the last ``window_s``).
        window_s: ``w``.
        router: the live router; its predictor state is forked, never changed.
        clusters: the active clusters (ready ones).
        make_router: builds a router over a forked predictor (``fork`` of
            ``router.model``).
        candidates: sizes to consider.
        delta_s: spin-up delay ``δ``.
        mu: completions ``μ`` to simulate per option after the new cluster is available.
        tau_target: BestWithTarget target ``τ``.
        minimum_s, price_per_unit_s: billing of the simulated clusters.
        vertical: the new cluster replaces the existing ones once available.
        max_arrivals: safety bound on simulated arrivals per option.
    """
    if not window:
        return SizingOutcome(None, {})
    base_t = min(q.arrival_s for q in window)
    span = max(window_s, 1e-9)

    def copies(start_s: float, until_s: float, first_id: int) -> _Replay:
        return _Replay(window, start_s - base_t, span, until_s, first_id, max_arrivals)

    # preparation period: once, shared by every option (lines 1-11)
    t_avail = now_s + delta_s
    prep = _what_if_pool(make_router(router.model.fork()), clusters)
    next_id = -1_000_000_000
    prep_arrivals = copies(now_s, t_avail, next_id).all()
    _PredictedWorld(prep, now_s).run_until(prep_arrivals, stop=lambda: False, on_done=lambda q, t: None,
                                           t_end=t_avail)
    next_id += len(prep_arrivals)

    outcomes: dict[str, tuple[float, float]] = {}
    for size in [None, *sorted(set(candidates))]:
        arrivals = copies(t_avail, math.inf, next_id)
        outcomes["none" if size is None else str(size)] = _simulate_option(
            size, prep, make_router, arrivals, t_avail, mu, minimum_s, price_per_unit_s, vertical)
    keys = list(outcomes)
    best = best_with_target([outcomes[k] for k in keys], tau_target)
    best_key = (max(0.0, outcomes[keys[best]][0] - tau_target), outcomes[keys[best]][1])
    none_key = (max(0.0, outcomes["none"][0] - tau_target), outcomes["none"][1])
    if none_key <= best_key:
        return SizingOutcome(None, outcomes)
    tied = [int(k) for k in keys if k != "none"
            and (max(0.0, outcomes[k][0] - tau_target), outcomes[k][1]) == best_key]
    return SizingOutcome(max(tied), outcomes)


class _ForkedRouter:
    """Stands in for the live router in a sizing job: only its forked predictor is read."""

    def __init__(self, model: Any) -> None:
        self.model = model


def decision_time(query: Query, now_s: float | None) -> float:
    """When an autoscaler decides on ``query``'s arrival: the driver's time, never before the arrival.

    Simulators pass nothing (they decide at the arrival); a live driver decides
    a little later, after billing timers may have seen a later completion.
    """
    return query.arrival_s if now_s is None else max(now_s, query.arrival_s)


class Autoscaler:
    """Triggers plus a scaling action, run at every arrival (AutoSLO §6).

    By default the Spinup Size Selector runs inside the arrival step that
    fired the trigger, as the simulators need (seeded, no thread timing).
    With a ``sizer`` it runs as in AutoSLO, in the background (§6, §8.8.2):
    the trigger hands a snapshot to the sizer's worker and routing goes on;
    the first arrival after the job finishes applies its spin-up; a forced
    decision (:meth:`force`) goes the same way. A trigger firing while a job
    runs is coalesced (``sizer.coalesced``). Each finished
    job is recorded, with its decision and queue times, in the events that
    :meth:`take_events` hands to the pool.

    Args:
        config: the parameters.
        trigger: a :class:`SpinupTrigger`, :class:`QueueTrigger` or ``None``
            (never fires on its own; :meth:`force` still scales).
        router: the router whose predictor the autoscaler reads (Iconq+).
        make_router: builds a router over a forked predictor, for what-if runs.
        mode: ``add`` (Spinup Size Selector adds a cluster), ``vertical``
            (the selector picks the one cluster to have), ``horizontal``
            (add a copy of the existing cluster size) or ``none``.
        minimum_s, price_per_unit_s: billing used in what-if runs.
        teardown: apply the teardown trigger.
        sizer: a :class:`~sloctl.control.background.BackgroundSizer` to run
            the size selector on (live drivers); ``None``: inside the step.
    """

    def __init__(self, config: AutoscalerConfig, trigger: Any, router: Any, make_router: Callable[[Any], Any], *,
                 mode: str = "add", minimum_s: float = 60.0, price_per_unit_s: float = 1.0,
                 teardown: bool = True, sizer: BackgroundSizer | None = None) -> None:
        if mode not in ("add", "vertical", "horizontal", "none"):
            raise ValueError(f"The 'mode' parameter of Autoscaler must be add, vertical, horizontal or none, "
                             f"got {mode!r}.")
        config.validate()
        self.config = config
        self.trigger = trigger
        self.router = router
        self.make_router = make_router
        self.mode = mode
        self.minimum_s = minimum_s
        self.price_per_unit_s = price_per_unit_s
        self.teardown = teardown
        self.sizer = sizer
        self.windows = ObservationWindows(config.window_s)
        self.decisions: list[tuple[float, SizingOutcome | None, ScalingAction | None]] = []
        self._events: list[dict[str, Any]] = []

    def on_completion(self, query: Query, end_s: float) -> None:
        self.windows.add_completion(query, end_s)

    def on_arrival(self, query: Query, clusters: list[ClusterView], now_s: float | None = None
                   ) -> list[ScalingAction]:
        """Record the arrival, run both triggers, take a finished background sizing; returns the actions to apply.

        ``now_s`` is the driver's time of the decision (default: the query's
        arrival, as in simulation). A live driver decides a little after the
        scheduled arrival, and billing timers may already have seen a later
        completion; deciding at the arrival would ask them to go back in time.
        """
        now = decision_time(query, now_s)
        self.windows.add_arrival(query)
        actions: list[ScalingAction] = []
        if self.teardown:
            ready = [c for c in clusters if c.ready]
            for c in ready:
                if len(ready) - sum(a.kind == "tear_down" for a in actions) <= 1:
                    break
                if should_tear_down(running=c.running, last_routed_s=c.last_routed_s, spun_up_s=c.spun_up_s,
                                    now_s=now, t_idle_s=self.config.t_idle_s,
                                    t_min_lifetime_s=self.config.t_min_lifetime_s):
                    actions.append(ScalingAction("tear_down", cluster_id=c.cluster_id, reason="idle"))
        if self.trigger is not None and self.mode != "none":
            running = [(Query(r.query_id, r.template, r.arrival_s, r.slo_s), r.predicted_s)
                       for r in self.router.model.running.values()]
            if self.trigger.check(now, [c.cluster_id for c in clusters], running, self.windows):
                if (self.sizer is not None and self.mode in ("add", "vertical")
                        and self.config.sizes_that_fit(clusters)):
                    # coalesced while a job runs or its result is still to be taken below
                    self.sizer.submit(self.sizing_job(now, clusters), triggered_s=now)
                else:
                    actions.extend(self.scale(now, clusters))
        if self.sizer is not None:
            actions.extend(self._take_sizing(now, clusters))
        return actions

    def force(self, now_s: float, clusters: list[ClusterView]) -> list[ScalingAction]:
        """Scale now regardless of the triggers (the size-selector experiment, §8.5).

        Without a sizer the decision is made inside this call, as the
        simulators need. With one (live drivers), an ``add`` or ``vertical``
        decision takes the trigger's path: the Spinup Size Selector's job is
        submitted on a snapshot taken now and routing goes on; the first
        arrival after it finishes applies its spin-up (a ``sizing`` event
        with ``triggered_s = now_s``). A forced decision while a job is under
        way is coalesced into that job, whose result then stands for it.
        ``horizontal`` and ``none`` decide inside this call (no simulation).
        """
        if (self.sizer is not None and self.mode in ("add", "vertical")
                and self.config.sizes_that_fit(clusters)):
            self.sizer.submit(self.sizing_job(now_s, clusters), triggered_s=now_s)
            return []
        return self.scale(now_s, clusters)

    def scale(self, now_s: float, clusters: list[ClusterView]) -> list[ScalingAction]:
        """The scaling action for ``clusters`` now, the size selector run inside this call."""
        fitting = self.config.sizes_that_fit(clusters)
        if self.mode == "none" or not fitting:
            self.decisions.append((now_s, None, None))
            return []
        ready = [c for c in clusters if c.ready and c.state is not None]
        if self.mode == "horizontal":
            size = ready[0].size if ready else min(self.config.candidate_sizes)
            if not self.config.fits(clusters, size):
                self.decisions.append((now_s, None, None))
                return []
            action = ScalingAction("spin_up", size=size, reason="trigger")
            self.decisions.append((now_s, None, action))
            return [action]
        return self._act(now_s, now_s, self.sizing_job(now_s, clusters)())

    def sizing_job(self, now_s: float, clusters: list[ClusterView]) -> Callable[[], SizingOutcome]:
        """Algorithm 3 over a snapshot taken now, as a function to run now or on a worker.

        The snapshot is what :func:`find_best_spinup_size` reads: a fork of
        the router's predictor, copies of the ready clusters' states and
        billing timers, and the arrival window. The job shares with the
        routing path only the predictor's weights and its per-template
        feature cache, whose entries never change once computed, so routing
        may go on while it runs.
        """
        model = self.router.model.fork()
        states = [ClusterState(c.state.cluster_id, c.state.size, c.state.timer.copy(), c.state.price_per_unit_s)
                  for c in clusters if c.ready and c.state is not None]
        window = list(self.windows.arrivals)
        config, make_router, vertical = self.config, self.make_router, self.mode == "vertical"
        # a vertical spin-up retires the others once it is ready, but holds its units beside them until then
        candidates = config.sizes_that_fit(clusters)
        minimum_s, price_per_unit_s = self.minimum_s, self.price_per_unit_s

        def job() -> SizingOutcome:
            return find_best_spinup_size(
                now_s=now_s, window=window, window_s=config.window_s, router=_ForkedRouter(model), clusters=states,
                make_router=make_router, candidates=candidates, delta_s=config.spinup_delay_s,
                mu=config.mu, tau_target=config.tau_target, minimum_s=minimum_s,
                price_per_unit_s=price_per_unit_s, vertical=vertical)

        return job

    def take_events(self) -> list[dict[str, Any]]:
        """Events of finished background sizings since the last call (the pool adds them to its log)."""
        events, self._events = self._events, []
        return events

    def _act(self, now_s: float, decided_s: float, outcome: SizingOutcome) -> list[ScalingAction]:
        """Lines 31-35 of Algorithm 3: do nothing (and suppress the trigger for ``δ``) or spin up."""
        if outcome.size is None:
            if self.trigger is not None:
                self.trigger.suppress(now_s + self.config.spinup_delay_s)
            self.decisions.append((decided_s, outcome, None))
            return []
        actions = [ScalingAction("spin_up", size=outcome.size, reason="size-selector")]
        if self.mode == "vertical":
            actions.append(ScalingAction("retire_others"))
        self.decisions.append((decided_s, outcome, actions[0]))
        return actions

    def _take_sizing(self, now_s: float, clusters: list[ClusterView]) -> list[ScalingAction]:
        """Apply the background job that finished since the last arrival, if any.

        A job that raised is recorded (``sizing_error``) and the trigger is
        suppressed for ``δ``, as after a do-nothing decision, so that a
        failing selector is not resubmitted at every arrival. A spin-up that
        no longer fits under ``max_clusters`` or ``max_units`` is recorded and skipped.
        """
        result = self.sizer.poll()
        if result is None:
            return []
        event: dict[str, Any] = {"t": now_s, "event": "sizing", "triggered_s": result.triggered_s,
                                 "decision_s": result.decision_s, "queue_delay_s": result.queue_delay_s}
        self._events.append(event)
        if result.error is not None:
            event.update(event="sizing_error", error=f"{type(result.error).__name__}: {result.error}")
            if self.trigger is not None:
                self.trigger.suppress(now_s + self.config.spinup_delay_s)
            self.decisions.append((result.triggered_s, None, None))
            return []
        outcome: SizingOutcome = result.value
        event["size"] = outcome.size
        units = sum(int(c.size) for c in clusters)
        why = None if outcome.size is None else self.config.limit_met(len(clusters), units, outcome.size)
        if why is not None:
            event["skipped"] = why
            self.decisions.append((result.triggered_s, outcome, None))
            return []
        return self._act(now_s, result.triggered_s, outcome)


class ArrivalScaler:
    """Base of an autoscaler that decides only at arrivals: nothing to observe at completions, nothing to force."""

    def on_completion(self, query: Query, end_s: float) -> None:
        return None

    def force(self, now_s: float, clusters: list[ClusterView]) -> list[ScalingAction]:
        return []


class QueueScaler(ArrivalScaler):
    """Queue@N spin-ups of the smallest size plus the §6.2.1 teardown; no latency model."""

    def __init__(self, config: AutoscalerConfig, queue_n: int) -> None:
        self.config = config
        self.queue_n = queue_n

    def on_arrival(self, query: Query, clusters: list[ClusterView], now_s: float | None = None
                   ) -> list[ScalingAction]:
        now = decision_time(query, now_s)
        ready = [c for c in clusters if c.ready]
        actions: list[ScalingAction] = []
        for c in ready:
            if len(ready) - len(actions) <= 1:
                break
            if should_tear_down(running=c.running, last_routed_s=c.last_routed_s, spun_up_s=c.spun_up_s, now_s=now,
                                t_idle_s=self.config.t_idle_s, t_min_lifetime_s=self.config.t_min_lifetime_s):
                actions.append(ScalingAction("tear_down", cluster_id=c.cluster_id, reason="idle"))
        starting = len(ready) < len(clusters)
        capacity = sum(c.size for c in ready)
        leaving = {a.cluster_id for a in actions}
        staying = [c for c in clusters if c.cluster_id not in leaving]
        if (not starting and self.config.fits(staying, min(self.config.candidate_sizes))
                and sum(c.running for c in ready) >= self.queue_n * capacity):
            actions.append(ScalingAction("spin_up", size=min(self.config.candidate_sizes), reason="queue@N"))
        return actions


def autoscaler_for(knobs: AutoscalerConfig, router: Any, make_router: Callable[[Any], Any], *,
                   trigger: Any = "spinup", mode: str = "add", minimum_s: float = 60.0,
                   price_per_unit_s: float = 1.0, teardown: bool = True, sizer: BackgroundSizer | None = None,
                   carry: Autoscaler | None = None) -> Autoscaler:
    """The one place an :class:`Autoscaler` is assembled (simulators, experiments, the runtime, the gateway).

    Args:
        knobs: the autoscaler's settings, in seconds.
        router: the router whose pool it scales.
        make_router: ``make_router(model)``: a router of the same kind over a
            forked model, for the size selector's what-if simulations.
        trigger: ``"spinup"`` (AutoSLO's spin-up trigger with ``knobs.theta``
            and ``knobs.tau_trigger``), ``None`` (no trigger: it sizes only
            when a scaling decision is forced), or a trigger object
            (:class:`QueueTrigger`, for Queue@N).
        mode: ``add``, ``vertical``, ``horizontal`` or ``none``.
        minimum_s: the billing minimum per cluster.
        price_per_unit_s: price of one size unit per second.
        teardown: whether idle clusters are retired.
        sizer: runs the size selector in the background (live); ``None``: inline.
        carry: the autoscaler this one replaces (a model or plan swap): its
            observation windows carry over, resized to ``knobs.window_s``.
    """
    if isinstance(trigger, str):
        if trigger != "spinup":
            raise ValueError(f"The 'trigger' parameter of autoscaler_for must be 'spinup', None or a trigger, "
                             f"got {trigger!r}.")
        trigger = SpinupTrigger(knobs.theta, knobs.tau_trigger)
    autoscaler = Autoscaler(knobs, trigger, router, make_router, mode=mode, minimum_s=minimum_s,
                            price_per_unit_s=price_per_unit_s, teardown=teardown, sizer=sizer)
    if carry is not None:
        autoscaler.windows = carry.windows
        autoscaler.windows.window_s = knobs.window_s
    return autoscaler
