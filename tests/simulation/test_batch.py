"""Batch Simulator (AutoSLO §7.3): the result matrix, its determinism, and scheduled spin-ups."""

from __future__ import annotations

import numpy as np
import pytest

from sloctl.control.router import Query
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup
from sloctl.simulation.batch import SimulationPool, WarehouseRunner, cell_seed, simulate_batch
from sloctl.simulation.emulator import WarehouseEmulator

WORLD = WarehouseEmulator({("a", 1): 1.0, ("b", 1): 2.0, ("a", 2): 0.6, ("b", 2): 1.1}, {1: 1.0, 2: 1.0},
                          noise_sigma=0.2)
RUNNER = WarehouseRunner(WORLD, minimum_s=5.0, spinup_delay_s=10.0)
CONFIGS = [ExecutionConfig(), ExecutionConfig(spinups=(ScheduledSpinup(60.0, 2),))]


def workload(seed: int, n: int = 120) -> list[Query]:
    """Quiet, then 1.5x what one size-1 cluster serves, then quiet again."""
    rng = np.random.default_rng(seed)
    rate = np.where((np.arange(n) >= n // 3) & (np.arange(n) < 2 * n // 3), 1.5, 0.4)
    arrivals = np.cumsum(rng.exponential(1 / rate))
    return [Query(i, "a" if rng.random() < 0.6 else "b", float(t), 4.0) for i, t in enumerate(arrivals)]


WORKLOADS = [workload(s) for s in range(3)]


@pytest.fixture(scope="module")
def inline():
    return simulate_batch(CONFIGS, WORKLOADS, runner=RUNNER, workers=1, seed=5)


def test_matrix_holds_every_configuration_on_every_workload(inline):
    assert inline.vr().shape == inline.cost().shape == (2, 3)
    cell = inline[0][1]
    assert cell.n_queries == len(WORKLOADS[1])
    assert np.all(cell.timeline.end_s > cell.timeline.arrival_s)
    assert cell.vr == pytest.approx(cell.timeline.violated.mean())
    assert inline.n_queries() == 2 * sum(len(w) for w in WORKLOADS)


def test_a_scheduled_spinup_adds_a_cluster_and_helps_under_overload(inline):
    plain, scheduled = inline[0][0].timeline, inline[1][0].timeline
    assert plain.cluster_count.tolist() == [1]
    assert scheduled.cluster_count.tolist() == [1, 2] and scheduled.cluster_t_s[1] >= 60.0
    assert inline.vr()[1].mean() < inline.vr()[0].mean() and inline.cost()[1].mean() > inline.cost()[0].mean()


def test_one_and_two_workers_give_identical_matrices_and_report_progress(inline):
    seen = []
    pooled = simulate_batch(CONFIGS, WORKLOADS, runner=RUNNER, workers=2, seed=5,
                            on_progress=lambda done, total: seen.append((done, total)))
    assert pooled.backend == "process" and pooled.equals(inline)
    assert [d for d, _ in seen] == list(range(1, 7)) and {t for _, t in seen} == {6}


def test_a_kept_pool_serves_many_batches_with_simulate_batch_results(inline):
    seen = []
    with SimulationPool(RUNNER, workers=2) as pool:
        first = pool.simulate(CONFIGS, WORKLOADS, seed=5, on_progress=lambda done, total: seen.append(done))
        workers = pool._pool
        second = pool.simulate(CONFIGS[::-1], WORKLOADS, seed=5)  # another batch: the same processes
        assert pool._pool is workers
        third = pool.simulate(CONFIGS[:1], WORKLOADS[:2], seed=6)
    assert pool._pool is None  # shut down on exit
    assert first.backend == "process" and first.equals(inline) and seen == list(range(1, 7))
    assert second[1][2].equals(inline[0][2]) and second[0][1].equals(inline[1][1])
    assert third.equals(simulate_batch(CONFIGS[:1], WORKLOADS[:2], runner=RUNNER, workers=1, seed=6))
    assert SimulationPool(RUNNER, workers=1).simulate(CONFIGS, WORKLOADS, seed=5).equals(inline)


def test_workloads_share_seeds_across_configurations_and_the_base_seed_matters(inline):
    assert cell_seed(5, 0) != cell_seed(5, 1) and cell_seed(5, 0) != cell_seed(6, 0)
    other = simulate_batch(CONFIGS[:1], WORKLOADS, runner=RUNNER, workers=1, seed=6)
    assert not other[0][0].equals(inline[0][0])
    again = simulate_batch(CONFIGS[::-1], WORKLOADS, runner=RUNNER, workers=1, seed=5)
    assert again[1][2].equals(inline[0][2])  # a cell does not depend on its row's position


def test_autoscaler_needs_a_model_based_router():
    from sloctl.control.autoscaler import AutoscalerConfig

    with pytest.raises(ValueError, match="model-based router"):
        RUNNER(ExecutionConfig(autoscaler=AutoscalerConfig()), WORKLOADS[0], 0)


@pytest.mark.slow
def test_ray_gives_the_process_pool_results(inline, ray_local):
    done = []
    on_ray = simulate_batch(CONFIGS, WORKLOADS, runner=RUNNER, ray_address="local", seed=5,
                            on_progress=lambda d, t: done.append((d, t)))
    assert on_ray.backend == "ray" and on_ray.equals(inline)
    assert done == [(k, 6) for k in range(1, 7)]  # inline equals the process pool: the test above


def test_spinup_scheduler_on_simulated_forecasts_only_keeps_what_validation_supports():
    from functools import partial

    from sloctl.control.scheduler import schedule_spinups

    evaluate = partial(simulate_batch, runner=RUNNER, workers=1, seed=5)
    result = schedule_spinups([ExecutionConfig()], evaluate=evaluate, train=WORKLOADS[:2], validation=WORKLOADS[2:],
                              sizes=(1, 2), tau_target=0.05, delta_s=10.0, eta=2, phi=2, sigma_min_s=30.0)
    keys = [(max(0.0, vr - 0.05), cost) for vr, cost in result.finalist_train]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)  # each round strictly improved
    assert result.best in result.finalists and len(result.best.spinups) <= 2
    assert result.best_validation == min(result.finalist_validation, key=lambda o: (max(0.0, o[0] - 0.05), o[1]))
