"""An emulated warehouse: the independent "world" that simulated experiments run in.

Policies are never graded by their own model. In simulation, when a query
really finishes is decided here, by a processor-sharing emulation calibrated
on real DuckDB logs — not by Stage or Iconq+:

* each query of template ``t`` on a cluster of size ``s`` needs a service
  time drawn around the measured isolated latency ``ℓ(t, s)`` (median of the
  isolated executions in the log), with log-normal noise whose spread is the
  measured spread of repeated isolated runs — or, in an *empirical* world
  (``calibrate(log, demand="empirical")``), one of the log's own isolated
  executions of ``(t, s)`` drawn at random, so that the world's service
  demand is not the per-template median a latency model's exact-repeat cache
  returns (the honest grading world of ``docs/end_to_end.md``);
* while ``k`` queries run on a cluster, each progresses at rate
  ``k ** -alpha[s]`` (``alpha = 1``: perfect processor sharing; below 1,
  overlapping queries hide some of each other's waits). ``alpha`` is fitted
  per size by replaying the log's concurrent runs with their real arrivals.

:func:`calibrate` fits on part of the log's concurrent cluster runs and
reports the emulator's own Q-error on the held-out runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from sloctl.datasets.analysis import overlap_counts
from sloctl.models.metrics import q_error_summary

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CalibrationReport", "WarehouseEmulator", "calibrate", "calibrated_world", "replay_processor_sharing"]

_ALPHAS = np.round(np.arange(0.2, 1.61, 0.05), 3)


def replay_processor_sharing(arrival_s: np.ndarray, service_s: np.ndarray, alpha: float) -> np.ndarray:
    """End times of queries sharing one cluster: with k running, each advances at ``k ** -alpha``.

    Args:
        arrival_s: arrival times (any order).
        service_s: isolated latency of each query (its work at rate 1).
        alpha: interference exponent.
    """
    order = np.argsort(arrival_s, kind="stable")
    arrival = np.asarray(arrival_s, dtype=float)[order]
    remaining = np.asarray(service_s, dtype=float)[order].copy()
    end = np.empty(len(arrival))
    running: list[int] = []
    t, nxt = 0.0, 0
    while nxt < len(arrival) or running:
        rate = len(running) ** -alpha if running else 0.0
        t_done = t + min(remaining[i] for i in running) / rate if running else math.inf
        t_arr = arrival[nxt] if nxt < len(arrival) else math.inf
        t_next = min(t_done, t_arr)
        if running:
            remaining[running] -= (t_next - t) * rate
        t = t_next
        if t_arr <= t_done:
            running.append(nxt)
            nxt += 1
        else:
            finished = [i for i in running if remaining[i] <= 1e-12 * max(1.0, service_s.max())]
            finished = finished or [min(running, key=lambda i: remaining[i])]
            for i in finished:
                end[i] = t
                running.remove(i)
    out = np.empty(len(arrival))
    out[order] = end
    return out


@dataclass
class WarehouseEmulator:
    """Calibrated processor-sharing warehouse (see the module docstring).

    Attributes:
        isolated_s: ``ℓ(t, s)``, the median isolated latency per (template, size).
        alpha: interference exponent per size.
        noise_sigma: log-normal spread of a service time around ``ℓ(t, s)``.
        sizes: the sizes the calibrating log ran.
        samples_s: the isolated executions per (template, size); when set,
            each service time is one of them drawn at random (an empirical
            world, no log-normal noise on top); ``None``: ``ℓ(t, s)`` with noise.
    """

    isolated_s: dict[tuple[str, int], float]
    alpha: dict[int, float]
    noise_sigma: float = 0.0
    sizes: tuple[int, ...] = field(default=())
    samples_s: dict[tuple[str, int], tuple[float, ...]] | None = None

    @property
    def demand(self) -> str:
        """How service times are drawn: ``"empirical"`` (isolated executions) or ``"median"`` (with noise)."""
        return "median" if self.samples_s is None else "empirical"

    def service_s(self, template: str, size: int, rng: np.random.Generator | None = None) -> float:
        """A service time (isolated latency) for one execution.

        Without ``rng`` it is ``ℓ(t, s)``. With one, an empirical world draws
        one of the isolated executions of ``(t, s)``; a median world draws
        log-normal noise around ``ℓ(t, s)`` (none when ``noise_sigma`` is 0).
        """
        key = (template, int(size))
        if key not in self.isolated_s:
            known = sorted({s for _, s in self.isolated_s})
            raise KeyError(f"No isolated latency measured for template {template!r} on size {size} "
                           f"(measured sizes: {known}); collect an isolated run on that size.")
        base = self.isolated_s[key]
        samples = self.samples_s.get(key) if self.samples_s is not None else None
        if rng is not None and samples:
            return float(samples[int(rng.integers(len(samples)))])
        if rng is None or self.noise_sigma <= 0:
            return base
        return float(base * math.exp(rng.normal(0.0, self.noise_sigma)))

    def rate(self, running: int, size: int) -> float:
        """Progress rate of each of ``running`` queries on a cluster of ``size``."""
        return running ** -self.alpha[int(size)] if running > 0 else 0.0

    def templates(self) -> list[str]:
        return sorted({t for t, _ in self.isolated_s})

    def slowed(self, factor: float) -> WarehouseEmulator:
        """The same warehouse with every service time ``factor`` times longer (a machine in a slower period)."""
        if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"The 'factor' parameter of WarehouseEmulator.slowed must be > 0, got {factor!r}.")
        samples = None if self.samples_s is None else {k: tuple(x * factor for x in v)
                                                        for k, v in self.samples_s.items()}
        return replace(self, isolated_s={k: v * factor for k, v in self.isolated_s.items()},
                                   samples_s=samples)


@dataclass
class CalibrationReport:
    """How well the emulator reproduces real runs it was not fitted on."""

    alpha: dict[int, float]
    noise_sigma: float
    n_fit_runs: int
    n_heldout_runs: int
    heldout_q_error: dict[str, float]
    heldout_q_error_concurrent: dict[str, float]


def calibrate(log: pd.DataFrame, *, heldout_fraction: float = 0.5, seed: int = 0, demand: str = "median"
              ) -> tuple[WarehouseEmulator, CalibrationReport]:
    """Fit a :class:`WarehouseEmulator` to a real query log.

    Isolated latencies come from executions with no neighbour (all of them);
    ``alpha`` per size from a random ``1 - heldout_fraction`` of the log's
    cluster runs that had concurrency; the report scores the rest.

    Args:
        log: the query log (docs/querylog.md).
        heldout_fraction: share of the concurrent cluster runs kept out of
            the fit of ``alpha`` (the report's Q-error is on them).
        seed: seed of that split.
        demand: ``"median"`` (service time = median isolated latency with
            log-normal noise) or ``"empirical"`` (a random draw among the
            log's isolated executions of the template on that size; use it
            for a grading world calibrated on a log the policies never saw).
    """
    if demand not in ("median", "empirical"):
        raise ValueError(f"The 'demand' parameter of calibrate must be 'median' or 'empirical', got {demand!r}.")
    ok = log[log["status"] == "ok"].copy()
    ok["neighbours"] = overlap_counts(ok).to_numpy()
    alone = ok[ok["neighbours"] == 0]
    if alone.empty:
        raise ValueError("Calibration needs isolated executions (queries with no neighbour) in the log.")
    isolated = {(t, int(s)): float(v) for (t, s), v in
                alone.groupby(["template", "cluster_size"])["latency_s"].median().items()}
    logs = np.log(alone["latency_s"].to_numpy())
    centred = logs - alone.groupby(["template", "cluster_size"])["latency_s"].transform(
        lambda x: np.log(x).mean()).to_numpy()
    repeats = alone.groupby(["template", "cluster_size"])["latency_s"].transform("size").to_numpy() > 1
    noise = float(np.std(centred[repeats])) if repeats.any() else 0.0

    runs = [g for _, g in ok.groupby("cluster_id") if (g["neighbours"] > 0).any()]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(runs))
    n_held = int(round(len(runs) * heldout_fraction)) if len(runs) > 1 else 0
    held = [runs[i] for i in order[:n_held]]
    fit = [runs[i] for i in order[n_held:]]
    sizes = sorted(int(s) for s in ok["cluster_size"].unique())
    alpha: dict[int, float] = {}
    for size in sizes:
        mine = [g for g in fit if int(g["cluster_size"].iloc[0]) == size]
        if not mine:
            alpha[size] = 1.0
            continue
        errors = []
        for a in _ALPHAS:
            err = np.concatenate([_replay_errors(g, isolated, a) for g in mine])
            errors.append(np.median(np.abs(err)) if len(err) else np.inf)
        alpha[size] = float(_ALPHAS[int(np.argmin(errors))])
    samples = None
    if demand == "empirical":  # sorted: the same executions give the same draws, whatever the log's row order
        samples = {(t, int(s)): tuple(sorted(float(x) for x in v)) for (t, s), v in
                   alone.groupby(["template", "cluster_size"])["latency_s"]}
    emulator = WarehouseEmulator(isolated_s=isolated, alpha=alpha, noise_sigma=noise, sizes=tuple(sizes),
                                 samples_s=samples)
    predicted, actual, busy = [], [], []
    for g in held:
        size = int(g["cluster_size"].iloc[0])
        pred = _replay(g, isolated, alpha.get(size, 1.0))
        keep = np.isfinite(pred)
        predicted.append(pred[keep])
        actual.append(g["latency_s"].to_numpy()[keep])
        busy.append(g["neighbours"].to_numpy()[keep] > 0)
    if held:
        p, a, b = np.concatenate(predicted), np.concatenate(actual), np.concatenate(busy)
        all_q, conc_q = q_error_summary(p, a), q_error_summary(p[b], a[b])
    else:
        all_q = conc_q = q_error_summary(np.empty(0), np.empty(0))
    report = CalibrationReport(alpha=alpha, noise_sigma=noise, n_fit_runs=len(fit), n_heldout_runs=len(held),
                               heldout_q_error=all_q, heldout_q_error_concurrent=conc_q)
    return emulator, report


def _replay(run: pd.DataFrame, isolated: dict[tuple[str, int], float], alpha: float) -> np.ndarray:
    size = int(run["cluster_size"].iloc[0])
    service = np.array([isolated.get((t, size), np.nan) for t in run["template"]])
    known = np.isfinite(service)
    out = np.full(len(run), np.nan)
    if known.any():
        arrival = run["arrival_s"].to_numpy()[known]
        out[known] = replay_processor_sharing(arrival, service[known], alpha) - arrival
    return out


def _replay_errors(run: pd.DataFrame, isolated: dict[tuple[str, int], float], alpha: float) -> np.ndarray:
    pred = _replay(run, isolated, alpha)
    keep = np.isfinite(pred) & (run["neighbours"].to_numpy() > 0)
    return np.log(np.maximum(pred[keep], 1e-6) / run["latency_s"].to_numpy()[keep])


def calibrated_world(log: pd.DataFrame, sizes: set[int], seed: int, demand: str = "median"):
    """The emulated warehouse of ``log`` and what a simulated day over it needs.

    ``demand`` is :func:`calibrate`'s: ``median`` or ``empirical`` service times.

    Returns:
        ``(world, report, slo_ref, templates, mean_iso, table)``: the
        calibrated :class:`WarehouseEmulator` and its :class:`CalibrationReport`;
        SLO references (isolated medians on the smallest size); the templates
        with isolated runs on every size of ``sizes``; their mean isolated
        latency on the smallest size (the time unit of scaled scenarios); and
        one feature row per template.

    Raises:
        ValueError: no template has isolated runs on every size.
    """
    from sloctl.datasets.slo import slo_baselines

    world, report = calibrate(log, seed=seed, demand=demand)
    sizes = sorted(sizes)
    slo_ref = slo_baselines(log, min(sizes))
    templates = [t for t in world.templates() if t in slo_ref and all((t, s) in world.isolated_s for s in sizes)]
    if not templates:
        raise ValueError(f"The log has no template with isolated runs on every size {sizes}.")
    mean_iso = float(np.mean([world.isolated_s[(t, min(sizes))] for t in templates]))
    table = log.drop_duplicates("template").set_index("template", drop=False).loc[templates].reset_index(drop=True)
    return world, report, slo_ref, templates, mean_iso, table
