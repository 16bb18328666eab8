"""m_semaphore tuners on Svalinn's own bandit curve, clean and noisy, beside the peer's constants (issue 21).

Svalinn's authors test their m_semaphore bandit on a synthetic curve (their
``m-semaphore/sim/mab_eg.py``; see ``/work/shared/STACK.md``): 45 arms, the
bandwidth of capacity ``c`` is ``M · min(c, knee) / knee + N(0, σ)`` with
knee 16 and σ = 3000. ``M`` is not stated there; 180 000 (MB/s, the
180 GB/s machine of the paper's second setup) makes the noise, in reward
units, 3 × the reward gap between neighbouring arms above the knee
(``α σ / M`` vs ``(1 − α) / 45`` at α = 0.8), the ratio STACK.md reports.

:class:`PeerTuner` is the peer's controller as published (ε 0.3, ±1 from
the best arm, α 0.8, ω 0.8, values start at 0, bandwidth normalised by the
largest seen, start at capacity 1). Every tuner faces the same curve and
the same noise draws (one ``numpy`` Generator per seed for the curve, the
tuner's own seed for its choices). A demand change moves the knee; the
run measures

* ``settle_ms``: after each change, the first interval after which the
  tuner's best arm equals the new knee for the rest of the phase (clean
  curve), at exactly 500 µs per interval;
* ``regret_per_step``: the mean of ``r(knee) − r(chosen arm)`` in noise-free
  reward over the second half of every phase (steady state; noisy curve).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sloctl.control.msemaphore import EpsilonGreedyTuner, ThompsonTuner, UCBTuner

__all__ = ["ARMS", "KNEES", "M", "NOISE_STD", "PeerTuner", "bandit_experiment", "run_curve", "tuner_factories"]

ARMS = 45
M = 180_000.0
NOISE_STD = 3000.0
ALPHA = 0.8
INTERVAL_S = 0.0005
KNEES = (16, 8, 16, 24)  # the knee of each phase: the optimum moves down, up, further up


class PeerTuner:
    """Svalinn's C++ m_semaphore controller as published: ε-greedy ±1 from the best arm.

    ``r[c] ← (1 − ω) r[c] + ω · reward`` with every ``r`` starting at 0; the
    bandwidth is normalised by the largest seen so far; with probability ``ε``
    the next capacity is ``best ± 1`` (uniformly, clamped to the arms), else
    ``best``; ``best`` is the arm with the highest ``r`` (ties: the smaller).
    """

    def __init__(self, max_capacity: int, alpha: float = 0.8, omega: float = 0.8, epsilon: float = 0.3,
                 seed: int = 0, interval_s: float = INTERVAL_S) -> None:
        self.max_capacity = max_capacity
        self.alpha, self.omega, self.epsilon = alpha, omega, epsilon
        self.interval_s = interval_s
        self._rng = random.Random(seed)
        self.r = [0.0] * (max_capacity + 1)
        self.max_seen = 0.0
        self.current = 1

    @property
    def best(self) -> int:
        return max(range(1, self.max_capacity + 1), key=lambda c: (self.r[c], -c))

    def select(self, now_s: float) -> int:
        best = self.best
        if self._rng.random() < self.epsilon:
            best = min(max(best + self._rng.choice((-1, 1)), 1), self.max_capacity)
        self.current = best
        return best

    def update(self, capacity: int, bandwidth: float, now_s: float) -> None:
        self.max_seen = max(self.max_seen, bandwidth)
        norm = bandwidth / self.max_seen if self.max_seen > 0 else 0.0
        reward = self.alpha * min(norm, 1.0) - (1 - self.alpha) * capacity / self.max_capacity
        self.r[capacity] = (1 - self.omega) * self.r[capacity] + self.omega * reward


def _true_reward(c: int, knee: int) -> float:
    return ALPHA * min(c, knee) / knee - (1 - ALPHA) * c / ARMS


def run_curve(tuner: Any, *, knees: Sequence[int] = KNEES, steps_per_phase: int = 400, noise_std: float = 0.0,
              seed: int = 0) -> dict[str, Any]:
    """Drive ``tuner`` over the phases; returns per phase the settling interval and the steady-state regret."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, noise_std, size=len(knees) * steps_per_phase) if noise_std > 0 else None
    settle, regret = [], []
    step = 0
    for knee in knees:
        bests, losses = [], []
        optimum = _true_reward(knee, knee)
        for _ in range(steps_per_phase):
            now_s = step * INTERVAL_S  # n × interval: no drift
            c = tuner.select(now_s)
            bw = M * min(c, knee) / knee + (noise[step] if noise is not None else 0.0)
            tuner.update(c, max(bw, 0.0), now_s)
            bests.append(tuner.best)
            losses.append(optimum - _true_reward(c, knee))
            step += 1
        k = steps_per_phase
        while k > 0 and bests[k - 1] == knee:
            k -= 1
        settle.append((k + 1) * INTERVAL_S * 1e3 if k < steps_per_phase else math.nan)
        regret.append(float(np.mean(losses[steps_per_phase // 2:])))
    return {"settle_ms": settle, "regret_per_step": regret}


def tuner_factories() -> dict[str, Callable[[int], Any]]:
    """The tuners compared, by name; each takes a seed. All use α 0.8 so that they score one reward."""
    return {
        "peer (ε 0.3, ω 0.8)": lambda seed: PeerTuner(ARMS, seed=seed),
        "sloctl ε-greedy (default)": lambda seed: EpsilonGreedyTuner(ARMS, M, alpha=ALPHA, seed=seed),
        "sloctl ε-greedy before issue 21 (follow-through on every move, fixed ε)": lambda seed: EpsilonGreedyTuner(
            ARMS, M, alpha=ALPHA, seed=seed, significance=0.0, epsilon_min=None),
        "sloctl ε-greedy, plain (paper's rule, optimistic neighbours)": lambda seed: EpsilonGreedyTuner(
            ARMS, M, alpha=ALPHA, seed=seed, follow_through=False, significance=0.0, epsilon_min=None),
        "sloctl UCB": lambda seed: UCBTuner(ARMS, M, alpha=ALPHA, seed=seed),
        "sloctl Thompson": lambda seed: ThompsonTuner(ARMS, M, alpha=ALPHA, seed=seed),
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    per_phase = list(zip(*(r["settle_ms"] for r in runs), strict=True))
    return {"settle_ms_median": [statistics.median(p) if not any(math.isnan(x) for x in p) else math.nan
                                 for p in per_phase],
            "settle_ms_worst": [max(p) if not any(math.isnan(x) for x in p) else math.nan for p in per_phase],
            "settled_share": [sum(not math.isnan(x) for x in p) / len(p) for p in per_phase],
            "regret_per_step": statistics.mean(statistics.mean(r["regret_per_step"]) for r in runs)}


def bandit_experiment(*, seeds: Sequence[int] = tuple(range(20)), clean_steps: int = 400, noisy_steps: int = 2000,
                      noise_std: float = NOISE_STD, names: Sequence[str] | None = None,
                      on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Every tuner of :func:`tuner_factories` on the clean and the noisy curve, over ``seeds``.

    ``on_progress(done, total)`` is called after each (tuner, seed) pair (its clean and noisy runs),
    ``total`` = tuners × seeds.

    Returns:
        ``{"curve": {...}, "clean": {name: summary}, "noisy": {name: summary}}``, a summary being
        ``{"settle_ms_median", "settle_ms_worst", "settled_share"}`` per phase and ``regret_per_step``
        (mean over seeds and phases of the steady-state regret).
    """
    factories = tuner_factories()
    chosen = list(names) if names is not None else list(factories)
    out: dict[str, Any] = {"curve": {"arms": ARMS, "M": M, "noise_std": noise_std, "alpha": ALPHA, "knees": KNEES,
                                     "interval_s": INTERVAL_S, "clean_steps_per_phase": clean_steps,
                                     "noisy_steps_per_phase": noisy_steps, "seeds": list(seeds)},
                           "clean": {}, "noisy": {}}
    total, done = len(chosen) * len(seeds), 0
    for name in chosen:
        make = factories[name]
        clean, noisy = [], []
        for s in seeds:
            clean.append(run_curve(make(s), steps_per_phase=clean_steps, seed=s))
            noisy.append(run_curve(make(s), steps_per_phase=noisy_steps, noise_std=noise_std, seed=s))
            done += 1
            if on_progress is not None:
                on_progress(done, total)
        out["clean"][name] = _summary(clean)
        out["noisy"][name] = _summary(noisy)
    return out
