"""Save and load a :class:`~sloctl.models.predictor.LatencyPredictor` as a folder.

Layout: ``meta.json`` (kind, schema versions, variant, network config,
feature scaler, the Stage model as LightGBM text, the router's SLO margin with
its calibration under ``router_calibration``, the feature columns it learned
from under ``feature_columns``), for Iconq ``iconq.pt`` (the
network's ``state_dict``), and ``templates.parquet`` (one row of plan features
per template seen in training, named by ``meta["templates"]``), and what the
model was trained on (``meta["provenance"]``, :mod:`sloctl.registry.provenance`), and how its log's
SQL text became features (``meta["sql"]``: the dialect, and ``catalog.csv``, the table statistics;
:class:`~sloctl.models.predictor.SqlSpec`). Loading checks
the feature-schema version, so a bundle from another layout is refused instead
of predicting garbage; a bundle written before margins and tables travelled
with the model loads with both ``None``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from sloctl.core.errors import SloctlError
from sloctl.core.kinds import ModelKind
from sloctl.datasets.interactions import FEATURE_SCHEMA_VERSION, FeatureScaler
from sloctl.datasets.plan_features import PLAN_FEATURE_VERSION, plan_feature_version_on_read
from sloctl.models.calibration import MarginCalibration
from sloctl.models.predictor import VARIANTS, LatencyPredictor, SqlSpec
from sloctl.models.stage import StageModel
from sloctl.registry.provenance import Provenance

__all__ = ["ModelSchemaError", "check_log_schema", "load_predictor", "read_provenance", "save_predictor"]

TEMPLATES_FILE = "templates.parquet"
CATALOG_FILE = "catalog.csv"


class ModelSchemaError(SloctlError, ValueError):
    """A model and a log (or this code) disagree on the feature schema."""


def save_predictor(predictor: LatencyPredictor, folder: str | Path, *, provenance: Provenance | None = None) -> Path:
    """Write ``predictor`` into ``folder`` (created), with the ``provenance`` of its training log if given."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "kind": predictor.kind,
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "plan_feature_version": PLAN_FEATURE_VERSION,
        "stage": predictor.stage.to_dict(),
    }
    if predictor.net is not None:
        meta["variant"] = predictor.variant.name
        meta["iconq_config"] = asdict(predictor.net.config)
        meta["scaler"] = predictor.scaler.to_dict()
        torch.save(predictor.net.state_dict(), folder / "iconq.pt")
    if predictor.calibration is not None:
        meta["router_calibration"] = predictor.calibration.to_dict()
    if predictor.templates is not None:
        predictor.templates.to_parquet(folder / TEMPLATES_FILE, index=False)
        meta["templates"] = TEMPLATES_FILE
    if predictor.feature_columns is not None:
        meta["feature_columns"] = list(predictor.feature_columns)
    if predictor.sql is not None:
        meta["sql"] = {"dialect": predictor.sql.dialect, "catalog": None}
        if predictor.sql.catalog is not None:
            predictor.sql.catalog.to_csv(folder / CATALOG_FILE)
            meta["sql"]["catalog"] = CATALOG_FILE
    if provenance is not None:
        meta["provenance"] = provenance.to_dict()
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def load_predictor(folder: str | Path) -> LatencyPredictor:
    """Read a predictor saved by :func:`save_predictor`.

    Raises:
        ModelSchemaError: the bundle was written for another feature schema.
    """
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    if meta.get("feature_schema_version") != FEATURE_SCHEMA_VERSION:
        raise ModelSchemaError(
            f"The model at {folder} uses feature schema {meta.get('feature_schema_version')!r}, but this "
            f"sloctl builds {FEATURE_SCHEMA_VERSION!r}; retrain it on a log collected with this version.")
    version = meta["plan_feature_version"]
    calibration = MarginCalibration.from_dict(meta["router_calibration"]) if "router_calibration" in meta else None
    templates = None
    if "templates" in meta:
        import pandas as pd

        templates = pd.read_parquet(folder / meta["templates"])
    stage = StageModel.from_dict(meta["stage"])
    columns = tuple(meta["feature_columns"]) if "feature_columns" in meta else None
    sql = None
    if meta.get("sql") is not None:
        from sloctl.datasets.sql_features import Catalog

        catalog = Catalog.from_csv(folder / meta["sql"]["catalog"]) if meta["sql"].get("catalog") else None
        sql = SqlSpec(meta["sql"]["dialect"], catalog)
    if meta["kind"] != ModelKind.ICONQ:
        return LatencyPredictor(stage, plan_feature_version=version, calibration=calibration, templates=templates,
                                feature_columns=columns, sql=sql)
    import torch

    from sloctl.models.iconq import IconqConfig, IconqNet

    net = IconqNet(IconqConfig(**meta["iconq_config"]))
    net.load_state_dict(torch.load(folder / "iconq.pt", map_location="cpu", weights_only=True))
    return LatencyPredictor(stage, FeatureScaler.from_dict(meta["scaler"]), net.eval(), VARIANTS[meta["variant"]],
                            plan_feature_version=version, calibration=calibration, templates=templates,
                            feature_columns=columns, sql=sql)


def read_provenance(folder: str | Path) -> Provenance | None:
    """The provenance saved with the bundle in ``folder`` (``None``: saved without one, or by an older sloctl)."""
    meta = json.loads((Path(folder) / "meta.json").read_text())
    return Provenance.from_dict(meta["provenance"]) if "provenance" in meta else None


def check_log_schema(predictor: LatencyPredictor, log_metadata: dict[str, str], source: str) -> None:
    """Refuse a log whose plan features were built by another schema version.

    A log of an older version that is upgraded on read (its missing columns
    NaN) counts as the version it reads as.
    """
    log_version = plan_feature_version_on_read(log_metadata.get("plan_feature_version", PLAN_FEATURE_VERSION))
    model_version = predictor.plan_feature_version
    if log_version != model_version:
        raise ModelSchemaError(
            f"{source}: the log's plan features are schema version {log_version!r}, but the model was "
            f"trained on version {model_version!r}; recollect the log or retrain the model.")
