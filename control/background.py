"""The Spinup Size Selector off the arrival path: one sizing job at a time on a worker (AutoSLO §6, §8.8.2).

In AutoSLO the Autoscaler runs in a background thread: a query's routing
never waits for Algorithm 3, which simulates the recent window once per
candidate size and takes far longer than a routing decision (§8.8.2 measures
seconds). :class:`BackgroundSizer` is that worker for a live driver. The
autoscaler hands it a *sizing job* — a function of a snapshot taken at the
trigger (a forked predictor, copies of the billing timers and cluster states,
the arrival window) that touches nothing the routing path changes — and
returns to routing at once. The driver's next control step takes the
finished result with :meth:`BackgroundSizer.poll` and applies it.

* One job at a time: a submission while a job runs (or while its result has
  not been taken yet) is coalesced — dropped and counted in
  :attr:`BackgroundSizer.coalesced` — since a second simulation of nearly the
  same window would only arrive later with nearly the same answer.
* Errors are never swallowed: a job that raises yields a
  :class:`SizingResult` with the exception in ``error``; it is also kept in
  :attr:`BackgroundSizer.errors` and logged.
* Deterministic to test: the executor is injectable (anything with
  ``submit(fn) -> Future`` and ``shutdown``); by default a single-thread
  :class:`~concurrent.futures.ThreadPoolExecutor`, started at the first
  submission and stopped by :meth:`BackgroundSizer.close`.

Simulated drivers never use it: their size selection stays inside the
arrival step, so seeded results do not depend on thread timing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = ["BackgroundSizer", "SizingResult"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SizingResult:
    """A finished sizing job, as the control step takes it.

    Attributes:
        triggered_s: the driver's time when the trigger fired (``t_d``).
        value: what the job returned (a
            :class:`~sloctl.control.autoscaler.SizingOutcome`); ``None`` when it raised.
        error: the exception the job raised, else ``None``.
        decision_s: seconds the job ran on the worker.
        queue_delay_s: seconds from submission to the result being taken,
            less ``decision_s``: waiting for the worker plus waiting for the
            next control step.
    """

    triggered_s: float
    value: Any
    error: BaseException | None
    decision_s: float
    queue_delay_s: float


@dataclass
class _Job:
    triggered_s: float
    submitted_at: float
    future: Future


class BackgroundSizer:
    """Runs one sizing job at a time off the arrival path; the control step polls for the result.

    Args:
        executor: runs the jobs; ``None`` starts a one-thread
            :class:`~concurrent.futures.ThreadPoolExecutor` at the first
            submission. Tests pass a fake that runs jobs when told.
        clock: seconds, for ``decision_s`` and ``queue_delay_s`` (monotonic).

    Attributes:
        submitted: jobs started.
        coalesced: submissions dropped because a job was under way.
        errors: exceptions the jobs raised, oldest first.
    """

    def __init__(self, executor: Executor | None = None, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.executor = executor
        self.clock = clock
        self.submitted = 0
        self.coalesced = 0
        self.errors: list[BaseException] = []
        self._job: _Job | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        """A job was submitted and its result has not been taken yet."""
        return self._job is not None

    @property
    def done(self) -> bool:
        """The job finished; :meth:`poll` will return its result."""
        return self._job is not None and self._job.future.done()

    def submit(self, job: Callable[[], Any], *, triggered_s: float) -> bool:
        """Start ``job`` unless one is under way (running, or its result not taken yet); returns whether it started.

        Args:
            job: a function of a snapshot; it must not read state the routing
                path changes.
            triggered_s: the driver's time of the trigger, carried into the result.

        Raises:
            RuntimeError: the sizer was closed.
        """
        if self._closed:
            raise RuntimeError("The BackgroundSizer must be open to take a sizing job, got a closed one.")
        if self._job is not None:
            self.coalesced += 1
            return False
        if self.executor is None:
            self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sloctl-sizer")
        submitted_at = self.clock()
        self._job = _Job(triggered_s, submitted_at, self.executor.submit(self._timed, job))
        self.submitted += 1
        return True

    def _timed(self, job: Callable[[], Any]) -> tuple[Any, BaseException | None, float, float]:
        started = self.clock()
        try:
            value, error = job(), None
        except Exception as exc:  # handed to the control step, never lost
            value, error = None, exc
        return value, error, started, self.clock()

    def poll(self) -> SizingResult | None:
        """The finished job's result, once; ``None`` while it runs or when there is none."""
        job = self._job
        if job is None or not job.future.done():
            return None
        self._job = None
        if job.future.cancelled():  # close() stopped it before it ran
            return None
        try:
            value, error, started, ended = job.future.result()
        except Exception as exc:  # the executor itself failed
            value, error, started, ended = None, exc, job.submitted_at, job.submitted_at
        decision_s = ended - started
        queue_delay_s = max(0.0, self.clock() - job.submitted_at - decision_s)
        if error is not None:
            self.errors.append(error)
            _log.error("sizing job triggered at %.3f s failed: %s", job.triggered_s, error, exc_info=error)
        return SizingResult(job.triggered_s, value, error, decision_s, queue_delay_s)

    def close(self) -> SizingResult | None:
        """Stop the worker and return the result nobody took (``None`` if none).

        A running job is waited for (its error, if any, still lands in
        :attr:`errors`); a job the executor had not started is cancelled.
        """
        self._closed = True
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
        if self._job is not None and not self._job.future.done():  # a fake executor that never ran it
            self._job.future.cancel()
        return self.poll()

    def __enter__(self) -> BackgroundSizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
