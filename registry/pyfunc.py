"""The MLflow pyfunc wrappers: Stage and Iconq predictors, and policy documents.

:class:`LatencyPyfunc`'s ``predict`` takes a log-shaped DataFrame (plan
features, ``cluster_size``, ``cluster_id``, ``arrival_s``, optionally
``start_s``/``end_s``) and returns each row's predicted latency in seconds
given the other rows as neighbours. A model trained on text and catalog
features (``sloctl train iconq --features text+catalog``) also reads a ``sql``
column instead of the features (optional ``catalog`` and ``schema`` columns
complete unqualified table names), and its input example shows it.
:class:`PolicyPyfunc` serves a policy document.
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
        if "sql" in model_input.columns and model_input["sql"].notna().any():
            from sloctl.models.predictor import queries_frame

            frame = queries_frame(model_input, self.predictor.templates, source="model input",
                                  sql=self.predictor.sql_features)
            if "cluster_id" not in model_input.columns:  # queries_frame's default: each query alone
                neighbours = "all"
            return self.predictor.predict(frame, neighbours=neighbours)
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


#: The columns of a query given as SQL text (``sql``; the session's ``catalog`` and ``schema`` are optional).
SQL_INPUT_COLUMNS: tuple[str, ...] = ("sql", "catalog", "schema", "cluster_id", "cluster_size", "arrival_s")


def latency_input_example(log: pd.DataFrame, rows: int = EXAMPLE_ROWS, predictor: Any = None) -> pd.DataFrame:
    """What the model reads, as example rows.

    A ``predictor`` that reads SQL text (:meth:`~sloctl.models.predictor.LatencyPredictor.sql_refusal`
    is ``None``) gets :data:`SQL_INPUT_COLUMNS`: one query per table of its catalog, running together
    on one cluster of ``log``'s first size; otherwise the first ``rows`` rows of ``log``, reduced to
    :data:`INPUT_COLUMNS`.
    """
    if predictor is not None and getattr(predictor, "sql", None) is not None and predictor.sql_refusal() is None:
        catalog = predictor.sql.catalog
        tables = [name for name in (catalog.tables if catalog is not None else {})][:rows] or ["(VALUES (1)) AS t"]
        size = int(log["cluster_size"].iloc[0]) if len(log) else 1
        return pd.DataFrame({"sql": [f"SELECT count(*) FROM {table}" for table in tables],
                             "catalog": "", "schema": "", "cluster_id": "c0", "cluster_size": size,
                             "arrival_s": [0.5 * i for i in range(len(tables))]})
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

    if "sql" in example.columns:  # a model that reads SQL text: the text, or the features, per query
        from sloctl.models.predictor import queries_frame

        frame = queries_frame(example, predictor.templates, source="input example", sql=predictor.sql_features)
        output = np.asarray(predictor.predict(frame, neighbours="all"), dtype=float)
    else:
        output = np.asarray(predictor.predict(example, neighbours="auto"), dtype=float)
    with warnings.catch_warnings():  # query_id and cluster_size are whole numbers, never missing, in every log
        warnings.filterwarnings("ignore", message=".*Inferred schema contains integer column.*")
        inferred = infer_signature(example, output, params={"neighbours": "auto"})
    optional = OPTIONAL_INPUT_COLUMNS | ({"sql", "catalog", "schema"} if "sql" in example.columns else set())
    columns = [ColSpec(col.type, col.name, required=col.name not in optional) for col in inferred.inputs.inputs]
    if "sql" in example.columns:  # the features may stand for the text, row by row
        columns += [ColSpec("string", "template", required=False), ColSpec("string", "sql_hash", required=False),
                    ColSpec("double", "start_s", required=False), ColSpec("double", "end_s", required=False),
                    *(ColSpec("double", name, required=False) for name in PLAN_FEATURES)]
    inputs = Schema(columns)
    return ModelSignature(inputs=inputs, outputs=inferred.outputs, params=inferred.params)
