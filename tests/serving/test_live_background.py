"""The live runner sizes in the background: routing never waits for the Spinup Size Selector.

The warehouse is a stand-in (``DuckDBClusterPool`` replaced: every query
takes 0.3 s), so the test needs no cores of its own; the size selector's
what-if routers sleep, so one sizing job takes about 0.3 s.
"""

from __future__ import annotations

import copy
import threading
import time

from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig, QueueTrigger
from sloctl.control.router import Query, RouteDecision
from sloctl.datasets.pool import ClusterInfo, QueryCompletion
from sloctl.serving.live import run_live

QUERY_S = 0.3
WHAT_IF_SLEEP_S = 0.1  # per what-if router: 3 routers (preparation, none, size 1) per job


class _Pool:
    """Clusters that are ready at once; each query ends ``QUERY_S`` after it was submitted."""

    def __init__(self, db_path, **_):
        self.sizes: dict[str, int] = {}
        self.inflight: list[QueryCompletion] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def spin_up(self, size, *, cluster_id=None):
        self.sizes[cluster_id] = size
        return cluster_id

    def wait_ready(self, cluster_id, timeout_s=None):
        return None

    def tear_down(self, cluster_id):
        self.sizes.pop(cluster_id, None)

    def clusters(self):
        return [ClusterInfo(cid, size, (0,), "ready", 0.0, 0.0, 0, False) for cid, size in self.sizes.items()]

    def submit(self, cluster_id, request):
        now = time.monotonic()
        self.inflight.append(QueryCompletion(request.query_id, cluster_id, now, now + QUERY_S, "ok"))

    def completions(self, timeout_s=None):
        time.sleep(min(timeout_s or 0.0, 0.005))
        now = time.monotonic()
        done = [c for c in self.inflight if c.end_s <= now]
        self.inflight = [c for c in self.inflight if c.end_s > now]
        return done


class _Running:
    def __init__(self, query_id, template, cluster_id, arrival_s, slo_s, predicted_s):
        self.query_id, self.template, self.cluster_id = query_id, template, cluster_id
        self.arrival_s, self.slo_s, self.predicted_s = arrival_s, slo_s, predicted_s


class _Model:
    """``QUERY_S`` × (1 + ½ per query already on the cluster)."""

    def __init__(self):
        self.running: dict[int, _Running] = {}

    def fork(self):
        twin = _Model()
        twin.running = {k: copy.copy(v) for k, v in self.running.items()}
        return twin

    def running_on(self, cluster_id):
        return [r for r in self.running.values() if r.cluster_id == cluster_id]

    def complete(self, query_id):
        self.running.pop(query_id, None)


class _LeastLoaded:
    name = "least-loaded"

    def __init__(self, model):
        self.model = model

    def route(self, query, clusters, now_s):
        best = min(clusters, key=lambda c: (len(self.model.running_on(c.cluster_id)), c.cluster_id))
        predicted = QUERY_S * (1.0 + 0.5 * len(self.model.running_on(best.cluster_id)))
        self.model.running[query.query_id] = _Running(query.query_id, query.template, best.cluster_id,
                                                      query.arrival_s, query.slo_s, predicted)
        return RouteDecision(best.cluster_id, predicted)

    def on_complete(self, query_id, now_s):
        self.model.complete(query_id)


def _slow_what_if(model):
    time.sleep(WHAT_IF_SLEEP_S)
    return _LeastLoaded(model)


def _run(monkeypatch, background: bool):
    from sloctl.serving import live

    monkeypatch.setattr(live, "DuckDBClusterPool", _Pool)
    router = _LeastLoaded(_Model())
    config = AutoscalerConfig(window_s=1.0, mu=5, candidate_sizes=(1,), spinup_delay_s=0.1, max_clusters=2)
    autoscaler = Autoscaler(config, QueueTrigger(3), router, _slow_what_if, mode="add", minimum_s=0.5,
                            teardown=False)
    queries = [Query(i, "q", 0.03 * i, 0.5) for i in range(80)]  # 2.4 s of arrivals: slack for a slowed sizer thread
    result = run_live("unused.duckdb", queries, [("c0", 1)], router, sql_by_template={"q": "SELECT 1"},
                      autoscaler=autoscaler, minimum_s=0.5, background_sizing=background)
    return result, autoscaler


def _sizer_threads():
    return [t for t in threading.enumerate() if t.name.startswith("sloctl-sizer")]


def test_live_routing_goes_on_while_the_size_selector_runs(monkeypatch):
    threads_before = len(_sizer_threads())
    result, autoscaler = _run(monkeypatch, background=True)
    kinds = [e["event"] for e in result.events]
    assert kinds[:3] == ["sizing", "spin_up", "ready"] and kinds[-1] == "sizer"
    sizing = result.events[0]
    assert sizing["size"] == 1 and sizing["decision_s"] >= 3 * WHAT_IF_SLEEP_S
    # queries arrived and were routed while the job ran
    df = result.queries
    during = df[(df["routed_s"] > sizing["triggered_s"]) & (df["routed_s"] < sizing["t"])]
    assert len(during) >= 5
    assert df["control_s"].max() < 3 * WHAT_IF_SLEEP_S
    assert result.events[-1]["submitted"] == 1 and result.events[-1]["errors"] == 0
    assert autoscaler.sizer is None and len(_sizer_threads()) == threads_before  # worker stopped, sizer taken back


def test_live_inline_sizing_waits_in_the_arrival_step(monkeypatch):
    result, autoscaler = _run(monkeypatch, background=False)
    kinds = [e["event"] for e in result.events]
    assert kinds[:2] == ["spin_up", "ready"] and "sizing" not in kinds and "sizer" not in kinds
    # the arrival that fired the trigger carried the whole size selection
    assert result.queries["control_s"].max() >= 3 * WHAT_IF_SLEEP_S
    assert autoscaler.decisions[0][1].size == 1


def test_live_forced_decision_is_sized_in_the_background_and_applied_after(monkeypatch):
    from sloctl.serving import live

    monkeypatch.setattr(live, "DuckDBClusterPool", _Pool)
    router = _LeastLoaded(_Model())
    config = AutoscalerConfig(window_s=1.0, mu=5, candidate_sizes=(1,), spinup_delay_s=0.1, max_clusters=2)
    autoscaler = Autoscaler(config, None, router, _slow_what_if, mode="add", minimum_s=0.5, teardown=False)
    queries = [Query(i, "q", 0.03 * i, 0.5) for i in range(80)]  # 2.4 s of arrivals: slack for a slowed sizer thread
    result = run_live("unused.duckdb", queries, [("c0", 1)], router, sql_by_template={"q": "SELECT 1"},
                      autoscaler=autoscaler, minimum_s=0.5, force_scaling_at=8, mark_at=(32,))
    kinds = [e["event"] for e in result.events]
    assert kinds[:4] == ["force", "sizing", "spin_up", "ready"] and kinds[-1] == "sizer"
    force, sizing, spin_up = result.events[:3]
    assert force["index"] == 8 and sizing["triggered_s"] == force["t"] and sizing["size"] == 1
    assert sizing["decision_s"] >= 3 * WHAT_IF_SLEEP_S and spin_up["t"] >= sizing["t"] > force["t"]
    df = result.queries
    assert df.loc[df["query_id"] == 8, "control_s"].item() < 3 * WHAT_IF_SLEEP_S  # the forced arrival did not wait
    assert (df["cluster_id"] == spin_up["cluster_id"]).any()
    assert result.events[-1]["submitted"] == 1 and not result.events[-1]["unapplied"]
    assert 0.0 <= result.cost_since(32) <= result.cost
