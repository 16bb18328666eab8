"""End-to-end runs at the sizes the issue names (``make test-slow``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sloctl.datasets.querylog import read_log

pytestmark = pytest.mark.slow


def sloctl(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sloctl.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=900)


def test_collect_tpch_sf01_sizes_1_2_is_valid_and_seeded(tmp_path):
    args = ["collect", "--benchmark", "tpch", "--sf", "0.1", "--sizes", "1,2", "--workload", "base",
            "--rate", "2", "--copies", "3", "--seed", "7"]
    out = sloctl(*args, "--out", "q.parquet", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    df = read_log(tmp_path / "q.parquet")
    assert len(df) == 2 * 22 * 3
    assert sorted(df["cluster_size"].unique()) == [1, 2]
    assert (df["status"] == "ok").all()
    again = sloctl(*args, "--sizes", "1", "--out", "r.parquet", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    first = df[df["cluster_size"] == 1].sort_values("arrival_s")
    second = read_log(tmp_path / "r.parquet").sort_values("arrival_s")
    assert first["template"].tolist() == second["template"].tolist()
    rel = lambda d: (d["arrival_s"] - d["arrival_s"].min()).round(6).tolist()  # noqa: E731
    assert rel(first) == rel(second)


def test_collect_tpcds_runs_all_99_templates(tmp_path):
    out = sloctl("collect", "--benchmark", "tpcds", "--sf", "0.1", "--sizes", "2", "--workload", "base",
                 "--rate", "5", "--copies", "1", "--seed", "7", "--out", "ds.parquet", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    df = read_log(tmp_path / "ds.parquet")
    assert df["template"].nunique() == 99
    assert (df["status"] == "ok").all()


def test_demo_reports_and_reuses_the_database(tmp_path):
    config = tmp_path / "demo.yaml"
    config.write_text("demo:\n  scale_factor: 0.1\n  concurrent_rate_per_s: 40.0\n")
    first = sloctl("demo", "--config", str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "Generating tpch SF 0.1" in first.stderr
    assert (tmp_path / "reports" / "demo_latency_vs_concurrency.png").stat().st_size > 10_000
    assert "slowdown" in first.stdout
    second = sloctl("demo", "--config", str(config), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "Reusing tpch SF 0.1" in second.stderr
