"""A seeded discrete-event simulator of a service network with per-class retry limits.

It runs the network a :class:`~sloctl.models.retry_network.NetworkSpec`
describes, with the semantics the analysis (:mod:`sloctl.models.retry`,
DiffTry's network flow model, §VI) assumes, so that the two can be compared
number for number:

* each service is one FIFO server of rate mu with room for ``buffer`` attempts
  (the one in service included); an attempt that finds it full is rejected;
* a rejected call of class p to service j is retried after a random (or fixed)
  delay, up to k_p(j) times; a call that runs out of attempts fails, and so
  does its request, end to end (no retries further up);
* a success at service i issues downstream calls drawn from the routing
  weights F_p (``independent`` or ``exclusive``); siblings are never
  cancelled, so the branches of a failed request still load the network;
* a request succeeds when every call in its tree succeeded.

Semantics, measurement (after a warm-up) and the JSON shape are documented in
``docs/retry.md`` (section "Simulator"); the event loop lives in :mod:`._retry_events`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from sloctl.models.retry_network import NetworkSpec
from sloctl.simulation._retry_events import Counters, EventEngine

__all__ = ["ClassResult", "RetrySimulation", "ServiceClassResult", "simulate_network"]

RetryDelay = Literal["exponential", "fixed"]
N_BATCHES = 20
# Student t 0.975 quantiles by degrees of freedom (batches - 1), for 10..20 non-empty batches
_T_975 = {9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
          18: 2.101, 19: 2.093}
_PROGRESS_CHUNKS = 50


@dataclass(frozen=True)
class ClassResult:
    """End-to-end outcome of one class's requests that arrived in the measurement window.

    ``end_to_end_rejection_ci`` is a 95% batch-means interval (see the docs);
    latencies are of successful requests only; ``calls_per_request`` counts
    every attempt (originals and retries, at every hop) per request.
    """

    completion_probability: float
    end_to_end_rejection: float
    end_to_end_rejection_ci: tuple[float, float]
    success_per_s: float
    requests: int
    latency_s: dict[str, float]
    calls_per_request: float
    calls_per_success: float


@dataclass(frozen=True)
class ServiceClassResult:
    """One class at one service, over the measurement window.

    ``offered_per_s`` counts original calls (first attempts), ``attempts_per_s``
    originals and retries, ``accepted_per_s`` the attempts that found room;
    ``attempt_rejection`` is rejected / all attempts and ``final_rejection``
    failed / original calls.
    """

    offered_per_s: float
    attempts_per_s: float
    accepted_per_s: float
    attempt_rejection: float
    final_rejection: float


@dataclass(frozen=True)
class RetrySimulation:
    """The result of :func:`simulate_network`; ``to_json()`` gives the documented plain form."""

    seed: int
    duration_s: float
    warmup_s: float
    retry_delay: RetryDelay
    retry_delay_s: float
    classes: dict[str, ClassResult]
    services: dict[str, dict[str, ServiceClassResult]]
    utilisation: dict[str, float]
    events: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping; NaN (no data, e.g. a class without arrivals) becomes ``None``."""
        return {
            "seed": self.seed,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "retry_delay": self.retry_delay,
            "retry_delay_s": self.retry_delay_s,
            "classes": {c: {"completion_probability": _num(r.completion_probability),
                            "end_to_end_rejection": _num(r.end_to_end_rejection),
                            "end_to_end_rejection_ci": [_num(v) for v in r.end_to_end_rejection_ci],
                            "success_per_s": _num(r.success_per_s),
                            "requests": r.requests,
                            "latency_s": {k: _num(v) for k, v in r.latency_s.items()},
                            "calls_per_request": _num(r.calls_per_request),
                            "calls_per_success": _num(r.calls_per_success)}
                        for c, r in self.classes.items()},
            "services": {s: {c: {"offered_per_s": _num(r.offered_per_s), "attempts_per_s": _num(r.attempts_per_s),
                                 "accepted_per_s": _num(r.accepted_per_s),
                                 "attempt_rejection": _num(r.attempt_rejection),
                                 "final_rejection": _num(r.final_rejection)}
                             for c, r in row.items()}
                         for s, row in self.services.items()},
            "utilisation": {s: _num(u) for s, u in self.utilisation.items()},
            "events": self.events,
        }


def simulate_network(spec: NetworkSpec, *, seed: int = 0, duration_s: float = 600.0, warmup_s: float | None = None,
                     retry_delay: RetryDelay = "exponential", retry_delay_s: float | None = None,
                     max_events: int = 20_000_000,
                     progress: Callable[[float, float, int], None] | None = None) -> RetrySimulation:
    """Simulate ``spec`` for ``duration_s`` seconds and measure it after a warm-up.

    Requests that arrive in ``[warmup_s, duration_s)`` are followed until they
    resolve (the run goes on past ``duration_s`` with arrivals continuing until
    they have); per-service rates count events inside the window.

    Args:
        spec: the network (see :mod:`sloctl.models.retry_network`).
        seed: seed of the numpy Generator; the same seed gives the same result.
        duration_s: simulated seconds, warm-up included.
        warmup_s: seconds discarded at the start; default ``max(0.1 * duration_s,
            5 * retry_delay_s)``.
        retry_delay: ``"exponential"`` (mean ``retry_delay_s``) or ``"fixed"``.
        retry_delay_s: the retry delay; default ``spec.effective_retry_delay_s``.
        max_events: the most events a run may process; a run whose rough
            expected count exceeds it is refused before it starts.
        progress: called as ``progress(now_s, duration_s, events)`` about 50
            times during the run.

    Returns:
        The measured :class:`RetrySimulation`.

    Raises:
        ValueError: a parameter is out of range, or the run is too large for ``max_events``.
    """
    delay_s = spec.effective_retry_delay_s if retry_delay_s is None else retry_delay_s
    _validate(duration_s, retry_delay, delay_s, max_events, seed)
    if warmup_s is None:
        warm_s = max(0.1 * duration_s, 5.0 * delay_s)
        if warm_s >= duration_s:
            raise ValueError(f"The 'duration_s' parameter of simulate_network must exceed the default warm-up of 5 "
                             f"retry delays ({warm_s:g} s) when warmup_s is not given, got {duration_s!r}.")
    elif not (_is_number(warmup_s) and 0 <= warmup_s < duration_s):
        raise ValueError(f"The 'warmup_s' parameter of simulate_network must be in [0, duration_s={duration_s:g}), "
                         f"got {warmup_s!r}.")
    else:
        warm_s = float(warmup_s)
    expected = expected_events(spec, duration_s, delay_s)
    if expected > max_events:
        raise ValueError(f"The 'max_events' parameter of simulate_network must be >= the run's expected event count "
                         f"(about {expected:.3g} for duration_s={duration_s:g}), got {max_events}; shorten "
                         "duration_s or raise max_events.")

    engine = EventEngine(spec, np.random.default_rng(seed), retry_delay_s=delay_s,
                         fixed_delay=retry_delay == "fixed", warmup_s=warm_s, end_s=duration_s, n_batches=N_BATCHES)
    marks = {duration_s * (i + 1) / _PROGRESS_CHUNKS for i in range(_PROGRESS_CHUNKS - 1)}
    marks = sorted(marks | {warm_s, duration_s})
    start = end = None
    for t in marks:
        _advance(engine, t, max_events)
        if t == warm_s:
            start = engine.counters()
        if t == duration_s:
            end = engine.counters()
        if progress is not None:
            progress(t, duration_s, engine.events)
    # drain: keep the network running until every measured request has resolved
    step_s = max(delay_s, float(np.max(1.0 / spec.capacity)))
    while engine.open_requests[0] > 0:
        _advance(engine, engine.now_s + step_s, max_events)
    return _summarise(spec, engine, start, end, seed=int(seed), duration_s=duration_s, warmup_s=warm_s,
                      retry_delay=retry_delay, retry_delay_s=delay_s)


def expected_events(spec: NetworkSpec, duration_s: float, retry_delay_s: float) -> float:
    """A rough count of the events a run will process (used to refuse absurd runs).

    From the standard flow equations without rejection, lambda_p = gamma_p (I - F_p)^-1:
    each call has one attempt event, plus k retries on the share of calls a
    fluid model rejects, and each service completes at most min(load, mu) jobs per second.
    """
    mu = spec.capacity
    n = len(mu)
    lam = np.zeros((len(spec.classes), n))
    for p, klass in enumerate(spec.classes):
        lam[p] = spec.external(klass) @ np.linalg.inv(np.eye(n) - spec.routing_matrix(klass))
    load = lam.sum(axis=0)
    overflow = np.where(load > mu, 1.0 - mu / np.maximum(load, 1e-300), 0.0)
    retries = np.array([spec.retry_vector(c) for c in spec.classes], dtype=float)
    per_s = float((lam * (1.0 + retries * overflow)).sum() + np.minimum(load, mu).sum())
    return per_s * (duration_s + 10.0 * retry_delay_s)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _validate(duration_s, retry_delay, retry_delay_s, max_events, seed) -> None:
    if not (_is_number(duration_s) and duration_s > 0):
        raise ValueError(f"The 'duration_s' parameter of simulate_network must be > 0, got {duration_s!r}.")
    if retry_delay not in ("exponential", "fixed"):
        raise ValueError(f"The 'retry_delay' parameter of simulate_network must be 'exponential' or 'fixed', "
                         f"got {retry_delay!r}.")
    if not (_is_number(retry_delay_s) and retry_delay_s > 0):
        raise ValueError(f"The 'retry_delay_s' parameter of simulate_network must be > 0, got {retry_delay_s!r}.")
    if not (isinstance(max_events, int) and not isinstance(max_events, bool) and max_events > 0):
        raise ValueError(f"The 'max_events' parameter of simulate_network must be a whole number > 0, "
                         f"got {max_events!r}.")
    if not (isinstance(seed, int | np.integer) and not isinstance(seed, bool) and seed >= 0):
        raise ValueError(f"The 'seed' parameter of simulate_network must be a whole number >= 0, got {seed!r}.")


def _advance(engine: EventEngine, t_s: float, max_events: int) -> None:
    engine.run_until(t_s)
    if engine.events > max_events:
        raise ValueError(f"The 'max_events' parameter of simulate_network was reached ({max_events} events by "
                         f"t={engine.now_s:.4g} s) before the run finished; shorten duration_s or raise max_events.")


def _summarise(spec: NetworkSpec, engine: EventEngine, start: Counters, end: Counters, **meta) -> RetrySimulation:
    window_s = meta["duration_s"] - meta["warmup_s"]
    n_cls = len(spec.classes)
    classes = {}
    for p, klass in enumerate(spec.classes):
        done = np.array(engine.done[p], dtype=float)
        ok = np.array(engine.succeeded[p], dtype=float)
        requests, successes = int(done.sum()), int(ok.sum())
        completion = successes / requests if requests else math.nan
        lat = np.array(engine.latencies_s[p])
        pct = np.percentile(lat, [50, 90, 99]).tolist() if lat.size else [math.nan] * 3
        classes[klass] = ClassResult(
            completion_probability=completion,
            end_to_end_rejection=1.0 - completion,
            end_to_end_rejection_ci=_batch_means_ci(1.0 - ok / np.maximum(done, 1), done > 0, 1.0 - completion),
            success_per_s=successes / window_s,
            requests=requests,
            latency_s={"mean": float(lat.mean()) if lat.size else math.nan,
                       "p50": pct[0], "p90": pct[1], "p99": pct[2]},
            calls_per_request=engine.cohort_attempts[p] / requests if requests else math.nan,
            calls_per_success=engine.cohort_attempts[p] / successes if successes else math.nan,
        )
    services = {}
    for j, name in enumerate(spec.service_names):
        row = {}
        for p, klass in enumerate(spec.classes):
            i = j * n_cls + p
            offered = end.offered[i] - start.offered[i]
            attempts = end.attempts[i] - start.attempts[i]
            accepted = end.accepted[i] - start.accepted[i]
            failed = end.failed[i] - start.failed[i]
            row[klass] = ServiceClassResult(
                offered_per_s=offered / window_s, attempts_per_s=attempts / window_s,
                accepted_per_s=accepted / window_s,
                attempt_rejection=(attempts - accepted) / attempts if attempts else math.nan,
                final_rejection=failed / offered if offered else math.nan)
        services[name] = row
    utilisation = {name: (end.busy_s[j] - start.busy_s[j]) / window_s for j, name in enumerate(spec.service_names)}
    return RetrySimulation(classes=classes, services=services, utilisation=utilisation, events=engine.events, **meta)


def _batch_means_ci(values: np.ndarray, valid: np.ndarray, centre: float) -> tuple[float, float]:
    """95% interval around ``centre`` from the spread of per-batch values (Student t); needs >= 10 non-empty batches."""
    v = values[valid]
    if v.size < 10 or math.isnan(centre):
        return (math.nan, math.nan)
    half = _T_975[v.size - 1] * float(v.std(ddof=1)) / math.sqrt(v.size)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
