from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from sloctl.control.billing import BillingTimer
from sloctl.control.router import (
    ClusterState,
    IconqRouter,
    Query,
    RoundRobinRouter,
    RouterGuard,
    ShadowRoundRobinRouter,
    StageCostRouter,
    load_based,
    protect_based,
)
from sloctl.models.calibration import MarginCalibration, concurrency_support, running_at_arrival
from sloctl.models.online import Counterfactual


@dataclass
class Running:
    query_id: int
    arrival_s: float
    slo_s: float
    predicted_s: float


class FakeModel:
    """Counterfactuals chosen by the test: {cluster: (query_s, running_after_s)}."""

    def __init__(self, answers, running=None, isolated=None):
        self.answers = answers
        self.running = running or {}
        self.isolated = isolated or {}
        self.committed = []

    def counterfactuals(self, template, arrival_s, clusters, now_s):
        out = {}
        for cid in clusters:
            query_s, after = self.answers[cid]
            mine = self.running.get(cid, [])
            out[cid] = Counterfactual(query_s, [r.query_id for r in mine],
                                      np.array([r.predicted_s for r in mine]), np.array(after, dtype=float))
        return out

    def commit(self, query_id, template, arrival_s, slo_s, cluster_id, size, now_s):
        self.committed.append(cluster_id)
        return self.answers[cluster_id][0] if cluster_id in self.answers else self.isolated[(template, size)]

    def complete(self, query_id):
        pass

    def isolated_s(self, template, size):
        return self.isolated[(template, size)]

    def running_on(self, cluster_id):
        return self.running.get(cluster_id, [])


def cluster(cid, size, busy_since=None):
    timer = BillingTimer(minimum_s=60)
    if busy_since is not None:
        timer.query_arrived(busy_since)
    return ClusterState(cid, size, timer)


def test_iconq_router_never_picks_a_violating_cluster_when_a_safe_one_exists():
    # "cheap" is busy (open billing window) but the newcomer would push a running query past its SLO.
    running = {"cheap": [Running(1, 0.0, 10.0, 5.0)]}
    model = FakeModel({"cheap": (2.0, [12.0]), "idle": (2.0, [])}, running)
    decision = IconqRouter(model).route(Query(2, "t", 1.0, 5.0), [cluster("cheap", 1, 0.0), cluster("idle", 1)], 1.0)
    assert decision.cluster_id == "idle"
    assert decision.explanation["cheap"]["violations_after"] == 1
    assert decision.explanation["idle"]["violations_after"] == 0


def test_iconq_router_picks_the_cheapest_of_equally_safe_clusters():
    running = {"open": [Running(1, 0.0, 10.0, 5.0)]}
    model = FakeModel({"open": (2.0, [6.0]), "idle": (2.0, [])}, running)
    decision = IconqRouter(model).route(Query(2, "t", 1.0, 5.0), [cluster("idle", 1), cluster("open", 1, 0.0)], 1.0)
    assert decision.cluster_id == "open"  # its billing window is already open: no new minimum
    assert decision.explanation["open"]["marginal_cost"] < decision.explanation["idle"]["marginal_cost"]
    assert model.committed == ["open"]


def test_iconq_router_prefers_fewer_violations_even_at_higher_cost():
    model = FakeModel({"small": (9.0, []), "big": (3.0, [])})
    decision = IconqRouter(model).route(Query(2, "t", 0.0, 5.0), [cluster("small", 1), cluster("big", 4)], 0.0)
    assert decision.cluster_id == "big"


def test_stage_router_meets_the_slo_in_isolation_then_cost():
    model = FakeModel({}, isolated={("t", 1): 9.0, ("t", 2): 4.0, ("t", 4): 2.0})
    router = StageCostRouter(model)
    clusters = [cluster("one", 1), cluster("two", 2), cluster("four", 4)]
    assert router.route(Query(1, "t", 0.0, 5.0), clusters, 0.0).cluster_id == "two"  # safe and cheaper than four
    strict = router.route(Query(2, "t", 0.0, 1.0), clusters, 0.0)
    assert strict.cluster_id == "four"  # none meets 1 s: the fastest


def test_round_robin_cycles_and_empty_pools_are_refused():
    router = RoundRobinRouter()
    clusters = [cluster("a", 1), cluster("b", 1)]
    assert [router.route(Query(i, "t", 0.0, 1.0), clusters, 0.0).cluster_id for i in range(3)] == ["a", "b", "a"]
    with pytest.raises(ValueError, match="No active cluster"):
        router.route(Query(9, "t", 0.0, 1.0), [], 0.0)


def test_shadow_round_robin_places_like_round_robin_but_runs_the_model():
    # the model would send everything to "fast"; the shadow keeps round-robin's placements
    model = FakeModel({"slow": (9.0, []), "fast": (1.0, [])})
    shadow = ShadowRoundRobinRouter(IconqRouter(model))
    clusters = [cluster("slow", 1), cluster("fast", 1)]
    decisions = [shadow.route(Query(i, "t", 0.0, 5.0), clusters, 0.0) for i in range(3)]
    assert [d.cluster_id for d in decisions] == ["slow", "fast", "slow"]
    assert model.committed == ["slow", "fast", "slow"]  # the model's state follows the real placements
    assert decisions[0].explanation == {"slow": {"predicted_s": 9.0}, "fast": {"predicted_s": 1.0}}


# -- the guard and soft violation counts: load-based placement while the model is not to be trusted --

def _busy(n):
    return [Running(i, 0.0, 100.0, 1.0) for i in range(n)]


def test_router_without_guard_follows_the_model_past_any_concurrency():
    running = {"cheap": _busy(10)}
    model = FakeModel({"cheap": (1.0, [1.0] * 10), "idle": (1.0, [])}, running)
    router = IconqRouter(model)
    decision = router.route(Query(99, "t", 1.0, 5.0), [cluster("cheap", 1, 0.0), cluster("idle", 1)], 1.0)
    assert decision.cluster_id == "cheap" and decision.fallback is None
    assert router.guard_state is None


def test_support_guard_places_by_load_when_the_pick_runs_more_than_training_showed():
    # The model says "cheap" is fine with 10 running; training never saw more than 3 on size 1.
    running = {"cheap": _busy(10)}
    model = FakeModel({"cheap": (1.0, [1.0] * 10), "idle": (1.0, [])}, running)
    router = IconqRouter(model, guard=RouterGuard(support={1: 3}))
    decision = router.route(Query(99, "t", 1.0, 5.0), [cluster("cheap", 1, 0.0), cluster("idle", 1)], 1.0)
    assert decision.cluster_id == "idle"
    assert decision.fallback == "support"
    assert decision.explanation["cheap"]["violations_after"] == 0  # the model's view is still explained
    assert router.guard_state.summary()["fallbacks"] == {"error": 0, "support": 1}
    assert router.guard_state.summary()["fallback_rate"] == 1.0


def test_support_guard_lets_the_model_decide_inside_its_support():
    running = {"cheap": _busy(2)}
    model = FakeModel({"cheap": (1.0, [1.0] * 2), "idle": (1.0, [])}, running)
    router = IconqRouter(model, guard=RouterGuard(support={1: 3}))
    decision = router.route(Query(99, "t", 1.0, 5.0), [cluster("cheap", 1, 0.0), cluster("idle", 1)], 1.0)
    assert decision.cluster_id == "cheap" and decision.fallback is None
    assert router.guard_state.summary()["fallback_rate"] == 0.0


def test_error_guard_fires_on_high_recent_error_and_lets_go_when_it_falls():
    model = FakeModel({"a": (1.0, []), "b": (1.0, [])})
    router = IconqRouter(model, guard=RouterGuard(max_ratio=2.0, window=4, min_samples=4))
    clusters = [cluster("a", 1), cluster("b", 2)]
    for i in range(4):  # predicted 1 s, took 3 s: ratio 3
        router.route(Query(i, "t", float(i), 5.0), clusters, float(i))
        router.on_complete(i, float(i) + 3.0)
    assert router.guard_state.recent_ratio() == pytest.approx(3.0)
    decision = router.route(Query(10, "t", 10.0, 5.0), clusters, 10.0)
    assert decision.fallback == "error"
    assert decision.cluster_id == "b"  # nothing running: the larger cluster has the least load per unit
    # Queries placed by load are still predicted and measured: the model is right again (ratio 1).
    router.on_complete(10, 11.0)  # window 3, 3, 3, 1: median 3
    assert router.route(Query(11, "t", 11.0, 5.0), clusters, 11.0).fallback == "error"
    router.on_complete(11, 12.0)  # window 3, 3, 1, 1: median 2, not above max_ratio
    assert not router.guard_state.error_high()
    assert router.route(Query(12, "t", 12.0, 5.0), clusters, 12.0).fallback is None
    summary = router.guard_state.summary()
    assert summary["routes"] == 7 and summary["fallbacks"] == {"error": 2, "support": 0}
    assert summary["fallback_rate"] == pytest.approx(2 / 7)


def test_error_guard_waits_for_min_samples():
    model = FakeModel({"a": (1.0, [])})
    router = IconqRouter(model, guard=RouterGuard(max_ratio=1.5, window=8, min_samples=3))
    for i in range(2):
        router.route(Query(i, "t", float(i), 5.0), [cluster("a", 1)], float(i))
        router.on_complete(i, float(i) + 10.0)
    assert not router.guard_state.error_high()
    router.route(Query(5, "t", 5.0, 5.0), [cluster("a", 1)], 5.0)
    router.on_complete(5, 15.0)
    assert router.guard_state.error_high()


def test_load_based_picks_fewest_running_per_size_unit():
    small, big = cluster("small", 1), cluster("big", 4)
    assert load_based([small, big], {"small": 0, "big": 3}).cluster_id == "big"  # 4/4 = 1 vs 1/1 = 1: larger wins
    assert load_based([small, big], {"small": 0, "big": 4}).cluster_id == "small"  # 5/4 > 1/1


def test_protect_places_by_load_among_clusters_without_late_queries():
    a, b, c = cluster("a", 1), cluster("b", 1), cluster("c", 2)
    # "a" is the least loaded but runs a query past its SLO; "c" (2 per unit... 3/2) beats "b" (2/1).
    assert protect_based([a, b, c], {"a": 0, "b": 1, "c": 2}, {"a": 1, "b": 0, "c": 0}).cluster_id == "c"
    assert protect_based([a, b], {"a": 0, "b": 1}, {"a": 0, "b": 0}).cluster_id == "a"  # none late: by load


def test_protect_sends_overload_to_the_cluster_already_losing_its_queries():
    a, b = cluster("a", 1), cluster("b", 1)
    # Both have late queries: "b" has lost 3 of 4, "a" 1 of 2: "a" is left to recover.
    assert protect_based([a, b], {"a": 2, "b": 4}, {"a": 1, "b": 3}).cluster_id == "b"
    # The same share late: the more loaded one per size unit takes it.
    assert protect_based([a, b], {"a": 2, "b": 4}, {"a": 1, "b": 2}).cluster_id == "b"


def _late(n, now):
    return [Running(i, 0.0, now / 2, 1.0) for i in range(n)]  # arrived at 0 with an SLO of now / 2: late


@pytest.mark.parametrize(("placement", "expected"), [("protect", "busy"), ("load", "light")])
def test_guard_placement_setting_decides_where_an_untrusted_pick_goes(placement, expected):
    # The model wants "busy" past its support; "light" also has a late query, but a smaller share of them.
    running = {"busy": _late(6, 10.0), "light": _late(1, 10.0) + _busy(3)}
    model = FakeModel({"busy": (1.0, [1.0] * 6), "light": (1.0, [1.0] * 4)}, running)
    router = IconqRouter(model, guard=RouterGuard(support={1: 3}, placement=placement))
    decision = router.route(Query(99, "t", 10.0, 5.0), [cluster("busy", 1, 0.0), cluster("light", 1, 0.0)], 10.0)
    assert decision.fallback == "support"
    assert decision.cluster_id == expected


def test_support_limit_scales_from_the_nearest_smaller_size():
    guard = RouterGuard(support={1: 3, 2: 5})
    assert guard.limit(2) == 5
    assert guard.limit(4) == 10  # from size 2: 5 x 4/2
    assert guard.limit(1) == 3
    assert RouterGuard(support={2: 5}).limit(1) == float("inf")
    assert RouterGuard().limit(1) == float("inf")


@pytest.mark.parametrize("kwargs", [{"max_ratio": 1.0}, {"window": 0}, {"window": 4, "min_samples": 5},
                                    {"support": {0: 3}}, {"support": {1: -1}}, {"placement": "nearest"}])
def test_guard_settings_are_checked(kwargs):
    with pytest.raises(ValueError):
        RouterGuard(**kwargs)


def test_running_at_arrival_counts_overlaps_per_run_and_cluster():
    log = pd.DataFrame({
        "run": [0, 0, 0, 0, 1],
        "cluster_id": ["c1", "c1", "c1", "c2", "c1"],
        "cluster_size": [1, 1, 1, 2, 1],
        "arrival_s": [0.0, 1.0, 5.0, 1.5, 1.2],
        "latency_s": [3.0, 1.0, 1.0, 1.0, 1.0],
    })
    # row 1 arrives at 1.0 while row 0 runs (0-3); row 2 at 5.0 finds nothing; other run and cluster never count.
    assert running_at_arrival(log).tolist() == [0, 1, 0, 0, 0]
    assert concurrency_support(log) == {1: 1, 2: 0}


def test_calibration_round_trips_its_support():
    calibration = MarginCalibration(0.2, 0.75, 1.25, 1.1, 100, concurrency_support={1: 3, 4: 12})
    doc = calibration.to_dict()
    assert doc["concurrency_support"] == {"1": 3, "4": 12}  # JSON keys
    assert MarginCalibration.from_dict(doc) == calibration
    old = {k: v for k, v in doc.items() if k != "concurrency_support"}  # a bundle written before
    assert MarginCalibration.from_dict(old).concurrency_support is None
    assert "12 running on size 4" in calibration.describe()


def test_soft_counts_keep_load_off_a_cluster_whose_queries_are_already_late():
    # "late": two running queries already predicted past their SLO; the newcomer makes them later still.
    # "ok": one query just inside its SLO, which the newcomer pushes just past it.
    # A 0/1 count sees no new violation on "late" (lost anyway) and one on "ok", so it piles onto "late";
    # the soft count sees the late ones get much worse and the ok one only a little.
    running = {"late": [Running(1, 0.0, 1.0, 1.2), Running(2, 0.0, 1.0, 1.2)],
               "ok": [Running(3, 0.0, 10.0, 9.0)]}
    model = FakeModel({"late": (2.0, [3.0, 3.0]), "ok": (2.0, [10.5])}, running)
    clusters = [cluster("late", 1, 0.0), cluster("ok", 1, 0.0)]
    hard = IconqRouter(model).route(Query(9, "t", 1.0, 2.5), clusters, 1.0)
    assert hard.cluster_id == "late"
    soft = IconqRouter(model, violation_spread=0.5).route(Query(9, "t", 1.0, 2.5), clusters, 1.0)
    assert soft.cluster_id == "ok"
    late = soft.explanation["late"]
    assert late["violations_after"] - late["violations_before"] > 0.9  # two queries near 0.64 -> near 0.99


def test_soft_count_is_half_at_the_threshold():
    router = IconqRouter(FakeModel({}), violation_spread=0.3)
    assert router._violations(np.array([2.0]), np.array([2.0])) == pytest.approx(0.5)
    assert router._violations(np.array([20.0]), np.array([2.0])) == pytest.approx(1.0, abs=1e-6)
    assert IconqRouter(FakeModel({}))._violations(np.array([2.0, 3.0]), np.array([2.5, 2.5])) == 1
    with pytest.raises(ValueError, match="violation_spread"):
        IconqRouter(FakeModel({}), violation_spread=-1.0)


def test_calibration_spread_follows_the_median_and_the_quantile():
    calibration = MarginCalibration(0.5, 0.75, 2.0, 1.0, 100)
    assert calibration.spread() == pytest.approx(np.log(2.0) / 0.6744897501960817)
    assert MarginCalibration(0.0, 0.75, 1.0, 1.0, 10).spread() == 0.05  # no spread measured: the floor


def test_equal_clusters_tied_on_violations_and_cost_go_to_the_shorter_queue():
    # Both billing windows are open and nothing is predicted late; the model says joining the busy
    # cluster adds less latency (it misjudges interference). The load tie break still joins the idler one.
    running = {"busy": [Running(1, 0.0, 50.0, 3.0), Running(2, 0.0, 50.0, 3.0)],
               "calm": [Running(3, 0.0, 50.0, 3.0)]}
    answers = {"busy": (1.0, [3.0, 3.0]), "calm": (2.0, [3.5])}
    clusters = [cluster("busy", 1, 0.0), cluster("calm", 1, 0.0)]
    query = Query(9, "t", 1.0, 50.0)
    assert IconqRouter(FakeModel(answers, running)).route(query, clusters, 1.0).cluster_id == "calm"
    old = IconqRouter(FakeModel(answers, running), tie_break="latency").route(query, clusters, 1.0)
    assert old.cluster_id == "busy"  # the rule before: least added latency


def test_load_tie_break_counts_running_queries_per_size_unit():
    running = {"big": [Running(i, 0.0, 50.0, 3.0) for i in range(3)], "small": [Running(9, 0.0, 50.0, 3.0)]}
    answers = {"big": (1.0, [3.0] * 3), "small": (1.0, [3.0])}
    clusters = [cluster("small", 1, 0.0), cluster("big", 4, 0.0)]
    router = IconqRouter(FakeModel(answers, running), cost_tolerance=1e6)  # costs tie at any size
    assert router.route(Query(20, "t", 1.0, 50.0), clusters, 1.0).cluster_id == "big"  # 4/4 per unit < 2/1


def test_unknown_tie_break_is_refused():
    with pytest.raises(ValueError, match="tie_break"):
        IconqRouter(FakeModel({}), tie_break="random")


@pytest.mark.parametrize("tolerance", [0.0, 0.5, 3.0, 1e6])
def test_a_query_safe_anywhere_joins_the_running_cluster_not_the_paused_one(tolerance):
    """Waking a paused cluster costs a whole minimum window: no tolerance or tie break makes that a tie."""
    running = {"running": [Running(1, 0.0, 50.0, 30.0), Running(2, 0.0, 50.0, 30.0)]}
    answers = {"running": (3.0, [31.0, 31.0]), "paused": (2.0, [])}  # paused is faster and emptier
    timer = BillingTimer(minimum_s=60)
    timer.query_arrived(0.0)
    timer.query_finished(1.0)  # its window closed at 60 s: paused by 100 s
    clusters = [ClusterState("paused", 1, timer), cluster("running", 1, 0.0)]
    router = IconqRouter(FakeModel(answers, running), cost_tolerance=tolerance)
    decision = router.route(Query(9, "t", 100.0, 50.0), clusters, 100.0)
    assert decision.cluster_id == "running"
    assert decision.explanation["paused"]["wakes"] == 1 and decision.explanation["running"]["wakes"] == 0
    for tie_break in ("load", "latency"):
        again = IconqRouter(FakeModel(answers, running), cost_tolerance=tolerance, tie_break=tie_break)
        assert again.route(Query(10, "t", 100.0, 50.0), clusters, 100.0).cluster_id == "running"


def test_a_paused_cluster_is_woken_when_the_running_one_would_add_a_violation():
    running = {"running": [Running(1, 0.0, 10.0, 8.0)]}
    answers = {"running": (3.0, [12.0]), "paused": (2.0, [])}  # joining pushes the running query late
    timer = BillingTimer(minimum_s=60)
    clusters = [ClusterState("paused", 1, timer), cluster("running", 1, 0.0)]
    decision = IconqRouter(FakeModel(answers, running), cost_tolerance=3.0).route(Query(9, "t", 1.0, 10.0),
                                                                                  clusters, 1.0)
    assert decision.cluster_id == "paused"
