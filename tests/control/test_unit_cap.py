"""The cluster core's size units as a pool limit (``AutoscalerConfig.max_units``, issue 52 item 7).

A plan fitted to the cluster core never asks for more size units than the
core gives: the Spinup Size Selector only weighs sizes that fit, Queue@N
and scheduled spin-ups add nothing past the limit, and an execution-config
whose starting clusters exceed it is refused when it is read.
"""

from __future__ import annotations

import pytest

from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig, QueueScaler
from sloctl.control.managed import ClusterView, ManagedPool, ScalingAction
from sloctl.control.policies import ExecutionPlan, policy_from_doc
from sloctl.control.router import Query
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup, ScheduledSpinups

from .test_background_sizer import Backend, Eager, LeastLoaded, TableModel

ISOLATED = {("a", 1): 1.0, ("a", 2): 0.6, ("a", 4): 0.4}


def view(cid: str, size: int, running: int = 0) -> ClusterView:
    return ClusterView(cid, size, True, 0.0, None, running)


def test_fits_counts_size_units_and_clusters():
    cfg = AutoscalerConfig(candidate_sizes=(1, 2, 4), max_clusters=3, max_units=4)
    two = [view("c0", 2)]
    assert cfg.fits(two, 2) and not cfg.fits(two, 4)
    assert cfg.sizes_that_fit(two) == (1, 2)
    assert cfg.sizes_that_fit([view("c0", 2), view("c1", 1), view("c2", 1)]) == ()  # max_clusters, units too
    assert AutoscalerConfig(candidate_sizes=(1, 2, 4)).sizes_that_fit(two * 3) == (1, 2, 4)  # no unit limit


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_max_units_must_be_a_whole_number_of_units(bad):
    with pytest.raises(ValueError, match="'max_units' parameter of AutoscalerConfig must be an integer >= 1"):
        AutoscalerConfig(max_units=bad).validate()


def _pool(max_units):
    router = LeastLoaded(TableModel(ISOLATED))
    config = AutoscalerConfig(window_s=5.0, mu=8, candidate_sizes=(1, 2, 4), spinup_delay_s=1.0, max_clusters=4,
                              max_units=max_units)
    autoscaler = Autoscaler(config, Eager(3), router, LeastLoaded, mode="add", minimum_s=2.0, teardown=False)
    backend = Backend()
    pool = ManagedPool(router, autoscaler=autoscaler, minimum_s=2.0, backend=backend)
    pool.add_cluster("c0", 2)
    return pool, autoscaler, backend


def _arrive(pool, n):
    for i in range(n):
        query = Query(i, "a", 0.5 * i, 0.5)  # an SLO no queue meets: the selector wants the most capacity
        pool.scale(query, query.arrival_s)
        pool.route(query, query.arrival_s)


def test_the_size_selector_weighs_only_the_sizes_that_fit():
    pool, autoscaler, backend = _pool(None)
    _arrive(pool, 4)
    assert backend.started and backend.started[0][0] == 4  # unbounded, it adds the largest size
    _, outcome, _ = autoscaler.decisions[0]
    assert "4" in outcome.outcomes

    pool, autoscaler, backend = _pool(4)  # a size-2 cluster holds 2 of the core's 4 units
    _arrive(pool, 4)
    _, outcome, _ = autoscaler.decisions[0]
    assert "4" not in outcome.outcomes and "2" in outcome.outcomes
    assert all(size <= 2 for size, _ in backend.started)


def test_nothing_is_added_when_the_core_is_full():
    pool, autoscaler, backend = _pool(2)
    _arrive(pool, 6)
    assert backend.started == [] and all(action is None for _, _, action in autoscaler.decisions)


def test_queue_at_n_adds_no_cluster_past_the_units():
    scaler = QueueScaler(AutoscalerConfig(candidate_sizes=(2,), max_units=4), queue_n=1)
    busy = [view("c0", 2, running=2)]
    assert [a.kind for a in scaler.on_arrival(Query(0, "a", 1.0, 1.0), busy)] == ["spin_up"]
    full = [view("c0", 2, running=2), view("c1", 2, running=2)]
    assert scaler.on_arrival(Query(1, "a", 1.0, 1.0), full) == []


def test_scheduled_spinups_past_the_units_are_skipped_with_the_reason():
    wrapper = ScheduledSpinups([ScheduledSpinup(1.0, 2), ScheduledSpinup(2.0, 2), ScheduledSpinup(3.0, 1)],
                               max_clusters=8, max_units=4)
    pool = [view("c0", 2)]
    actions = wrapper.on_arrival(Query(0, "a", 5.0, 1.0), pool)
    assert [(a.kind, a.size) for a in actions] == [("spin_up", 2)]  # 2 + 2 = 4; the next two do not fit
    assert wrapper.skipped == [ScheduledSpinup(2.0, 2), ScheduledSpinup(3.0, 1)]
    assert wrapper.skipped_why == ["max_units", "max_units"]
    # a tear-down decided at the same step frees its units
    again = ScheduledSpinups([ScheduledSpinup(1.0, 2)], max_clusters=8, max_units=4)
    pending = [ScalingAction("tear_down", cluster_id="c1")]
    assert [a.size for a in again.due(5.0, [view("c0", 2), view("c1", 2)], pending=pending)] == [2]


def test_a_plan_past_its_units_is_refused_when_read():
    plan = ExecutionPlan(config=ExecutionConfig(start_sizes=(2, 2), autoscaler=AutoscalerConfig(max_units=4)))
    assert policy_from_doc(plan.to_doc()).config.autoscaler.max_units == 4  # round trip
    doc = plan.to_doc()
    doc["start_sizes"] = [4, 4]
    with pytest.raises(ValueError, match=r"'start_sizes' field .* at most autoscaler.max_units = 4"):
        policy_from_doc(doc)
    doc = plan.to_doc()
    doc["spinups"] = [{"time_s": 5.0, "size": 8, "mode": "add"}]
    with pytest.raises(ValueError, match=r"'spinups\[0\].size' field .* at most autoscaler.max_units = 4"):
        policy_from_doc(doc)
    doc = plan.to_doc()
    doc["autoscaler"]["max_units"] = 0
    with pytest.raises(ValueError, match="max_units"):
        policy_from_doc(doc)


def test_a_configuration_past_the_units_is_refused_naming_the_sizes():
    from sloctl.core.errors import ConfigError

    ExecutionConfig(start_sizes=(2, 2), spinups=(ScheduledSpinup(5.0, 4),)).check_fits(4)
    ExecutionConfig(start_sizes=(8, 8)).check_fits(None)  # no limit
    with pytest.raises(ConfigError, match=r"AutoSLO's plan starts clusters \[4, 4\]: 8 size units, more than the 4"):
        ExecutionConfig(start_sizes=(4, 4)).check_fits(4, "AutoSLO's plan")
    with pytest.raises(ConfigError, match=r"spin-ups of size \[8\]"):
        ExecutionConfig(start_sizes=(1,), spinups=(ScheduledSpinup(5.0, 8),)).check_fits(4)
