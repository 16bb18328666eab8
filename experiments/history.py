"""Table 5 of AutoSLO (§8.7) in simulation: how much workload history the Policy Tuner needs.

For a real Redset instance, a target day and an SLO strictness ``κ``, the
execution configuration is tuned on ``H`` days of history (``H`` = 0, 1, 7,
30) and then graded on what really arrived that day:

* ``H = 0`` — nothing to forecast from: the reactive autoscaler alone.
* ``H > 0`` — a :class:`~sloctl.datasets.reservoir.Reservoir` holds only the
  ``H`` days before the target (hourly counts); the default ``decay``
  :class:`~sloctl.datasets.forecast.Forecaster` draws training and validation
  forecasts of the target day (with one day of history it falls back to the
  prior day, with seven to the same weekday a week back), and the Policy
  Tuner runs on them as §8.7 does: the Configuration Tuner
  (:func:`~sloctl.training.policy_tuner.tune_policy`: starting clusters and
  size, teardown timers) and then
  :func:`~sloctl.control.scheduler.schedule_spinups`, which adds scheduled
  spin-ups on top of the reactive autoscaler, every configuration simulated
  on those forecasts with :func:`~sloctl.simulation.batch.simulate_batch`
  (``tune_knobs=False``: spin-ups only).
* Grading replays the target day's real hourly counts (arrivals uniform
  within each hour, seeded; the same draw for every ``H`` and ``κ``) in the
  emulated warehouse. The forecasts a configuration was tuned on are never
  used to grade it.

Reactive layer. The Iconq+ autoscaler costs about 80 s per simulated day on
this machine (its router and size selector run the LSTM per query), far too
slow for the hundreds of simulations a tuning run needs. The reactive layer
here is therefore cheap and model-free: a packing router (first fit: the oldest
cluster below ``pack_n`` running queries per size unit, else the least
loaded one), a Queue@N spin-up trigger (§8.6's baseline) that adds one
smallest cluster when the ready clusters hold ``queue_n`` running queries
per size unit and nothing is starting, and the §6.2.1 teardown trigger.
Scheduled spin-ups are torn down by the same trigger once idle.

Re-graded (issue 17). By default the world that tunes is the world that
grades (one log calibrates both) and the reactive layer is the cheap one
above. With ``grade_log`` the configuration is still tuned in the world built
from ``log``, but graded in a world calibrated on the held-out ``grade_log``
whose service demand is drawn from that log's isolated executions
(:func:`~sloctl.simulation.emulator.calibrate` with ``demand="empirical"``);
with ``reactive="iconq"`` grading runs the plan under the Iconq+ Query Router
and the Autoscaler (Algorithms 2–3, :class:`IconqReactiveRunner`). Tuning
keeps the cheap reactive layer either way: the Iconq+ layer is too slow for
the tuning loop, so it enacts the plan only when it is graded.

Time compression. One hour of the day lasts ``hour_units`` mean isolated
latencies (of the calibrated world's templates on size 1). Counts are
scaled per instance so that the 95th percentile of the hourly counts in the
30 days before the instance's earliest target day offers ``peak_load`` times
what one size-1 cluster serves; a day then holds roughly 1–3 k queries.
Spin-up delay, billing minimum and the teardown timers are in the same unit.
Costs are reported in size-1 cluster-hours of the compressed day.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sloctl.control.autoscaler import AutoscalerConfig, QueueScaler, RelativeAutoscalerSettings, autoscaler_for
from sloctl.control.placement import PackingRouter
from sloctl.control.router import IconqRouter, Query, RouterGuard
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinups, schedule_spinups
from sloctl.core.kinds import RouterKind
from sloctl.datasets.forecast import Forecaster
from sloctl.datasets.querylog import read_log, template_table
from sloctl.datasets.reservoir import Reservoir
from sloctl.experiments.warehouse import ScalingExperimentConfig, mean_delta, scaling_setup
from sloctl.models.drift import DriftCalibratedPredictor, DriftCalibration
from sloctl.models.online import OnlinePredictor, one_inference_thread
from sloctl.registry.bundles import load_predictor
from sloctl.registry.routers import build_router
from sloctl.simulation.batch import CellResult, SimulationPool, cell_seed, explain_of, timeline_of
from sloctl.simulation.emulator import calibrate
from sloctl.simulation.engine import WarehouseSimulator
from sloctl.training.policy_tuner import SearchSpace, tune_policy

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.core.config import RouterSection
    from sloctl.simulation.emulator import WarehouseEmulator

__all__ = [
    "HistoryExperimentConfig",
    "HistoryRunner",
    "IconqReactiveRunner",
    "iconq_reactive_runner",
    "history_experiment",
    "pick_instances",
    "pick_target_days",
    "run_table5",
]

DEFAULT_LOG = Path(__file__).resolve().parents[1] / "reports" / "bench_latency_log.parquet"


@dataclass(frozen=True)
class HistoryExperimentConfig:
    """The Table 5 grid and its scaling.

    Attributes:
        histories_days: ``H`` values; 0 means the reactive autoscaler alone.
        kappas: SLO multipliers (SLO = ``κ ×`` the template's largest isolated
            latency on size 1).
        n_target_days: target days per instance (:func:`pick_target_days`).
        hour_units: one hour of the day, in mean isolated latencies.
        peak_load: offered load of the reference hour (95th percentile of the
            history's hourly counts) on one size-1 cluster.
        n_train, n_validation: forecast workloads per split.
        sizes: ``S``, sizes a scheduled spin-up may have.
        tau_target: ``τ`` of BestWithTarget.
        eta, phi: ``η`` rounds and ``φ`` attempts per round.
        sigma_min_hours, merge_gap_hours: spacing of spin-ups and merging of
            congestion epochs, in hours of the day.
        spinup_delay_units, minimum_units, t_idle_units, t_min_lifetime_units:
            spin-up delay, billing minimum and teardown timers, in mean
            isolated latencies.
        queue_n: running queries per size unit of the ready clusters that
            fire the Queue@N spin-up trigger.
        pack_n: running queries per size unit below which the packing router
            still sends work to an older cluster.
        max_clusters: pool limit.
        max_units: size units the pool may hold at once (the cluster core's,
            for a plan that must run without oversubscribing it); ``None``:
            no limit. Every approach honours it: the tuner searches only
            starting pools that fit, the Autoscaler, Queue@N and scheduled
            spin-ups add no cluster past it.
        policy: forecasting policy.
        grading_draws: placements of the actual day's arrivals within their
            hours; VR and cost are their means.
        tune_knobs: with history, run the whole Policy Tuner as §8.7 does:
            the Configuration Tuner first (starting clusters and size, the
            teardown timers; ``knob_budget`` configurations, adaptive), then
            the Spin-up Scheduler on its winner. ``False``: spin-ups only.
        knob_budget: configurations the Configuration Tuner may try.
    """

    histories_days: tuple[int, ...] = (0, 1, 7, 30)
    kappas: tuple[float, ...] = (2.0, 4.0)
    n_target_days: int = 2
    hour_units: float = 100.0
    peak_load: float = 1.5
    n_train: int = 5
    n_validation: int = 3
    sizes: tuple[int, ...] = (1, 2)
    tau_target: float = 0.05
    eta: int = 3
    phi: int = 3
    sigma_min_hours: float = 0.5
    merge_gap_hours: float = 0.25
    spinup_delay_units: float = 10.0
    minimum_units: float = 5.0
    t_idle_units: float = 10.0
    t_min_lifetime_units: float = 25.0
    queue_n: int = 4
    pack_n: int = 2
    max_clusters: int = 4
    max_units: int | None = None
    policy: str = "decay"
    grading_draws: int = 3
    tune_knobs: bool = True
    knob_budget: int = 12

    def quick(self) -> HistoryExperimentConfig:
        """A small variant for tests and smoke runs."""
        return dataclasses.replace(self, n_train=2, n_validation=1, eta=1, phi=2, hour_units=20.0)


# -- the reactive layer --------------------------------------------------------------------------------------

@dataclass(eq=False)
class HistoryRunner:
    """A SimulateBatch runner: packing router, Queue@N autoscaler and the configuration's schedule.

    ``config.autoscaler`` ``None`` runs the schedule alone (no reactive scaling).
    """

    world: WarehouseEmulator
    minimum_s: float
    queue_n: int = 4
    pack_n: int = 1
    spinup_delay_s: float = 300.0
    max_clusters: int = 4
    max_units: int | None = None

    def __call__(self, config: ExecutionConfig, queries: Sequence[Query], seed: int) -> CellResult:
        config.check_fits(self.max_units)
        knobs = config.autoscaler
        if knobs is not None and self.max_units is not None:
            knobs = dataclasses.replace(knobs, max_units=self.max_units)
        inner = QueueScaler(knobs, self.queue_n) if knobs is not None else None
        scheduled = ScheduledSpinups(config.spinups, inner, spinup_delay_s=self.spinup_delay_s,
                                     max_clusters=self.max_clusters, max_units=self.max_units)
        clusters = [(f"c{i}-s{s}", s) for i, s in enumerate(config.start_sizes)]
        sim = WarehouseSimulator(self.world, clusters, PackingRouter(self.pack_n), minimum_s=self.minimum_s,
                                 seed=seed, autoscaler=scheduled)
        out = sim.run(list(queries))
        return CellResult(out.violation_rate, out.cost, timeline_of(out, len(clusters)), explain_of(out))


_PREDICTORS: dict[str, Any] = {}


def _predictor(folder: str) -> Any:
    # once per process: a runner travels to pool workers as a folder name, never as a model
    if folder not in _PREDICTORS:
        _PREDICTORS[folder] = load_predictor(folder)
    return _PREDICTORS[folder]


@dataclass(eq=False)
class IconqReactiveRunner:
    """A SimulateBatch runner that enacts a plan under AutoSLO's reactive layer (§5, §6).

    The configuration's starting clusters and scheduled spin-ups
    (:class:`~sloctl.control.scheduler.ScheduledSpinups`) wrap the Autoscaler:
    Algorithm 2's spin-up trigger, Algorithm 3's Spinup Size Selector adding
    clusters (mode ``add``) and the §6.2.1 teardown with the configuration's
    tuned ``T_idle`` and ``T_min_lifetime``; the Iconq+ Query Router places
    every query. The router's settings are resolved once, by
    :func:`~sloctl.registry.routers.build_router` (see
    :func:`iconq_reactive_runner`); the runner holds plain data and a model
    folder, so that it pickles to pool workers.

    Attributes:
        world: the emulated warehouse that grades.
        predictor_dir: the Iconq+ bundle folder.
        table: the template table routed with.
        slo_margin, cost_tolerance, guard, violation_spread: the router's settings.
        minimum_s: billing minimum ``m``.
        window_s, theta, tau_trigger, mu, tau_target, candidate_sizes: the
            Autoscaler's ``w``, ``θ``, ``τ_trigger``, ``μ``, ``τ`` and sizes;
            they replace the configuration's (the Policy Tuner tunes the
            teardown timers and the schedule, not these).
        spinup_delay_s, max_clusters: ``δ`` and the pool limit.
        max_units: size units the pool may hold (``None``: no limit); a
            plan whose starting clusters exceed it is refused.
        sizes_from_plan: the Spinup Size Selector chooses among the plan's
            own ``candidate_sizes`` (those the Policy Tuner planned with)
            instead of ``candidate_sizes``.
        drift: calibrate predictions against completions online
            (:mod:`sloctl.models.drift`); None: trust the model as trained.
        tuned_knobs: the configuration's own ``w``, ``θ``, ``τ_trigger``,
            ``μ`` and ``τ`` run (those a Policy Tuner searching with this
            runner chose); ``False``: this runner's fields replace them (a
            plan tuned with another reactive layer).
    """

    world: WarehouseEmulator
    predictor_dir: str
    table: pd.DataFrame
    slo_margin: float
    cost_tolerance: float
    minimum_s: float
    window_s: float
    spinup_delay_s: float
    guard: RouterGuard | None = None
    violation_spread: float = 0.0
    theta: int = 10
    tau_trigger: float = 0.1
    mu: int = 20
    tau_target: float = 0.1
    candidate_sizes: tuple[int, ...] = (1, 2)
    max_clusters: int = 4
    max_units: int | None = None
    sizes_from_plan: bool = False
    drift: DriftCalibration | None = None
    tuned_knobs: bool = False

    def make_router(self, model: Any) -> IconqRouter:
        """An Iconq+ router over ``model`` (the live one, or a fork for the size selector's what-if runs)."""
        return IconqRouter(model, slo_margin=self.slo_margin, cost_tolerance=self.cost_tolerance, guard=self.guard,
                           violation_spread=self.violation_spread)

    def __call__(self, config: ExecutionConfig, queries: Sequence[Query], seed: int) -> CellResult:
        with one_inference_thread():
            return self._run(config, queries, seed)

    def _run(self, config: ExecutionConfig, queries: Sequence[Query], seed: int) -> CellResult:
        config.check_fits(self.max_units)
        model: Any = OnlinePredictor(_predictor(self.predictor_dir), self.table)
        if self.drift is not None:  # a fresh calibration per simulated day
            model = DriftCalibratedPredictor(model, self.drift.fresh())
        router = self.make_router(model)
        inner = None
        if config.autoscaler is not None:
            sizes = config.autoscaler.candidate_sizes if self.sizes_from_plan else self.candidate_sizes
            knobs = dataclasses.replace(config.autoscaler, candidate_sizes=tuple(sizes),
                                        spinup_delay_s=self.spinup_delay_s, max_clusters=self.max_clusters,
                                        max_units=self.max_units)
            if not self.tuned_knobs:
                knobs = dataclasses.replace(knobs, window_s=self.window_s, theta=self.theta,
                                            tau_trigger=self.tau_trigger, mu=self.mu, tau_target=self.tau_target)
            inner = autoscaler_for(knobs, router, self.make_router, minimum_s=self.minimum_s)
        scheduled = ScheduledSpinups(config.spinups, inner, spinup_delay_s=self.spinup_delay_s,
                                     max_clusters=self.max_clusters, max_units=self.max_units)
        clusters = [(f"c{i}-s{s}", s) for i, s in enumerate(config.start_sizes)]
        sim = WarehouseSimulator(self.world, clusters, router, minimum_s=self.minimum_s, seed=seed,
                                 autoscaler=scheduled)
        out = sim.run(list(queries))
        self.drift_state_ = model.calibration.state() if self.drift is not None else None  # the day's last word
        return CellResult(out.violation_rate, out.cost, timeline_of(out, len(clusters)), explain_of(out))


def iconq_reactive_runner(world: WarehouseEmulator, model_dir: str | Path, log: pd.DataFrame, *, mean_iso: float,
                          minimum_s: float, spinup_delay_s: float, tau_target: float, sizes: Sequence[int],
                          max_clusters: int, router: RouterSection | None = None,
                          sizes_from_plan: bool = False, drift: DriftCalibration | None = None,
                          tuned_knobs: bool = False, max_units: int | None = None) -> IconqReactiveRunner:
    """The :class:`IconqReactiveRunner` for a model bundle, its router settings resolved by ``build_router``.

    Args:
        world: the world that grades.
        model_dir: the Iconq+ bundle folder (``save_predictor``).
        log: the training log: its template table is routed with, and it
            calibrates the SLO margin of a bundle that carries none.
        mean_iso: ℓ̄, the time unit the Autoscaler's window (20 ℓ̄, the
            :class:`~sloctl.control.autoscaler.RelativeAutoscalerSettings`
            default) is scaled by.
        minimum_s, spinup_delay_s, max_clusters: billing minimum, ``δ``, pool limit.
        tau_target: ``τ`` of the Spinup Size Selector.
        sizes: sizes the selector may add.
        router: the ``router:`` settings (default: the defaults).
        sizes_from_plan: add clusters of the plan's own candidate sizes
            (those the Policy Tuner planned with), not of ``sizes``.
        drift: the online drift calibration's settings (None: off).
        tuned_knobs: run each configuration's own Autoscaler knobs
            (:attr:`IconqReactiveRunner.tuned_knobs`).
        max_units: size units the pool may hold (``None``: no limit).
    """
    from sloctl.core.config import RouterSection

    table = template_table(log)
    built = build_router(_predictor(str(model_dir)), router or RouterSection(), templates=table, log=log)
    if built.kind != RouterKind.ICONQ:
        raise ValueError(f"The 'model_dir' parameter must hold an Iconq+ model with a template table, got a "
                         f"{built.kind} router from {model_dir}.")
    relative = RelativeAutoscalerSettings()
    return IconqReactiveRunner(
        world, str(model_dir), table, built.slo_margin, built.cost_tolerance, minimum_s,
        relative.window_s * mean_iso, spinup_delay_s, guard=built.guard, violation_spread=built.violation_spread,
        theta=relative.theta, tau_trigger=relative.tau_trigger, mu=relative.mu, tau_target=tau_target,
        candidate_sizes=tuple(sizes), max_clusters=max_clusters, max_units=max_units,
        sizes_from_plan=sizes_from_plan, drift=drift, tuned_knobs=tuned_knobs)


# -- instances, days and workloads ---------------------------------------------------------------------------

def _hourly_frame(source: str | Path | pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    frame = source if isinstance(source, pd.DataFrame) else pd.read_parquet(source)
    for column in ("instance_id", "timestamp", "query_count"):
        if column not in frame.columns:
            raise ValueError(f"The 'hourly' parameter must have a '{column}' column, got {list(frame.columns)}.")
    return frame.assign(ts=pd.to_datetime(frame["timestamp"]).dt.floor("h"))


def _day_matrix(rows: pd.DataFrame) -> tuple[dt.date, np.ndarray]:
    """(first date, counts of shape (days, 24)); missing hours are 0."""
    day0 = rows["ts"].min().normalize()
    days = (rows["ts"].max().normalize() - day0).days + 1
    out = np.zeros(days * 24)
    hours = ((rows["ts"] - day0).dt.total_seconds() // 3600).to_numpy(dtype=int)
    np.add.at(out, hours, rows["query_count"].to_numpy(dtype=float))
    return day0.date(), out.reshape(days, 24)


def pick_target_days(rows: pd.DataFrame, n: int = 2, min_history_days: int = 31, min_gap_days: int = 28
                     ) -> list[str]:
    """Target days of one instance: complete weekdays with queries and ``min_history_days`` before them.

    The first is the latest such day; each further one is the latest at least
    ``min_gap_days`` before the previous (so that, as in the paper, the recent
    histories barely overlap; ``min_gap_days`` ≥ the history length keeps
    them apart), or else the latest earlier one.
    """
    day0, matrix = _day_matrix(rows)
    eligible = [day0 + dt.timedelta(days=d) for d in range(min_history_days, len(matrix) - 1)  # last day: partial
                if matrix[d].sum() > 0 and matrix[d - 1].sum() > 0
                and (day0 + dt.timedelta(days=d)).weekday() < 5]
    picked: list[dt.date] = []
    for _ in range(n):
        if not eligible:
            break
        far = [d for d in eligible if picked and d <= picked[-1] - dt.timedelta(days=min_gap_days)]
        day = max(far) if far else max(eligible)
        picked.append(day)
        eligible = [d for d in eligible if d < day]
    return [d.isoformat() for d in picked]


def pick_instances(hourly: str | Path | pd.DataFrame, n: int = 3, min_history_days: int = 31,
                   n_target_days: int = 2) -> list[int]:
    """The ``n`` instances with the most non-empty hours among those with enough history for every target day."""
    frame = _hourly_frame(hourly)
    scored = []
    for instance, rows in frame.groupby("instance_id", sort=True):
        if len(pick_target_days(rows, n_target_days, min_history_days)) == n_target_days:
            scored.append((-int((rows["query_count"] > 0).sum()), int(instance)))
    return [i for _, i in sorted(scored)[:n]]


def _stochastic_round(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return (np.floor(x) + (rng.random(len(x)) < x - np.floor(x))).astype(int)


def _compress(pairs: Sequence[tuple[float, Any]], scale: float, hour_s: float, templates: Sequence[str],
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(arrival_s, template index) of a scaled, compressed day from (second of the day, _) pairs.

    Hour ``h`` keeps a stochastically rounded ``scale ×`` its count: a random
    subset of its offsets, topped up with uniform ones when ``scale > 1``.
    Templates are drawn uniformly from the world's (the contour has none).
    """
    seconds = np.sort(np.asarray([p[0] for p in pairs], dtype=float))
    hours = np.minimum((seconds // 3600).astype(int), 23)
    per_hour = np.bincount(hours, minlength=24)
    keep = _stochastic_round(per_hour * scale, rng)
    out = []
    for h in range(24):
        mine = seconds[hours == h] - 3600.0 * h
        if keep[h] <= len(mine):
            chosen = rng.choice(mine, size=keep[h], replace=False)
        else:
            chosen = np.concatenate([mine, rng.uniform(0.0, 3600.0, keep[h] - len(mine))])
        out.append((h + np.sort(chosen) / 3600.0) * hour_s)
    arrival = np.concatenate(out) if out else np.zeros(0)
    return arrival, rng.integers(0, len(templates), size=len(arrival))


def _actual_pairs(counts: np.ndarray, rng: np.random.Generator) -> list[tuple[float, str]]:
    """The real day: each hour's count, arrivals uniform within the hour."""
    return [(h * 3600.0 + s, "all") for h, c in enumerate(counts.astype(int))
            for s in rng.uniform(0.0, 3600.0, c)]


def _queries(day: tuple[np.ndarray, np.ndarray], templates: Sequence[str], slo_ref: dict[str, float],
             kappa: float) -> list[Query]:
    arrival, which = day
    return [Query(i, templates[k], float(a), kappa * slo_ref[templates[k]])
            for i, (a, k) in enumerate(zip(arrival, which, strict=True))]


def _fingerprint(day: tuple[np.ndarray, np.ndarray]) -> str:
    return hashlib.sha1(np.round(day[0], 9).tobytes() + day[1].astype(np.int64).tobytes()).hexdigest()[:16]


# -- one cell of the table -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Cell:
    instance: int
    day: str
    kappa: float
    history_days: int
    seed: int


@dataclass(frozen=True, eq=False)
class _CellSetup:
    """What tuning and grading one cell share: the compressed day's clock, the actual arrivals, the cheap layer.

    Attributes:
        hour_s: one hour of the compressed day.
        target, day0, t: the target date, the instance's first date, and ``target - day0`` in days.
        matrix: the instance's hourly counts, shape (days, 24).
        day_seed: seed prefix of everything drawn for this (instance, day).
        actuals: ``grading_draws`` placements of the actual day's arrivals.
        autoscaler: the reactive knobs before tuning.
        runner: the cheap reactive layer (:class:`HistoryRunner`) in the tuning world.
        base: the configuration without history.
    """

    hour_s: float
    target: dt.date
    day0: dt.date
    t: int
    matrix: np.ndarray
    day_seed: tuple[int, ...]
    actuals: list[tuple[np.ndarray, np.ndarray]]
    autoscaler: AutoscalerConfig
    runner: HistoryRunner
    base: ExecutionConfig


def _cell_setup(cell: _Cell, rows: pd.DataFrame, world: WarehouseEmulator, templates: list[str], mean_iso: float,
                scale: float, cfg: HistoryExperimentConfig) -> _CellSetup:
    hour_s = cfg.hour_units * mean_iso
    target = dt.date.fromisoformat(cell.day)
    day0, matrix = _day_matrix(rows)
    t = (target - day0).days
    day_seed = (cell.seed, cell.instance, target.toordinal())
    actuals = [_compress(_actual_pairs(matrix[t], np.random.default_rng([*day_seed, 0, d])), scale, hour_s,
                         templates, np.random.default_rng([*day_seed, 1, d])) for d in range(cfg.grading_draws)]
    autoscaler = AutoscalerConfig(
        t_idle_s=cfg.t_idle_units * mean_iso, t_min_lifetime_s=cfg.t_min_lifetime_units * mean_iso,
        candidate_sizes=(min(cfg.sizes),), spinup_delay_s=cfg.spinup_delay_units * mean_iso,
        max_clusters=cfg.max_clusters, max_units=cfg.max_units)
    runner = HistoryRunner(world, cfg.minimum_units * mean_iso, cfg.queue_n, cfg.pack_n,
                           autoscaler.spinup_delay_s, cfg.max_clusters, cfg.max_units)
    return _CellSetup(hour_s, target, day0, t, matrix, day_seed, actuals, autoscaler, runner,
                      ExecutionConfig(autoscaler=autoscaler))


def _history_reservoir(folder: str | Path, cell: _Cell, setup: _CellSetup) -> Reservoir:
    """A reservoir holding only the ``H`` days before the target (hourly counts)."""
    import pandas as pd

    reservoir = Reservoir(Path(folder) / "reservoir.sqlite", seed=cell.seed)
    lo = setup.t - cell.history_days
    history = [{"timestamp": dt.datetime.combine(setup.day0 + dt.timedelta(days=d), dt.time(h)),
                "query_count": int(setup.matrix[d, h])} for d in range(max(lo, 0), setup.t) for h in range(24)]
    reservoir.add_hourly_counts(pd.DataFrame(history))
    return reservoir


def _tune_on_history(cell: _Cell, setup: _CellSetup, slo_ref: dict[str, float], templates: list[str],
                     mean_iso: float, scale: float, cfg: HistoryExperimentConfig, *, runner: Any = None,
                     base: ExecutionConfig | None = None, knobs: dict[str, Any] | None = None, workers: int = 1,
                     margin: float | str = 0.0, workloads: list[list[Query]] | None = None,
                     pool: SimulationPool | None = None) -> tuple[ExecutionConfig, dict[str, Any]]:
    """The Policy Tuner on ``H > 0`` days of forecasts (§8.7): the chosen configuration and what to report.

    Args:
        runner: the reactive layer every configuration is simulated with
            (default: ``setup.runner``, packing + Queue@N).
        base: the configuration the knobs are applied to (default ``setup.base``).
        knobs: search-space entries added to the starting clusters and the
            teardown timers (``tune_knobs``).
        workers: SimulateBatch processes.
        margin: :func:`~sloctl.training.policy_tuner.tune_knobs`'s margin below ``τ``.
        workloads: tune on these (train then validation) instead of forecasts
            of the history (the oracle: the graded day itself).
        pool: simulate on this pool (its runner, not ``runner``); default: a
            pool of ``workers`` processes for this call.
    """
    if pool is None:
        with SimulationPool(runner if runner is not None else setup.runner, workers) as own:
            return _tune_on_history(cell, setup, slo_ref, templates, mean_iso, scale, cfg, base=base, knobs=knobs,
                                    margin=margin, workloads=workloads, pool=own)
    hour_s, autoscaler = setup.hour_s, setup.autoscaler
    base = base if base is not None else setup.base
    forecasts = forecast_days(cell, setup, templates, scale, cfg) if workloads is None else []
    if workloads is None:
        workloads = [_queries(f, templates, slo_ref, cell.kappa) for f in forecasts]
    n_train = cfg.n_train if len(workloads) > cfg.n_train else max(len(workloads) - 1, 1)
    evaluate = partial(pool.simulate, seed=cell_seed(cell.seed, 7))
    schedule_args = dict(evaluate=evaluate, train=workloads[:n_train], validation=workloads[n_train:] or workloads,
                         sizes=cfg.sizes, tau_target=cfg.tau_target, delta_s=autoscaler.spinup_delay_s,
                         eta=cfg.eta, phi=cfg.phi, sigma_min_s=cfg.sigma_min_hours * hour_s,
                         merge_gap_s=cfg.merge_gap_hours * hour_s)
    row: dict[str, Any] = {}
    started = time.perf_counter()
    if cfg.tune_knobs:
        space = SearchSpace({
            "start_sizes": starting_pools(cfg.sizes, cfg.max_units),
            "t_idle_s": (0.2 * autoscaler.t_idle_s, 5.0 * autoscaler.t_idle_s, "log"),
            "t_min_lifetime_s": (0.2 * autoscaler.t_min_lifetime_s, 5.0 * autoscaler.t_min_lifetime_s, "log"),
            **(knobs or {})})
        policy = tune_policy(space, base=base, strategy="adaptive", budget=cfg.knob_budget, seed=cell.seed,
                             margin=margin, **schedule_args)
        result, chosen = policy.schedule, policy.best
        row["knobs"] = {"start_sizes": list(chosen.start_sizes),
                        "t_idle_units": chosen.autoscaler.t_idle_s / mean_iso,
                        "t_min_lifetime_units": chosen.autoscaler.t_min_lifetime_s / mean_iso}
        for name in (knobs or {}):
            value = getattr(chosen.autoscaler, name)
            row["knobs"][name.removesuffix("_s") + "_units" if name.endswith("_s") else name] = (
                value / mean_iso if name.endswith("_s") else value)
        row["margin"] = policy.tuning.margin
        row["simulations"] = result.simulations + len(policy.tuning.trials) * n_train \
            + len(policy.tuning.top) * len(schedule_args["validation"])
    else:
        result = schedule_spinups([base], **schedule_args)
        chosen = result.best
        row["simulations"] = result.simulations
    row.update({"validation_vr": result.best_validation[0], "validation_cost": result.best_validation[1] / hour_s,
                "tuner_wall_s": time.perf_counter() - started})
    if forecasts:
        forecast_hourly = np.mean([np.bincount(np.minimum((f[0] // hour_s).astype(int), 23), minlength=24)
                                   for f in forecasts], axis=0)
        actual_hourly = np.bincount(np.minimum((setup.actuals[0][0] // hour_s).astype(int), 23), minlength=24)
        row.update({
            "forecast_queries": float(np.mean([len(f[0]) for f in forecasts])),
            "forecast_wape": float(np.abs(forecast_hourly - actual_hourly).sum() / max(actual_hourly.sum(), 1)),
            "forecast_fingerprints": [_fingerprint(f) for f in forecasts]})
    return chosen, row


def starting_pools(sizes: Sequence[int], max_units: int | None = None) -> list[tuple[int, ...]]:
    """The starting pools the Configuration Tuner tries: one or two clusters of one size, those that fit.

    Raises:
        ValueError: not even one cluster of the smallest size fits ``max_units``.
    """
    pools = [(int(s),) * n for n in (1, 2) for s in sorted(sizes)]
    fitting = [p for p in pools if max_units is None or sum(p) <= max_units]
    if not fitting:
        raise ValueError(f"The 'max_units' setting ({max_units}) must fit one cluster of the smallest size "
                         f"{min(sizes)}, got none that fits.")
    return fitting


def forecast_days(cell: _Cell, setup: _CellSetup, templates: list[str], scale: float,
                  cfg: HistoryExperimentConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``n_train + n_validation`` forecast days the Policy Tuner plans on (arrivals and templates)."""
    forecasts = []
    with tempfile.TemporaryDirectory() as folder:
        forecaster = Forecaster(_history_reservoir(folder, cell, setup), cfg.policy, seed=cell.seed)
        for j in range(cfg.n_train + cfg.n_validation):
            pairs = forecaster.workload(setup.target, seed=cell.seed * 1000 + j)
            forecasts.append(_compress(pairs, scale, setup.hour_s, templates,
                                       np.random.default_rng([*setup.day_seed, 100 + j])))
    return forecasts


def _run_cell(cell: _Cell, rows: pd.DataFrame, world: WarehouseEmulator, slo_ref: dict[str, float],
              templates: list[str], mean_iso: float, scale: float, cfg: HistoryExperimentConfig,
              grade_runner: Any = None) -> dict[str, Any]:
    """Tune on ``H`` days of forecasts (``H > 0``), then grade on the actual day.

    ``grade_runner`` grades instead of the tuning world's cheap layer (the
    re-graded Table 5: another world, or the Iconq+ reactive layer).
    """
    started = time.perf_counter()
    setup = _cell_setup(cell, rows, world, templates, mean_iso, scale, cfg)
    row: dict[str, Any] = {"instance": cell.instance, "day": cell.day, "kappa": cell.kappa,
                           "history_days": cell.history_days,
                           "actual_queries": float(np.mean([len(a[0]) for a in setup.actuals])),
                           "actual_fingerprints": [_fingerprint(a) for a in setup.actuals]}
    chosen = setup.base
    if cell.history_days > 0:
        chosen, tuned = _tune_on_history(cell, setup, slo_ref, templates, mean_iso, scale, cfg)
        row.update(tuned)
    grader = grade_runner if grade_runner is not None else setup.runner
    graded = [grader(chosen, _queries(a, templates, slo_ref, cell.kappa), cell_seed(cell.seed, 9 + d))
              for d, a in enumerate(setup.actuals)]
    row.update({"vr": float(np.mean([g.vr for g in graded])),
                "cost": float(np.mean([g.cost for g in graded])) / setup.hour_s,
                "spinups": [[s.time_s / setup.hour_s, s.size] for s in chosen.spinups],
                "wall_s": time.perf_counter() - started})
    return row


# -- the experiment ------------------------------------------------------------------------------------------

def _scale(rows: pd.DataFrame, first_target: str, cfg: HistoryExperimentConfig) -> float:
    """Count scale of an instance, from the 30 days before its earliest target day only."""
    day0, matrix = _day_matrix(rows)
    t = (dt.date.fromisoformat(first_target) - day0).days
    ref = float(np.percentile(matrix[max(t - 30, 0):t], 95))
    return cfg.peak_load * cfg.hour_units / max(ref, 1.0)


def _summary(rows: list[dict[str, Any]], histories: Sequence[int]) -> dict[str, Any]:

    by_key: dict[tuple, dict[str, dict[str, float]]] = {}
    for r in rows:
        by_key.setdefault((r["instance"], r["day"], r["kappa"]), {})[f"H={r['history_days']}"] = {
            "vr": r["vr"], "cost": r["cost"]}
    complete = [v for v in by_key.values() if len(v) == len(histories)]
    if not complete or 0 not in histories:
        return {}
    delta = mean_delta(complete, "H=0")
    means = {h: {m: float(np.mean([v[f"H={h}"][m] for v in complete])) for m in ("vr", "cost")}
             for h in histories}
    return {"mean_delta_vs_H0": delta, "mean": {f"H={h}": m for h, m in means.items()},
            "scenarios": len(complete)}


def log_data_hash(log: pd.DataFrame) -> str:
    """SHA-256 of a query log's rows (not its file): two copies of one log hash alike whatever their file names."""
    import pandas as pd

    rows = pd.util.hash_pandas_object(log.reset_index(drop=True), index=False).to_numpy()
    columns = "\x1f".join(map(str, log.columns)).encode()
    return hashlib.sha256(columns + rows.tobytes()).hexdigest()


def grading_world(grade_log: pd.DataFrame, templates: Sequence[str], sizes: Sequence[int], *, seed: int = 0
                  ) -> tuple[WarehouseEmulator, Any, list[str]]:
    """The held-out world that grades: calibrated on ``grade_log``, service demand drawn from its isolated runs.

    Returns:
        The world, its calibration report, and the templates of ``templates``
        it measured on every size of ``sizes`` (the workload is drawn from
        those only, so that tuning and grading see the same templates).
    """
    world, report = calibrate(grade_log, seed=seed, demand="empirical")
    kept = [t for t in templates if all((t, int(s)) in world.isolated_s for s in sizes)]
    if not kept:
        raise ValueError(f"The 'grade_log' parameter must hold isolated runs of the training log's templates on "
                         f"every size {list(sizes)}, got none in common (its sizes: {list(world.sizes)}).")
    return world, report, kept


def history_experiment(hourly: str | Path | pd.DataFrame, log: pd.DataFrame, *,
                       instances: Sequence[int] | None = None, n_instances: int = 3,
                       config: HistoryExperimentConfig | None = None, workers: int | None = None,
                       seed: int = 0, quick: bool = False, grade_log: pd.DataFrame | None = None,
                       reactive: str = "queue", model_dir: str | Path | None = None,
                       router: RouterSection | None = None,
                       on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the Table 5 grid on Redset hourly contours; returns a JSON-able dict.

    ``on_progress(done, total)`` is called as each (instance, day, κ, history) cell finishes.

    Args:
        hourly: Redset hourly layout (``instance_id``, ``timestamp``, ``query_count``).
        log: query log the emulated world is calibrated on (docs/querylog.md).
        instances: instance ids (``None``: :func:`pick_instances` picks ``n_instances``).
        n_instances: how many to pick when ``instances`` is ``None``.
        config: the grid and scaling (``quick`` shrinks it, see
            :meth:`HistoryExperimentConfig.quick`).
        workers: processes over table cells (default: all cores); 1 runs inline.
        seed: seed of forecasts, actual-day arrivals and service times.
        grade_log: a held-out log (neither the model nor the tuner saw it);
            grade in the world calibrated on it (:func:`grading_world`)
            instead of the tuning world. ``None``: tune and grade in one world.
        reactive: the reactive layer that grades: ``"queue"`` (packing
            router + Queue@N, as the tuner plans with) or ``"iconq"``
            (:class:`IconqReactiveRunner`; needs ``model_dir``).
        model_dir: Iconq+ bundle folder for ``reactive="iconq"``.
        router: the ``router:`` settings of the Iconq+ router.

    Returns:
        ``{"rows": [one per (instance, day, κ, H)], "summary": {"mean_delta_vs_H0":
        {"H=1": {"vr", "cost", ...}}, ...}, "instances", "days", "scale", "config", "wall_s"}``.
        ``vr`` is the actual day's violation rate; ``cost`` is in size-1
        cluster-hours of the compressed day. Re-graded runs (``grade_log`` or
        ``reactive="iconq"``) add ``"world"``: which log tuned, which graded,
        and which reactive layer enacted the plan.
    """
    if reactive not in ("queue", "iconq"):
        raise ValueError(f"The 'reactive' parameter must be 'queue' or 'iconq', got {reactive!r}.")
    if reactive == "iconq" and model_dir is None:
        raise ValueError("The 'model_dir' parameter must name an Iconq+ bundle folder with reactive='iconq', "
                         "got None.")

    started = time.perf_counter()
    cfg = config or HistoryExperimentConfig()
    if quick:
        cfg = cfg.quick()
    min_history = max(max(cfg.histories_days), 1) + 1
    frame = _hourly_frame(hourly)
    if instances is None:
        instances = pick_instances(frame, n_instances, min_history, cfg.n_target_days)
    world, report, slo_ref, templates, mean_iso, _ = scaling_setup(
        log, ScalingExperimentConfig(start_sizes=(1,), candidate_sizes=tuple(cfg.sizes), seed=seed))
    grade_runner, world_doc = None, None
    if grade_log is not None or reactive != "queue":
        grade_world, grade_report = world, report
        if grade_log is not None:
            grade_world, grade_report, templates = grading_world(grade_log, templates, cfg.sizes, seed=seed)
        if reactive == "iconq":
            grade_runner = iconq_reactive_runner(
                grade_world, model_dir, log, mean_iso=mean_iso, minimum_s=cfg.minimum_units * mean_iso,
                spinup_delay_s=cfg.spinup_delay_units * mean_iso, tau_target=cfg.tau_target, sizes=cfg.sizes,
                max_clusters=cfg.max_clusters, router=router)
        else:
            grade_runner = HistoryRunner(grade_world, cfg.minimum_units * mean_iso, cfg.queue_n, cfg.pack_n,
                                         cfg.spinup_delay_units * mean_iso, cfg.max_clusters)
        world_doc = {
            "tuned_in": {"log_sha256": log_data_hash(log), "demand": world.demand,
                         "reactive": "packing router + Queue@N + teardown"},
            "graded_in": {"log_sha256": log_data_hash(grade_log if grade_log is not None else log),
                          "held_out": grade_log is not None, "demand": grade_world.demand,
                          "alpha": {str(k): v for k, v in grade_report.alpha.items()},
                          "reactive": ("Iconq+ router + Autoscaler (Algorithms 2-3, mode add) + teardown"
                                       if reactive == "iconq" else "packing router + Queue@N + teardown")},
            "model_dir": None if model_dir is None else str(model_dir),
            "templates": len(templates)}
    cells, args, days, scales = [], {}, {}, {}
    for instance in instances:
        rows = frame[frame["instance_id"] == instance]
        if rows.empty:
            raise ValueError(f"The 'instances' parameter must name instance_id values in the frame, got {instance!r}.")
        days[int(instance)] = pick_target_days(rows, cfg.n_target_days, min_history)
        if not days[int(instance)]:
            raise ValueError(f"Instance {instance} has no weekday with {min_history} days of history before it.")
        scales[int(instance)] = _scale(rows, min(days[int(instance)]), cfg)
        args[int(instance)] = (rows[["ts", "query_count"]].copy(), world, slo_ref, templates, mean_iso,
                               scales[int(instance)], cfg, grade_runner)
        cells += [_Cell(int(instance), day, kappa, h, seed) for day in days[int(instance)] for kappa in cfg.kappas
                  for h in cfg.histories_days]
    cells.sort(key=lambda c: -c.history_days)  # longest first: better packing on the pool
    n_workers = min(workers or os.cpu_count() or 1, len(cells))
    rows_out = []

    def done(row: dict[str, Any]) -> None:
        rows_out.append(row)
        if on_progress is not None:
            on_progress(len(rows_out), len(cells))

    if n_workers <= 1:
        for c in cells:
            done(_run_cell(c, *args[c.instance]))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        os.environ.setdefault("OMP_NUM_THREADS", "1")
        with ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for future in as_completed([pool.submit(_run_cell, c, *args[c.instance]) for c in cells]):
                done(future.result())
    rows_out.sort(key=lambda r: (r["instance"], r["day"], -r["kappa"], r["history_days"]))
    out = {
        "rows": rows_out,
        "summary": _summary(rows_out, cfg.histories_days),
        "instances": [int(i) for i in instances],
        "days": {str(k): v for k, v in days.items()},
        "scale": {str(k): v for k, v in scales.items()},
        "config": dataclasses.asdict(cfg),
        "time_scale": {"mean_isolated_s": mean_iso, "hour_s": cfg.hour_units * mean_iso,
                       "cost_unit": "size-1 cluster-hours of the compressed day"},
        "world_alpha": {str(k): v for k, v in report.alpha.items()},
        "workers": n_workers,
        "wall_s": time.perf_counter() - started,
    }
    if world_doc is not None:
        out["world"] = world_doc
    return out


def run_table5(hourly_path: str | Path, log_path: str | Path | pd.DataFrame | None = None, *,
               instances: Sequence[int] | None = None, seed: int = 0, quick: bool = False,
               tune_knobs: bool = True, grade_log: pd.DataFrame | None = None, reactive: str = "queue",
               model_dir: str | Path | None = None, router: RouterSection | None = None,
               tau_target: float | None = None, peak_load: float | None = None, max_clusters: int | None = None,
               sizes: Sequence[int] | None = None,
               on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Table 5 from files: the Redset hourly Parquet and a query log (default: the bench log).

    ``log_path`` may also be a log already read (several runs merged by
    ``sloctl experiment history --log A --log B``).
    A full run picks 3 instances (2 target days × 2 κ × 4 histories each;
    about 1.5 minutes on 2 cores with the bench log);
    ``quick`` picks 1 and shrinks the tuning (:meth:`HistoryExperimentConfig.quick`);
    ``tune_knobs=False`` runs the Spin-up Scheduler alone (the ablation).
    ``grade_log``, ``reactive``, ``model_dir`` and ``router`` re-grade it
    (see :func:`history_experiment`); ``tau_target`` replaces ``τ`` (0.05;
    the paper's §8.2 uses 0.1); ``peak_load``, ``max_clusters`` and ``sizes``
    replace the world's (``sloctl experiment end-to-end``'s world: 6, 8 and
    the sizes both logs measured).
    """
    import pandas as pd

    if isinstance(log_path, pd.DataFrame):
        log = log_path
    else:
        path = Path(log_path) if log_path is not None else DEFAULT_LOG
        if not path.is_file():
            raise FileNotFoundError(f"The 'log_path' parameter must name a query log, got {path} (missing); "
                                    f"collect one with `sloctl collect` or pass log_path.")
        log = read_log(path)
    config = HistoryExperimentConfig(tune_knobs=tune_knobs)
    world = {k: v for k, v in (("tau_target", tau_target), ("peak_load", peak_load),
                               ("max_clusters", max_clusters), ("sizes", None if sizes is None else tuple(sizes)))
             if v is not None}
    config = dataclasses.replace(config, **world)
    return history_experiment(hourly_path, log, instances=instances, n_instances=1 if quick else 3,
                              config=config, seed=seed, quick=quick, grade_log=grade_log, reactive=reactive,
                              model_dir=model_dir, router=router, on_progress=on_progress)
