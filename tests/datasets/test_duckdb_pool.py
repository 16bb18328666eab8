"""The live DuckDB warehouse: real processes, real queries, exact times."""

from __future__ import annotations

import os
import time

import pytest

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.collect import collect
from sloctl.datasets.duckdb_pool import DuckDBClusterPool
from sloctl.datasets.pool import QueryRequest
from sloctl.datasets.workloads import Workload, WorkloadQuery, base_workload, isolated_workload

SLOW_SQL = "SELECT count(*) FROM range(20000000000) t(i) WHERE i % 7 = 3"


def wait_all(pool, n, timeout_s=60.0):
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got.extend(pool.completions(timeout_s=1.0))
    assert len(got) == n
    return got


def test_overlapping_executions_are_recorded_in_order(tpch_db, tpch_templates):
    # 22 queries in 0.2 s on one core: they must overlap.
    wl = base_workload(tpch_templates, rate_per_s=100.0, copies=1, seed=3)
    result = collect(tpch_db, wl, [1], timeout_s=30, log=None)
    df = result.log.sort_values("start_s")
    assert (df["status"] == "ok").all()
    assert (df["start_s"] >= df["arrival_s"]).all()
    assert (df["end_s"] > df["start_s"]).all()
    assert ((df["latency_s"] - (df["end_s"] - df["arrival_s"])).abs() < 1e-9).all()
    # some query starts before an earlier-started one has ended
    assert (df["start_s"].iloc[1:].to_numpy() < df["end_s"].cummax().iloc[:-1].to_numpy()).any()
    # arrivals keep the workload's spacing
    expected = sorted(q.arrival_s for q in wl.queries)
    got = sorted(df["arrival_s"] - df["arrival_s"].min())
    assert max(abs(a - b) for a, b in zip(expected, got, strict=False)) < 1e-6


def test_isolated_run_never_overlaps(tpch_db, tpch_templates):
    wl = isolated_workload(tpch_templates[:6], copies=1, seed=0)
    df = collect(tpch_db, wl, [1], log=None).log.sort_values("start_s")
    assert (df["start_s"].iloc[1:].to_numpy() >= df["end_s"].iloc[:-1].to_numpy()).all()


def test_timeout_is_recorded_as_censored_row(tpch_db):
    wl = Workload("probe", (WorkloadQuery("slow", SLOW_SQL, 0.0),
                            WorkloadQuery("fast", "SELECT 42", 0.05)))
    df = collect(tpch_db, wl, [1], timeout_s=0.3, log=None).log.set_index("template")
    slow = df.loc["slow"]
    assert slow["status"] == "timeout"
    assert 0.3 <= slow["latency_s"] < 2.0  # time to failure: a lower bound on latency
    assert df.loc["fast", "status"] == "ok"


def test_failed_query_is_an_error_row(tpch_db):
    wl = Workload("probe", (WorkloadQuery("bad", "SELECT * FROM no_such_table", 0.0),))
    df = collect(tpch_db, wl, [1], log=None).log
    assert df["status"].tolist() == ["error"]
    assert "no_such_table" in df["error"].iloc[0]


def test_clusters_get_disjoint_cores_and_oversize_pools_are_refused(tpch_db):
    n = len(os.sched_getaffinity(0))
    with DuckDBClusterPool(tpch_db) as pool:
        first = pool.spin_up(1)
        with pytest.raises(ClusterPoolError, match="needs .* free cores"):
            pool.spin_up(n)
        pool.wait_ready(first, timeout_s=60)
        pool.tear_down(first)
        second = pool.spin_up(n)  # cores are free again
        info = pool.wait_ready(second, timeout_s=60)
        assert len(info.cores) == n and not info.oversubscribed


def test_oversubscribed_pool_marks_every_row(tpch_db):
    n = len(os.sched_getaffinity(0))
    with DuckDBClusterPool(tpch_db, allow_oversubscribe=True) as pool:
        a = pool.spin_up(n)
        b = pool.spin_up(1)
        pool.wait_ready(a, timeout_s=60)
        pool.wait_ready(b, timeout_s=60)
        assert all(c.oversubscribed for c in pool.clusters())
        pool.submit(a, QueryRequest(1, "SELECT 1"))
        pool.submit(b, QueryRequest(2, "SELECT 2"))
        done = wait_all(pool, 2)
        assert all(c.oversubscribed and c.status == "ok" for c in done)


def test_spin_up_includes_warmup_and_teardown_interrupts(tpch_db):
    with DuckDBClusterPool(tpch_db, warmup_s=0.4) as pool:
        cid = pool.spin_up(1)
        info = pool.wait_ready(cid, timeout_s=60)
        assert info.ready_s - info.requested_s >= 0.4
        pool.submit(cid, QueryRequest(7, SLOW_SQL))
        time.sleep(0.2)
        pool.tear_down(cid)
        done = wait_all(pool, 1)
        assert done[0].status == "error" and "torn down" in done[0].error
        with pytest.raises(ClusterPoolError, match="stopped"):
            pool.submit(cid, QueryRequest(8, "SELECT 1"))


def test_unknown_cluster_and_bad_size_are_clear_errors(tpch_db):
    with DuckDBClusterPool(tpch_db) as pool:
        with pytest.raises(ClusterPoolError, match="Unknown cluster 'nope'"):
            pool.submit("nope", QueryRequest(1, "SELECT 1"))
        with pytest.raises(ClusterPoolError, match="'size'"):
            pool.spin_up(0)
