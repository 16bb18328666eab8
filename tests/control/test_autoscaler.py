from __future__ import annotations

import pytest

from sloctl.control.autoscaler import (
    AutoscalerConfig,
    ObservationWindows,
    QueueTrigger,
    SpinupTrigger,
    find_best_spinup_size,
    should_tear_down,
)
from sloctl.control.billing import BillingTimer
from sloctl.control.router import ClusterState, Query, RouteDecision


@pytest.mark.parametrize("running, last_routed, spun_up, now, expected", [
    (0, 0.0, 0.0, 2000.0, True),      # idle long enough, old enough
    (1, 0.0, 0.0, 2000.0, False),     # a query still runs
    (0, 1800.0, 0.0, 2000.0, False),  # routed to 200 s ago < T_idle
    (0, 0.0, 900.0, 2000.0, False),   # alive 1100 s < T_min_lifetime
    (0, None, 0.0, 1300.0, True),     # never used: idle since spin-up
])
def test_teardown_respects_both_thresholds(running, last_routed, spun_up, now, expected):
    assert should_tear_down(running=running, last_routed_s=last_routed, spun_up_s=spun_up, now_s=now,
                            t_idle_s=300.0, t_min_lifetime_s=1200.0) is expected


def q(i: int, arrival: float, slo: float = 1.0) -> Query:
    return Query(i, "t", arrival, slo)


def test_spinup_trigger_needs_theta_queries_and_fires_once_per_cluster_set():
    trigger = SpinupTrigger(theta=4, tau_trigger=0.4)
    windows = ObservationWindows(100.0)
    assert not trigger.check(0.0, ["a"], [], windows)  # the cluster set is recorded at its first sight
    for i in range(3):
        windows.add_arrival(q(i, float(i)))
    running = [(q(i, float(i)), 5.0) for i in range(3)]  # projected to violate
    assert not trigger.check(3.0, ["a"], running, windows)  # 3 < θ
    windows.add_completion(q(3, 3.0), 10.0)  # observed violation
    assert trigger.check(10.0, ["a"], running, windows)
    assert not trigger.check(11.0, ["a"], running, windows)  # in flight
    assert not trigger.check(12.0, ["a", "b"], running, windows)  # set changed: only newer queries count
    assert trigger.check(20.0, ["a", "b"], [(q(9, 15.0), 5.0)] * 4, windows)


def test_observed_only_trigger_ignores_projections():
    windows = ObservationWindows(100.0)
    running = [(q(i, 0.0), 5.0) for i in range(5)]
    for observed_only, fires in ((True, False), (False, True)):
        trigger = SpinupTrigger(theta=2, tau_trigger=0.1, observed_only=observed_only)
        trigger.check(0.0, ["a"], [], windows)
        assert trigger.check(1.0, ["a"], running, windows) is fires


def test_queue_trigger_fires_at_n_outstanding():
    trigger = QueueTrigger(3)
    windows = ObservationWindows(10.0)
    assert not trigger.check(0.0, ["a"], [(q(0, 0.0), 1.0)] * 2, windows)
    assert trigger.check(0.0, ["a"], [(q(0, 0.0), 1.0)] * 3, windows)


class FakeModel:
    """Predicts a fixed latency per cluster size, scaled by the number of running queries."""

    def __init__(self, base_s: dict[int, float]):
        self.base_s = base_s
        self.running: dict[int, object] = {}
        self.on: dict[str, list] = {}

    def fork(self):
        twin = FakeModel(self.base_s)
        twin.running = dict(self.running)
        twin.on = {k: list(v) for k, v in self.on.items()}
        return twin

    def running_on(self, cid):
        return self.on.get(cid, [])


class Item:
    def __init__(self, query, predicted_s):
        self.query_id, self.template, self.arrival_s, self.slo_s = query.query_id, "t", query.arrival_s, query.slo_s
        self.predicted_s = predicted_s


class LeastLoadedRouter:
    def __init__(self, model):
        self.model = model

    def route(self, query, clusters, now_s):
        best = min(clusters, key=lambda c: (len(self.model.running_on(c.cluster_id)), -c.size))
        k = len(self.model.running_on(best.cluster_id)) + 1
        item = Item(query, self.model.base_s[best.size] * k)
        self.model.on.setdefault(best.cluster_id, []).append(item)
        self.model.running[query.query_id] = item
        return RouteDecision(best.cluster_id, item.predicted_s)

    def on_complete(self, query_id, now_s):
        item = self.model.running.pop(query_id)
        for items in self.model.on.values():
            if item in items:
                items.remove(item)


def sizing(base_s, slo, candidates=(1, 2)):
    router = LeastLoadedRouter(FakeModel(base_s))
    window = [q(i, 0.5 * i, slo) for i in range(10)]
    return find_best_spinup_size(now_s=5.0, window=window, window_s=5.0, router=router,
                                 clusters=[ClusterState("c0", 1, BillingTimer(1.0))], make_router=LeastLoadedRouter,
                                 candidates=candidates, delta_s=2.0, mu=10, tau_target=0.05, minimum_s=1.0)


def test_size_selector_does_nothing_when_no_candidate_strictly_improves():
    outcome = sizing({1: 0.1, 2: 0.05}, slo=10.0)  # nothing violates: adding only costs more
    assert outcome.size is None
    assert set(outcome.outcomes) == {"none", "1", "2"}
    assert outcome.outcomes["none"][0] == 0.0


def test_size_selector_adds_a_cluster_when_it_removes_violations():
    outcome = sizing({1: 0.9, 2: 0.2}, slo=0.5)  # one size-1 cluster cannot keep up
    assert outcome.size is not None
    assert outcome.outcomes[str(outcome.size)][0] < outcome.outcomes["none"][0]


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="'mu'"):
        AutoscalerConfig(mu=0).validate()
