"""``sloctl simulate log``: logs of any size in the collected schema (docs/querylog.md), from a calibrated world."""

from __future__ import annotations

import numpy as np
import pytest

from sloctl.datasets.analysis import overlap_counts
from sloctl.datasets.querylog import COLUMNS, read_log, read_metadata, validate_log
from sloctl.simulation.emulator import calibrate, replay_processor_sharing
from sloctl.simulation.log_synth import run_profiles, share_cluster, simulate_log


def test_share_cluster_is_the_emulators_processor_sharing_without_limits():
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.uniform(0, 10, 60))
    service = rng.lognormal(0, 0.5, 60)
    start, end, timed_out = share_cluster(arrival, service, 0.8)
    np.testing.assert_allclose(end, replay_processor_sharing(arrival, service, 0.8), rtol=1e-9)
    assert np.array_equal(start, arrival) and not timed_out.any()


def test_a_timed_out_execution_stops_at_its_timeout_and_frees_the_cluster():
    arrival = np.array([0.0, 0.0])
    start, end, timed_out = share_cluster(arrival, np.array([10.0, 1.0]), 1.0, timeout_s=4.0)
    # both share the cluster at rate 1/2: the short one ends at 2; the long one then runs alone until its timeout
    assert end[1] == pytest.approx(2.0) and not timed_out[1]
    assert end[0] == pytest.approx(4.0) and timed_out[0]


def test_admission_limit_queues_arrivals_first_in_first_out():
    arrival = np.array([0.0, 0.1, 0.2])
    start, end, _ = share_cluster(arrival, np.array([1.0, 1.0, 1.0]), 1.0, max_running=1)
    assert start.tolist() == pytest.approx([0.0, 1.0, 2.0]) and end.tolist() == pytest.approx([1.0, 2.0, 3.0])


def test_simulated_log_has_the_schema_the_rows_and_the_worlds_shape(sim_log):
    out = simulate_log(sim_log, 3000, seed=4)
    validate_log(out, source="simulated")
    assert len(out) == 3000 and list(out.columns[:len(COLUMNS)]) == list(COLUMNS)
    assert out["query_id"].is_unique and set(out["template"]) <= set(sim_log["template"])
    assert set(out["cluster_size"]) <= set(sim_log["cluster_size"])
    # isolated runs stay isolated; concurrent ones overlap, never across clusters
    nb = overlap_counts(out).to_numpy()
    isolated = out["cluster_id"].isin([c for c, g in out.groupby("cluster_id") if (nb[g.index] == 0).all()])
    assert isolated.any() and (~isolated).any()
    # every run starts after the previous one's last arrival: a later time slice is later runs
    first = out.groupby("run")["arrival_s"].min().to_numpy()
    last = out.groupby("run")["arrival_s"].max().to_numpy()
    assert (first[1:] > last[:-1]).all()
    # the latencies come from the world: the isolated ones are the log's own isolated executions
    world, _ = calibrate(sim_log, demand="empirical")
    iso = out[isolated & (out["status"] == "ok")]
    known = {v for samples in world.samples_s.values() for v in samples}
    assert np.isin(np.round(iso["latency_s"].to_numpy(), 9), np.round(list(known), 9)).all()


def test_same_seed_same_log_other_seed_other_log(sim_log):
    a, b, c = (simulate_log(sim_log, 800, seed=s) for s in (1, 1, 2))
    assert a.equals(b) and not a.equals(c)


def test_runs_keep_their_admission_limit(sim_log):
    frame = sim_log.copy()
    busy = frame["cluster_id"] == "busy-1-2"
    # the real run queued its arrivals: at most 3 ran at once
    profiles = {p.rows: p for p in run_profiles(frame)}
    assert all(p.max_running is None for p in profiles.values())  # the fixture never queues
    frame.loc[busy, "start_s"] = frame.loc[busy, "arrival_s"] + 0.5
    limited = [p for p in run_profiles(frame) if p.max_running is not None]
    assert len(limited) == 1 and limited[0].max_running >= 1


def test_timeouts_are_censored_rows(sim_log):
    out = simulate_log(sim_log, 2000, seed=3, timeout_s=float(sim_log["latency_s"].quantile(0.8)))
    timed_out = out[out["status"] == "timeout"]
    assert len(timed_out) > 0
    assert timed_out["error"].str.contains("timeout").all()
    np.testing.assert_allclose(timed_out["latency_s"], float(sim_log["latency_s"].quantile(0.8)), rtol=1e-9)


def test_bad_arguments_are_named(sim_log):
    with pytest.raises(ValueError, match="'rows'"):
        simulate_log(sim_log, 0)
    with pytest.raises(ValueError, match="'timeout_s'"):
        simulate_log(sim_log, 10, timeout_s=-1.0)


def test_cli_writes_a_log_train_can_read_and_refuses_bad_rows(sim_log, tmp_path, run_sloctl):
    from sloctl.datasets.querylog import write_log

    world = write_log(sim_log, tmp_path / "world.parquet")
    out = tmp_path / "big.parquet"
    done = run_sloctl("simulate", "log", "--world", world, "--rows", "1500", "--seed", "7", "--out", out, "--json")
    assert done.returncode == 0, done.stderr
    log = read_log(out)
    assert len(log) == 1500
    meta = read_metadata(out)
    assert meta["simulated_seed"] == "7" and meta["simulated_rows"] == "1500" and "simulated_world_hash" in meta
    bad = run_sloctl("simulate", "log", "--world", world, "--rows", "0", "--out", tmp_path / "x.parquet")
    assert bad.returncode == 2 and "--rows" in bad.stderr and not (tmp_path / "x.parquet").exists()
