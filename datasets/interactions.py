"""Interaction features for Iconq+ (AutoSLO §4.1–4.3), built from a query log.

For a target query ``q`` and a neighbour ``n`` (their executions overlap on
the same cluster), the interaction vector is::

    [ f(q), log ℓ̂_q, f(n), log ℓ̂_n, log1p|Δarrival|, 1[q arrived before n], S(c) ]

``f`` are the standardised plan features, ``ℓ̂`` the Stage (isolated)
predictions in seconds, and ``S(c)`` the cluster-size features (i)–(v) of
§4.2: size, log2(size), 1/size, ℓ̂_q·size, ℓ̂_n·size and (ℓ̂_q + ℓ̂_n)/size —
the last three as log1p, since they span orders of magnitude. Without size
features (the original Iconq) ``S(c)`` is left out.

Each training sample is one query with its before-neighbours and its
after-neighbours, both in chronological order of arrival. With censoring
(§4.3), extra samples keep only a prefix of the after-neighbours: the query
was still running when the next neighbour arrived, so the time until then is
a lower bound on its latency; timed-out queries enter with their time to
failure as a lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sloctl.datasets.plan_features import PLAN_FEATURE_VERSION, PLAN_FEATURES

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FEATURE_SCHEMA_VERSION",
    "FeatureScaler",
    "NeighbourIndex",
    "QuerySample",
    "SampleTable",
    "build_samples",
    "chronological_rank",
    "full_samples",
    "neighbour_index",
    "neighbour_lists",
    "pair_dim",
    "pair_vectors",
    "sample_table",
    "self_dim",
    "self_vectors",
]

#: Changes whenever the interaction layout or the plan features change.
FEATURE_SCHEMA_VERSION = f"iconq-1/plan-{PLAN_FEATURE_VERSION}"
_MIN_BOUND_S = 1e-3
N_PLAN = len(PLAN_FEATURES)


def pair_dim(size_features: bool) -> int:
    """Width of one interaction vector."""
    return 2 * (N_PLAN + 1) + 2 + (6 if size_features else 0)


def self_dim(size_features: bool) -> int:
    """Width of a query's own feature vector (plan, Stage, size)."""
    return N_PLAN + 1 + (3 if size_features else 0)


@dataclass
class FeatureScaler:
    """Standardises plan features; unknown (NaN) values become 0 (the mean)."""

    mean_: np.ndarray
    std_: np.ndarray

    @classmethod
    def fit(cls, log: pd.DataFrame) -> FeatureScaler:
        plan = log[list(PLAN_FEATURES)].to_numpy(dtype=float)
        known = np.isfinite(plan).any(axis=0)  # a column unknown in every row (no catalog, no plan) scales to 0
        mean, std = np.zeros(N_PLAN), np.ones(N_PLAN)
        if len(plan) and known.any():
            mean[known] = np.nan_to_num(np.nanmean(plan[:, known], axis=0))
            std[known] = np.nan_to_num(np.nanstd(plan[:, known], axis=0))
        return cls(mean_=mean, std_=np.where(std > 1e-9, std, 1.0))

    def transform(self, log: pd.DataFrame) -> np.ndarray:
        plan = log[list(PLAN_FEATURES)].to_numpy(dtype=float)
        return np.nan_to_num((plan - self.mean_) / self.std_, nan=0.0, posinf=0.0, neginf=0.0)

    def to_dict(self) -> dict[str, list[float]]:
        return {"mean": self.mean_.tolist(), "std": self.std_.tolist()}

    @classmethod
    def from_dict(cls, state: dict[str, list[float]]) -> FeatureScaler:
        return cls(mean_=np.asarray(state["mean"]), std_=np.asarray(state["std"]))


def self_vectors(plan: np.ndarray, stage_s: np.ndarray, size: np.ndarray, size_features: bool) -> np.ndarray:
    """Per-query vectors ``[f(q), log ℓ̂_q, size, log2 size, 1/size]`` (N, S)."""
    parts = [plan, np.log(stage_s)[:, None]]
    if size_features:
        size = np.asarray(size, dtype=float)
        parts.append(np.stack([size, np.log2(size), 1.0 / size], axis=1))
    return np.hstack(parts).astype(np.float32)


def pair_vectors(plan: np.ndarray, stage_s: np.ndarray, arrival_s: np.ndarray, size: np.ndarray,
                 q: np.ndarray, n: np.ndarray, size_features: bool) -> np.ndarray:
    """Interaction vectors for target rows ``q`` and neighbour rows ``n`` (K, D)."""
    q = np.asarray(q, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    lq, ln = stage_s[q], stage_s[n]
    delta = arrival_s[n] - arrival_s[q]
    parts = [plan[q], np.log(lq)[:, None], plan[n], np.log(ln)[:, None],
             np.log1p(np.abs(delta))[:, None], (delta > 0).astype(float)[:, None]]
    if size_features:
        s = np.asarray(size, dtype=float)[q]
        parts.append(np.stack([s, np.log2(s), 1.0 / s, np.log1p(lq * s), np.log1p(ln * s),
                               np.log1p((lq + ln) / s)], axis=1))
    return np.hstack(parts).astype(np.float32)


@dataclass(frozen=True)
class NeighbourIndex:
    """Every query's before- and after-neighbours as two CSR arrays (row positions, chronological).

    ``before[before_ptr[r]:before_ptr[r + 1]]`` are row ``r``'s
    before-neighbours, likewise for ``after``. Built once per log in
    vectorised passes (:func:`neighbour_index`), so a log of millions of rows
    needs neither a Python loop per row nor a square overlap matrix per
    cluster.
    """

    before_ptr: np.ndarray
    before: np.ndarray
    after_ptr: np.ndarray
    after: np.ndarray

    def __len__(self) -> int:
        return len(self.before_ptr) - 1

    def before_len(self) -> np.ndarray:
        return np.diff(self.before_ptr)

    def after_len(self) -> np.ndarray:
        return np.diff(self.after_ptr)

    def lists(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per-row arrays (:func:`neighbour_lists`' form)."""
        return (np.split(self.before, self.before_ptr[1:-1]), np.split(self.after, self.after_ptr[1:-1]))

    @classmethod
    def from_pairs(cls, n_rows: int, owner_b: np.ndarray, nb_b: np.ndarray, owner_a: np.ndarray, nb_a: np.ndarray,
                   order_key: np.ndarray) -> NeighbourIndex:
        """CSR arrays from (owner, neighbour) pairs; each owner's neighbours sorted by ``order_key`` (a rank)."""
        def csr(owner: np.ndarray, nb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            order = np.lexsort((order_key[nb], owner))
            ptr = np.zeros(n_rows + 1, dtype=np.int64)
            np.cumsum(np.bincount(owner, minlength=n_rows), out=ptr[1:])
            return ptr, nb[order].astype(np.int64)

        bp, b = csr(owner_b, nb_b)
        ap, a = csr(owner_a, nb_a)
        return cls(bp, b, ap, a)


def chronological_rank(log: pd.DataFrame) -> np.ndarray:
    """Each row's rank in arrival order (ties: smaller ``query_id`` first)."""
    order = np.lexsort((log["query_id"].to_numpy(), log["arrival_s"].to_numpy(dtype=float)))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def neighbour_index(log: pd.DataFrame) -> NeighbourIndex:
    """Each query's before- and after-neighbours (:class:`NeighbourIndex`).

    Neighbours run on the same cluster with overlapping executions
    (``start < other end`` both ways). A neighbour that arrived earlier (ties:
    smaller ``query_id``) is "before". Every logged execution occupied the
    cluster, so failed and timed-out queries are neighbours too. One sweep per
    cluster over the executions sorted by start: each one's overlaps among
    those starting after it are a contiguous range found by binary search.
    """
    n_rows = len(log)
    start = log["start_s"].to_numpy(dtype=float)
    end = log["end_s"].to_numpy(dtype=float)
    rank = chronological_rank(log)
    codes = log["cluster_id"].astype("category").cat.codes.to_numpy() if n_rows else np.empty(0, np.int64)
    order = np.lexsort((rank, start, codes))  # by cluster, then start
    first: list[np.ndarray] = []
    second: list[np.ndarray] = []
    bounds = np.flatnonzero(np.diff(codes[order])) + 1 if n_rows else np.empty(0, np.int64)
    for group in np.split(order, bounds) if n_rows else []:
        s, e = start[group], end[group]
        hi = np.searchsorted(s, e, side="left")  # those starting before this one ends
        pos = np.arange(len(group))
        counts = np.maximum(hi - pos - 1, 0)
        total = int(counts.sum())
        if total == 0:
            continue
        i = np.repeat(pos, counts)
        j = np.arange(total) - np.repeat(np.cumsum(counts) - counts - pos - 1, counts)
        keep = s[i] < e[j]  # the later-starting one must still run when the earlier one starts
        first.append(group[i[keep]])
        second.append(group[j[keep]])
    a = np.concatenate(first) if first else np.empty(0, np.int64)
    b = np.concatenate(second) if second else np.empty(0, np.int64)
    a_first = rank[a] < rank[b]
    early, late = np.where(a_first, a, b), np.where(a_first, b, a)
    return NeighbourIndex.from_pairs(n_rows, late, early, early, late, rank)


def neighbour_lists(log: pd.DataFrame) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Row positions of each query's before- and after-neighbours, chronological (:func:`neighbour_index`)."""
    return neighbour_index(log).lists()


@dataclass
class QuerySample:
    """One training/evaluation example for Iconq+."""

    row: int                 # position in the log
    before: np.ndarray       # row positions, chronological
    after: np.ndarray        # row positions, chronological (maybe a prefix)
    label_log: float         # log latency, or log of a lower bound
    censored: bool           # label is a lower bound
    full: bool               # the complete neighbour set (not a sampled prefix)


@dataclass(frozen=True)
class SampleTable:
    """Training or evaluation samples as arrays (one entry per sample).

    Attributes:
        row: the query's position in the log.
        after_len: how many of its after-neighbours the sample keeps (all of
            them for a full sample, a prefix for a partial one).
        label_log: log latency, or the log of a lower bound.
        censored: the label is a lower bound.
        full: the complete neighbour set (not a sampled prefix).
    """

    row: np.ndarray
    after_len: np.ndarray
    label_log: np.ndarray
    censored: np.ndarray
    full: np.ndarray

    def __len__(self) -> int:
        return len(self.row)


def sample_table(log: pd.DataFrame, rows: np.ndarray, *, censored: bool, partial_per_query: int = 2, seed: int = 0,
                 index: NeighbourIndex | None = None) -> SampleTable:
    """Samples for the queries at positions ``rows`` of ``log``, as arrays.

    Args:
        log: the validated query log (all rows: neighbours come from it).
        rows: which queries become samples (e.g. the training split).
        censored: add sampled partial neighbour sets and timed-out queries as
            lower-bound labels (§4.3); without it, timed-out queries are left
            out.
        partial_per_query: partial samples per query with after-neighbours.
        seed: seed of the prefix sampling.
        index: the log's :func:`neighbour_index` (built here when not given).
    """
    index = neighbour_index(log) if index is None else index
    rng = np.random.default_rng(seed)
    arrival = log["arrival_s"].to_numpy(dtype=float)
    latency = log["latency_s"].to_numpy(dtype=float)
    status = log["status"].to_numpy()
    rows = np.asarray(rows, dtype=np.int64)
    keep = (status[rows] != "error") & (latency[rows] > 0)
    timed_out = status[rows] == "timeout"
    if not censored:
        keep &= ~timed_out
    n_after = index.after_len()
    out_row, out_len, out_label, out_cens, out_full = [], [], [], [], []
    with np.errstate(divide="ignore"):
        log_latency = np.log(latency)
    for row, ok, late in zip(rows.tolist(), keep.tolist(), timed_out.tolist(), strict=True):
        if not ok:
            continue
        count = int(n_after[row])
        out_row.append(row), out_len.append(count), out_label.append(log_latency[row])
        out_cens.append(late), out_full.append(True)
        if not censored or count == 0:
            continue
        base = index.after_ptr[row]
        for cut in rng.integers(0, count, size=min(partial_per_query, count)).tolist():
            bound = arrival[index.after[base + cut]] - arrival[row]
            if bound < _MIN_BOUND_S:
                continue
            out_row.append(row), out_len.append(cut), out_label.append(math.log(bound))
            out_cens.append(True), out_full.append(False)
    return SampleTable(np.asarray(out_row, dtype=np.int64), np.asarray(out_len, dtype=np.int64),
                       np.asarray(out_label, dtype=np.float64), np.asarray(out_cens, dtype=bool),
                       np.asarray(out_full, dtype=bool))


def full_samples(index: NeighbourIndex) -> SampleTable:
    """One sample per row of ``index`` with all its neighbours and no label (for prediction)."""
    n = len(index)
    return SampleTable(np.arange(n, dtype=np.int64), index.after_len().astype(np.int64), np.full(n, np.nan),
                       np.zeros(n, dtype=bool), np.ones(n, dtype=bool))


def build_samples(log: pd.DataFrame, rows: np.ndarray, *, censored: bool, partial_per_query: int = 2,
                  seed: int = 0) -> list[QuerySample]:
    """:func:`sample_table` as one :class:`QuerySample` per sample (neighbour arrays included)."""
    index = neighbour_index(log)
    table = sample_table(log, rows, censored=censored, partial_per_query=partial_per_query, seed=seed, index=index)
    return [QuerySample(int(r), index.before[index.before_ptr[r]:index.before_ptr[r + 1]],
                        index.after[index.after_ptr[r]:index.after_ptr[r] + k], float(y), censored=bool(c),
                        full=bool(f))
            for r, k, y, c, f in zip(table.row, table.after_len, table.label_log, table.censored, table.full,
                                     strict=True)]
