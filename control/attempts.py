"""What follows the end of one attempt of a query: done, fail, or retry elsewhere.

The gateway's retry rule, as a function a simulator or a test can drive:

* an attempt that succeeded ends the query;
* an error that is the query's own fault (a syntax error, a cast, a memory
  limit) fails it: another cluster would fail it the same way;
* a timeout at the query's maximum run time fails it (Trino's
  ``query.max-run-time``): a retry could not finish within it either;
* otherwise the query is retried on another cluster while it has had at most
  ``retry_limit`` attempts beyond its first (DiffTry's per-class limit *k*: a
  lower class gives up sooner, which is what makes retry limits a rejection
  priority), unless rows of the failed attempt may already have reached the
  client (they cannot be taken back) or retries are closed (draining,
  shutdown);
* else it fails, as a timeout or an error.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["AttemptOutcome", "after_attempt"]

#: Slack on the run-time check: a timeout this close to the limit counts as reaching it.
RUN_TIME_SLACK_S = 1e-2


class AttemptOutcome(StrEnum):
    DONE = "done"
    QUERY_FAULT = "query-fault"
    RUN_TIME_EXCEEDED = "run-time-exceeded"
    RETRY = "retry"
    TIMED_OUT = "timed-out"
    FAILED = "failed"


def after_attempt(status: str, *, query_fault: bool, elapsed_s: float, max_run_time_s: float, attempts: int,
                  retry_limit: int, streamed: bool, may_retry: bool = True) -> AttemptOutcome:
    """The outcome of a query whose latest attempt ended with ``status`` (``ok``, ``timeout`` or ``error``).

    Args:
        query_fault: the error is the query's own (retrying elsewhere cannot help).
        elapsed_s: seconds since the query was submitted.
        max_run_time_s: the longest the query may run, all attempts together.
        attempts: attempts made so far, the one that ended included.
        retry_limit: retries the query's class allows (0: none).
        streamed: rows of the ended attempt may have reached the client.
        may_retry: retries are open (not draining, not shutting down).
    """
    if status == "ok":
        return AttemptOutcome.DONE
    if status == "error" and query_fault:
        return AttemptOutcome.QUERY_FAULT
    if status == "timeout" and elapsed_s >= max_run_time_s - RUN_TIME_SLACK_S:
        return AttemptOutcome.RUN_TIME_EXCEEDED
    if may_retry and not streamed and attempts <= retry_limit:
        return AttemptOutcome.RETRY
    return AttemptOutcome.TIMED_OUT if status == "timeout" else AttemptOutcome.FAILED
