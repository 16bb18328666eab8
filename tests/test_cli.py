"""The command line as a user runs it: real subprocesses, real exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from sloctl.datasets.querylog import read_log, read_metadata


def test_help_starts_without_heavy_imports():
    code = (
        "import sys\n"
        "sys.argv = ['sloctl', '--help']\n"
        "from sloctl.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = {'torch', 'lightgbm', 'mlflow', 'lightning', 'duckdb', 'pandas'}\n"
        "print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "collect" in out.stdout and "warehouse" in out.stdout
    assert "HEAVY []" in out.stdout


@pytest.mark.slow
def test_collect_writes_a_valid_log_and_same_seed_repeats(tmp_path, run_sloctl):
    args = ["collect", "--benchmark", "tpch", "--sf", "0.01", "--sizes", "1", "--workload", "base",
            "--rate", "40", "--copies", "1", "--seed", "7", "--data-dir", str(tmp_path / "data")]
    first = run_sloctl(*args, "--out", str(tmp_path / "a.parquet"))
    assert first.returncode == 0, first.stderr
    second = run_sloctl(*args, "--out", str(tmp_path / "b.parquet"))
    assert second.returncode == 0, second.stderr
    assert "Reusing tpch SF 0.01" in second.stderr  # the database is generated once
    a, b = read_log(tmp_path / "a.parquet"), read_log(tmp_path / "b.parquet")
    assert len(a) == 22 and set(a["status"]) == {"ok"}

    def schedule(df: pd.DataFrame) -> list[tuple[str, float]]:
        df = df.sort_values("arrival_s")
        return list(zip(df["template"], (df["arrival_s"] - df["arrival_s"].min()).round(6), strict=True))

    assert schedule(a) == schedule(b)
    meta = read_metadata(tmp_path / "a.parquet")
    assert meta["benchmark"] == "tpch" and meta["workload"] == "base"
    # the warehouse's table statistics travel with the log: a model trained on it featurizes new SQL the same way
    tables = {row["table"].split(".")[-1]: row["rows"] for row in json.loads(meta["catalog"])}
    assert meta["dialect"] == "duckdb" and tables['"lineitem"'] > tables['"nation"'] == 25


@pytest.fixture
def bad_log(tmp_path):
    import math

    from sloctl.datasets.plan_features import PLAN_FEATURES

    row = {"query_id": 1, "template": "t", "sql_hash": "h", "cluster_id": "c", "cluster_size": 1,
           "arrival_s": 0.0, "start_s": 0.1, "end_s": 0.05, "latency_s": 0.05, "status": "ok",
           "slo_s": math.nan, "oversubscribed": False, **{f: 0.0 for f in PLAN_FEATURES}}
    path = tmp_path / "bad.parquet"
    pd.DataFrame([row]).to_parquet(path)
    return path


def test_log_validate_reports_first_bad_column(bad_log, run_sloctl):
    out = run_sloctl("log", "validate", str(bad_log))
    assert out.returncode == 2
    assert "column 'end_s' must be >= start_s" in out.stderr


def test_config_with_unknown_key_exits_non_zero(tmp_path, run_sloctl):
    path = tmp_path / "c.yaml"
    path.write_text("collect:\n  sizez: [1]\n")
    out = run_sloctl("config", "show", "--config", str(path))
    assert out.returncode == 2
    assert "unknown key 'collect.sizez'" in out.stderr and "c.yaml" in out.stderr


def test_bad_sizes_are_a_usage_error(tmp_path, run_sloctl):
    out = run_sloctl("collect", "--sizes", "1,x", "--out", str(tmp_path / "q.parquet"))
    assert out.returncode == 2
    assert "--sizes" in out.stderr


def test_import_redset_cli(tmp_path, run_sloctl):
    raw = pd.DataFrame({"instance_id": [1, 1], "arrival_timestamp": ["2024-03-01 00:00:00",
                                                                     "2024-03-01 00:00:03"],
                        "queue_duration_ms": [0, 100], "execution_duration_ms": [200, 300],
                        "was_aborted": [False, False], "num_joins": [1, 2]})
    raw.to_parquet(tmp_path / "redset.parquet")
    out = run_sloctl("import", "redset", str(tmp_path / "redset.parquet"), "--out", str(tmp_path / "q.parquet"))
    assert out.returncode == 0, out.stderr
    assert read_log(tmp_path / "q.parquet")["f_joins"].tolist() == [1.0, 2.0]


def test_sizes_beyond_the_machine_are_refused(tmp_path, run_sloctl):
    import math
    import os

    from sloctl.config import load_config

    warehouse = load_config().warehouse
    cluster_cores = len(os.sched_getaffinity(0)) - warehouse.reserved_cores
    too_big = math.floor(cluster_cores / warehouse.size_unit_cores) + 1  # one unit more than the cluster cores hold
    out = run_sloctl("collect", "--sf", "0.01", "--sizes", str(too_big), "--rate", "10", "--copies", "1",
                     "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "q.parquet"))
    assert out.returncode == 2
    assert f"A cluster of size {too_big} needs" in out.stderr
    assert "--allow-oversubscribe" in out.stderr
    assert not (tmp_path / "q.parquet").exists()
