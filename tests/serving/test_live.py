"""Routers on live DuckDB clusters: the same router runs live unchanged."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from sloctl.control.router import Query, RoundRobinRouter, StageCostRouter
from sloctl.datasets.cpu_budget import find_cgroup_root
from sloctl.datasets.pool import ClusterInfo, QueryCompletion
from sloctl.datasets.slo import slo_baselines
from sloctl.models.online import OnlinePredictor
from sloctl.models.predictor import LatencyPredictor
from sloctl.models.stage import StageConfig
from sloctl.serving.live import run_live
from sloctl.training.pipeline import fit_stage

N_QUERIES = 20
CLUSTERS = [("a", 1), ("b", 1)] if len(os.sched_getaffinity(0)) >= 2 else [("a", 1)]


@pytest.fixture(scope="module")
def sql(tpch_templates):
    return {t.name: t.sql for t in tpch_templates}


@pytest.fixture(scope="module")
def queries(iso_log, tpch_templates):
    slo = slo_baselines(iso_log, 1)
    names = [t.name for t in tpch_templates if t.name in slo]
    # 50 queries/s: they overlap on each cluster
    return [Query(i, names[i % len(names)], 0.02 * i, 2.0 * slo[names[i % len(names)]]) for i in range(N_QUERIES)]


def worker_children() -> list[int]:
    """Cluster worker processes that are children of this test process (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"sloctl.datasets._cluster_worker" in cmdline:
            found.append(int(entry.name))
    return found


def check_rows(result, queries):
    df = result.queries
    assert len(df) == len(queries) and sorted(df["query_id"]) == [q.query_id for q in queries]
    assert (df["status"] == "ok").all()
    assert (df["routed_s"] >= df["arrival_s"]).all() and (df["start_s"] >= df["routed_s"]).all()
    assert (df["end_s"] >= df["start_s"]).all()
    assert np.allclose(df["latency_s"], df["end_s"] - df["arrival_s"])
    assert set(df["cluster_id"]) <= {cid for cid, _ in CLUSTERS}
    assert (df["violated"] == (df["latency_s"] > df["slo_s"])).all()
    assert result.violation_rate == pytest.approx(df["violated"].mean())
    assert result.cost > 0 and result.cost == pytest.approx(sum(result.cost_by_cluster.values()))
    assert set(result.cost_by_cluster) == {cid for cid, _ in CLUSTERS}


def test_round_robin_alternates_clusters_and_records_every_query(tpch_db, queries, sql):
    progress = []
    result = run_live(tpch_db, queries, CLUSTERS, RoundRobinRouter(), minimum_s=0.5, timeout_s=30,
                      sql_by_template=sql, on_progress=lambda done, total: progress.append((done, total)))
    check_rows(result, queries)
    ordered = result.queries.sort_values(["arrival_s", "query_id"])
    ids = [cid for cid, _ in CLUSTERS]
    assert list(ordered["cluster_id"]) == [ids[i % len(ids)] for i in range(len(queries))]
    assert ordered["predicted_s"].isna().all()
    assert progress[-1] == (len(queries), len(queries)) and len(progress) == len(queries)
    # a billing window lasts at least minimum_s on every cluster that ran a query
    assert all(cost >= 0.5 for cost in result.cost_by_cluster.values())
    assert worker_children() == []


def test_stage_cost_router_runs_live_unchanged(tpch_db, iso_log, queries, sql):
    rows = np.arange(len(iso_log))
    stage = fit_stage(iso_log, rows, StageConfig(), np.zeros(len(iso_log), int))
    online = OnlinePredictor(LatencyPredictor(stage), iso_log.drop_duplicates("template"), use_iconq=False)
    result = run_live(tpch_db, queries, CLUSTERS, StageCostRouter(online), minimum_s=0.5, timeout_s=30,
                      sql_by_template=sql)
    check_rows(result, queries)
    expected = [online.isolated_s(t, 1) for t in result.queries["template"]]
    assert np.allclose(result.queries["predicted_s"], expected) and (result.queries["predicted_s"] > 0).all()
    assert online.running == {}  # every completion reached the router


@pytest.mark.skipif(find_cgroup_root() is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs writable cgroups and a core for the controller")
def test_live_runs_on_budgeted_clusters_and_removes_their_groups(tpch_db, queries, sql):
    options = {"size_unit_cores": 0.25, "reserved_cores": 1}
    result = run_live(tpch_db, queries, [("a", 2), ("b", 1)], RoundRobinRouter(), minimum_s=0.5, timeout_s=60,
                      sql_by_template=sql, pool_options=options)
    check_rows(result, queries)
    assert set(result.queries["cluster_id"]) == {"a", "b"}
    parent = find_cgroup_root().path / "sloctl"
    assert not [p for p in parent.iterdir() if p.name.startswith(f"p{os.getpid()}-")]


def test_pool_is_torn_down_after_a_run_and_after_a_failing_router(tpch_db, queries, sql):
    class Failing(RoundRobinRouter):
        def route(self, query, clusters, now_s):
            if query.query_id == 3:
                raise RuntimeError("router broke")
            return super().route(query, clusters, now_s)

    with pytest.raises(RuntimeError, match="router broke"):
        run_live(tpch_db, queries[:6], CLUSTERS, Failing(), sql_by_template=sql)
    assert worker_children() == []
    # the same cores serve a second run at once
    again = run_live(tpch_db, queries[:4], CLUSTERS, RoundRobinRouter(), minimum_s=0.1, sql_by_template=sql)
    assert len(again.queries) == 4 and worker_children() == []


class _LatePool:
    """A pool whose first completion is reported only after the next arrival was routed."""

    def __init__(self, db_path, **_):
        self.submitted: dict[int, tuple[str, float]] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def spin_up(self, size, *, cluster_id=None):
        return cluster_id

    def wait_ready(self, cluster_id, timeout_s=None):
        return None

    def clusters(self):
        return [ClusterInfo(cid, 1, (0,), "ready", 0.0, 0.0, 0, False) for cid in ("a", "b")]

    def submit(self, cluster_id, request):
        self.submitted[request.query_id] = (cluster_id, time.monotonic())

    def completions(self, timeout_s=None):
        if len(self.submitted) < 2:
            time.sleep(min(timeout_s or 0.0, 0.01))
            return []
        (c0, t0), (c1, t1) = self.submitted.pop(0), self.submitted.pop(1)
        # query 0 ended 10 ms before query 1 was routed, but is observed after it
        return [QueryCompletion(0, c0, t0, t1 - 0.01, "ok"), QueryCompletion(1, c1, t1, t1 + 0.001, "ok")]


class _CostReadingRouter(RoundRobinRouter):
    """Reads every cluster's billing timer at ``now_s``, as the cost-aware routers do."""

    def route(self, query, clusters, now_s):
        for c in clusters:
            c.timer.projected_active_s(now_s, now_s)
        return super().route(query, clusters, now_s)


@pytest.mark.parametrize("clusters", [[("a", 1)], [("a", 1), ("b", 1)]], ids=["same-cluster", "other-cluster"])
def test_completion_observed_late_is_clamped_for_billing(monkeypatch, sql, clusters):
    from sloctl.serving import live

    monkeypatch.setattr(live, "DuckDBClusterPool", _LatePool)
    queries = [Query(0, "tpch-q06", 0.0, 1.0), Query(1, "tpch-q06", 0.05, 1.0)]
    result = run_live("unused.duckdb", queries, clusters, _CostReadingRouter(), minimum_s=0.0,
                      sql_by_template=sql)
    df = result.queries.set_index("query_id")
    assert df.loc[0, "end_s"] < df.loc[1, "routed_s"]  # the row keeps the measured end
    # billing without gaps: query 0's end is clamped to query 1's routing time
    assert result.cost == pytest.approx(df.loc[1, "end_s"] - df.loc[0, "routed_s"], abs=1e-6)


def test_bad_input_is_refused_before_any_cluster_starts(tpch_db, queries, sql):
    with pytest.raises(ValueError, match="sql_by_template"):
        run_live(tpch_db, queries, CLUSTERS, RoundRobinRouter(), sql_by_template={})
    with pytest.raises(ValueError, match="distinct cluster ids"):
        run_live(tpch_db, queries, [("a", 1), ("a", 1)], RoundRobinRouter(), sql_by_template=sql)
    assert worker_children() == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores: one to start on, one to add")
def test_live_autoscaler_spins_up_a_real_cluster_and_routes_to_it(tpch_db, tpch_templates):
    from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig, QueueTrigger
    from sloctl.control.router import RoundRobinRouter

    class Counting:  # the autoscaler reads running queries from the router's model
        def __init__(self):
            self.router = RoundRobinRouter()
            self.model = type("M", (), {"running": {}})()

        def route(self, query, clusters, now_s):
            return self.router.route(query, clusters, now_s)

        def on_complete(self, query_id, now_s):
            return None

    router = Counting()
    config = AutoscalerConfig(spinup_delay_s=0.2, candidate_sizes=(1,), max_clusters=2)
    autoscaler = Autoscaler(config, QueueTrigger(1), router, lambda m: router, mode="horizontal", teardown=False)
    router.model.running = {0: type("R", (), {"query_id": 0, "template": "t", "arrival_s": 0.0, "slo_s": 1.0,
                                               "predicted_s": 1.0})()}
    sql = {t.name: t.sql for t in tpch_templates}
    queries = [Query(i, tpch_templates[i % 4].name, 0.05 * i, 5.0) for i in range(30)]
    result = run_live(tpch_db, queries, [("c0", 1)], router, sql_by_template=sql, autoscaler=autoscaler,
                      warmup_s=0.1, minimum_s=1.0)
    kinds = [e["event"] for e in result.events]
    assert kinds[:2] == ["spin_up", "ready"]
    new = result.events[0]["cluster_id"]
    assert (result.queries["cluster_id"] == new).any()  # routed to once ready
    assert set(result.cost_by_cluster) == {"c0", new}
    assert len(result.queries) == 30
