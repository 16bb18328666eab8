"""The MLflow pyfunc wrapper that serves Stage and Iconq predictors.

``predict`` takes a log-shaped DataFrame (plan features, ``cluster_size``,
``cluster_id``, ``arrival_s``, optionally ``start_s``/``end_s``) and returns
each row's predicted latency in seconds given the other rows as neighbours.
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

__all__ = ["LatencyPyfunc"]


class LatencyPyfunc(mlflow.pyfunc.PythonModel):
    """Loads the predictor bundle once; ``predict`` has no side effects."""

    def load_context(self, context: Any) -> None:
        from sloctl.training.artifacts import load_predictor

        self.predictor = load_predictor(context.artifacts["bundle"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> np.ndarray:
        neighbours = (params or {}).get("neighbours", "auto")
        return self.predictor.predict(model_input, neighbours=neighbours)
