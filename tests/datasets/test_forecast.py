from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sloctl._cli_forecast import forecast_app
from sloctl.core.errors import WorkloadError
from sloctl.datasets.forecast import (
    POLICIES,
    Forecaster,
    evaluate_forecasts,
    forecast_hourly,
    interarrival_deciles,
    parse_policy,
    place_in_hour,
    sample_interarrivals,
    source_lags,
    split_days,
)
from sloctl.datasets.reservoir import Reservoir

REDSET_HOURLY = Path(__file__).resolve().parents[3] / "shared" / "data" / "redset_serverless_hourly.parquet"
MONDAY = pd.Timestamp("2024-03-04")


def weekly_frame(weeks: int = 6, *, instance: int = 0, noise: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """Hourly counts with a strong weekly cycle (busy weekdays, idle weekends) and a daily shape."""
    rng = np.random.default_rng(seed)
    stamps = pd.date_range(MONDAY, periods=weeks * 7 * 24, freq="h")
    shape = 1.0 + np.sin(2 * np.pi * (stamps.hour - 9) / 24.0)
    level = np.where(stamps.day_of_week < 5, 400.0, 20.0) * (1 + 0.5 * (stamps.day_of_week == 0))
    counts = rng.poisson(level * shape * rng.uniform(1 - noise, 1 + noise, len(stamps)))
    return pd.DataFrame({"instance_id": instance, "timestamp": stamps.strftime("%Y-%m-%d %H:%M:%S"),
                         "query_count": counts})


# -- policies and weights -----------------------------------------------------

def test_decay_weights_are_lambda_powers_normalised():
    lags = source_lags("decay", 30, decay_lambda=0.5)
    assert [lag for lag, _ in lags] == [7, 14, 21, 28]
    raw = np.array([1.0, 0.5, 0.25, 0.125])
    np.testing.assert_allclose([w for _, w in lags], raw / raw.sum())
    assert source_lags("decay", 30, decay_lambda=0.5, max_weeks=2) == [(7, 2 / 3), (14, 1 / 3)]


def test_a_small_lambda_lets_the_most_recent_week_dominate():
    weights = [w for _, w in source_lags("decay", 70, decay_lambda=0.05)]
    assert weights[0] > 0.94 and weights == sorted(weights, reverse=True)
    history = np.zeros((70, 24))
    history[-7] = 100.0  # last week, same weekday
    history[-14] = 0.0
    assert forecast_hourly(history, "decay", decay_lambda=0.05)[0] > 94.0


def test_other_policies_pick_their_bins_and_too_little_history_falls_back_to_the_prior_day():
    assert source_lags("prior_day", 10) == [(1, 1.0)]
    assert source_lags("seasonal_naive", 10) == [(7, 1.0)]
    assert source_lags("equal_7", 10) == [(lag, 1 / 7) for lag in range(1, 8)]
    assert source_lags("equal_7", 3) == [(lag, 1 / 3) for lag in range(1, 4)]
    assert source_lags("decay", 6) == [(1, 1.0)] == source_lags("seasonal_naive", 6)


@pytest.mark.parametrize(("call", "field"), [
    (lambda: source_lags("mean", 7), "'policy'"),
    (lambda: source_lags("decay", 0), "'history_days'"),
    (lambda: source_lags("decay", 7, decay_lambda=0.0), "'decay_lambda'"),
    (lambda: source_lags("decay", 7, max_weeks=0), "'max_weeks'"),
    (lambda: parse_policy("prior_day:0.5"), "'policy'"),
    (lambda: forecast_hourly(np.zeros((3, 23))), "'history'"),
    (lambda: split_days(["2024-03-04", "2024-03-05"], 2), "'validation_days'"),
])
def test_bad_parameters_are_refused_naming_the_field(call, field):
    with pytest.raises(WorkloadError, match=field):
        call()


def test_parse_policy_reads_a_per_policy_lambda():
    assert parse_policy("decay") == ("decay", None)
    assert parse_policy("decay:0.8") == ("decay", 0.8)
    assert parse_policy("equal_7") == ("equal_7", None)


# -- interarrival times -------------------------------------------------------

def test_sampled_interarrivals_stay_in_the_decile_range_and_follow_the_bin_distribution():
    rng = np.random.default_rng(0)
    gaps = rng.lognormal(1.0, 1.2, size=5000)
    deciles = interarrival_deciles(gaps)
    sample = sample_interarrivals(deciles, 50_000, np.random.default_rng(1))
    assert sample.min() >= deciles[0] and sample.max() <= deciles[-1]
    share = np.histogram(sample, bins=deciles)[0] / len(sample)
    np.testing.assert_allclose(share, 0.1, atol=0.01)  # each decile holds a tenth
    np.testing.assert_allclose(np.quantile(sample, [0.25, 0.5, 0.75]), np.quantile(gaps, [0.25, 0.5, 0.75]),
                               rtol=0.1)


def test_placed_offsets_keep_the_gaps_and_stay_in_the_hour():
    rng = np.random.default_rng(0)
    offsets = place_in_hour(np.full(99, 10.0), rng)
    assert len(offsets) == 100 and offsets[0] >= 0 and offsets[-1] < 3600
    np.testing.assert_allclose(np.diff(offsets), 10.0)
    crowded = place_in_hour(np.full(999, 10.0), rng)  # 9990 s of gaps cannot fit: shrunk evenly
    assert crowded[-1] < 3600 and np.allclose(np.diff(crowded), np.diff(crowded)[0])


def reservoir_with_regular_mondays(tmp_path, *, weeks: int = 3, gap_s: float = 10.0, cap=None) -> Reservoir:
    reservoir = Reservoir(tmp_path / "r.db", max_arrivals_per_bin=cap, seed=0)
    rows = []
    for week in range(weeks):
        day = MONDAY + pd.Timedelta(days=7 * week)
        rows += [(day + pd.Timedelta(hours=9, seconds=100 + gap_s * i), "busy") for i in range(300)]
        rows += [(day + pd.Timedelta(days=1, hours=9), "tuesday")]
    reservoir.add_queries(rows)
    return reservoir


def test_forecast_arrivals_reproduce_the_bins_interarrival_times(tmp_path):
    reservoir = reservoir_with_regular_mondays(tmp_path)
    target = MONDAY + pd.Timedelta(days=21)
    forecaster = Forecaster(reservoir, seed=4)
    np.testing.assert_allclose(forecaster.interarrival_deciles(target, 9), 10.0)
    workload = forecaster.workload(target)
    times = np.array([t for t, _ in workload])
    assert len(workload) == 300 and {name for _, name in workload} == {"busy"}
    assert times.min() >= 9 * 3600 and times.max() < 10 * 3600
    np.testing.assert_allclose(np.diff(times), 10.0, atol=1e-6)


def test_thinned_bins_have_their_gaps_shrunk_back_to_the_real_spacing(tmp_path):
    reservoir = reservoir_with_regular_mondays(tmp_path, cap=30)  # 30 of 300 offsets kept per bin
    deciles = Forecaster(reservoir).interarrival_deciles(MONDAY + pd.Timedelta(days=21), 9)
    assert 5.0 < deciles[5] < 20.0  # the kept sample alone spaces them ~100 s apart


def test_sparse_bins_fall_back_to_uniform_arrivals(tmp_path):
    reservoir = Reservoir(tmp_path / "r.db")
    # Three arrivals crammed into one minute, and 2000 counted queries with no arrival times.
    reservoir.add_queries([(MONDAY + pd.Timedelta(hours=3, seconds=s), "q") for s in (60, 61, 62)])
    reservoir.add_hourly_counts(pd.DataFrame({"timestamp": [MONDAY + pd.Timedelta(hours=3)],
                                              "query_count": [2000]}))
    forecaster = Forecaster(reservoir, "seasonal_naive", seed=1)
    target = MONDAY + pd.Timedelta(days=7)
    assert forecaster.interarrival_deciles(target, 3) is None
    offsets = np.array([t for t, _ in forecaster.workload(target)]) - 3 * 3600
    assert len(offsets) == 2003 and offsets.min() >= 0 and offsets.max() < 3600
    quarters = np.histogram(offsets, bins=4, range=(0, 3600))[0]
    assert quarters.min() > 400  # spread over the hour, not bunched where the three were


# -- forecasts from the reservoir ---------------------------------------------

def reservoir_from_frame(tmp_path, frame: pd.DataFrame) -> Reservoir:
    reservoir = Reservoir(tmp_path / "h.db")
    reservoir.add_hourly_counts(frame, instance=0)
    return reservoir


def test_reservoir_forecasts_match_the_hourly_backtest_path(tmp_path):
    frame = weekly_frame(4)
    reservoir = reservoir_from_frame(tmp_path, frame)
    matrix = frame["query_count"].to_numpy(dtype=float).reshape(-1, 24)
    target = MONDAY + pd.Timedelta(days=25)
    for policy in POLICIES:
        expected = forecast_hourly(matrix[:25], policy, decay_lambda=0.6)
        got = Forecaster(reservoir, policy, decay_lambda=0.6).hourly_counts(target)
        np.testing.assert_allclose(got, expected)


def test_only_days_before_the_target_are_used(tmp_path):
    frame = weekly_frame(4)
    reservoir = reservoir_from_frame(tmp_path, frame)
    target = MONDAY + pd.Timedelta(days=14)
    before = Forecaster(reservoir, "equal_7").hourly_counts(target)
    np.testing.assert_allclose(before, forecast_hourly(frame["query_count"].to_numpy().reshape(-1, 24)[:14],
                                                       "equal_7"))
    assert all(date < "2024-03-18" for date, _ in Forecaster(reservoir).sources(target))
    with pytest.raises(WorkloadError, match="'target_date'"):
        Forecaster(reservoir).sources(MONDAY)


def test_sampled_workload_follows_the_forecast_counts_and_template_mix(tmp_path):
    reservoir = Reservoir(tmp_path / "r.db", max_arrivals_per_bin=50)
    rng = np.random.default_rng(0)
    for week in range(3):
        day = MONDAY + pd.Timedelta(days=7 * week)
        n = 200 * (week + 1)
        reservoir.add_queries(pd.DataFrame({
            "timestamp": day + pd.to_timedelta(14 * 3600 + rng.uniform(0, 3600, n), unit="s"),
            "template": rng.choice(["a", "b"], size=n, p=[0.8, 0.2])}))
    forecaster = Forecaster(reservoir, decay_lambda=0.5, seed=2)
    target = MONDAY + pd.Timedelta(days=21)
    expected = forecaster.hourly_counts(target)[14]
    np.testing.assert_allclose(expected, (600 + 0.5 * 400 + 0.25 * 200) / 1.75)
    workload = forecaster.workload(target)
    assert abs(len(workload) - expected) < 1
    share_a = np.mean([name == "a" for _, name in workload])
    assert 0.72 < share_a < 0.88
    assert [t for t, _ in workload] == sorted(t for t, _ in workload)


def test_same_seed_same_workload_another_seed_differs(tmp_path):
    reservoir = reservoir_from_frame(tmp_path, weekly_frame(3))
    target = MONDAY + pd.Timedelta(days=20)
    assert Forecaster(reservoir, seed=5).workload(target) == Forecaster(reservoir, seed=5).workload(target)
    assert Forecaster(reservoir, seed=5).workload(target) != Forecaster(reservoir, seed=6).workload(target)
    assert Forecaster(reservoir).workload(target, seed=6) == Forecaster(reservoir, seed=6).workload(target)


def test_split_holds_out_the_last_days_disjointly(tmp_path):
    dates = ["2024-03-06", "2024-03-04", "2024-03-05", "2024-03-08", "2024-03-07"]
    split = split_days(dates, 2)
    assert split.train == ("2024-03-04", "2024-03-05", "2024-03-06")
    assert split.validation == ("2024-03-07", "2024-03-08")
    reservoir = reservoir_from_frame(tmp_path, weekly_frame(2))
    split = Forecaster(reservoir).split(3)
    assert len(split.train) == 11 and len(split.validation) == 3
    assert not set(split.train) & set(split.validation) and max(split.train) < min(split.validation)


# -- evaluation -----------------------------------------------------------------

def test_on_a_weekly_cycle_seasonal_and_decay_beat_the_prior_day():
    frame = pd.concat([weekly_frame(6, instance=0), weekly_frame(6, instance=1, seed=1),
                       weekly_frame(2, instance=2, seed=2)])  # 14 days: too short to score
    result = evaluate_forecasts(frame, test_days=14)
    policies = result["policies"]
    assert result["instances"] == [0, 1] and 2 in result["skipped"]
    for better in ("seasonal_naive", "decay"):
        assert policies[better]["median_wape"] < 0.5 * policies["prior_day"]["median_wape"]
        assert set(policies[better]["per_instance"]) == {0, 1}
    assert policies["decay"]["median_wape"] < 0.15


def test_evaluation_scores_chosen_instances_and_refuses_unknown_ones():
    frame = pd.concat([weekly_frame(4, instance=0), weekly_frame(4, instance=7, seed=3)])
    result = evaluate_forecasts(frame, instances=[7], policies=("decay:0.9", "prior_day"), test_days=7)
    assert result["instances"] == [7] and set(result["policies"]) == {"decay:0.9", "prior_day"}
    with pytest.raises(WorkloadError, match="'instances'"):
        evaluate_forecasts(frame, instances=[3])


def test_cli_prints_json_and_a_table(tmp_path):
    path = tmp_path / "hourly.parquet"
    weekly_frame(4).to_parquet(path)
    runner = CliRunner()
    out = runner.invoke(forecast_app, ["evaluate", "--hourly", str(path), "--test-days", "7", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert set(result["policies"]) == set(POLICIES) and result["wall_s"] >= 0
    out = runner.invoke(forecast_app, ["evaluate", "--hourly", str(path), "--instances", "0", "--test-days", "7"])
    assert out.exit_code == 0 and "median WAPE" in out.stdout and "seasonal_naive" in out.stdout
    out = runner.invoke(forecast_app, ["evaluate", "--hourly", str(path), "--instances", "zero"])
    assert out.exit_code == 2


@pytest.mark.skipif(not REDSET_HOURLY.is_file(),
                    reason=f"the Redset hourly file is not here ({REDSET_HOURLY}); shared data is optional")
def test_evaluation_runs_on_the_real_redset_contours():
    result = evaluate_forecasts(REDSET_HOURLY)
    assert len(result["instances"]) >= 30
    for row in result["policies"].values():
        assert 0.0 < row["median_wape"] < 5.0 and len(row["per_instance"]) == len(result["instances"])
