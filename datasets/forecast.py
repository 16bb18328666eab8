"""The Workload Forecaster: the day ahead, drawn from same-weekday-and-hour history (AutoSLO §7.2).

For each hour ``h`` of the target day the forecaster pools the reservoir's bins
chosen by a *policy*, each with a weight (weights sum to 1):

* ``decay`` (default) — the same weekday and hour ``k`` = 1, 2, ... weeks back,
  weighted ``lambda ** (k - 1)``;
* ``prior_day`` — the same hour of the day before;
* ``equal_7`` — the same hour of each of the last 7 days, equally;
* ``seasonal_naive`` — the same hour one week earlier.

The forecast count of hour ``h`` is the weighted mean of the pooled bins'
counts; a sampled workload draws that many queries (stochastic rounding),
each template with probability proportional to its weighted count — every
past query is sampled with its bin's weight. Arrival offsets within the hour
come from the pooled bins' interarrival deciles: a gap picks a decile
uniformly, then a value uniformly inside it. A bin with fewer than
``min_interarrivals`` gaps (sparse, or contour-only) falls back to arrivals
uniform in the hour.

Only days before the target are used; a policy whose bins all predate the
history (e.g. ``decay`` with under a week of it) falls back to the prior day.
:func:`evaluate_forecasts` backtests the policies on hourly counts (WAPE).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.core.errors import WorkloadError
from sloctl.datasets.reservoir import HOUR_S, Reservoir, as_date

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = [
    "DEFAULT_DECAY",
    "POLICIES",
    "DaySplit",
    "Forecaster",
    "backtest_series",
    "evaluate_forecasts",
    "forecast_hourly",
    "interarrival_deciles",
    "parse_policy",
    "place_in_hour",
    "sample_interarrivals",
    "source_lags",
    "split_days",
]

POLICIES = ("decay", "prior_day", "equal_7", "seasonal_naive")
DEFAULT_DECAY = 0.5


def parse_policy(spec: str) -> tuple[str, float | None]:
    """``"decay"`` -> ("decay", None); ``"decay:0.8"`` -> ("decay", 0.8) (a per-policy lambda)."""
    name, _, value = str(spec).partition(":")
    if name not in POLICIES:
        raise WorkloadError(f"The 'policy' parameter must be one of {', '.join(POLICIES)} "
                            f"(decay may carry its lambda, decay:0.8), got {spec!r}.")
    if not value:
        return name, None
    try:
        lam = float(value)
    except ValueError:
        lam = math.nan
    if name != "decay" or not 0.0 < lam <= 1.0:
        raise WorkloadError(f"The 'policy' parameter may carry a lambda in (0, 1] only for decay, got {spec!r}.")
    return name, lam


def source_lags(policy: str, history_days: int, *, decay_lambda: float = DEFAULT_DECAY,
                max_weeks: int | None = None) -> list[tuple[int, float]]:
    """The bins a policy pools: (days before the target, weight), most recent first.

    Args:
        policy: one of :data:`POLICIES`.
        history_days: days of history just before the target (lags up to this
            many days exist).
        decay_lambda: ``lambda`` of ``decay``; week ``k`` weighs ``lambda ** (k - 1)``.
        max_weeks: ``decay`` looks at most this many weeks back (``None``: all).

    Returns:
        Weights normalised to sum to 1.
    """
    _check_policy_args(policy, history_days, decay_lambda, max_weeks)
    if policy == "decay":
        weeks = history_days // 7 if max_weeks is None else min(history_days // 7, max_weeks)
        raw = [(7 * k, decay_lambda ** (k - 1)) for k in range(1, weeks + 1)]
    elif policy == "equal_7":
        raw = [(lag, 1.0) for lag in range(1, min(7, history_days) + 1)]
    elif policy == "seasonal_naive":
        raw = [(7, 1.0)] if history_days >= 7 else []
    else:
        raw = [(1, 1.0)]
    raw = raw or [(1, 1.0)]  # too little history for the policy: the prior day
    total = sum(w for _, w in raw)
    return [(lag, w / total) for lag, w in raw]


def forecast_hourly(history: np.ndarray, policy: str = "decay", *, decay_lambda: float = DEFAULT_DECAY,
                    max_weeks: int | None = None) -> np.ndarray:
    """Expected hourly counts of the day after ``history`` (shape (days, 24), oldest day first)."""
    import numpy as np

    history = np.asarray(history, dtype=float)
    if history.ndim != 2 or history.shape[1] != 24 or len(history) == 0:
        raise WorkloadError(f"The 'history' parameter must have shape (days >= 1, 24), got {history.shape}.")
    lags = source_lags(policy, len(history), decay_lambda=decay_lambda, max_weeks=max_weeks)
    return sum(w * history[len(history) - lag] for lag, w in lags)  # (24,)


def interarrival_deciles(gaps_s: Iterable[float]) -> np.ndarray:
    """The 11 decile edges (min, 10 %, ..., max) of interarrival gaps."""
    import numpy as np

    gaps = np.asarray(list(gaps_s), dtype=float)
    if gaps.size == 0 or not np.isfinite(gaps).all() or (gaps < 0).any():
        raise WorkloadError("The 'gaps_s' parameter must hold at least one finite gap >= 0.")
    return np.quantile(gaps, np.linspace(0.0, 1.0, 11))


def sample_interarrivals(deciles: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` gaps: each picks one of the 10 deciles uniformly, then a value uniformly inside it."""

    which = rng.integers(0, 10, size=n)
    return rng.uniform(deciles[which], deciles[which + 1])


def place_in_hour(gaps_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``len(gaps_s) + 1`` sorted offsets in [0, 3600) that keep the gaps, shifted at random.

    Gaps that overrun the hour (the forecast holds more queries than the past
    bins spaced that way) are shrunk by one common factor so that they fit.
    """
    import numpy as np

    span = float(np.sum(gaps_s))
    n = len(gaps_s) + 1
    limit = HOUR_S * (n - 1) / n  # leaves, on average, one gap's room at the end
    if span > limit:
        gaps_s = gaps_s * (limit / span)
        span = limit
    start = rng.uniform(0.0, HOUR_S - span)
    offsets = start + np.concatenate([[0.0], np.cumsum(gaps_s)])
    return np.minimum(offsets, np.nextafter(HOUR_S, 0.0))


@dataclass(frozen=True)
class DaySplit:
    """History days cut in two: forecasts are built on ``train`` and checked on ``validation``."""

    train: tuple[str, ...]
    validation: tuple[str, ...]


def split_days(dates: Sequence[Any], validation_days: int) -> DaySplit:
    """Hold out the last ``validation_days`` dates (chronologically); the rest train."""
    if isinstance(validation_days, bool) or not isinstance(validation_days, int) or validation_days < 1:
        raise WorkloadError(f"The 'validation_days' parameter must be an integer >= 1, got {validation_days!r}.")
    days = sorted({as_date(d, "dates").isoformat() for d in dates})
    if validation_days >= len(days):
        raise WorkloadError(f"The 'validation_days' parameter must be below the number of dates ({len(days)}), "
                            f"got {validation_days}.")
    return DaySplit(tuple(days[:-validation_days]), tuple(days[-validation_days:]))


class Forecaster:
    """Day-ahead workloads from a :class:`~sloctl.datasets.reservoir.Reservoir`.

    Args:
        reservoir: the history.
        policy: ``decay``, ``prior_day``, ``equal_7`` or ``seasonal_naive``.
        decay_lambda: ``lambda`` of ``decay``.
        max_weeks: ``decay`` looks at most this many weeks back (``None``: all).
        min_interarrivals: fewer pooled gaps than this in an hour -> uniform arrivals.
        seed: seed of the sampled workloads (combined with the target date).
    """

    def __init__(self, reservoir: Reservoir, policy: str = "decay", *, decay_lambda: float = DEFAULT_DECAY,
                 max_weeks: int | None = None, min_interarrivals: int = 10, seed: int = 0) -> None:
        self.reservoir = reservoir
        self.policy = policy
        self.decay_lambda = decay_lambda
        self.max_weeks = max_weeks
        self.min_interarrivals = min_interarrivals
        self.seed = seed

    def sources(self, target_date: Any) -> list[tuple[str, float]]:
        """The dates pooled for ``target_date`` and their weights (only dates before it)."""
        self._validate()
        target = as_date(target_date, "target_date")
        dates = self.reservoir.dates()
        if not dates or dt.date.fromisoformat(dates[0]) >= target:
            raise WorkloadError(f"The 'target_date' parameter must follow the reservoir's first date "
                                f"({dates[0] if dates else 'none stored'}), got {target.isoformat()}.")
        history_days = (target - dt.date.fromisoformat(dates[0])).days
        lags = source_lags(self.policy, history_days, decay_lambda=self.decay_lambda, max_weeks=self.max_weeks)
        return [((target - dt.timedelta(days=lag)).isoformat(), w) for lag, w in lags]

    def hourly_counts(self, target_date: Any) -> np.ndarray:
        """Expected query count of each hour of ``target_date``, shape (24,)."""
        import numpy as np

        sources = self.sources(target_date)
        counts = self.reservoir.counts(dates=[d for d, _ in sources])
        weight = counts["date"].map(dict(sources)).to_numpy(dtype=float)
        out = np.zeros(24)
        np.add.at(out, counts["hour"].to_numpy(dtype=int), weight * counts["count"].to_numpy(dtype=float))
        return out

    def interarrival_deciles(self, target_date: Any, hour: int) -> np.ndarray | None:
        """Decile edges of the pooled bins' gaps for ``hour``; ``None`` when too sparse."""
        sources = self.sources(target_date)
        counts = self.reservoir.counts(dates=[d for d, _ in sources])
        arrivals = self.reservoir.arrivals(dates=[d for d, _ in sources])
        gaps = _pooled_gaps(counts[counts["hour"] == hour], arrivals[arrivals["hour"] == hour])
        return interarrival_deciles(gaps) if len(gaps) >= self.min_interarrivals else None

    def workload(self, target_date: Any, *, seed: int | None = None) -> list[tuple[float, str]]:
        """A sampled workload for ``target_date``: (seconds after its midnight, template), in time order."""
        import numpy as np

        sources = self.sources(target_date)
        target = as_date(target_date, "target_date")
        rng = np.random.default_rng([self.seed if seed is None else seed, target.toordinal()])
        counts = self.reservoir.counts(dates=[d for d, _ in sources])
        arrivals = self.reservoir.arrivals(dates=[d for d, _ in sources])
        counts = counts.assign(weighted=counts["date"].map(dict(sources)) * counts["count"])
        out: list[tuple[float, str]] = []
        for hour, bins in counts.groupby("hour", sort=True):
            pool = bins.groupby("template", sort=True)["weighted"].sum()
            expected = float(pool.sum())
            n = int(math.floor(expected) + (rng.random() < expected - math.floor(expected)))
            if n == 0:
                continue
            templates = rng.choice(pool.index.to_numpy(), size=n, p=(pool / expected).to_numpy())
            gaps = _pooled_gaps(bins, arrivals[arrivals["hour"] == hour])
            if n > 1 and len(gaps) >= self.min_interarrivals:
                offsets = place_in_hour(sample_interarrivals(interarrival_deciles(gaps), n - 1, rng), rng)
            else:  # sparse bins: uniform in the hour
                offsets = np.sort(rng.uniform(0.0, HOUR_S, size=n))
            out.extend(zip((int(hour) * HOUR_S + offsets).tolist(), templates.tolist(), strict=True))
        return out

    def split(self, validation_days: int) -> DaySplit:
        """The reservoir's dates with the last ``validation_days`` held out."""
        return split_days(self.reservoir.dates(), validation_days)

    def _validate(self) -> None:
        _check_policy_args(self.policy, 1, self.decay_lambda, self.max_weeks)
        m = self.min_interarrivals
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise WorkloadError(f"The 'min_interarrivals' parameter of Forecaster must be an integer >= 1, got {m!r}.")


def _check_policy_args(policy: str, history_days: int, decay_lambda: float, max_weeks: int | None) -> None:
    if policy not in POLICIES:
        raise WorkloadError(f"The 'policy' parameter must be one of {', '.join(POLICIES)}, got {policy!r}.")
    if isinstance(history_days, bool) or not isinstance(history_days, int) or history_days < 1:
        raise WorkloadError(f"The 'history_days' parameter must be an integer >= 1, got {history_days!r}.")
    if not (isinstance(decay_lambda, int | float) and 0.0 < decay_lambda <= 1.0):
        raise WorkloadError(f"The 'decay_lambda' parameter must be in (0, 1], got {decay_lambda!r}.")
    if max_weeks is not None and (isinstance(max_weeks, bool) or not isinstance(max_weeks, int) or max_weeks < 1):
        raise WorkloadError(f"The 'max_weeks' parameter must be an integer >= 1 or None, got {max_weeks!r}.")


def _pooled_gaps(counts: pd.DataFrame, arrivals: pd.DataFrame) -> np.ndarray:
    """Interarrival gaps of every (date, hour) bin, all templates merged.

    A bin whose offsets were thinned by reservoir sampling (kept < seen) has
    gaps stretched by seen / kept on average; they are shrunk back by kept / seen.
    """
    import numpy as np

    seen = counts.groupby(["date", "hour"])["arrivals_seen"].sum()
    gaps = []
    for key, bin_ in arrivals.groupby(["date", "hour"], sort=True):
        offsets = np.sort(bin_["offset_s"].to_numpy(dtype=float))
        if len(offsets) < 2:
            continue
        n_seen = seen.get(key, 0)
        scale = min(1.0, len(offsets) / n_seen) if n_seen > 0 else 1.0
        gaps.append(np.diff(offsets) * scale)
    return np.concatenate(gaps) if gaps else np.zeros(0)


# -- backtest on hourly counts ------------------------------------------------

def _read_hourly(source: str | Path | pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        frame = source
    else:
        path = Path(source)
        if not path.is_file():
            raise WorkloadError(f"The 'hourly_frame' parameter names no file: {path}.")
        frame = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    for column in ("timestamp", "query_count"):
        if column not in frame.columns:
            raise WorkloadError(f"The 'hourly_frame' parameter must have a '{column}' column "
                                f"(required: timestamp, query_count), got {list(frame.columns)}.")
    frame = frame.assign(ts=pd.to_datetime(frame["timestamp"], errors="coerce"),
                         query_count=pd.to_numeric(frame["query_count"], errors="coerce"))
    bad = frame["ts"].isna() | frame["query_count"].isna() | (frame["query_count"] < 0)
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise WorkloadError(f"The 'hourly_frame' parameter must hold date-times and counts >= 0, got "
                            f"timestamp={frame['timestamp'].iloc[row]!r}, "
                            f"query_count={frame['query_count'].iloc[row]!r} at row {row}.")
    if "instance_id" not in frame.columns:
        frame = frame.assign(instance_id=0)
    return frame


def _day_matrix(rows: pd.DataFrame) -> np.ndarray:
    """Counts as (days, 24), from the first row's date to the last row's; missing hours are 0."""
    import numpy as np

    day0 = rows["ts"].min().normalize()
    days = (rows["ts"].max().normalize() - day0).days + 1
    out = np.zeros(days * 24)
    hours = ((rows["ts"].dt.floor("h") - day0).dt.total_seconds() // HOUR_S).to_numpy(dtype=int)
    np.add.at(out, hours, rows["query_count"].to_numpy(dtype=float))
    return out.reshape(days, 24)


def evaluate_forecasts(hourly_frame: str | Path | pd.DataFrame, instances: Iterable[int] | None = None,
                       policies: Sequence[str] = POLICIES, test_days: int = 14, *,
                       decay_lambda: float = DEFAULT_DECAY, max_weeks: int | None = None,
                       min_history_days: int = 7) -> dict:
    """Backtest forecasting policies on hourly counts.

    Each instance's last ``test_days`` dates are forecast one day at a time
    from everything before that day; WAPE = sum |forecast - actual| / sum actual
    over the test hours. Hours without a row count as 0 queries.

    Args:
        hourly_frame: frame or Parquet/CSV with ``timestamp``, ``query_count``
            and (optionally) ``instance_id`` — the Redset hourly layout.
        instances: the instance ids to score (``None``: every instance with
            ``min_history_days + test_days`` days and queries in the test days).
        policies: policy specs (:func:`parse_policy`), e.g. ``decay:0.8``.
        test_days: days held out at the end of each instance.
        decay_lambda: ``lambda`` of ``decay`` without its own.
        max_weeks: ``decay`` looks at most this many weeks back.
        min_history_days: days needed before the first test day.

    Returns:
        ``{"policies": {spec: {"median_wape", "mean_wape", "pooled_wape",
        "per_instance": {id: wape}}}, "instances": [...], "skipped": {id: reason},
        "test_days", "decay_lambda"}``.
    """
    import numpy as np

    if isinstance(test_days, bool) or not isinstance(test_days, int) or test_days < 1:
        raise WorkloadError(f"The 'test_days' parameter must be an integer >= 1, got {test_days!r}.")
    if isinstance(min_history_days, bool) or not isinstance(min_history_days, int) or min_history_days < 1:
        raise WorkloadError(f"The 'min_history_days' parameter must be an integer >= 1, got {min_history_days!r}.")
    specs = {spec: parse_policy(spec) for spec in policies}
    if not specs:
        raise WorkloadError("The 'policies' parameter must name at least one policy, got none.")
    frame = _read_hourly(hourly_frame)
    by_instance = dict(list(frame.groupby("instance_id", sort=True)))
    wanted = sorted(by_instance) if instances is None else list(instances)
    unknown = [i for i in wanted if i not in by_instance]
    if unknown:
        raise WorkloadError(f"The 'instances' parameter must name instance_id values in the frame, "
                            f"got {unknown[0]!r}.")
    scores: dict[str, dict[Any, float]] = {spec: {} for spec in specs}
    errors: dict[str, list[float]] = {spec: [0.0, 0.0] for spec in specs}  # sum |f - a|, sum a
    skipped: dict[Any, str] = {}
    for instance in wanted:
        matrix = _day_matrix(by_instance[instance])
        if len(matrix) < min_history_days + test_days:
            skipped[_key(instance)] = f"{len(matrix)} days < {min_history_days} history + {test_days} test days"
            continue
        actual = matrix[-test_days:]
        if actual.sum() == 0:
            skipped[_key(instance)] = "no queries in the test days"
            continue
        for spec, (name, lam) in specs.items():
            forecast = _backtest(matrix, name, lam or decay_lambda, max_weeks, test_days)
            error = float(np.abs(forecast - actual).sum())
            scores[spec][_key(instance)] = error / float(actual.sum())
            errors[spec][0] += error
            errors[spec][1] += float(actual.sum())
    result: dict[str, Any] = {"policies": {}, "instances": [k for k in map(_key, wanted) if k not in skipped],
                              "skipped": skipped, "test_days": test_days, "decay_lambda": decay_lambda}
    for spec, per_instance in scores.items():
        values = np.array(list(per_instance.values()))
        result["policies"][spec] = {
            "median_wape": float(np.median(values)) if values.size else None,
            "mean_wape": float(np.mean(values)) if values.size else None,
            "pooled_wape": errors[spec][0] / errors[spec][1] if errors[spec][1] else None,
            "per_instance": per_instance,
        }
    return result


def _backtest(matrix: np.ndarray, policy: str, decay_lambda: float, max_weeks: int | None,
              test_days: int) -> np.ndarray:
    """The last ``test_days`` rows of ``matrix`` forecast one day at a time from the days before, (test_days, 24)."""
    import numpy as np

    return np.stack([forecast_hourly(matrix[:t], policy, decay_lambda=decay_lambda, max_weeks=max_weeks)
                     for t in range(len(matrix) - test_days, len(matrix))])


def backtest_series(hourly_frame: str | Path | pd.DataFrame, instance: Any, policies: Sequence[str] = POLICIES,
                    test_days: int = 14, *, decay_lambda: float = DEFAULT_DECAY,
                    max_weeks: int | None = None) -> dict[str, Any]:
    """One instance's test days hour by hour: the actual counts and each policy's day-ahead forecast.

    The same backtest as :func:`evaluate_forecasts` (each day forecast from
    the days before it), kept as series for a plot.

    Returns:
        ``{"instance", "start": first test date (ISO), "actual": [count per hour],
        "forecasts": {spec: [count per hour]}}``.
    """
    import pandas as pd

    frame = _read_hourly(hourly_frame)
    rows = frame[frame["instance_id"] == instance]
    if rows.empty:
        raise WorkloadError(f"The 'instance' parameter must name an instance_id of the frame, got {instance!r}.")
    matrix = _day_matrix(rows)
    if len(matrix) <= test_days:
        raise WorkloadError(f"Instance {instance} has {len(matrix)} days, not more than the {test_days} test days.")
    start = rows["ts"].min().normalize() + pd.Timedelta(days=len(matrix) - test_days)
    forecasts = {}
    for spec in policies:
        name, lam = parse_policy(spec)
        forecasts[spec] = _backtest(matrix, name, lam or decay_lambda, max_weeks, test_days).ravel().tolist()
    return {"instance": _key(instance), "start": start.date().isoformat(),
            "actual": matrix[-test_days:].ravel().tolist(), "forecasts": forecasts}


def _key(instance: Any) -> Any:
    return instance.item() if hasattr(instance, "item") else instance
