"""The README's quick commands, run as written after ``pip install .``, from a folder outside the checkout (issue 18).

The wheel is built from a copy of the sources and installed, without its
dependencies, into a fresh virtual environment; that environment reads the
dependencies (torch, pandas, mlflow, ...) from the project's ``.venv`` through
a path file, so nothing is downloaded, but ``sloctl`` itself — code, package
data and the console script — comes only from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # builds a wheel and a virtual environment (about 30 s)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(bin folder of a fresh venv holding only the sloctl wheel, a work folder outside the checkout)``."""
    tmp = tmp_path_factory.mktemp("readme")
    src = tmp / "src"
    src.mkdir()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in pyproject["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    wheel_dir = tmp / "wheel"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheel_dir)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheel_dir.glob("sloctl-*.whl")

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies, from the project's environment; its editable sloctl is not seen (its .pth is not processed)
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "project-deps.pth").write_text("\n".join(deps) + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    work = tmp / "elsewhere"
    work.mkdir()
    return env_dir / "bin", work


def _run(installed, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    bin_dir, work = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_sloctl_comes_from_the_wheel_not_the_checkout(installed):
    bin_dir, _ = installed
    out = _run(installed, str(bin_dir / "python"), "-c", "import sloctl, sloctl.configs; print(sloctl.__file__)")
    assert out.returncode == 0, out.stderr
    assert str(ROOT) not in out.stdout and str(bin_dir.parent) in out.stdout
    assert shutil.which("sloctl", path=str(bin_dir)) is not None


def test_help_version_and_config(installed):
    out = _run(installed, "sloctl", "--help")
    assert out.returncode == 0 and "collect" in out.stdout and "retry" in out.stdout, out.stderr
    out = _run(installed, "sloctl", "--version")
    assert out.returncode == 0 and out.stdout.strip() == "sloctl 0.1.0", out.stderr
    out = _run(installed, "sloctl", "config", "show")
    assert out.returncode == 0 and "tracking_uri" in out.stdout, out.stderr
    out = _run(installed, "sloctl", "config", "show", "--json")
    assert out.returncode == 0 and "registry" in json.loads(out.stdout), out.stderr


@pytest.mark.parametrize("network", ["tandem", "configs/networks/tandem.yaml", "configs/networks/hotel.yaml"])
def test_retry_solve_as_the_readme_writes_it(installed, network):
    out = _run(installed, "sloctl", "retry", "solve", "--network", network)
    assert out.returncode == 0, out.stderr
    assert "converged=True" in out.stdout and "class" in out.stdout
    out = _run(installed, "sloctl", "retry", "solve", "-n", network, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["converged"] is True, out.stderr


def test_retry_simulate_and_sweep(installed):
    out = _run(installed, "sloctl", "retry", "simulate", "-n", "tandem", "--duration-s", "30", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["events"] > 0, out.stderr
    out = _run(installed, "sloctl", "retry", "sweep", "-n", "tandem", "--rho", "0.5,1", "--no-simulate")
    assert out.returncode == 0 and "ρ 1.00" in out.stdout, out.stderr


def test_log_summary_and_validate_on_a_tiny_log(installed, sim_log):
    from sloctl.datasets.querylog import write_log

    _, work = installed
    write_log(sim_log, work / "q.parquet")
    out = _run(installed, "sloctl", "log", "summary", "q.parquet")
    assert out.returncode == 0 and "Latency by template" in out.stdout, out.stderr
    out = _run(installed, "sloctl", "log", "validate", "q.parquet")
    assert out.returncode == 0 and "valid query log" in out.stdout, out.stderr
    out = _run(installed, "sloctl", "warehouse", "templates")
    assert out.returncode == 0 and out.stdout.startswith("tpch-q01"), out.stderr


def test_a_user_error_after_install_is_one_line(installed):
    out = _run(installed, "sloctl", "log", "summary", "missing.parquet")
    assert out.returncode == 2
    assert out.stderr.strip() == "error: missing.parquet: query log not found."
