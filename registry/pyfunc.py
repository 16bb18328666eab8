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
from sloctl.datasets.plan_features import PLAN_FEATURES
from sloctl.registry.bundles import load_predictor, read_provenance

__all__ = ["INPUT_COLUMNS", "OPTIONAL_INPUT_COLUMNS", "LatencyPyfunc", "PolicyPyfunc", "latency_input_example",
           "latency_signature"]

#: The log columns a latency model reads: plan features, where and when each query runs.
INPUT_COLUMNS: tuple[str, ...] = ("query_id", "sql_hash", "cluster_id", "cluster_size", "arrival_s", "start_s",
                                  "end_s", *PLAN_FEATURES)
#: Columns a caller may leave out: ``query_id``/``start_s``/``end_s`` are known only for
#: executed queries (``neighbours="overlap"`` needs them), ``sql_hash`` only feeds Stage's cache.
OPTIONAL_INPUT_COLUMNS: frozenset[str] = frozenset({"query_id", "sql_hash", "start_s", "end_s"})
#: Example rows logged with each latency model (enough for a few neighbours).
EXAMPLE_ROWS = 5


class LatencyPyfunc(mlflow.pyfunc.PythonModel):
    """Loads the predictor bundle once; ``predict`` has no side effects.

    ``provenance`` is what the model was trained on (``None`` for bundles saved without one).
    """

    def load_context(self, context: Any) -> None:
        self.predictor = load_predictor(context.artifacts["bundle"])
        self.provenance = read_provenance(context.artifacts["bundle"])

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


def latency_input_example(log: pd.DataFrame, rows: int = EXAMPLE_ROWS) -> pd.DataFrame:
    """The first ``rows`` rows of ``log``, reduced to :data:`INPUT_COLUMNS` (what the model reads)."""
    missing = [c for c in INPUT_COLUMNS if c not in OPTIONAL_INPUT_COLUMNS and c not in log.columns]
    if missing:
        raise ValueError(f"The 'log' parameter must have the column {missing[0]!r} a latency model reads, "
                         f"got columns {sorted(log.columns)}.")
    return log.loc[:, [c for c in INPUT_COLUMNS if c in log.columns]].head(rows).reset_index(drop=True)


def latency_signature(predictor: Any, example: pd.DataFrame) -> Any:
    """The MLflow signature of a latency model: ``example``'s columns in, seconds out, ``neighbours`` param.

    Inferred with :func:`mlflow.models.infer_signature` from ``example`` and the
    predictor's answer on it; the columns in :data:`OPTIONAL_INPUT_COLUMNS`
    are marked optional so that queries not yet run (no ``start_s``) pass.
    """
    import warnings

    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types.schema import ColSpec, Schema

    output = np.asarray(predictor.predict(example, neighbours="auto"), dtype=float)
    with warnings.catch_warnings():  # query_id and cluster_size are whole numbers, never missing, in every log
        warnings.filterwarnings("ignore", message=".*Inferred schema contains integer column.*")
        inferred = infer_signature(example, output, params={"neighbours": "auto"})
    inputs = Schema([ColSpec(col.type, col.name, required=col.name not in OPTIONAL_INPUT_COLUMNS)
                     for col in inferred.inputs.inputs])
    return ModelSignature(inputs=inputs, outputs=inferred.outputs, params=inferred.params)
