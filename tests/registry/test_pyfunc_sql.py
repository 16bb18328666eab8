"""A registered model that reads SQL text: its input example is SQL, and ``mlflow models serve`` answers it.

The server is MLflow's own scoring server (``mlflow models serve``, the
``/invocations`` protocol of MLflow's "Deploy MLflow models" documentation:
``{"dataframe_split": {"columns": [...], "data": [...]}}`` in,
``{"predictions": [...]}`` out), run with ``--env-manager local``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

UNSEEN = "SELECT o_orderpriority, count(*) FROM orders WHERE o_orderdate >= DATE '1996-01-01' GROUP BY 1"


@pytest.fixture(scope="module")
def registered(sql_models, tmp_path_factory):
    from sloctl.registry.store import register

    folder = tmp_path_factory.mktemp("sqlreg")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    reg = register(sql_models["iconq"], sql_models["log"], name="iconq-sql", tracking_uri=uri, experiment="t")
    return {"uri": uri, "model_uri": f"models:/iconq-sql/{reg.version}", "folder": folder}


def test_the_input_example_is_sql_and_the_pyfunc_predicts_unseen_text(registered, sql_models):
    import mlflow
    from mlflow.models import Model

    local = mlflow.artifacts.download_artifacts(registered["model_uri"], dst_path=str(registered["folder"] / "dl"),
                                                tracking_uri=registered["uri"])
    meta = Model.load(local)
    example = meta.load_input_example(local)
    assert list(example.columns) == ["sql", "catalog", "schema", "cluster_id", "cluster_size", "arrival_s"]
    assert example["sql"].str.startswith("SELECT count(*) FROM").all()
    inputs = {c.name: c for c in meta.signature.inputs.inputs}
    assert not inputs["sql"].required and not inputs["f_t_joins"].required and inputs["cluster_size"].required
    mlflow.set_tracking_uri(registered["uri"])
    loaded = mlflow.pyfunc.load_model(registered["model_uri"])
    assert np.isfinite(np.asarray(loaded.predict(example))).all()
    one = example.head(2).assign(sql=[UNSEEN, example["sql"].iloc[1]])
    predicted = np.asarray(loaded.predict(one))
    assert predicted.shape == (2,) and (predicted > 0).all()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_models_serve_answers_sql_text(registered, tmp_path):
    import requests

    port = _free_port()
    bin_dir = str(Path(sys.executable).parent)  # mlflow runs uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": registered["uri"], "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    with (tmp_path / "serve.err").open("w") as err:
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", registered["model_uri"],
                                   "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, (tmp_path / "serve.err").read_text()[-2000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/ping", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "mlflow models serve did not start"
            time.sleep(0.3)
        body = {"dataframe_split": {"columns": ["sql", "cluster_id", "cluster_size", "arrival_s"],
                                    "data": [[UNSEEN, "a", 2, 0.0], ["SELECT count(*) FROM lineitem", "a", 2, 0.5]]}}
        answer = requests.post(f"http://127.0.0.1:{port}/invocations", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        predictions = answer.json()["predictions"]
        assert len(predictions) == 2 and all(p > 0 for p in predictions)
    finally:
        server.terminate()
        server.wait(timeout=30)
