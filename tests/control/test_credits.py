from __future__ import annotations

import pytest

from sloctl.control.credits import (
    ClassShare,
    CreditController,
    DropPenaltyUtility,
    GoodputUtility,
    ThroughputUtility,
    WindowStats,
)

SERVICE_S = 1e-4  # one request holds a server core for 100 µs
DT_S = 1e-5


def simulate(ctrl: CreditController, rate_per_s, duration_s: float, klass: str = "x") -> None:
    """A fluid server under unbounded demand: completions per second = ``rate_per_s(in_flight)``.

    Every step the clients take every credit they can, then the server finishes
    its share of work and releases that many credits.
    """
    now, owed = 0.0, 0.0
    for _ in range(round(duration_s / DT_S)):
        while ctrl.try_acquire(klass, now):
            pass
        owed += rate_per_s(ctrl.in_flight) * DT_S
        while owed >= 1.0 and ctrl.in_flight > 0:
            ctrl.release(klass, now)
            owed -= 1.0
        now += DT_S


def knee(n: int) -> float:
    """Throughput grows with concurrency up to 50, then stays flat."""
    return min(n, 50) / SERVICE_S


def collapse(n: int) -> float:
    """Throughput peaks at 50 and falls past it (thrashing)."""
    return max(0.0, min(n, 50) - 0.2 * max(0, n - 50)) / SERVICE_S


def test_pool_grows_while_more_credits_bring_more_throughput():
    ctrl = CreditController(initial_credits=10, seed=1)
    simulate(ctrl, knee, 0.25)
    assert ctrl.credits >= 50
    pools = [p for _, p, _, _ in ctrl.history]
    assert pools[0] > 10 and max(pools) <= 80  # stops once the flat region is inside the dead-band


def test_pool_shrinks_when_throughput_falls_past_the_knee():
    ctrl = CreditController(initial_credits=150, seed=2)
    simulate(ctrl, collapse, 0.25)
    assert 40 <= ctrl.credits <= 70


def test_pool_holds_within_the_dead_band():
    ctrl = CreditController(initial_credits=64, seed=0)
    simulate(ctrl, lambda n: min(n, 5) / SERVICE_S, 0.05)  # 5 cores: the pool does not matter
    assert len(ctrl.history) >= 8
    assert all(p == 64 for _, p, _, _ in ctrl.history)
    assert all(abs(up - um) <= 0.02 * max(up, um) for _, _, up, um in ctrl.history)


def test_pool_is_clamped_to_its_bounds():
    high = CreditController(initial_credits=20, max_credits=30, seed=0)
    simulate(high, knee, 0.1)
    assert high.credits == 30 and max(p for _, p, _, _ in high.history) == 30
    low = CreditController(initial_credits=20, min_credits=5, seed=0)
    simulate(low, lambda n: 1e6 / max(n, 1), 0.1)  # fewer is always better
    assert low.credits == 5 and min(p for _, p, _, _ in low.history) == 5


def test_warmup_then_two_experiments_then_warmup_again():
    ctrl = CreditController(initial_credits=40, epsilon=0.1, warmup_s=0.001, experiment_s=0.002, seed=0)
    ctrl.tick(0.0)
    ctrl.tick(0.0009)
    assert ctrl.phase == "warmup" and ctrl.limit == 40
    ctrl.tick(0.001)
    first = ctrl.phase
    assert first in ("plus", "minus") and ctrl.limit == (44 if first == "plus" else 36)
    ctrl.tick(0.0029)
    assert ctrl.phase == first
    ctrl.tick(0.003)
    assert ctrl.phase == ("minus" if first == "plus" else "plus")
    ctrl.tick(0.0049)
    assert not ctrl.history
    ctrl.tick(0.005)
    assert ctrl.phase == "warmup" and len(ctrl.history) == 1 and ctrl.limit == ctrl.credits
    ctrl.tick(0.0059)
    assert ctrl.phase == "warmup"
    ctrl.tick(0.006)
    assert ctrl.phase != "warmup"


def test_experiment_order_is_random_but_seeded():
    def order(seed):
        ctrl = CreditController(seed=seed)
        phases = []
        for k in range(20):
            ctrl.tick(k * 0.005)
            ctrl.tick(k * 0.005 + 0.001)
            phases.append(ctrl.phase)
            ctrl.tick(k * 0.005 + 0.003)
        return phases

    assert order(7) == order(7)
    assert set(order(7)) == {"plus", "minus"}


def run_two_windows(ctrl: CreditController, plus_requests: int, minus_requests: int) -> None:
    """Feed instantaneous requests into the +δ and −δ windows of one cycle."""
    ctrl.tick(0.0)
    for start in (0.001, 0.003):
        ctrl.tick(start)
        n = plus_requests if ctrl.phase == "plus" else minus_requests
        for i in range(n):
            t = start + (i + 0.5) * 0.002 / n
            assert ctrl.try_acquire("x", t)
            ctrl.release("x", t)
    ctrl.tick(0.005)


@pytest.mark.parametrize("relabel_by, grows", [("received", True), ("admitted", True), ("none", False)])
def test_windows_are_relabelled_by_the_requests_actually_received(relabel_by, grows):
    # Clients held the extra credits of the +δ window but sent little: without relabelling
    # that window looks worse and the pool would wrongly shrink.
    ctrl = CreditController(initial_credits=20, relabel_by=relabel_by, seed=0)
    run_two_windows(ctrl, plus_requests=5, minus_requests=50)
    _, pool, u_plus, u_minus = ctrl.history[-1]
    if grows:
        assert (u_plus, u_minus) == (pytest.approx(50 / 0.002), pytest.approx(5 / 0.002))
        assert pool == 22
        assert ctrl.windows_[-1][0].received == 50
    else:
        assert pool == 18


def test_default_relabelling_uses_credits_actually_held():
    ctrl = CreditController(initial_credits=20, seed=0)
    ctrl.tick(0.0)
    for start in (0.001, 0.003):
        ctrl.tick(start)
        held = 2 if ctrl.phase == "plus" else 15  # the +δ window's clients sat on their credits
        for _ in range(held):
            assert ctrl.try_acquire("x", start)
        for _ in range(held):
            ctrl.release("x", start + 0.0019)
    ctrl.tick(0.005)
    plus, minus = ctrl.windows_[-1]
    assert plus.mean_in_flight > minus.mean_in_flight
    assert plus.completed == 15 and ctrl.credits == 22


def test_low_priority_is_refused_first_under_a_saturated_pool():
    classes = [ClassShare("low", priority=0), ClassShare("high", priority=1)]
    ctrl = CreditController(initial_credits=10, warmup_s=10.0, classes=classes)
    assert ctrl.threshold("high") == 1.0 and ctrl.threshold("low") == 0.5
    admitted_low = sum(ctrl.try_acquire("low", 0.0) for _ in range(20))
    assert admitted_low == 5  # low stops at half the pool
    admitted_high = sum(ctrl.try_acquire("high", 0.0) for _ in range(20))
    assert admitted_high == 5  # high takes the reserved half
    ctrl.release("high", 0.1)
    assert not ctrl.try_acquire("low", 0.1) and ctrl.try_acquire("high", 0.1)
    assert ctrl.in_flight_of("low") == 5 and ctrl.in_flight_of("high") == 5


def test_under_overload_low_classes_shed_before_high_ones():
    classes = [ClassShare("low", 0), ClassShare("mid", 1), ClassShare("high", 2, share=2.0)]
    ctrl = CreditController(initial_credits=40, warmup_s=10.0, classes=classes)
    assert [ctrl.threshold(c) for c in ("low", "mid", "high")] == pytest.approx([0.25, 0.5, 1.0])
    refused = {"low": 0, "mid": 0, "high": 0}
    held: list[str] = []
    for step in range(3000):
        now = step * 1e-5
        for klass in ("low", "mid", "high"):
            if ctrl.try_acquire(klass, now):
                held.append(klass)
            else:
                refused[klass] += 1
        ctrl.release(held.pop(0), now)  # the server finishes 1 per step < 3 arrivals: overload
    assert refused["low"] > refused["mid"] > refused["high"] == 0


def test_record_drop_frees_the_credit_and_counts_a_drop():
    ctrl = CreditController(initial_credits=4, warmup_s=0.0, experiment_s=1.0)
    ctrl.tick(0.0)
    assert ctrl.try_acquire("x", 0.0)
    ctrl.record_drop("x", 0.1)
    assert ctrl.in_flight == 0
    with pytest.raises(RuntimeError, match="no credit held"):
        ctrl.release("x", 0.2)


def test_utilities():
    stats = WindowStats(received=100, completed=80, good=60, dropped=20, duration_s=2.0)
    assert ThroughputUtility()(stats) == 40.0
    assert GoodputUtility()(stats) == 30.0
    assert DropPenaltyUtility(threshold=0.1, weight=10.0)(stats) == pytest.approx(40.0 - 10 * 40 * 0.1)
    assert DropPenaltyUtility()(WindowStats(100, 95, 95, 5, 1.0)) == 95.0  # under the threshold: free
    assert ThroughputUtility()(WindowStats(0, 0, 0, 0, 0.0)) == 0.0


@pytest.mark.parametrize("kwargs, field", [
    ({"epsilon": 1.5}, "epsilon"),
    ({"epsilon": 0.0}, "epsilon"),
    ({"initial_credits": 0}, "initial_credits"),
    ({"min_credits": 10, "max_credits": 5, "initial_credits": 7}, "min_credits"),
    ({"initial_credits": 5000}, "initial_credits"),
    ({"experiment_s": 0.0}, "experiment_s"),
    ({"warmup_s": -1.0}, "warmup_s"),
    ({"dead_band": 1.0}, "dead_band"),
    ({"relabel_by": "sent"}, "relabel_by"),
    ({"classes": [ClassShare("a", 0), ClassShare("a", 1)]}, "classes"),
])
def test_invalid_parameters_raise(kwargs, field):
    with pytest.raises(ValueError, match=f"The '{field}' parameter of CreditController"):
        CreditController(**kwargs)


def test_invalid_messages_name_field_rule_and_value():
    with pytest.raises(ValueError, match=r"^The 'epsilon' parameter of CreditController must be in \(0, 1\], "
                                         r"got 1\.5\.$"):
        CreditController(epsilon=1.5)
    with pytest.raises(ValueError, match="'share' parameter of ClassShare 'a'"):
        CreditController(classes=[ClassShare("a", 0, share=0.0)])
    with pytest.raises(ValueError, match="'threshold' parameter of DropPenaltyUtility"):
        DropPenaltyUtility(threshold=2.0)
    ctrl = CreditController(classes=[ClassShare("a", 0)])
    with pytest.raises(ValueError, match="'klass' argument"):
        ctrl.try_acquire("b", 0.0)
