"""Following the machine's drift: predicted against observed latency, calibrated online.

A latency model is trained on a log from one period of the machine; in a later
period (noisy neighbours, grown data, another CPU budget) every query may run
1.3-1.5 x slower than it predicts, and the router's margin, the spin-up
trigger's projections and the size selector's what-if runs all trust it.
:class:`DriftCalibration` keeps, per cluster size, the ratios observed /
predicted of the queries that completed in a sliding window (seconds, and at
most ``max_observations``) and answers a factor: the exponential of their
median log ratio, from the size's own observations once there are
``min_observations``, else from every size's, else 1; clipped to
``factor_bounds``. The median is robust to the few queries a model misjudges
for other reasons; the window lets the factor follow a change within the day.

:class:`DriftCalibratedPredictor` wraps an
:class:`~sloctl.models.online.OnlinePredictor` so that every prediction it
gives (the router's counterfactuals, the running queries the trigger projects
and the size selector replays, Stage's isolated estimate) is multiplied by
its cluster size's factor, while the model itself stays as trained. Forks
(the size selector's what-if runs) take a frozen copy of the calibration:
a simulated completion never teaches it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["DriftCalibratedPredictor", "DriftCalibration"]


@dataclass
class DriftCalibration:
    """Per-size factors observed / predicted over a sliding window of completions.

    Args:
        window_s: completions older than this (behind the newest one) are forgotten.
        min_observations: completions a size needs before its own factor is used.
        max_observations: the most completions kept per size.
        factor_bounds: the factor is clipped to this range.
        frozen: observations are ignored (a what-if copy).
    """

    window_s: float = 1800.0
    min_observations: int = 20
    max_observations: int = 2000
    factor_bounds: tuple[float, float] = (0.25, 4.0)
    frozen: bool = False
    _obs: dict[int, deque] = field(default_factory=dict, init=False, repr=False)
    _cache: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"The 'window_s' parameter of DriftCalibration must be > 0, got {self.window_s!r}.")
        if isinstance(self.min_observations, bool) or not isinstance(self.min_observations, int) \
                or self.min_observations < 1:
            raise ValueError(f"The 'min_observations' parameter of DriftCalibration must be a whole number >= 1, "
                             f"got {self.min_observations!r}.")
        if not self.max_observations >= self.min_observations:
            raise ValueError(f"The 'max_observations' parameter of DriftCalibration must be >= min_observations "
                             f"({self.min_observations}), got {self.max_observations!r}.")
        low, high = self.factor_bounds
        if not 0 < low <= 1 <= high:
            raise ValueError(f"The 'factor_bounds' parameter of DriftCalibration must be (low, high) with "
                             f"0 < low <= 1 <= high, got {self.factor_bounds!r}.")

    def observe(self, size: int, end_s: float, observed_s: float, predicted_s: float) -> None:
        """A query on a cluster of ``size`` ended at ``end_s`` after ``observed_s``, predicted ``predicted_s``."""
        if self.frozen or not (observed_s > 0 and predicted_s > 0) or not math.isfinite(observed_s / predicted_s):
            return
        rows = self._obs.setdefault(int(size), deque(maxlen=self.max_observations))
        rows.append((float(end_s), math.log(observed_s / predicted_s)))
        for other in self._obs.values():  # one clock for every size: the window trails the newest completion
            while other and other[0][0] < end_s - self.window_s:
                other.popleft()
        self._cache.clear()

    def _median_factor(self, logs: list[float]) -> float:
        low, high = self.factor_bounds
        return float(min(max(math.exp(float(np.median(logs))), low), high))

    def factor(self, size: int) -> float:
        """The multiplier for predictions on a cluster of ``size`` (1 until enough completions are seen)."""
        size = int(size)
        if size in self._cache:
            return self._cache[size]
        own = [r for _, r in self._obs.get(size, ())]
        if len(own) >= self.min_observations:
            value = self._median_factor(own)
        else:
            pooled = [r for rows in self._obs.values() for _, r in rows]
            value = self._median_factor(pooled) if len(pooled) >= self.min_observations else 1.0
        self._cache[size] = value
        return value

    def snapshot(self) -> DriftCalibration:
        """A frozen copy (what-if runs read it; their simulated completions do not change it)."""
        twin = replace(self, frozen=True)
        twin._obs = {k: deque(v, maxlen=self.max_observations) for k, v in self._obs.items()}
        return twin

    def fresh(self) -> DriftCalibration:
        """The same settings with nothing observed (one per simulated or served day)."""
        return replace(self)

    def state(self) -> dict[str, Any]:
        """The calibration as JSON: per size the factor in use and the completions it rests on."""
        pooled = [r for rows in self._obs.values() for _, r in rows]
        return {"window_s": self.window_s, "min_observations": self.min_observations,
                "sizes": {str(size): {"factor": self.factor(size), "observations": len(rows),
                                      "own": len(rows) >= self.min_observations}
                          for size, rows in sorted(self._obs.items())},
                "pooled": {"factor": self._median_factor(pooled) if pooled else 1.0, "observations": len(pooled)}}


class _ScaledRow:
    """A running query's row as the calibrated predictor shows it: ``predicted_s`` × ``factor``, the rest the row's.

    A read-only view, not a copy: the Workload Simulator asks for every
    running query at every simulated event, and copying each row
    (``dataclasses.replace``) took most of a what-if's time under a backlog.
    """

    __slots__ = ("_factor", "_row")

    def __init__(self, row: Any, factor: float) -> None:
        self._row = row
        self._factor = factor

    @property
    def predicted_s(self) -> float:
        return self._row.predicted_s * self._factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._row, name)


class DriftCalibratedPredictor:
    """An online predictor whose every answer is multiplied by the calibration's factor for its cluster size.

    Everything else (``templates``, ``predictor``, ``use_iconq``, ...) is the
    wrapped model's. :meth:`observe_completion` (called by the routers when a
    query ends, before :meth:`complete`) feeds the calibration with the
    wrapped model's own latest prediction, so the factor measures the model,
    not itself.
    """

    def __init__(self, model: Any, calibration: DriftCalibration | None = None) -> None:
        self.model = model
        self.calibration = calibration if calibration is not None else DriftCalibration()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["model"], name)

    def fork(self) -> DriftCalibratedPredictor:
        return DriftCalibratedPredictor(self.model.fork(), self.calibration.snapshot())

    def _scaled(self, row: Any) -> Any:
        factor = self.calibration.factor(row.size)
        return row if factor == 1.0 else _ScaledRow(row, factor)

    @property
    def running(self) -> dict[int, Any]:
        return {k: self._scaled(r) for k, r in self.model.running.items()}

    def running_on(self, cluster_id: str) -> list[Any]:
        return [self._scaled(r) for r in self.model.running_on(cluster_id)]

    def isolated_s(self, template: str, size: int) -> float:
        return self.model.isolated_s(template, size) * self.calibration.factor(size)

    def counterfactuals(self, template: str, arrival_s: float, clusters: dict[str, int], now_s: float
                        ) -> dict[str, Any]:
        out = self.model.counterfactuals(template, arrival_s, clusters, now_s)
        for cid, cf in out.items():
            f = self.calibration.factor(clusters[cid])
            out[cid] = replace(cf, query_s=cf.query_s * f, running_before_s=cf.running_before_s * f,
                               running_after_s=cf.running_after_s * f)
        return out

    def commit(self, query_id: int, template: str, arrival_s: float, slo_s: float, cluster_id: str, size: int,
               now_s: float) -> float:
        raw = self.model.commit(query_id, template, arrival_s, slo_s, cluster_id, size, now_s)
        return raw * self.calibration.factor(size)

    def observe_completion(self, query_id: int, end_s: float) -> None:
        """Feed the calibration with a finished query (its latency against the model's latest prediction)."""
        row = self.model.running.get(query_id)
        if row is not None:
            self.calibration.observe(row.size, end_s, end_s - row.arrival_s, row.predicted_s)

    def complete(self, query_id: int) -> None:
        self.model.complete(query_id)
