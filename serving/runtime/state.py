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
* ``answers``: the answer given to each route and complete call, by
  ``query_id``, so that a repeated call gets the first answer back (kept
  ``answer_ttl_s``).

:class:`~sloctl.serving.runtime.state_redis.RedisStateStore` keeps the same state in
Redis for replicas (``state.url``); its route and complete are atomic
scripts instead of this file's transactions.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any, Protocol

__all__ = ["SqliteStateStore", "StateStore"]


class StateStore(Protocol):
    """The runtime's durable state (see the module docstring)."""

    def costs(self) -> dict[str, float]: ...
    def save_costs(self, rows: list[tuple[str, float]], *, delete: tuple[str, ...] = ()) -> None: ...
    def running(self) -> list[tuple[int, str, str, float, float, float | None]]: ...
    def add_running(self, row: tuple[int, str, str, float, float, float | None],
                    answer: dict[str, Any] | None = None) -> None: ...
    def remove_running(self, query_id: int, answer: dict[str, Any] | None = None) -> None: ...
    def answer(self, query_id: int) -> dict[str, Any] | None: ...
    def done(self, query_id: int) -> dict[str, Any] | None: ...
    def clusters(self) -> list[tuple[str, int, str]] | None: ...
    def save_clusters(self, rows: list[tuple[str, int, str]]) -> None: ...
    def meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def close(self) -> None: ...


class SqliteStateStore:
    """:class:`StateStore` in a SQLite file (safe across threads: one lock around the connection).

    Args:
        path: the file.
        answer_ttl_s: how long the answers of completed queries are kept for repeated calls.
    """

    shared = False  # one process: the runtime's lock orders every change

    def __init__(self, path: str, *, answer_ttl_s: float = 3600.0) -> None:
        self.answer_ttl_s = answer_ttl_s
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS cost (cluster_id TEXT PRIMARY KEY, accrued REAL NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS running (query_id INTEGER PRIMARY KEY, template TEXT, "
                         "cluster_id TEXT, arrival_wall REAL, slo_s REAL, predicted_s REAL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS clusters (cluster_id TEXT PRIMARY KEY, size INTEGER NOT NULL, "
                         "origin TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS answers (kind TEXT, query_id INTEGER, doc TEXT, at REAL, "
                         "PRIMARY KEY (kind, query_id))")
        self._db.execute("CREATE INDEX IF NOT EXISTS answers_at ON answers (at)")

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

    def add_running(self, row: tuple[int, str, str, float, float, float | None],
                    answer: dict[str, Any] | None = None) -> None:
        """A query routed (``answer``: what its caller was told, kept for a repeated call)."""
        statements = [("INSERT INTO running VALUES (?, ?, ?, ?, ?, ?)", row)]
        if answer is not None:
            statements.append(("INSERT OR REPLACE INTO answers VALUES ('route', ?, ?, ?)",
                               (row[0], json.dumps(answer), time.time())))
        self._write(statements)

    def remove_running(self, query_id: int, answer: dict[str, Any] | None = None) -> None:
        """A query ended (``answer``: the complete call's, kept for a repeated call; old answers go)."""
        statements = [("DELETE FROM running WHERE query_id = ?", (query_id,))]
        if answer is not None:
            now = time.time()
            statements += [("INSERT OR REPLACE INTO answers VALUES ('complete', ?, ?, ?)",
                            (query_id, json.dumps(answer), now)),
                           ("UPDATE answers SET at = ? WHERE kind = 'route' AND query_id = ?", (now, query_id)),
                           ("DELETE FROM answers WHERE at < ? AND query_id NOT IN (SELECT query_id FROM running)",
                            (now - self.answer_ttl_s,))]
        self._write(statements)

    def _answer(self, kind: str, query_id: int) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT doc FROM answers WHERE kind = ? AND query_id = ?",
                                   (kind, query_id)).fetchone()
        return None if row is None else json.loads(row[0])

    def answer(self, query_id: int) -> dict[str, Any] | None:
        """The answer of the first route call for ``query_id`` (None: never routed, or forgotten)."""
        return self._answer("route", query_id)

    def done(self, query_id: int) -> dict[str, Any] | None:
        """The answer of the first complete call for ``query_id`` (None: not completed, or forgotten)."""
        return self._answer("complete", query_id)

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
