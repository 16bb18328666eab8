"""The Workload Reservoir: every query's (date, hour, template), kept on disk (AutoSLO §7.1).

Two SQLite tables, both keyed by calendar date and hour of day:

* ``counts(date, hour, template, count, arrivals_seen)`` — exact query counts.
  ``arrivals_seen`` is how many of them came with an arrival time (contour-only
  data from :meth:`Reservoir.add_hourly_counts` adds counts without arrivals).
* ``arrivals(date, hour, template, slot, offset_s)`` — within-hour arrival
  offsets in seconds, ``0 <= offset_s < 3600``. Per (date, hour, template) at
  most ``max_arrivals_per_bin`` are kept, chosen by reservoir sampling
  (Algorithm R), so that storage stays bounded while counts stay exact. The
  kept offsets are a uniform sample of the bin's arrivals.

The Policy Tuner reads the reservoir rarely, so nothing is held in memory:
every call opens the file, does its work and closes it. Every write is one
SQLite transaction — a batch that fails half-way (bad row, exception, crash)
leaves the file as it was before the batch.

Sampling is seeded: write number ``w`` (counted in the file) draws from
``numpy.random.default_rng([seed, w])``, so the same writes with the same seed
keep the same offsets.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterable
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.core.errors import WorkloadError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["HOUR_S", "Reservoir", "as_date"]

HOUR_S = 3600.0
_SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counts (
    date TEXT NOT NULL, hour INTEGER NOT NULL, template TEXT NOT NULL,
    count INTEGER NOT NULL, arrivals_seen INTEGER NOT NULL,
    PRIMARY KEY (date, hour, template));
CREATE TABLE IF NOT EXISTS arrivals (
    date TEXT NOT NULL, hour INTEGER NOT NULL, template TEXT NOT NULL,
    slot INTEGER NOT NULL, offset_s REAL NOT NULL,
    PRIMARY KEY (date, hour, template, slot));
"""


def as_date(value: Any, field: str = "date") -> dt.date:
    """A calendar date from a ``date``, ``datetime``, pandas Timestamp or ISO text."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value)[:10])
    except ValueError:
        raise WorkloadError(f"The '{field}' parameter must be a date (YYYY-MM-DD), got {value!r}.") from None


class Reservoir:
    """A bounded, on-disk store of past workloads: hourly counts and sampled arrivals.

    Args:
        path: the SQLite file (created on first use).
        max_arrivals_per_bin: offsets kept per (date, hour, template); ``None``
            keeps all. Fixed when the file is created.
        seed: seed of the reservoir sampling.
    """

    def __init__(self, path: str | Path, max_arrivals_per_bin: int | None = 1000, seed: int = 0) -> None:
        self.path = path
        self.max_arrivals_per_bin = max_arrivals_per_bin
        self.seed = seed

    # -- writing -------------------------------------------------------------

    def add_queries(self, queries: pd.DataFrame | Iterable[tuple[Any, str]]) -> int:
        """Add arrivals: a frame with ``timestamp`` and ``template`` columns, or (timestamp, template) pairs.

        Timestamps are binned by their wall-clock date and hour (a time zone,
        if any, is kept as the wall clock and then dropped).

        Returns:
            The number of queries added.
        """
        import pandas as pd

        if not isinstance(queries, pd.DataFrame):
            rows = list(queries)
            bad = next((i for i, r in enumerate(rows) if not (isinstance(r, tuple | list) and len(r) == 2)), None)
            if bad is not None:
                raise WorkloadError(f"The 'queries' parameter must hold (timestamp, template) pairs, "
                                    f"got {rows[bad]!r} at row {bad}.")
            queries = pd.DataFrame(rows, columns=["timestamp", "template"])
        _require(queries, ("timestamp", "template"), "queries")
        stamps = _timestamps(queries["timestamp"], "timestamp")
        frame = _binned(stamps, _templates(queries["template"]))
        self._write(frame, arrivals=True)
        return len(frame)

    def add_log(self, log: pd.DataFrame, start_date: Any) -> int:
        """Add a query log (docs/querylog.md): ``arrival_s`` counts from ``start_date``.

        Args:
            log: rows with ``template`` and ``arrival_s`` (seconds >= 0).
            start_date: the wall-clock time of ``arrival_s = 0`` (a date means
                its midnight).

        Returns:
            The number of queries added.
        """
        import numpy as np
        import pandas as pd

        _require(log, ("template", "arrival_s"), "log")
        try:
            start = pd.to_datetime(start_date, errors="coerce")
        except (TypeError, ValueError):
            start = pd.NaT
        if not isinstance(start, pd.Timestamp) or pd.isna(start):
            raise WorkloadError(f"The 'start_date' parameter must be a date or date-time, got {start_date!r}.")
        arrival_s = pd.to_numeric(log["arrival_s"], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(arrival_s) | (arrival_s < 0)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise WorkloadError(f"The 'arrival_s' field must be a finite number >= 0, "
                                f"got {log['arrival_s'].iloc[row]!r} at row {row}.")
        if start.tzinfo is not None:
            start = start.tz_localize(None)
        stamps = pd.Series(start + pd.to_timedelta(arrival_s, unit="s"))
        frame = _binned(stamps, _templates(log["template"]))
        self._write(frame, arrivals=True)
        return len(frame)

    def add_hourly_counts(self, frame: pd.DataFrame, *, instance: int | None = None,
                          template: str = "all") -> int:
        """Add contour-only data: hourly query counts without arrival times.

        Args:
            frame: ``timestamp`` (on the hour) and ``query_count`` columns, the
                Redset hourly layout; an ``instance_id`` column is filtered by
                ``instance``; a ``template`` column overrides ``template``.
            instance: the ``instance_id`` to keep (required when the frame
                holds several).
            template: the template name the counts are filed under.

        Returns:
            The number of queries added. Counts add to what is stored.
        """
        import numpy as np
        import pandas as pd

        _require(frame, ("timestamp", "query_count"), "frame")
        if "instance_id" in frame.columns:
            ids = pd.unique(frame["instance_id"])
            if instance is None and len(ids) > 1:
                raise WorkloadError(f"The 'instance' parameter is required when the frame holds several "
                                    f"instance_id values, got None for {len(ids)} instances.")
            if instance is not None:
                frame = frame[frame["instance_id"] == instance]
                if frame.empty:
                    raise WorkloadError(f"The 'instance' parameter must name an instance_id in the frame, "
                                        f"got {instance!r}.")
        stamps = _timestamps(frame["timestamp"], "timestamp")
        off_hour = (stamps != stamps.dt.floor("h")).to_numpy()
        if off_hour.any():
            row = int(np.flatnonzero(off_hour)[0])
            raise WorkloadError(f"The 'timestamp' field must fall on the hour, got {stamps.iloc[row]} at row {row}.")
        count = pd.to_numeric(frame["query_count"], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(count) | (count < 0) | (count != np.round(count))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise WorkloadError(f"The 'query_count' field must be a whole number >= 0, "
                                f"got {frame['query_count'].iloc[row]!r} at row {row}.")
        names = (_templates(frame["template"]) if "template" in frame.columns
                 else _templates(pd.Series([template] * len(frame), dtype=object)))
        binned = _binned(stamps, names).assign(count=count.astype(np.int64))
        self._write(binned, arrivals=False)
        return int(count.sum())

    # -- reading -------------------------------------------------------------

    def counts(self, start: Any = None, end: Any = None, *, template: str | None = None,
               dates: Iterable[Any] | None = None) -> pd.DataFrame:
        """Stored counts, one row per (date, hour, template), ordered.

        Args:
            start, end: first and last date to return (inclusive).
            template: only this template.
            dates: only these dates.

        Returns:
            Columns ``date`` (ISO text), ``hour``, ``template``, ``count`` and
            ``arrivals_seen``.
        """
        return self._select("counts", "date, hour, template, count, arrivals_seen",
                            start, end, template, dates, "date, hour, template")

    def arrivals(self, start: Any = None, end: Any = None, *, template: str | None = None,
                 dates: Iterable[Any] | None = None) -> pd.DataFrame:
        """Kept arrival offsets: columns ``date``, ``hour``, ``template``, ``offset_s``, ordered by time."""
        return self._select("arrivals", "date, hour, template, offset_s",
                            start, end, template, dates, "date, hour, offset_s, template")

    def dates(self) -> list[str]:
        """Every date with a stored count, ascending (ISO text)."""
        with self._connection() as con:
            return [row[0] for row in con.execute("SELECT DISTINCT date FROM counts ORDER BY date")]

    # -- internals -----------------------------------------------------------

    def _validate(self) -> None:
        cap = self.max_arrivals_per_bin
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise WorkloadError(f"The 'max_arrivals_per_bin' parameter of Reservoir must be an integer >= 0 "
                                f"or None, got {cap!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise WorkloadError(f"The 'seed' parameter of Reservoir must be an integer >= 0, got {self.seed!r}.")

    @contextmanager
    def _connection(self):
        self._validate()
        with closing(sqlite3.connect(Path(self.path), isolation_level=None)) as con:
            con.executescript(_SCHEMA)
            stored = dict(con.execute("SELECT key, value FROM meta").fetchall())
            cap = "none" if self.max_arrivals_per_bin is None else str(self.max_arrivals_per_bin)
            if not stored:
                con.execute("BEGIN IMMEDIATE")
                con.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                                [("schema_version", _SCHEMA_VERSION), ("max_arrivals_per_bin", cap),
                                 ("writes", "0")])
                con.execute("COMMIT")
            elif stored.get("max_arrivals_per_bin") != cap:
                raise WorkloadError(f"The 'max_arrivals_per_bin' parameter of Reservoir must match the file "
                                    f"{self.path} ({stored.get('max_arrivals_per_bin')}), got {cap}.")
            yield con

    @contextmanager
    def _transaction(self):
        with self._connection() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def _write(self, frame: pd.DataFrame, *, arrivals: bool) -> None:
        """Upsert counts and, for arrivals, sample offsets into the bins — all in one transaction."""
        import pandas as pd

        if frame.empty:
            return
        keys = ["date", "hour", "template"]
        if arrivals:
            grouped = frame.groupby(keys, sort=True).size().rename("count").reset_index()
            grouped["arrivals_seen"] = grouped["count"]
        else:
            grouped = frame.groupby(keys, sort=True)["count"].sum().reset_index()
            grouped["arrivals_seen"] = 0
        with self._transaction() as con:
            writes = int(con.execute("SELECT value FROM meta WHERE key = 'writes'").fetchone()[0])
            con.execute("UPDATE meta SET value = ? WHERE key = 'writes'", (str(writes + 1),))
            if arrivals:
                seen = pd.DataFrame(
                    con.execute("SELECT date, hour, template, arrivals_seen FROM counts "
                                f"WHERE date IN ({','.join('?' * frame['date'].nunique())})",
                                sorted(frame["date"].unique())).fetchall(),
                    columns=[*keys, "before"])
            self._write_counts(con, grouped)
            if arrivals:
                self._write_arrivals(con, frame, seen, writes)

    @staticmethod
    def _write_counts(con: sqlite3.Connection, grouped: pd.DataFrame) -> None:
        con.executemany(
            "INSERT INTO counts (date, hour, template, count, arrivals_seen) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (date, hour, template) DO UPDATE SET count = count + excluded.count, "
            "arrivals_seen = arrivals_seen + excluded.arrivals_seen",
            [(d, int(h), t, int(c), int(s)) for d, h, t, c, s in grouped.itertuples(index=False)])

    def _write_arrivals(self, con: sqlite3.Connection, frame: pd.DataFrame, seen: pd.DataFrame,
                        writes: int) -> None:
        """Algorithm R per bin, continued from the arrivals the bin has already seen."""
        import numpy as np

        keys = ["date", "hour", "template"]
        frame = frame.merge(seen, on=keys, how="left")
        # i: the arrival's index in its bin's whole stream (earlier writes included)
        i = frame["before"].fillna(0).to_numpy(dtype=np.int64) + frame.groupby(keys).cumcount().to_numpy()
        cap = self.max_arrivals_per_bin
        if cap is None:
            slot = i
        else:
            rng = np.random.default_rng([self.seed, writes])
            slot = np.where(i < cap, i, np.floor(rng.random(len(i)) * (i + 1)).astype(np.int64))
            slot = np.where(slot < cap, slot, -1)
        kept = frame.assign(slot=slot)
        kept = kept[kept["slot"] >= 0].drop_duplicates([*keys, "slot"], keep="last")  # a later arrival wins
        con.executemany(
            "INSERT OR REPLACE INTO arrivals (date, hour, template, slot, offset_s) VALUES (?, ?, ?, ?, ?)",
            [(d, int(h), t, int(s), float(o)) for d, h, t, s, o in
             kept[[*keys, "slot", "offset_s"]].itertuples(index=False)])

    def _select(self, table: str, columns: str, start: Any, end: Any, template: str | None,
                dates: Iterable[Any] | None, order: str) -> pd.DataFrame:
        import pandas as pd

        where, args = [], []
        if start is not None:
            where.append("date >= ?")
            args.append(as_date(start, "start").isoformat())
        if end is not None:
            where.append("date <= ?")
            args.append(as_date(end, "end").isoformat())
        if template is not None:
            where.append("template = ?")
            args.append(str(template))
        if dates is not None:
            wanted = sorted({as_date(d, "dates").isoformat() for d in dates})
            where.append(f"date IN ({','.join('?' * len(wanted))})")
            args.extend(wanted)
        sql = f"SELECT {columns} FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._connection() as con:
            rows = con.execute(f"{sql} ORDER BY {order}", args).fetchall()
        return pd.DataFrame(rows, columns=[c.strip() for c in columns.split(",")])


def _require(frame: Any, columns: tuple[str, ...], name: str) -> None:
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise WorkloadError(f"The '{name}' parameter must be a pandas DataFrame, got {type(frame).__name__}.")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise WorkloadError(f"The '{name}' parameter must have a '{missing[0]}' column "
                            f"(required: {', '.join(columns)}), got columns {list(frame.columns)}.")


def _timestamps(values: pd.Series, field: str) -> pd.Series:
    import numpy as np
    import pandas as pd

    values = values.reset_index(drop=True)
    try:
        stamps = pd.to_datetime(values, errors="coerce", format="mixed")
    except (TypeError, ValueError):  # mixed time zones
        stamps = pd.Series([pd.to_datetime(v, errors="coerce") for v in values], dtype=object)
        stamps = pd.Series([s.tz_localize(None) if getattr(s, "tzinfo", None) else s for s in stamps])
        stamps = pd.to_datetime(stamps)
    if getattr(stamps.dt, "tz", None) is not None:
        stamps = stamps.dt.tz_localize(None)
    bad = stamps.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise WorkloadError(f"The '{field}' field must be a date-time, got {values.iloc[row]!r} at row {row}.")
    return stamps


def _templates(values: pd.Series) -> list[str]:
    values = values.reset_index(drop=True)
    for row, value in enumerate(values):
        if not isinstance(value, str) or not value.strip():
            raise WorkloadError(f"The 'template' field must be a non-empty string, got {value!r} at row {row}.")
    return values.tolist()


def _binned(stamps: pd.Series, templates: list[str]) -> pd.DataFrame:
    """(date, hour, template, offset_s) in arrival order — the order reservoir sampling sees them."""
    import numpy as np
    import pandas as pd

    hour_start = stamps.dt.floor("h")
    frame = pd.DataFrame({
        "date": stamps.dt.strftime("%Y-%m-%d").to_numpy(),
        "hour": stamps.dt.hour.to_numpy(dtype=np.int64),
        "template": templates,
        "offset_s": (stamps - hour_start).dt.total_seconds().to_numpy(dtype=float),
        "_t": stamps.to_numpy(),
    })
    frame = frame.sort_values("_t", kind="stable")
    return frame.drop(columns="_t").reset_index(drop=True)
