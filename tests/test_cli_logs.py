"""Several logs on the command line: `log merge`, repeatable `--log`, `collect --workload a,b`."""

from __future__ import annotations

import json

import pytest

from sloctl.datasets.querylog import read_log, read_metadata, write_log


@pytest.fixture
def parts(tmp_path, sim_log):
    """The synthetic log as two runs in ``parts/``: its size-1 clusters (a) and its size-2 clusters (b)."""
    folder = tmp_path / "parts"
    for name, size in (("a", 1), ("b", 2)):
        write_log(sim_log[sim_log["cluster_size"] == size], folder / f"{name}.parquet",
                  metadata={"benchmark": "synthetic"})
    return folder


def _one_error_line(out) -> str:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def test_log_merge_writes_one_valid_log(parts, tmp_path, run_sloctl, sim_log):
    a, b, merged = parts / "a.parquet", parts / "b.parquet", tmp_path / "merged.parquet"
    out = run_sloctl("log", "merge", a, b, "--out", merged, "--json")
    assert out.returncode == 0, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Merged 2 logs" in out.stderr
    summary = json.loads(out.stdout)
    assert summary["rows"] == len(sim_log) and [r["path"] for r in summary["runs"]] == [str(a), str(b)]
    log = read_log(merged)
    assert len(log) == len(sim_log) and log["query_id"].is_unique and set(log["run"]) == {0, 1}
    meta = read_metadata(merged)
    assert meta["benchmark"] == "synthetic"
    assert [entry["rows"] for entry in json.loads(meta["merged_from"])] == [len(read_log(a)), len(read_log(b))]


def test_log_merge_refuses_bad_input_in_one_line(parts, tmp_path, run_sloctl):
    a = parts / "a.parquet"
    line = _one_error_line(run_sloctl("log", "merge", a, tmp_path / "missing.parquet", "--out", tmp_path / "m.parquet"))
    assert "FILES" in line and "missing.parquet" in line and "not found" in line
    (tmp_path / "notes.txt").write_text("not a log")
    line = _one_error_line(run_sloctl("log", "merge", a, tmp_path / "notes.txt", "--out", tmp_path / "m.parquet"))
    assert "FILES" in line and "notes.txt" in line and "not a readable Parquet file" in line
    line = _one_error_line(run_sloctl("log", "merge", "--out", tmp_path / "m.parquet"))
    assert "FILES" in line and "at least one" in line
    before = a.read_bytes()
    line = _one_error_line(run_sloctl("log", "merge", a, parts / "b.parquet", "--out", a))
    assert "--out" in line and "input" in line
    assert a.read_bytes() == before
    assert not (tmp_path / "m.parquet").exists()


@pytest.mark.slow
def test_several_logs_train_exactly_like_their_merged_file(parts, tmp_path, run_sloctl):
    merged = tmp_path / "merged.parquet"
    assert run_sloctl("log", "merge", parts / "a.parquet", parts / "b.parquet", "--out", merged).returncode == 0

    def train(*logs) -> dict:
        out = run_sloctl("train", "stage", "--no-register", "--json", *[arg for log in logs for arg in ("--log", log)])
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    from_files = train(parts / "a.parquet", parts / "b.parquet")
    assert from_files == train(merged)
    assert from_files == train(parts)  # a folder: its *.parquet, sorted


def test_log_option_names_itself_when_a_log_is_missing(parts, tmp_path, run_sloctl):
    line = _one_error_line(run_sloctl("evaluate", "predictor", "--log", parts / "a.parquet",
                                      "--log", tmp_path / "missing.parquet", "--model", tmp_path / "no-model"))
    assert "--log" in line and "missing.parquet" in line and "not found" in line


def test_collect_runs_several_workloads_into_one_log(tpch_db, tmp_path, run_sloctl):
    out_path = tmp_path / "both.parquet"
    out = run_sloctl("collect", "--benchmark", "tpch", "--sf", "0.01", "--sizes", "1", "--workload", "isolated,base",
                     "--rate", "40", "--copies", "1", "--seed", "7", "--templates", "tpch-q01,tpch-q03,tpch-q06",
                     "--data-dir", tpch_db.parent, "--out", out_path)
    assert out.returncode == 0, out.stderr
    log = read_log(out_path)  # valid: unique ids
    assert len(log) == 6 and set(log["status"]) == {"ok"}
    assert log.groupby("run")["workload"].unique().map(list).to_dict() == {0: ["isolated"], 1: ["base"]}
    assert set(log["cluster_id"]) == {"r0/size1-run0", "r1/size1-run0"}
    first, second = (log[log["run"] == i] for i in (0, 1))
    assert second["arrival_s"].min() > first["end_s"].max()
    meta = read_metadata(out_path)
    assert meta["workload"] == "isolated,base" and meta["benchmark"] == "tpch"
    assert [entry["metadata"]["workload"] for entry in json.loads(meta["merged_from"])] == ["isolated", "base"]
