"""Every registered kind loads with ``mlflow.pyfunc.load_model`` in a fresh venv: its own requirements plus sloctl.

Slow (about 5 minutes on the 2-core development machine, most of it pip
installing MLflow and then torch): one virtualenv grows from the policy
requirements to Stage's to Iconq+'s, and each kind is loaded when the venv
holds exactly its own ``requirements.txt`` (their sets nest: policy ⊂ Stage
⊂ Iconq+). sloctl itself goes in with ``pip install --no-deps`` from this
checkout, so nothing but the model's requirements can satisfy its imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LOADER = """
import json, sys
import mlflow.pyfunc
import pandas as pd
from mlflow.models import Model

path = sys.argv[1]
model = mlflow.pyfunc.load_model(path)
example = Model.load(path).load_input_example(path)
out = model.predict(example if example is not None else pd.DataFrame())
print(json.dumps({"type": type(out).__name__, "n": len(out) if hasattr(out, "__len__") else None,
                  "kind": out.get("kind") if isinstance(out, dict) else None,
                  "torch": "torch" in sys.modules}))
"""


def _pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *args], check=True, capture_output=True, text=True, timeout=1200)


def _requirements(model_dir: Path) -> list[str]:
    lines = [line.strip() for line in (model_dir / "requirements.txt").read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _load(venv: Path, model_dir: Path) -> dict:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", LOADER, str(model_dir)], capture_output=True,
                         text=True, timeout=600, cwd=model_dir)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # about 5 minutes: pip installs MLflow, LightGBM and torch into a fresh venv
def test_every_registered_kind_loads_in_a_fresh_venv(sim_log, tmp_path):
    import dataclasses

    import mlflow

    from sloctl.config import load_config
    from sloctl.control.policies import ExecutionPlan
    from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup
    from sloctl.models.retry_network import load_network
    from sloctl.registry.store import register, register_policy
    from sloctl.training.pipeline import train_iconq, train_stage
    from sloctl.training.retry_budget import BudgetSearch, optimise_budgets, register_retry_policy

    cfg = load_config()
    small = sim_log[sim_log["cluster_id"].isin(["iso-1", "iso-2", "busy-1-2", "busy-2-2"])].reset_index(drop=True)
    iconq = dataclasses.replace(cfg.iconq, max_epochs=1, hidden_dim=16, embed_dim=16, head_dim=16)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    register(train_stage(small, cfg.stage), small, name="stage", tracking_uri=uri, experiment="t")
    register(train_iconq(small, cfg.stage, iconq), small, name="iconq", tracking_uri=uri, experiment="t")
    network = str(REPO / "configs/networks/tandem.yaml")
    register_retry_policy(optimise_budgets(load_network(network), BudgetSearch(max_retries=2), load=1.5),
                          tracking_uri=uri, experiment="t", source=network)
    register_policy(ExecutionPlan(ExecutionConfig(spinups=(ScheduledSpinup(3.0, 2),))), tracking_uri=uri,
                    experiment="t")
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    dirs = {name: Path(mlflow.artifacts.download_artifacts(f"models:/{name}/1", dst_path=str(tmp_path / name)))
            for name in ("retry-policy-tandem", "execution-config", "stage", "iconq")}
    reqs = {name: _requirements(path) for name, path in dirs.items()}
    assert reqs["retry-policy-tandem"] == reqs["execution-config"]
    assert set(reqs["retry-policy-tandem"]) < set(reqs["stage"]) < set(reqs["iconq"])

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    _pip(venv, "--no-deps", str(REPO))  # sloctl itself, none of its declared dependencies
    installed: set[str] = set()
    for name in ("retry-policy-tandem", "execution-config", "stage", "iconq"):
        own = [r for r in reqs[name] if not r.startswith("sloctl")]
        if set(own) - installed:
            _pip(venv, *own)
            installed |= set(own)
        answer = _load(venv, dirs[name])
        if name in ("stage", "iconq"):
            assert answer["type"] == "ndarray" and answer["n"] == 5
        else:
            assert answer["type"] == "dict" and answer["kind"] == name.removesuffix("-tandem")
        assert answer["torch"] == (name == "iconq")  # only Iconq+ needs torch
