"""The gateway's SLO gate driven directly: no threads, no HTTP, no clock (control/slo_gate.py)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from sloctl.control.slo_gate import GateClass, SloGate, predicted_to_meet


@dataclass(eq=False)
class Q:
    name: str
    submitted_s: float


CLASSES = {"high": GateClass(priority=2, queue_limit=2, max_defer_s=5.0),
           "low": GateClass(priority=1, queue_limit=1, max_defer_s=5.0),
           "batch": GateClass(defer=False)}


def gate() -> SloGate:
    return SloGate(CLASSES, CLASSES.__getitem__)


def test_admit_force_defer_and_shed_when_the_class_queue_is_full():
    g = gate()
    assert g.on_arrival(Q("a", 0.0), "low", meets=True) == "admit"
    assert g.on_arrival(Q("b", 0.0), "batch", meets=False) == "force"     # a class that never waits
    assert g.on_arrival(Q("c", 0.0), "low", meets=False) == "defer"
    assert g.on_arrival(Q("d", 0.0), "low", meets=False) == "shed"        # queue_limit 1
    assert g.on_arrival(Q("e", 0.0), "high", meets=False) == "defer"
    assert g.waiting() == {"high": 1, "low": 1, "batch": 0}


def test_a_query_waiting_past_max_defer_is_expired_and_the_others_stay():
    g = gate()
    old, new = Q("old", 0.0), Q("new", 4.0)
    g.on_arrival(old, "high", meets=False)
    g.on_arrival(new, "high", meets=False)
    assert g.expire(5.0) == []                      # exactly max_defer_s: still waits
    assert g.expire(5.5) == [("high", old)] and g.waiting()["high"] == 1


def test_release_takes_higher_priority_first_and_looks_again_after_each_placement():
    g = gate()
    low, high1, high2 = Q("low", 0.0), Q("high1", 1.0), Q("high2", 2.0)
    g.on_arrival(low, "low", meets=False)
    g.on_arrival(high1, "high", meets=False)
    g.on_arrival(high2, "high", meets=False)
    room = {"left": 2}                               # two clusters free: each placement takes one
    placed = []

    def meets(q):
        return room["left"] > 0

    def place(klass, q):
        room["left"] -= 1
        placed.append(q.name)

    assert g.release(meets, place) == 2
    assert placed == ["high1", "high2"] and g.waiting() == {"high": 0, "low": 1, "batch": 0}
    assert g.released == {"high": 2, "low": 0, "batch": 0}


def test_release_shares_one_priority_by_releases_per_share():
    classes = {"a": GateClass(share=1.0), "b": GateClass(share=3.0)}
    g = SloGate(classes, classes.__getitem__)
    for i in range(4):
        g.on_arrival(Q(f"a{i}", float(i)), "a", meets=False)
        g.on_arrival(Q(f"b{i}", float(i)), "b", meets=False)
    placed = []
    g.release(lambda q: len(placed) < 4, lambda k, q: placed.append(q.name))
    assert placed == ["a0", "b0", "b1", "b2"]       # after a0, b's 1/3 per share stays below a's 1


def test_a_cancelled_query_leaves_its_queue_and_drain_empties_every_queue():
    g = gate()
    q1, q2 = Q("1", 0.0), Q("2", 0.0)
    g.on_arrival(q1, "high", meets=False)
    g.on_arrival(q2, "low", meets=False)
    assert g.remove(q1) and not g.remove(q1)
    assert list(g.drain()) == [("low", q2)] and not g.has_waiting()


def test_the_class_settings_are_read_at_each_decision():
    settings = {"c": GateClass(queue_limit=0)}
    g = SloGate(settings, lambda name: settings[name])
    assert g.on_arrival(Q("x", 0.0), "c", meets=False) == "shed"
    settings["c"] = GateClass(queue_limit=5)        # a policy swap
    assert g.on_arrival(Q("y", 0.0), "c", meets=False) == "defer"


class FakePredictor:
    """Counterfactual latency per cluster (Iconq+) and isolated latency per size (Stage)."""

    def __init__(self, query_s: dict[str, float], isolated: dict[int, float]) -> None:
        self.query_s, self.isolated = query_s, isolated

    def counterfactuals(self, template, arrival_s, clusters, now_s):
        return {cid: SimpleNamespace(query_s=self.query_s[cid]) for cid in clusters}

    def isolated_s(self, template, size):
        return self.isolated[size]


@pytest.mark.parametrize("kind, left_s, margin, expected", [
    ("iconq", 2.0, 0.0, True),      # the best cluster needs 1.5 s of 2 left
    ("iconq", 2.0, 0.3, False),     # with the router's margin only 1.4 s count
    ("stage", 0.9, 0.0, False),     # isolated 1.0 s on the larger cluster
    ("stage", 1.0, 0.9, True),      # Stage ignores the margin (it predicts latency alone)
])
def test_predicted_to_meet_uses_the_best_cluster(kind, left_s, margin, expected):
    model = FakePredictor({"c0": 3.0, "c1": 1.5}, {1: 2.0, 2: 1.0})
    assert predicted_to_meet(model, kind, "q1", left_s, {"c0": 1, "c1": 2}, 0.0, margin) is expected


def test_no_ready_cluster_is_never_predicted_to_meet():
    assert not predicted_to_meet(FakePredictor({}, {}), "iconq", "q1", 10.0, {}, 0.0)
