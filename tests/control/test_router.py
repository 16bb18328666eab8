from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from sloctl.control.billing import BillingTimer
from sloctl.control.router import (
    ClusterState,
    IconqRouter,
    Query,
    RoundRobinRouter,
    ShadowRoundRobinRouter,
    StageCostRouter,
)
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
