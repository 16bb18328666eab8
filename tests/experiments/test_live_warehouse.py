"""The live warehouse experiments: their input checks and the paired round-by-round comparison."""

from __future__ import annotations

import pytest

from sloctl.experiments.live_warehouse import live_router_experiment, paired_rounds


def test_live_experiment_needs_isolated_runs(tpch_db, iso_log):
    busy = iso_log.assign(start_s=0.0, end_s=1.0)  # every query overlaps every other
    with pytest.raises(ValueError, match="isolated run on size 1"):
        live_router_experiment(tpch_db, busy, predictor=None)


def test_live_experiment_needs_at_least_one_round(tpch_db, iso_log):
    with pytest.raises(ValueError, match="'rounds'"):
        live_router_experiment(tpch_db, iso_log, predictor=None, rounds=0)


def test_cli_live_names_a_missing_database(tmp_path, run_sloctl):
    out = run_sloctl("experiment", "router", "--live", "--log", "x.parquet", "--db", tmp_path / "missing.duckdb",
                     cwd=tmp_path, timeout_s=120)
    assert out.returncode == 2 and "--db" in out.stderr


def test_paired_rounds_counts_rounds_and_bootstraps_the_pooled_change():
    def rnd(a, b, n=40):
        return {"n_queries": n, "results": {"router": {"vr": a}, "rr": {"vr": b}}}

    better = [rnd(0.2, 0.3), rnd(0.1, 0.2), rnd(0.25, 0.25), rnd(0.3, 0.4), rnd(0.15, 0.3)]
    out = paired_rounds(better, "router", "rr", seed=1)
    assert (out["lower"], out["equal"], out["higher"], out["rounds"]) == (4, 1, 0, 5)
    assert out["ci90"][1] < 0 and out["p_lower"] > 0.95
    assert out == paired_rounds(better, "router", "rr", seed=1)  # seeded
    mixed = [rnd(0.2, 0.3), rnd(0.4, 0.2), rnd(0.3, 0.3)]
    out = paired_rounds(mixed, "router", "rr", seed=1)
    assert (out["lower"], out["equal"], out["higher"]) == (1, 1, 1)
    assert out["ci90"][0] < 0 < out["ci90"][1]
    assert paired_rounds([rnd(0.0, 0.0)], "router", "rr")["ci90"] is None  # no baseline violation to compare


def test_live_autoscaling_needs_room_for_a_second_budgeted_cluster(tmp_path):
    import os

    from sloctl.core.errors import ClusterPoolError
    from sloctl.experiments.live_warehouse import live_autoscale_experiment

    whole_cores = {"size_unit_cores": float(len(os.sched_getaffinity(0))), "reserved_cores": 0}
    with pytest.raises(ClusterPoolError, match="room for a second cluster"):
        live_autoscale_experiment(tmp_path / "unused.duckdb", None, None, pool_options=whole_cores)
