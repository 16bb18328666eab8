from __future__ import annotations

import pytest

from sloctl.control.aqm import BottleneckAQM, DelayBudget


def test_budget_starts_at_slo_minus_expected_service():
    budget = DelayBudget(slo_s=0.010, expected_service_s=0.004)
    assert budget.remaining_s == pytest.approx(0.006)
    assert not budget.exhausted
    assert budget.deduct(0.006) == pytest.approx(0.0)
    assert budget.exhausted and budget.spent_s == pytest.approx(0.006)


def test_a_request_pays_every_bottleneck_and_is_dropped_at_the_third():
    locks = BottleneckAQM("lock", servers=1)
    disk = BottleneckAQM("disk", servers=2)
    membw = BottleneckAQM("membw", servers=4)
    locks.observe_hold(0.001)
    disk.observe_hold(0.002)
    membw.observe_hold(0.004)
    for aqm in (locks, disk, membw):
        for _ in range(3):
            aqm.joined()  # three items already queued at each
    cleaned = []
    budget = DelayBudget(slo_s=0.020, expected_service_s=0.004, cleanup=lambda: cleaned.append("buffer"))

    # lock: expects 3 × 1 ms / 1 = 3 ms ≤ 16 ms; waits 3.5 ms in fact
    assert locks.expected_wait_s() == pytest.approx(0.003)
    assert not locks.should_drop(budget)
    locks.joined()
    locks.left(0.0035, budget)
    assert budget.remaining_s == pytest.approx(0.0125)

    # disk: 3 × 2 ms / 2 = 3 ms ≤ 12.5 ms; waits 4.5 ms
    assert not disk.should_drop(budget)
    disk.joined()
    disk.left(0.0045, budget)
    assert budget.remaining_s == pytest.approx(0.008)

    # membw: 3 × 4 ms / 4 = 3 ms would fit, but the queue has grown to 9: 9 ms > 8 ms
    for _ in range(6):
        membw.joined()
    assert membw.expected_wait_s() == pytest.approx(0.009)
    assert membw.should_drop(budget)
    assert budget.dropped and cleaned == ["buffer"]
    assert (locks.drops, disk.drops, membw.drops) == (0, 0, 1)
    assert (locks.admitted, disk.admitted, membw.admitted) == (4, 4, 9)
    assert budget.spent_s == pytest.approx(0.008)


def test_expected_wait_uses_the_ewma_of_hold_times():
    aqm = BottleneckAQM("x", servers=2, ewma=0.25)
    assert aqm.expected_wait_s(10) == 0.0  # nothing observed yet, no initial guess
    aqm.observe_hold(0.004)  # the first sample replaces the guess
    aqm.observe_hold(0.008)
    assert aqm.mean_hold_s == pytest.approx(0.25 * 0.008 + 0.75 * 0.004)
    assert aqm.expected_wait_s(4) == pytest.approx(4 * 0.005 / 2)


def test_an_idle_bottleneck_admits_a_request_with_zero_budget_but_not_an_overdue_one():
    aqm = BottleneckAQM("x", initial_hold_s=0.001)
    exact = DelayBudget(slo_s=0.002, expected_service_s=0.002)
    assert exact.remaining_s == 0.0 and not aqm.should_drop(exact)
    late = DelayBudget(slo_s=0.002)
    late.deduct(0.003)
    assert late.remaining_s < 0 and aqm.should_drop(late)


def test_cleanup_runs_exactly_once():
    calls = []
    budget = DelayBudget(slo_s=0.001, cleanup=lambda: calls.append("first"))
    budget.on_drop(lambda: calls.append("second"))
    full = BottleneckAQM("a", initial_hold_s=1.0)
    full.joined()
    other = BottleneckAQM("b", initial_hold_s=1.0)
    other.joined()
    assert full.should_drop(budget)
    assert full.should_drop(budget)  # asked again: still refused, not counted, no second cleanup
    assert other.should_drop(budget)
    assert not budget.drop()
    assert calls == ["first", "second"]
    assert full.drops == 1 and other.drops == 0
    budget.on_drop(lambda: calls.append("late"))  # registered after the drop: runs at once, once
    assert calls == ["first", "second", "late"]


def test_left_with_an_empty_queue_is_an_error():
    with pytest.raises(RuntimeError, match="empty queue"):
        BottleneckAQM("x").left(0.0)


@pytest.mark.parametrize("slo_s, service_s, field", [
    (0.0, 0.0, "slo_s"),
    (-1.0, 0.0, "slo_s"),
    (0.001, 0.002, "slo_s"),  # the budget would start negative
    (0.001, -0.001, "expected_service_s"),
    (float("nan"), 0.0, "slo_s"),
])
def test_negative_or_empty_budgets_are_refused(slo_s, service_s, field):
    with pytest.raises(ValueError, match=f"The '{field}' parameter of DelayBudget"):
        DelayBudget(slo_s, service_s)


def test_invalid_waits_and_parameters_raise():
    with pytest.raises(ValueError, match="'wait_s' parameter"):
        DelayBudget(1.0).deduct(-0.1)
    with pytest.raises(ValueError, match="'servers' parameter of BottleneckAQM"):
        BottleneckAQM("x", servers=0)
    with pytest.raises(ValueError, match="'ewma' parameter of BottleneckAQM"):
        BottleneckAQM("x", ewma=0.0)
    with pytest.raises(ValueError, match="'hold_s' parameter"):
        BottleneckAQM("x").observe_hold(-1.0)
    with pytest.raises(ValueError, match=r"^The 'slo_s' parameter of DelayBudget must be >= expected_service_s"):
        DelayBudget(0.001, 0.002)


def test_behind_a_busy_lock_the_holder_counts_when_in_service_is_tracked():
    naive = BottleneckAQM("lock", servers=1, initial_hold_s=10e-6)
    aqm = BottleneckAQM("lock", servers=1, initial_hold_s=10e-6, count_in_service=True)
    for a in (naive, aqm):
        a.joined()
        a.left(0.0)  # the first request holds the lock, nobody waits
    assert naive.expected_wait_s() == 0.0  # misses the holder's remaining time
    assert aqm.expected_wait_s() == pytest.approx(10e-6)
    assert aqm.should_drop(DelayBudget(slo_s=20e-6, expected_service_s=12e-6))  # 8 us left < one hold
    aqm.released()
    assert aqm.expected_wait_s() == 0.0 and aqm.in_service == 0
    with pytest.raises(RuntimeError, match="released"):
        aqm.released()


def test_a_residual_aqm_counts_what_is_left_of_the_holders_section():
    aqm = BottleneckAQM("lock", servers=1, initial_hold_s=10e-6, count_in_service=True, residual=True)
    aqm.joined()
    aqm.left(0.0, now_s=1.0)  # got the lock at t = 1 s
    assert aqm.expected_wait_s(now_s=1.0 + 7e-6) == pytest.approx(3e-6)  # 3 us of its 10 us section left
    assert aqm.expected_wait_s(now_s=1.0 + 15e-6) == 0.0  # overdue: never negative
    assert aqm.expected_wait_s() == pytest.approx(10e-6)  # no clock given: a whole section, as before
    # 4 us of allowance: enough behind 3 us left, not behind a whole section
    assert not aqm.should_drop(DelayBudget(slo_s=16e-6, expected_service_s=12e-6), now_s=1.0 + 7e-6)
    whole = BottleneckAQM("lock", servers=1, initial_hold_s=10e-6, count_in_service=True)
    whole.joined()
    whole.left(0.0, now_s=1.0)
    assert whole.should_drop(DelayBudget(slo_s=16e-6, expected_service_s=12e-6), now_s=1.0 + 7e-6)
    aqm.joined()  # a second request queues behind the holder: its whole section counts too
    assert aqm.expected_wait_s(now_s=1.0 + 7e-6) == pytest.approx(13e-6)
    aqm.released()  # the holder let go; the queued one takes the lock at 1.00001 s
    aqm.left(3e-6, now_s=1.0 + 10e-6)
    assert aqm.expected_wait_s(now_s=1.0 + 12e-6) == pytest.approx(8e-6)
