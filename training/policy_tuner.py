"""The Configuration Tuner of the Policy Tuner (AutoSLO §7.5), and its chaining with the Spin-up Scheduler.

:func:`tune_knobs` searches the autoscaler's knobs (and the starting clusters)
over a declared :class:`SearchSpace`:

1. A strategy proposes configurations in batches — ``grid``, ``random``,
   ``coordinate`` (coordinate descent), ``adaptive`` (adaptive batches around
   the current leaders with a shrinking radius) or ``optuna`` (seeded TPE).
2. Each batch runs on the TRAINING workloads through the injected
   ``evaluate(configs, workloads)``; a configuration's score is its mean
   violation rate and mean cost over the workloads.
3. The top ``k`` by BestWithTarget on the training means are run once more on
   the VALIDATION workloads, and BestWithTarget on the validation means picks
   the winner.

``budget`` counts distinct configurations run on the training workloads; the
``k`` validation runs come on top. A configuration proposed twice is run once.

:func:`tune_policy` chains the tuner with
:func:`~sloctl.control.scheduler.schedule_spinups`. The default order tunes
the knobs first and schedules spin-ups on the winner: the knobs decide how
the reactive autoscaler behaves everywhere, and the scheduler then only adds
capacity where congestion survives them. ``order="schedule_first"`` follows
the paper's text instead (schedule on the base knobs, then tune the knobs with
the schedule fixed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloctl.control.autoscaler import AutoscalerConfig
from sloctl.control.billing import best_with_target
from sloctl.control.scheduler import ExecutionConfig, ScheduleResult, schedule_spinups
from sloctl.core.errors import ConfigError

__all__ = ["STRATEGIES", "SearchSpace", "Trial", "KnobTuning", "PolicyResult", "apply_knobs", "spread_margin",
           "tune_knobs", "tune_policy"]

STRATEGIES = ("grid", "random", "coordinate", "adaptive", "optuna")
KINDS = ("int", "float", "log")
# Knobs of the execution configuration itself (not of the reactive autoscaler).
START_KNOBS = ("start_clusters", "start_size", "start_sizes")
_AUTOSCALER_FIELDS = tuple(f.name for f in dataclasses.fields(AutoscalerConfig))
_INT_FIELDS = ("theta", "mu", "max_clusters", "max_units", "start_clusters", "start_size")

Knob = tuple[float, float, str] | Sequence[Any]
Evaluate = Callable[[Sequence[ExecutionConfig], Sequence[Any]], Any]


@dataclass(frozen=True)
class SearchSpace:
    """Knobs to search: ``name -> (low, high, kind)`` with kind ``int``/``float``/``log``, or a list of choices.

    Numeric knobs are tuples, choices are lists. Names are
    :class:`~sloctl.control.autoscaler.AutoscalerConfig` fields, or
    ``start_clusters`` / ``start_size`` (the clusters active at time 0), or
    ``start_sizes``: choices of whole starting pools (lists of sizes, e.g.
    only those that fit the cluster core).
    Numeric knobs have ``grid_points`` grid values (grid, random and
    coordinate strategies use the grid; adaptive and optuna sample between
    the bounds).
    """

    knobs: Mapping[str, Knob]
    grid_points: int = 5

    def validate(self) -> None:
        """Raise :class:`~sloctl.core.errors.ConfigError` naming the first bad knob."""
        if not self.knobs:
            raise ConfigError("The 'knobs' parameter of SearchSpace must hold at least one knob, got {}.")
        if isinstance(self.grid_points, bool) or not isinstance(self.grid_points, int) or self.grid_points < 2:
            raise ConfigError(f"The 'grid_points' parameter of SearchSpace must be an integer >= 2, "
                              f"got {self.grid_points!r}.")
        for name, spec in self.knobs.items():
            if name not in _AUTOSCALER_FIELDS and name not in START_KNOBS:
                raise ConfigError(f"The knob {name!r} of SearchSpace must be an AutoscalerConfig field or one of "
                                  f"{', '.join(START_KNOBS)}, got an unknown name.")
            if self._numeric(spec):
                low, high, kind = spec
                ok = (kind in KINDS and all(isinstance(v, int | float) and not isinstance(v, bool)
                                            and math.isfinite(v) for v in (low, high)) and low < high
                      and (kind != "log" or low > 0))
                if not ok:
                    raise ConfigError(f"The knob {name!r} of SearchSpace must be (low, high, kind) with finite "
                                      f"low < high (low > 0 for log) and kind in {KINDS}, got {tuple(spec)!r}.")
                if name in _INT_FIELDS and kind != "int":
                    raise ConfigError(f"The knob {name!r} of SearchSpace is whole-numbered and must have kind "
                                      f"'int', got {kind!r}.")
            elif isinstance(spec, str) or not isinstance(spec, Sequence) or len(spec) == 0:
                raise ConfigError(f"The knob {name!r} of SearchSpace must be (low, high, kind) or a non-empty "
                                  f"list of choices, got {spec!r}.")
            if name == "start_sizes" and (self._numeric(spec) or not all(
                    isinstance(c, Sequence) and not isinstance(c, str) and len(c) > 0
                    and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in c) for c in spec)):
                raise ConfigError(f"The knob 'start_sizes' of SearchSpace must be a list of starting pools, each a "
                                  f"non-empty list of cluster sizes >= 1, got {spec!r}.")

    @staticmethod
    def _numeric(spec: Any) -> bool:
        # numeric knobs are (low, high, kind) tuples; choices are given as a list
        return isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[2], str)

    @property
    def names(self) -> list[str]:
        return list(self.knobs)

    def grid(self, name: str) -> list[Any]:
        """The grid values of one knob (choices as given)."""
        spec = self.knobs[name]
        if not self._numeric(spec):
            return list(spec)
        low, high, kind = spec
        if kind == "int":
            return sorted({int(round(v)) for v in np.linspace(low, high, self.grid_points)})
        values = np.geomspace(low, high, self.grid_points) if kind == "log" else np.linspace(low, high,
                                                                                             self.grid_points)
        return [float(v) for v in values]

    def grid_size(self) -> int:
        return math.prod(len(self.grid(n)) for n in self.names)

    def grid_point(self, index: int) -> dict[str, Any]:
        """The ``index``-th point of the cross product (last knob varies fastest)."""
        out: dict[str, Any] = {}
        for name in reversed(self.names):
            values = self.grid(name)
            index, r = divmod(index, len(values))
            out[name] = values[r]
        return {n: out[n] for n in self.names}

    def from_unit(self, name: str, u: float) -> Any:
        """Map ``u`` in [0, 1] onto the knob (log knobs geometrically; choices by bucket)."""
        spec = self.knobs[name]
        u = min(max(float(u), 0.0), 1.0)
        if not self._numeric(spec):
            return list(spec)[min(int(u * len(spec)), len(spec) - 1)]
        low, high, kind = spec
        if kind == "log":
            return float(math.exp(math.log(low) + u * (math.log(high) - math.log(low))))
        value = low + u * (high - low)
        return int(round(value)) if kind == "int" else float(value)

    def to_unit(self, name: str, value: Any) -> float:
        spec = self.knobs[name]
        if not self._numeric(spec):
            choices = list(spec)
            return (choices.index(value) + 0.5) / len(choices)
        low, high, kind = spec
        if kind == "log":
            return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
        return (value - low) / (high - low)


def apply_knobs(base: ExecutionConfig, params: Mapping[str, Any]) -> ExecutionConfig:
    """``base`` with the knobs set: autoscaler fields on its autoscaler (default one if it has none)."""
    auto = {k: v for k, v in params.items() if k in _AUTOSCALER_FIELDS}
    config = base
    if auto:
        autoscaler = dataclasses.replace(base.autoscaler or AutoscalerConfig(), **auto)
        config = dataclasses.replace(config, autoscaler=autoscaler)
    if "start_sizes" in params:  # one knob for the whole starting pool (a list of sizes)
        config = dataclasses.replace(config, start_sizes=tuple(int(s) for s in params["start_sizes"]))
    elif "start_clusters" in params or "start_size" in params:
        n = int(params.get("start_clusters", len(base.start_sizes)))
        size = int(params.get("start_size", base.start_sizes[0]))
        config = dataclasses.replace(config, start_sizes=(size,) * n)
    return config


@dataclass
class Trial:
    """One configuration the tuner ran: its knobs, training means, and validation means if re-evaluated."""

    number: int
    batch: int
    params: dict[str, Any]
    config: ExecutionConfig
    train: tuple[float, float]
    validation: tuple[float, float] | None = None


@dataclass
class KnobTuning:
    """What :func:`tune_knobs` found: the winner on validation, its top-k rivals and every trial."""

    best: ExecutionConfig
    best_params: dict[str, Any]
    best_train: tuple[float, float]
    best_validation: tuple[float, float]
    top: list[Trial]
    trials: list[Trial]
    strategy: str
    budget: int
    margin: float = 0.0
    tau_target: float = 0.05

    @property
    def target(self) -> float:
        """The violation rate the winner was picked against: ``τ`` less :attr:`margin`."""
        return self.tau_target - self.margin

    @property
    def evaluated(self) -> int:
        return len(self.trials)


@dataclass
class PolicyResult:
    """:func:`tune_policy`: the final execution configuration and both phases."""

    best: ExecutionConfig
    best_validation: tuple[float, float]
    tuning: KnobTuning
    schedule: ScheduleResult
    order: str
    extra: dict[str, Any] = field(default_factory=dict)


def _means(result: Any, n: int) -> list[tuple[float, float]]:
    """Per-configuration (mean VR, mean cost) from what ``evaluate`` returned (:func:`_matrices`)."""
    vr, cost = _matrices(result, n)
    return list(zip(vr.mean(axis=1).tolist(), cost.mean(axis=1).tolist(), strict=True))


def _matrices(result: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The (configurations, workloads) VR and cost matrices of what ``evaluate`` returned.

    Accepted: an object with ``.vr()`` and ``.cost()`` matrices (a
    :class:`~sloctl.simulation.batch.BatchResult`), a ``(vr, cost)`` tuple of
    matrices, or a matrix of outcomes with ``.vr`` and ``.cost``.
    """
    if hasattr(result, "vr") and hasattr(result, "cost") and callable(result.vr):
        vr, cost = np.asarray(result.vr(), float), np.asarray(result.cost(), float)
    elif isinstance(result, tuple) and len(result) == 2:
        vr, cost = np.asarray(result[0], float), np.asarray(result[1], float)
    else:
        vr = np.array([[c.vr for c in row] for row in result], float)
        cost = np.array([[c.cost for c in row] for row in result], float)
    if vr.shape != cost.shape or vr.ndim != 2 or vr.shape[0] != n:
        raise ValueError(f"The 'evaluate' callable must return ({n}, workloads) VR and cost matrices, "
                         f"got shapes {vr.shape} and {cost.shape}.")
    return vr, cost


def spread_margin(vr: np.ndarray) -> float:
    """The margin below ``τ`` a validated plan keeps: the mean over configurations of the VR's spread.

    ``vr`` is the (configurations, validation workloads) matrix; each row's
    standard deviation is how far one forecast day's violation rate strays
    from the mean the tuner ranks by. 0 with one validation workload.
    """
    vr = np.asarray(vr, float)
    if vr.ndim != 2 or vr.shape[1] < 2:
        return 0.0
    return float(np.mean(vr.std(axis=1, ddof=1)))


def _key(outcome: tuple[float, float], tau_target: float) -> tuple[float, float]:
    return max(0.0, outcome[0] - tau_target), outcome[1]


class _Search:
    """Bookkeeping shared by the strategies: dedupe, budget, batches, ranking."""

    def __init__(self, space: SearchSpace, evaluate: Evaluate, train: Sequence[Any], base: ExecutionConfig,
                 budget: int, tau_target: float) -> None:
        self.space, self.evaluate, self.train, self.base = space, evaluate, train, base
        self.budget, self.tau_target = budget, tau_target
        self.trials: list[Trial] = []
        self.seen: dict[tuple, Trial] = {}
        self.batches = 0

    @staticmethod
    def _sig(params: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, round(v, 12) if isinstance(v, float) else v) for k, v in params.items()))

    @property
    def left(self) -> int:
        return self.budget - len(self.trials)

    def run(self, proposals: Sequence[Mapping[str, Any]]) -> list[Trial]:
        """Run the new proposals (up to the budget) as one batch; return the trials of all proposals."""
        fresh: list[dict[str, Any]] = []
        for p in proposals:
            sig = self._sig(p)
            if sig not in self.seen and all(self._sig(f) != sig for f in fresh) and len(fresh) < self.left:
                fresh.append(dict(p))
        if fresh:
            configs = [apply_knobs(self.base, p) for p in fresh]
            means = _means(self.evaluate(configs, self.train), len(configs))
            for p, c, m in zip(fresh, configs, means, strict=True):
                trial = Trial(len(self.trials), self.batches, p, c, m)
                self.trials.append(trial)
                self.seen[self._sig(p)] = trial
            self.batches += 1
        return [self.seen[self._sig(p)] for p in proposals if self._sig(p) in self.seen]

    def ranked(self) -> list[Trial]:
        return sorted(self.trials, key=lambda t: (*_key(t.train, self.tau_target), t.number))

    def best_of(self, trials: Sequence[Trial]) -> Trial:
        return trials[best_with_target([t.train for t in trials], self.tau_target)]


def _grid(s: _Search, rng: np.random.Generator, **_: Any) -> None:
    n = s.space.grid_size()
    # a grid larger than the budget is thinned evenly over its enumeration order
    idx = range(n) if n <= s.budget else np.unique(np.linspace(0, n - 1, s.budget).round().astype(int)).tolist()
    s.run([s.space.grid_point(int(i)) for i in idx])


def _random(s: _Search, rng: np.random.Generator, **_: Any) -> None:
    n = s.space.grid_size()
    picks = rng.choice(n, size=min(n, s.budget), replace=False)
    s.run([s.space.grid_point(int(i)) for i in picks])


def _coordinate(s: _Search, rng: np.random.Generator, *, start: Mapping[str, Any] | None = None,
                **_: Any) -> None:
    names = s.space.names
    if start is None:  # the grid's middle point
        start = {n: s.space.grid(n)[(len(s.space.grid(n)) - 1) // 2] for n in names}
    missing = [n for n in names if n not in start]
    if missing:
        raise ConfigError(f"The 'start' parameter of coordinate descent must set every knob, missing {missing}.")
    center = s.run([dict(start)])[0]
    while s.left > 0:
        moved = False
        for name in names:  # one knob at a time over its grid, the others held at the current best
            if s.left <= 0:
                break
            line = s.run([{**center.params, name: v} for v in s.space.grid(name)])
            best = s.best_of([center, *line])  # the current point first: ties keep it
            if best is not center:
                center, moved = best, True
        if not moved:
            break


def _adaptive(s: _Search, rng: np.random.Generator, *, batch_size: int | None = None, top_k: int = 3,
              radius: float = 0.5, shrink: float = 0.5, patience: int = 2, **_: Any) -> None:
    names = s.space.names
    size = batch_size or max(4, s.budget // 4)
    best_key, stale, stalls = None, 0, 0
    while s.left > 0 and stale < patience and stalls < 3:
        if not s.trials:  # first batch: uniform over the box
            proposals = [{n: s.space.from_unit(n, rng.random()) for n in names} for _ in range(size)]
        else:  # around the leaders, within +-radius in unit coordinates
            leaders = s.ranked()[:top_k]
            proposals = []
            for i in range(size):
                c = leaders[i % len(leaders)].params
                proposals.append({n: s.space.from_unit(n, s.space.to_unit(n, c[n]) + rng.uniform(-radius, radius))
                                  for n in names})
            radius *= shrink
        before = len(s.trials)
        s.run(proposals)
        stalls = stalls + 1 if len(s.trials) == before else 0  # a small discrete space can run out of new points
        key = _key(s.ranked()[0].train, s.tau_target)
        if best_key is not None and key >= best_key:
            stale += 1  # early stopping: no batch improved on the leader
        else:
            best_key, stale = key, 0


def _optuna(s: _Search, rng: np.random.Generator, *, batch_size: int | None = None, seed: int = 0,
            **_: Any) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed), direction="minimize")
    size = batch_size or max(4, s.budget // 4)
    stalls = 0
    while s.left > 0 and stalls < 3:
        asked = [study.ask() for _ in range(min(size, s.left))]
        proposals = [{n: _suggest(t, n, s.space) for n in s.space.names} for t in asked]
        before = len(s.trials)
        trials = s.run(proposals)
        stalls = stalls + 1 if len(s.trials) == before else 0
        by_sig = {s._sig(t.params): t for t in trials}
        for t, p in zip(asked, proposals, strict=True):
            done = by_sig.get(s._sig(p))
            if done is None:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
                continue
            excess, cost = _key(done.train, s.tau_target)
            # TPE ranks values only: a large weight makes the scalar order BestWithTarget's lexicographic one
            study.tell(t, excess * 1e9 + cost)


def _suggest(trial: Any, name: str, space: SearchSpace) -> Any:
    spec = space.knobs[name]
    if not space._numeric(spec):
        choices = list(spec)
        return choices[trial.suggest_categorical(name, list(range(len(choices))))]
    low, high, kind = spec
    if kind == "int":
        return trial.suggest_int(name, int(low), int(high))
    return trial.suggest_float(name, float(low), float(high), log=kind == "log")


_STRATEGIES = {"grid": _grid, "random": _random, "coordinate": _coordinate, "adaptive": _adaptive,
               "optuna": _optuna}


def tune_knobs(space: SearchSpace, *, evaluate: Evaluate, train: Sequence[Any], validation: Sequence[Any],
               strategy: str = "adaptive", budget: int = 20, top_k: int = 3, tau_target: float = 0.05,
               seed: int = 0, base: ExecutionConfig | None = None, margin: float | str = 0.0,
               **options: Any) -> KnobTuning:
    """Configuration Tuner (§7.5): search knobs on training workloads, pick among the top-k on validation.

    Args:
        space: the knobs and their ranges.
        evaluate: ``evaluate(configs, workloads)``, returning a
            :class:`~sloctl.simulation.batch.BatchResult`, a ``(vr, cost)``
            pair of (configs, workloads) matrices, or a matrix of outcomes.
        train, validation: the forecast workloads of each split.
        strategy: one of :data:`STRATEGIES`.
        budget: distinct configurations run on the training workloads.
        top_k: ``k``, configurations re-run on validation.
        tau_target: ``τ`` of BestWithTarget.
        seed: seeds every random choice (same inputs and seed, same result).
        base: the configuration the knobs are applied to (spin-ups, other
            fields); default: one size-1 cluster and the default autoscaler.
        margin: the winner is BestWithTarget's at ``τ − margin`` on the
            validation means (never below 0); ``"spread"``: the margin is
            :func:`spread_margin` of the top ``k``'s validation runs. The
            search itself ranks at ``τ``.
        **options: strategy options — ``start`` (coordinate), ``batch_size``
            (adaptive, optuna), ``radius``, ``shrink``, ``patience`` (adaptive).

    Returns:
        :class:`KnobTuning`, trials in evaluation order.
    """
    space.validate()
    if strategy not in _STRATEGIES:
        raise ConfigError(f"The 'strategy' parameter of tune_knobs must be one of {', '.join(STRATEGIES)}, "
                          f"got {strategy!r}.")
    for name, value in (("budget", budget), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"The '{name}' parameter of tune_knobs must be an integer >= 1, got {value!r}.")
    if not train or not validation:
        raise ConfigError("The 'train' and 'validation' parameters of tune_knobs must each hold a workload.")
    base = base if base is not None else ExecutionConfig(autoscaler=AutoscalerConfig())
    search = _Search(space, evaluate, train, base, budget, tau_target)
    rng = np.random.default_rng(seed)
    if strategy in ("adaptive", "optuna"):
        options.setdefault("seed", seed)
        if strategy == "adaptive":
            options.setdefault("top_k", top_k)
    _STRATEGIES[strategy](search, rng, **options)
    top = search.ranked()[:top_k]
    vr, cost = _matrices(evaluate([t.config for t in top], validation), len(top))
    validated = list(zip(vr.mean(axis=1).tolist(), cost.mean(axis=1).tolist(), strict=True))
    for t, v in zip(top, validated, strict=True):
        t.validation = v
    kept = _margin(margin, vr, tau_target)
    winner = top[best_with_target(validated, tau_target - kept)]
    return KnobTuning(winner.config, dict(winner.params), winner.train, winner.validation, top, search.trials,
                      strategy, budget, kept, tau_target)


def _margin(margin: float | str, vr: np.ndarray, tau_target: float) -> float:
    if margin == "spread":
        value = spread_margin(vr)
    elif isinstance(margin, int | float) and not isinstance(margin, bool) and math.isfinite(margin) \
            and margin >= 0:
        value = float(margin)
    else:
        raise ConfigError(f"The 'margin' parameter of tune_knobs must be a number >= 0 or 'spread', "
                          f"got {margin!r}.")
    return min(value, tau_target)  # never aim below zero violations


def tune_policy(space: SearchSpace, *, evaluate: Evaluate, train: Sequence[Any], validation: Sequence[Any],
                sizes: Sequence[int], delta_s: float, base: ExecutionConfig | None = None,
                order: str = "knobs_first", strategy: str = "adaptive", budget: int = 20, top_k: int = 3,
                tau_target: float = 0.05, seed: int = 0, eta: int = 3, phi: int = 3, sigma_min_s: float = 0.0,
                tuner_options: Mapping[str, Any] | None = None, margin: float | str = 0.0,
                **schedule_options: Any) -> PolicyResult:
    """The Policy Tuner's two searches chained: knobs (§7.5) and scheduled spin-ups (§7.4).

    ``order="knobs_first"`` (default) tunes the knobs on ``base``, then
    schedules spin-ups on the winner; ``"schedule_first"`` schedules spin-ups
    on ``base`` and then tunes the knobs with that schedule fixed. ``evaluate``
    must return the scheduler's outcome matrix (timelines included), e.g.
    :func:`~sloctl.simulation.batch.simulate_batch` with its runner bound.
    ``margin`` is :func:`tune_knobs`'s; with ``knobs_first`` the spin-up
    schedule is then judged against the same ``τ − margin``.

    Returns:
        :class:`PolicyResult`; ``best_validation`` is the final configuration's
        validation (mean VR, mean cost), from the phase that ran last.
    """
    if order not in ("knobs_first", "schedule_first"):
        raise ConfigError(f"The 'order' parameter of tune_policy must be 'knobs_first' or 'schedule_first', "
                          f"got {order!r}.")
    base = base if base is not None else ExecutionConfig(autoscaler=AutoscalerConfig())
    tune_args = dict(evaluate=evaluate, train=train, validation=validation, strategy=strategy, budget=budget,
                     top_k=top_k, tau_target=tau_target, seed=seed, margin=margin, **(tuner_options or {}))
    sched_args = dict(evaluate=evaluate, train=train, validation=validation, sizes=sizes,
                      delta_s=delta_s, eta=eta, phi=phi, sigma_min_s=sigma_min_s, **schedule_options)
    if order == "knobs_first":
        tuning = tune_knobs(space, base=base, **tune_args)
        # the schedule is judged against the same target the knobs were picked against
        schedule = schedule_spinups([tuning.best], tau_target=tuning.target, **sched_args)
        return PolicyResult(schedule.best, schedule.best_validation, tuning, schedule, order)
    ahead = 0.0 if margin == "spread" else _margin(margin, np.zeros((1, 1)), tau_target)  # no spread measured yet
    schedule = schedule_spinups([base], tau_target=tau_target - ahead, **sched_args)
    tuning = tune_knobs(space, base=schedule.best, **tune_args)
    return PolicyResult(tuning.best, tuning.best_validation, tuning, schedule, order)

