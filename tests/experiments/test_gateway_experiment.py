"""``sloctl experiment gateway``: the seeded mix, the per-class accounting, and a tiny live run (issue 22, part 5)."""

from __future__ import annotations

import json
import math

import pytest


def test_the_mix_is_seeded_with_a_burst_in_its_middle_third_and_a_high_share():
    from sloctl.experiments.gateway import gateway_workload

    ref = {"a": 0.1, "b": 0.2}
    kwargs = dict(n_queries=300, rate_per_s=10.0, burst=2.0, high_share=0.2, kappa=3.0)
    one = gateway_workload(["a", "b"], ref, seed=4, **kwargs)
    again = gateway_workload(["a", "b"], ref, seed=4, **kwargs)
    assert one == again and one != gateway_workload(["a", "b"], ref, seed=5, **kwargs)
    gaps = [y["arrival_s"] - x["arrival_s"] for x, y in zip(one, one[1:], strict=False)]
    outer, middle = gaps[:99] + gaps[200:], gaps[100:199]
    assert sum(middle) / len(middle) < 0.75 * sum(outer) / len(outer)  # the burst comes faster (2x in expectation)
    high = sum(q["klass"] == "high" for q in one) / len(one)
    assert 0.12 < high < 0.28
    assert all(math.isclose(q["slo_s"], 3.0 * ref[q["template"]]) for q in one)
    with pytest.raises(ValueError, match="'burst'"):
        gateway_workload(["a"], {"a": 1.0}, seed=0, **{**kwargs, "burst": 0})


def test_shed_queries_count_as_violations_and_a_vanished_query_is_caught():
    from sloctl.experiments.gateway import summarise_arm

    rows = [{"klass": "high", "outcome": "admitted", "ok": True, "latency_s": 0.5, "slo_s": 1.0},
            {"klass": "high", "outcome": "admitted", "ok": True, "latency_s": 2.0, "slo_s": 1.0},
            {"klass": "low", "outcome": "deferred", "ok": True, "latency_s": 0.9, "slo_s": 1.0},
            {"klass": "low", "outcome": "shed", "ok": False, "latency_s": 0.2, "slo_s": 1.0},
            {"klass": "low", "outcome": None, "ok": False, "latency_s": math.inf, "slo_s": 1.0}]
    per_class, overall = summarise_arm(rows, span_s=10.0)
    assert per_class["high"]["vr"] == 0.5 and per_class["high"]["goodput_per_s"] == 0.1
    low = per_class["low"]
    assert (low["deferred"], low["shed"], low["lost"], low["failed"]) == (1, 1, 1, 0)
    assert low["vr"] == 2 / 3 and low["vr_served"] == 0.0
    assert overall["submitted"] == 5 and overall["lost"] == 1 and overall["good"] == 2


@pytest.mark.slow
def test_a_tiny_live_run_compares_the_four_arms_and_accounts_for_every_query(tpch_db, iso_log):
    from sloctl.config import load_config
    from sloctl.experiments.gateway import ARMS, run_gateway_experiment
    from sloctl.training.pipeline import train_stage

    stage = train_stage(iso_log, load_config().stage, risk_quantile=None).predictor
    result = run_gateway_experiment(tpch_db, iso_log, stage, sizes=(1, 1), n_queries=6, load=0.8, kappa=2.0,
                                    seed=3, only_templates=["tpch-q01", "tpch-q06", "tpch-q14"])
    assert [a.arm for a in result.arms] == list(ARMS)
    for arm in result.arms:
        assert arm.accounted and arm.overall["submitted"] == 6 and arm.overall["lost"] == 0
        assert sum(row["submitted"] for row in arm.per_class.values()) == 6
        assert arm.overall["admitted"] + arm.overall["deferred"] + arm.overall["shed"] == 6
        assert arm.cost > 0
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["world"].startswith("live DuckDB") and set(doc["ratios"]) >= {"high_vr_full_vs_least_queued"}
