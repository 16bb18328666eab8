"""MLflow: record every training run and keep a ``champion`` alias honest.

Each run logs its parameters, the data hash, the feature-schema versions and
the Q-error metrics per split, and registers the predictor as a pyfunc model
(``stage`` or ``iconq``). The alias ``champion`` moves to the new version only
when it beats the current champion on the new run's validation split — both
scored on the same rows — or when there is no champion yet (or the old one
cannot be loaded by this code).
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloctl.control.policies import PolicyDocument
from sloctl.datasets.analysis import overlap_counts
from sloctl.datasets.interactions import FEATURE_SCHEMA_VERSION
from sloctl.datasets.plan_features import PLAN_FEATURE_VERSION
from sloctl.models.metrics import q_error_summary
from sloctl.registry.bundles import load_predictor, save_predictor

__all__ = ["Registration", "connect", "load_model", "load_policy", "pip_requirements", "register", "register_policy"]

CHAMPION = "champion"
#: What each kind of registered model imports, beyond sloctl itself (pinned to the versions installed here).
_KIND_PACKAGES: dict[str, tuple[str, ...]] = {
    "stage": ("lightgbm", "pandas", "numpy"),
    "iconq": ("lightgbm", "pandas", "numpy", "torch"),
    "policy": ("pandas",),
}


def pip_requirements(kind: str) -> list[str]:
    """Exact, minimal pip requirements of a registered ``kind`` (``stage``, ``iconq`` or ``policy``).

    sloctl at this version plus the packages the kind's pyfunc imports, each
    pinned to the installed version (a local build tag such as ``+cpu`` is
    dropped: pip resolves ``torch==2.13.0`` to it).

    Raises:
        ValueError: ``kind`` is not one of the above.
    """
    from importlib.metadata import PackageNotFoundError, version

    if kind not in _KIND_PACKAGES:
        raise ValueError(f"The 'kind' parameter of pip_requirements must be one of {', '.join(_KIND_PACKAGES)}, "
                         f"got {kind!r}.")
    out = []
    for package in ("sloctl", *_KIND_PACKAGES[kind]):
        try:
            out.append(f"{package}=={version(package).split('+')[0]}")
        except PackageNotFoundError:  # running from a checkout that was never installed
            out.append(package)
    return out


@dataclass
class Registration:
    """What :func:`register` did."""

    run_id: str
    name: str
    version: str
    champion: bool
    reason: str
    new_score: float
    old_score: float | None


def connect(tracking_uri: str) -> Any:
    import logging
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    return mlflow


def _validation_score(predictor: Any, log: Any, rows: Any, metric: str) -> float:
    """The selection metric of ``predictor`` on validation ``rows`` of ``log``."""
    import numpy as np


    predicted = predictor.predict(log, neighbours="overlap")
    ok = log["status"].to_numpy() == "ok"
    mask = np.zeros(len(log), bool)
    mask[rows] = True
    mask &= ok
    if "isolated" in metric:
        mask &= overlap_counts(log).to_numpy() == 0
    return q_error_summary(predicted[mask], log["latency_s"].to_numpy()[mask])["p90"]


def register(result: Any, log: Any, *, name: str, tracking_uri: str, experiment: str,
             log_path: str = "", extra_tags: dict[str, str] | None = None) -> Registration:
    """Log ``result`` (a :class:`~sloctl.training.pipeline.TrainResult`) and register it.

    Args:
        result: the trained predictor with metrics and params.
        log: the log it was trained on (to score the old champion on the same
            validation rows).
        name: registered model name (``stage`` or ``iconq``).
        tracking_uri: MLflow tracking/registry store.
        experiment: MLflow experiment name.
        log_path: recorded as a tag.
        extra_tags: more tags for the run.
    """
    import math

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException


    with _quiet_pyfunc_logging():
        from sloctl.registry.pyfunc import LatencyPyfunc, latency_input_example, latency_signature

    mlflow = connect(tracking_uri)
    mlflow.set_experiment(experiment)
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    new_score = _validation_score(result.predictor, log, result.splits["val"], result.selection_metric)
    with mlflow.start_run(run_name=f"train-{name}") as run:
        mlflow.log_params({k: v for k, v in result.params.items()})
        mlflow.set_tags({"data_hash": result.data_hash, "feature_schema_version": FEATURE_SCHEMA_VERSION,
                         "plan_feature_version": PLAN_FEATURE_VERSION, "model_kind": result.predictor.kind,
                         "log_path": str(log_path), "selection_metric": result.selection_metric,
                         **(extra_tags or {})})
        mlflow.log_metrics({k: v for k, v in result.metrics.items() if math.isfinite(v)})
        with tempfile.TemporaryDirectory() as tmp, _quiet_pyfunc_logging():
            bundle = save_predictor(result.predictor, Path(tmp) / "bundle")
            example = latency_input_example(log)
            info = mlflow.pyfunc.log_model(name="model", python_model=LatencyPyfunc(),
                                           artifacts={"bundle": str(bundle)},
                                           pip_requirements=pip_requirements(result.predictor.kind),
                                           signature=latency_signature(result.predictor, example),
                                           input_example=example, registered_model_name=name)
        version = str(info.registered_model_version)
        old_score: float | None = None
        try:
            current = client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException:
            current = None
        if current is None:
            move, reason = True, "no champion yet"
        else:
            try:
                old = load_model(f"models:/{name}@{CHAMPION}", tracking_uri=tracking_uri)
                old_score = _validation_score(old, log, result.splits["val"], result.selection_metric)
            except Exception as exc:  # an unloadable champion is replaced, and we say why
                move, reason = True, f"champion v{current.version} could not be scored ({type(exc).__name__}: {exc})"
            else:
                move = not math.isfinite(old_score) or new_score < old_score
                verdict = "beats" if move else "does not beat"
                reason = (f"v{version} {verdict} champion v{current.version} on validation "
                          f"{result.selection_metric}: {new_score:.4f} vs {old_score:.4f}")
        if move:
            client.set_registered_model_alias(name, CHAMPION, version)
        mlflow.set_tags({"champion_decision": reason, "became_champion": str(move)})
        mlflow.log_metric("selection_score", new_score)
    return Registration(run_id=run.info.run_id, name=name, version=version, champion=move, reason=reason,
                        new_score=new_score, old_score=old_score)


@contextlib.contextmanager
def _quiet_pyfunc_logging():
    """Silence MLflow's advice about our own pyfunc class while it is logged.

    The class is sloctl's (imported by module path on load), and its input is a
    log-shaped frame that type hints cannot describe.
    """
    import logging
    import warnings

    logger = logging.getLogger("mlflow.pyfunc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*type hints.*")
            yield
    finally:
        logger.setLevel(level)


def load_model(uri: str, *, tracking_uri: str) -> Any:
    """Load a registered predictor (``models:/iconq@champion``) or a bundle folder.

    Returns:
        The :class:`~sloctl.models.predictor.LatencyPredictor` inside.
    """
    path = Path(uri)
    if path.is_dir() and (path / "meta.json").is_file():

        return load_predictor(path)
    mlflow = connect(tracking_uri)
    model = mlflow.pyfunc.load_model(uri)
    return model.unwrap_python_model().predictor


def register_policy(policy: PolicyDocument, *, tracking_uri: str, experiment: str, name: str | None = None,
                    params: dict[str, Any] | None = None, metrics: dict[str, float | None] | None = None,
                    tags: dict[str, str] | None = None, alias: str = CHAMPION) -> str:
    """Log a typed policy (:mod:`sloctl.control.policies`) as a pyfunc model and register it.

    The document (``policy.to_doc()``) is validated by reading it back before
    anything is logged, stored as JSON, and registered as ``name`` (default:
    ``policy.kind``). Its provenance becomes run tags (``data_hash``,
    ``source``, ...). Policies (retry budgets, admission settings, execution
    configurations) are chosen by search, not trained against a held-out
    split, so the newest registration becomes the champion; ``alias=""``
    registers without moving it.

    Returns:
        The registered version.
    """
    import json
    import math

    from mlflow import MlflowClient

    with _quiet_pyfunc_logging():
        from sloctl.registry.pyfunc import PolicyPyfunc

    name = name or policy.kind
    doc = policy.to_doc()
    type(policy).from_doc(json.loads(json.dumps(doc)))  # what is registered must load back
    mlflow = connect(tracking_uri)
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=f"tune-{name}"):
        mlflow.set_tags({**policy.provenance, "model_kind": name, "policy_kind": policy.kind,
                         "policy_version": str(policy.version), **(tags or {})})
        mlflow.log_params(params or {})
        mlflow.log_metrics({k: float(v) for k, v in (metrics or {}).items() if v is not None and math.isfinite(v)})
        with tempfile.TemporaryDirectory() as tmp, _quiet_pyfunc_logging():
            path = Path(tmp) / "policy.json"
            path.write_text(json.dumps(doc, indent=2))
            info = mlflow.pyfunc.log_model(name="model", python_model=PolicyPyfunc(), artifacts={"policy": str(path)},
                                           pip_requirements=pip_requirements("policy"), registered_model_name=name)
    version = str(info.registered_model_version)
    if alias:
        MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).set_registered_model_alias(
            name, alias, version)
    return version


def load_policy(uri: str, *, tracking_uri: str, kind: str | None = None) -> PolicyDocument:
    """The typed policy registered under ``uri`` (e.g. ``models:/retry-policy@champion``).

    Documents registered before schema versions existed load as version 1.

    Args:
        uri: a registry URI or a run's model URI.
        tracking_uri: the MLflow store.
        kind: the expected kind (e.g. ``RetryPolicy.kind``); another kind is refused.
    """
    mlflow = connect(tracking_uri)
    with _quiet_pyfunc_logging():
        model = mlflow.pyfunc.load_model(uri)
    policy = model.unwrap_python_model().policy
    if kind is not None and policy.kind != kind:
        raise ValueError(f"The policy at {uri} must be of kind {kind!r}, got {policy.kind!r}.")
    return policy
