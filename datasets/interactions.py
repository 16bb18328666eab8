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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sloctl.datasets.plan_features import PLAN_FEATURE_VERSION, PLAN_FEATURES

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FEATURE_SCHEMA_VERSION",
    "FeatureScaler",
    "QuerySample",
    "build_samples",
    "neighbour_lists",
    "pair_dim",
    "pair_vectors",
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


def neighbour_lists(log: pd.DataFrame) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Row positions of each query's before- and after-neighbours, chronological.

    Neighbours run on the same cluster with overlapping executions. A
    neighbour that arrived earlier (ties: smaller ``query_id``) is "before".
    Every logged execution occupied the cluster, so failed and timed-out
    queries are neighbours too.
    """
    n_rows = len(log)
    before: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * n_rows
    after: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * n_rows
    arrival = log["arrival_s"].to_numpy(dtype=float)
    qid = log["query_id"].to_numpy()
    start = log["start_s"].to_numpy(dtype=float)
    end = log["end_s"].to_numpy(dtype=float)
    for _, index in log.groupby("cluster_id", sort=False).indices.items():
        order = index[np.lexsort((qid[index], arrival[index]))]
        s, e = start[order], end[order]
        overlap = (s[:, None] < e[None, :]) & (s[None, :] < e[:, None])
        np.fill_diagonal(overlap, False)
        for i, row in enumerate(order):
            mates = np.flatnonzero(overlap[i])
            before[row] = order[mates[mates < i]]
            after[row] = order[mates[mates > i]]
    return before, after


@dataclass
class QuerySample:
    """One training/evaluation example for Iconq+."""

    row: int                 # position in the log
    before: np.ndarray       # row positions, chronological
    after: np.ndarray        # row positions, chronological (maybe a prefix)
    label_log: float         # log latency, or log of a lower bound
    censored: bool           # label is a lower bound
    full: bool               # the complete neighbour set (not a sampled prefix)


def build_samples(log: pd.DataFrame, rows: np.ndarray, *, censored: bool, partial_per_query: int = 2,
                  seed: int = 0) -> list[QuerySample]:
    """Samples for the queries at positions ``rows`` of ``log``.

    Args:
        log: the validated query log (all rows: neighbours come from it).
        rows: which queries become samples (e.g. the training split).
        censored: add sampled partial neighbour sets and timed-out queries as
            lower-bound labels (§4.3); without it, timed-out queries are left
            out.
        partial_per_query: partial samples per query with after-neighbours.
        seed: seed of the prefix sampling.
    """
    rng = np.random.default_rng(seed)
    before, after = neighbour_lists(log)
    arrival = log["arrival_s"].to_numpy(dtype=float)
    latency = log["latency_s"].to_numpy(dtype=float)
    status = log["status"].to_numpy()
    samples: list[QuerySample] = []
    for row in np.asarray(rows, dtype=np.int64):
        if status[row] == "error" or latency[row] <= 0:
            continue
        timed_out = status[row] == "timeout"
        if timed_out and not censored:
            continue
        samples.append(QuerySample(int(row), before[row], after[row], float(np.log(latency[row])),
                                   censored=bool(timed_out), full=True))
        if not censored or len(after[row]) == 0:
            continue
        for cut in rng.integers(0, len(after[row]), size=min(partial_per_query, len(after[row]))):
            bound = arrival[after[row][cut]] - arrival[row]
            if bound < _MIN_BOUND_S:
                continue
            samples.append(QuerySample(int(row), before[row], after[row][:cut], float(np.log(bound)),
                                       censored=True, full=False))
    return samples
