"""What ``pip install .`` ships and where sloctl writes: network examples, images under reports/."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from sloctl.config import PACKAGED_NETWORKS_DIR, resolve_network_path

ROOT = Path(__file__).resolve().parents[1]
NETWORKS = sorted(p.name for p in (ROOT / "configs" / "networks").glob("*.yaml"))


def test_the_wheel_carries_every_network_example(tmp_path):
    """Built from a copy of the sources (no ``build/`` left in the checkout); the README's networks are inside."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in pyproject["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "wheel").glob("sloctl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert NETWORKS, "no network examples in configs/networks"
    for name in NETWORKS:
        assert f"sloctl/configs/networks/{name}" in names
    assert "sloctl/configs/default.yaml" in names


def test_a_file_that_exists_here_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "configs" / "networks" / "tandem.yaml"
    local.parent.mkdir(parents=True)
    local.write_text("mine")
    assert resolve_network_path("configs/networks/tandem.yaml") == (Path("configs/networks/tandem.yaml"), False)


@pytest.mark.parametrize("given", ["tandem", "tandem.yaml", "configs/networks/tandem.yaml"])
def test_a_bare_name_or_the_documented_path_reads_the_packaged_copy(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the checkout, as after `pip install .`
    path, packaged = resolve_network_path(given)
    assert packaged and path == PACKAGED_NETWORKS_DIR / "tandem.yaml" and path.is_file()


@pytest.mark.parametrize("given", ["nosuch", "elsewhere/tandem.yaml", "/abs/configs/networks/tandem.yaml"])
def test_other_missing_paths_come_back_unchanged(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_network_path(given) == (Path(given), False)


def test_the_retry_cli_says_which_file_it_used(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from sloctl.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["retry", "solve", "-n", "configs/networks/tandem.yaml", "--json"])
    assert result.exit_code == 0, result.output
    assert "using the network shipped with sloctl" in result.stderr
    assert str(PACKAGED_NETWORKS_DIR / "tandem.yaml") in result.stderr
    assert result.stdout.lstrip().startswith("{")


def _commands(command, prefix=()):
    if hasattr(command, "commands"):  # a group (typer vendors its own click)
        for name, sub in command.commands.items():
            yield from _commands(sub, (*prefix, name))
    else:
        yield prefix, command


def test_default_image_paths_lie_under_reports():
    """Every CLI option that names where plots go defaults to nothing or to a folder under reports/."""
    import typer.main

    from sloctl.cli import app
    from sloctl.config import load_config

    seen = 0
    for name, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            if "plot" not in (param.name or "") and "png" not in (param.name or ""):
                continue
            seen += 1
            default = param.default
            if default is None or str(default) == "":
                continue
            parts = Path(str(default)).parts
            assert parts[0] == "reports" and len(parts) >= 2, f"sloctl {' '.join(name)} --{param.name}: {default}"
    assert seen >= 2  # `retry sweep --plot`, `experiment admission --plots`
    assert Path(load_config().demo.reports_dir).parts[0] == "reports"  # the demo's PNGs
