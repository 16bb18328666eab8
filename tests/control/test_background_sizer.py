"""The Spinup Size Selector off the arrival path (control/background.py, AutoSLO §6).

The pool is driven by hand: every arrival is one control step
(``pool.scale`` then ``pool.route``), as the live runner does. Queries never
complete, so a single size-1 cluster falls behind and the size selector
asks for a second one (the same scenario without a sizer spins it up at the
fourth arrival, the first to find three running).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from concurrent.futures import Future

import pytest

from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig, SizingOutcome
from sloctl.control.background import BackgroundSizer
from sloctl.control.managed import ManagedPool
from sloctl.control.router import Query, RouteDecision

ISOLATED = {("a", 1): 1.0, ("a", 2): 0.6}


class _Running:
    def __init__(self, query_id, template, cluster_id, size, arrival_s, slo_s, predicted_s):
        self.query_id, self.template, self.cluster_id, self.size = query_id, template, cluster_id, size
        self.arrival_s, self.slo_s, self.predicted_s = arrival_s, slo_s, predicted_s


class TableModel:
    """Isolated latency × (1 + ½ per query already on the cluster); ``fork`` copies the running set."""

    def __init__(self, isolated_s):
        self.isolated = isolated_s
        self.running: dict[int, _Running] = {}

    def fork(self):
        twin = TableModel(self.isolated)
        twin.running = {k: copy.copy(v) for k, v in self.running.items()}
        return twin

    def running_on(self, cluster_id):
        return [r for r in self.running.values() if r.cluster_id == cluster_id]

    def commit(self, query_id, template, arrival_s, slo_s, cluster_id, size, now_s):
        predicted = self.isolated[(template, size)] * (1.0 + 0.5 * len(self.running_on(cluster_id)))
        self.running[query_id] = _Running(query_id, template, cluster_id, size, arrival_s, slo_s, predicted)
        return predicted

    def complete(self, query_id):
        self.running.pop(query_id, None)


class LeastLoaded:
    """Routes to the cluster with the fewest running queries (larger size first on ties)."""

    name = "least-loaded"

    def __init__(self, model):
        self.model = model

    def route(self, query, clusters, now_s):
        best = min(clusters, key=lambda c: (len(self.model.running_on(c.cluster_id)), -c.size, c.cluster_id))
        predicted = self.model.commit(query.query_id, query.template, query.arrival_s, query.slo_s,
                                      best.cluster_id, best.size, now_s)
        return RouteDecision(best.cluster_id, predicted)

    def on_complete(self, query_id, now_s):
        self.model.complete(query_id)


class Eager:
    """Fires at every arrival with at least ``n`` running queries (no in-flight flag: tests coalescing)."""

    def __init__(self, n):
        self.n = n
        self.suppressed: list[float] = []

    def check(self, now_s, active, running, windows):
        return len(running) >= self.n

    def suppress(self, until_s):
        self.suppressed.append(until_s)


class Backend:
    def __init__(self):
        self.started: list[tuple[int, float]] = []

    def spin_up(self, size, now_s):
        self.started.append((size, now_s))
        return f"new{len(self.started)}", now_s + 1.0

    def tear_down(self, cluster_id, now_s):
        raise AssertionError("no teardown in these tests")


class ManualExecutor:
    """Runs a submitted job only when the test says so: a worker whose timing the test decides."""

    def __init__(self):
        self.jobs: list[tuple[Future, object, tuple]] = []
        self.shut_down = False

    def submit(self, fn, *args):
        future = Future()
        self.jobs.append((future, fn, args))
        return future

    def run_all(self):
        while self.jobs:
            future, fn, args = self.jobs.pop(0)
            future.set_running_or_notify_cancel()
            future.set_result(fn(*args))

    def shutdown(self, wait=True, cancel_futures=False):
        self.shut_down = True
        if cancel_futures:
            for future, _, _ in self.jobs:
                future.cancel()


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def build(sizer=None, make_router=None):
    router = LeastLoaded(TableModel(ISOLATED))
    config = AutoscalerConfig(window_s=5.0, mu=8, candidate_sizes=(1, 2), spinup_delay_s=1.0, max_clusters=2)
    autoscaler = Autoscaler(config, Eager(3), router, make_router or LeastLoaded, mode="add", minimum_s=2.0,
                            teardown=False, sizer=sizer)
    backend = Backend()
    pool = ManagedPool(router, autoscaler=autoscaler, minimum_s=2.0, backend=backend)
    pool.add_cluster("c0", 1)
    return pool, autoscaler, backend


def arrive(pool, i, t=None):
    """One control step for query ``i`` arriving at ``0.5 i``; returns the autoscaler's actions."""
    t = 0.5 * i if t is None else t
    query = Query(i, "a", t, 2.0)
    actions = pool.scale(query, t)
    pool.route(query, t)
    return actions


def test_synchronous_mode_sizes_inside_the_triggering_step():
    pool, autoscaler, backend = build()
    for i in range(4):
        arrive(pool, i)
    assert backend.started == [(1, 1.5)]  # the fourth arrival (t = 1.5) fired and spun up at once
    t, outcome, action = autoscaler.decisions[0]
    assert t == 1.5 and outcome.size == 1 and action.kind == "spin_up"
    assert [e["event"] for e in pool.events] == ["spin_up"]  # no sizing event without a sizer


def test_background_job_is_applied_at_the_step_after_it_finishes():
    clock, executor = FakeClock(), ManualExecutor()
    sizer = BackgroundSizer(executor, clock=clock)
    pool, autoscaler, backend = build(sizer)
    for i in range(4):
        assert arrive(pool, i) == []
    assert sizer.busy and not sizer.done and backend.started == []  # routed on; the job has not run
    arrive(pool, 4)
    assert backend.started == [] and sizer.coalesced == 1  # fired again while the job was pending
    clock.now += 0.25  # the job waited 0.25 s for the worker ...
    future, timed, (job,) = executor.jobs[0]
    executor.jobs[0] = (future, timed, (_advancing(job, clock, 0.5),))
    executor.run_all()  # ... and ran for 0.5 s
    assert sizer.done
    clock.now += 0.125  # then waited for the next arrival
    actions = arrive(pool, 5)
    assert [a.kind for a in actions] == ["spin_up"] and backend.started == [(1, 2.5)]
    sizing, spin_up = pool.events
    assert sizing["event"] == "sizing" and sizing["t"] == 2.5 and sizing["triggered_s"] == 1.5
    assert sizing["size"] == 1
    assert sizing["decision_s"] == pytest.approx(0.5) and sizing["queue_delay_s"] == pytest.approx(0.375)
    assert spin_up["event"] == "spin_up" and spin_up["size"] == 1
    t, outcome, action = autoscaler.decisions[0]
    assert t == 1.5 and outcome.size == 1 and action.kind == "spin_up"  # recorded at the trigger's time
    # that arrival's trigger was coalesced too: the finished result was still to be taken
    assert (sizer.submitted, sizer.coalesced) == (1, 2) and not sizer.busy


def test_a_forced_decision_is_sized_in_the_background_like_a_triggered_one():
    sizer = BackgroundSizer(ManualExecutor())
    pool, autoscaler, backend = build(sizer)
    autoscaler.trigger = None  # only the forced decision scales
    for i in range(3):
        arrive(pool, i)
    forced = Query(3, "a", 1.5, 2.0)
    assert pool.scale(forced, 1.5, force=True) == []  # submitted; the arrival is routed at once
    pool.route(forced, 1.5)
    assert sizer.submitted == 1 and backend.started == []
    sizer.executor.run_all()
    assert [a.kind for a in arrive(pool, 4)] == ["spin_up"] and backend.started == [(1, 2.0)]
    assert pool.events[0]["event"] == "sizing" and pool.events[0]["triggered_s"] == 1.5
    # the same decision as inside the step, without a sizer
    sync_pool, sync_scaler, sync_backend = build()
    sync_scaler.trigger = None
    for i in range(3):
        arrive(sync_pool, i)
    assert [a.kind for a in sync_pool.scale(forced, 1.5, force=True)] == ["spin_up"]
    assert sync_backend.started == [(1, 1.5)]
    assert autoscaler.decisions[0][1].outcomes == sync_scaler.decisions[0][1].outcomes


def test_a_forced_decision_while_a_job_runs_is_coalesced_into_it():
    sizer = BackgroundSizer(ManualExecutor())
    pool, autoscaler, backend = build(sizer)
    for i in range(4):
        arrive(pool, i)  # the fourth fired the trigger: a job is under way
    assert pool.scale(Query(4, "a", 2.0, 2.0), 2.0, force=True) == []
    assert (sizer.submitted, sizer.coalesced) == (1, 2)  # the trigger and the forced decision
    assert autoscaler.decisions == []


def _advancing(job, clock, seconds):
    def run():
        value = job()
        clock.now += seconds
        return value

    return run


def test_background_outcome_equals_the_synchronous_one():
    sync_pool, sync_scaler, _ = build()
    sizer = BackgroundSizer(ManualExecutor())
    bg_pool, bg_scaler, _ = build(sizer)
    for i in range(4):
        arrive(sync_pool, i)
        arrive(bg_pool, i)
    sizer.executor.run_all()
    arrive(bg_pool, 4)
    assert bg_scaler.decisions[0][1].outcomes == sync_scaler.decisions[0][1].outcomes


def test_routing_does_not_wait_for_a_running_sizing_job():
    release, started = threading.Event(), threading.Event()

    def make_router(model):  # what-if routers only: the job blocks until released
        started.set()
        assert release.wait(10.0), "the test never released the sizing job"
        return LeastLoaded(model)

    sizer = BackgroundSizer()
    pool, autoscaler, backend = build(sizer, make_router)
    try:
        for i in range(4):
            arrive(pool, i)
        assert started.wait(5.0)  # the job runs on the worker ...
        t0 = time.perf_counter()
        for i in range(4, 9):  # ... and routing goes on meanwhile
            arrive(pool, i)
        assert time.perf_counter() - t0 < 5.0
        assert sizer.busy and not sizer.done and backend.started == [] and sizer.coalesced == 5
        assert len(pool.running) == 9
        release.set()
        deadline = time.monotonic() + 10.0
        while not sizer.done:
            assert time.monotonic() < deadline, "the sizing job did not finish"
            time.sleep(0.01)
        arrive(pool, 9)
        assert [e["event"] for e in pool.events] == ["sizing", "spin_up"] and backend.started == [(1, 4.5)]
        assert pool.events[0]["triggered_s"] == 1.5 and pool.events[0]["decision_s"] > 0
    finally:
        release.set()
        sizer.close()


def test_a_failing_job_is_recorded_and_suppresses_the_trigger(caplog):
    def broken(model):
        raise RuntimeError("what-if broke")

    sizer = BackgroundSizer(ManualExecutor())
    pool, autoscaler, backend = build(sizer, broken)
    for i in range(4):
        arrive(pool, i)
    sizer.executor.run_all()
    with caplog.at_level(logging.ERROR, logger="sloctl.control.background"):
        assert arrive(pool, 4) == []
    assert "what-if broke" in caplog.text
    assert backend.started == [] and len(sizer.errors) == 1 and isinstance(sizer.errors[0], RuntimeError)
    (event,) = pool.events
    assert event["event"] == "sizing_error" and event["error"] == "RuntimeError: what-if broke"
    assert autoscaler.trigger.suppressed == [2.0 + autoscaler.config.spinup_delay_s]
    assert autoscaler.decisions == [(1.5, None, None)]


def test_a_result_that_no_longer_fits_is_skipped():
    sizer = BackgroundSizer(ManualExecutor())
    pool, autoscaler, backend = build(sizer)
    for i in range(4):
        arrive(pool, i)
    pool.add_cluster("other", 1)  # the pool reached max_clusters meanwhile
    sizer.executor.run_all()
    assert arrive(pool, 4) == [] and backend.started == []
    assert pool.events[0]["skipped"] == "max_clusters" and pool.events[0]["size"] == 1


def test_sizer_coalesces_and_hands_each_result_over_once():
    executor = ManualExecutor()
    sizer = BackgroundSizer(executor)
    assert sizer.poll() is None
    assert sizer.submit(lambda: SizingOutcome(None, {}), triggered_s=1.0)
    assert not sizer.submit(lambda: SizingOutcome(2, {}), triggered_s=2.0)
    assert sizer.poll() is None  # not run yet
    executor.run_all()
    result = sizer.poll()
    assert result.triggered_s == 1.0 and result.value.size is None and result.error is None
    assert sizer.poll() is None and not sizer.busy
    assert (sizer.submitted, sizer.coalesced) == (1, 1)


def test_close_stops_the_worker_thread():
    def workers():
        return [t for t in threading.enumerate() if t.name.startswith("sloctl-sizer")]

    before = len(workers())
    sizer = BackgroundSizer()
    assert sizer.submit(lambda: 42, triggered_s=0.0)
    assert len(workers()) == before + 1
    result = sizer.close()  # waits for the job; nobody took its result
    assert result is not None and result.value == 42
    assert len(workers()) == before
    with pytest.raises(RuntimeError, match="closed"):
        sizer.submit(lambda: 1, triggered_s=0.0)


def test_close_cancels_a_job_that_never_started():
    executor = ManualExecutor()
    sizer = BackgroundSizer(executor)
    sizer.submit(lambda: 1, triggered_s=0.0)
    assert sizer.close() is None and executor.shut_down and sizer.errors == []
