"""The layers check: imports point down the layers, wherever they are written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def layers():
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "tools" / "check_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_repository_keeps_its_layers_with_no_exceptions(layers):
    violations, edges = layers.scan(ROOT)
    assert violations == []
    assert not layers.EXCEPTIONS
    assert ("experiments", "serving") in edges  # the scan sees real edges, so an empty result means something


@pytest.mark.parametrize("body", [
    "from sloctl.training.pipeline import train_iconq\n",
    "def f():\n    from sloctl.training import pipeline\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sloctl.serving.runtime import Runtime\n",
    "import sloctl.simulation.day\n",
    "from sloctl import serving\n",
])
def test_an_upward_import_is_reported_wherever_it_is_written(layers, tmp_path, body):
    root = _tree(tmp_path, {"control/__init__.py": "", "control/router.py": body})
    violations, _ = layers.scan(root)
    assert len(violations) == 1 and "control/router.py" in violations[0]


def test_same_level_folders_may_not_import_each_other(layers, tmp_path):
    root = _tree(tmp_path, {"serving/x.py": "from sloctl.training.tune import tune\n",
                            "models/y.py": "from sloctl.control.router import Query\n"})
    violations, _ = layers.scan(root)
    assert len(violations) == 2


def test_downward_same_folder_and_relative_imports_pass(layers, tmp_path):
    root = _tree(tmp_path, {"serving/__init__.py": "",
                            "serving/x.py": "from sloctl.control.router import Query\nfrom . import y\n"
                                            "from sloctl.serving import y as z\nimport numpy\n",
                            "serving/y.py": "from sloctl.core.errors import SloctlError\n"})
    violations, edges = layers.scan(root)
    assert violations == []
    assert edges == {("serving", "control"): 1, ("serving", "core"): 1}


def test_core_may_import_nothing_of_sloctl(layers, tmp_path):
    root = _tree(tmp_path, {"core/errors.py": "from sloctl.datasets.querylog import read_log\n"})
    violations, _ = layers.scan(root)
    assert len(violations) == 1


def test_the_two_front_doors_never_import_each_other(layers, tmp_path):
    root = _tree(tmp_path, {
        "serving/gateway/gateway.py": "from sloctl.serving.runtime.runtime import Runtime\n"
                                      "from sloctl.serving.controller import Controller\n",
        "serving/runtime/app.py": "def f():\n    import sloctl.serving.gateway.trino\n",
        "serving/controller.py": "from sloctl.control.router import Query\n"})
    violations, _ = layers.scan(root)
    assert len(violations) == 2
    assert {v.split(":")[0] for v in violations} == {"serving/gateway/gateway.py", "serving/runtime/app.py"}
