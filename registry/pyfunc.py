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

__all__ = ["LatencyPyfunc", "PolicyPyfunc"]


class LatencyPyfunc(mlflow.pyfunc.PythonModel):
    """Loads the predictor bundle once; ``predict`` has no side effects."""

    def load_context(self, context: Any) -> None:
        from sloctl.registry.bundles import load_predictor

        self.predictor = load_predictor(context.artifacts["bundle"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> np.ndarray:
        neighbours = (params or {}).get("neighbours", "auto")
        return self.predictor.predict(model_input, neighbours=neighbours)


class PolicyPyfunc(mlflow.pyfunc.PythonModel):
    """Serves a policy document (``retry-policy``, ``admission-policy``) registered as JSON.

    The whole document is on ``.policy`` (``unwrap_python_model().policy``).
    For a retry policy, ``predict`` takes rows with ``class`` and ``service``
    columns and returns each row's retry budget k; for other kinds it returns
    the document as one JSON string.
    """

    def load_context(self, context: Any) -> None:
        import json
        from pathlib import Path

        self.policy = json.loads(Path(context.artifacts["policy"]).read_text())

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> np.ndarray:
        import json

        if self.policy.get("kind") == "retry-policy":
            retries = self.policy["retries"]
            return np.array([retries[c][s] for c, s in zip(model_input["class"], model_input["service"],
                                                           strict=True)])
        return np.array([json.dumps(self.policy)])
