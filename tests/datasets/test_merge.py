"""Merging query logs of separate runs: every row kept, ids unique, no neighbours across runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sloctl.core.errors import QueryLogError
from sloctl.datasets.analysis import overlap_counts
from sloctl.datasets.interactions import neighbour_lists
from sloctl.datasets.merge import merge_logs
from sloctl.datasets.querylog import read_log, read_metadata, write_log

MOVED = ["query_id", "cluster_id", "arrival_s", "start_s", "end_s", "run"]


@pytest.fixture
def runs(sim_log):
    """Two runs of the synthetic log: its size-1 clusters and its size-2 clusters, each on its own clock."""
    small = sim_log[sim_log["cluster_size"] == 1].reset_index(drop=True)
    large = sim_log[sim_log["cluster_size"] == 2].reset_index(drop=True)
    large[["arrival_s", "start_s", "end_s"]] -= large["arrival_s"].min()  # a second run starting at 0 too
    return [small, large]


def test_merge_keeps_every_row_and_its_content(runs):
    merged, _ = merge_logs(runs)
    assert len(merged) == sum(len(run) for run in runs)
    for index, run in enumerate(runs):
        part = merged[merged["run"] == index].reset_index(drop=True)
        pd.testing.assert_frame_equal(part.drop(columns=MOVED), run.drop(columns=MOVED[:-1]))
        assert (part["cluster_id"] == f"r{index}/" + run["cluster_id"]).all()
        shift = part["arrival_s"] - run["arrival_s"]
        for column in ("start_s", "end_s"):
            np.testing.assert_allclose(part[column] - run[column], shift, atol=1e-9)
        np.testing.assert_allclose(shift, shift.iloc[0], atol=1e-9)  # one offset per run


def test_ids_are_unique_and_keep_each_runs_order(runs):
    merged, _ = merge_logs(runs)
    assert merged["query_id"].tolist() == list(range(len(merged)))
    for index, run in enumerate(runs):
        part = merged[merged["run"] == index]
        assert (np.argsort(part["query_id"].to_numpy()) == np.argsort(run["query_id"].to_numpy())).all()


def test_runs_lie_end_to_end_after_the_gap(runs):
    merged, meta = merge_logs(runs, gap_s=5.0)
    first, second = (merged[merged["run"] == i] for i in (0, 1))
    assert second["arrival_s"].min() == pytest.approx(first["end_s"].max() + 5.0)
    assert json.loads(meta["merge_gap_s"]) == 5.0
    offsets = [entry["offset_s"] for entry in json.loads(meta["merged_from"])]
    assert offsets[0] == 0.0 and offsets[1] == pytest.approx(first["end_s"].max() + 5.0)


def test_no_false_neighbours_across_runs(sim_log):
    # the worst case: the same run twice, same cluster names, same clock
    merged, _ = merge_logs([sim_log, sim_log])
    per_run = overlap_counts(sim_log).to_numpy()
    assert (overlap_counts(merged).to_numpy() == np.concatenate([per_run, per_run])).all()
    before, after = neighbour_lists(merged)
    alone_before, alone_after = neighbour_lists(sim_log)
    n = len(sim_log)
    for row in range(n):
        for offset in (0, n):
            assert (before[row + offset] == alone_before[row] + offset).all()
            assert (after[row + offset] == alone_after[row] + offset).all()
    # the clocks alone keep the runs apart, even for code that ignored the cluster prefixes
    unprefixed = merged.assign(cluster_id=merged["cluster_id"].str.split("/", n=1).str[1])
    assert (overlap_counts(unprefixed).to_numpy() == np.concatenate([per_run, per_run])).all()


def test_merge_is_deterministic(runs, tmp_path):
    first, first_meta = merge_logs(runs)
    second, second_meta = merge_logs(runs)
    pd.testing.assert_frame_equal(first, second)
    assert first_meta == second_meta
    write_log(first, tmp_path / "a.parquet", metadata=first_meta)
    write_log(second, tmp_path / "b.parquet", metadata=second_meta)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_merged_file_records_every_input(runs, tmp_path):
    paths = []
    for index, run in enumerate(runs):
        paths.append(write_log(run, tmp_path / f"run{index}.parquet",
                               metadata={"benchmark": "synthetic", "workload": f"w{index}"}))
    merged, meta = merge_logs(paths)
    write_log(merged, tmp_path / "merged.parquet", metadata=meta)
    back = read_log(tmp_path / "merged.parquet")
    pd.testing.assert_frame_equal(back, merged)
    stored = read_metadata(tmp_path / "merged.parquet")
    assert stored["benchmark"] == "synthetic"  # shared by every input
    assert "workload" not in stored            # differs between inputs: only per input
    inputs = json.loads(stored["merged_from"])
    assert [entry["path"] for entry in inputs] == [str(p) for p in paths]
    assert [entry["rows"] for entry in inputs] == [len(run) for run in runs]
    assert [entry["metadata"]["workload"] for entry in inputs] == ["w0", "w1"]
    assert [entry["cluster_prefix"] for entry in inputs] == ["r0/", "r1/"]


def test_refuses_logs_of_different_plan_feature_versions(runs, tmp_path):
    old = write_log(runs[0], tmp_path / "old.parquet", metadata={"plan_feature_version": "0"})
    new = write_log(runs[1], tmp_path / "new.parquet")
    with pytest.raises(QueryLogError, match="plan-feature version"):
        merge_logs([old, new])
    with pytest.raises(QueryLogError, match="version '0'"):
        merge_logs(runs, metadata=[None, {"plan_feature_version": "0"}])


def test_refuses_bad_inputs(runs, tmp_path):
    with pytest.raises(QueryLogError, match="at least one"):
        merge_logs([])
    with pytest.raises(QueryLogError, match="not found"):
        merge_logs([runs[0], tmp_path / "missing.parquet"])
    with pytest.raises(ValueError, match="'gap_s'"):
        merge_logs(runs, gap_s=-1.0)
    with pytest.raises(ValueError, match="one entry per log"):
        merge_logs(runs, metadata=[None])


def test_a_run_column_of_the_input_is_replaced(runs):
    twice, _ = merge_logs([merge_logs(runs)[0], runs[0]])
    assert sorted(set(twice["run"])) == [0, 1]
    assert twice["cluster_id"].str.startswith("r0/r").sum() == sum(len(run) for run in runs)
