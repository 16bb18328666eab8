"""Save and load a :class:`~sloctl.models.predictor.LatencyPredictor` as a folder.

Layout: ``meta.json`` (kind, schema versions, variant, network config,
feature scaler, the Stage model as LightGBM text) and, for Iconq, ``iconq.pt``
(the network's ``state_dict``). Loading checks the feature-schema version, so
a bundle from another layout is refused instead of predicting garbage.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from sloctl.core.errors import SloctlError
from sloctl.datasets.interactions import FEATURE_SCHEMA_VERSION, FeatureScaler
from sloctl.datasets.plan_features import PLAN_FEATURE_VERSION
from sloctl.models.predictor import VARIANTS, LatencyPredictor
from sloctl.models.stage import StageModel

__all__ = ["ModelSchemaError", "check_log_schema", "load_predictor", "save_predictor"]


class ModelSchemaError(SloctlError, ValueError):
    """A model and a log (or this code) disagree on the feature schema."""


def save_predictor(predictor: LatencyPredictor, folder: str | Path) -> Path:
    """Write ``predictor`` into ``folder`` (created)."""
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
    predictor = LatencyPredictor(StageModel.from_dict(meta["stage"]), plan_feature_version=version)
    if meta["kind"] == "iconq":
        import torch

        from sloctl.models.iconq import IconqConfig, IconqNet

        net = IconqNet(IconqConfig(**meta["iconq_config"]))
        net.load_state_dict(torch.load(folder / "iconq.pt", map_location="cpu", weights_only=True))
        predictor = LatencyPredictor(predictor.stage, FeatureScaler.from_dict(meta["scaler"]), net.eval(),
                                     VARIANTS[meta["variant"]], plan_feature_version=version)
    return predictor


def check_log_schema(predictor: LatencyPredictor, log_metadata: dict[str, str], source: str) -> None:
    """Refuse a log whose plan features were built by another schema version."""
    log_version = log_metadata.get("plan_feature_version", PLAN_FEATURE_VERSION)
    model_version = predictor.plan_feature_version
    if log_version != model_version:
        raise ModelSchemaError(
            f"{source}: the log's plan features are schema version {log_version!r}, but the model was "
            f"trained on version {model_version!r}; recollect the log or retrain the model.")
