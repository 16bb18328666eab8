"""The gateway's query log: one row per attempt, in the schema of :mod:`sloctl.datasets.querylog`.

Rows are kept in memory and rewritten atomically to one Parquet file per
gateway run (``gateway-<start>-<id>.parquet`` in ``log_dir``), so that
``sloctl train iconq --log LOG_DIR`` reads every run. The file's metadata
names the database's benchmark and scale factor when its name says them
(``tpch_sf1.duckdb``): the provenance of a model trained on it.

Plan features come from the router's template table, else from the
``explain`` callable the gateway passes (``EXPLAIN (FORMAT JSON)`` run on a
sandboxed cluster worker): this process never opens a database nor runs a
client's text (docs/DESIGN.md, "Strangers' SQL runs sandboxed").

The log must not stop silently. A text that cannot be featurized gets NaN
features; a row that breaks the schema is dropped; a failed write keeps the
rows for the next flush. Each is counted in :attr:`AttemptLog.errors`
(also a Prometheus counter, ``sloctl_gateway_log_errors_total{kind}``) and
said on stderr as one ``warning: gateway query log: ...`` line (repeats of a
kind at most once a minute).

Every write also records the file, its SHA-256 and row count in
``log_dir/gateway-manifest.json`` (merged with what other runs wrote there);
``sloctl ... --log LOG_DIR`` then reads only the files listed with their
checksum (docs/querylog.md, "The gateway's manifest").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sloctl.core.errors import QueryLogError
from sloctl.datasets.plan_features import (
    ENGINE_PLAN_FEATURES,
    PLAN_FEATURES,
    features_from_plan,
    features_from_postgres_plan,
)
from sloctl.datasets.sql_features import text_features

__all__ = ["ERROR_KINDS", "MANIFEST_NAME", "AttemptLog", "db_source", "file_sha256", "read_manifest"]

#: The gateway's list of the log files it wrote, in ``log_dir``.
MANIFEST_NAME = "gateway-manifest.json"
_MANIFEST_KIND = "sloctl gateway query logs"
_MANIFEST_VERSION = 1
#: What :attr:`AttemptLog.errors` counts: texts not featurized, rows dropped for breaking the schema, failed writes.
ERROR_KINDS = ("featurize", "invalid", "write")
_SHUTDOWN_TRIES = 3


def db_source(db_path: Path) -> dict[str, str]:
    """``benchmark`` and ``scale_factor`` of a database named as ``sloctl warehouse generate`` names it (or none)."""
    match = re.match(r"^(tpch|tpcds)_sf([0-9.]+)\.duckdb$", Path(db_path).name)
    return {} if match is None else {"benchmark": match.group(1), "scale_factor": match.group(2)}


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as 64 hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: str | Path) -> dict[str, dict[str, Any]] | None:
    """The files ``folder``'s gateway manifest lists (``{name: {"sha256", "rows", "written_at"}}``).

    Returns:
        ``None`` when the folder holds no manifest.

    Raises:
        QueryLogError: the manifest is unreadable or not a gateway manifest.
    """
    path = Path(folder) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise QueryLogError(f"{path}: not a readable gateway manifest ({_one_line(exc)}).") from exc
    files = doc.get("files") if isinstance(doc, dict) and doc.get("kind") == _MANIFEST_KIND else None
    if not isinstance(files, dict) or not all(
            isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]) and isinstance(entry.get("rows"), int)
            for entry in files.values()):
        raise QueryLogError(f"{path}: not a gateway manifest (expected kind {_MANIFEST_KIND!r} and files with "
                            "their sha256 and rows).")
    return files


@contextlib.contextmanager
def _manifest_lock(folder: Path) -> Iterator[None]:
    """Several gateways may share a folder: one read-modify-write of the manifest at a time."""
    with open(folder / ".gateway-manifest.lock", "a") as fh:
        try:
            import fcntl
        except ImportError:  # no advisory locks on this platform: runs sharing a folder may race
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _record_in_manifest(path: Path, rows: int) -> None:
    from sloctl.core.files import atomic_write

    with _manifest_lock(path.parent):
        files = read_manifest(path.parent) or {}  # a broken manifest is not overwritten: other runs' entries
        files[path.name] = {"sha256": file_sha256(path), "rows": rows,
                            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        doc = {"kind": _MANIFEST_KIND, "version": _MANIFEST_VERSION, "files": dict(sorted(files.items()))}
        with atomic_write(path.parent / MANIFEST_NAME, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")


def _one_line(exc: BaseException | str) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _nan_features() -> dict[str, float]:
    return dict.fromkeys(PLAN_FEATURES, math.nan)


class AttemptLog:
    """Attempts as query-log rows; ``path`` is ``None`` when nothing is written (no ``log_dir``).

    Args:
        db_path: the database the clusters serve (named in the file's metadata; never opened here).
        log_dir: where the file goes, or ``None``.
        stamp: the gateway's start, in the file name.
        explain: ``explain(sql) -> str | None``: the text of DuckDB's ``EXPLAIN (FORMAT JSON)``
            of ``sql``, computed in a sandbox, or ``None`` when it cannot be planned. Called at
            most once per distinct text, from :meth:`flush` / :meth:`frame` (never on a
            query's path), and never while this log holds its rows lock. ``None``: texts
            the template table does not know get NaN features. The text counts
            (``f_t_*``) are parsed from the text beside its plan; the catalog
            columns (``f_c_*``) stay NaN unless the template table has them.
    """

    #: Seconds between two stderr lines of one error kind (the count of those held back is in the next).
    warn_interval_s = 60.0

    def __init__(self, db_path: str | Path, log_dir: str | Path | None, stamp: str, *,
                 explain: Callable[[str], str | None] | None = None) -> None:
        self.db_path = Path(db_path)
        self.explain = explain
        self.path = None if log_dir is None else Path(log_dir) / f"gateway-{stamp}-{uuid.uuid4().hex[:6]}.parquet"
        self.rows: list[dict[str, Any]] = []
        self.dirty = False
        self.written_rows = 0
        self.errors: dict[str, int] = dict.fromkeys(ERROR_KINDS, 0)
        self.last_error: str | None = None
        self._features: dict[str, dict[str, float]] = {}  # sql_hash -> features (NaN ones too: asked once)
        self._warned: dict[str, tuple[float, int]] = {}  # kind -> (when last said, how many held back since)
        self._rows_lock = threading.Lock()
        self._file_lock = threading.Lock()  # one featurize-and-write at a time: a newer snapshot is never overwritten
        self._error_lock = threading.Lock()
        self._registry: Any = None

    def append(self, row: dict[str, Any], sql: str) -> None:
        """One attempt; ``sql`` is kept to plan it later if neither the cache nor the template table knows it."""
        with self._rows_lock:
            self.rows.append({**row, "_sql": None if row.get("sql_hash") in self._features else sql})
            self.dirty = True

    def __len__(self) -> int:
        return len(self.rows)

    # -- errors: counted, said once on stderr, exported ---------------------------------
    def _error(self, kind: str, message: str, *, always: bool = False) -> None:
        message = _one_line(message)
        with self._error_lock:
            self.errors[kind] += 1
            self.last_error = f"{kind}: {message}"
            now = time.monotonic()
            said, held = self._warned.get(kind, (-math.inf, 0))
            if not always and now - said < self.warn_interval_s:
                self._warned[kind] = (said, held + 1)
                return
            self._warned[kind] = (now, 0)
        more = f" (and {held} more {kind} error(s) since the last warning)" if held else ""
        print(f"warning: gateway query log: {message}{more}", file=sys.stderr, flush=True)

    def status(self) -> dict[str, Any]:
        """What ``GET /v1/gateway`` shows of the log: file, rows, rows on disk, errors by kind, the last error."""
        with self._error_lock:
            errors, last = dict(self.errors), self.last_error
        return {"path": None if self.path is None else str(self.path), "rows": len(self.rows),
                "written_rows": self.written_rows, "errors": errors, "last_error": last}

    def collect(self) -> Iterator[Any]:
        """Prometheus collector protocol: ``registry.register(log)`` exports the error counter and the backlog."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        errors = CounterMetricFamily("sloctl_gateway_log_errors", "Gateway query-log errors (featurize: NaN "
                                     "features; invalid: row dropped; write: file not written).", labels=["kind"])
        with self._error_lock:
            for kind, n in self.errors.items():
                errors.add_metric([kind], n)
        yield errors
        yield GaugeMetricFamily("sloctl_gateway_log_unwritten_rows", "Logged attempts not yet in the log file.",
                                value=max(len(self.rows) - self.written_rows, 0) if self.path is not None else 0)

    def metrics_text(self) -> bytes:
        """The Prometheus exposition of :meth:`collect` (on a registry of this log's own)."""
        from prometheus_client import CollectorRegistry, generate_latest

        if self._registry is None:
            self._registry = CollectorRegistry()
            self._registry.register(self)
        return generate_latest(self._registry)

    # -- plan features -------------------------------------------------------------------
    def _features_of(self, row: dict[str, Any], table: Any, plan: bool) -> dict[str, float]:
        key = str(row.get("sql_hash"))
        features = self._features.get(key)
        if features is not None:
            return features
        if table is not None:
            try:
                match = table.loc[table["template"] == row.get("template")]
                if len(match):
                    # a table written before plan-feature version 2 lacks the text columns: unknown
                    features = {name: float(match[name].iloc[0]) if name in match.columns else math.nan
                                for name in PLAN_FEATURES}
            except Exception as exc:  # noqa: BLE001  (a bad table must not stop the log)
                self._error("featurize", f"template table lookup of {row.get('template')!r}: {_one_line(exc)}")
        if features is None:
            if not plan and self.explain is not None:
                return _nan_features()  # at shutdown: not planned, and not remembered as unplannable
            features = self._planned(row.get("_sql"), key) if self.explain is not None else _nan_features()
        self._features[key] = features
        return features

    def _planned(self, sql: str | None, key: str) -> dict[str, float]:
        try:
            text = self.explain(sql or "")
            if text is None:  # the query cannot be planned (it failed as an error row): unknown
                return _nan_features()
            plan = json.loads(text)
            # PostgreSQL's plan (a PostgreSQL-backed gateway plans there): [{"Plan": {...}}]
            postgres = isinstance(plan, list) and bool(plan) and isinstance(plan[0], dict) and "Plan" in plan[0]
            features = features_from_postgres_plan(plan) if postgres else features_from_plan(plan)
            if set(features) != set(ENGINE_PLAN_FEATURES) or not all(
                    isinstance(v, float) and math.isfinite(v) for v in features.values()):
                raise ValueError("the plan gave missing or non-finite features")
            # the text's own counts (parsed here, never run); no catalog: the gateway never opens the database
            out = {**features, **text_features(sql or "", "duckdb")}
            if postgres:
                out["f_source"] = "plan:postgresql+text"
            return out
        except Exception as exc:  # noqa: BLE001  (whatever the sandbox answers, the log goes on)
            self._error("featurize", f"plan features of text {key} are NaN: {type(exc).__name__}: {_one_line(exc)}")
            return _nan_features()

    # -- the frame and the file ----------------------------------------------------------
    def _frame(self, table: Any, *, plan: bool = True) -> Any:
        import pandas as pd

        from sloctl.datasets.querylog import COLUMNS, validate_log

        with self._rows_lock:
            rows = [dict(row) for row in self.rows]
        for row in rows:
            row.update(self._features_of(row, table, plan))
            row.pop("_sql", None)
        try:
            return validate_log(pd.DataFrame(rows, columns=None if rows else list(COLUMNS)), source="gateway query log")
        except QueryLogError:
            rows = self._drop_invalid(rows)
            return validate_log(pd.DataFrame(rows, columns=None if rows else list(COLUMNS)), source="gateway query log")

    def _drop_invalid(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Drop the rows that break the schema (each alone, or a repeated ``query_id``) from the log for good."""
        import pandas as pd

        from sloctl.datasets.querylog import validate_log

        bad: list[int] = []
        seen: set[Any] = set()
        first = ""
        for i, row in enumerate(rows):
            try:
                validate_log(pd.DataFrame([row]), source=f"attempt row {i}")
                if row["query_id"] in seen:
                    raise QueryLogError(f"attempt row {i}: query_id {row['query_id']!r} repeats an earlier row.")
            except (QueryLogError, KeyError) as exc:
                bad.append(i)
                first = first or _one_line(exc)
                continue
            seen.add(row["query_id"])
        if not bad:
            return rows
        with self._rows_lock:  # rows are only ever appended, so the snapshot's indices are the log's
            for i in reversed(bad):
                del self.rows[i]
        with self._error_lock:
            self.errors["invalid"] += len(bad) - 1  # _error counts the last one
        self._error("invalid", f"dropped {len(bad)} attempt row(s) that break the query-log schema; first: {first}")
        keep = set(range(len(rows))) - set(bad)
        return [row for i, row in enumerate(rows) if i in keep]

    def frame(self, table: Any = None) -> Any:
        """The rows so far as a validated query log (a DataFrame); ``table``: the router's template table."""
        with self._file_lock:
            return self._frame(table)

    def flush(self, table: Any = None, *, router: str = "", final: bool = False) -> Path | None:
        """Rewrite the file atomically and record it in the folder's manifest.

        A failed write is counted (``errors["write"]``), said on stderr, and
        leaves the previous file as it was and the rows marked dirty, so the
        next flush writes them.

        Args:
            table: the router's template table (plan features of known templates).
            router: the router in force, for the file's metadata.
            final: the gateway's last flush, at shutdown, after it ended the
                attempts still running (each :meth:`append`-ed as an ``error``
                row, ``"gateway shut down"``). Texts never planned get NaN
                features without calling ``explain`` (its workers are gone);
                the write is tried 3 times; it never raises.

        Returns:
            The file, or ``None`` without a ``log_dir`` or rows (or, with
            ``final``, when the write failed).

        Raises:
            Exception: what the write raised (without ``final``), after counting it.
        """
        from sloctl.datasets.querylog import write_log

        if self.path is None:
            return None
        with self._file_lock:
            with self._rows_lock:
                if not self.rows:
                    return None
                self.dirty = False  # an append from now on marks it again
            try:
                frame = self._frame(table, plan=not final)
                metadata = {"source": "sloctl gateway", "workload": "gateway", "router": router,
                            **db_source(self.db_path)}
                for attempt in range(_SHUTDOWN_TRIES if final else 1):
                    try:
                        write_log(frame, self.path, metadata=metadata)
                        _record_in_manifest(self.path, len(frame))
                        break
                    except Exception:
                        if attempt + 1 == (_SHUTDOWN_TRIES if final else 1):
                            raise
                        time.sleep(0.1)
            except Exception as exc:
                self.dirty = True
                unwritten = len(self.rows) - self.written_rows
                then = "they are lost (the gateway is shutting down)" if final else "the next flush tries again"
                self._error("write", f"{self.path}: not written ({type(exc).__name__}: {_one_line(exc)}); "
                            f"{unwritten} attempt row(s) not on disk, {then}", always=final)
                if final:
                    return None
                raise
            self.written_rows = len(frame)
            return self.path
