"""Spin-up Scheduler (AutoSLO §7.4): congestion epochs, candidate times, greedy acceptance."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from sloctl.control.router import Query
from sloctl.control.scheduler import (
    CongestionEpoch,
    ExecutionConfig,
    ScheduledSpinup,
    ScheduledSpinups,
    Timeline,
    candidate_times,
    find_congestion_epochs,
    find_good_spinup_times,
    schedule_spinups,
)


def timeline(*queries: tuple[float, float, bool]) -> Timeline:
    arrival = np.array([q[0] for q in queries], float)
    end = np.array([q[1] for q in queries], float)
    return Timeline(arrival, arrival.copy(), end, np.array([q[2] for q in queries], bool), np.zeros(1),
                    np.ones(1, int))


# W0 is delinquent on [10, 20), W1 on [12, 25), W2 never (its only query is fine)
W0 = timeline((0, 5, False), (10, 20, True))
W1 = timeline((12, 25, True))
W2 = timeline((0, 100, False))


def test_epoch_needs_k_workloads_delinquent_at_once():
    assert find_congestion_epochs([W0, W1, W2], tau_target=0.5, k=2) == [CongestionEpoch(12, 20, 2)]
    assert find_congestion_epochs([W0, W1, W2], tau_target=0.5, k=1) == [CongestionEpoch(10, 25, 2)]
    assert find_congestion_epochs([W0, W1, W2], tau_target=0.5, k=3) == []
    # default k is a majority of the workloads (2 of 3)
    assert find_congestion_epochs([W0, W1, W2], tau_target=0.5) == [CongestionEpoch(12, 20, 2)]


def test_delinquency_is_the_violating_share_of_running_queries():
    # two running queries, one violating: share 0.5 is delinquent only for tau_target < 0.5
    w = timeline((0, 10, True), (0, 10, False))
    assert find_congestion_epochs([w], tau_target=0.4, k=1) == [CongestionEpoch(0, 10, 1)]
    assert find_congestion_epochs([w], tau_target=0.5, k=1) == []


def test_zero_length_intervals_neither_open_nor_close_epochs():
    # W0's violator ends at 50 exactly when W1's starts: no instant with both, no gap for k=1
    a, b = timeline((40, 50, True)), timeline((50, 60, True))
    assert find_congestion_epochs([a, b], tau_target=0.5, k=2) == []
    assert find_congestion_epochs([a, b], tau_target=0.5, k=1) == [CongestionEpoch(40, 60, 1)]


def test_close_epochs_merge_when_the_gap_is_short():
    w = timeline((10, 20, True), (22, 30, True), (60, 70, True))
    assert len(find_congestion_epochs([w], tau_target=0.5, k=1)) == 3
    merged = find_congestion_epochs([w], tau_target=0.5, k=1, merge_gap_s=5.0)
    assert merged == [CongestionEpoch(10, 30, 1), CongestionEpoch(60, 70, 1)]


def test_candidate_times_are_delta_earlier_clipped_at_zero_and_spaced():
    epochs = [CongestionEpoch(3, 9, 1), CongestionEpoch(50, 52, 1), CongestionEpoch(55, 60, 1)]
    assert candidate_times(epochs, 10.0) == [0.0, 40.0, 45.0]
    assert candidate_times(epochs, 10.0, sigma_min_s=10.0) == [0.0, 40.0]
    assert candidate_times(epochs, 10.0, sigma_min_s=5.0, scheduled_s=[38.0]) == [0.0, 45.0]
    with pytest.raises(ValueError, match="'delta_s'"):
        candidate_times(epochs, -1.0)


# -- greedy outer loop with a fake evaluator ------------------------------------------------------------

# congestion at 100, 200, 300 on both training workloads -> with delta 10: candidates 90, 190, 290
CONGESTED = timeline((100, 110, True), (200, 210, True), (300, 310, True))


@dataclass
class Cell:
    vr: float
    cost: float
    timeline: Timeline


class FakeEvaluator:
    """Objective chosen by the test: ``objective(spinups, split) -> (vr, cost)``; records every trial."""

    def __init__(self, objective):
        self.objective = objective
        self.calls: list[list[ExecutionConfig]] = []

    def __call__(self, configs, workloads):
        self.calls.append(list(configs))
        return [[Cell(*self.objective(c.spinups, w), CONGESTED) for w in workloads] for c in configs]

    def tried(self) -> list[tuple[tuple[float, int], ...]]:
        """Schedules of every trial, as ``((time, size), ...)``."""
        return [tuple((s.time_s, s.size) for s in c.spinups) for call in self.calls for c in call if c.spinups]


def run(objective, **kw):
    evaluate = FakeEvaluator(objective)
    args = dict(evaluate=evaluate, train=["train", "train"], validation=["val"], sizes=(1, 2), tau_target=0.05,
                delta_s=10.0, eta=3, phi=3, sigma_min_s=50.0)
    args.update(kw)
    return schedule_spinups([ExecutionConfig()], **args), evaluate


def test_a_candidate_that_does_not_strictly_improve_is_rejected():
    result, evaluate = run(lambda spinups, split: (0.2, 10.0))
    assert result.best == ExecutionConfig() and result.finalists == [ExecutionConfig()]
    # one round: each of the 3 candidate times tried with both sizes, then the configuration is dropped
    assert evaluate.tried() == [((90, 1),), ((90, 2),), ((190, 1),), ((190, 2),), ((290, 1),), ((290, 2),)]


def test_an_improving_spinup_is_accepted_and_spacing_is_respected():
    def objective(spinups, split):
        return (0.05, 12.0) if ScheduledSpinup(190.0, 2) in spinups else (0.2, 10.0)

    result, evaluate = run(objective)
    assert result.best.spinups == (ScheduledSpinup(190.0, 2),)
    assert result.rounds[0]["accepted"] == {0: ScheduledSpinup(190.0, 2)}
    # round 2 only tries times at least sigma_min from 190: 90 and 290 are 100 away
    assert {tuple(t for t, _ in trial) for trial in evaluate.tried() if len(trial) == 2} == {(90.0, 190.0),
                                                                                          (190.0, 290.0)}
    # sigma_min 150: candidates 90 and 290 only (190 is too close to 90); after 290 is accepted
    # round 2 may only try 90, and stops when it does not help
    def late(spinups, split):
        return (0.05, 12.0) if any(s.time_s == 290.0 for s in spinups) else (0.2, 10.0)

    tight, evaluate = run(late, sigma_min_s=150.0)
    assert tight.best.spinups == (ScheduledSpinup(290.0, 1),) and len(tight.rounds) == 2
    assert {trial for trial in evaluate.tried() if len(trial) == 2} == {((90.0, 1), (290.0, 1)),
                                                                         ((90.0, 2), (290.0, 1))}
    assert all(t != 190.0 for trial in evaluate.tried() for t, _ in trial)


def test_at_most_eta_rounds_and_one_spinup_per_round():
    result, _ = run(lambda spinups, split: (0.5 - 0.1 * len(spinups), 10.0 + len(spinups)), eta=2)
    assert len(result.best.spinups) == 2 and len(result.rounds) == 2
    assert [len(c.spinups) for c in result.finalists] == [0, 1, 2]


def test_at_most_phi_attempts_per_round():
    def objective(spinups, split):
        return (0.0, 11.0) if any(s.time_s == 290.0 for s in spinups) else (0.2, 10.0)

    assert run(objective, phi=2)[0].best.spinups == ()
    assert run(objective, phi=3)[0].best.spinups[0].time_s == 290.0


def test_validation_picks_among_the_round_results():
    def objective(spinups, split):
        if split == "val":  # spin-ups only cost money on validation
            return 0.0, 10.0 + len(spinups)
        return 0.5 - 0.1 * len(spinups), 10.0

    result, _ = run(objective)
    assert len(result.finalists) == 4 and result.best == ExecutionConfig()
    assert result.best_validation == (0.0, 10.0)


def test_find_good_spinup_times_composes_scan_and_candidates():
    assert find_good_spinup_times([CONGESTED], tau_target=0.5, delta_s=150.0, sigma_min_s=60.0) == [0.0, 150.0]


def test_scheduled_spinups_fire_at_the_first_arrival_after_their_time_within_the_pool_limit():
    wrapper = ScheduledSpinups([ScheduledSpinup(5.0, 2), ScheduledSpinup(6.0, 1, "vertical")], max_clusters=2)
    assert wrapper.on_arrival(Query(0, "t", 4.0, 1.0), [object()]) == []
    actions = wrapper.on_arrival(Query(1, "t", 7.0, 1.0), [object()])
    assert [(a.kind, a.size) for a in actions] == [("spin_up", 2)]
    assert wrapper.skipped == [ScheduledSpinup(6.0, 1, "vertical")]
