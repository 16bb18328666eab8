"""The baselines Svalinn is compared with in :mod:`sloctl.simulation.server_sim`.

Every policy is an :class:`~sloctl.control.admission.AdmissionController` and
overrides the do-nothing defaults of :class:`~sloctl.control.admission.AdmitAll`
(itself the ``none`` baseline: unbounded queues). Svalinn is
:class:`~sloctl.control.admission.Svalinn`, the object the live middleware runs.

* ``single-queue`` — :class:`SingleQueueAdmission`, Breakwater-like: one credit
  pool for all requests, AIMD on the measured run-queue delay.
* ``seda`` — :class:`SedaAdmission`: a token bucket whose rate follows the p99
  of latency/SLO (SEDA's adaptive admission controller).
* ``protego`` — :class:`ProtegoAdmission`: Protego's credit pool (raised only
  while throughput rises and the credits are used) and a drop before a lock
  when the wait would not fit the request's remaining SLO; no view of memory.
"""

from __future__ import annotations

import numpy as np

from sloctl.control.admission import AdmissionRequest, AdmitAll

__all__ = ["ProtegoAdmission", "SedaAdmission", "SingleQueueAdmission"]


class SingleQueueAdmission(AdmitAll):
    """Breakwater-like: one credit pool, AIMD on run-queue delay, no view of memory or locks.

    Every ``tick`` the delay signal ``d`` is the longest run-queue wait seen
    since the last tick. Below ``target_delay_s`` the pool grows by
    ``additive`` credits; above it shrinks to ``W · max(1 − beta · (d − target) / d, 0.5)``.
    A request is admitted only while fewer than ``W`` are in flight.

    Args:
        target_delay_s: queueing-delay target (seconds), derived from the SLO by the caller.
        initial_credits: starting pool.
        additive: credits added per tick below target.
        beta: multiplicative-decrease strength.
    """

    def __init__(self, target_delay_s: float, initial_credits: float = 16.0, additive: float = 1.0,
                 beta: float = 0.4) -> None:
        self.target_delay_s = target_delay_s
        self.initial_credits = initial_credits
        self.additive = additive
        self.beta = beta
        self.credits_ = float(initial_credits)
        self.in_flight_ = 0
        self._max_wait_s = 0.0

    def on_arrival(self, req: AdmissionRequest, now_s: float) -> bool:
        if self.in_flight_ >= max(1.0, self.credits_):
            return False
        self.in_flight_ += 1
        req.ctx["credit"] = True
        return True

    def on_dequeue(self, req: AdmissionRequest, bottleneck: str, wait_s: float, now_s: float) -> None:
        if bottleneck == "cpu":
            self._max_wait_s = max(self._max_wait_s, wait_s)

    def _release(self, req: AdmissionRequest) -> None:
        if req.ctx.pop("credit", False):
            self.in_flight_ -= 1

    def on_complete(self, req: AdmissionRequest, now_s: float) -> None:
        self._release(req)

    def on_drop(self, req: AdmissionRequest, now_s: float, partial: bool) -> None:
        self._release(req)

    def tick(self, now_s: float) -> None:
        d, target = self._max_wait_s, self.target_delay_s
        if d <= target:
            self.credits_ += self.additive
        else:
            self.credits_ *= max(1.0 - self.beta * (d - target) / d, 0.5)
        self.credits_ = min(max(self.credits_, 1.0), 65536.0)
        self._max_wait_s = 0.0

    def gauges(self) -> dict[str, float]:
        return {"credits": self.credits_}


class SedaAdmission(AdmitAll):
    """SEDA's adaptive admission: a token bucket whose rate keeps p99 latency/SLO under ``target_ratio``.

    Every ``adjust_interval_s`` with at least ``min_samples`` completions: if
    the p99 of latency/SLO exceeds ``target_ratio`` the rate is multiplied by
    ``decrease``, else multiplied by ``1 + increase`` (capped at ``max_rate_per_s``).

    Args:
        initial_rate_per_s: starting token rate (requests/s).
        target_ratio: target for the p99 of latency / SLO.
        burst: bucket depth (tokens).
        adjust_interval_s: how often the rate moves (seconds).
        decrease, increase: multiplicative steps.
        min_samples: completions needed before a step.
        max_rate_per_s: rate ceiling.
    """

    def __init__(self, initial_rate_per_s: float, target_ratio: float = 0.9, burst: float = 16.0,
                 adjust_interval_s: float = 0.001, decrease: float = 0.8, increase: float = 0.05,
                 min_samples: int = 20, max_rate_per_s: float = 1e9) -> None:
        self.initial_rate_per_s = initial_rate_per_s
        self.target_ratio = target_ratio
        self.burst = burst
        self.adjust_interval_s = adjust_interval_s
        self.decrease = decrease
        self.increase = increase
        self.min_samples = min_samples
        self.max_rate_per_s = max_rate_per_s
        self.rate_per_s_ = float(initial_rate_per_s)
        self._tokens = float(burst)
        self._last_s = 0.0
        self._last_adjust_s = 0.0
        self._ratios: list[float] = []

    def on_arrival(self, req: AdmissionRequest, now_s: float) -> bool:
        self._tokens = min(self.burst, self._tokens + (now_s - self._last_s) * self.rate_per_s_)
        self._last_s = now_s
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def on_complete(self, req: AdmissionRequest, now_s: float) -> None:
        self._ratios.append((now_s - req.arrival_s) / req.rtype.slo_s)

    def tick(self, now_s: float) -> None:
        if now_s - self._last_adjust_s < self.adjust_interval_s or len(self._ratios) < self.min_samples:
            return
        p99 = float(np.quantile(self._ratios, 0.99))
        if p99 > self.target_ratio:
            self.rate_per_s_ *= self.decrease
        else:
            self.rate_per_s_ = min(self.rate_per_s_ * (1 + self.increase), self.max_rate_per_s)
        self._ratios.clear()
        self._last_adjust_s = now_s

    def gauges(self) -> dict[str, float]:
        return {"rate_per_s": self.rate_per_s_}


class ProtegoAdmission(AdmitAll):
    """Protego-like: a throughput-driven credit pool and lock AQM (drop before a lock whose expected wait
    exceeds the request's remaining SLO); memory bandwidth is not managed.

    Credits (as in Protego's published controller): every ``credit_interval_s`` compare this
    interval's completions ``Δout`` with the last interval's; the pool grows by ``step`` only if
    ``Δout`` rose, ``10 · Δout ≥ Δin`` and the credits were all in use at some point of the interval,
    otherwise it shrinks by ``step``. ``Δin`` counts the requests admitted in the interval (requests
    that entered the server): counting refused arrivals too would make ``10 · Δout ≥ Δin`` false at
    any overload above 10 × what the pool lets through, and a pool that once shrank could never grow
    back (measured: the pool collapsed to 1 credit at 2 × and 4 × load). A request is admitted while
    fewer than the pool are in flight. ``credits=False`` leaves only the lock AQM.

    Lock AQM: the expected wait is ``(queue_len + 1) · h`` (the waiters plus the holder's section),
    ``h`` an EWMA of lock hold times; the budget is what is left of the SLO after the time already
    spent and the request's own lock section.

    Args:
        ewma: weight of the newest hold sample.
        credits: run the credit pool.
        initial_credits, min_credits, max_credits: the pool (requests in flight).
        step: credits added or removed per interval (Protego: ``max(1, sessions × 0.001)``).
        credit_interval_s: the pool's cadence (Protego: 200–400 µs).
    """

    def __init__(self, ewma: float = 0.2, credits: bool = True, initial_credits: float = 16.0,
                 min_credits: float = 1.0, max_credits: float = 65536.0, step: float = 1.0,
                 credit_interval_s: float = 0.0003) -> None:
        self.ewma = ewma
        self.credits = credits
        self.initial_credits = initial_credits
        self.min_credits = min_credits
        self.max_credits = max_credits
        self.step = step
        self.credit_interval_s = credit_interval_s
        self.hold_s_: dict[str, float] = {}
        self.credits_ = float(initial_credits)
        self.in_flight_ = 0
        self._in = self._out = 0
        self._last_out: int | None = None
        self._saturated = False
        self._last_adjust_s = 0.0

    def on_arrival(self, req: AdmissionRequest, now_s: float) -> bool:
        if not self.credits:
            return True
        if self.in_flight_ >= max(1.0, self.credits_):
            self._saturated = True
            return False
        self._in += 1
        self.in_flight_ += 1
        self._saturated |= self.in_flight_ >= self.credits_
        req.ctx["credit"] = True
        return True

    def _release(self, req: AdmissionRequest) -> None:
        if req.ctx.pop("credit", False):
            self.in_flight_ -= 1

    def on_complete(self, req: AdmissionRequest, now_s: float) -> None:
        self._out += 1
        self._release(req)

    def on_drop(self, req: AdmissionRequest, now_s: float, partial: bool) -> None:
        self._release(req)

    def tick(self, now_s: float) -> None:
        if not self.credits or now_s - self._last_adjust_s < self.credit_interval_s * (1 - 1e-9):
            return
        rose = self._last_out is not None and self._out > self._last_out
        if rose and 10 * self._out >= self._in and self._saturated:
            self.credits_ += self.step
        else:
            self.credits_ -= self.step
        self.credits_ = min(max(self.credits_, self.min_credits), self.max_credits)
        self._last_out, self._in, self._out, self._saturated = self._out, 0, 0, False
        self._last_adjust_s = now_s

    def on_enqueue(self, req: AdmissionRequest, bottleneck: str, queue_len: int, now_s: float) -> bool:
        if bottleneck == "cpu":
            return True
        hold_s = self.hold_s_.get(bottleneck, req.rtype.lock_s)
        budget_s = req.rtype.slo_s - (now_s - req.arrival_s) - req.rtype.lock_s
        return (queue_len + 1) * hold_s <= budget_s

    def on_dequeue(self, req: AdmissionRequest, bottleneck: str, wait_s: float, now_s: float) -> None:
        if bottleneck != "cpu":
            old = self.hold_s_.get(bottleneck, req.rtype.lock_s)
            self.hold_s_[bottleneck] = self.ewma * req.rtype.lock_s + (1 - self.ewma) * old

    def gauges(self) -> dict[str, float]:
        return {"credits": self.credits_} if self.credits else {}
