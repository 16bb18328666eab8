"""Optuna studies people can act on: one metric per study, bound to its log, one MLflow parent, --apply."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sloctl.config import load_config
from sloctl.training.pipeline import OBJECTIVES, train_stage
from sloctl.training.tune import StudyDataError, tune


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    base = load_config()
    # no exact-repeat cache: every validation row is then scored by the booster, so values differ per round
    return dataclasses.replace(base, stage=dataclasses.replace(base.stage, use_cache=False),
                               registry=dataclasses.replace(
                                   base.registry, tracking_uri=f"sqlite:///{tmp_path_factory.mktemp('mlf')}/m.db"))


def _prune_all():
    import optuna

    # every Q-error is >= 1: the first report prunes, so a trial costs 10 boosting rounds
    return optuna.pruners.ThresholdPruner(upper=1.0)


def test_stage_objective_is_the_metric_the_run_reports(sim_log, cfg):
    seen = []

    def record(env):
        seen.append({r[1]: r[2] for r in env.evaluation_result_list})

    result = train_stage(sim_log, dataclasses.replace(cfg.stage, n_estimators=30), callbacks=[record],
                         risk_quantile=None)
    assert seen[-1][OBJECTIVES["stage"]] == pytest.approx(result.metrics[OBJECTIVES["stage"]], rel=1e-9)
    assert seen[-1][OBJECTIVES["stage"]] >= 1.0 and "l1" in seen[-1]  # LightGBM's own L1 is there too


def test_pruned_trials_report_the_objective_not_the_training_loss(sim_log, cfg, tmp_path):
    """Issue 18: pruned trials printed validation log-L1 next to completed trials' p90 Q-error."""
    import optuna

    reports = []
    storage = f"sqlite:///{tmp_path}/o.db"
    with pytest.raises(ValueError, match="no completed trial"):
        tune("stage", sim_log, cfg, trials=2, storage=storage, study_name="s", on_trial=reports.append,
             log_to_mlflow=False, pruner=_prune_all())
    assert [r.state for r in reports] == ["PRUNED", "PRUNED"]
    assert all(r.objective == "val_isolated_q_error_p90" and r.step == 9 and r.value >= 1.0 for r in reports)
    study = optuna.load_study(study_name="s", storage=storage)
    for trial, report in zip(study.trials, reports, strict=True):
        # what was pruned on is the objective of the model at that round (the booster's l1 is < 1 here)
        stage = dataclasses.replace(cfg.stage, **{**trial.params, "n_estimators": 10})
        again = train_stage(sim_log, stage, risk_quantile=None)
        assert trial.intermediate_values[9] == pytest.approx(again.metrics["val_isolated_q_error_p90"], rel=1e-9)
        assert report.value == trial.intermediate_values[9]


def test_iconq_reports_its_objective_every_epoch(sim_log, cfg):
    """Iconq's pruning reads val_q_error_p90 (the study's objective), not val_loss."""
    import lightning as L

    from sloctl.training.pipeline import train_iconq

    class Seen(L.Callback):
        values: list[float] = []

        def on_validation_end(self, trainer, pl_module):
            self.values.append(float(trainer.callback_metrics["val_q_error_p90"]))

    iconq = dataclasses.replace(cfg.iconq, max_epochs=2, hidden_dim=16, embed_dim=16, head_dim=16)
    seen = Seen()
    small = sim_log[sim_log["cluster_id"].isin(["iso-1", "iso-2", "busy-1-2", "busy-2-2"])].reset_index(drop=True)
    result = train_iconq(small, cfg.stage, iconq, callbacks=[seen], risk_quantile=None)
    assert len(seen.values) == 2 and min(seen.values) >= 1.0
    # the model kept is one of the epochs reported: its objective is one of the reported values
    assert np.isclose(seen.values, result.metrics["val_q_error_p90"], rtol=1e-5).any()


def test_a_study_is_bound_to_its_log_and_model(sim_log, cfg, tmp_path):
    """Issue 18: a different log silently joined the same study."""
    storage = f"sqlite:///{tmp_path}/o.db"
    with pytest.raises(ValueError, match="no completed trial"):
        tune("stage", sim_log, cfg, trials=1, storage=storage, study_name="s", log_to_mlflow=False,
             pruner=_prune_all(), log_path="a.parquet")
    other = sim_log.iloc[: len(sim_log) // 2]
    with pytest.raises(StudyDataError, match=r"was run on a log with data hash \w+ \(a.parquet\).*--study-name s-"):
        tune("stage", other, cfg, trials=1, storage=storage, study_name="s", log_to_mlflow=False)
    with pytest.raises(StudyDataError, match="tunes stage, not iconq"):
        tune("iconq", sim_log, cfg, trials=1, storage=storage, study_name="s", log_to_mlflow=False)


def test_resuming_a_study_reuses_its_mlflow_parent_run(sim_log, cfg, tmp_path):
    """Issue 18: each resume made a new MLflow run."""
    import mlflow
    import optuna

    storage = f"sqlite:///{tmp_path}/o.db"
    for _ in range(2):
        with pytest.raises(ValueError, match="no completed trial"):
            tune("stage", sim_log, cfg, trials=1, storage=storage, study_name="p", pruner=_prune_all())
    parent = optuna.load_study(study_name="p", storage=storage).user_attrs["mlflow_parent_run_id"]
    mlflow.set_tracking_uri(cfg.registry.tracking_uri)
    runs = mlflow.search_runs(experiment_names=[cfg.registry.experiment],
                              filter_string="tags.study_name = 'p'", output_format="list")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
    assert [r.info.run_id for r in parents] == [parent] and len(children) == 2  # one nested run per trial


def test_tune_apply_trains_and_registers_the_best_parameters(sim_log, cfg, tmp_path):
    """Issue 18: there was no way to train with the best parameters."""
    import optuna
    from mlflow import MlflowClient
    from typer.testing import CliRunner

    from sloctl.cli import app
    from sloctl.datasets.querylog import write_log

    write_log(sim_log, tmp_path / "log.parquet")
    storage = f"sqlite:///{tmp_path}/o.db"
    (tmp_path / "c.yaml").write_text(f"registry:\n  tracking_uri: {cfg.registry.tracking_uri}\n"
                                     f"  optuna_storage: {storage}\nstage:\n  use_cache: false\n")
    best = {"n_estimators": 20, "learning_rate": 0.2, "num_leaves": 7, "min_child_samples": 3, "reg_lambda": 0.5}
    study = optuna.create_study(study_name="stage", storage=storage, direction="minimize")
    study.enqueue_trial(best)  # the one trial this run adds: cheap, and so the best
    out = CliRunner().invoke(app, ["tune", "stage", "--log", str(tmp_path / "log.parquet"), "--trials", "1",
                                   "--apply", "--json", "--config", str(tmp_path / "c.yaml")])
    assert out.exit_code == 0, out.output
    assert "trial 1/1 (#0) complete: val_isolated_q_error_p90" in out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["best_params"] == best and summary["applied"]["name"] == "stage"
    client = MlflowClient(tracking_uri=cfg.registry.tracking_uri, registry_uri=cfg.registry.tracking_uri)
    version = client.get_model_version("stage", summary["applied"]["version"])
    params = client.get_run(version.run_id).data.params
    assert {k: params[k] for k in best} == {k: str(v) for k, v in best.items()}


def test_tune_iconq_shows_each_trial_s_epochs_with_samples_per_second(sim_log, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from sloctl.cli import app
    from sloctl.datasets.querylog import write_log

    monkeypatch.setenv("SLOCTL_PROGRESS", "lines")
    write_log(sim_log, tmp_path / "log.parquet")
    (tmp_path / "c.yaml").write_text(f"registry:\n  tracking_uri: sqlite:///{tmp_path}/m.db\n"
                                     f"  optuna_storage: sqlite:///{tmp_path}/o.db\n")
    out = CliRunner().invoke(app, ["tune", "iconq", "--log", str(tmp_path / "log.parquet"), "--trials", "1",
                                   "--max-epochs", "1", "--json", "--config", str(tmp_path / "c.yaml")])
    assert out.exit_code == 0, out.output
    assert "tune iconq: trial 1/1, epoch 1/1:" in out.stderr and "ETA" in out.stderr
    assert "trial 1/1 (#0) complete" in out.stderr and "tune iconq" not in out.stdout
