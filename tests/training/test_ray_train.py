"""`sloctl train iconq --ray-address` (issue 53): Iconq+ trains in Ray Train workers and registers as a local fit does.

Ray runs in local mode (2 CPUs, the ``ray_local`` fixture, started once per session and shut down after it).
Each Ray Train run costs about 12 s of start-up on 2 cores (a controller and 2 workers importing torch); the
two runs here take about 30 s and 17 s.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("ray")

from sloctl.cli import app  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory, sim_log):
    path = tmp_path_factory.mktemp("ray_train")
    sim_log.to_parquet(path / "log.parquet")
    (path / "ray.yaml").write_text(f"registry:\n  tracking_uri: sqlite:///{path / 'mlflow.db'}\n"
                                   "iconq:\n  learn_rows: all\n")
    return path


def _train(folder, *extra):
    args = ["train", "iconq", "--log", folder / "log.parquet", "--config", folder / "ray.yaml", "--max-epochs", "2",
            *extra, "--json"]
    return CliRunner().invoke(app, [str(a) for a in args], env={"SLOCTL_PROGRESS": "lines"})


@pytest.mark.slow  # about 30 s: a Ray Train run (controller and 2 workers importing torch) on 2 cores
def test_two_ray_workers_train_a_registered_model_that_predicts(folder, sim_log, ray_local):
    from mlflow.tracking import MlflowClient

    from sloctl.registry.store import load_model

    result = _train(folder, "--devices", "2", "--ray-address", "local", "--name", "iconq-ray")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["model"] == "iconq-ray" and summary["version"] == "1"
    assert 1.0 <= summary["test"]["p90"] < 10.0
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(client.get_model_version("iconq-ray", "1").run_id)
    params, metrics = run.data.params, run.data.metrics
    assert params["iconq_ray_address"] == "local" and params["iconq_devices"] == "2"
    assert params["iconq_stopped_by"] == "max_epochs" and metrics["epochs"] == 2.0
    # the first worker's figures came back: samples of both workers, and the best checkpoint's loss
    assert metrics["train_samples_per_s"] > 0 and np.isfinite(metrics["best_val_loss"])
    predictor = load_model("models:/iconq-ray@champion", tracking_uri=uri)
    latency_s = predictor.predict(sim_log)
    assert len(latency_s) == len(sim_log) and np.isfinite(latency_s).all() and (latency_s > 0).all()


@pytest.mark.slow  # about 18 s: a Ray Train run per trial
def test_a_study_prunes_a_trial_that_trains_on_ray(sim_log, tmp_path, monkeypatch, ray_local):
    """A trial does not pickle: the pruning callback reopens it from the study's storage in the worker."""
    import optuna
    from optuna_integration import PyTorchLightningPruningCallback

    from sloctl.config import load_config
    from sloctl.training.pipeline import train_iconq

    monkeypatch.chdir(tmp_path)  # a relative SQLite storage, as `sloctl tune` is given by default
    study = optuna.create_study(storage="sqlite:///optuna.db", study_name="s",
                                pruner=optuna.pruners.ThresholdPruner(upper=0.0))  # prunes at the first report
    trial = study.ask()
    base = load_config()
    cfg = dataclasses.replace(base.iconq, devices=2, ray_address="local", max_epochs=3)
    with pytest.raises(optuna.TrialPruned, match="epoch 0"):
        train_iconq(sim_log, base.stage, cfg, callbacks=[PyTorchLightningPruningCallback(trial, "val_q_error_p90")],
                    risk_quantile=None)
    assert list(optuna.load_study(study_name="s", storage="sqlite:///optuna.db").trials[0].intermediate_values) == [0]


def test_a_bad_ray_address_or_missing_ray_is_refused_before_training(folder, monkeypatch):
    import importlib.util
    import sys

    from sloctl.core.config import IconqSection
    from sloctl.core.errors import ConfigError
    from sloctl.training.ray_train import connect

    for bad in ("", "ray://head 10001"):
        result = _train(folder, "--ray-address", bad, "--no-register")
        assert result.exit_code == 2 and "--ray-address" in result.stderr, result.output
    with pytest.raises(ConfigError, match="iconq.ray_address"):
        IconqSection(ray_address=" ")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    result = _train(folder, "--ray-address", "local", "--no-register")
    assert result.exit_code == 2 and "pip install 'sloctl[ray]'" in result.stderr, result.output
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
    with pytest.raises(ImportError, match=r"sloctl\[ray\]"):
        connect("local")


def test_a_local_ray_refuses_more_workers_than_it_has_room_for(ray_local):
    from sloctl.core.config import IconqSection
    from sloctl.training.ray_train import fit_on_ray

    for cfg in (IconqSection(ray_address="local", accelerator="gpu"), IconqSection(ray_address="local", devices=3)):
        with pytest.raises(ValueError, match="iconq.devices asks"):  # not a wait for resources that never come
            fit_on_ray(None, None, cfg, [])
