"""Run workloads on live DuckDB clusters and record the query log.

:func:`run_on_cluster` replays one workload on one ready cluster: open-loop
arrivals are dispatched at their scheduled times whatever is running, and a
closed-loop workload (``concurrency_limit``) issues a query whenever a slot
frees. :func:`collect` does this for each requested cluster size in turn
(one cluster at a time, so each gets its cores to itself) and returns the
validated log. All times share one clock whose zero is the collection start.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.core.errors import WorkloadError
from sloctl.datasets.duckdb_pool import DuckDBClusterPool
from sloctl.datasets.plan_features import PlanFeaturizer, sql_hash
from sloctl.datasets.pool import ClusterPool, QueryRequest
from sloctl.datasets.querylog import empty_features, validate_log

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.datasets.workloads import Workload

__all__ = ["CollectResult", "collect", "concat_logs", "run_on_cluster"]

#: Lead time before the first arrival, so it is not late by construction.
_LEAD_S = 0.05


@dataclass
class CollectResult:
    """A collected log and what it took to get it."""

    log: pd.DataFrame
    dispatch_lag_s: list[float]
    spin_up_s: dict[str, float]
    budget_mode: str = "pinning"
    budget_note: str = ""

    def metadata(self) -> dict[str, str]:
        """How CPU was capped, for the log file's metadata."""
        return {"cpu_budget_mode": self.budget_mode, "cpu_budget_note": self.budget_note}


def run_on_cluster(
    pool: ClusterPool,
    cluster_id: str,
    cluster_size: int,
    workload: Workload,
    *,
    clock_zero_s: float,
    first_query_id: int = 0,
    timeout_s: float | None = None,
    features: Callable[[str], dict[str, float]] | None = None,
    on_done: Callable[[int], None] | None = None,
) -> tuple[list[dict[str, Any]], list[float]]:
    """Replay ``workload`` on a ready cluster; return log rows and dispatch lags.

    Args:
        pool: the pool that owns the cluster.
        cluster_id: a ready cluster of ``pool``.
        cluster_size: its size, written to every row.
        workload: the arrivals to replay (times relative to now).
        clock_zero_s: ``time.monotonic()`` value that is time 0 in the log.
        first_query_id: ids are ``first_query_id + index in workload``.
        timeout_s: per-query timeout; a timed-out row is censored.
        features: plan features for a query text (``None``: all NaN).
        on_done: called with the number of finished queries after each one.

    Returns:
        ``(rows, lags)``: one dict per query (log columns) and, for each
        dispatched query, ``start - scheduled arrival`` in seconds.
    """

    items = collections.deque(enumerate(workload.queries))
    limit = workload.concurrency_limit
    in_flight: dict[int, tuple[Any, float]] = {}  # query_id -> (item, arrival monotonic)
    rows: list[dict[str, Any]] = []
    lags: list[float] = []
    # plan features per query text, explained up front so EXPLAIN never delays a dispatch
    hashes = {index: sql_hash(item.sql) for index, item in items}
    feature_cache: dict[str, dict[str, float]] = {}
    for index, item in items:
        if hashes[index] not in feature_cache:
            feature_cache[hashes[index]] = features(item.sql) if features is not None else empty_features()
    base = time.monotonic() + _LEAD_S

    while items or in_flight:
        now = time.monotonic()
        while items and (limit is None or len(in_flight) < limit):
            index, item = items[0]
            due = base + item.arrival_s
            if due > now:
                break
            items.popleft()
            arrival = due if limit is None else max(due, now)
            query_id = first_query_id + index
            in_flight[query_id] = (item, arrival)
            pool.submit(cluster_id, QueryRequest(query_id, item.sql, timeout_s))
            now = time.monotonic()
        if items and (limit is None or len(in_flight) < limit):
            wait = max(0.0, base + items[0][1].arrival_s - time.monotonic())
        else:
            wait = 1.0
        for done in pool.completions(timeout_s=wait):
            if done.query_id not in in_flight:
                continue  # not ours (another run on the same pool)
            item, arrival = in_flight.pop(done.query_id)
            key = hashes[done.query_id - first_query_id]
            if limit is None:
                lags.append(done.start_s - arrival)
            rows.append({
                "query_id": done.query_id,
                "template": item.template,
                "sql_hash": key,
                "cluster_id": cluster_id,
                "cluster_size": cluster_size,
                "arrival_s": arrival - clock_zero_s,
                "start_s": done.start_s - clock_zero_s,
                "end_s": done.end_s - clock_zero_s,
                "latency_s": done.end_s - arrival,
                "status": done.status,
                "slo_s": math.nan,
                "oversubscribed": done.oversubscribed,
                "cpu_budget": done.cpu_budget,
                **feature_cache[key],
                "error": done.error,
                "workload": workload.name,
            })
            if on_done is not None:
                on_done(len(rows))
    return rows, lags


def collect(
    db_path: str | Path,
    workload: Workload,
    sizes: list[int] | tuple[int, ...],
    *,
    timeout_s: float | None = 60.0,
    warmup_s: float = 0.0,
    allow_oversubscribe: bool = False,
    on_progress: Callable[[str, int, int], None] | None = None,
    log: Callable[[str], None] | None = print,
    pool_options: Mapping[str, Any] | None = None,
) -> CollectResult:
    """Run ``workload`` on a fresh cluster of each size in ``sizes``, in turn.

    Args:
        db_path: the DuckDB database the clusters open read-only.
        workload: what to replay on every cluster.
        sizes: cluster sizes (units of CPU budget, or cores without budgets),
            each run on its own new cluster.
        timeout_s: per-query timeout (``None``: none).
        warmup_s: warm-up delay added to every spin-up.
        allow_oversubscribe: allow sizes larger than the machine.
        on_progress: ``(cluster_id, done, total)`` after every query.
        log: where to report spin-up and teardown (``None``: silent).
        pool_options: CPU-budget options of the pool (``size_unit_cores``,
            ``reserved_cores``, ``period_s``, ``budget_mode``: see
            :class:`~sloctl.datasets.duckdb_pool.DuckDBClusterPool`); ``None``
            pins whole cores.

    Returns:
        The validated log (rows in completion order), dispatch lags and
        spin-up durations per cluster.
    """
    import duckdb
    import pandas as pd


    if not sizes:
        raise WorkloadError("The 'sizes' parameter must name at least one cluster size.")
    if len(workload) == 0:
        raise WorkloadError("The workload holds no queries; nothing to collect.")
    if timeout_s is not None and not timeout_s > 0:
        raise WorkloadError(f"The 'timeout_s' parameter must be > 0, got {timeout_s!r}.")
    explain_con = duckdb.connect(str(db_path), read_only=True)
    featurizer = PlanFeaturizer(explain_con)
    rows: list[dict[str, Any]] = []
    lags: list[float] = []
    spin_up_s: dict[str, float] = {}
    clock_zero_s = time.monotonic()
    try:
        with DuckDBClusterPool(db_path, warmup_s=warmup_s, allow_oversubscribe=allow_oversubscribe,
                               log=log or (lambda message: None), **dict(pool_options or {})) as pool:
            budget_mode, budget_note = pool.budget_mode, pool.budget_note
            for run, size in enumerate(sizes):
                cluster_id = pool.spin_up(size, cluster_id=f"size{size}-run{run}")
                info = pool.wait_ready(cluster_id, timeout_s=120 + warmup_s)
                spin_up_s[cluster_id] = info.ready_s - info.requested_s
                if log:
                    log(f"Cluster {cluster_id} ready on cores {list(info.cores)}, CPU budget "
                        f"{info.cpu_budget:g} cores ({budget_mode}), after "
                        f"{spin_up_s[cluster_id]:.2f} s; running {len(workload)} queries.")

                def progress(done: int, cluster_id: str = cluster_id) -> None:
                    if on_progress is not None:
                        on_progress(cluster_id, done, len(workload))

                run_rows, run_lags = run_on_cluster(
                    pool, cluster_id, size, workload, clock_zero_s=clock_zero_s,
                    first_query_id=run * len(workload), timeout_s=timeout_s,
                    features=featurizer, on_done=progress)
                rows.extend(run_rows)
                lags.extend(run_lags)
                pool.tear_down(cluster_id)
    finally:
        explain_con.close()
    df = validate_log(pd.DataFrame(rows), source="collected log")
    return CollectResult(log=df, dispatch_lag_s=lags, spin_up_s=spin_up_s, budget_mode=budget_mode,
                         budget_note=budget_note)


def concat_logs(logs: list[pd.DataFrame], labels: list[str] | None = None) -> pd.DataFrame:
    """Join logs of separate runs into one: ids renumbered, cluster ids kept apart.

    Each run has its own clock and its own clusters, so every part's
    ``cluster_id`` gets a suffix (its label, or its index) and queries from
    different parts are never neighbours.
    """
    import pandas as pd


    parts, offset = [], 0
    for index, log in enumerate(logs):
        label = labels[index] if labels else str(index)
        part = log.copy()
        part["query_id"] = part["query_id"] - part["query_id"].min() + offset if len(part) else part["query_id"]
        part["cluster_id"] = part["cluster_id"].astype(str) + f"-{label}"
        offset += len(part)
        parts.append(part)
    return validate_log(pd.concat(parts, ignore_index=True), source="joined log")
