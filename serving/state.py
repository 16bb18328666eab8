"""The runtime's durable state behind one small interface: accrued cost, running queries, the cluster set.

:class:`StateStore` lists the operations :class:`~sloctl.serving.runtime.Runtime`
needs; :class:`SqliteStateStore` keeps them in a SQLite file in the working
folder (WAL, one transaction per call). A shared store for replicas (Redis,
issue 20) implements the same operations.

What is kept, and why a crash cannot rewind it:

* ``cost``: accrued cost per cluster id plus ``_retired`` (clusters gone).
  The runtime writes the cost it is about to report *before* reporting it,
  and a restart carries on from the stored values, so a reported total never
  goes down across a crash.
* ``running``: queries routed and not yet completed (re-committed at start).
* ``clusters``: the cluster set in force (id, size, who brought it), written
  on every change, so clusters added or removed at runtime survive a restart.
* ``meta``: small flags (``operator_changed_pool``).
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any, Protocol

__all__ = ["SqliteStateStore", "StateStore"]


class StateStore(Protocol):
    """The runtime's durable state (see the module docstring)."""

    def costs(self) -> dict[str, float]: ...
    def save_costs(self, rows: list[tuple[str, float]], *, delete: tuple[str, ...] = ()) -> None: ...
    def running(self) -> list[tuple[int, str, str, float, float, float | None]]: ...
    def add_running(self, row: tuple[int, str, str, float, float, float | None]) -> None: ...
    def remove_running(self, query_id: int) -> None: ...
    def clusters(self) -> list[tuple[str, int, str]] | None: ...
    def save_clusters(self, rows: list[tuple[str, int, str]]) -> None: ...
    def meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def close(self) -> None: ...


class SqliteStateStore:
    """:class:`StateStore` in a SQLite file (safe across threads: one lock around the connection)."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS cost (cluster_id TEXT PRIMARY KEY, accrued REAL NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS running (query_id INTEGER PRIMARY KEY, template TEXT, "
                         "cluster_id TEXT, arrival_wall REAL, slo_s REAL, predicted_s REAL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS clusters (cluster_id TEXT PRIMARY KEY, size INTEGER NOT NULL, "
                         "origin TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")

    def _write(self, statements: list[tuple[str, Any]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    if isinstance(args, list):
                        self._db.executemany(sql, args)
                    else:
                        self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql).fetchall()

    def costs(self) -> dict[str, float]:
        return dict(self._read("SELECT cluster_id, accrued FROM cost"))

    def save_costs(self, rows: list[tuple[str, float]], *, delete: tuple[str, ...] = ()) -> None:
        self._write([("DELETE FROM cost WHERE cluster_id = ?", [(c,) for c in delete]),
                     ("INSERT INTO cost VALUES (?, ?) ON CONFLICT(cluster_id) DO UPDATE SET accrued = "
                      "max(accrued, excluded.accrued)", rows)])

    def running(self) -> list[tuple[int, str, str, float, float, float | None]]:
        return self._read("SELECT query_id, template, cluster_id, arrival_wall, slo_s, predicted_s FROM running")

    def add_running(self, row: tuple[int, str, str, float, float, float | None]) -> None:
        self._write([("INSERT INTO running VALUES (?, ?, ?, ?, ?, ?)", row)])

    def remove_running(self, query_id: int) -> None:
        self._write([("DELETE FROM running WHERE query_id = ?", (query_id,))])

    def clusters(self) -> list[tuple[str, int, str]] | None:
        """The cluster set last saved (None: never saved, e.g. a fresh state file)."""
        if self.meta("clusters_saved") is None:
            return None
        return self._read("SELECT cluster_id, size, origin FROM clusters ORDER BY rowid")

    def save_clusters(self, rows: list[tuple[str, int, str]]) -> None:
        self._write([("DELETE FROM clusters", ()), ("INSERT INTO clusters VALUES (?, ?, ?)", rows),
                     ("INSERT INTO meta VALUES ('clusters_saved', '1') ON CONFLICT(key) DO NOTHING", ())])

    def meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self._write([("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                      (key, value))])

    def close(self) -> None:
        with self._lock:
            self._db.close()
