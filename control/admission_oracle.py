"""The goodput an overload controller could at best achieve: a small linear program (issue 21).

A controller is graded against the best achievable goodput, not only against
another controller. In a fluid view of a server, class ``i`` is offered
``λ_i`` requests/s, of which a share ``f_i`` could meet its SLO at all (1 when
its isolated service time fits the SLO, 0 when it cannot); each admitted
request of class ``i`` uses ``a_ij`` units of resource ``j`` (core-seconds,
bytes of memory traffic, seconds holding a lock), and resource ``j`` offers
``C_j`` units per second. The goodput ``x_i`` of every class then obeys

    0 ≤ x_i ≤ f_i · λ_i,      Σ_i a_ij · x_i ≤ C_j  for every resource j.

Many allocations satisfy these constraints; the bound is the one that
serves each class as far as the resources allow without taking from a class
served at a smaller fraction of its feasible demand: the lexicographic
max-min fair allocation of ``x_i / (f_i λ_i)`` (progressive filling, each
step a linear program solved with ``scipy.optimize.linprog``). It is
Pareto-optimal — no class could get more without a class served at a
smaller or equal fraction getting less — and it is what shedding each
resource's own excess, and nothing else, would reach. Maximising the total
instead would starve expensive classes (at 6 × load it serves no memory
request when the cores bind); that total is reported as ``max_total_per_s``.
Queueing is ignored, so no controller can exceed the bound except by noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["GoodputBound", "goodput_bound"]


@dataclass(frozen=True)
class GoodputBound:
    """The optimum: max-min fair goodput per class (requests/s), its total, the largest total any
    allocation reaches, and each resource's use at the optimum (0..1)."""

    goodput_per_s: dict[str, float]
    total_per_s: float
    max_total_per_s: float
    utilisation: dict[str, float]
    feasible_share: dict[str, float]

    def fraction(self, goodput_per_s: Mapping[str, float]) -> dict[str, float]:
        """Each class's ``goodput_per_s`` as a fraction of the bound (NaN where the bound is 0)."""
        return {c: (goodput_per_s.get(c, 0.0) / bound if bound > 0 else math.nan)
                for c, bound in self.goodput_per_s.items()}

    def to_dict(self) -> dict[str, object]:
        return {"goodput_per_s": dict(self.goodput_per_s), "total_per_s": self.total_per_s,
                "max_total_per_s": self.max_total_per_s,
                "utilisation": dict(self.utilisation), "feasible_share": dict(self.feasible_share)}


def _check(name: str, value: float, owner: str = "goodput_bound") -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"The '{name}' parameter of {owner} must be a finite number >= 0, got {value!r}.")
    return float(value)


def goodput_bound(offered_per_s: Mapping[str, float], usage: Mapping[str, Mapping[str, float]],
                  capacity: Mapping[str, float], feasible_share: Mapping[str, float] | None = None) -> GoodputBound:
    """The largest goodput per class the resources allow.

    Args:
        offered_per_s: arrival rate per class (requests/s, >= 0).
        usage: per class, the units of each resource one request uses
            (resources a class does not name it does not use).
        capacity: units per second of each resource (> 0), e.g. ``{"cores": 16,
            "bandwidth": 60e9, "lock:hot": 1.0}``.
        feasible_share: per class, the share of its requests that could meet
            the SLO at all, in [0, 1] (default 1).

    Returns:
        The :class:`GoodputBound`.
    """
    from scipy.optimize import linprog

    classes = list(offered_per_s)
    if not classes:
        raise ValueError("The 'offered_per_s' parameter of goodput_bound must name at least one class, got none.")
    resources = list(capacity)
    for r in resources:
        if not _check(f"capacity[{r!r}]", capacity[r]) > 0:
            raise ValueError(f"The 'capacity[{r!r}]' parameter of goodput_bound must be > 0, got {capacity[r]!r}.")
    share = {c: 1.0 for c in classes} | dict(feasible_share or {})
    upper = []
    for c in classes:
        f = _check(f"feasible_share[{c!r}]", share[c])
        if f > 1:
            raise ValueError(f"The 'feasible_share[{c!r}]' parameter of goodput_bound must be in [0, 1], got {f!r}.")
        upper.append(f * _check(f"offered_per_s[{c!r}]", offered_per_s[c]))
    for c, row in usage.items():
        if c not in offered_per_s:
            raise ValueError(f"The 'usage' parameter of goodput_bound names class {c!r}, which is not offered.")
        for r, a in row.items():
            if r not in capacity:
                raise ValueError(f"The 'usage[{c!r}]' parameter of goodput_bound names resource {r!r}, "
                                 f"which has no capacity.")
            _check(f"usage[{c!r}][{r!r}]", a)
    # Scale each resource row by its capacity so that the program is well conditioned (bytes vs seconds).
    a_ub = [[usage.get(c, {}).get(r, 0.0) / capacity[r] for c in classes] for r in resources]
    n = len(classes)
    widest = linprog([-1.0] * n, A_ub=a_ub or None, b_ub=[1.0] * len(a_ub) or None,
                     bounds=[(0.0, u) for u in upper], method="highs")
    if widest.status != 0:
        raise RuntimeError(f"goodput_bound: the linear program failed ({widest.message}).")
    x = _max_min_fair(a_ub, upper)
    goodput = {c: float(max(0.0, v)) for c, v in zip(classes, x, strict=True)}
    utilisation = {r: float(sum(row[i] * goodput[c] for i, c in enumerate(classes)))
                   for r, row in zip(resources, a_ub, strict=True)}
    return GoodputBound(goodput_per_s=goodput, total_per_s=sum(goodput.values()), max_total_per_s=float(-widest.fun),
                        utilisation=utilisation, feasible_share={c: float(share[c]) for c in classes})


def _max_min_fair(a_ub: list[list[float]], upper: list[float]) -> list[float]:
    """Progressive filling: raise every unfrozen class at the same fraction ``t`` of its demand; freeze the
    classes that cannot go beyond it; repeat with the others."""
    from scipy.optimize import linprog

    n = len(upper)
    frozen = {i: 0.0 for i, u in enumerate(upper) if u <= 0}
    b_ub = [1.0] * len(a_ub)
    while len(frozen) < n:
        free = [i for i in range(n) if i not in frozen]
        bounds = [(frozen[i], frozen[i]) if i in frozen else (0.0, upper[i]) for i in range(n)]
        rows = [row + [0.0] for row in a_ub] + [[-1.0 if j == i else 0.0 for j in range(n)] + [upper[i]] for i in free]
        level = linprog([0.0] * n + [-1.0], A_ub=rows, b_ub=b_ub + [0.0] * len(free), bounds=bounds + [(0.0, 1.0)],
                        method="highs")
        if level.status != 0:
            raise RuntimeError(f"goodput_bound: the linear program failed ({level.message}).")
        t = float(level.x[-1])
        if t >= 1.0 - 1e-9:
            frozen.update({i: upper[i] for i in free})
            break
        stuck = []
        for i in free:  # can class i alone go beyond t while the others keep theirs?
            others = [j for j in free if j != i]
            rows_i = [list(row) for row in a_ub] + [[-1.0 if k == j else 0.0 for k in range(n)] for j in others]
            rhs_i = b_ub + [-t * upper[j] for j in others]
            alone = linprog([-1.0 if k == i else 0.0 for k in range(n)], A_ub=rows_i, b_ub=rhs_i, bounds=bounds,
                            method="highs")
            if alone.status != 0 or -alone.fun <= t * upper[i] * (1 + 1e-7) + 1e-12:
                stuck.append(i)
        frozen.update({i: t * upper[i] for i in (stuck or free)})
    return [frozen[i] for i in range(n)]
