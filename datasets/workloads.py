"""Seeded workloads: which query templates arrive, and when.

* :func:`base_workload` — AutoSLO's BaseWorkload(λ) (§8.1.2): ``copies`` of
  every template, shuffled, issued by a Poisson process of rate λ.
* :func:`phased_workload` — the "phased" training runs of §8.3.2: the same
  shuffled queries, alternating ``low_count`` arrivals at a low rate with
  ``high_count`` arrivals at a high rate.
* :func:`isolated_workload` — one query at a time (concurrency 1): each
  arrives when the previous one finishes. Gives each template's isolated
  latency, the baseline Stage trains on.
* :func:`contour_workload` — arrival rate follows hourly query counts (e.g.
  the Redset serverless trace), time-compressed by an explicit factor.

Every function takes a seed; the same seed gives the same templates in the
same order at the same arrival times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.core.errors import WorkloadError

if TYPE_CHECKING:
    import numpy as np

    from sloctl.core.config import WorkloadConfig
    from sloctl.datasets.tpc import Template

__all__ = [
    "Workload",
    "WorkloadQuery",
    "base_workload",
    "build_workload",
    "contour_workload",
    "hourly_counts",
    "isolated_workload",
    "phased_workload",
]


@dataclass(frozen=True)
class WorkloadQuery:
    """One arrival: a template and when it arrives (seconds from the run start)."""

    template: str
    sql: str
    arrival_s: float


@dataclass(frozen=True)
class Workload:
    """An ordered list of arrivals.

    Attributes:
        name: the kind of workload (``base``, ``phased``, ...).
        queries: arrivals in time order.
        concurrency_limit: at most this many queries in flight (``None``: open
            loop); a query waits for a free slot and its arrival is then the
            moment it was issued.
        time_compression: real seconds represented by one workload second.
        params: the parameters that built it (recorded with every log).
    """

    name: str
    queries: tuple[WorkloadQuery, ...]
    concurrency_limit: int | None = None
    time_compression: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.queries)

    @property
    def duration_s(self) -> float:
        """Arrival time of the last query (0 for closed-loop workloads)."""
        return self.queries[-1].arrival_s if self.queries else 0.0


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise WorkloadError(f"The '{name}' parameter must be a finite number > 0, got {value!r}.")


def _count(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkloadError(f"The '{name}' parameter must be an integer >= {minimum}, got {value!r}.")


def _shuffled(templates: list[Template], copies: int, rng: np.random.Generator) -> list[Template]:
    if not templates:
        raise WorkloadError("The 'templates' parameter must hold at least one template, got none.")
    _count("copies", copies)
    pool = [t for t in templates for _ in range(copies)]
    order = rng.permutation(len(pool))
    return [pool[i] for i in order]


def base_workload(templates: list[Template], rate_per_s: float, copies: int = 3,
                  seed: int = 0) -> Workload:
    """BaseWorkload(λ): ``copies`` of each template, shuffled, Poisson arrivals."""
    import numpy as np

    _positive("rate_per_s", rate_per_s)
    rng = np.random.default_rng(seed)
    chosen = _shuffled(templates, copies, rng)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, size=len(chosen)))
    arrivals -= arrivals[0]  # the first query arrives at time 0
    return Workload(
        name="base",
        queries=tuple(WorkloadQuery(t.name, t.sql, float(a)) for t, a in zip(chosen, arrivals, strict=False)),
        params={"rate_per_s": rate_per_s, "copies": copies, "seed": seed},
    )


def phased_workload(templates: list[Template], copies: int = 3, *, low_rate_per_s: float,
                    high_rate_per_s: float, low_count: int, high_count: int,
                    seed: int = 0) -> Workload:
    """Alternate ``low_count`` arrivals at the low rate with ``high_count`` at the high rate."""
    import numpy as np

    _positive("low_rate_per_s", low_rate_per_s)
    _positive("high_rate_per_s", high_rate_per_s)
    _count("low_count", low_count)
    _count("high_count", high_count)
    rng = np.random.default_rng(seed)
    chosen = _shuffled(templates, copies, rng)
    period = low_count + high_count
    rates = np.array([low_rate_per_s if i % period < low_count else high_rate_per_s
                      for i in range(len(chosen))])
    gaps = rng.exponential(1.0, size=len(chosen)) / rates
    gaps[0] = 0.0
    arrivals = np.cumsum(gaps)
    return Workload(
        name="phased",
        queries=tuple(WorkloadQuery(t.name, t.sql, float(a)) for t, a in zip(chosen, arrivals, strict=False)),
        params={"copies": copies, "low_rate_per_s": low_rate_per_s,
                "high_rate_per_s": high_rate_per_s, "low_count": low_count,
                "high_count": high_count, "seed": seed},
    )


def isolated_workload(templates: list[Template], copies: int = 1, seed: int = 0) -> Workload:
    """Every template ``copies`` times, one at a time (concurrency 1)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    chosen = _shuffled(templates, copies, rng)
    return Workload(
        name="isolated",
        queries=tuple(WorkloadQuery(t.name, t.sql, 0.0) for t in chosen),
        concurrency_limit=1,
        params={"copies": copies, "seed": seed},
    )


def hourly_counts(path: str | Path | None = None, *, instance: int = -1, hours: int = 24,
                  seed: int = 0) -> np.ndarray:
    """Hourly query counts to drive a contour workload.

    Args:
        path: Parquet with ``instance_id``, ``timestamp`` and ``query_count``
            (the Redset hourly layout). ``None`` or a missing file gives a
            synthetic daily contour (busy days, quiet nights), seeded.
        instance: the ``instance_id`` to follow; -1 picks the busiest.
        hours: how many consecutive hours to return.
        seed: seed of the synthetic contour.
    """
    import numpy as np

    _count("hours", hours)
    if path is None or not Path(path).is_file():
        rng = np.random.default_rng(seed)
        hour = np.arange(hours)
        shape = 1.0 + 0.8 * np.sin(2 * np.pi * (hour - 9) / 24.0)
        return rng.poisson(200.0 * shape).astype(float)
    import pandas as pd

    df = pd.read_parquet(path)
    for column in ("instance_id", "timestamp", "query_count"):
        if column not in df.columns:
            raise WorkloadError(f"{path}: missing column '{column}' for an hourly contour.")
    if instance == -1:
        instance = int(df.groupby("instance_id")["query_count"].sum().idxmax())
    rows = df[df["instance_id"] == instance]
    if rows.empty:
        raise WorkloadError(f"{path}: no rows for 'contour_instance' {instance}.")
    series = rows.assign(ts=pd.to_datetime(rows["timestamp"])).set_index("ts")["query_count"]
    series = series.groupby(level=0).sum().asfreq("h", fill_value=0)
    return series.iloc[:hours].to_numpy(dtype=float)


def contour_workload(templates: list[Template], counts: np.ndarray, *,
                     time_compression: float = 3600.0, count_scale: float = 1.0,
                     seed: int = 0) -> Workload:
    """Arrivals whose hourly rate follows ``counts``, compressed in time.

    Hour ``h`` holds Poisson(``count_scale`` × counts[h]) arrivals spread
    uniformly over it (a non-homogeneous Poisson process with a piecewise
    constant rate); templates are drawn uniformly. One real hour lasts
    ``3600 / time_compression`` workload seconds.
    """
    import numpy as np

    _positive("time_compression", time_compression)
    _positive("count_scale", count_scale)
    if not templates:
        raise WorkloadError("The 'templates' parameter must hold at least one template, got none.")
    counts = np.asarray(counts, dtype=float)
    if counts.ndim != 1 or (counts < 0).any() or not np.isfinite(counts).all():
        raise WorkloadError("The 'counts' parameter must be a 1-D array of finite counts >= 0.")
    rng = np.random.default_rng(seed)
    hour_s = 3600.0 / time_compression
    arrivals: list[float] = []
    for h, count in enumerate(counts):
        n = int(rng.poisson(count * count_scale))
        arrivals.extend(np.sort(rng.uniform(h * hour_s, (h + 1) * hour_s, size=n)).tolist())
    picks = rng.integers(0, len(templates), size=len(arrivals))
    return Workload(
        name="contour",
        queries=tuple(WorkloadQuery(templates[i].name, templates[i].sql, a)
                      for i, a in zip(picks, arrivals, strict=False)),
        time_compression=time_compression,
        params={"hours": len(counts), "time_compression": time_compression,
                "count_scale": count_scale, "seed": seed},
    )


def build_workload(cfg: WorkloadConfig, templates: list[Template]) -> Workload:
    """The workload a :class:`~sloctl.config.WorkloadConfig` describes."""
    if cfg.kind == "base":
        return base_workload(templates, cfg.rate_per_s, cfg.copies, cfg.seed)
    if cfg.kind == "phased":
        return phased_workload(templates, cfg.copies, low_rate_per_s=cfg.low_rate_per_s,
                               high_rate_per_s=cfg.high_rate_per_s, low_count=cfg.low_count,
                               high_count=cfg.high_count, seed=cfg.seed)
    if cfg.kind == "isolated":
        return isolated_workload(templates, cfg.copies, cfg.seed)
    if cfg.kind == "contour":
        counts = hourly_counts(cfg.contour_file or None, instance=cfg.contour_instance,
                               hours=cfg.contour_hours, seed=cfg.seed)
        return contour_workload(templates, counts, time_compression=cfg.time_compression,
                                count_scale=cfg.count_scale, seed=cfg.seed)
    raise WorkloadError(
        f"The 'kind' parameter must be base, phased, isolated or contour, got {cfg.kind!r}.")
