"""Studies on a real database (issue 20): parallel workers on one PostgreSQL study, MLflow on PostgreSQL.

The Optuna tests replace the LightGBM fit inside a Stage trial by a formula
of its parameters (a real trial takes seconds); the search space, the
sampler, the storage and the study bookkeeping are ``tune``'s own. The slow
test runs two real ``sloctl tune stage`` workers.
"""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest

from sloctl.config import load_config
from sloctl.training import tune as tune_module
from sloctl.training.pipeline import OBJECTIVES
from sloctl.training.tune import tune


@pytest.fixture
def fast_stage(monkeypatch):
    """Stage trials that score their parameters by a formula instead of fitting LightGBM."""
    def train_stage(log, stage, **kwargs):
        value = 1.0 + abs(stage.learning_rate - 0.05) + 1.0 / stage.num_leaves + 0.01 * stage.min_child_samples
        return SimpleNamespace(metrics={OBJECTIVES["stage"]: value})

    monkeypatch.setattr(tune_module, "train_stage", train_stage)


@pytest.fixture(scope="module")
def cfg():
    return load_config()


def _param_sets(storage, study_name="s"):
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    return [tuple(sorted(t.params.items())) for t in study.trials]


def test_two_workers_on_one_postgres_study_draw_distinct_trials(postgres_server, sim_log, cfg, fast_stage):
    """Issue 20: two workers with the same seed on one study gave identical trials in pairs (4 distinct of 8)."""
    storage = postgres_server.create_database("optuna_two_workers")
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def worker(k):
        try:
            barrier.wait()  # both create the study (and Optuna's tables) at the same moment
            results[k] = tune("stage", sim_log, cfg, trials=8, storage=storage, study_name="s", seed=0,
                              log_to_mlflow=False)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    params = _param_sets(storage)
    assert len(params) == 16 and len(set(params)) == 16
    assert sorted(r.n_new for r in results.values()) == [8, 8]


def test_one_worker_repeats_for_a_seed_and_a_resume_draws_new_trials(tmp_path, sim_log, cfg, fast_stage):
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    for storage in (a, b):
        tune("stage", sim_log, cfg, trials=2, storage=storage, study_name="s", seed=7, log_to_mlflow=False)
    assert _param_sets(a) == _param_sets(b)
    resumed = tune("stage", sim_log, cfg, trials=2, storage=a, study_name="s", seed=7, log_to_mlflow=False)
    assert (resumed.n_trials, resumed.n_new) == (4, 2)
    assert len(set(_param_sets(a))) == 4

def test_tune_logs_its_runs_to_mlflow_on_postgres(postgres_server, sim_log, cfg, fast_stage, tmp_path, monkeypatch):
    """MLflow's tracking store on PostgreSQL (the driver from sloctl[postgres]): parent run, nested trial runs."""
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # a database-backed MLflow keeps artifacts under ./mlruns
    tracking = postgres_server.create_database("mlflow_tune")
    optuna_db = postgres_server.create_database("optuna_mlflow")
    cfg = dataclasses.replace(cfg, registry=dataclasses.replace(cfg.registry, tracking_uri=tracking))
    result = tune("stage", sim_log, cfg, trials=2, storage=optuna_db, study_name="s", seed=0)
    client = MlflowClient(tracking_uri=tracking)
    parent = client.get_run(result.mlflow_run_id)
    assert parent.data.tags["study_name"] == "s"
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.data.tags["trial_number"] for r in children) == ["0", "1"]
    assert all(r.data.metrics["objective_value"] >= 1.0 for r in children)
    # a registered model lives in the same database
    client.create_registered_model("stage-pg")
    version = client.create_model_version("stage-pg", f"runs:/{parent.info.run_id}/model", parent.info.run_id)
    client.set_registered_model_alias("stage-pg", "champion", version.version)
    assert client.get_model_version_by_alias("stage-pg", "champion").run_id == parent.info.run_id


@pytest.mark.slow
def test_two_sloctl_tune_stage_workers_on_postgres(postgres_server, sim_log, tmp_path):
    """The real thing: two `sloctl tune stage` processes, same seed, one PostgreSQL study: 16 distinct trials."""
    import subprocess
    import sys

    log = tmp_path / "log.parquet"
    sim_log.to_parquet(log)
    storage = postgres_server.create_database("optuna_cli_workers")
    cmd = [sys.executable, "-m", "sloctl.cli", "tune", "stage", "--log", str(log), "--trials", "8", "--storage",
           storage, "--study-name", "s", "--seed", "0", "--json"]
    # cwd: the default MLflow store (sqlite:///mlflow.db) lands in tmp_path; created before the workers start
    # (two processes creating MLflow's tables at once collide; at scale workers share an MLflow server)
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db").create_experiment(load_config().registry.experiment)
    workers = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    outs = [w.communicate(timeout=1800) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [o[1][-2000:] for o in outs]
    params = _param_sets(storage)
    assert len(params) == 16 and len(set(params)) == 16
