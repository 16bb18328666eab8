"""Registered latency models carry a signature, an input example and exact, minimal requirements."""

from __future__ import annotations

import json
from importlib.metadata import version

import numpy as np
import pytest

from sloctl.registry.pyfunc import INPUT_COLUMNS, OPTIONAL_INPUT_COLUMNS, latency_input_example
from sloctl.registry.store import pip_requirements


def _pinned(name: str) -> str:
    return f"{name}=={version(name).split('+')[0]}"


def test_requirements_are_pinned_and_minimal_per_kind():
    assert pip_requirements("stage") == [_pinned("sloctl"), _pinned("lightgbm"), _pinned("pandas"), _pinned("numpy")]
    assert pip_requirements("iconq") == [*pip_requirements("stage"), "torch==2.13.0"]
    assert pip_requirements("policy") == [_pinned("sloctl"), _pinned("pandas")]
    with pytest.raises(ValueError, match="'kind' parameter of pip_requirements must be one of .*got 'forest'"):
        pip_requirements("forest")


def test_the_input_example_is_the_columns_the_model_reads(sim_log):
    example = latency_input_example(sim_log)
    assert list(example.columns) == list(INPUT_COLUMNS) and len(example) == 5
    with pytest.raises(ValueError, match="must have the column 'cluster_size'"):
        latency_input_example(sim_log.drop(columns=["cluster_size"]))


def test_a_registered_stage_model_has_signature_example_and_requirements(trained_models, sim_log, tmp_path):
    import mlflow
    from mlflow.models import Model

    from sloctl.registry.store import register

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    reg = register(trained_models["stage"], sim_log, name="stage", tracking_uri=uri, experiment="t")
    model_uri = f"models:/stage/{reg.version}"
    local = mlflow.artifacts.download_artifacts(model_uri, dst_path=str(tmp_path / "dl"), tracking_uri=uri)
    meta = Model.load(local)

    signature = meta.signature
    assert signature is not None
    inputs = {c.name: c for c in signature.inputs.inputs}
    assert list(inputs) == list(INPUT_COLUMNS)
    assert {n for n, c in inputs.items() if not c.required} == OPTIONAL_INPUT_COLUMNS
    assert [p.name for p in signature.params.params] == ["neighbours"]
    assert signature.outputs is not None

    example = meta.load_input_example(local)
    assert list(example.columns) == list(INPUT_COLUMNS) and len(example) == 5

    requirements = (tmp_path / "dl" / "requirements.txt").read_text().split()
    assert requirements == [_pinned("mlflow"), *pip_requirements("stage")]  # MLflow adds itself
    assert not any(r.startswith("torch") for r in requirements)

    mlflow.set_tracking_uri(uri)
    loaded = mlflow.pyfunc.load_model(model_uri)
    predicted = np.asarray(loaded.predict(example.drop(columns=["start_s", "end_s"])))  # not yet run: optional
    expected = trained_models["stage"].predictor.predict(example)
    np.testing.assert_allclose(predicted, expected)
    assert json.loads(json.dumps(meta.saved_input_example_info))["type"] == "dataframe"
