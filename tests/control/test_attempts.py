"""The gateway's retry rule (control/attempts.py), driven without threads or HTTP."""

from __future__ import annotations

import pytest

from sloctl.control.attempts import AttemptOutcome, after_attempt


def _after(status: str, **overrides) -> AttemptOutcome:
    kwargs = dict(query_fault=False, elapsed_s=1.0, max_run_time_s=60.0, attempts=1, retry_limit=2, streamed=False,
                  may_retry=True)
    return after_attempt(status, **{**kwargs, **overrides})


def test_a_success_ends_the_query_and_a_fault_of_the_query_is_never_retried():
    assert _after("ok") == AttemptOutcome.DONE
    assert _after("error", query_fault=True) == AttemptOutcome.QUERY_FAULT
    assert _after("error") == AttemptOutcome.RETRY  # the cluster's fault: another may succeed


@pytest.mark.parametrize("limit, retried", [(0, 0), (1, 1), (3, 3)])
def test_a_class_retries_exactly_its_limit_then_gives_up(limit, retried):
    attempts, outcome = 1, _after("timeout", retry_limit=limit)
    while outcome == AttemptOutcome.RETRY:
        attempts += 1
        outcome = _after("timeout", attempts=attempts, retry_limit=limit)
    assert attempts - 1 == retried and outcome == AttemptOutcome.TIMED_OUT
    assert _after("error", attempts=limit + 1, retry_limit=limit) == AttemptOutcome.FAILED


def test_a_timeout_at_the_maximum_run_time_is_not_retried():
    assert _after("timeout", elapsed_s=59.995) == AttemptOutcome.RUN_TIME_EXCEEDED
    assert _after("timeout", elapsed_s=59.0) == AttemptOutcome.RETRY
    assert _after("error", elapsed_s=60.0) == AttemptOutcome.RETRY  # only a timeout means the run time is spent


def test_rows_already_sent_or_a_draining_gateway_stop_retries():
    assert _after("error", streamed=True) == AttemptOutcome.FAILED
    assert _after("timeout", may_retry=False) == AttemptOutcome.TIMED_OUT
