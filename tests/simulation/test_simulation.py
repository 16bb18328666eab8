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
