"""Table 5 in simulation: tuning on history, grading on the actual day (AutoSLO §8.7)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sloctl.control.autoscaler import AutoscalerConfig, QueueScaler
from sloctl.control.managed import ClusterView
from sloctl.control.router import Query
from sloctl.experiments.history import (
    HistoryExperimentConfig,
    history_experiment,
    pick_target_days,
)

PEAK_HOURS = (12, 13)


def periodic_contour(days: int = 40, base: int = 20, peak: int = 200, seed: int = 0) -> pd.DataFrame:
    """Quiet hours and the same two-hour peak every day, Poisson noise on top."""
    rng = np.random.default_rng(seed)
    stamps = pd.date_range("2024-03-01", periods=days * 24, freq="h")
    mean = np.where(np.isin(stamps.hour, PEAK_HOURS), peak, base)
    return pd.DataFrame({"instance_id": 7, "timestamp": stamps, "query_count": rng.poisson(mean)})


@pytest.fixture(scope="module")
def table(sim_log):
    """The Spin-up Scheduler alone (the ablation), so that what it schedules is visible."""
    cfg = HistoryExperimentConfig(histories_days=(0, 1), kappas=(3.0,), n_target_days=1, tune_knobs=False)
    return history_experiment(periodic_contour(), sim_log, instances=[7], config=cfg, workers=1, seed=0,
                              quick=True)


@pytest.fixture(scope="module")
def tuned_table(sim_log):
    """The whole Policy Tuner: Configuration Tuner, then Spin-up Scheduler."""
    cfg = HistoryExperimentConfig(histories_days=(0, 1), kappas=(3.0,), n_target_days=1, knob_budget=6)
    return history_experiment(periodic_contour(), sim_log, instances=[7], config=cfg, workers=1, seed=0,
                              quick=True)


def test_target_days_are_weekdays_with_a_month_of_history_and_spread_apart():
    rows = periodic_contour(days=80).assign(ts=lambda f: pd.to_datetime(f["timestamp"]))
    days = [pd.Timestamp(d) for d in pick_target_days(rows, n=2, min_history_days=31)]
    assert len(days) == 2 and all(d.weekday() < 5 for d in days)
    assert days[0] < pd.Timestamp("2024-05-19")  # the last (partial) day is never a target
    assert (days[0] - days[1]).days >= 28 and (days[1] - pd.Timestamp("2024-03-01")).days >= 31


def test_history_places_a_spinup_before_the_recurring_peak_and_lowers_actual_vr(table):
    by_h = {r["history_days"]: r for r in table["rows"]}
    assert by_h[0]["spinups"] == []
    hours = [h for h, _ in by_h[1]["spinups"]]
    assert any(PEAK_HOURS[0] - 1.0 <= h <= PEAK_HOURS[0] + 0.5 for h in hours), hours
    assert by_h[1]["vr"] < by_h[0]["vr"]
    assert table["summary"]["mean_delta_vs_H0"]["H=1"]["vr"] < 0


def test_policy_tuner_with_history_tunes_knobs_and_beats_no_history(tuned_table):
    by_h = {r["history_days"]: r for r in tuned_table["rows"]}
    assert "knobs" not in by_h[0]  # no history: the default configuration
    knobs = by_h[1]["knobs"]
    assert set(knobs) == {"start_sizes", "t_idle_units", "t_min_lifetime_units"}
    assert by_h[1]["vr"] < by_h[0]["vr"]  # graded on the actual day


def test_grading_uses_the_actual_day_not_the_forecasts(table):
    tuned = next(r for r in table["rows"] if r["history_days"] == 1)
    assert len(tuned["forecast_fingerprints"]) == 3  # quick: 2 training + 1 validation forecasts
    assert not set(tuned["actual_fingerprints"]) & set(tuned["forecast_fingerprints"])
    untuned = next(r for r in table["rows"] if r["history_days"] == 0)
    assert untuned["actual_fingerprints"] == tuned["actual_fingerprints"]  # one actual day for every H
    json.dumps(table)


def test_queue_scaler_adds_one_cluster_at_a_time_and_tears_idle_ones_down():
    scaler = QueueScaler(AutoscalerConfig(t_idle_s=5.0, t_min_lifetime_s=5.0, candidate_sizes=(1,)), queue_n=2)
    q = Query(0, "a", 100.0, 1.0)
    busy = [ClusterView("c0", 1, True, 0.0, 99.0, 2)]
    assert [a.kind for a in scaler.on_arrival(q, busy)] == ["spin_up"]
    starting = [*busy, ClusterView("c1", 1, False, 99.0, None, 0)]
    assert scaler.on_arrival(q, starting) == []
    idle = [ClusterView("c0", 1, True, 0.0, 99.0, 1), ClusterView("c1", 1, True, 50.0, 60.0, 0)]
    assert [(a.kind, a.cluster_id) for a in scaler.on_arrival(q, idle)] == [("tear_down", "c1")]


def test_the_tuner_tries_only_starting_pools_that_fit_the_units():
    from sloctl.experiments.history import starting_pools

    assert starting_pools((1, 2, 4)) == [(1,), (2,), (4,), (1, 1), (2, 2), (4, 4)]
    assert starting_pools((1, 2, 4), 4) == [(1,), (2,), (4,), (1, 1), (2, 2)]
    assert starting_pools((2, 1), 1) == [(1,)]
    with pytest.raises(ValueError, match="'max_units' setting \\(1\\) must fit one cluster of the smallest size 2"):
        starting_pools((2, 4), 1)


def test_a_runner_refuses_a_plan_past_the_units_instead_of_running_it(sim_log):
    from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup
    from sloctl.experiments.history import HistoryRunner
    from sloctl.simulation.emulator import calibrate

    world, _ = calibrate(sim_log)
    runner = HistoryRunner(world, minimum_s=1.0, max_units=2)
    queries = [Query(0, sorted(world.templates())[0], 0.0, 10.0)]
    assert runner(ExecutionConfig(start_sizes=(1, 1)), queries, 0).n_queries == 1
    with pytest.raises(ValueError, match=r"starts clusters \[2, 2\]: 4 size units, more than the 2"):
        runner(ExecutionConfig(start_sizes=(2, 2)), queries, 0)
    with pytest.raises(ValueError, match=r"spin-ups of size \[4\]"):
        runner(ExecutionConfig(start_sizes=(1,), spinups=(ScheduledSpinup(1.0, 4),)), queries, 0)
