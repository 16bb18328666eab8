"""Optuna studies for Stage and Iconq+ hyper-parameters.

Studies live in an Optuna storage (SQLite by default), so running the same
study again resumes it: finished trials are kept and new ones are added.
Trials report validation scores as they train and unpromising ones are
pruned (median pruner): Stage per boosting round, Iconq per epoch. The best
trial's parameters and score are logged to MLflow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sloctl.registry.store import connect
from sloctl.training.pipeline import train_iconq, train_stage

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.core.config import IconqSection, RegistrySection
    from sloctl.models.stage import StageConfig


class SloctlConfig(Protocol):
    """The sections a study reads (a :class:`sloctl.config.SloctlConfig` has them)."""

    stage: StageConfig
    iconq: IconqSection
    registry: RegistrySection

__all__ = ["TuneResult", "tune"]


@dataclass
class TuneResult:
    """The study after this call."""

    study_name: str
    n_trials: int
    n_new: int
    best_value: float
    best_params: dict[str, Any]
    mlflow_run_id: str | None


def _stage_trial(trial: Any, log: pd.DataFrame, cfg: SloctlConfig) -> float:
    import optuna


    stage = dataclasses.replace(
        cfg.stage,
        n_estimators=trial.suggest_int("n_estimators", 50, 600, log=True),
        learning_rate=trial.suggest_float("learning_rate", 0.01, 0.3, log=True),
        num_leaves=trial.suggest_int("num_leaves", 4, 63, log=True),
        min_child_samples=trial.suggest_int("min_child_samples", 1, 20),
        reg_lambda=trial.suggest_float("reg_lambda", 1e-4, 10.0, log=True),
    )

    def report(env: Any) -> None:  # LightGBM callback: prune on the validation L1 of log latency
        if env.evaluation_result_list and env.iteration % 10 == 0:
            trial.report(float(env.evaluation_result_list[0][2]), step=env.iteration)
            if trial.should_prune():
                raise optuna.TrialPruned()

    result = train_stage(log, stage, val_fraction=cfg.iconq.val_fraction, test_fraction=cfg.iconq.test_fraction,
                         seed=cfg.iconq.seed, callbacks=[report], risk_quantile=None)
    return result.metrics["val_isolated_q_error_p90"]


def _iconq_trial(trial: Any, log: pd.DataFrame, cfg: SloctlConfig, max_epochs: int) -> float:
    import optuna

    from sloctl.training.lightning import OptunaPruning

    iconq = dataclasses.replace(
        cfg.iconq,
        hidden_dim=trial.suggest_categorical("hidden_dim", [32, 64, 128]),
        embed_dim=trial.suggest_categorical("embed_dim", [32, 64, 128]),
        dropout=trial.suggest_float("dropout", 0.0, 0.4),
        lr=trial.suggest_float("lr", 1e-3, 2e-2, log=True),
        batch_size=trial.suggest_categorical("batch_size", [16, 32, 64]),
        max_epochs=max_epochs,
    )
    pruning = OptunaPruning(trial)
    # a trial's model is scored, not served: no router margin to calibrate
    result = train_iconq(log, cfg.stage, iconq, callbacks=[pruning], risk_quantile=None)
    if pruning.pruned:
        raise optuna.TrialPruned()
    return result.metrics["val_q_error_p90"]


def tune(model: str, log: pd.DataFrame, cfg: SloctlConfig, *, trials: int, storage: str, study_name: str,
         seed: int = 0, max_epochs: int = 30, log_to_mlflow: bool = True,
         on_trial: Callable[[int, float | None, str], None] | None = None) -> TuneResult:
    """Run ``trials`` more trials of the ``model`` study (created or resumed).

    Args:
        model: ``stage`` or ``iconq``.
        log: the query log to train on.
        cfg: base configuration; the study varies some of its fields.
        trials: trials to add in this call.
        storage: Optuna storage URL (``sqlite:///optuna.db``).
        study_name: the study; an existing one is resumed.
        seed: sampler seed.
        max_epochs: epochs per Iconq trial.
        log_to_mlflow: log the best trial as an MLflow run.
        on_trial: called with (trial number, value or None, state) per trial.
    """
    import logging

    import optuna

    if model not in ("stage", "iconq"):
        raise ValueError(f"The 'model' parameter must be 'stage' or 'iconq', got {model!r}.")
    if trials < 1:
        raise ValueError(f"The 'trials' parameter must be >= 1, got {trials!r}.")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    study = optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True, direction="minimize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2))
    before = len(study.trials)
    # a resumed study gets a fresh (still seeded) sampler stream, so it does not retry the first trials
    study.sampler = optuna.samplers.TPESampler(seed=seed + before)

    def objective(trial: Any) -> float:
        if model == "stage":
            return _stage_trial(trial, log, cfg)
        return _iconq_trial(trial, log, cfg, max_epochs)

    def callback(study: Any, trial: Any) -> None:
        if on_trial is not None:
            on_trial(trial.number, trial.value, trial.state.name)

    study.optimize(objective, n_trials=trials, callbacks=[callback], catch=(ValueError,))
    completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not completed:
        raise ValueError(f"Study {study_name!r} has no completed trial yet (all pruned or failed).")
    run_id = None
    if log_to_mlflow:
        run_id = _log_best(study, model, cfg)
    return TuneResult(study_name=study_name, n_trials=len(study.trials), n_new=len(study.trials) - before,
                      best_value=study.best_value, best_params=study.best_params, mlflow_run_id=run_id)


def _log_best(study: Any, model: str, cfg: SloctlConfig) -> str:

    mlflow = connect(cfg.registry.tracking_uri)
    mlflow.set_experiment(cfg.registry.experiment)
    with mlflow.start_run(run_name=f"tune-{model}") as run:
        mlflow.log_params({f"best_{k}": v for k, v in study.best_params.items()})
        mlflow.log_metrics({"best_value": study.best_value, "n_trials": len(study.trials)})
        mlflow.set_tags({"study_name": study.study_name, "best_trial": str(study.best_trial.number),
                         "objective": "val_isolated_q_error_p90" if model == "stage" else "val_q_error_p90"})
    return run.info.run_id
