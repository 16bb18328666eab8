"""MLflow: record every training run and keep a ``champion`` alias honest.

Each run logs its parameters, the data hash, the feature-schema versions,
what it was trained on (provenance: :mod:`sloctl.registry.provenance`, as
tags and MLflow dataset inputs) and the Q-error metrics per split, and
registers the predictor as a pyfunc model (``stage`` or ``iconq``). The alias
``champion`` moves to the new version only when it covers what the champion
was trained on and beats it on the new run's validation rows of the
champion's provenance — both scored on the same rows — or when there is no
champion yet (or the old one cannot be loaded by this code). Policies are
registered by :func:`register_policy` (retry budgets one registered model per
network, :mod:`sloctl.training.retry_budget`).
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
from sloctl.registry.bundles import load_predictor, read_provenance, save_predictor
from sloctl.registry.provenance import Provenance, log_provenance, row_sources

__all__ = ["Registration", "connect", "load_model", "load_model_with_provenance", "load_policy",
           "log_mismatch", "model_provenance", "pip_requirements", "register", "register_policy"]

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
    provenance: Provenance | None = None


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


def _log_frame(mlflow: Any, frame: Any, name: str, context: str, *, source: str | None = None) -> None:
    """``frame`` as an MLflow dataset input (digest, schema, row count, source) of the active run."""
    import warnings

    import mlflow.data

    with warnings.catch_warnings():  # a local path "can be interpreted in multiple ways" by MLflow
        warnings.filterwarnings("ignore", message=".*dataset source.*")
        warnings.filterwarnings("ignore", message=".*integer column.*")
        mlflow.log_input(mlflow.data.from_pandas(frame, source=source or None, name=name), context=context)


def _log_inputs(mlflow: Any, log: Any, splits: dict[str, Any], name: str, log_path: str) -> None:
    """The training, validation and test rows as MLflow dataset inputs."""
    source = log_path if log_path and "," not in log_path else None
    for split, context in (("train", "training"), ("val", "validation"), ("test", "test")):
        _log_frame(mlflow, log.iloc[splits[split]].reset_index(drop=True), f"{name}-{split}", context, source=source)


def _champion_provenance(client: Any, version: Any) -> Provenance | None:
    """The provenance recorded on the run that registered ``version`` (``None``: none recorded)."""
    if not getattr(version, "run_id", None):
        return None
    try:
        return Provenance.from_tags(client.get_run(version.run_id).data.tags)
    except Exception:  # the run was deleted: nothing says what the champion was trained on
        return None


def register(result: Any, log: Any, *, name: str, tracking_uri: str, experiment: str,
             log_path: str = "", extra_tags: dict[str, str] | None = None,
             log_metadata: dict[str, str] | None = None) -> Registration:
    """Log ``result`` (a :class:`~sloctl.training.pipeline.TrainResult`) and register it.

    The run records the provenance of ``log`` (benchmark and scale factor of
    its rows, cluster sizes, log hashes: :mod:`sloctl.registry.provenance`) as
    ``provenance.*`` tags, in the bundle and as MLflow dataset inputs (the
    training, validation and test rows). The ``champion`` alias moves only
    when the new model covers what the champion was trained on (every
    benchmark, scale factor and cluster size) and beats it on the new run's
    validation rows *of the champion's provenance*; a candidate that does not
    cover the champion's data is refused with the reason, never compared on
    rows the champion was not trained for.

    Args:
        result: the trained predictor with metrics and params.
        log: the log it was trained on (to score the old champion on the same
            validation rows).
        name: registered model name (``stage`` or ``iconq``).
        tracking_uri: MLflow tracking/registry store.
        experiment: MLflow experiment name.
        log_path: recorded as a tag (and the datasets' source).
        extra_tags: more tags for the run.
        log_metadata: the log file's metadata (``read_logs_with_metadata``):
            benchmark and scale factor of its rows.
    """
    import math

    import numpy as np
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    with _quiet_pyfunc_logging():
        from sloctl.registry.pyfunc import LatencyPyfunc, latency_input_example, latency_signature

    mlflow = connect(tracking_uri)
    mlflow.set_experiment(experiment)
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    provenance = log_provenance(log, log_metadata, logs=str(log_path))
    val_rows = np.asarray(result.splits["val"])
    new_score = _validation_score(result.predictor, log, val_rows, result.selection_metric)
    with mlflow.start_run(run_name=f"train-{name}") as run:
        mlflow.log_params({k: v for k, v in result.params.items()})
        mlflow.set_tags({"data_hash": result.data_hash, "feature_schema_version": FEATURE_SCHEMA_VERSION,
                         "plan_feature_version": PLAN_FEATURE_VERSION, "model_kind": result.predictor.kind,
                         "log_path": str(log_path), "selection_metric": result.selection_metric,
                         **provenance.to_tags(), **(extra_tags or {})})
        mlflow.log_metrics({k: v for k, v in result.metrics.items() if math.isfinite(v)})
        _log_inputs(mlflow, log, result.splits, name, str(log_path))
        with tempfile.TemporaryDirectory() as tmp, _quiet_pyfunc_logging():
            bundle = save_predictor(result.predictor, Path(tmp) / "bundle", provenance=provenance)
            example = latency_input_example(log, predictor=result.predictor)
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
            move, reason, old_score, new_score = _gate(result, log, log_metadata, provenance, client, current,
                                                       version, name, tracking_uri, new_score)
        if move:
            client.set_registered_model_alias(name, CHAMPION, version)
        mlflow.set_tags({"champion_decision": reason, "became_champion": str(move)})
        mlflow.log_metric("selection_score", new_score)
    return Registration(run_id=run.info.run_id, name=name, version=version, champion=move, reason=reason,
                        new_score=new_score, old_score=old_score, provenance=provenance)


def _gate(result: Any, log: Any, log_metadata: dict[str, str] | None, provenance: Provenance, client: Any,
          current: Any, version: str, name: str, tracking_uri: str, new_score: float
          ) -> tuple[bool, str, float | None, float]:
    """(move the alias?, why, champion's score, candidate's score) against champion version ``current``."""
    import math

    import numpy as np

    metric = result.selection_metric
    rows = np.asarray(result.splits["val"])
    champion = _champion_provenance(client, current)
    note = ""
    if champion is None:
        note = f" (champion v{current.version} records no provenance: compared on all validation rows)"
    else:
        lacks = provenance.lacks(champion)
        if lacks:
            return False, (f"refused: champion v{current.version} was trained on {champion.describe()}, but "
                           f"v{version} was trained on {provenance.describe()}, without {' and '.join(lacks)}; "
                           f"it is not compared on rows the champion was not trained for. Train on a log that "
                           f"covers them, or register it under another name (--name)"), None, new_score
        sources = row_sources(log, log_metadata)[rows]
        sizes = log["cluster_size"].to_numpy()[rows]
        keep = np.isin(sources, list(champion.sources)) & np.isin(sizes, list(champion.cluster_sizes))
        if not keep.any():
            return False, (f"refused: none of v{version}'s validation rows is of the provenance of champion "
                           f"v{current.version} ({champion.describe()}); nothing to compare them on"), None, new_score
        if not keep.all():
            rows = rows[keep]
            note = f" (on the {len(rows)} validation rows of the champion's provenance)"
            new_score = _validation_score(result.predictor, log, rows, metric)
    try:
        old = load_model(f"models:/{name}@{CHAMPION}", tracking_uri=tracking_uri)
        old_score = _validation_score(old, log, rows, metric)
    except Exception as exc:  # an unloadable champion is replaced, and we say why
        return True, f"champion v{current.version} could not be scored ({type(exc).__name__}: {exc})", None, new_score
    move = not math.isfinite(old_score) or new_score < old_score
    verdict = "beats" if move else "does not beat"
    return move, (f"v{version} {verdict} champion v{current.version} on validation {metric}: "
                  f"{new_score:.4f} vs {old_score:.4f}{note}"), old_score, new_score


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
    return load_model_with_provenance(uri, tracking_uri=tracking_uri)[0]


def load_model_with_provenance(uri: str, *, tracking_uri: str) -> tuple[Any, Provenance | None]:
    """A predictor (as :func:`load_model`) and what it was trained on (``None``: not recorded)."""
    path = Path(uri)
    if path.is_dir() and (path / "meta.json").is_file():
        return load_predictor(path), read_provenance(path)
    mlflow = connect(tracking_uri)
    model = mlflow.pyfunc.load_model(uri).unwrap_python_model()
    return model.predictor, getattr(model, "provenance", None)


def model_provenance(uri: str, *, tracking_uri: str) -> Provenance | None:
    """What the model at ``uri`` was trained on, without loading it (``None``: not recorded).

    A bundle folder keeps it in ``meta.json``; a registered model
    (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``) on the tags of the run
    that registered it. Never raises for a model that has none, or a URI it
    cannot resolve (loading the model reports that).
    """
    path = Path(uri)
    if path.is_dir() and (path / "meta.json").is_file():
        return read_provenance(path)
    if not uri.startswith("models:/"):
        return None
    from mlflow import MlflowClient

    connect(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    rest = uri.removeprefix("models:/")
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            version = client.get_model_version_by_alias(name, alias)
        else:
            name, _, number = rest.partition("/")
            version = client.get_model_version(name, number)
    except Exception:
        return None
    return _champion_provenance(client, version)


def log_mismatch(uri: str, log_path: str | Path, *, tracking_uri: str) -> str | None:
    """Why the query log at ``log_path`` is outside what the model at ``uri`` was trained on (None: it is not).

    ``None`` too when the model records no provenance. What ``sloctl serve``
    says about its ``--templates-log``.
    """
    from sloctl.datasets.querylog import read_log, read_metadata

    provenance = model_provenance(uri, tracking_uri=tracking_uri)
    if provenance is None:
        return None
    log = read_log(log_path)
    return provenance.mismatch(sources=row_sources(log, read_metadata(log_path)),
                               cluster_sizes=log["cluster_size"].unique())


def register_policy(policy: PolicyDocument, *, tracking_uri: str, experiment: str, name: str | None = None,
                    params: dict[str, Any] | None = None, metrics: dict[str, float | None] | None = None,
                    tags: dict[str, str] | None = None, alias: str = CHAMPION,
                    inputs: list[tuple[Any, ...]] | None = None) -> str:
    """Log a typed policy (:mod:`sloctl.control.policies`) as a pyfunc model and register it.

    The document (``policy.to_doc()``) is validated by reading it back before
    anything is logged, stored as JSON, and registered as ``name`` (default:
    ``policy.kind``). Its provenance becomes run tags (``data_hash``,
    ``source``, ...). Policies (retry budgets, admission settings, execution
    configurations) are chosen by search, not trained against a held-out
    split, so the newest registration becomes the champion; ``alias=""``
    registers without moving it. ``inputs`` are ``(DataFrame, name, context)``
    or ``(DataFrame, name, context, source)`` logged as MLflow dataset inputs
    (what the policy was chosen on; the source defaults to the policy's).

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
        for frame, input_name, context, *source in inputs or []:
            _log_frame(mlflow, frame, input_name, context, source=source[0] if source else policy.provenance.get(
                "source"))
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
