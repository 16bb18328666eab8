"""The runtime enacts the execution-config in force: starting clusters, scheduled spin-ups, autoscaler knobs.

The registry is faked (each slot reads an alias from a dict) and the clock is
injected, so every test runs in well under a second of real time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from sloctl.config import load_config
from sloctl.control.autoscaler import AutoscalerConfig, SizingOutcome
from sloctl.control.policies import ExecutionPlan
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup, ScheduledSpinups
from sloctl.serving.controller import ModelSlot
from sloctl.serving.runtime import Runtime
from sloctl.serving.runtime.execution import check_plan_settings, plan_day_start, spinup_offset_s

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXECUTION = "models:/execution-config@champion"
DAY = "2024-03-04"
MIDNIGHT = dt.datetime(2024, 3, 4, tzinfo=dt.UTC).timestamp()
HOUR = 3600.0


class FakeClock:
    """Wall seconds that move only when told."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def to(self, t: float) -> None:
        self.t = t


class FakeRegistry:
    """Stands in for MLflow: alias URI -> (version, value); an exception as value fails to load."""

    def __init__(self) -> None:
        self.aliases: dict[str, tuple[str, object]] = {}

    def refresh(self, slot: ModelSlot) -> bool:  # ModelSlot.refresh's contract
        entry = self.aliases.get(slot.uri)
        if entry is None:
            slot.error = f"no model at {slot.uri}"
            return False
        version, value = entry
        if version == slot.version:
            return False
        if isinstance(value, Exception):
            slot.error = f"version {version} failed to load ({value}); serving version {slot.version}"
            return False
        slot.value, slot.version, slot.error = value, version, None
        slot.swaps += 1
        return True


@pytest.fixture
def registry(monkeypatch):
    fake = FakeRegistry()
    monkeypatch.setattr(ModelSlot, "refresh", lambda slot: fake.refresh(slot))
    return fake


def _cfg(tmp_path, **serve):
    base = load_config()
    serve = {"state_db": str(tmp_path / "state.db"), "watch_interval_s": 0.05, "cluster_sizes": (1, 2),
             "spinup_delay_s": 60.0, **serve}
    return dataclasses.replace(base, serve=dataclasses.replace(base.serve, **serve))


def _plan(spinups=(), *, start=(1,), knobs=None, target=DAY, **extra) -> ExecutionPlan:
    return ExecutionPlan(ExecutionConfig(spinups=tuple(ScheduledSpinup(*s) for s in spinups), autoscaler=knobs,
                                         start_sizes=tuple(start)), target_date=target, **extra)


def _runtime(tmp_path, clock, **serve) -> Runtime:
    cfg = _cfg(tmp_path, **serve)
    return Runtime(cfg, None, cfg.serve.state_db, clock=clock).start()


def _ready(rt: Runtime) -> dict[str, int]:
    return {c["cluster_id"]: c["size"] for c in rt.clusters_view()["clusters"]}


# -- mapping the Policy Tuner's time_s onto the wall clock ----------------------------------------------------
def test_a_spinup_time_maps_onto_the_real_or_the_compressed_day():
    plan = _plan(time_scale={"hour_s": 4.0})
    assert spinup_offset_s(plan, 10.0, clock="real") == pytest.approx(2.5 * HOUR)  # real_time 02:30
    assert plan.real_time(10.0) == "02:30"
    assert spinup_offset_s(plan, 10.0, clock="compressed") == 10.0
    assert spinup_offset_s(_plan(), 10.0, clock="real") == 10.0  # no time_scale: uncompressed


def test_the_plan_day_starts_at_its_target_date_the_load_or_the_epoch():
    loaded = MIDNIGHT + 5 * 86400 + 123.0
    assert plan_day_start(_plan(), epoch=None, in_force_wall_s=loaded) == MIDNIGHT
    assert plan_day_start(_plan(target=None), epoch=None, in_force_wall_s=loaded) == MIDNIGHT + 5 * 86400
    assert plan_day_start(_plan(), epoch="load", in_force_wall_s=loaded) == loaded
    assert plan_day_start(_plan(), epoch="2024-03-04T01:00:00", in_force_wall_s=loaded) == MIDNIGHT + HOUR
    bad = dataclasses.replace(load_config().serve, plan_epoch="tomorrow")
    with pytest.raises(ValueError, match=r"'serve.plan_epoch' setting must be null, 'load' or an ISO-8601 "
                                         r"date-time, got 'tomorrow'"):
        check_plan_settings(bad)


def test_scheduled_spinups_due_between_arrivals_respect_the_pool_limit():
    schedule = ScheduledSpinups([ScheduledSpinup(5.0, 2), ScheduledSpinup(1.0, 1, "vertical")], max_clusters=2)
    assert schedule.due(0.5, ["c0"]) == []
    assert [a.kind for a in schedule.due(1.0, ["c0"])] == ["spin_up", "retire_others"]
    assert schedule.due(9.0, ["c0", "c1"]) == [] and schedule.skipped == [ScheduledSpinup(5.0, 2)]
    assert schedule.requested == [ScheduledSpinup(1.0, 1, "vertical")] and schedule.upcoming == []


# -- the runtime enacts the plan ------------------------------------------------------------------------------
def test_a_scheduled_spinup_is_enacted_at_its_time_exactly_once(tmp_path, registry):
    clock = FakeClock(MIDNIGHT + 0.5 * HOUR)
    registry.aliases[EXECUTION] = ("1", _plan([(HOUR, 2), (2 * HOUR, 1)]))
    rt = _runtime(tmp_path, clock)
    assert rt.execution_view()["next_spinup"] == {"at": "2024-03-04T01:00:00.000+00:00", "size": 2, "mode": "add"}

    clock.to(MIDNIGHT + HOUR - 0.001)
    rt.route(1, "t", 5.0)
    assert not rt.enactor.enacted and set(rt.pool.clusters) == {"plan-c0-s1"}
    clock.to(MIDNIGHT + HOUR)
    rt.route(2, "t", 5.0)  # the route call looks at the clock first
    (enacted,) = rt.execution_view()["enacted"]
    assert enacted["cluster_id"] == "plan-1-s2" and enacted["size"] == 2
    assert enacted["at"] == enacted["scheduled_at"] == "2024-03-04T01:00:00.000+00:00"
    assert enacted["ready_at"] == "2024-03-04T01:01:00.000+00:00"  # serve.spinup_delay_s later
    for qid in (3, 4, 5):
        assert rt.route(qid, "t", 5.0)["cluster_id"] == "plan-c0-s1"  # not routed to before it is ready
    assert len(rt.execution_view()["enacted"]) == 1
    view = rt.clusters_view()
    assert [s["cluster_id"] for s in view["starting"]] == ["plan-1-s2"] and "plan-1-s2" not in _ready(rt)
    clock.to(MIDNIGHT + HOUR + 60.0)
    assert _ready(rt) == {"plan-c0-s1": 1, "plan-1-s2": 2}
    assert {rt.route(qid, "t", 5.0)["cluster_id"] for qid in (6, 7)} == {"plan-c0-s1", "plan-1-s2"}
    # the background refresh enacts the next one without any route call
    clock.to(MIDNIGHT + 2 * HOUR + 1.0)
    rt.refresh()
    assert [e["cluster_id"] for e in rt.execution_view()["enacted"]] == ["plan-1-s2", "plan-2-s1"]
    assert rt.execution_view()["next_spinup"] is None
    events = [(e["event"], e.get("cluster_id"), e["origin"]) for e in rt.clusters_view()["events"]]
    assert ("spin_up", "plan-1-s2", "schedule") in events and ("ready", "plan-1-s2", "schedule") in events
    assert rt.enactor.counts[("spin_up", "schedule")] == 2
    rt.close()


def test_the_start_sizes_of_the_first_plan_become_the_pool(tmp_path, registry):
    clock = FakeClock(MIDNIGHT)
    rt = _runtime(tmp_path, clock)
    assert _ready(rt) == {"c0": 1, "c1": 2} and rt.execution_view() is None
    running = rt.route(1, "t", 5.0)["cluster_id"]  # a query runs on a config cluster when the plan arrives
    registry.aliases[EXECUTION] = ("1", _plan(start=(2, 2, 1)))
    rt.refresh()
    assert set(_ready(rt)) == {"plan-c0-s2", "plan-c1-s2", "plan-c2-s1", running}
    assert rt.pool.clusters[running].retired  # drains: no new query goes there
    assert {rt.route(q, "t", 5.0)["cluster_id"] for q in (2, 3, 4)} == {"plan-c0-s2", "plan-c1-s2", "plan-c2-s1"}
    rt.complete(1, 0.5, "ok")
    rt.tick()
    assert _ready(rt) == {"plan-c0-s2": 2, "plan-c1-s2": 2, "plan-c2-s1": 1}
    assert rt.execution_view()["in_force"]["start_sizes_applied"] is True
    rt.close()


def test_a_pool_changed_by_hand_keeps_its_clusters(tmp_path, registry):
    clock = FakeClock(MIDNIGHT)
    rt = _runtime(tmp_path, clock)
    rt.put_cluster("mine", 4)
    registry.aliases[EXECUTION] = ("1", _plan(start=(2,)))
    rt.refresh()
    assert _ready(rt) == {"c0": 1, "c1": 2, "mine": 4}
    in_force = rt.execution_view()["in_force"]
    assert in_force["start_sizes"] == [2] and in_force["start_sizes_applied"] is False
    assert "changed by hand" in in_force["start_sizes_note"]
    rt.close()


def test_a_new_plan_replaces_the_spinups_to_come_and_the_knobs_without_a_restart(tmp_path, registry):
    clock = FakeClock(MIDNIGHT)
    first = AutoscalerConfig(t_idle_s=100.0, t_min_lifetime_s=200.0, spinup_delay_s=10.0)
    registry.aliases[EXECUTION] = ("1", _plan([(HOUR, 2), (3 * HOUR, 2)], knobs=first))
    rt = _runtime(tmp_path, clock)
    assert rt.pool.autoscaler.config == first
    clock.to(MIDNIGHT + HOUR)
    rt.route(1, "t", 5.0)
    assert [e["cluster_id"] for e in rt.execution_view()["enacted"]] == ["plan-1-s2"]
    second = dataclasses.replace(first, t_idle_s=50.0, spinup_delay_s=20.0)
    registry.aliases[EXECUTION] = ("2", _plan([(2 * HOUR, 1), (4 * HOUR, 4)], start=(4,), knobs=second))
    rt.refresh()
    view = rt.execution_view()
    assert view["source"] == f"{EXECUTION} v2" and view["in_force"]["autoscaler"]["t_idle_s"] == 50.0
    assert rt.pool.autoscaler.config == second  # the new knobs at once
    assert view["next_spinup"]["at"] == "2024-03-04T02:00:00.000+00:00" and view["next_spinup"]["size"] == 1
    assert view["in_force"]["start_sizes_applied"] is False  # only the first plan sets the pool
    assert set(rt.pool.clusters) == {"plan-c0-s1", "plan-1-s2"}  # what was spun up stays
    clock.to(MIDNIGHT + 3 * HOUR + 1.0)  # past the old plan's 03:00 spin-up: not enacted any more
    rt.tick()  # the first look after 02:00 requests the new plan's spin-up
    enacted = rt.execution_view()["enacted"]
    assert [(e["cluster_id"], e["source"]) for e in enacted] == [
        ("plan-1-s2", f"{EXECUTION} v1"), ("plan-2-s1", f"{EXECUTION} v2")]
    assert enacted[1]["scheduled_at"] == "2024-03-04T02:00:00.000+00:00"
    assert enacted[1]["at"] == "2024-03-04T03:00:01.000+00:00"
    assert enacted[1]["ready_at"] == "2024-03-04T03:00:21.000+00:00"  # the new knobs' spin-up delay
    rt.close()


def test_scheduled_clusters_are_torn_down_by_the_teardown_trigger_once_idle(tmp_path, registry):
    clock = FakeClock(MIDNIGHT)
    knobs = AutoscalerConfig(t_idle_s=100.0, t_min_lifetime_s=200.0, spinup_delay_s=10.0)
    registry.aliases[EXECUTION] = ("1", _plan([(HOUR, 2)], knobs=knobs))
    rt = _runtime(tmp_path, clock)
    assert "teardown only" in rt.execution_view()["in_force"]["reactive"]  # round-robin: no trigger model
    rt.route(1, "t", 5.0)  # keeps the starting cluster busy
    clock.to(MIDNIGHT + HOUR)
    rt.tick()
    clock.to(MIDNIGHT + HOUR + 150.0)
    rt.route(2, "t", 5.0)  # plan-1-s2 is idle for T_idle but younger than T_min_lifetime
    rt.complete(2, 1.0, "ok")
    assert "plan-1-s2" in rt.pool.clusters
    clock.to(MIDNIGHT + HOUR + 400.0)
    assert rt.route(3, "t", 5.0)["cluster_id"] == "plan-c0-s1"  # the arrival tears it down first (§6.2.1)
    assert "plan-1-s2" not in rt.pool.clusters
    teardown = [e for e in rt.clusters_view()["events"] if e["event"] == "tear_down"]
    assert teardown[-1]["cluster_id"] == "plan-1-s2" and teardown[-1]["origin"] == "autoscaler"
    assert rt.total_cost(rt.now_s()) > 0  # its cost stays in the total
    rt.close()


def test_spinups_past_before_the_plan_came_into_force_are_missed_not_enacted_late(tmp_path, registry):
    clock = FakeClock(MIDNIGHT + 5 * HOUR)
    registry.aliases[EXECUTION] = ("1", _plan([(HOUR, 2), (6 * HOUR, 1)]))
    rt = _runtime(tmp_path, clock)
    view = rt.execution_view()
    assert view["missed"] == [{"at": "2024-03-04T01:00:00.000+00:00", "size": 2, "mode": "add"}]
    assert view["enacted"] == [] and view["next_spinup"]["size"] == 1
    rt.close()


def test_bad_or_absent_configs_leave_the_runtime_serving_as_before(tmp_path, registry):
    clock = FakeClock(MIDNIGHT)
    registry.aliases[EXECUTION] = ("1", OSError("artifact store unreachable"))
    rt = _runtime(tmp_path, clock)
    assert rt.execution_view() is None and "failed to load" in rt.slots["execution"].error
    assert rt.route(1, "t", 5.0)["cluster_id"] in ("c0", "c1") and rt.pool.autoscaler is None
    good = _plan([(HOUR, 2)], start=(2,))
    registry.aliases[EXECUTION] = ("2", good)
    rt.refresh()
    assert set(rt.pool.clusters) >= {"plan-c0-s2"}
    broken = _plan(knobs=AutoscalerConfig(window_s=0.0))  # cannot be enacted (a document would be refused)
    registry.aliases[EXECUTION] = ("3", broken)
    rt.refresh()
    slot = rt.slots["execution"]
    assert "version 3 could not be enacted" in slot.error and f"enacting {EXECUTION} v2" in slot.error
    assert slot.value is good and slot.version == "2" and rt.execution_view()["source"] == f"{EXECUTION} v2"
    assert rt.pool.autoscaler is None
    rt.route(2, "t", 5.0)
    rt.close()


def test_the_endpoints_show_the_plan_in_force_its_next_spinup_and_what_it_enacted(tmp_path, registry, wait_until):
    from sloctl.serving.local import LocalServer
    from sloctl.serving.runtime.app import create_app

    clock = FakeClock(MIDNIGHT + 0.5 * HOUR)
    cfg = _cfg(tmp_path)
    plan = _plan([(HOUR, 2)], start=(1,), knobs=AutoscalerConfig(spinup_delay_s=30.0))
    with LocalServer(create_app(cfg, token=TOKEN, clock=clock)) as client:
        assert client.get("/v1/execution-config").status_code == 404
        registry.aliases[EXECUTION] = ("1", plan)  # the watcher picks it up without a restart
        served = wait_until(lambda: client.get("/v1/execution-config").json()["in_force"], "the plan in force")
        body = client.get("/v1/execution-config").json()
        assert {k: body[k] for k in plan.to_doc()} == plan.to_doc() and body["source"] == f"{EXECUTION} v1"
        assert served["since"] == "2024-03-04T00:30:00.000+00:00" and served["start_sizes"] == [1]
        assert served["autoscaler"]["spinup_delay_s"] == 30.0
        assert body["next_spinup"] == {"at": "2024-03-04T01:00:00.000+00:00", "size": 2, "mode": "add"}
        assert body["enacted"] == []
        clock.to(MIDNIGHT + HOUR + 5.0)
        assert client.post("/v1/route", json={"query_id": 1, "template": "t", "slo_s": 5.0},
                           headers=AUTH).status_code == 200
        body = client.get("/v1/execution-config").json()
        assert body["next_spinup"] is None
        assert [(e["cluster_id"], e["size"]) for e in body["enacted"]] == [("plan-1-s2", 2)]
        clusters = client.get("/v1/clusters").json()
        assert [c["cluster_id"] for c in clusters["clusters"]] == ["plan-c0-s1"]
        # requested at the first look after 01:00 (the route call or the watcher), ready δ = 30 s later
        assert clusters["starting"][0]["ready_at"] == "2024-03-04T01:00:35.000+00:00"
        assert any(e["event"] == "spin_up" and e["cluster_id"] == "plan-1-s2" for e in clusters["events"])
        metrics = client.get("/metrics").text
        assert 'sloctl_scaling_events_total{event="spin_up",origin="schedule"} 1.0' in metrics


def test_route_calls_drive_the_reactive_autoscaler_through_the_background_sizer(tmp_path, registry, sim_log,
                                                                                monkeypatch, wait_until):
    from sloctl.control.autoscaler import Autoscaler
    from sloctl.training.pipeline import train_stage

    stage = train_stage(sim_log, load_config().stage, risk_quantile=None).predictor
    registry.aliases["models:/stage@champion"] = ("1", stage)
    knobs = AutoscalerConfig(theta=3, tau_trigger=0.1, spinup_delay_s=5.0, candidate_sizes=(1, 2))
    registry.aliases[EXECUTION] = ("1", _plan(knobs=knobs))
    # the Spinup Size Selector's verdict is Algorithm 3's business (tests/control); here: what the runtime does with it
    monkeypatch.setattr(Autoscaler, "sizing_job", lambda self, now_s, clusters: lambda: SizingOutcome(2, {}))
    clock = FakeClock(MIDNIGHT)
    cfg = _cfg(tmp_path)
    table = sim_log.drop_duplicates("template").reset_index(drop=True)
    rt = Runtime(cfg, table, cfg.serve.state_db, clock=clock).start()
    assert rt.router_kind == "stage" and "size selector" in rt.execution_view()["in_force"]["reactive"]
    template = str(sim_log["template"].iloc[0])
    for qid in range(4):  # every query predicted to miss a 1 ms SLO: the spin-up trigger fires (Algorithm 2)
        clock.to(MIDNIGHT + qid)
        rt.route(qid, template, 0.001)
    assert rt.sizer.submitted == 1  # routing did not wait for it
    wait_until(lambda: rt.sizer.done or not rt.sizer.busy, "the sizing job")  # (or the same arrival took it)
    clock.to(MIDNIGHT + 10.0)
    rt.route(10, template, 0.001)  # an arrival after the job finished applies its spin-up
    assert rt.origin.get("auto-1-s2") == "autoscaler" and rt.pool.clusters["auto-1-s2"].size == 2
    spin_up = [e for e in rt.clusters_view()["events"] if e["event"] == "spin_up"]
    assert [(e["cluster_id"], e["origin"]) for e in spin_up] == [("auto-1-s2", "autoscaler")]
    assert any(e["event"] == "sizing" for e in rt.clusters_view()["events"])
    assert rt.enactor.counts[("spin_up", "autoscaler")] == 1
    rt.close()


def test_a_restart_restores_queries_running_on_the_plan_start_clusters(tmp_path, registry):
    clock = FakeClock(MIDNIGHT)
    registry.aliases[EXECUTION] = ("1", _plan(start=(2,)))
    rt = _runtime(tmp_path, clock)
    assert rt.route(1, "t", 5.0)["cluster_id"] == "plan-c0-s2"
    rt.close()
    clock.to(MIDNIGHT + 10.0)
    again = _runtime(tmp_path, clock)  # the plan is taken before the running queries are reconciled
    assert again.reconciled == {"restored": 1, "dropped_stale": 0, "clusters": "state"}
    assert set(again.pool.clusters) == {"plan-c0-s2"}
    assert again.complete(1, 10.0, "ok")["cluster_id"] == "plan-c0-s2"
    again.close()


def test_a_vertical_spinup_takes_over_once_ready_and_the_others_drain(tmp_path, registry):
    clock = FakeClock(MIDNIGHT)
    registry.aliases[EXECUTION] = ("1", _plan([(HOUR, 2, "vertical")], start=(1,)))
    rt = _runtime(tmp_path, clock)
    clock.to(MIDNIGHT + HOUR + 30.0)
    assert rt.route(1, "t", 5.0)["cluster_id"] == "plan-c0-s1"  # retired, but serves until plan-1-s2 is ready
    assert rt.pool.clusters["plan-c0-s1"].retired
    clock.to(MIDNIGHT + HOUR + 90.0)
    assert rt.route(2, "t", 5.0)["cluster_id"] == "plan-1-s2"
    assert "plan-c0-s1" in rt.pool.clusters  # still runs query 1
    rt.complete(1, 60.0, "ok")
    assert _ready(rt) == {"plan-1-s2": 2}
    rt.close()
