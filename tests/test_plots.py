"""Plots people read (issue 18, part 6): every axis named with its unit, readable ticks, files under reports/.

Checked on the matplotlib objects (labels, scales, tick formatters, bar heights), never on pixels.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sloctl import plots  # noqa: E402
from sloctl.plots import (  # noqa: E402
    approach_bars_figure,
    forecast_figure,
    placement_figure,
    plot_predicted_vs_actual,
    predicted_vs_actual_figure,
    report_path,
    scenario_label,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _tick_text(axis, value: float) -> str:
    return axis.get_major_formatter()(value, 0)


def test_predicted_vs_actual_is_log_log_in_seconds_with_plain_ticks_and_the_q_error():
    actual = np.array([0.05, 0.2, 1.0, 4.0, 10.0])
    predicted = actual * np.array([1.0, 2.0, 0.5, 1.0, 1.5])
    fig = predicted_vs_actual_figure(predicted, actual, groups=[1, 1, 2, 2, 2], title="m on log")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "actual latency (s)" and ax.get_ylabel() == "predicted latency (s)"
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert _tick_text(ax.xaxis, 0.1) == "0.1" and _tick_text(ax.yaxis, 10.0) == "10"  # not 10^-1
    assert "p90 2.00" in ax.get_title() and "p50 1.50" in ax.get_title()
    labels = ax.get_legend_handles_labels()[1]
    assert "cluster size 1 (2 queries)" in labels and "predicted = actual" in labels


def test_predicted_vs_actual_refuses_mismatched_or_empty_input():
    with pytest.raises(ValueError, match="same length"):
        predicted_vs_actual_figure([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        predicted_vs_actual_figure([0.0], [1.0])


def test_generated_images_go_under_reports_unless_a_path_is_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert report_path("evaluate.png") == Path("reports/evaluate.png")
    written = plot_predicted_vs_actual([1.0, 2.0], [1.5, 2.5], report_path("evaluate.png"))
    assert written.is_file() and written.parent.name == "reports"
    assert not list(tmp_path.glob("*.png"))


def test_approach_bars_show_vr_in_percent_and_cost_with_its_unit():
    results = {"round-robin": {"vr": 0.2, "cost": 300.0}, "iconq+": {"vr": 0.05, "cost": 280.0}}
    fig = approach_bars_figure(results, title="router")
    vr_ax, cost_ax = fig.axes
    assert vr_ax.get_ylabel() == "SLO violation rate (% of queries)"
    assert cost_ax.get_ylabel() == "cost (size-1 cluster-seconds)"
    assert vr_ax.get_xlabel() == cost_ax.get_xlabel() == "approach"
    assert [t.get_text() for t in vr_ax.get_xticklabels()] == ["round-robin", "iconq+"]
    heights = [p.get_height() for p in vr_ax.patches if np.isfinite(p.get_height()) and p.get_height() > 0]
    assert heights == pytest.approx([20.0, 5.0])
    assert _tick_text(vr_ax.yaxis, 10.0) == "10%"


def test_approach_bars_group_the_scenarios_of_an_experiment():
    scenarios = [{"load": 0.6, "kappa": 4.0, "clusters": [["c0-s2", 2], ["c1-s1", 1]],
                  "results": {"rr": {"vr": 0.1, "cost": 10.0}, "ours": {"vr": 0.0, "cost": 9.0}}},
                 {"load": 0.85, "kappa": 2.0, "clusters": [1],
                  "results": {"rr": {"vr": 0.3, "cost": 12.0}, "ours": {"vr": 0.1, "cost": 11.0}}}]
    fig = approach_bars_figure({scenario_label(s): s["results"] for s in scenarios})
    vr_ax, _ = fig.axes
    assert vr_ax.get_xlabel() == "scenario"
    assert [t.get_text() for t in vr_ax.get_xticklabels()] == ["load 0.6\nκ 4\nsizes 2,1", "load 0.85\nκ 2\nsizes 1"]
    assert vr_ax.get_legend_handles_labels()[1] == ["rr", "ours"]


def test_experiment_cli_helper_writes_the_bar_chart(tmp_path):
    from sloctl._cli_experiments import _plot_scenarios

    result = {"scenarios": [{"load": 1.0, "kappa": 2.0, "clusters": [1],
                             "results": {"no-op": {"vr": 0.4, "cost": 5.0}, "ours": {"vr": 0.1, "cost": 6.0}}}]}
    _plot_scenarios(result, tmp_path / "reports" / "trigger.png", "experiment trigger")
    assert (tmp_path / "reports" / "trigger.png").is_file()


def test_forecast_plot_has_dated_midnight_ticks_and_counts_per_hour():
    actual = np.tile(np.r_[np.zeros(8), np.full(8, 100.0), np.zeros(8)], 3)
    fig = forecast_figure(actual, {"prior_day": actual * 1.1}, start="2024-03-01")
    (ax,) = fig.axes
    assert ax.get_ylabel() == "queries per hour"
    assert "midnight" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_xticklabels()][:3] == ["03-01", "03-02", "03-03"]
    assert "prior_day (WAPE 0.10)" in ax.get_legend_handles_labels()[1]
    with pytest.raises(ValueError, match="prior_day"):
        forecast_figure(actual, {"prior_day": actual[:5]})


def _hourly(days: int, instance: int = 0) -> pd.DataFrame:
    ts = pd.date_range("2024-01-01", periods=24 * days, freq="h")
    counts = 50 + 40 * np.sin(2 * np.pi * np.arange(ts.size) / 24)
    return pd.DataFrame({"instance_id": instance, "timestamp": ts, "query_count": counts.round()})


def test_forecast_cli_plot_writes_the_chosen_instance(tmp_path):
    from sloctl._cli_forecast import forecast_app
    from sloctl.datasets.forecast import backtest_series, evaluate_forecasts

    path = tmp_path / "hourly.parquet"
    _hourly(21).to_parquet(path)
    series = backtest_series(path, 0, ("prior_day",), 7)
    assert series["start"] == "2024-01-15" and len(series["actual"]) == 7 * 24
    wape = evaluate_forecasts(path, policies=("prior_day",), test_days=7)["policies"]["prior_day"]["median_wape"]
    f, a = np.array(series["forecasts"]["prior_day"]), np.array(series["actual"])
    assert np.abs(f - a).sum() / a.sum() == pytest.approx(wape)  # the same backtest as the scores
    out = CliRunner().invoke(forecast_app, ["evaluate", "--hourly", str(path), "--test-days", "7", "--json",
                                            "--plot", str(tmp_path / "reports" / "fc.png")])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["instances"] == [0] and (tmp_path / "reports" / "fc.png").is_file()
    bad = CliRunner().invoke(forecast_app, ["evaluate", "--hourly", str(path), "--test-days", "7",
                                            "--plot", str(tmp_path / "x.png"), "--plot-instance", "9"])
    assert bad.exit_code == 2 and not (tmp_path / "x.png").exists()


def test_placement_timeline_stacks_concurrent_queries_and_names_clusters():
    rows = [{"cluster_id": "c0", "cluster_size": 1, "start_s": 0.0, "end_s": 2.0, "violated": False},
            {"cluster_id": "c0", "cluster_size": 1, "start_s": 1.0, "end_s": 3.0, "violated": True},
            {"cluster_id": "c0", "cluster_size": 1, "start_s": 2.5, "end_s": 4.0, "violated": False},
            {"cluster_id": "c1", "cluster_size": 2, "start_s": 3.0, "end_s": 3.5, "violated": False},
            {"cluster_id": "c1", "cluster_size": 2, "start_s": None, "end_s": None, "violated": True}]
    assert plots._slots(rows[:4]) == [0, 1, 0, 0]  # the second overlaps the first; the third reuses lane 0
    fig = placement_figure(rows, [{"event": "spin_up", "t": 1.5}, {"event": "ready", "t": 2.9}])
    (ax,) = fig.axes
    assert ax.get_xlabel() == "time since the run started (s)" and ax.get_ylabel() == "cluster"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["c0 (size 1)", "c1 (size 2)"]
    assert "4 queries, 1 missed their SLO" in ax.get_title()
    assert {"met SLO", "missed SLO", "spin up", "ready"} <= set(ax.get_legend().get_texts()[i].get_text()
                                                                for i in range(4))


# -- the plots that existed before: readable axes ----------------------------------------
@pytest.fixture
def captured(monkeypatch):
    """The figures a plot function saves (save_figure replaced in each module that plots)."""
    figures = []

    def capture(fig, path):
        figures.append(fig)
        return Path(path)

    import sloctl.datasets.analysis as analysis
    import sloctl.simulation.day as day
    import sloctl.simulation.retry_sweep as retry_sweep

    for module in (analysis, day, retry_sweep):
        monkeypatch.setattr(module, "save_figure", capture)
    return figures


def _assert_units(fig) -> None:
    for ax in fig.axes:
        for label in (ax.get_xlabel(), ax.get_ylabel()):
            if label:
                assert "(" in label and ")" in label, f"no unit in axis label {label!r}"
    assert any(ax.get_xlabel() for ax in fig.axes)


def test_retry_sweep_plot_names_load_and_rejection_in_percent(captured):
    from sloctl.simulation.retry_sweep import plot_retry_sweep

    result = {"points": [{"offered_rho": r, "k": {"high": 5, "low": 1}, "analysis": {"high": 0.0, "low": r / 4},
                          "simulated": {"high": 0.0, "low": r / 4 + 0.01}} for r in (0.5, 1.0, 2.0)]}
    plot_retry_sweep(result, "unused.png")
    (ax,) = captured[0].axes
    _assert_units(captured[0])
    assert ax.get_ylabel() == "end-to-end rejection (% of requests)"
    assert _tick_text(ax.yaxis, 0.5) == "50%"
    assert "1 = saturated" in ax.get_xlabel()


def test_day_plot_names_its_units(captured):
    from sloctl.simulation.day import plot_day

    day = {"queries": 10, "contour": "synthetic", "hour_s": 30.0, "hours": 4,
           "results": {"ours": {"vr": 0.1, "cost": 40.0, "per_hour_vr": [0.0, 0.2, 0.1, 0.0],
                                "cumulative_cost": [10.0, 20.0, 30.0, 40.0]}}}
    plot_day(day, "unused.png")
    top, bottom = captured[0].axes
    _assert_units(captured[0])
    assert bottom.get_ylabel() == "cost so far (size-1 cluster-seconds)"
    assert _tick_text(top.yaxis, 20.0) == "20%"


def test_end_to_end_plot_shows_vr_in_percent(tmp_path, monkeypatch):
    import sloctl.datasets.analysis as analysis
    from sloctl.experiments.end_to_end import plot_scenarios

    figures = []
    monkeypatch.setattr(analysis, "save_figure", lambda fig, path: figures.append(fig) or Path(path))
    result = SimpleNamespace(tau_target=0.1, world={"instance": 3},
                             scenarios=[{"day": "2024-01-02", "kappa": 2.0,
                                         "results": {"autoslo": {"vr": 0.05, "cost": 3.0}}}])
    plot_scenarios(result, tmp_path)
    (ax,) = figures[0].axes
    assert ax.get_xlabel() == "SLO violation rate (% of queries)" and ax.get_ylabel() == "cost (size-1 cluster-hours)"
    assert ax.xaxis.get_major_formatter()(0.05, 0) == "5%"


def test_interference_plot_names_counts_and_slowdown(captured):
    from sloctl.datasets.analysis import plot_latency_vs_concurrency

    log = pd.DataFrame({"status": "ok", "template": "q1", "cluster_size": 1, "cluster_id": "c0", "query_id": range(4),
                        "start_s": [0.0, 10.0, 10.5, 11.0], "end_s": [1.0, 12.0, 12.5, 13.0],
                        "latency_s": [1.0, 2.0, 2.0, 2.0], "arrival_s": [0.0, 10.0, 10.5, 11.0]})
    plot_latency_vs_concurrency(log, "unused.png")
    (ax,) = captured[0].axes
    _assert_units(captured[0])
    captured[0].canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ax.get_yscale() == "log" and labels and not any("^" in t for t in labels)  # plain numbers, not 10^x
