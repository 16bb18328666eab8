from __future__ import annotations

import pytest

from sloctl.control.billing import BillingTimer, best_with_target


def test_a_short_query_is_billed_the_minimum_window():
    timer = BillingTimer(minimum_s=60)
    timer.query_arrived(10.0)
    timer.query_finished(15.0)
    assert timer.active_s(30.0) == pytest.approx(20.0)  # still inside the window
    assert timer.active_s(500.0) == pytest.approx(60.0)
    assert not timer.is_running


def test_a_long_query_is_billed_its_duration():
    timer = BillingTimer(minimum_s=60)
    timer.query_arrived(0.0)
    timer.query_finished(100.0)
    assert timer.active_s(1000.0) == pytest.approx(100.0)


def test_arrival_inside_the_window_extends_it_without_a_new_minimum():
    timer = BillingTimer(minimum_s=60)
    timer.query_arrived(0.0)
    timer.query_finished(5.0)
    timer.query_arrived(50.0)  # timer still running: same window
    timer.query_finished(80.0)
    assert timer.active_s(1000.0) == pytest.approx(80.0)


def test_idle_cluster_restarts_the_timer_with_a_new_minimum():
    timer = BillingTimer(minimum_s=60)
    timer.query_arrived(0.0)
    timer.query_finished(5.0)
    timer.query_arrived(200.0)  # paused at 60: a new window
    timer.query_finished(201.0)
    assert timer.active_s(1000.0) == pytest.approx(120.0)


def test_arrival_exactly_at_the_boundary_keeps_the_window_open():
    timer = BillingTimer(minimum_s=60)
    timer.query_arrived(0.0)
    timer.query_finished(1.0)
    timer.query_arrived(60.0)
    timer.query_finished(61.0)
    assert timer.active_s(1000.0) == pytest.approx(61.0)


def test_timer_keeps_running_while_queries_overlap():
    timer = BillingTimer(minimum_s=10)
    timer.query_arrived(0.0)
    timer.query_arrived(5.0)
    timer.query_finished(30.0)
    assert timer.is_running and timer.running_queries == 1
    timer.query_finished(40.0)
    assert timer.active_s(100.0) == pytest.approx(40.0)


def test_projections_for_routing():
    timer = BillingTimer(minimum_s=60)
    assert timer.projected_with_arrival(100.0, drain_s=110.0) == pytest.approx(60.0)  # opens a window
    timer.query_arrived(100.0)
    assert timer.projected_active_s(120.0, drain_s=300.0) == pytest.approx(200.0)
    assert timer.projected_with_arrival(120.0, drain_s=130.0) == pytest.approx(60.0)  # inside the window


def test_time_must_not_go_backwards_and_finish_needs_a_running_query():
    timer = BillingTimer()
    timer.query_arrived(10.0)
    with pytest.raises(ValueError, match="backwards"):
        timer.query_arrived(5.0)
    timer.query_finished(11.0)
    with pytest.raises(ValueError, match="no running query"):
        timer.query_finished(12.0)
    with pytest.raises(ValueError, match="'minimum_s'"):
        BillingTimer(minimum_s=-1)


def test_best_with_target_meets_target_first_then_cost():
    outcomes = [(0.30, 1.0), (0.04, 9.0), (0.05, 5.0), (0.02, 7.0)]
    assert best_with_target(outcomes, target=0.05) == 2  # both under 0.05 tie on 0, cheaper wins
    assert best_with_target(outcomes, target=0.0) == 3
    assert best_with_target([(0.5, 1.0), (0.5, 1.0)], target=0.1) == 0


def test_usage_splits_the_bill_into_busy_time_and_what_the_minimum_window_added():
    timer = BillingTimer(minimum_s=60)
    timer.query_arrived(0.0)
    timer.query_finished(10.0)  # a 10 s burst opens a 60 s window: 50 s billed idle
    timer.query_arrived(100.0)  # a second window
    timer.query_arrived(150.0)
    timer.query_finished(170.0)
    timer.query_finished(180.0)  # busy 100-180: past the minimum, nothing added
    usage = timer.usage(1000.0)
    assert usage == {"billed_s": 60.0 + 80.0, "busy_s": 10.0 + 80.0, "minimum_added_s": 50.0, "windows": 2.0}
    assert timer.usage(1000.0)["billed_s"] == timer.active_s(1000.0)
