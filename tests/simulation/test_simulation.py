from __future__ import annotations

import numpy as np
import pytest

from sloctl.control.router import Query, RoundRobinRouter
from sloctl.simulation.emulator import WarehouseEmulator, calibrate, replay_processor_sharing
from sloctl.simulation.engine import WarehouseSimulator


def test_processor_sharing_replay():
    # two equal jobs together share the cluster: both end at 2x their service time (alpha = 1)
    np.testing.assert_allclose(replay_processor_sharing(np.array([0.0, 0.0]), np.array([1.0, 1.0]), 1.0), [2, 2])
    # a job alone is not slowed down
    np.testing.assert_allclose(replay_processor_sharing(np.array([0.0, 5.0]), np.array([1.0, 1.0]), 1.0), [1, 6])
    # with alpha = 0 overlap is free
    np.testing.assert_allclose(replay_processor_sharing(np.array([0.0, 0.5]), np.array([1.0, 1.0]), 0.0), [1, 1.5])


def test_calibration_recovers_interference_of_a_known_world(sim_log):
    world, report = calibrate(sim_log, seed=0)
    # sim_log comes from processor sharing on `size` cores: rate min(1, s/k), i.e. about k^-1 under load
    assert 0.6 <= world.alpha[1] <= 1.2
    assert report.n_heldout_runs >= 1
    assert report.heldout_q_error["p50"] < 1.5


def world() -> WarehouseEmulator:
    return WarehouseEmulator(isolated_s={("a", 1): 1.0, ("b", 1): 3.0}, alpha={1: 1.0}, noise_sigma=0.2)


def queries(n: int = 40) -> list[Query]:
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1.0, n))
    return [Query(i, "a" if i % 3 else "b", float(t), 4.0) for i, t in enumerate(arrivals)]


def test_simulator_is_deterministic_for_a_seed_and_bills_every_cluster():
    runs = [WarehouseSimulator(world(), [("c1", 1), ("c2", 1)], RoundRobinRouter(), minimum_s=5, seed=s).run(queries())
            for s in (7, 7, 8)]
    assert runs[0].queries.equals(runs[1].queries) and runs[0].cost == runs[1].cost
    assert not runs[0].queries["latency_s"].equals(runs[2].queries["latency_s"])
    result = runs[0]
    assert len(result.queries) == 40 and (result.queries["latency_s"] > 0).all()
    assert set(result.cost_by_cluster) == {"c1", "c2"} and result.cost > 0
    assert 0.0 <= result.violation_rate <= 1.0


def test_unknown_template_is_a_clear_error():
    with pytest.raises(KeyError, match="No isolated latency measured for template 'zzz'"):
        world().service_s("zzz", 1)


def test_autoscaler_spins_up_under_overload_and_lowers_violations(sim_log):
    from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig, SpinupTrigger
    from sloctl.control.router import StageCostRouter
    from sloctl.models.online import OnlinePredictor
    from sloctl.models.predictor import LatencyPredictor
    from sloctl.models.stage import StageConfig
    from sloctl.training.pipeline import fit_stage

    emulator, _ = calibrate(sim_log, seed=0)
    stage = fit_stage(sim_log, np.arange(len(sim_log)), StageConfig(), np.zeros(len(sim_log), int))
    table = sim_log.drop_duplicates("template").reset_index(drop=True)
    templates = sorted(t for t in emulator.templates()
                       if (t, 1) in emulator.isolated_s and (t, 2) in emulator.isolated_s)
    mean_iso = float(np.mean([emulator.isolated_s[(t, 1)] for t in templates]))
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(mean_iso / 1.5, 200))  # 1.5x what one size-1 cluster serves
    names = [templates[i % len(templates)] for i in range(len(arrivals))]
    queries = [Query(i, name, float(t), 3 * emulator.isolated_s[(name, 1)])
               for i, (name, t) in enumerate(zip(names, arrivals, strict=True))]

    def run(mode):
        router = StageCostRouter(OnlinePredictor(LatencyPredictor(stage), table, use_iconq=False))
        config = AutoscalerConfig(window_s=20 * mean_iso, spinup_delay_s=5 * mean_iso, theta=10, tau_trigger=0.1,
                                  mu=15, t_idle_s=1e9, t_min_lifetime_s=1e9)
        autoscaler = Autoscaler(config, SpinupTrigger(10, 0.1), router, StageCostRouter, mode=mode,
                                minimum_s=5 * mean_iso)
        return WarehouseSimulator(emulator, [("c0", 1)], router, minimum_s=5 * mean_iso, seed=3,
                                  autoscaler=autoscaler).run(queries)

    idle, scaled = run("none"), run("add")
    assert not idle.events
    assert any(e["event"] == "spin_up" for e in scaled.events)
    assert scaled.violation_rate < idle.violation_rate
    assert len(scaled.queries) == len(queries)
