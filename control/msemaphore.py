"""m_semaphore: an explicit queue for implicit memory bandwidth, and the bandits that size it (Svalinn §4.3).

Memory bandwidth has no queue of its own: let every thread issue loads and
they all stall, burning cores that CPU-bound requests could use. Wrapping
the memory-heavy code path in an :class:`MSemaphore` turns the bandwidth into
a queue an AQM can manage: ``try_wait`` never queues (refuse if no slot),
``wait_if_uncongested`` queues only when the remaining delay budget covers
the expected wait, ``post`` hands a freed slot straight to the oldest waiter.

Its capacity — how many memory-heavy requests run at once — is tuned online
by a bandit over arms ``1..max_capacity``. The reward of an interval pays for
bandwidth and charges for the cores held:

    r = α · min(bandwidth / max_bandwidth, 1) − (1 − α) · capacity / max_capacity

All tuners share ``select(now_s) -> int`` and ``update(capacity, bandwidth, now_s)``
and, like the paper, explore only next to the current best arm so that the
capacity never jumps.
"""

from __future__ import annotations

import math
import numbers
import random
import statistics
from collections import deque
from collections.abc import Hashable, Mapping
from typing import Literal, Protocol

from sloctl.control.aqm import DelayBudget

__all__ = [
    "CapacityTuner",
    "EpsilonGreedyTuner",
    "MSemaphore",
    "ThompsonTuner",
    "UCBTuner",
]

WaitOutcome = Literal["acquired", "queued", "dropped"]
_DUE_TOLERANCE = 1e-9  # relative slack of ``due``: float clocks drift by ulps
_NOISE_WINDOW = 32  # innovations the noise estimate looks at


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_capacity(value: object, owner: str, field: str = "capacity") -> None:
    if not (_is_int(value) and value >= 1):
        raise ValueError(f"The '{field}' parameter of {owner} must be an integer >= 1, got {value!r}.")


class MSemaphore:
    """A counting semaphore with a FIFO wait queue and direct hand-off.

    Tokens are whatever the caller uses to name a request (hashable ids are
    best). A queued token's enqueue time is kept so that, when :meth:`post`
    hands it a slot, :attr:`last_wait_s` holds how long it waited — deduct it
    from the request's budget.

    Args:
        capacity: slots (concurrent holders), >= 1.
    """

    def __init__(self, capacity: int) -> None:
        _check_capacity(capacity, "MSemaphore")
        self._capacity = int(capacity)
        self._in_use = 0
        self._queue: deque[tuple[Hashable, float]] = deque()
        self.last_wait_s = 0.0
        self.drops = 0
        self.handoffs = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_use(self) -> int:
        """Slots held (may exceed capacity for a while after a shrink)."""
        return self._in_use

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _free_slot(self) -> bool:
        return self._in_use < self._capacity

    def try_wait(self, token: Hashable) -> bool:
        """Take a slot only if one is free and nobody is queued; never queues."""
        if self._free_slot() and not self._queue:
            self._in_use += 1
            return True
        self.drops += 1
        return False

    def wait_if_uncongested(self, token: Hashable, budget: DelayBudget | float, now_s: float,
                            expected_hold_s: float) -> WaitOutcome:
        """Take a free slot, else queue if the expected wait fits the budget, else drop.

        The expected wait of a newcomer is ``(queued + 1) · expected_hold_s / capacity``.
        A dropped :class:`DelayBudget` runs its cleanups.

        Args:
            token: names the request; returned by :meth:`post` when it gets its slot.
            budget: a :class:`DelayBudget` or the remaining budget in seconds.
            now_s: current time (seconds), stored as the enqueue time.
            expected_hold_s: how long a holder keeps a slot (seconds).
        """
        if not (math.isfinite(expected_hold_s) and expected_hold_s >= 0):
            raise ValueError(f"The 'expected_hold_s' parameter of MSemaphore.wait_if_uncongested must be >= 0, "
                             f"got {expected_hold_s!r}.")
        if self._free_slot() and not self._queue:
            self._in_use += 1
            return "acquired"
        remaining_s = budget.remaining_s if isinstance(budget, DelayBudget) else float(budget)
        if (len(self._queue) + 1) * expected_hold_s / self._capacity <= remaining_s:
            self._queue.append((token, now_s))
            return "queued"
        self.drops += 1
        if isinstance(budget, DelayBudget):
            budget.drop()
        return "dropped"

    def post(self, now_s: float) -> Hashable | None:
        """Free a slot. If someone waits, hand the slot to the oldest waiter and return its token.

        On a hand-off the number of slots in use does not change and
        :attr:`last_wait_s` is the waiter's wait. After a shrink, slots over
        capacity are retired instead of handed off.
        """
        if self._in_use <= 0:
            raise RuntimeError("MSemaphore.post() with no slot held.")
        if self._queue and self._in_use <= self._capacity:
            token, enqueued_s = self._queue.popleft()
            self.last_wait_s = max(0.0, now_s - enqueued_s)
            self.handoffs += 1
            return token
        self._in_use -= 1
        return None

    def set_capacity(self, n: int, now_s: float) -> list[Hashable]:
        """Resize. Growing hands the new slots to waiters (returned in FIFO order, oldest first);
        shrinking takes effect as holders post."""
        _check_capacity(n, "MSemaphore")
        self._capacity = int(n)
        started = []
        while self._queue and self._free_slot():
            token, enqueued_s = self._queue.popleft()
            self.last_wait_s = max(0.0, now_s - enqueued_s)
            self._in_use += 1
            started.append(token)
        return started

    def enqueued_at(self, token: Hashable) -> float | None:
        """When a still-queued ``token`` joined the queue (None if it is not queued)."""
        return next((t for tok, t in self._queue if tok == token), None)

    def cancel(self, token: Hashable) -> bool:
        """Remove a queued ``token`` (e.g. its budget ran out while waiting); True if it was queued."""
        for i, (tok, _) in enumerate(self._queue):
            if tok == token:
                del self._queue[i]
                return True
        return False

    def __repr__(self) -> str:
        return f"MSemaphore(capacity={self._capacity}, in_use={self._in_use}, queued={len(self._queue)})"


class CapacityTuner(Protocol):
    """What a capacity tuner offers to a driver, once per ``interval_s``."""

    interval_s: float

    def select(self, now_s: float) -> int:
        """The capacity to use for the next interval."""

    def update(self, capacity: int, bandwidth: float, now_s: float) -> None:
        """The bandwidth measured during an interval run at ``capacity``."""


class _NeighbourBandit:
    """Arms ``1..max_capacity``, the shared reward, the neighbourhood and the bookkeeping."""

    def __init__(self, max_capacity: int, max_bandwidth: float, alpha: float, interval_s: float, seed: int,
                 initial_capacity: int | None, follow_through: bool, significance: float = 0.0) -> None:
        self.significance = significance
        self.max_capacity = max_capacity
        self.max_bandwidth = max_bandwidth
        self.alpha = alpha
        self.interval_s = interval_s
        self.seed = seed
        self.initial_capacity = initial_capacity
        self.follow_through = follow_through
        self._validate_common()
        self._rng = random.Random(seed)
        self.values: dict[int, float] = {}  # explored arms only
        self._start = 1 if initial_capacity is None else initial_capacity
        self._last_select_s = -math.inf
        self._innovations: deque[float] = deque(maxlen=_NOISE_WINDOW)  # |reward − the arm's value before it|
        self.since_move_ = 0  # updates since the best arm last moved significantly

    def _validate_common(self) -> None:
        name = type(self).__name__
        _check_capacity(self.max_capacity, name, "max_capacity")
        if not (math.isfinite(self.max_bandwidth) and self.max_bandwidth > 0):
            raise ValueError(f"The 'max_bandwidth' parameter of {name} must be > 0, got {self.max_bandwidth!r}.")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"The 'alpha' parameter of {name} must be in [0, 1], got {self.alpha!r}.")
        if not (math.isfinite(self.significance) and self.significance >= 0):
            raise ValueError(f"The 'significance' parameter of {name} must be >= 0, got {self.significance!r}.")
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"The 'interval_s' parameter of {name} must be > 0, got {self.interval_s!r}.")
        if self.initial_capacity is not None and not (
                _is_int(self.initial_capacity) and 1 <= self.initial_capacity <= self.max_capacity):
            raise ValueError(f"The 'initial_capacity' parameter of {name} must be in [1, {self.max_capacity}], "
                             f"got {self.initial_capacity!r}.")

    def reward(self, capacity: int, bandwidth: float) -> float:
        """``α · min(bandwidth / max_bandwidth, 1) − (1 − α) · capacity / max_capacity``."""
        return (self.alpha * min(max(bandwidth, 0.0) / self.max_bandwidth, 1.0)
                - (1 - self.alpha) * capacity / self.max_capacity)

    @property
    def best(self) -> int:
        """The explored arm with the highest value (ties: the smaller capacity); the start arm before any."""
        if not self.values:
            return self._start
        return max(self.values, key=lambda arm: (self.values[arm], -arm))

    def neighbours(self, arm: int) -> list[int]:
        return [a for a in (arm - 1, arm + 1) if 1 <= a <= self.max_capacity]

    def due(self, now_s: float) -> bool:
        """Whether ``interval_s`` has passed since the last :meth:`select`.

        Up to a relative tolerance of 1e-9 of ``interval_s``: a driver's clock
        built from sums of floats (0.0001 five times is 0.00049999...) must
        not stretch a 500 µs interval to the next tick.
        """
        return now_s - self._last_select_s >= self.interval_s * (1.0 - _DUE_TOLERANCE)

    def update(self, capacity: int, bandwidth: float, now_s: float) -> None:
        """Learn the reward of an interval run at ``capacity``.

        With ``follow_through``, when the best arm moves *significantly*, the
        arm one further in the same direction is forgotten, so that it is
        probed next (its old value may be stale: the optimum that moved once
        may keep moving). A move is significant when the new best's value
        exceeds the old best's by more than ``significance`` × the reward
        noise :attr:`noise_std_`; with ``significance = 0`` every move is.
        On a clean signal the noise estimate is 0 and every real move
        counts; on a noisy one the best arm's random steps above the knee
        no longer drag the capacity along.
        """
        self._check_arm(capacity, "capacity")
        capacity = int(capacity)
        before = self.best
        reward = self.reward(capacity, bandwidth)
        old = self.values.get(capacity)
        if old is not None:
            self._innovations.append(abs(reward - old))
        self._learn(capacity, reward)
        after = self.best
        self.since_move_ += 1
        if after != before and self._significant(after, before):
            self.since_move_ = 0
            if self.follow_through:
                ahead = after + (1 if after > before else -1)
                if ahead != before and ahead in self.values:
                    self._forget(ahead)

    @property
    def noise_std_(self) -> float:
        """The reward noise the tuner estimates (reward units): 1.4826 × the median of the last 32
        innovations ``|reward − the arm's value before it|``. A median, so that the few large
        innovations a real change of the optimum causes are not taken for noise."""
        if not self._innovations:
            return 0.0
        return 1.4826 * statistics.median(self._innovations)

    def _significant(self, after: int, before: int) -> bool:
        if before not in self.values:
            return True
        return self.values[after] - self.values[before] > self.significance * self.noise_std_

    def _learn(self, arm: int, reward: float) -> None:
        raise NotImplementedError

    def _forget(self, arm: int) -> None:
        self.values.pop(arm, None)

    def _check_arm(self, capacity: int, what: str) -> None:
        if not (_is_int(capacity) and 1 <= capacity <= self.max_capacity):
            raise ValueError(f"The '{what}' parameter of {type(self).__name__} must be an arm in "
                             f"[1, {self.max_capacity}], got {capacity!r}.")

    def _check_values(self, values: Mapping[int, float]) -> None:
        for arm, value in values.items():
            self._check_arm(arm, "values")
            if not math.isfinite(value):
                raise ValueError(f"The 'values' parameter of {type(self).__name__} must hold finite values, "
                                 f"got {value!r} for arm {arm}.")


class EpsilonGreedyTuner(_NeighbourBandit):
    """ε-greedy over capacities, exploring only next to the best arm (Svalinn §4.3).

    Each interval: with probability ``ε`` try ``best − 1`` or ``best + 1``
    (uniformly; only the one that exists at an edge), otherwise exploit.
    Exploiting picks ``best`` — unless a neighbour of ``best`` has never been
    tried, in which case it picks that neighbour (the upper one first): an
    unexplored arm is treated optimistically, but only within reach, so a
    fresh tuner climbs one arm per interval instead of waiting for ``ε`` to
    stumble on the next arm, and the capacity still moves by at most one.

    Arm values are exponentially weighted: ``v ← ω · r + (1 − ω) · v`` —
    ``ω`` weighs the NEW reward (0.8: mostly trust the latest interval, so the
    tuner follows a drifting optimum); an arm's first reward is taken as is.

    Args:
        max_capacity: the largest arm (arms are ``1..max_capacity``).
        max_bandwidth: bandwidth that earns the full ``α`` (same unit as ``update``'s).
        alpha: ``α``, weight of bandwidth against cores in the reward, in [0, 1].
        omega: ``ω``, EWMA weight of the newest reward, in (0, 1].
        epsilon: ``ε``, exploration probability, in [0, 1].
        interval_s: ``Δt_msem``, the cadence drivers should call ``select`` at (seconds).
        seed: seeds exploration.
        initial_capacity: the arm to start from (default 1).
        follow_through: when the best arm moves significantly, forget the
            next arm in that direction so it is probed at once (see
            :meth:`update`); False is the paper's plain ε-greedy.
        significance: how many noise standard deviations a move of the best
            arm must clear to count (follow-through, and the reset of a
            decayed ε); 0 counts every move.
        epsilon_min: the floor ``ε`` decays to while the best arm holds
            (None: no decay). ``ε_t = max(ε_min, ε · 2^(−t / epsilon_half_life))``,
            ``t`` the intervals since the best arm last moved significantly.
        epsilon_half_life: intervals for ``ε`` to halve.
    """

    def __init__(self, max_capacity: int, max_bandwidth: float, alpha: float = 0.7, omega: float = 0.8,
                 epsilon: float = 0.3, interval_s: float = 0.0005, seed: int = 0,
                 initial_capacity: int | None = None, follow_through: bool = True, significance: float = 3.0,
                 epsilon_min: float | None = 0.2, epsilon_half_life: float = 20.0) -> None:
        super().__init__(max_capacity, max_bandwidth, alpha, interval_s, seed, initial_capacity, follow_through,
                         significance)
        self.omega = omega
        self.epsilon = epsilon
        self.epsilon_min = epsilon_min
        self.epsilon_half_life = epsilon_half_life
        if epsilon_min is not None and not 0.0 <= epsilon_min <= 1.0:
            raise ValueError(f"The 'epsilon_min' parameter of EpsilonGreedyTuner must be in [0, 1], "
                             f"got {epsilon_min!r}.")
        if not (math.isfinite(epsilon_half_life) and epsilon_half_life > 0):
            raise ValueError(f"The 'epsilon_half_life' parameter of EpsilonGreedyTuner must be > 0, "
                             f"got {epsilon_half_life!r}.")
        if not 0.0 < omega <= 1.0:
            raise ValueError(f"The 'omega' parameter of EpsilonGreedyTuner must be in (0, 1], got {omega!r}.")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"The 'epsilon' parameter of EpsilonGreedyTuner must be in [0, 1], got {epsilon!r}.")

    def select(self, now_s: float) -> int:
        self._last_select_s = now_s
        best = self.best
        around = self.neighbours(best)
        if around and self._rng.random() < self.epsilon_now:
            return self._rng.choice(around)
        unexplored = [a for a in reversed(around) if a not in self.values]
        return unexplored[0] if unexplored else best

    @property
    def epsilon_now(self) -> float:
        """The exploration probability in force (``ε`` decayed while the best arm holds)."""
        if self.epsilon_min is None:
            return self.epsilon
        return max(min(self.epsilon_min, self.epsilon),
                   self.epsilon * 0.5 ** (self.since_move_ / self.epsilon_half_life))

    def _learn(self, arm: int, reward: float) -> None:
        old = self.values.get(arm)
        self.values[arm] = reward if old is None else self.omega * reward + (1 - self.omega) * old

    def warm_start(self, values: Mapping[int, float]) -> None:
        """Seed arm values (e.g. from a registry of past runs); seeded arms count as explored."""
        self._check_values(values)
        self.values.update({int(a): float(v) for a, v in values.items()})


class _DiscountedStats(_NeighbourBandit):
    """Discounted counts and reward sums per arm (Garivier & Moulines), for UCB and Thompson sampling.

    Every update multiplies all counts and sums by ``gamma`` before adding the
    new reward, so old evidence fades and a moved optimum can be found again.
    """

    def __init__(self, max_capacity: int, max_bandwidth: float, alpha: float, gamma: float, neighbours_only: bool,
                 interval_s: float, seed: int, initial_capacity: int | None, follow_through: bool) -> None:
        super().__init__(max_capacity, max_bandwidth, alpha, interval_s, seed, initial_capacity, follow_through)
        self.gamma = gamma
        self.neighbours_only = neighbours_only
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"The 'gamma' parameter of {type(self).__name__} must be in (0, 1], got {gamma!r}.")
        self.counts: dict[int, float] = {}
        self.sums: dict[int, float] = {}

    def candidates(self) -> list[int]:
        if not self.neighbours_only:
            return list(range(1, self.max_capacity + 1))
        best = self.best
        return sorted([best, *self.neighbours(best)])

    def _learn(self, arm: int, reward: float) -> None:
        for a in self.counts:
            self.counts[a] *= self.gamma
            self.sums[a] *= self.gamma
        self.counts[arm] = self.counts.get(arm, 0.0) + 1.0
        self.sums[arm] = self.sums.get(arm, 0.0) + reward
        for a in self.counts:
            self.values[a] = self.sums[a] / self.counts[a]

    def _forget(self, arm: int) -> None:
        for table in (self.values, self.counts, self.sums):
            table.pop(arm, None)

    def warm_start(self, values: Mapping[int, float]) -> None:
        """Seed arm values as one pseudo-observation each; seeded arms count as explored."""
        self._check_values(values)
        for arm, value in values.items():
            self.counts[int(arm)] = 1.0
            self.sums[int(arm)] = float(value)
            self.values[int(arm)] = float(value)


class UCBTuner(_DiscountedStats):
    """Discounted UCB over capacities.

    Picks the candidate with the highest ``mean + c · sqrt(ln N / n)`` where
    ``n`` is the arm's discounted count and ``N`` the total; untried
    candidates come first (upper one first). With ``neighbours_only`` (the
    default, as in the paper) candidates are ``best − 1, best, best + 1``;
    otherwise all arms.

    Args:
        c: exploration weight (reward units; rewards span about 1).
        gamma: discount per update, in (0, 1]; 1 = plain UCB1. The default
            0.9 remembers about ten intervals (5 ms at 500 µs).
        neighbours_only, follow_through, interval_s, seed, initial_capacity:
            as in :class:`EpsilonGreedyTuner` / above.
    """

    def __init__(self, max_capacity: int, max_bandwidth: float, alpha: float = 0.7, c: float = 0.05,
                 gamma: float = 0.9, neighbours_only: bool = True, interval_s: float = 0.0005, seed: int = 0,
                 initial_capacity: int | None = None,
                 follow_through: bool = True) -> None:
        super().__init__(max_capacity, max_bandwidth, alpha, gamma, neighbours_only, interval_s, seed,
                         initial_capacity, follow_through)
        self.c = c
        if not (math.isfinite(c) and c >= 0):
            raise ValueError(f"The 'c' parameter of UCBTuner must be >= 0, got {c!r}.")

    def select(self, now_s: float) -> int:
        self._last_select_s = now_s
        candidates = self.candidates()
        untried = [a for a in reversed(candidates) if self.counts.get(a, 0.0) <= 1e-12]
        if untried:
            return untried[0]
        total = sum(self.counts.values())
        return max(candidates, key=lambda a: (self.values[a] + self.c * math.sqrt(
            math.log(max(total, 1.0 + 1e-9)) / self.counts[a]), -a))


class ThompsonTuner(_DiscountedStats):
    """Thompson sampling with a Gaussian posterior per capacity.

    Rewards of an arm are modelled as ``N(μ, noise_std²)`` with prior
    ``μ ~ N(prior_mean, prior_std²)`` (an untried arm is a draw from this
    wide prior, so it is tried soon after it comes within reach); discounted
    counts keep the posterior from freezing. Candidates as in :class:`UCBTuner`.

    Args:
        noise_std: assumed reward noise (reward units).
        prior_mean, prior_std: prior on an arm's mean reward.
        gamma: discount per update, in (0, 1].
        neighbours_only, follow_through, interval_s, seed, initial_capacity:
            as in :class:`UCBTuner`.
    """

    def __init__(self, max_capacity: int, max_bandwidth: float, alpha: float = 0.7, noise_std: float = 0.02,
                 prior_mean: float = 0.5, prior_std: float = 1.0, gamma: float = 0.9, neighbours_only: bool = True,
                 interval_s: float = 0.0005, seed: int = 0, initial_capacity: int | None = None,
                 follow_through: bool = True) -> None:
        super().__init__(max_capacity, max_bandwidth, alpha, gamma, neighbours_only, interval_s, seed,
                         initial_capacity, follow_through)
        self.noise_std = noise_std
        self.prior_mean = prior_mean
        self.prior_std = prior_std
        for field in ("noise_std", "prior_std"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"The '{field}' parameter of ThompsonTuner must be > 0, got {value!r}.")

    def posterior(self, arm: int) -> tuple[float, float]:
        """Posterior mean and standard deviation of the arm's mean reward."""
        n = self.counts.get(arm, 0.0)
        precision = 1.0 / self.prior_std ** 2 + n / self.noise_std ** 2
        mean = (self.prior_mean / self.prior_std ** 2 + self.sums.get(arm, 0.0) / self.noise_std ** 2) / precision
        return mean, 1.0 / math.sqrt(precision)

    def select(self, now_s: float) -> int:
        self._last_select_s = now_s
        draws = {a: self._rng.gauss(*self.posterior(a)) for a in self.candidates()}
        return max(draws, key=lambda a: (draws[a], -a))
