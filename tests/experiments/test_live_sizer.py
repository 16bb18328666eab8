"""The live size-selector experiment: a forced scaling decision on real DuckDB clusters (AutoSLO §8.5).

``run_live`` forces one decision at a chosen arrival and marks the bill at
others; ``sloctl experiment sizer --live`` runs no-op, horizontal and
add+ours on the tiny TPC-H database (SF 0.01) of the tests.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig
from sloctl.control.router import Query, RoundRobinRouter
from sloctl.datasets.slo import slo_baselines
from sloctl.serving.live import run_live

N_QUERIES = 40
FORCE_AT = 5
TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores: one to start on, one to add")


@pytest.fixture(scope="module")
def sql(tpch_templates):
    return {t.name: t.sql for t in tpch_templates}


@pytest.fixture(scope="module")
def queries(iso_log, tpch_templates):
    slo = slo_baselines(iso_log, 1)
    names = [t.name for t in tpch_templates if t.name in slo]
    # 10 queries/s over 4 s: time for a spin-up after the forced arrival at 0.5 s
    return [Query(i, names[i % len(names)], 0.1 * i, 5.0 * slo[names[i % len(names)]]) for i in range(N_QUERIES)]


def _horizontal(router):
    config = AutoscalerConfig(spinup_delay_s=0.2, candidate_sizes=(1,), max_clusters=2)
    return Autoscaler(config, None, router, lambda model: router, mode="horizontal", teardown=False)


@pytest.mark.slow
@TWO_CORES
def test_forced_decision_spins_up_a_real_cluster_after_the_forced_arrival(tpch_db, queries, sql):
    router = RoundRobinRouter()
    result = run_live(tpch_db, queries, [("c0", 1)], router, sql_by_template=sql, autoscaler=_horizontal(router),
                      warmup_s=0.1, minimum_s=0.5, timeout_s=30, force_scaling_at=FORCE_AT, mark_at=(0, 20, 32))
    kinds = [e["event"] for e in result.events]
    assert kinds[:3] == ["force", "spin_up", "ready"]  # no trigger: nothing scales before the forced arrival
    force, spin_up, ready = result.events[:3]
    assert force["index"] == FORCE_AT and spin_up["t"] == force["t"]  # horizontal: decided inside the step
    new = spin_up["cluster_id"]
    df = result.queries.sort_values(["arrival_s", "query_id"]).reset_index(drop=True)
    assert (df.loc[:FORCE_AT, "cluster_id"] == "c0").all()
    on_new = df[df["cluster_id"] == new]
    assert len(on_new) > 0 and (on_new["routed_s"] >= ready["t"]).all()
    assert set(result.cost_by_cluster) == {"c0", new} and len(df) == N_QUERIES


@TWO_CORES
def test_cost_marks_split_the_bill_at_marked_arrivals(tpch_db, queries, sql):
    result = run_live(tpch_db, queries[:12], [("c0", 1)], RoundRobinRouter(), sql_by_template=sql, minimum_s=0.2,
                      timeout_s=30, mark_at=(0, 6, 11))
    marks = result.cost_marks
    assert sorted(marks) == [0, 6, 11]
    assert marks[0] == 0.0 and result.cost_since(0) == pytest.approx(result.cost)  # nothing billed before it
    assert 0.0 < marks[6] <= marks[11] <= result.cost
    assert result.cost_since(11) == pytest.approx(result.cost - marks[11]) and result.cost_since(11) >= 0.0
    with pytest.raises(ValueError, match="marked arrival"):
        result.cost_since(3)
    assert run_live(tpch_db, queries[:2], [("c0", 1)], RoundRobinRouter(), sql_by_template=sql).cost_marks == {}


def test_forced_scaling_and_marks_are_checked_before_any_cluster_starts(tpch_db, queries, sql):
    router = RoundRobinRouter()
    with pytest.raises(ValueError, match="'force_scaling_at'.*autoscaler"):
        run_live(tpch_db, queries, [("c0", 1)], router, sql_by_template=sql, force_scaling_at=3)
    with pytest.raises(ValueError, match="'force_scaling_at'.*got 40"):
        run_live(tpch_db, queries, [("c0", 1)], router, sql_by_template=sql, autoscaler=_horizontal(router),
                 force_scaling_at=N_QUERIES)
    with pytest.raises(ValueError, match="'mark_at'.*got -1"):
        run_live(tpch_db, queries, [("c0", 1)], router, sql_by_template=sql, mark_at=(2, -1))


def test_live_experiment_kind_must_be_trigger_or_sizer(tmp_path):
    from sloctl.experiments.live_warehouse import live_autoscale_experiment

    with pytest.raises(ValueError, match="'kind'.*'vertical'"):
        live_autoscale_experiment(tmp_path / "unused.duckdb", None, None, kind="vertical")


@pytest.fixture(scope="module")
def stage_bundle(tmp_path_factory, iso_log):
    """A Stage-only predictor of the tiny database (the router and selector run without Iconq+) and its log."""
    from sloctl.datasets.querylog import write_log
    from sloctl.models.predictor import LatencyPredictor
    from sloctl.models.stage import StageConfig
    from sloctl.registry.bundles import save_predictor
    from sloctl.training.pipeline import fit_stage

    folder = tmp_path_factory.mktemp("sizer")
    stage = fit_stage(iso_log, np.arange(len(iso_log)), StageConfig(), np.zeros(len(iso_log), int))
    save_predictor(LatencyPredictor(stage), folder / "bundle")
    write_log(iso_log, folder / "log.parquet")
    return folder


@pytest.mark.slow
@TWO_CORES  # about 13 s: three live runs (no-op, horizontal, add+ours) plus the CLI's start-up
def test_cli_live_sizer_json_has_the_documented_keys(stage_bundle, tpch_db, run_sloctl):
    out = run_sloctl("experiment", "sizer", "--live", "--log", "log.parquet", "--model", "bundle", "--db", tpch_db,
                     "--warmup-s", "0.1", "--json", cwd=stage_bundle, timeout_s=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert {"live", "lambda", "load", "kappa", "clusters", "pool", "candidate_sizes", "results", "baseline",
            "mean_delta", "time_scale", "force_scaling_at", "mark_at"} <= set(result)
    assert result["live"] is True and result["baseline"] == "no-op" and result["clusters"] == [1]
    assert list(result["results"]) == ["no-op", "horizontal", "add+ours"]
    assert set(result["mean_delta"]) == {"horizontal", "add+ours"}
    n = result["time_scale"]["n_queries"]
    assert (result["force_scaling_at"], result["mark_at"]) == (int(0.2 * n), int(0.8 * n))
    for name, outcome in result["results"].items():
        assert {"vr", "cost", "spin_ups", "events", "clusters"} <= set(outcome)
        assert 0.0 <= outcome["vr"] <= 1.0 and outcome["cost"] >= 0.0
        forced = [e for e in outcome["events"] if e["event"] == "force"]
        assert len(forced) == (0 if name == "no-op" else 1)
    assert result["results"]["no-op"]["spin_ups"] == 0 and result["results"]["horizontal"]["spin_ups"] == 1
    # add+ours sized on the background worker: its decision is logged against the forced arrival
    add = result["results"]["add+ours"]["events"]
    force = next(e for e in add if e["event"] == "force")
    assert any(e["event"] == "sizing" and e["triggered_s"] == force["t"] for e in add) or \
        next(e for e in add if e["event"] == "sizer")["unapplied"]
