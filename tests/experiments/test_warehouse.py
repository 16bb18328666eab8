"""The experiment runners produce the documented JSON shape (tiny, simulated)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sloctl.experiments.warehouse import (
    RouterExperimentConfig,
    ScalingExperimentConfig,
    mean_delta,
    noise_seed,
    noise_summary,
    router_experiment,
    scaling_experiment,
)


@pytest.fixture(scope="module")
def iconq_plus(trained_models):
    return trained_models["iconq"].predictor


def test_router_experiment_json_shape(sim_log, iconq_plus):
    cfg = RouterExperimentConfig(loads=(0.8,), kappas=(2.0,), cluster_sets=((2, 1),), copies=2)
    result = json.loads(json.dumps(router_experiment(sim_log, iconq_plus, cfg)))
    assert result["baseline"] == "round-robin"
    (scenario,) = result["scenarios"]
    assert scenario["clusters"] == [2, 1] and scenario["kappa"] == 2.0 and scenario["lambda"] > 0
    assert set(scenario["results"]) == {"round-robin", "stage+cost", "iconq+cost"}
    assert all(0 <= r["vr"] <= 1 and r["cost"] > 0 for r in scenario["results"].values())
    assert set(result["mean_delta"]) == {"stage+cost", "iconq+cost"}
    assert result["predictor_vs_world"]["p50"] >= 1.0


@pytest.mark.slow
def test_scaling_experiments_json_shape(sim_log, iconq_plus):
    cfg = ScalingExperimentConfig(loads=(1.4,), kappas=(3.0,), start_sizes=(1,), copies=2)
    sizer = scaling_experiment("sizer", sim_log, iconq_plus, cfg)
    assert set(sizer["scenarios"][0]["results"]) == {"no-op", "horizontal", "vertical+ours", "add+ours"}
    trigger = scaling_experiment("trigger", sim_log, iconq_plus, cfg)
    assert set(trigger["scenarios"][0]["results"]) == {"no-op", "queue", "observed", "ours"}
    assert trigger["baseline"] == sizer["baseline"] == "no-op"
    with pytest.raises(ValueError, match="'kind'"):
        scaling_experiment("nope", sim_log, iconq_plus, cfg)


def test_mean_delta_is_the_mean_relative_change_and_skips_zero_baselines():
    results = [{"rr": {"vr": 0.5, "cost": 10.0}, "x": {"vr": 0.25, "cost": 12.0}},
               {"rr": {"vr": 0.0, "cost": 10.0}, "x": {"vr": 0.1, "cost": 8.0}}]
    delta = mean_delta(results, "rr")["x"]
    assert delta["vr"] == pytest.approx(-0.5) and delta["n_vr"] == 1
    assert delta["cost"] == pytest.approx(0.0) and delta["n_cost"] == 2


def test_commit_stores_the_routers_counterfactual_step_instead_of_recomputing_it(sim_log, iconq_plus):
    """Routing then committing leaves the same predictions as committing from scratch."""
    import numpy as np

    from sloctl.models.online import OnlinePredictor

    table = sim_log.drop_duplicates("template").reset_index(drop=True)
    templates = table["template"].tolist()
    reused, fresh = OnlinePredictor(iconq_plus, table), OnlinePredictor(iconq_plus, table)
    sizes = {"a": 1, "b": 2}
    rng = np.random.default_rng(0)
    for qid in range(12):
        now = 0.05 * qid
        template, cid = templates[qid % len(templates)], ("a", "b")[int(rng.integers(2))]
        if qid == 6:  # a completion between two arrivals invalidates nothing it should not
            reused.complete(2), fresh.complete(2)
        got_cf = reused.counterfactuals(template, now, sizes, now)
        fresh.counterfactuals(template, now, sizes, now)
        fresh._pending = None  # force the recomputing path
        got = reused.commit(qid, template, now, 1.0, cid, sizes[cid], now)
        want = fresh.commit(qid, template, now, 1.0, cid, sizes[cid], now)
        assert got == pytest.approx(want, rel=1e-5)
        assert got == pytest.approx(got_cf[cid].query_s, rel=1e-12)
    for cid in sizes:
        np.testing.assert_allclose([r.predicted_s for r in reused.running_on(cid)],
                                   [r.predicted_s for r in fresh.running_on(cid)], rtol=1e-5)
    # a stale step (another arrival time) is not reused
    reused.counterfactuals(templates[0], 9.0, sizes, 9.0)
    assert reused.commit(99, templates[0], 9.5, 1.0, "a", 1, 9.5) > 0


def test_a_new_querys_before_sequence_holds_only_the_newest_neighbours(sim_log, iconq_plus):
    """Past max_before running neighbours, a new query is predicted from the newest ones alone."""
    from sloctl.models.online import OnlinePredictor

    table = sim_log.drop_duplicates("template").reset_index(drop=True)
    templates = table["template"].tolist()
    capped, newest = OnlinePredictor(iconq_plus, table), OnlinePredictor(iconq_plus, table)
    capped.max_before = newest.max_before = 3
    arrivals = [(q, templates[q % len(templates)], 0.01 * q) for q in range(8)]
    for qid, template, t in arrivals:
        capped.commit(qid, template, t, 1.0, "a", 1, t)
    for qid, template, t in arrivals[-3:]:
        newest.commit(qid, template, t, 1.0, "a", 1, t)
    new = (templates[0], 0.5)
    got = capped.counterfactuals(*new, {"a": 1}, 0.5)["a"].query_s
    assert got == pytest.approx(newest.counterfactuals(*new, {"a": 1}, 0.5)["a"].query_s, rel=1e-6)
    capped._pending = newest._pending = None  # the commit path builds the sequence itself
    assert capped.commit(100, *new, 1.0, "a", 1, 0.5) == pytest.approx(
        newest.commit(100, *new, 1.0, "a", 1, 0.5), rel=1e-6)


def test_router_experiment_reports_how_often_the_guard_fired(sim_log, iconq_plus):
    from sloctl.control.router import RouterGuard

    base = RouterExperimentConfig(loads=(0.8,), kappas=(2.0,), cluster_sets=((2, 1),), copies=2)
    tight = dataclasses.replace(base, guard=RouterGuard(support={1: 0, 2: 0}))  # any queue is past support
    (scenario,) = router_experiment(sim_log, iconq_plus, tight)["scenarios"]
    guard = scenario["results"]["iconq+cost"]["guard"]
    assert guard["routes"] > 0
    assert guard["fallbacks"]["support"] > 0 and 0 < guard["fallback_rate"] <= 1
    (unguarded,) = router_experiment(sim_log, iconq_plus, base)["scenarios"]
    assert "guard" not in unguarded["results"]["iconq+cost"]


def test_mean_delta_reports_the_worst_scenario():
    results = [{"rr": {"vr": 0.5, "cost": 10.0}, "x": {"vr": 0.25, "cost": 12.0}},
               {"rr": {"vr": 0.2, "cost": 10.0}, "x": {"vr": 0.3, "cost": 8.0}}]
    assert mean_delta(results, "rr")["x"]["worst_vr"] == pytest.approx(0.5)
    assert mean_delta(results, "rr")["x"]["n_worse_10pct"] == 1  # 0.3 vs 0.2; 0.25 vs 0.5 is better


def test_noise_draws_keep_draw_zero_and_report_the_mean(sim_log, iconq_plus):
    one = RouterExperimentConfig(loads=(0.8,), kappas=(2.0,), cluster_sets=((1, 1),), copies=1)
    plain = router_experiment(sim_log, iconq_plus, one)
    assert "noise" not in plain
    (single,) = plain["scenarios"]
    result = router_experiment(sim_log, iconq_plus, dataclasses.replace(one, noise_draws=2))
    (scenario,) = result["scenarios"]
    for name, outcome in scenario["results"].items():
        assert outcome["vr"] == single["results"][name]["vr"]  # draw 0 is the one-draw run
        assert outcome["vr_draws"][0] == outcome["vr"] and len(outcome["vr_draws"]) == 2
        assert outcome["vr_mean"] == pytest.approx(sum(outcome["vr_draws"]) / 2)
    assert result["noise"]["draws"] == 2 and result["noise"]["scenarios"] == 1
    assert set(result["noise"]["approaches"]) == {"stage+cost", "iconq+cost"}
    assert noise_seed(7, 0) == 7 and noise_seed(7, 1) != noise_seed(7, 2)
    with pytest.raises(ValueError, match="noise_draws"):
        RouterExperimentConfig(noise_draws=0)


def test_noise_summary_counts_single_draw_and_mean_losses():
    def scenario(rr, x):
        return {"results": {"rr": {"vr": rr[0], "vr_draws": rr, "vr_mean": sum(rr) / len(rr)},
                            "x": {"vr": x[0], "vr_draws": x, "vr_mean": sum(x) / len(x)}}}

    scenarios = [scenario([0.5, 0.7], [0.6, 0.5]),  # first draw 20% worse, means within 10%; rr re-drawn 40% worse
                 scenario([0.5, 0.5], [0.4, 0.5]),  # better on both
                 scenario([0.0, 0.1], [0.2, 0.3])]  # zero first draw: no single-draw test; means count
    summary = noise_summary(scenarios, "rr")
    assert summary["baseline_vs_itself"] == 1
    # beyond the noise only the third: worse on both of its draws (the first is worse on one, better on the other)
    assert summary["approaches"]["x"] == {"worse_single_draw": 1, "worse_mean_of_draws": 1,
                                          "worse_beyond_noise": 1, "worse_by_margin_beyond_noise": 1}
    assert scenarios[0]["results"]["x"]["vr_ratio_90"][0] < 1.0
    assert scenarios[1]["results"]["x"]["vr_ratio_90"][1] <= 1.0  # never worse on any resample
    assert scenarios[2]["results"]["x"]["vr_ratio_90"][0] > 1.1


def test_a_loss_beyond_the_noise_needs_the_paired_draws_to_agree():
    from sloctl.experiments.warehouse import paired_ratio_interval

    base = [0.30, 0.20, 0.25, 0.35, 0.28, 0.22, 0.31, 0.26]
    steady = [v * 1.5 for v in base]  # 50% worse on every draw: clearly worse, and by more than 10%
    lo, hi = paired_ratio_interval(steady, base)
    assert lo == pytest.approx(1.5) and hi == pytest.approx(1.5)
    mixed = [0.45, 0.15, 0.25, 0.50, 0.20, 0.24, 0.33, 0.27]  # worse on the mean (+9%), not on every draw
    lo, hi = paired_ratio_interval(mixed, base)
    assert lo < 1.0 < hi
    scenario = {"results": {"rr": {"vr": base[0], "vr_draws": base, "vr_mean": sum(base) / 8},
                            "x": {"vr": steady[0], "vr_draws": steady, "vr_mean": sum(steady) / 8}}}
    summary = noise_summary([scenario], "rr")
    assert summary["approaches"]["x"]["worse_beyond_noise"] == 1
    assert summary["approaches"]["x"]["worse_by_margin_beyond_noise"] == 1
    assert paired_ratio_interval([0.1], [0.2]) is None  # one draw: no interval
    with pytest.raises(ValueError, match="as many draws"):
        paired_ratio_interval([0.1, 0.2], [0.2])
