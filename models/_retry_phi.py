"""DiffTry at one service: rejection functions, retry algebra and the per-service fixed point.

Private helpers of :mod:`sloctl.models.retry`; every function is vectorised so
that a whole network (or one topological level of it) is solved at once.
Shapes: ``P`` classes, ``n`` services.
"""

from __future__ import annotations

import math

import numpy as np

MODELS = ("fluid", "mm1m", "mixed")

# Grid that brackets the least fixed point before bisecting (see solve_s_bar): geometric
# below 0.1, where the residual correction can put two roots a few hundredths apart.
_GRID = np.concatenate(([0.0], np.geomspace(1e-9, 0.1, 64, endpoint=False), np.linspace(0.1, 1.0, 46)))
_BISECTIONS = 46  # widest cell 0.02, halved 46 times: below 1e-15


def check_model(model: str) -> str:
    if model not in MODELS:
        raise ValueError(f"The 'model' parameter must be one of {', '.join(MODELS)}, got {model!r}.")
    return model


def phi(model: str, rho, m) -> np.ndarray:
    """Per-attempt rejection probability at utilisation ``rho`` with buffer ``m`` (§IV.A-B).

    ``fluid``: ``max(0, 1 - 1/rho)``. ``mm1m``: the M/M/1/m blocking probability
    ``(1-rho) rho^m / (1 - rho^(m+1))`` (``1/(m+1)`` at ``rho = 1``), evaluated
    through ``expm1``/``log`` so that neither large ``rho`` nor large ``m``
    overflows. ``mixed``: M/M/1/m up to ``rho = 1`` and, above it, the fluid form
    bounded below by the rejection at ``rho = 1``, ``max(1 - 1/rho, 1/(m+1))``; it
    is continuous at 1, nondecreasing, and equals the fluid model once
    ``rho >= (m+1)/m`` (in overload a large buffer is almost never idle, so the
    fluid throughput ``mu`` is the right one there).
    """
    check_model(model)
    rho = np.asarray(rho, dtype=float)
    m = np.asarray(m, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if model == "fluid":
            return np.where(rho > 1.0, 1.0 - 1.0 / rho, 0.0)
        under = _mm1m(rho, m)
        if model == "mm1m":
            return under
        return np.where(rho > 1.0, np.maximum(1.0 - 1.0 / rho, 1.0 / (m + 1.0)), under)


def _mm1m(rho: np.ndarray, m: np.ndarray) -> np.ndarray:
    log_rho = np.log(np.where(rho > 0, rho, 1.0))
    # rho < 1: (1-rho) rho^m / (1 - rho^(m+1)); rho > 1: divide through by rho^(m+1).
    low = (1.0 - rho) * np.exp(m * log_rho) / -np.expm1((m + 1.0) * log_rho)
    high = (1.0 - 1.0 / rho) / -np.expm1(-(m + 1.0) * log_rho)
    out = np.where(rho < 1.0, low, high)
    out = np.where(rho == 1.0, 1.0 / (m + 1.0), out)
    return np.where(rho > 0, out, 0.0)


# -- retry algebra ---------------------------------------------------------------------
def geometric(y: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``sum_{r<n} x^r`` for ``x = 1 - y`` in [0, 1], accurate as ``y -> 0`` (limit ``n``)."""
    y = np.asarray(y, dtype=float)
    n = np.asarray(n, dtype=float)
    yn = y * n
    with np.errstate(divide="ignore", invalid="ignore"):
        closed = -np.expm1(n * np.log1p(-np.minimum(y, 1.0))) / y
    taylor = n * (1.0 - y * (n - 1.0) / 2.0 + y * y * (n - 1.0) * (n - 2.0) / 6.0)
    return np.where(yn < 1e-4, taylor, closed)


def attempts_and_rejection(lam, k, s, alpha) -> tuple[np.ndarray, np.ndarray]:
    """Attempts ``Lam`` and end rejection ``a`` of originals ``lam`` with ``k`` retries at rejection ``s``.

    Independent attempts (``alpha is None``): ``a = s^(k+1)``,
    ``Lam = lam (1 + s + ... + s^k)``. Residual correction (§IV.D): a retry is
    rejected with ``s_r = (1 - alpha) + alpha s``, so ``a = s s_r^k`` and
    ``Lam = lam (1 + s (1 + s_r + ... + s_r^(k-1)))``. Broadcasts ``s`` (..., 1, n)
    against ``lam``, ``k`` (P, n).
    """
    if alpha is None:
        return lam * geometric(1.0 - s, k + 1), s ** (k + 1)
    y_r = alpha * (1.0 - s)  # 1 - s_r, computed without cancellation
    return lam * (1.0 + s * geometric(y_r, k)), s * (1.0 - y_r) ** k


def solve_s_bar(lam, k, mu, m, model: str, alpha=None) -> np.ndarray:
    """The per-attempt rejection ``s`` at each service: the least root of ``phi(rho(s)) = s``.

    ``s -> phi(rho(s))`` is nondecreasing, equal to ``phi(rho(0)) >= 0`` at 0 and
    below 1 at 1, so a root exists. A 111-point grid brackets the first sign
    change of ``g(s) = phi(rho(s)) - s`` and bisection refines it. The least root
    is the one a monotone iteration from ``s = 0`` reaches, and the one whose
    order in ``k`` carries the monotonicity of §VI.G. With independent attempts
    the root has been unique in every case tried; with the residual correction
    and small ``alpha`` there can be three (a low-rejection state and a retry
    storm), and the least is the state an empty service settles in.
    Shapes: ``lam``, ``k`` (P, n); ``mu``, ``m``, ``alpha`` (n,); returns (n,).
    """
    lam = np.asarray(lam, dtype=float)  # (P, n)
    n = lam.shape[1]
    if n == 0:
        return np.zeros(0)

    def g(s):  # s (..., n) -> (..., n)
        attempts, _ = attempts_and_rejection(lam, k, s[..., None, :], alpha)
        return phi(model, attempts.sum(axis=-2) / mu, m) - s

    grid = np.broadcast_to(_GRID[:, None], (_GRID.size, n))
    below = g(grid) <= 0.0  # (G, n); the last row is always True (phi < 1 at finite load)
    below[-1] = True
    first = np.argmax(below, axis=0)
    hi = _GRID[first]
    lo = _GRID[np.maximum(first - 1, 0)]
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        positive = g(mid) > 0.0
        lo = np.where(positive, mid, lo)
        hi = np.where(positive, hi, mid)
    return np.where(first == 0, 0.0, 0.5 * (lo + hi))


# -- residual-time correction ------------------------------------------------------------
def residual_alpha(capacity_per_s: float, retry_delay_s: float, service_cv: float = 1.0) -> float:
    """Probability that the job blocking an attempt has left before the retry (§IV.D).

    ``alpha = P(R < D)`` with ``R`` the equilibrium residual service time and
    ``D`` the exponential retry delay of mean ``retry_delay_s``, i.e. the Laplace
    transform of ``R`` at ``1/retry_delay_s``: ``(1 - S~(t)) / (t E[S])`` with
    ``S~`` the service time's transform. The service distribution follows
    ``service_cv``: 0 deterministic, 1 exponential (``alpha = mu d / (1 + mu d)``),
    above 1 a balanced two-phase hyperexponential (each phase carries half the
    mean), and between 0 and 1 a constant plus an exponential of mean ``cv/mu``
    -- the distributions the simulator (``sloctl.simulation.retry_sim``) draws.

    Raises:
        ValueError: a non-positive rate or delay, or a negative cv.
    """
    if not (capacity_per_s > 0 and math.isfinite(capacity_per_s)):
        raise ValueError(f"The 'capacity_per_s' parameter must be > 0, got {capacity_per_s!r}.")
    if not (retry_delay_s > 0 and math.isfinite(retry_delay_s)):
        raise ValueError(f"The 'retry_delay_s' parameter must be > 0, got {retry_delay_s!r}.")
    if not (service_cv >= 0 and math.isfinite(service_cv)):
        raise ValueError(f"The 'service_cv' parameter must be >= 0, got {service_cv!r}.")
    mu, t = float(capacity_per_s), 1.0 / float(retry_delay_s)
    c2 = float(service_cv) ** 2
    if c2 == 0.0:
        one_minus = -math.expm1(-t / mu)
    elif c2 == 1.0:
        one_minus = t / (mu + t)
    elif c2 > 1.0:
        p1 = 0.5 * (1.0 + math.sqrt((c2 - 1.0) / (c2 + 1.0)))
        rates = (2.0 * p1 * mu, 2.0 * (1.0 - p1) * mu)
        one_minus = p1 * t / (rates[0] + t) + (1.0 - p1) * t / (rates[1] + t)
    else:  # S = c + Exp(mean b) with b = cv / mu, c = (1 - cv) / mu
        b, c = service_cv / mu, (1.0 - service_cv) / mu
        one_minus = (t * b - math.expm1(-t * c)) / (1.0 + t * b)
    return min(1.0, one_minus * mu / t)
