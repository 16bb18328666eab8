"""Overload controllers for :mod:`sloctl.simulation.server_sim`: four baselines and Svalinn.

Every policy follows :class:`~sloctl.simulation.server_sim.AdmissionPolicy`;
:class:`AdmitAll` supplies the do-nothing defaults the others override.

* ``none`` — :class:`AdmitAll`: unbounded queues.
* ``single-queue`` — :class:`SingleQueuePolicy`, Breakwater-like: one credit
  pool for all requests, AIMD on the measured run-queue delay.
* ``seda`` — :class:`SedaPolicy`: a token bucket whose rate follows the p99
  of latency/SLO (SEDA's adaptive admission controller).
* ``protego`` — :class:`ProtegoPolicy`: drop before a lock when the wait
  would not fit the request's remaining SLO; everything else admitted.
* ``svalinn`` — :class:`SvalinnPolicy`: credits tuned by micro-experiments,
  per-bottleneck AQM with SLO delay budgets and an m_semaphore sized by an
  ε-greedy bandit (Svalinn §4), built on :mod:`sloctl.control`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

import numpy as np

from sloctl.simulation.server_sim import GateOutcome, Request

__all__ = ["AdmitAll", "ProtegoPolicy", "SedaPolicy", "SingleQueuePolicy", "SvalinnPolicy"]


class AdmitAll:
    """Admit everything, never gate memory: the ``none`` baseline and the base of the others."""

    def on_arrival(self, req: Request, now_s: float) -> bool:
        return True

    def on_enqueue(self, req: Request, bottleneck: str, queue_len: int, now_s: float) -> bool:
        return True

    def on_dequeue(self, req: Request, bottleneck: str, wait_s: float, now_s: float) -> None:
        pass

    def mem_gate(self, req: Request, now_s: float) -> GateOutcome:
        return "acquired"

    def mem_release(self, req: Request | None, now_s: float) -> list[Request]:
        return []

    def mem_expired(self, now_s: float) -> list[Request]:
        return []

    def on_complete(self, req: Request, now_s: float) -> None:
        pass

    def on_drop(self, req: Request, now_s: float, partial: bool) -> None:
        pass

    def tick(self, now_s: float) -> None:
        pass

    def observe_bandwidth(self, bytes_per_s: float, now_s: float) -> None:
        pass

    def gauges(self) -> dict[str, float]:
        return {}


class SingleQueuePolicy(AdmitAll):
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

    def on_arrival(self, req: Request, now_s: float) -> bool:
        if self.in_flight_ >= max(1.0, self.credits_):
            return False
        self.in_flight_ += 1
        req.ctx["credit"] = True
        return True

    def on_dequeue(self, req: Request, bottleneck: str, wait_s: float, now_s: float) -> None:
        if bottleneck == "cpu":
            self._max_wait_s = max(self._max_wait_s, wait_s)

    def _release(self, req: Request) -> None:
        if req.ctx.pop("credit", False):
            self.in_flight_ -= 1

    def on_complete(self, req: Request, now_s: float) -> None:
        self._release(req)

    def on_drop(self, req: Request, now_s: float, partial: bool) -> None:
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


class SedaPolicy(AdmitAll):
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

    def on_arrival(self, req: Request, now_s: float) -> bool:
        self._tokens = min(self.burst, self._tokens + (now_s - self._last_s) * self.rate_per_s_)
        self._last_s = now_s
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def on_complete(self, req: Request, now_s: float) -> None:
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


class ProtegoPolicy(AdmitAll):
    """Protego-like lock AQM: drop before a lock whose expected wait exceeds the request's remaining SLO.

    The expected wait is ``(queue_len + 1) · h`` (the waiters plus the
    holder's section), ``h`` an EWMA of lock hold times; the budget is what
    is left of the SLO after the time already spent and the request's own
    lock section. Other bottlenecks are not managed.

    Args:
        ewma: weight of the newest hold sample.
    """

    def __init__(self, ewma: float = 0.2) -> None:
        self.ewma = ewma
        self.hold_s_: dict[str, float] = {}

    def on_enqueue(self, req: Request, bottleneck: str, queue_len: int, now_s: float) -> bool:
        if bottleneck == "cpu":
            return True
        hold_s = self.hold_s_.get(bottleneck, req.rtype.lock_s)
        budget_s = req.rtype.slo_s - (now_s - req.arrival_s) - req.rtype.lock_s
        return (queue_len + 1) * hold_s <= budget_s

    def on_dequeue(self, req: Request, bottleneck: str, wait_s: float, now_s: float) -> None:
        if bottleneck != "cpu":
            old = self.hold_s_.get(bottleneck, req.rtype.lock_s)
            self.hold_s_[bottleneck] = self.ewma * req.rtype.lock_s + (1 - self.ewma) * old


class SvalinnPolicy(AdmitAll):
    """Svalinn (§4): credits for total throughput, AQM per bottleneck, a bandit-sized m_semaphore.

    * Arrival: take a credit (:class:`~sloctl.control.credits.CreditController`,
      shedding low-priority classes first) and a
      :class:`~sloctl.control.aqm.DelayBudget` of ``slo − expected service``.
    * Run queue and each lock: a :class:`~sloctl.control.aqm.BottleneckAQM`
      drops the request before it joins when the predicted wait exceeds its
      remaining budget; the wait actually spent is deducted on leaving.
    * Memory sections: :meth:`~sloctl.control.msemaphore.MSemaphore.wait_if_uncongested`;
      every ``tuner.interval_s`` the :class:`~sloctl.control.msemaphore.EpsilonGreedyTuner`
      is fed the mean bandwidth of the interval and picks the next capacity
      (or the capacity stays at ``static_capacity`` if given).

    Args:
        cores: the server's cores (servers of the run-queue AQM, largest arm).
        max_bandwidth_bytes_per_s: peak memory bandwidth (the tuner's full reward).
        expected_service_s: isolated service time per request type name (seconds).
        priorities: priority per class name (higher = more important); one
            class, or none given, disables shedding order.
        utility: the credit controller's utility (default throughput).
        static_capacity: fix the m_semaphore capacity and disable the tuner.
        credit_kwargs, tuner_kwargs: passed on to the controller and the tuner.
        shares: credit share per class name (default 1 each; see ``ClassShare``).
        seed: seeds the credit experiments and the tuner.
    """

    def __init__(self, cores: int, max_bandwidth_bytes_per_s: float, expected_service_s: Mapping[str, float],
                 priorities: Mapping[str, int] | None = None, utility=None, static_capacity: int | None = None,
                 credit_kwargs: Mapping | None = None, tuner_kwargs: Mapping | None = None, seed: int = 0,
                 shares: Mapping[str, float] | None = None) -> None:
        from sloctl.control.aqm import BottleneckAQM
        from sloctl.control.credits import ClassShare, CreditController
        from sloctl.control.msemaphore import EpsilonGreedyTuner, MSemaphore

        self.cores = cores
        self.max_bandwidth_bytes_per_s = max_bandwidth_bytes_per_s
        self.expected_service_s = dict(expected_service_s)
        self.priorities = dict(priorities or {})
        self.static_capacity = static_capacity
        shares = dict(shares or {})
        classes = ([ClassShare(n, p, shares.get(n, 1.0)) for n, p in self.priorities.items()]
                   if len(self.priorities) > 1 else [])
        self.credits_ = CreditController(utility=utility, classes=classes, seed=seed, **dict(credit_kwargs or {}))
        self.cpu_aqm_ = BottleneckAQM("cpu", servers=cores)
        self.lock_aqm_: dict[str, BottleneckAQM] = {}
        self._make_lock_aqm = lambda name: BottleneckAQM(name, servers=1)
        self.tuner_ = EpsilonGreedyTuner(cores, max_bandwidth_bytes_per_s, seed=seed,
                                         **{"initial_capacity": cores, **dict(tuner_kwargs or {})})
        start = static_capacity if static_capacity is not None else self.tuner_.select(0.0)
        self.msem_ = MSemaphore(start)
        self.mem_hold_s_ = 0.0
        self.capacity_log_: list[tuple[float, int, int]] = [(0.0, start, self.tuner_.best)]
        self._bw_sum = 0.0
        self._bw_n = 0
        self._granted: deque[Request] = deque()
        self._expired: list[Request] = []
        self._parked: dict[Request, None] = {}  # insertion-ordered, for determinism

    def _klass(self, req: Request) -> str:
        return req.rtype.klass if self.credits_.classes else "all"

    def on_arrival(self, req: Request, now_s: float) -> bool:
        from sloctl.control.aqm import DelayBudget

        if not self.credits_.try_acquire(self._klass(req), now_s):
            return False
        req.ctx["credit"] = True
        slo_s = req.rtype.slo_s
        req.ctx["budget"] = DelayBudget(slo_s, min(self.expected_service_s.get(req.rtype.name, 0.0), slo_s))
        return True

    def _aqm(self, bottleneck: str):
        if bottleneck == "cpu":
            return self.cpu_aqm_
        if bottleneck not in self.lock_aqm_:
            self.lock_aqm_[bottleneck] = self._make_lock_aqm(bottleneck)
        return self.lock_aqm_[bottleneck]

    def on_enqueue(self, req: Request, bottleneck: str, queue_len: int, now_s: float) -> bool:
        aqm = self._aqm(bottleneck)
        if aqm.should_drop(req.ctx["budget"]):
            return False
        aqm.joined()
        return True

    def on_dequeue(self, req: Request, bottleneck: str, wait_s: float, now_s: float) -> None:
        aqm = self._aqm(bottleneck)
        aqm.left(wait_s, req.ctx["budget"])
        if bottleneck != "cpu":
            aqm.observe_hold(req.rtype.lock_s)

    def mem_gate(self, req: Request, now_s: float) -> GateOutcome:
        outcome = self.msem_.wait_if_uncongested(req, req.ctx["budget"], now_s, self.mem_hold_s_)
        if outcome == "queued":
            req.ctx["mem_queued_s"] = now_s
            self._parked[req] = None
        return outcome

    def _late(self, req: Request, start_s: float) -> bool:
        """Would ``req`` miss its deadline if its memory section started at ``start_s``?"""
        return start_s + self.mem_hold_s_ + req.rtype.cpu_s / 2 > req.arrival_s + req.rtype.slo_s

    def _grant(self, req: Request, now_s: float) -> Request:
        self._parked.pop(req, None)
        req.ctx["budget"].deduct(max(0.0, now_s - req.ctx.pop("mem_queued_s")))
        return req

    def mem_release(self, req: Request | None, now_s: float) -> list[Request]:
        if req is None:
            granted, self._granted = list(self._granted), deque()
            return granted
        self.mem_hold_s_ = req.mem_s if self.mem_hold_s_ == 0.0 else 0.2 * req.mem_s + 0.8 * self.mem_hold_s_
        nxt = self.msem_.post(now_s)
        while nxt is not None and self._late(nxt, now_s):  # too late: pass the slot on
            del self._parked[nxt]
            self._expired.append(nxt)
            nxt = self.msem_.post(now_s)
        return [] if nxt is None else [self._grant(nxt, now_s)]

    def mem_expired(self, now_s: float) -> list[Request]:
        # A waiter predicted to finish after its deadline cannot count as good: free its place for one that can.
        expired, self._expired = self._expired, []
        per_slot_s = self.mem_hold_s_ / self.msem_.capacity
        for position, req in enumerate(list(self._parked)):
            if self._late(req, now_s + (position + 1) * per_slot_s):
                self.msem_.cancel(req)
                del self._parked[req]
                expired.append(req)
        return expired

    def on_complete(self, req: Request, now_s: float) -> None:
        self.cpu_aqm_.observe_hold(req.core_s)
        ok = now_s - req.arrival_s <= req.rtype.slo_s
        self.credits_.release(self._klass(req), now_s, ok=True, within_slo=ok)

    def on_drop(self, req: Request, now_s: float, partial: bool) -> None:
        if req.ctx.pop("credit", False):
            self.credits_.record_drop(self._klass(req), now_s)
            req.ctx["budget"].drop()

    def observe_bandwidth(self, bytes_per_s: float, now_s: float) -> None:
        self._bw_sum += bytes_per_s
        self._bw_n += 1

    def tick(self, now_s: float) -> None:
        self.credits_.tick(now_s)
        if self.static_capacity is not None or not self.tuner_.due(now_s) or self._bw_n == 0:
            return
        self.tuner_.update(self.msem_.capacity, self._bw_sum / self._bw_n, now_s)
        self._bw_sum, self._bw_n = 0.0, 0
        capacity = self.tuner_.select(now_s)
        self._granted.extend(self._grant(r, now_s) for r in self.msem_.set_capacity(capacity, now_s))
        self.capacity_log_.append((now_s, capacity, self.tuner_.best))

    def gauges(self) -> dict[str, float]:
        return {"credits": self.credits_.credits, "in_flight": self.credits_.in_flight,
                "msem_capacity": self.msem_.capacity, "msem_best": self.tuner_.best,
                "msem_queued": self.msem_.queued, "mem_hold_s": self.mem_hold_s_,
                "cpu_mean_hold_s": self.cpu_aqm_.mean_hold_s if math.isfinite(self.cpu_aqm_.mean_hold_s) else 0.0}
