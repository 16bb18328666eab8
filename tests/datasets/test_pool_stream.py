"""Streamed results, EXPLAIN on a worker, and what a dead worker leaves behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.duckdb_pool import DuckDBClusterPool
from sloctl.datasets.plan_features import ENGINE_PLAN_FEATURES, features_from_plan
from sloctl.datasets.pool import CANCELLED, QueryRequest

SLOW_SQL = "SELECT count(*) FROM range(20000000000) t(i) WHERE i % 7 = 3"


class Pages:
    """An ``on_page`` that keeps every page; with ``auto_credit`` it lets the next one come at once."""

    def __init__(self, pool=None, cluster_id=None, query_id=None, auto_credit=False):
        self.pool, self.cluster_id, self.query_id, self.auto_credit = pool, cluster_id, query_id, auto_credit
        self.pages: list[tuple[tuple, list]] = []
        self.lock = threading.Lock()

    def __call__(self, columns, rows):
        with self.lock:
            self.pages.append((columns, rows))
        if self.auto_credit:
            self.pool.credit(self.cluster_id, self.query_id)

    def count(self) -> int:
        with self.lock:
            return len(self.pages)


def completion(pool, query_id, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for done in pool.completions(timeout_s=0.1):
            if done.query_id == query_id:
                return done
    raise AssertionError(f"no completion for query {query_id}")


@pytest.fixture(scope="module")
def cluster(tpch_db):
    with DuckDBClusterPool(tpch_db, memory_limit="256MB") as pool:
        cid = pool.spin_up(1)
        pool.wait_ready(cid, timeout_s=60)
        yield pool, cid


def test_pages_arrive_in_order_with_their_columns(cluster):
    pool, cid = cluster
    pages = Pages(pool, cid, 1, auto_credit=True)
    pool.submit(cid, QueryRequest(1, "SELECT i, i::DECIMAL(10, 2) AS d FROM range(2500) t(i) ORDER BY i",
                                  stream=True, page_rows=1000, buffer_pages=1, on_page=pages))
    done = completion(pool, 1)
    assert done.status == "ok" and done.rows == 2500 and done.data is None
    assert done.columns == (("i", "BIGINT"), ("d", "DECIMAL(10,2)"))
    assert [len(rows) for _, rows in pages.pages] == [1000, 1000, 500]
    assert all(columns == done.columns for columns, _ in pages.pages)
    rows = [row for _, page in pages.pages for row in page]
    assert rows[0] == [0, "0.00"] and [r[0] for r in rows] == list(range(2500))


def test_worker_sends_no_more_than_its_credit(cluster):
    pool, cid = cluster
    pages = Pages()
    pool.submit(cid, QueryRequest(2, "SELECT i FROM range(100) t(i)", stream=True, page_rows=10, buffer_pages=2,
                                  on_page=pages))
    time.sleep(0.8)
    assert pages.count() == 2 and pool.completions(timeout_s=0.0) == []
    pool.credit(cid, 2, pages=3)
    time.sleep(0.5)
    assert pages.count() == 5
    credited_s = time.monotonic()
    pool.credit(cid, 2, pages=10)
    done = completion(pool, 2)
    assert done.status == "ok" and done.rows == 100 and pages.count() == 10
    assert done.end_s >= credited_s  # the last page went after the credit that let it


def test_stream_waiting_for_credit_times_out(cluster):
    pool, cid = cluster
    pages = Pages()
    pool.submit(cid, QueryRequest(3, "SELECT i FROM range(100) t(i)", timeout_s=0.5, stream=True, page_rows=10,
                                  buffer_pages=1, on_page=pages))
    done = completion(pool, 3, timeout_s=5)
    assert done.status == "timeout" and done.rows == 10 and pages.count() == 1
    assert 0.5 <= done.end_s - done.start_s < 2.0


def test_cancel_wakes_a_stream_waiting_for_credit(cluster):
    pool, cid = cluster
    pool.submit(cid, QueryRequest(4, "SELECT i FROM range(100) t(i)", stream=True, page_rows=10, buffer_pages=1,
                                  on_page=Pages()))
    time.sleep(0.3)
    asked_s = time.monotonic()
    pool.cancel(cid, 4)
    done = completion(pool, 4, timeout_s=5)
    assert done.status == "error" and done.error == CANCELLED
    assert time.monotonic() - asked_s < 1.0


def test_failing_consumer_stops_the_query(cluster):
    pool, cid = cluster

    def refuse(columns, rows):
        raise ValueError("disk full")

    pool.submit(cid, QueryRequest(5, "SELECT i FROM range(100000) t(i)", stream=True, page_rows=10, buffer_pages=2,
                                  on_page=refuse))
    done = completion(pool, 5, timeout_s=5)
    assert done.status == "error" and done.error == "on_page raised ValueError: disk full"


def test_stream_without_consumer_counts_rows_and_empty_results_make_no_page(cluster):
    pool, cid = cluster
    pool.submit(cid, QueryRequest(6, "SELECT i FROM range(5000) t(i)", stream=True, page_rows=100, buffer_pages=1))
    assert completion(pool, 6).rows == 5000
    pages = Pages()
    pool.submit(cid, QueryRequest(7, "SELECT 1 AS x WHERE false", stream=True, on_page=pages))
    done = completion(pool, 7)
    assert done.status == "ok" and done.rows == 0 and done.columns == (("x", "INTEGER"),) and pages.count() == 0
    pool.submit(cid, QueryRequest(8, "SELECT * FROM no_such_table", stream=True, on_page=pages))
    done = completion(pool, 8)
    assert done.status == "error" and done.error.startswith("CatalogException:") and pages.count() == 0


@pytest.mark.parametrize(("request_options", "match"), [
    ({"fetch": True}, "'fetch' and 'stream' parameters"),
    ({"page_rows": 0}, "'page_rows' parameter of a QueryRequest must be an integer >= 1"),
    ({"buffer_pages": 1.5}, "'buffer_pages' parameter"),
])
def test_bad_stream_requests_are_refused_by_name(cluster, request_options, match):
    pool, cid = cluster
    with pytest.raises(ClusterPoolError, match=match):
        pool.submit(cid, QueryRequest(9, "SELECT 1", stream=True, **request_options))
    with pytest.raises(ClusterPoolError, match="'pages' parameter of credit"):
        pool.credit(cid, 9, pages=0)


def test_explain_returns_a_plan_the_featurizer_reads(cluster, tpch_templates):
    pool, cid = cluster
    plan = pool.explain(cid, tpch_templates[0].sql)
    features = features_from_plan(json.loads(plan))
    assert set(features) == set(ENGINE_PLAN_FEATURES)
    assert pool.explain(cid, "SELECT * FROM no_such_table") is None
    assert pool.explain(cid, "SELECT * FROM read_text('/etc/hostname')") is None
    assert pool.explain(cid, "SELECT 1; SELECT 2") is None
    with pytest.raises(ClusterPoolError, match="'timeout_s' parameter of explain"):
        pool.explain(cid, "SELECT 1", timeout_s=0)


def test_killed_worker_fails_its_cluster_and_queries(tpch_db):
    with DuckDBClusterPool(tpch_db) as pool:
        cid = pool.spin_up(1)
        pid = pool.wait_ready(cid, timeout_s=60).pid
        pool.submit(cid, QueryRequest(1, SLOW_SQL))
        pool.submit(cid, QueryRequest(2, "SELECT i FROM range(100) t(i)", stream=True, page_rows=10, buffer_pages=1,
                                      on_page=Pages()))
        time.sleep(0.3)
        killed_s = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        done = {}
        while len(done) < 2 and time.monotonic() - killed_s < 5:
            done.update((c.query_id, c) for c in pool.completions(timeout_s=0.1))
        assert time.monotonic() - killed_s < 2.0
        assert set(done) == {1, 2}
        for c in done.values():
            assert c.status == "error" and "stopped" in c.error and "killed by signal 9" in c.error, c.error
        assert done[2].rows == 10
        info = pool.clusters()[0]
        assert info.state == "failed" and info.failure == f"worker process {pid} was killed by signal 9 (SIGKILL)"
        with pytest.raises(ClusterPoolError, match="failed"):
            pool.submit(cid, QueryRequest(3, "SELECT 1"))
        with pytest.raises(ClusterPoolError, match="failed"):
            pool.explain(cid, "SELECT 1")
        pool.tear_down(cid)
        assert pool.clusters()[0].state == "stopped"


@pytest.mark.slow
def test_streaming_six_million_rows_keeps_the_worker_small(tmp_path_factory):
    """TPC-H SF 1 ``lineitem`` (6M rows, ~1 GB of JSON) through a worker with a 1 GB memory limit."""
    import psutil

    from sloctl.datasets.tpc import ensure_database

    db = ensure_database("tpch", 1, tmp_path_factory.mktemp("sf1"), log=None)
    with DuckDBClusterPool(db, memory_limit="1GB") as pool:
        cid = pool.spin_up(1)
        worker = psutil.Process(pool.wait_ready(cid, timeout_s=120).pid)
        base_rss = worker.memory_info().rss
        rows = [0]

        def on_page(columns, page):
            rows[0] += len(page)
            pool.credit(cid, 1)

        pool.submit(cid, QueryRequest(1, "SELECT * FROM lineitem", stream=True, on_page=on_page))
        peak_rss = base_rss
        done = []
        while not done:
            peak_rss = max(peak_rss, worker.memory_info().rss)
            done = pool.completions(timeout_s=0.05)
        assert done[0].status == "ok" and done[0].rows == rows[0] == 6_001_215
        print(f"worker RSS {base_rss / 2**20:.0f} MiB at start, {peak_rss / 2**20:.0f} MiB at peak; "
              f"{done[0].end_s - done[0].start_s:.1f} s")
        assert peak_rss < 600 * 2**20


@pytest.mark.parametrize("stream_timeout_s,status", [(None, "timeout"), (30.0, "ok")])
def test_once_rows_have_left_the_stream_timeout_bounds_the_query(cluster, stream_timeout_s, status):
    """A consumer slower than ``timeout_s``: cut at it, unless ``stream_timeout_s`` lets the stream run on."""
    pool, cid = cluster
    qid = 900 + (stream_timeout_s is None)
    pages = Pages()
    pool.submit(cid, QueryRequest(qid, "SELECT i FROM range(50) t(i)", timeout_s=0.4, stream=True, page_rows=10,
                                  buffer_pages=1, stream_timeout_s=stream_timeout_s, on_page=pages))
    for _ in range(4):  # one page every 0.25 s: 1 s in all, past the 0.4 s timeout
        time.sleep(0.25)
        pool.credit(cid, qid)
    done = completion(pool, qid)
    assert done.status == status
    assert done.rows == (50 if status == "ok" else pages.count() * 10) and pages.count() >= 1


def test_pages_of_decimals_dates_and_nan_are_json_as_before(cluster):
    pool, cid = cluster
    pages = Pages(pool, cid, 910, auto_credit=True)
    pool.submit(cid, QueryRequest(910, "SELECT 1.5::DECIMAL(4,2) AS d, DATE '2024-03-01' AS day, "
                                       "TIMESTAMP '2024-03-01 12:34:56' AS ts, 'nan'::DOUBLE AS x, [1, 2] AS l",
                                  stream=True, on_page=pages))
    assert completion(pool, 910).status == "ok"
    assert pages.pages[0][1] == [["1.50", "2024-03-01", "2024-03-01 12:34:56", "NaN", [1, 2]]]
