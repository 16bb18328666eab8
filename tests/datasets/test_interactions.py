from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sloctl.datasets.interactions import build_samples, neighbour_lists, pair_dim, pair_vectors
from sloctl.datasets.plan_features import PLAN_FEATURES


def tiny_log() -> pd.DataFrame:
    # q0 [0, 10]; q1 arrives 2 ends 4; q2 arrives 7 ends 12; q3 arrives 11 (after q0 ended)
    # q4 on another cluster overlaps q0 in time but is not its neighbour.
    spans = [(0, 10, "a", "ok"), (2, 4, "a", "ok"), (7, 12, "a", "ok"), (11, 13, "a", "timeout"), (1, 9, "b", "ok")]
    rows = []
    for i, (start, end, cluster, status) in enumerate(spans):
        rows.append({"query_id": i, "template": "t", "sql_hash": "h", "cluster_id": cluster, "cluster_size": 1,
                     "arrival_s": float(start), "start_s": float(start), "end_s": float(end),
                     "latency_s": float(end - start), "status": status, "slo_s": math.nan,
                     "oversubscribed": False, **{f: 0.0 for f in PLAN_FEATURES}})
    return pd.DataFrame(rows)


def test_neighbours_are_overlapping_queries_on_the_same_cluster_in_arrival_order():
    before, after = neighbour_lists(tiny_log())
    assert before[0].tolist() == [] and after[0].tolist() == [1, 2]
    assert before[2].tolist() == [0] and after[2].tolist() == [3]
    assert before[3].tolist() == [2]
    assert before[4].tolist() == [] and after[4].tolist() == []


def test_partial_neighbour_sets_carry_lower_bound_labels():
    log = tiny_log()
    samples = build_samples(log, np.arange(len(log)), censored=True, partial_per_query=5, seed=0)
    for s in samples:
        if not s.full:
            assert s.censored
            true = log["latency_s"].iloc[s.row]
            assert math.exp(s.label_log) <= true + 1e-9  # a lower bound
            assert len(s.after) < len(neighbour_lists(log)[1][s.row])
    timed_out = [s for s in samples if s.row == 3]
    assert timed_out and all(s.censored for s in timed_out)


def test_without_censoring_timeouts_and_partials_are_left_out():
    log = tiny_log()
    samples = build_samples(log, np.arange(len(log)), censored=False)
    assert all(s.full and not s.censored for s in samples)
    assert 3 not in {s.row for s in samples}


def test_pair_vector_layout_and_size_features():
    plan = np.zeros((2, len(PLAN_FEATURES)))
    stage = np.array([1.0, 2.0])
    v = pair_vectors(plan, stage, np.array([0.0, 3.0]), np.array([4, 4]), np.array([0]), np.array([1]), True)
    assert v.shape == (1, pair_dim(True))
    tail = v[0, -8:]
    assert tail[0] == np.float32(math.log1p(3.0)) and tail[1] == 1.0  # |Δarrival|, q before n
    np.testing.assert_allclose(tail[2:5], [4, 2, 0.25])  # size, log2 size, 1/size
    np.testing.assert_allclose(tail[5:], np.log1p([4.0, 8.0, 0.75]), rtol=1e-6)
    assert pair_vectors(plan, stage, np.array([0.0, 3.0]), np.array([4, 4]), np.array([0]), np.array([1]),
                        False).shape == (1, pair_dim(False))


def _brute_force_neighbours(log: pd.DataFrame) -> tuple[list[list[int]], list[list[int]]]:
    """The definition, pair by pair: same cluster, overlapping [start, end), chronological by (arrival, query_id)."""
    key = list(zip(log["arrival_s"], log["query_id"], strict=True))
    before, after = [[] for _ in range(len(log))], [[] for _ in range(len(log))]
    for i in range(len(log)):
        for j in range(len(log)):
            same = log["cluster_id"].iloc[i] == log["cluster_id"].iloc[j]
            overlap = log["start_s"].iloc[i] < log["end_s"].iloc[j] and log["start_s"].iloc[j] < log["end_s"].iloc[i]
            if i != j and same and overlap:
                (before if key[j] < key[i] else after)[i].append(j)
    order = lambda rows: sorted(rows, key=lambda r: key[r])  # noqa: E731
    return [order(b) for b in before], [order(a) for a in after]


def test_neighbour_index_matches_the_definition_with_ties_and_empty_executions():
    from sloctl.datasets.interactions import neighbour_index

    rng = np.random.default_rng(5)
    n = 160
    start = np.round(rng.uniform(0, 20, n), 1)  # rounded: many equal starts
    end = start + np.where(rng.random(n) < 0.1, 0.0, np.round(rng.exponential(2.0, n), 1))  # some zero-length
    log = pd.DataFrame({"query_id": rng.permutation(n), "cluster_id": rng.choice(["a", "b", "c"], n),
                        "arrival_s": start - np.round(rng.uniform(0, 0.3, n), 1), "start_s": start, "end_s": end})
    index = neighbour_index(log)
    before, after = index.lists()
    expected_before, expected_after = _brute_force_neighbours(log)
    assert [b.tolist() for b in before] == expected_before
    assert [a.tolist() for a in after] == expected_after
    assert index.before_len().sum() == index.after_len().sum()  # each pair once on each side


def test_sample_table_holds_what_build_samples_lists():
    from sloctl.datasets.interactions import neighbour_index, sample_table

    log = tiny_log()
    table = sample_table(log, np.arange(len(log)), censored=True, partial_per_query=5, seed=0)
    samples = build_samples(log, np.arange(len(log)), censored=True, partial_per_query=5, seed=0)
    assert len(table) == len(samples)
    assert table.row.tolist() == [s.row for s in samples]
    assert table.after_len.tolist() == [len(s.after) for s in samples]
    assert table.censored.tolist() == [s.censored for s in samples]
    full = neighbour_index(log).after_len()
    assert all(k == full[r] for r, k, f in zip(table.row, table.after_len, table.full, strict=True) if f)
