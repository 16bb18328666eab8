"""Optuna studies for Stage and Iconq+ hyper-parameters.

Studies live in an Optuna storage (SQLite by default), so running the same
study again resumes it: finished trials are kept and new ones are added.

* **One metric per study.** A study minimises the model's selection metric
  (:data:`~sloctl.training.pipeline.OBJECTIVES`: ``val_isolated_q_error_p90``
  for Stage, ``val_q_error_p90`` for Iconq+), and trials report that same
  metric as they train, so the median pruner compares like with like and a
  pruned trial's last value reads on the same scale as a finished one's.
  Stage reports every 10 boosting rounds through
  :class:`~sloctl.training.pipeline.StageObjective` and
  ``optuna_integration.LightGBMPruningCallback``; Iconq+ every epoch through
  ``optuna_integration.PyTorchLightningPruningCallback``.
* **Bound to its data.** A study records the data hash of the log it was
  created on (study user attribute ``data_hash``), the model and the epoch
  limit; resuming it on another log, for another model, is refused with
  :class:`StudyDataError` (name a new study instead).
* **One MLflow parent run per study**, created on the first call and reused
  by every resume (its id is the study's ``mlflow_parent_run_id``), with one
  nested run per trial: its parameters, state, the objective it reported as
  it trained (one metric history, steps = rounds or epochs) and, when it
  completed, its value (``objective_value``). (``optuna_integration``'s
  ``MLflowCallback`` does the same without the history, and is deprecated.)
* :func:`best_config` gives the configuration with the best trial's
  parameters, which ``sloctl tune ... --apply`` trains and registers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sloctl.core.errors import SloctlError
from sloctl.core.kinds import ModelKind
from sloctl.registry.store import connect
from sloctl.training.pipeline import OBJECTIVES, data_hash, objective_of, train_iconq, train_stage

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.core.config import IconqSection, RegistrySection
    from sloctl.models.stage import StageConfig


class StudyConfig(Protocol):
    """The sections a study reads (a :class:`sloctl.config.SloctlConfig` has them)."""

    stage: StageConfig
    iconq: IconqSection
    registry: RegistrySection


__all__ = ["StudyDataError", "TrialReport", "StudyResult", "best_config", "tune"]

_DATA = "data_hash"
_PARENT = "mlflow_parent_run_id"


class StudyDataError(SloctlError, ValueError):
    """A study was resumed on another log (or for another model) than the one it was created on."""


@dataclass(frozen=True)
class TrialReport:
    """One finished trial, as progress.

    Attributes:
        number: the trial's number in the study.
        state: ``COMPLETE``, ``PRUNED`` or ``FAIL``.
        objective: the metric the study minimises (``val_q_error_p90``, ...).
        value: the objective of a completed trial; of a pruned one, the last
            value it reported (same metric), with ``step`` the round or epoch;
            ``None`` for a failed trial.
        step: the boosting round or epoch of a pruned trial's value (``None`` otherwise).
        params: the trial's parameters.
        best_value: the best completed value in the study so far (``None``: none yet).
        done: trials finished in this call; ``total``: trials asked for in this call.
    """

    number: int
    state: str
    objective: str
    value: float | None
    step: int | None
    params: dict[str, Any]
    best_value: float | None
    done: int
    total: int


@dataclass
class StudyResult:
    """The study after this call."""

    study_name: str
    n_trials: int
    n_new: int
    best_value: float
    best_params: dict[str, Any]
    mlflow_run_id: str | None
    objective: str = ""
    data_hash: str = ""
    max_epochs: int | None = None


def _stage_config(base: StageConfig, params: dict[str, Any]) -> StageConfig:
    keys = ("n_estimators", "learning_rate", "num_leaves", "min_child_samples", "reg_lambda")
    return dataclasses.replace(base, **{k: params[k] for k in keys if k in params})


def _iconq_config(base: IconqSection, params: dict[str, Any], max_epochs: int) -> IconqSection:
    keys = ("hidden_dim", "embed_dim", "dropout", "lr", "batch_size")
    return dataclasses.replace(base, max_epochs=max_epochs, **{k: params[k] for k in keys if k in params})


def _stage_trial(trial: Any, log: pd.DataFrame, cfg: StudyConfig) -> float:
    from optuna_integration import LightGBMPruningCallback

    trial.suggest_int("n_estimators", 50, 600, log=True)
    trial.suggest_float("learning_rate", 0.01, 0.3, log=True)
    trial.suggest_int("num_leaves", 4, 63, log=True)
    trial.suggest_int("min_child_samples", 1, 20)
    trial.suggest_float("reg_lambda", 1e-4, 10.0, log=True)
    stage = _stage_config(cfg.stage, trial.params)
    # StageObjective (added by train_stage) puts the objective into LightGBM's eval results every 10 rounds
    pruning = LightGBMPruningCallback(trial, objective_of("stage", stage), valid_name="valid_0",
                                      report_interval=10)
    result = train_stage(log, stage, val_fraction=cfg.iconq.val_fraction, test_fraction=cfg.iconq.test_fraction,
                         seed=cfg.iconq.seed, callbacks=[pruning], risk_quantile=None)
    return result.metrics[objective_of("stage", stage)]


def _iconq_trial(trial: Any, log: pd.DataFrame, cfg: StudyConfig, max_epochs: int,
                 on_batch: Callable[[int, int, int, float], None] | None = None) -> float:
    from optuna_integration import PyTorchLightningPruningCallback

    trial.suggest_categorical("hidden_dim", [32, 64, 128])
    trial.suggest_categorical("embed_dim", [32, 64, 128])
    trial.suggest_float("dropout", 0.0, 0.4)
    trial.suggest_float("lr", 1e-3, 2e-2, log=True)
    trial.suggest_categorical("batch_size", [16, 32, 64])
    iconq = _iconq_config(cfg.iconq, trial.params, max_epochs)
    pruning = PyTorchLightningPruningCallback(trial, monitor=OBJECTIVES["iconq"])  # raises TrialPruned in fit
    # a trial's model is scored, not served: no router margin to calibrate
    result = train_iconq(log, cfg.stage, iconq, callbacks=[pruning], risk_quantile=None, on_batch=on_batch)
    return result.metrics[OBJECTIVES["iconq"]]


def best_config(model: str, params: dict[str, Any], cfg: Any, *, max_epochs: int | None = None) -> Any:
    """``cfg`` with ``model``'s section set to a trial's ``params`` (Iconq: and ``max_epochs``).

    What ``sloctl tune ... --apply`` trains with: the parameters a study
    found, the rest of the configuration as given.
    """
    if model == ModelKind.STAGE:
        return dataclasses.replace(cfg, stage=_stage_config(cfg.stage, params))
    if model == ModelKind.ICONQ:
        epochs = cfg.iconq.max_epochs if max_epochs is None else max_epochs
        return dataclasses.replace(cfg, iconq=_iconq_config(cfg.iconq, params, epochs))
    raise ValueError(f"The 'model' parameter must be 'stage' or 'iconq', got {model!r}.")


def _bind(study: Any, model: str, log_hash: str, log_path: str, max_epochs: int, storage: str,
          objective: str) -> None:
    """Record what ``study`` runs on, or refuse when it was created on other data."""
    attrs = study.user_attrs
    if _DATA not in attrs:  # a new study (or one created before studies were bound): bind it now
        study.set_user_attr(_DATA, log_hash)
        study.set_user_attr("log_path", log_path)
        study.set_user_attr("model", model)
        study.set_user_attr("objective", objective)
        study.set_user_attr("max_epochs", max_epochs)
        return
    name = study.study_name
    if attrs.get("model", model) != model:
        raise StudyDataError(f"Study {name!r} in {storage} tunes {attrs['model']}, not {model}; name another study "
                             f"(--study-name {model}).")
    if attrs[_DATA] != log_hash:
        raise StudyDataError(
            f"Study {name!r} in {storage} was run on a log with data hash {attrs[_DATA]} "
            f"({attrs.get('log_path') or 'path not recorded'}); this log hashes to {log_hash}. Trials of one "
            f"study must be scored on the same log: resume it with that log, or start a new study "
            f"(--study-name {name}-{log_hash[:8]}).")
    if attrs.get("objective", objective) != objective:
        raise StudyDataError(f"Study {name!r} in {storage} minimises {attrs['objective']}, not {objective} "
                             f"(stage.train_on changed); use a new study (--study-name {name}-{objective}).")
    if model == ModelKind.ICONQ and attrs.get("max_epochs", max_epochs) != max_epochs:
        raise StudyDataError(f"Study {name!r} in {storage} ran its trials with --max-epochs "
                             f"{attrs['max_epochs']}, not {max_epochs}; use the same limit or a new study.")


def _parent_run(mlflow: Any, study: Any, model: str, log_hash: str) -> Any:
    """The study's MLflow parent run, started (resumed when the study already has one)."""
    from mlflow.exceptions import MlflowException

    run_id = study.user_attrs.get(_PARENT)
    if run_id:
        try:
            if mlflow.get_run(run_id).info.lifecycle_stage == "active":
                return mlflow.start_run(run_id=run_id)
        except MlflowException:  # deleted, or another store: start a new parent
            pass
    run = mlflow.start_run(run_name=f"tune-{model}-{study.study_name}")
    objective = study.user_attrs.get("objective", OBJECTIVES[model])
    mlflow.set_tags({"study_name": study.study_name, "objective": objective, "data_hash": log_hash,
                     "model_kind": model})
    study.set_user_attr(_PARENT, run.info.run_id)
    return run


def tune(model: str, log: pd.DataFrame, cfg: StudyConfig, *, trials: int, storage: str, study_name: str,
         seed: int = 0, max_epochs: int = 30, log_to_mlflow: bool = True,
         on_trial: Callable[[TrialReport], None] | None = None, log_path: str = "", pruner: Any = None,
         on_batch: Callable[[int, int, int, float], None] | None = None) -> StudyResult:
    """Run ``trials`` more trials of the ``model`` study (created or resumed).

    Args:
        model: ``stage`` or ``iconq``.
        log: the query log to train on (the study is bound to its data hash).
        cfg: base configuration; the study varies some of its fields.
        trials: trials to add in this call.
        storage: Optuna storage URL (``sqlite:///optuna.db``).
        study_name: the study; an existing one is resumed.
        seed: sampler seed.
        max_epochs: epochs per Iconq trial (recorded with the study).
        log_to_mlflow: one parent run per study (reused on resume), one nested run per trial.
        on_trial: called with a :class:`TrialReport` after each trial.
        on_batch: Iconq trials: called after each training batch with (epoch,
            samples done this epoch, samples per epoch, samples per second), as
            :func:`~sloctl.training.pipeline.train_iconq` calls it.
        log_path: recorded with the study (named when another log is refused).
        pruner: an Optuna pruner (default: median, 2 start-up trials, 2 warm-up steps).

    Raises:
        StudyDataError: the study was created on another log or for another model.
        ValueError: bad arguments, or no trial of the study completed.
    """
    import logging

    import optuna

    from sloctl.training.optuna_shared import TrialSeededSampler, open_storage

    if model not in OBJECTIVES:
        raise ValueError(f"The 'model' parameter must be 'stage' or 'iconq', got {model!r}.")
    if trials < 1:
        raise ValueError(f"The 'trials' parameter must be >= 1, got {trials!r}.")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    objective_name = objective_of(model, cfg.stage)
    log_hash = data_hash(log)
    study = optuna.create_study(study_name=study_name, storage=open_storage(storage), load_if_exists=True,
                                direction="minimize",
                                pruner=pruner or optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2))
    _bind(study, model, log_hash, log_path, max_epochs, storage, objective_name)
    # one seeded stream per trial (seed, trial number, trial id): parallel workers on one study and resumed
    # studies draw new trials, one worker on a fresh storage repeats for a seed (training/optuna_shared.py)
    study.sampler = TrialSeededSampler(seed)

    def objective(trial: Any) -> float:
        if model == ModelKind.STAGE:
            return _stage_trial(trial, log, cfg)
        return _iconq_trial(trial, log, cfg, max_epochs, on_batch)

    done = [0]

    def report(study: Any, trial: Any) -> None:
        done[0] += 1
        if on_trial is None:
            return
        value, step = trial.value, None
        if trial.state.name == "PRUNED" and trial.intermediate_values:
            step = max(trial.intermediate_values)
            value = trial.intermediate_values[step]
        completed = [t.value for t in study.trials if t.state.name == "COMPLETE" and t.value is not None]
        on_trial(TrialReport(number=trial.number, state=trial.state.name, objective=objective_name,
                             value=None if value is None or not math.isfinite(value) else float(value), step=step,
                             params=dict(trial.params), best_value=min(completed) if completed else None,
                             done=done[0], total=trials))

    callbacks: list[Any] = [report]
    run_id = None
    if log_to_mlflow:
        mlflow = connect(cfg.registry.tracking_uri)
        mlflow.set_experiment(cfg.registry.experiment)
        parent = _parent_run(mlflow, study, model, log_hash)
        run_id = parent.info.run_id

        def log_trial(study: Any, trial: Any) -> None:
            _log_trial(mlflow, trial, objective_name, {"study_name": study_name, "data_hash": log_hash})

        callbacks.insert(0, log_trial)
    try:
        study.optimize(objective, n_trials=trials, callbacks=callbacks, catch=(ValueError,))
        completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not completed:
            raise ValueError(f"Study {study_name!r} has no completed trial yet (all pruned or failed).")
        if log_to_mlflow:
            _log_best(mlflow, study, objective_name)
    finally:
        if log_to_mlflow:
            mlflow.end_run()
    # n_new: the trials this call ran (other workers on the same study add trials too)
    return StudyResult(study_name=study_name, n_trials=len(study.trials), n_new=done[0],
                      best_value=study.best_value, best_params=study.best_params, mlflow_run_id=run_id,
                      objective=objective_name, data_hash=log_hash,
                      max_epochs=max_epochs if model == ModelKind.ICONQ else None)


def _log_trial(mlflow: Any, trial: Any, objective_name: str, tags: dict[str, str]) -> None:
    """One nested run for ``trial`` under the active parent: params, state, the objective's history and value."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(objective_name, float(v), now, int(step)) for step, v in sorted(trial.intermediate_values.items())
               if math.isfinite(v)]
    if trial.value is not None and math.isfinite(trial.value):
        metrics.append(Metric("objective_value", float(trial.value), now, 0))
    with mlflow.start_run(run_name=f"trial-{trial.number}", nested=True) as run:
        mlflow.set_tags({**tags, "trial_number": str(trial.number), "trial_state": trial.state.name,
                         "objective": objective_name})
        mlflow.log_params(trial.params)
        if metrics:
            mlflow.MlflowClient().log_batch(run.info.run_id, metrics=metrics)


def _log_best(mlflow: Any, study: Any, objective_name: str) -> None:
    """The study so far on its parent run: best value and trial (metrics move with each resume), best parameters."""
    import json

    states = [t.state.name for t in study.trials]
    step = len(study.trials)
    mlflow.log_metrics({"best_value": study.best_value, "n_trials": step,
                        "n_pruned": states.count("PRUNED"), "n_complete": states.count("COMPLETE")}, step=step)
    mlflow.set_tags({"best_trial": str(study.best_trial.number), "best_params": json.dumps(study.best_params),
                     "objective": objective_name})
