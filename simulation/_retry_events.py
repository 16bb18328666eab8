"""The event loop behind :func:`sloctl.simulation.retry_sim.simulate_network`.

Kept apart from the public module because it is written for speed, not for
reading: state lives in flat lists indexed ``j * P + p`` (service j, class p),
random numbers come from pre-drawn blocks, and the hot paths are closures over
local variables. Semantics are documented in ``docs/retry.md`` (section
"Simulator", subsection "Semantics").

A *call* is a small list ``[j, p, rec, retries_left]``; a *request* record is
``[p, outstanding_calls, failed, arrival_s, attempts, batch]`` where ``batch``
is the measurement batch of the arrival, or -1 outside the measured cohort.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from heapq import heappop, heappush

import numpy as np

from sloctl.models.retry_network import NetworkSpec

_BLOCK = 1 << 14
_ARRIVAL, _DEPARTURE, _RETRY = 0, 1, 2


def _stream(draw: Callable[[int], np.ndarray]) -> Callable[[], float]:
    """A zero-argument sampler that hands out pre-drawn numbers one by one."""

    def gen() -> Iterator[float]:
        while True:
            yield from draw(_BLOCK).tolist()

    return gen().__next__


def _service_sampler(mean_s: float, cv: float, next_exp, next_uni) -> Callable[[], float]:
    """Service-time sampler with the given mean and coefficient of variation.

    cv = 1: exponential; cv = 0: deterministic; cv > 1: two-phase
    hyperexponential with balanced means (each phase carries half the mean);
    0 < cv < 1: a constant plus an exponential (shifted exponential).
    """
    if cv == 1.0:
        return lambda: mean_s * next_exp()
    if cv == 0.0:
        return lambda: mean_s
    if cv < 1.0:
        b = cv * mean_s
        a = mean_s - b
        return lambda: a + b * next_exp()
    c2 = cv * cv
    p1 = 0.5 * (1.0 + math.sqrt((c2 - 1.0) / (c2 + 1.0)))
    m1, m2 = mean_s / (2.0 * p1), mean_s / (2.0 * (1.0 - p1))  # phase means; p1*m1 = p2*m2 = mean/2
    return lambda: (m1 if next_uni() < p1 else m2) * next_exp()


@dataclass
class Counters:
    """Cumulative counts at one instant; differences of two give a window's counts."""

    offered: list[int]
    attempts: list[int]
    accepted: list[int]
    failed: list[int]
    busy_s: list[float]


class EventEngine:
    """The network's state and its event loop; advance it with :meth:`run_until`.

    Args:
        spec: the network.
        rng: the only source of randomness.
        retry_delay_s: mean (exponential) or value (fixed) of the delay before a retry.
        fixed_delay: whether the retry delay is fixed rather than exponential.
        warmup_s, end_s: requests arriving in [warmup_s, end_s) form the measured cohort.
        n_batches: number of equal arrival-time batches the cohort is split into.
    """

    def __init__(self, spec: NetworkSpec, rng: np.random.Generator, *, retry_delay_s: float, fixed_delay: bool,
                 warmup_s: float, end_s: float, n_batches: int):
        self.n_services = n = len(spec.services)
        self.n_classes = n_cls = len(spec.classes)
        next_exp = _stream(rng.standard_exponential)
        next_uni = _stream(rng.random)
        self._next_exp, self._next_uni = next_exp, next_uni
        self._retry_delay = (lambda: retry_delay_s) if fixed_delay else (lambda: retry_delay_s * next_exp())
        self._service = [_service_sampler(s.mean_service_s, s.service_cv, next_exp, next_uni) for s in spec.services]
        self._capacity = [int(s.buffer) for s in spec.services]
        self._retries = [spec.retry_vector(c).tolist() for c in spec.classes]  # [p][j]
        self._exclusive = spec.routing_mode == "exclusive"
        self._routes = [self._route_table(spec.routing_matrix(c)) for c in spec.classes]  # [p][j]

        streams = [(i, p, float(spec.external(c)[i])) for p, c in enumerate(spec.classes) for i in range(n)]
        streams = [s for s in streams if s[2] > 0]
        self._stream_targets = [(i, p) for i, p, _ in streams]
        self.total_rate_per_s = sum(r for _, _, r in streams)
        cum = np.cumsum([r for _, _, r in streams]) / self.total_rate_per_s if streams else np.zeros(0)
        self._stream_cum = cum.tolist()

        self.warmup_s, self.end_s, self.n_batches = warmup_s, end_s, n_batches
        self.now_s = 0.0
        self.events = 0
        self.heap: list = []
        self._seq = itertools.count().__next__
        self._present = [0] * n
        self._queues = [deque() for _ in range(n)]
        self._busy_s = [0.0] * n
        self._since_s = [0.0] * n
        size = n * n_cls
        self._offered, self._attempts = [0] * size, [0] * size
        self._accepted, self._failed = [0] * size, [0] * size
        # the measured cohort, per class: done and successful requests per batch, attempts, latencies
        self.open_requests = [0]
        self.done = [[0] * n_batches for _ in range(n_cls)]
        self.succeeded = [[0] * n_batches for _ in range(n_cls)]
        self.cohort_attempts = [0] * n_cls
        self.latencies_s: list[list[float]] = [[] for _ in range(n_cls)]
        if streams:
            heappush(self.heap, (next_exp() / self.total_rate_per_s, self._seq(), _ARRIVAL, None))

    def _route_table(self, F: np.ndarray) -> list:
        """Per source service: ``[(j, floor, frac)]`` (independent) or ``(cum_probs, targets)`` (exclusive)."""
        table = []
        for row in F:
            targets = [int(j) for j in np.flatnonzero(row > 0)]
            if self._exclusive:
                table.append((np.cumsum(row[targets]).tolist(), targets))
            else:
                table.append([(j, int(math.floor(row[j])), float(row[j] - math.floor(row[j]))) for j in targets])
        return table

    def counters(self) -> Counters:
        """Cumulative counts now, with the service time in progress counted up to now."""
        busy = [b + (self.now_s - s if k else 0.0) for b, s, k in zip(self._busy_s, self._since_s, self._present,
                                                                       strict=True)]
        return Counters(list(self._offered), list(self._attempts), list(self._accepted), list(self._failed), busy)

    def run_until(self, t_stop: float) -> None:
        """Process every event at or before ``t_stop`` and leave the clock at ``t_stop``."""
        heap, seq = self.heap, self._seq
        next_exp, next_uni, retry_delay = self._next_exp, self._next_uni, self._retry_delay
        service, capacity, retries, routes = self._service, self._capacity, self._retries, self._routes
        exclusive = self._exclusive
        present, queues, busy_s, since_s = self._present, self._queues, self._busy_s, self._since_s
        offered, attempts, accepted, failed = self._offered, self._attempts, self._accepted, self._failed
        n_cls = self.n_classes
        targets, cum, total_rate = self._stream_targets, self._stream_cum, self.total_rate_per_s
        n_streams = len(targets)
        warmup_s, end_s, n_batches = self.warmup_s, self.end_s, self.n_batches
        batch_per_s = n_batches / (end_s - warmup_s)
        open_requests, done, succeeded = self.open_requests, self.done, self.succeeded
        cohort_attempts, latencies_s = self.cohort_attempts, self.latencies_s

        def resolve(rec, t):
            # one call of the request is settled; the request ends with its last outstanding call
            rec[1] -= 1
            if rec[1] == 0 and rec[5] >= 0:
                p, b = rec[0], rec[5]
                open_requests[0] -= 1
                done[p][b] += 1
                cohort_attempts[p] += rec[4]
                if not rec[2]:
                    succeeded[p][b] += 1
                    latencies_s[p].append(t - rec[3])

        def attempt(call, t):
            j = call[0]
            idx = j * n_cls + call[1]
            attempts[idx] += 1
            rec = call[2]
            rec[4] += 1
            if present[j] < capacity[j]:
                accepted[idx] += 1
                present[j] += 1
                queues[j].append(call)
                if present[j] == 1:
                    since_s[j] = t
                    heappush(heap, (t + service[j](), seq(), _DEPARTURE, j))
            elif call[3] > 0:
                call[3] -= 1
                heappush(heap, (t + retry_delay(), seq(), _RETRY, call))
            else:
                failed[idx] += 1
                rec[2] = True
                resolve(rec, t)

        def issue(j, p, rec, t):
            rec[1] += 1
            offered[j * n_cls + p] += 1
            attempt([j, p, rec, retries[p][j]], t)

        events = 0
        while heap and heap[0][0] <= t_stop:
            t, _, kind, x = heappop(heap)
            events += 1
            if kind == _DEPARTURE:
                queue = queues[x]
                call = queue.popleft()
                present[x] -= 1
                busy_s[x] += t - since_s[x]
                if queue:
                    since_s[x] = t
                    heappush(heap, (t + service[x](), seq(), _DEPARTURE, x))
                p, rec = call[1], call[2]
                route = routes[p][x]
                if exclusive:
                    if route[1]:
                        k = bisect_right(route[0], next_uni())
                        if k < len(route[1]):
                            issue(route[1][k], p, rec, t)
                else:
                    for j, base, frac in route:
                        for _ in range(base + (1 if frac and next_uni() < frac else 0)):
                            issue(j, p, rec, t)
                resolve(rec, t)
            elif kind == _RETRY:
                attempt(x, t)
            else:
                heappush(heap, (t + next_exp() / total_rate, seq(), _ARRIVAL, None))
                s = 0 if n_streams == 1 else min(bisect_right(cum, next_uni()), n_streams - 1)
                i, p = targets[s]
                b = -1
                if warmup_s <= t < end_s:
                    b = min(int((t - warmup_s) * batch_per_s), n_batches - 1)
                    open_requests[0] += 1
                rec = [p, 0, False, t, 0, b]
                issue(i, p, rec, t)
        self.events += events
        self.now_s = t_stop
