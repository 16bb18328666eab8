"""The MLflow pyfunc wrappers: Stage and Iconq predictors, and policy documents.

:class:`LatencyPyfunc`'s ``predict`` takes a log-shaped DataFrame (plan
features, ``cluster_size``, ``cluster_id``, ``arrival_s``, optionally
``start_s``/``end_s``) and returns each row's predicted latency in seconds
given the other rows as neighbours. :class:`PolicyPyfunc` serves a policy
document.
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

from sloctl.control.policies import policy_from_doc
from sloctl.registry.bundles import load_predictor

__all__ = ["LatencyPyfunc", "PolicyPyfunc"]


class LatencyPyfunc(mlflow.pyfunc.PythonModel):
    """Loads the predictor bundle once; ``predict`` has no side effects."""

    def load_context(self, context: Any) -> None:

        self.predictor = load_predictor(context.artifacts["bundle"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> np.ndarray:
        neighbours = (params or {}).get("neighbours", "auto")
        return self.predictor.predict(model_input, neighbours=neighbours)


class PolicyPyfunc(mlflow.pyfunc.PythonModel):
    """Serves a typed policy (:mod:`sloctl.control.policies`) registered as its JSON document.

    ``load_context`` reads the document once with
    :func:`~sloctl.control.policies.policy_from_doc` (validated; documents
    registered before schema versions load as version 1) and keeps the typed
    policy on ``.policy`` (``unwrap_python_model().policy``). ``predict``
    returns the same type for every kind: the document, ``policy.to_doc()``,
    as a dict; its input is ignored. Per-row retry budgets are
    :meth:`~sloctl.control.policies.RetryPolicy.budgets` on the typed policy.
    """

    def load_context(self, context: Any) -> None:
        import json
        from pathlib import Path


        self.policy = policy_from_doc(json.loads(Path(context.artifacts["policy"]).read_text()))

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
                ) -> dict[str, Any]:
        return self.policy.to_doc()
