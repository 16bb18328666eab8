"""`sloctl tune policy --ray` (issue 20, part 3): Ray runs the Batch Simulator, with the process pool's result.

Ray runs in local mode (2 CPUs, the ``ray_local`` fixture, started once per session).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sloctl.cli import app


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, sim_log):
    folder = tmp_path_factory.mktemp("policy_ray")
    hours = pd.date_range("2024-03-01", periods=3 * 24, freq="h")
    shape = 5 + 25 * np.exp(-0.5 * ((hours.hour.to_numpy() - 14) / 3.0) ** 2)  # an afternoon peak
    pd.DataFrame({"instance_id": 0, "timestamp": hours.strftime("%Y-%m-%d %H:%M:%S"),
                  "query_count": shape.round().astype(int)}).to_parquet(folder / "hourly.parquet")
    sim_log.to_parquet(folder / "log.parquet")
    return folder


def _tune(folder, *extra):
    args = ["tune", "policy", "--history", folder / "hourly.parquet", "--log", folder / "log.parquet", "--days", "2",
            "--strategy", "grid", "--budget", "2", "--top-k", "1", "--seed", "3", "--no-register", *extra, "--json"]
    result = CliRunner().invoke(app, [str(a) for a in args], env={"SLOCTL_PROGRESS": "lines"})
    assert result.exit_code == 0, result.output
    try:
        summary = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise AssertionError(f"no JSON on stdout: {result.stdout[-800:]!r}; stderr: {result.stderr[-800:]!r}") from None
    summary.pop("wall_s", None)
    return summary, result.stderr


@pytest.mark.slow
def test_tune_policy_on_ray_gives_the_process_pool_execution_config(inputs, ray_local):
    # one local process here: tests/simulation/test_batch.py shows it gives the process pool's matrices
    on_pool, _ = _tune(inputs, "--workers", "1")
    on_ray, progress = _tune(inputs, "--ray")  # --ray alone: the local cluster (here the one already started)
    assert on_ray == on_pool
    assert on_ray["simulations"] > 0 and on_ray["start_sizes"]
    # the progress line counts cells (configurations x forecasts) up to every simulation run
    assert f"{on_ray['simulations']}/{on_ray['simulations']} (100%)" in progress


def test_tune_policy_ray_option_takes_an_address(inputs, monkeypatch):
    import sloctl.training.day_plan as day_plan

    seen = []

    def fake_run(*args, ray_address=None, on_progress=None, **kwargs):
        seen.append(ray_address)
        on_progress(1, 1)
        return {"x": 1}

    monkeypatch.setattr(day_plan, "tune_execution_plan", fake_run)
    for extra, expected in ((["--ray", "ray://head:10001"], "ray://head:10001"), (["--ray"], "local"), ([], None)):
        _tune(inputs, *extra)
        assert seen[-1] == expected
    refused = CliRunner().invoke(app, ["tune", "policy", "--history", str(inputs / "hourly.parquet"), "--log",
                                       str(inputs / "log.parquet"), "ray://head:10001"])
    assert refused.exit_code == 2 and "needs --ray" in refused.stderr and len(seen) == 3


@pytest.mark.slow
def test_a_runner_ships_its_model_to_hosts_without_the_folder(trained_models, sim_log, tmp_path, ray_local):
    """On a Ray cluster of several hosts the driver's model folder exists only on the driver's host."""
    import dataclasses

    from sloctl.control.router import Query
    from sloctl.control.scheduler import ExecutionConfig
    from sloctl.experiments.warehouse import ScalingExperimentConfig, scaling_setup
    from sloctl.registry.bundles import save_predictor
    from sloctl.simulation.batch import WarehouseRunner, pack_folder, simulate_batch

    world, _, slo_ref, templates, mean_iso, table = scaling_setup(sim_log, ScalingExperimentConfig(seed=0))
    save_predictor(trained_models["stage"].predictor, tmp_path / "model")
    here = WarehouseRunner(world, router="stage", predictor_dir=str(tmp_path / "model"), table=table)
    elsewhere = dataclasses.replace(here, predictor_dir=str(tmp_path / "not-on-this-host"),
                                    predictor_bundle=pack_folder(tmp_path / "model"))
    queries = [Query(i, templates[i % len(templates)], 0.3 * i * mean_iso, 3 * slo_ref[templates[i % len(templates)]])
               for i in range(30)]
    local = simulate_batch([ExecutionConfig(start_sizes=(1, 1))], [queries], runner=here, workers=1, seed=2)
    shipped = simulate_batch([ExecutionConfig(start_sizes=(1, 1))], [queries], runner=elsewhere, ray_address="local",
                             seed=2)
    assert shipped.backend == "ray" and shipped.equals(local)
    with pytest.raises(FileNotFoundError):
        dataclasses.replace(elsewhere, predictor_bundle=None)(ExecutionConfig(), queries, 2)
