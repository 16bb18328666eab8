"""DiffTry analysis: per-class retry limits at one service and across a service network.

Implements the approximation of "Prioritizing Microservice Requests via
Retries" (DiffTry): §IV for one service (fluid, M/M/1/m and mixed rejection
functions, residual-time correction), §VI for networks (topological pass on a
DAG, fixed-point iteration otherwise, uniqueness conditions, completion
probability). Notation follows the paper: ``lam[p, i]`` originals of class
``p`` offered to service ``i``, ``Lam`` attempts, ``s_bar`` the per-attempt
rejection, ``a`` the end rejection, ``k_p`` retries, ``gamma`` external
arrivals, ``F`` routing. The network file is described in ``docs/retry.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sloctl.models._retry_phi import MODELS, attempts_and_rejection, check_model, residual_alpha, solve_s_bar
from sloctl.models._retry_phi import phi as _phi
from sloctl.models.retry_network import NetworkError, NetworkSpec

__all__ = [
    "MODELS",
    "NetworkSolution",
    "SingleServiceSolution",
    "offered_rho",
    "phi",
    "residual_alpha",
    "scale_to_load",
    "solve_network",
    "solve_single_service",
    "uniqueness_report",
]

Method = Literal["auto", "topological", "iterate"]


def phi(model: str, rho, m) -> np.ndarray:
    """Per-attempt rejection probability at utilisation ``rho`` with buffer ``m`` (§IV.A-B), vectorised.

    Args:
        model: ``fluid`` (``max(0, 1 - 1/rho)``), ``mm1m`` (exact M/M/1/m
            blocking, stable for large ``rho`` and ``m``) or ``mixed`` (M/M/1/m
            for ``rho <= 1``, ``max(1 - 1/rho, 1/(m+1))`` above: the fluid form
            bounded below by the M/M/1/m rejection at ``rho = 1``; continuous at
            1, nondecreasing, equal to the fluid model once ``rho >= (m+1)/m``,
            tends to 1).
        rho: utilisation(s) >= 0.
        m: buffer(s), counting the attempt in service; broadcast against ``rho``.

    Returns:
        Rejection probabilities in [0, 1), shaped like ``rho`` broadcast with ``m``.
    """
    rho_arr = np.asarray(rho, dtype=float)
    if np.any(~(rho_arr >= 0)) or np.any(~np.isfinite(rho_arr)):
        raise ValueError(f"The 'rho' parameter must be finite and >= 0, got {rho!r}.")
    return _phi(model, rho_arr, m)


# -- one service ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SingleServiceSolution:
    """DiffTry at one service (§IV.C); arrays are per class, in the order of ``classes``."""

    classes: tuple[str, ...]
    s_bar: float  # per-attempt rejection
    rho: float  # attempts / capacity
    end_rejection: np.ndarray  # a_p = s^(k_p+1) (or s s_r^k_p)
    success_per_s: np.ndarray  # E_p = lam_p (1 - a_p)
    attempts_per_s: np.ndarray  # Lam_p


def solve_single_service(lam_p, k_p, mu: float, m: int, model: str = "mixed", *,
                         alpha: float | None = None) -> SingleServiceSolution:
    """Solve one service with classes of originals ``lam_p`` and retry limits ``k_p`` (§IV).

    Args:
        lam_p: originals per second per class, a mapping ``{class: rate}`` or a sequence.
        k_p: retries per class: a mapping with the same keys, a sequence, or one int for all.
        mu: capacity (attempts served per second) > 0.
        m: buffer >= 1, counting the attempt in service.
        model: the rejection function, see :func:`phi`.
        alpha: residual-time correction (§IV.D), the probability that a retry
            finds the blocking job gone; ``None`` treats attempts as independent.

    Returns:
        The least fixed point ``s_bar = phi(sum_p Lam_p(s_bar) / mu)`` and the per-class rates.
    """
    check_model(model)
    if isinstance(lam_p, Mapping):
        classes = tuple(str(c) for c in lam_p)
        lam = np.array([float(lam_p[c]) for c in lam_p])
        if isinstance(k_p, Mapping):
            missing = [c for c in lam_p if c not in k_p]
            if missing:
                raise ValueError(f"The 'k_p' parameter has no retry limit for class {missing[0]!r}.")
            k_p = [k_p[c] for c in lam_p]
    else:
        lam = np.atleast_1d(np.asarray(lam_p, dtype=float))
        classes = tuple(str(i) for i in range(lam.size))
    k = np.broadcast_to(np.asarray(k_p), lam.shape) if np.ndim(k_p) == 0 else np.asarray(k_p)
    _check_rates(lam, "lam_p")
    if k.shape != lam.shape or not np.issubdtype(k.dtype, np.integer) or np.any(k < 0):
        raise ValueError(f"The 'k_p' parameter must hold one whole number >= 0 per class, got {k_p!r}.")
    if not (np.isfinite(mu) and mu > 0):
        raise ValueError(f"The 'mu' parameter must be > 0, got {mu!r}.")
    if not (int(m) == m and m >= 1):
        raise ValueError(f"The 'm' parameter must be a whole number >= 1, got {m!r}.")
    alpha_arr = None if alpha is None else np.array([_check_alpha(alpha)])
    lam2, k2 = lam[:, None], k.astype(int)[:, None]
    s = solve_s_bar(lam2, k2, np.array([float(mu)]), np.array([float(m)]), model, alpha_arr)
    attempts, a = attempts_and_rejection(lam2, k2, s, alpha_arr)
    return SingleServiceSolution(classes=classes, s_bar=float(s[0]), rho=float(attempts.sum() / mu),
                                 end_rejection=a[:, 0], success_per_s=lam * (1.0 - a[:, 0]),
                                 attempts_per_s=attempts[:, 0])


# -- networks ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NetworkSolution:
    """DiffTry on a service network (§VI). Arrays are (P, N): classes x services, in spec order."""

    model: str
    classes: tuple[str, ...]
    services: tuple[str, ...]
    offered: np.ndarray  # lam: originals offered per second
    attempts: np.ndarray  # Lam: originals + retries per second
    final_rejection: np.ndarray  # a: a call's end rejection at that hop
    attempt_rejection: np.ndarray  # s_bar, (N,)
    utilisation: np.ndarray  # rho, (N,)
    completion: np.ndarray  # C_p[i]: a call entering i completes with all it triggers
    class_completion: np.ndarray  # (P,): gamma-weighted C_p
    class_success_per_s: np.ndarray  # (P,): Gamma_p = sum_i lam (1 - a), network-wide successes
    class_completed_per_s: np.ndarray  # (P,): sum_i gamma C_p, requests completed end to end
    converged: bool
    iterations: int
    uniqueness: Mapping[str, Any]
    offered_rho: float
    requests: Mapping[str, tuple[str, float]] = field(default_factory=dict)  # name -> (class, completion)
    alpha: np.ndarray | None = None  # residual correction per service, None if independent

    @property
    def accepted(self) -> np.ndarray:
        """Originals that succeed at each hop per second, lam (1 - a), (P, N)."""
        return self.offered * (1.0 - self.final_rejection)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (plain floats; NaN, for a class without arrivals, becomes None)."""
        accepted = self.accepted
        services = {
            svc: {c: {"offered_per_s": _num(self.offered[p, i]), "attempts_per_s": _num(self.attempts[p, i]),
                      "accepted_per_s": _num(accepted[p, i]),
                      "attempt_rejection": _num(self.attempt_rejection[i]),
                      "final_rejection": _num(self.final_rejection[p, i])}
                  for p, c in enumerate(self.classes)}
            for i, svc in enumerate(self.services)}
        return {
            "model": self.model,
            "classes": {c: {"completion_probability": _num(self.class_completion[p]),
                            "end_to_end_rejection": _num(1.0 - self.class_completion[p]),
                            "success_per_s": _num(self.class_completed_per_s[p]),
                            "calls_succeeded_per_s": _num(self.class_success_per_s[p])}
                        for p, c in enumerate(self.classes)},
            "services": services,
            "utilisation": {svc: _num(self.utilisation[i]) for i, svc in enumerate(self.services)},
            "requests": {name: {"class": klass, "completion_probability": _num(prob)}
                         for name, (klass, prob) in self.requests.items()},
            "converged": bool(self.converged),
            "iterations": int(self.iterations),
            "uniqueness": dict(self.uniqueness),
            "offered_rho": _num(self.offered_rho),
        }


def solve_network(spec: NetworkSpec, model: str = "mixed", *, residual: bool = False,
                  alpha: float | Mapping[str, float] | None = None, tol: float = 1e-10, max_iter: int = 10_000,
                  method: Method = "auto", order_key: Callable[[int], Any] | None = None) -> NetworkSolution:
    """Solve the DiffTry flow equations on a network (§VI.B-D) and derive completion probabilities (§VI.F).

    ``lam[p, i] = gamma[p, i] + sum_j F_p[j, i] lam[p, j] (1 - a[p, j])`` with
    ``a`` and ``s_bar`` from the single-service fixed point at each service.

    Args:
        spec: the validated network.
        model: the rejection function, see :func:`phi`.
        residual: apply the residual-time correction (§IV.D) with ``alpha`` from
            each service's ``service_cv`` and ``spec.effective_retry_delay_s``.
        alpha: an explicit correction instead, one value or ``{service: value}``;
            implies ``residual``.
        tol: stop iterating when no ``lam`` moves by more than ``tol * max(1, max lam)``.
        max_iter: iteration cap; a run that hits it is returned with ``converged=False``.
        method: ``auto`` (one topological pass on a DAG, iteration otherwise),
            ``topological`` (DAG only) or ``iterate`` (iteration from ``gamma`` on any network).
        order_key: sort key for the ready services of ``spec.topological_order``;
            the result does not depend on it (§VI.C), which tests check.

    Raises:
        ValueError: a bad ``model``, ``method``, ``tol``, ``max_iter`` or ``alpha``.
        NetworkError: ``method="topological"`` on a network with a cycle.
    """
    check_model(model)
    if method not in ("auto", "topological", "iterate"):
        raise ValueError(f"The 'method' parameter must be one of auto, topological, iterate, got {method!r}.")
    if not (tol > 0):
        raise ValueError(f"The 'tol' parameter must be > 0, got {tol!r}.")
    if not (isinstance(max_iter, int) and max_iter >= 1):
        raise ValueError(f"The 'max_iter' parameter must be a whole number >= 1, got {max_iter!r}.")
    alpha_arr = _alpha_vector(spec, residual, alpha)
    gamma, F, K = _arrays(spec)
    mu, m = spec.capacity, spec.buffer
    order = spec.topological_order(key=order_key)
    if method == "topological" and order is None:
        raise NetworkError("solve_network: method 'topological' needs a DAG, but the routing graph has a cycle.")

    def local(lam, idx=slice(None)):  # the single-service fixed point at services idx
        al = None if alpha_arr is None else alpha_arr[idx]
        s = solve_s_bar(lam, K[:, idx], mu[idx], m[idx], model, al)
        attempts, a = attempts_and_rejection(lam, K[:, idx], s, al)
        return s, attempts, a

    if order is not None and method != "iterate":
        lam = gamma.copy()
        for level in _levels(order, F):
            _, _, a = local(lam[:, level], level)
            out = lam[:, level] * (1.0 - a)
            lam = lam + np.einsum("pb,pbn->pn", out, F[:, level, :])  # flows only reach later levels
        iterations, converged = 1, True
    else:
        lam, iterations, converged = gamma.copy(), 0, False
        while iterations < max_iter:
            iterations += 1
            _, _, a = local(lam)
            new = gamma + np.einsum("pj,pji->pi", lam * (1.0 - a), F)
            step = float(np.max(np.abs(new - lam))) if new.size else 0.0
            lam = new
            if step <= tol * max(1.0, float(np.max(lam, initial=0.0))):
                converged = True
                break
    s, attempts, a = local(lam)
    sigma = 1.0 - a
    completion = _completion(spec, F, sigma, tol, max_iter)
    total = gamma.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        class_completion = np.where(total > 0, (gamma * completion).sum(axis=1) / total, np.nan)
    requests = {}
    for req in spec.requests:
        p = spec.classes.index(req.klass)
        requests[req.name] = (req.klass, float(np.prod([sigma[p, spec.index(svc)] for svc in req.path])))
    return NetworkSolution(
        model=model, classes=tuple(spec.classes), services=spec.service_names, offered=lam, attempts=attempts,
        final_rejection=a, attempt_rejection=s, utilisation=attempts.sum(axis=0) / mu, completion=completion,
        class_completion=class_completion, class_success_per_s=(lam * sigma).sum(axis=1),
        class_completed_per_s=(gamma * completion).sum(axis=1), converged=converged,
        iterations=iterations, uniqueness=_uniqueness(F, order is not None), offered_rho=_offered_rho(gamma, F, mu),
        requests=requests, alpha=alpha_arr)


def scale_to_load(spec: NetworkSpec, rho: float) -> NetworkSpec:
    """``spec`` with every class's external arrivals scaled by one factor so that :func:`offered_rho` is ``rho``.

    The offered load is linear in the arrivals (``lam0 = gamma (I - F)^-1``),
    so the factor is ``rho / offered_rho(spec)`` and the class mix is kept.

    Raises:
        ValueError: ``rho`` is not positive, or the network has no arrivals to scale.
    """
    if isinstance(rho, bool) or not isinstance(rho, int | float) or not (0 < rho < math.inf):
        raise ValueError(f"The 'rho' parameter must be a bottleneck load > 0 (1 = saturated), got {rho!r}.")
    now = offered_rho(spec)
    if not now > 0:
        raise ValueError("The network has no external arrivals, so its load cannot be scaled to "
                         f"rho = {rho:g}; give some class an 'arrivals' rate.")
    factor = rho / now
    return spec.scale_arrivals(dict.fromkeys(spec.classes, factor))


def offered_rho(spec: NetworkSpec) -> float:
    """Bottleneck utilisation of the standard flow (§VI.A): no losses, no retries.

    ``max_i sum_p lam0[p, i] / mu_i`` with ``lam0 = gamma (I - F)^-1`` per class.
    """
    gamma, F, _ = _arrays(spec)
    return _offered_rho(gamma, F, spec.capacity)


def _offered_rho(gamma: np.ndarray, F: np.ndarray, mu: np.ndarray) -> float:
    lam0 = np.stack([_solve_sparse(np.eye(len(mu)) - F[p].T, gamma[p]) for p in range(len(gamma))])
    return float(np.max(lam0.sum(axis=0) / mu))


def _solve_sparse(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solve ``A x = b`` for a routing-shaped (mostly zero) ``A``; SuperLU beats dense LAPACK here."""
    from scipy.sparse import csc_array
    from scipy.sparse.linalg import spsolve

    return np.atleast_1d(spsolve(csc_array(A), b))


def uniqueness_report(spec: NetworkSpec) -> dict[str, Any]:
    """Which sufficient conditions for a unique solution hold (§VI.C, §VI.E).

    ``dag``: the union routing graph has no cycle (one pass, unique).
    ``norm_condition``: ``max_p ||F_p||_inf < 1/(P-1)`` (always true for one class).
    ``class_independent_P_le_2``: at most two classes, all with the same
    routing matrix, of spectral radius below 1.
    """
    _, F, _ = _arrays(spec)
    return _uniqueness(F, spec.is_dag())


def _uniqueness(F: np.ndarray, dag: bool) -> dict[str, Any]:
    n_classes = F.shape[0]
    norm = float(np.max(F.sum(axis=2), initial=0.0))
    norm_ok = n_classes == 1 or norm < 1.0 / (n_classes - 1)
    same = all(np.array_equal(F[0], F[p]) for p in range(1, n_classes))
    independent_ok = n_classes <= 2 and same and (dag or float(np.max(np.abs(np.linalg.eigvals(F[0])))) < 1.0)
    guaranteed = dag or norm_ok or independent_ok
    if dag:
        note = "DAG: a single topological pass gives the only solution."
    elif norm_ok or independent_ok:
        which = "||F||_inf < 1/(P-1)" if norm_ok else "class-independent routing with P <= 2"
        note = f"cyclic, but {which} holds, so the fixed point is unique."
    else:
        note = (f"cyclic and neither sufficient condition holds (P={n_classes}, ||F||_inf={norm:.3g}); "
                "uniqueness is not proven, though no second solution has been observed numerically.")
    return {"dag": dag, "norm_condition": bool(norm_ok), "class_independent_P_le_2": bool(independent_ok),
            "guaranteed": bool(guaranteed), "note": note}


# -- helpers -----------------------------------------------------------------------------------
def _arrays(spec: NetworkSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gamma (P, N), F (P, N, N) and K (P, N); F is built with a name index (spec.routing_matrix scans names)."""
    index = {name: i for i, name in enumerate(spec.service_names)}
    n = len(index)
    gamma = np.stack([spec.external(c) for c in spec.classes])
    F = np.zeros((len(spec.classes), n, n))
    for p, klass in enumerate(spec.classes):
        for src, row in spec.routing.get(klass, {}).items():
            for dst, w in row.items():
                F[p, index[src], index[dst]] = w
    K = np.stack([spec.retry_vector(c) for c in spec.classes])
    return gamma, F, K


def _levels(order: Sequence[int], F: np.ndarray) -> list[np.ndarray]:
    """Split a topological order into levels: a service's callers all lie in earlier levels."""
    callers = F.any(axis=0)  # (N, N): callers[j, i] means j calls i for some class
    depth = np.zeros(len(order), dtype=int)
    for i in order:
        pred = np.flatnonzero(callers[:, i])
        depth[i] = 1 + depth[pred].max() if pred.size else 0
    position = {i: pos for pos, i in enumerate(order)}
    return [np.array(sorted(np.flatnonzero(depth == d), key=position.__getitem__))
            for d in range(int(depth.max(initial=-1)) + 1)]


def _completion(spec: NetworkSpec, F: np.ndarray, sigma: np.ndarray, tol: float, max_iter: int) -> np.ndarray:
    """C_p[i], the probability that a call entering i completes end to end (§VI.F), (P, N)."""
    n = sigma.shape[1]
    out = np.empty_like(sigma)
    for p in range(sigma.shape[0]):
        if spec.routing_mode == "exclusive":  # C = sigma (L + F C): leave with L, else move on once
            leave = 1.0 - F[p].sum(axis=1)
            c = _solve_sparse(np.eye(n) - sigma[p][:, None] * F[p], sigma[p] * leave)
            out[p] = np.clip(c, 0.0, 1.0)  # the solve may round a certain completion to 1 + 1e-16
            continue
        src, dst = np.nonzero(F[p])  # each edge draws floor(w) calls, plus one with probability frac(w)
        whole, frac = np.floor(F[p, src, dst]), F[p, src, dst] - np.floor(F[p, src, dst])
        c = np.ones(n)
        for _ in range(max_iter):  # from C = 1: exact after depth + 1 steps on a DAG, monotone otherwise
            with np.errstate(divide="ignore"):
                logs = whole * np.log(c[dst]) + np.log1p(-frac * (1.0 - c[dst]))
            new = sigma[p] * np.exp(np.bincount(src, weights=logs, minlength=n))
            done = np.max(np.abs(new - c)) <= tol * 1e-3
            c = new
            if done:
                break
        out[p] = c
    return out


def _alpha_vector(spec: NetworkSpec, residual: bool, alpha) -> np.ndarray | None:
    names = spec.service_names
    if alpha is not None:
        if isinstance(alpha, Mapping):
            unknown = [s for s in alpha if s not in names]
            if unknown:
                raise ValueError(f"The 'alpha' parameter names unknown service {unknown[0]!r}.")
            return np.array([_check_alpha(alpha.get(s, 1.0)) for s in names])
        return np.full(len(names), _check_alpha(alpha))
    if not residual:
        return None
    delay = spec.effective_retry_delay_s
    return np.array([residual_alpha(s.capacity_per_s, delay, s.service_cv) for s in spec.services])


def _check_alpha(alpha) -> float:
    if not (isinstance(alpha, int | float) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"The 'alpha' parameter must be a probability in [0, 1], got {alpha!r}.")
    return float(alpha)


def _check_rates(lam: np.ndarray, name: str) -> None:
    if lam.size == 0 or np.any(~np.isfinite(lam)) or np.any(lam < 0):
        raise ValueError(f"The '{name}' parameter must hold finite rates >= 0 per second, got {lam.tolist()!r}.")


def _num(x) -> float | None:
    x = float(x)
    return None if np.isnan(x) else x
