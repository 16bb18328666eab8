"""The Spin-up Scheduler of the Policy Tuner (AutoSLO §7.4).

An execution configuration (:class:`ExecutionConfig`) is a list of scheduled
spin-ups on top of the reactive autoscaler. The scheduler grows it greedily:

* :func:`find_congestion_epochs` is the single linear scan of Algorithm 5
  over the merged, time-sorted arrival and completion events of every
  training simulation. A workload is *delinquent* while more than
  ``tau_target`` of its running queries are (eventually) SLO violators; a
  congestion epoch is a maximal stretch of positive length during which at
  least ``k`` workloads are delinquent at once.
* :func:`candidate_times` places a spin-up ``delta_s`` before each epoch start
  (clipped at 0), keeping a candidate only if it is at least ``sigma_min_s``
  from the previous one and from every spin-up already scheduled.
* :func:`try_spinup_at` is one attempt of Algorithm 4 (lines 12-17): add a
  spin-up of each size at one candidate time, simulate the training
  workloads, keep the best by BestWithTarget.
* :func:`schedule_spinups` is Algorithm 4: up to ``eta`` greedy rounds, each
  adding at most one spin-up per initial configuration and only on a strict
  improvement, at most ``phi`` attempts per round; the configuration after
  each round is a finalist, and BestWithTarget on the validation workloads
  picks among the finalists.

Simulation is injected (``evaluate(configs, workloads) -> matrix``) so that
:func:`~sloctl.simulation.batch.simulate_batch` runs it for real and tests can
use a fake. :class:`ScheduledSpinups` is the autoscaler wrapper that carries
a schedule into a :class:`~sloctl.simulation.engine.WarehouseSimulator`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sloctl.control.autoscaler import AutoscalerConfig
from sloctl.control.billing import best_with_target
from sloctl.control.managed import ScalingAction
from sloctl.core.errors import ConfigError

__all__ = [
    "CongestionEpoch",
    "ExecutionConfig",
    "ScheduleResult",
    "ScheduledSpinup",
    "ScheduledSpinups",
    "Timeline",
    "aggregate",
    "candidate_times",
    "find_congestion_epochs",
    "find_good_spinup_times",
    "schedule_spinups",
    "try_spinup_at",
]


@dataclass(frozen=True)
class ScheduledSpinup:
    """Request a cluster of ``size`` at ``time_s`` (ready one spin-up delay later).

    ``mode="add"`` adds it to the pool; ``"vertical"`` stops routing to the
    other clusters once it is requested (they drain and stop billing).
    """

    time_s: float
    size: int
    mode: str = "add"


@dataclass(frozen=True)
class ExecutionConfig:
    """What SimulateBatch runs: starting clusters, scheduled spin-ups, autoscaler knobs (§7.3).

    Attributes:
        spinups: scheduled spin-ups, sorted by time.
        autoscaler: the reactive autoscaler's parameters; ``None`` runs
            without a reactive autoscaler (schedule only).
        start_sizes: sizes of the clusters active at time 0.
    """

    spinups: tuple[ScheduledSpinup, ...] = ()
    autoscaler: AutoscalerConfig | None = None
    start_sizes: tuple[int, ...] = (1,)

    def with_spinup(self, spinup: ScheduledSpinup) -> ExecutionConfig:
        """A copy with one more scheduled spin-up (kept sorted by time)."""
        spinups = tuple(sorted((*self.spinups, spinup), key=lambda s: (s.time_s, s.size, s.mode)))
        return dataclasses.replace(self, spinups=spinups)

    def check_fits(self, max_units: int | None, what: str = "The plan") -> None:
        """Refuse a configuration whose starting clusters or a scheduled spin-up exceed ``max_units`` size units.

        ``max_units`` is the cluster cores' (``AutoscalerConfig.max_units``);
        ``None``: no limit. A configuration that does not fit is never run
        oversubscribed.

        Raises:
            ConfigError: naming the sizes and the limit.
        """
        if max_units is None:
            return
        start = sum(int(s) for s in self.start_sizes)
        if start > max_units:
            raise ConfigError(f"{what} starts clusters {list(self.start_sizes)}: {start} size units, more than the "
                              f"{max_units} the cluster cores give (max_units); start fewer or smaller clusters, "
                              f"or plan with max_units {max_units}.")
        big = [s.size for s in self.spinups if s.size > max_units]
        if big:
            raise ConfigError(f"{what} schedules spin-ups of size {big}, more than the {max_units} size units the "
                              f"cluster cores give (max_units).")


@dataclass(frozen=True, eq=False)
class Timeline:
    """Per-query outcome of one simulation, in arrival order, plus the cluster count over time.

    ``start_s`` equals ``arrival_s`` in the emulated warehouse (a query is
    routed and starts sharing its cluster on arrival). ``cluster_count[i]``
    clusters are provisioned from ``cluster_t_s[i]`` on.
    """

    arrival_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    violated: np.ndarray
    cluster_t_s: np.ndarray
    cluster_count: np.ndarray

    def equals(self, other: Timeline) -> bool:
        return all(np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))


class Outcome(Protocol):
    """One cell of a SimulateBatch matrix, as the scheduler reads it."""

    vr: float
    cost: float
    timeline: Timeline


Evaluate = Callable[[Sequence[ExecutionConfig], Sequence[Any]], Sequence[Sequence[Outcome]]]


@dataclass(frozen=True)
class CongestionEpoch:
    """``[start_s, end_s)`` during which at least ``k`` workloads were delinquent (peak: most at once)."""

    start_s: float
    end_s: float
    peak_delinquent: int


def aggregate(row: Sequence[Outcome]) -> tuple[float, float]:
    """``(violation rate, cost)`` of one configuration across workloads: the means over workloads."""
    return float(np.mean([c.vr for c in row])), float(np.mean([c.cost for c in row]))


def find_congestion_epochs(timelines: Sequence[Timeline], *, tau_target: float, k: int | None = None,
                           merge_gap_s: float = 0.0) -> list[CongestionEpoch]:
    """Algorithm 5's scan: epochs where violations concentrate across the training simulations.

    Every query contributes an arrival and a completion event; at equal times
    completions go first (a query ending at ``t`` no longer runs at ``t``).
    Running sums ``V_i`` (running violators) and ``N_i`` (running queries) make
    each event O(1). Workload ``i`` is delinquent while ``V_i > tau_target · N_i``
    and ``N_i > 0``; the state is judged only after the last event at a
    timestamp, so zero-length intervals never open or close an epoch.

    Args:
        timelines: one per training workload (same execution configuration).
        tau_target: ``τ``, the BestWithTarget violation-rate target.
        k: delinquent workloads needed at once; default: a majority,
            ``ceil(len(timelines) / 2)``.
        merge_gap_s: epochs separated by less than this gap merge into one.

    Returns:
        Epochs in time order; an epoch still open at the end closes at the last event.
    """
    if not timelines:
        return []
    k = math.ceil(len(timelines) / 2) if k is None else k
    if k < 1:
        raise ValueError(f"The 'k' parameter of find_congestion_epochs must be >= 1, got {k!r}.")
    t = np.concatenate([np.concatenate([tl.arrival_s, tl.end_s]) for tl in timelines]).astype(float)
    if not len(t):
        return []
    delta = np.concatenate([np.concatenate([np.ones(len(tl.arrival_s), int), -np.ones(len(tl.end_s), int)])
                            for tl in timelines])
    workload = np.concatenate([np.full(2 * len(tl.arrival_s), i) for i, tl in enumerate(timelines)])
    bad = np.concatenate([np.tile(np.asarray(tl.violated, bool), 2) for tl in timelines]).astype(int)
    order = np.lexsort((delta, t))  # by time, completions (-1) before arrivals (+1)
    t, delta, workload, bad = t[order].tolist(), delta[order].tolist(), workload[order].tolist(), bad[order].tolist()

    V = [0] * len(timelines)
    N = [0] * len(timelines)
    D = [False] * len(timelines)
    n_D = 0
    epochs: list[CongestionEpoch] = []
    start, peak = None, 0
    last = len(t) - 1
    for e in range(len(t)):
        i = workload[e]
        N[i] += delta[e]
        V[i] += delta[e] * bad[e]
        d = N[i] > 0 and V[i] > tau_target * N[i]
        if d != D[i]:
            D[i] = d
            n_D += 1 if d else -1
        if e < last and t[e + 1] == t[e]:
            continue  # zero-length interval: judge after the last event at this time
        if start is None and n_D >= k:
            start, peak = t[e], n_D
        elif start is not None:
            if n_D >= k:
                peak = max(peak, n_D)
            else:
                epochs.append(CongestionEpoch(start, t[e], peak))
                start = None
    if start is not None:
        epochs.append(CongestionEpoch(start, t[last], peak))
    merged: list[CongestionEpoch] = []
    for ep in epochs:
        if merged and ep.start_s - merged[-1].end_s < merge_gap_s:
            prev = merged[-1]
            merged[-1] = CongestionEpoch(prev.start_s, ep.end_s, max(prev.peak_delinquent, ep.peak_delinquent))
        else:
            merged.append(ep)
    return merged


def candidate_times(epochs: Sequence[CongestionEpoch], delta_s: float, *, sigma_min_s: float = 0.0,
                    scheduled_s: Sequence[float] = ()) -> list[float]:
    """Spin-up times ``delta_s`` before each epoch start, clipped at 0, in time order.

    A candidate is dropped when it is closer than ``sigma_min_s`` to the
    previous kept candidate or to any already scheduled spin-up time.
    """
    if delta_s < 0:
        raise ValueError(f"The 'delta_s' parameter of candidate_times must be >= 0, got {delta_s!r}.")
    out: list[float] = []
    for ep in sorted(epochs, key=lambda e: e.start_s):
        time_s = max(0.0, ep.start_s - delta_s)
        if out and time_s - out[-1] < sigma_min_s:
            continue
        if any(abs(time_s - s) < sigma_min_s for s in scheduled_s):
            continue
        out.append(time_s)
    return out


def find_good_spinup_times(timelines: Sequence[Timeline], *, tau_target: float, delta_s: float,
                           sigma_min_s: float = 0.0, k: int | None = None, merge_gap_s: float = 0.0,
                           scheduled_s: Sequence[float] = ()) -> list[float]:
    """Algorithm 5 (FindGoodSpinupTime): the promising spin-up times ``Γ`` of one configuration."""
    epochs = find_congestion_epochs(timelines, tau_target=tau_target, k=k, merge_gap_s=merge_gap_s)
    return candidate_times(epochs, delta_s, sigma_min_s=sigma_min_s, scheduled_s=scheduled_s)


def _key(outcome: tuple[float, float], tau_target: float) -> tuple[float, float]:
    return max(0.0, outcome[0] - tau_target), outcome[1]


def _accept(base_outcome: tuple[float, float], trials: list[ExecutionConfig], rows: Sequence[Sequence[Outcome]],
            tau_target: float) -> tuple[ExecutionConfig, tuple[float, float]] | None:
    # BestWithTarget keeps the first index on ties, so the baseline (index 0)
    # wins unless a trial is strictly better.
    outcomes = [base_outcome, *(aggregate(row) for row in rows)]
    best = best_with_target(outcomes, tau_target)
    return None if best == 0 else (trials[best - 1], outcomes[best])


def try_spinup_at(base: ExecutionConfig, base_outcome: tuple[float, float], time_s: float, sizes: Sequence[int],
                  *, evaluate: Evaluate, workloads: Sequence[Any], tau_target: float, mode: str = "add"
                  ) -> tuple[ExecutionConfig, tuple[float, float]] | None:
    """One attempt of Algorithm 4 (lines 12-17) for one configuration.

    Adds a spin-up of each size at ``time_s``, simulates the training
    workloads, and returns the best trial with its aggregate outcome if
    BestWithTarget ranks it strictly above ``base``; else ``None``.
    """
    trials = [base.with_spinup(ScheduledSpinup(time_s, s, mode)) for s in sizes]
    return _accept(base_outcome, trials, evaluate(trials, workloads), tau_target)


@dataclass
class ScheduleResult:
    """What :func:`schedule_spinups` found.

    Attributes:
        best: ``E*``, the finalist with the best validation outcome.
        best_validation: its ``(violation rate, cost)`` on the validation workloads.
        finalists: every configuration reached after a round (initial ones
            included), in the order they were compared on validation.
        finalist_train: their training ``(violation rate, cost)``.
        finalist_validation: their validation ``(violation rate, cost)``.
        simulations: configuration × workload simulations run.
    """

    best: ExecutionConfig
    best_validation: tuple[float, float]
    finalists: list[ExecutionConfig]
    finalist_train: list[tuple[float, float]]
    finalist_validation: list[tuple[float, float]]
    simulations: int = 0
    rounds: list[dict[str, Any]] = field(default_factory=list)


def schedule_spinups(initial: Sequence[ExecutionConfig], *, evaluate: Evaluate, train: Sequence[Any],
                     validation: Sequence[Any], sizes: Sequence[int], tau_target: float, delta_s: float,
                     eta: int = 3, phi: int = 3, sigma_min_s: float = 0.0, k: int | None = None,
                     merge_gap_s: float = 0.0, mode: str = "add") -> ScheduleResult:
    """Algorithm 4 (ScheduleSpinups): greedy scheduled spin-ups, chosen on validation.

    Args:
        initial: the starting configurations ``{E_i^0}``.
        evaluate: ``evaluate(configs, workloads)`` returns the matrix
            ``R[i][j]`` (e.g. :func:`~sloctl.simulation.batch.simulate_batch`
            with its runner bound).
        train, validation: the forecast workloads of each split.
        sizes: ``S``, the cluster sizes a scheduled spin-up may have.
        tau_target: ``τ``.
        delta_s: ``δ``, how long before an epoch to request the cluster
            (normally the spin-up delay).
        eta: ``η``, greedy rounds.
        phi: ``φ``, attempts (candidate times) per round.
        sigma_min_s: ``σ_min``, minimum spacing between spin-ups.
        k, merge_gap_s: see :func:`find_congestion_epochs`.
        mode: the scheduled spin-ups' mode (``add`` or ``vertical``).
    """
    for name, value in (("eta", eta), ("phi", phi)):
        if value < 1:
            raise ValueError(f"The '{name}' parameter of schedule_spinups must be >= 1, got {value!r}.")
    if not initial:
        raise ValueError("The 'initial' parameter of schedule_spinups must hold at least one configuration.")
    if mode not in ("add", "vertical"):
        raise ValueError(f"The 'mode' parameter of schedule_spinups must be 'add' or 'vertical', got {mode!r}.")
    simulations = 0

    def run(configs: list[ExecutionConfig], workloads: Sequence[Any]) -> Sequence[Sequence[Outcome]]:
        nonlocal simulations
        if not configs:
            return []
        simulations += len(configs) * len(workloads)
        return evaluate(configs, workloads)

    best = list(initial)
    history: list[list[tuple[ExecutionConfig, tuple[float, float]]]] = [[] for _ in initial]
    alive_at_all = set(range(len(initial)))
    rounds: list[dict[str, Any]] = []
    for r in range(eta):
        if not alive_at_all:
            break
        ids = sorted(alive_at_all)
        matrix = run([best[i] for i in ids], train)
        current: dict[int, tuple[float, float]] = {}
        gamma: dict[int, list[float]] = {}
        for i, row in zip(ids, matrix, strict=True):
            current[i] = aggregate(row)
            if r == 0:
                history[i].append((best[i], current[i]))
            gamma[i] = find_good_spinup_times([c.timeline for c in row], tau_target=tau_target, delta_s=delta_s,
                                              sigma_min_s=sigma_min_s, k=k, merge_gap_s=merge_gap_s,
                                              scheduled_s=[s.time_s for s in best[i].spinups])
            if not gamma[i]:
                alive_at_all.discard(i)
        attempt = dict.fromkeys(alive_at_all, 0)
        alive_this_round = set(alive_at_all)
        accepted: dict[int, ScheduledSpinup] = {}
        while alive_this_round:
            # one attempt wave: every still-alive configuration tries its next time with every size, in one batch
            wave = sorted(alive_this_round)
            trials = {i: [best[i].with_spinup(ScheduledSpinup(gamma[i][attempt[i]], s, mode)) for s in sizes]
                      for i in wave}
            matrix = run([cfg for i in wave for cfg in trials[i]], train)
            for n, i in enumerate(wave):
                rows = matrix[n * len(sizes):(n + 1) * len(sizes)]
                result = _accept(current[i], trials[i], rows, tau_target)
                if result is not None:
                    accepted[i] = ScheduledSpinup(gamma[i][attempt[i]], sizes[trials[i].index(result[0])], mode)
                    best[i] = result[0]
                    history[i].append(result)
                    alive_this_round.discard(i)
                    continue
                attempt[i] += 1
                if attempt[i] >= min(phi, len(gamma[i])):
                    alive_this_round.discard(i)
                    alive_at_all.discard(i)
        rounds.append({"round": r, "candidates": {i: gamma[i] for i in ids}, "accepted": accepted})
    finalists = [cfg for h in history for cfg, _ in h]
    finalist_train = [out for h in history for _, out in h]
    val_matrix = run(finalists, validation)
    finalist_validation = [aggregate(row) for row in val_matrix]
    pick = best_with_target(finalist_validation, tau_target)
    return ScheduleResult(finalists[pick], finalist_validation[pick], finalists, finalist_train,
                          finalist_validation, simulations, rounds)


class ScheduledSpinups:
    """Autoscaler wrapper that adds scheduled spin-ups to a reactive autoscaler (or to none).

    The simulator consults its autoscaler at arrivals, so a spin-up scheduled
    at ``t`` is requested at the first arrival at or after ``t``. A spin-up
    that would exceed ``max_clusters`` or ``max_units`` is skipped (and listed
    in ``skipped``, the limit it met in ``skipped_why``);
    the others are listed in ``requested``, in the order they were requested.
    A driver with a clock of its own (the HTTP runtime) also calls
    :meth:`due` between arrivals, so a spin-up is not held back by a quiet spell.

    Args:
        spinups: the schedule.
        inner: the reactive :class:`~sloctl.control.autoscaler.Autoscaler`, or ``None``.
        spinup_delay_s: request-to-ready delay when there is no ``inner``.
        max_clusters, max_units: pool limits when there is no ``inner``.
    """

    def __init__(self, spinups: Sequence[ScheduledSpinup], inner: Any = None, *, spinup_delay_s: float = 300.0,
                 max_clusters: int = 4, max_units: int | None = None) -> None:
        self.spinups = sorted(spinups, key=lambda s: s.time_s)
        self.inner = inner
        self.config = inner.config if inner is not None else AutoscalerConfig(
            spinup_delay_s=spinup_delay_s, max_clusters=max_clusters, max_units=max_units)
        self.skipped: list[ScheduledSpinup] = []
        self.skipped_why: list[str] = []
        self.requested: list[ScheduledSpinup] = []
        self._next = 0

    @property
    def upcoming(self) -> list[ScheduledSpinup]:
        """The spin-ups not yet requested nor skipped, in time order."""
        return self.spinups[self._next:]

    def on_completion(self, query: Any, end_s: float) -> None:
        if self.inner is not None:
            self.inner.on_completion(query, end_s)

    def force(self, now_s: float, clusters: list[Any]) -> list[ScalingAction]:
        return self.inner.force(now_s, clusters) if self.inner is not None else []

    def on_arrival(self, query: Any, clusters: list[Any], now_s: float | None = None) -> list[ScalingAction]:
        actions = list(self.inner.on_arrival(query, clusters, now_s)) if self.inner is not None else []
        return actions + self.due(query.arrival_s, clusters, pending=actions)

    def due(self, now_s: float, clusters: list[Any], *, pending: Sequence[ScalingAction] = ()) -> list[ScalingAction]:
        """The actions of every spin-up scheduled at or before ``now_s`` and not yet requested.

        Args:
            now_s: the driver's time.
            clusters: the pool's clusters (views), for the ``max_clusters`` and ``max_units`` limits.
            pending: actions already decided at this step (the reactive
                autoscaler's), counted against the limit.

        Returns:
            ``spin_up`` per due spin-up (followed by ``retire_others`` for a
            vertical one); each is requested once.
        """
        n = len(clusters) + sum(a.kind == "spin_up" for a in pending) - sum(a.kind == "tear_down" for a in pending)
        units = 0
        if self.config.max_units is not None:  # sizes count only against max_units
            leaving = {a.cluster_id for a in pending if a.kind == "tear_down"}
            units = sum(int(c.size) for c in clusters if c.cluster_id not in leaving) \
                + sum(int(a.size) for a in pending if a.kind == "spin_up")
        actions: list[ScalingAction] = []
        while self._next < len(self.spinups) and self.spinups[self._next].time_s <= now_s:
            spinup = self.spinups[self._next]
            self._next += 1
            why = self.config.limit_met(n, units, spinup.size)
            if why is not None:
                self.skipped.append(spinup)
                self.skipped_why.append(why)
                continue
            actions.append(ScalingAction("spin_up", size=spinup.size, reason="plan"))
            if spinup.mode == "vertical":
                actions.append(ScalingAction("retire_others"))
            self.requested.append(spinup)
            n, units = n + 1, units + int(spinup.size)
        return actions
