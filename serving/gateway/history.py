"""The gateway's query history: every query and its attempts in a database that outlives the gateway process.

The gateway keeps its queries in memory for ``result_ttl_s``; the history
keeps them for ``retention_hours`` (24 by default) in a database, as Trino
Gateway keeps its ``query_history`` table (``dataStore.jdbcUrl``, pruned
after ``queryHistoryHoursRetention`` hours): a restarted gateway, ``sloctl
gateway history`` and an operator's own SQL all read it.

:class:`QueryHistory` takes an SQLAlchemy URL, the same choice of store as
the runtime's state (:mod:`sloctl.serving.runtime.state`):

* ``None``: a SQLite file (``path_default``, e.g. ``<log_dir>/history.sqlite``),
  in WAL mode (readers never wait for the writer) with a busy timeout, so a
  CLI reading the file while the gateway writes it waits instead of failing;
* ``sqlite:///PATH``: a SQLite file named explicitly;
* ``postgresql://...`` or ``postgresql+psycopg://...`` (psycopg 3,
  ``pip install 'sloctl[postgres]'``): a PostgreSQL database, for several
  gateways or a history too large for one file.

Two tables (SQLAlchemy Core; created when missing):

* ``queries``: one row per query (``query_id``), its user, source, class,
  template, SQL text (at most :data:`MAX_SQL_CHARS` characters kept), Trino
  state, outcome, error, UTC submission and end, ``elapsed_s``, ``slo_s``,
  rows sent, attempt count, routing group and the backend of its last attempt;
* ``attempts``: one row per attempt (``query_id``, ``attempt``): the backend
  (``cluster_id``) and its kind, ``arrival_s``, ``start_s`` and ``end_s`` on
  the gateway's clock, status, error and the router's ``predicted_s``.

Both writes are upserts that set only the fields a document names: the
gateway records a query when it is submitted and again when it ends, an
attempt when it is placed and again when it ends, and a later call never
erases what an earlier one wrote. Strings that are too long are cut, never
refused (and NUL characters, which PostgreSQL refuses, are replaced).

Writes come from the gateway's dispatcher thread and its HTTP threads: one
engine (a connection pool), one short transaction per call, and with SQLite
one writer at a time in this process. A write that fails raises by default;
``safe=True`` (the gateway's hot path) counts it in :attr:`QueryHistory.failures`
and :attr:`QueryHistory.last_error`, says it on stderr at most once a minute,
and returns ``False``, so a full disk or a lost database never fails a query.

:meth:`QueryHistory.prune` deletes the queries submitted more than
``retention_hours`` ago, with their attempts; the gateway calls it now and
then (it is not run on every write).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # SQLAlchemy is imported on first use: `sloctl --help` does not load it
    import sqlalchemy as sa

__all__ = ["MAX_SQL_CHARS", "STATES", "QueryHistory", "format_history"]

#: The longest SQL text kept, in characters (Trino's ``query.max-length`` default is 1,000,000).
MAX_SQL_CHARS = 100_000
#: The Trino states a query row may be in.
STATES = ("QUEUED", "RUNNING", "FINISHED", "FAILED")
_NAME_CHARS = 256
_MESSAGE_CHARS = 10_000
_LIST_LIMIT = 10_000
_BUSY_TIMEOUT_S = 30.0
_WARN_INTERVAL_S = 60.0
_ACCEPTED = ("None (a SQLite file at path_default), sqlite:///PATH, postgresql://USER@HOST:PORT/DB or "
             "postgresql+psycopg://USER@HOST:PORT/DB")

# document key -> (column, kind, longest string); the kinds are the converters of _convert
_QUERY_FIELDS: dict[str, tuple[str, str, int]] = {
    "user": ("user_name", "str", _NAME_CHARS), "source": ("source", "str", _NAME_CHARS),
    "class": ("query_class", "str", _NAME_CHARS), "template": ("template", "str", _NAME_CHARS),
    "sql": ("sql_text", "str", MAX_SQL_CHARS), "state": ("state", "state", 0),
    "outcome": ("outcome", "str", _NAME_CHARS), "error_name": ("error_name", "str", _NAME_CHARS),
    "error_message": ("error_message", "str", _MESSAGE_CHARS), "submitted_at": ("submitted_at", "time", 0),
    "ended_at": ("ended_at", "time", 0), "elapsed_s": ("elapsed_s", "float", 0), "slo_s": ("slo_s", "float", 0),
    "rows": ("rows_sent", "int", 0), "routing_group": ("routing_group", "str", _NAME_CHARS),
    "backend": ("backend", "str", _NAME_CHARS),
}
_ATTEMPT_FIELDS: dict[str, tuple[str, str, int]] = {
    "cluster_id": ("cluster_id", "str", _NAME_CHARS), "backend_kind": ("backend_kind", "str", _NAME_CHARS),
    "arrival_s": ("arrival_s", "float", 0), "start_s": ("start_s", "float", 0), "end_s": ("end_s", "float", 0),
    "status": ("status", "str", _NAME_CHARS), "error": ("error", "str", _MESSAGE_CHARS),
    "predicted_s": ("predicted_s", "float", 0),
}


@functools.cache
def _schema() -> tuple[sa.MetaData, sa.Table, sa.Table]:
    """The two tables (built once, on first use)."""
    import sqlalchemy as sa

    meta = sa.MetaData()
    name, message = sa.String(_NAME_CHARS), sa.String(_MESSAGE_CHARS)
    queries = sa.Table(
        "queries", meta,
        sa.Column("query_id", name, primary_key=True), sa.Column("user_name", name), sa.Column("source", name),
        sa.Column("query_class", name), sa.Column("template", name), sa.Column("sql_text", sa.Text),
        sa.Column("state", sa.String(16), nullable=False, default="QUEUED"), sa.Column("outcome", name),
        sa.Column("error_name", name), sa.Column("error_message", message),
        sa.Column("submitted_at", sa.DateTime, nullable=False),  # UTC, without a zone (the same in both dialects)
        sa.Column("ended_at", sa.DateTime), sa.Column("elapsed_s", sa.Float), sa.Column("slo_s", sa.Float),
        sa.Column("rows_sent", sa.BigInteger), sa.Column("attempt_count", sa.Integer, nullable=False, default=0),
        sa.Column("routing_group", name), sa.Column("backend", name),
        sa.Index("queries_submitted_at", "submitted_at"), sa.Index("queries_user", "user_name", "submitted_at"))
    attempts = sa.Table(
        "attempts", meta,
        sa.Column("query_id", name, primary_key=True), sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("cluster_id", name), sa.Column("backend_kind", name), sa.Column("arrival_s", sa.Float),
        sa.Column("start_s", sa.Float), sa.Column("end_s", sa.Float), sa.Column("status", name),
        sa.Column("error", message), sa.Column("predicted_s", sa.Float))
    return meta, queries, attempts


def _text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else str(value)
    return text[:limit].replace("\x00", "\ufffd")


def _utc(value: datetime) -> datetime:
    """``value`` as a UTC time without a zone (a time without a zone is taken as UTC already)."""
    return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)


def _convert(field: str, kind: str, limit: int, value: Any) -> Any:
    """One field's value as stored; ``None`` stays ``None`` (an empty column)."""
    if value is None:
        return None
    if kind == "str":
        return _text(value, limit)
    if kind == "state":
        if value not in STATES:
            raise ValueError(f"The '{field}' field must be one of {', '.join(STATES)}, got {value!r}.")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        form = {"float": "a number", "int": "an integer >= 0", "time": "a datetime or POSIX seconds"}[kind]
        raise ValueError(f"The '{field}' field must be {form} or None, got {value!r}.")
    if not math.isfinite(value):
        if kind == "float":
            return None  # NaN SLOs and unknown predictions: no value
        raise ValueError(f"The '{field}' field must be finite, got {value!r}.")
    if kind == "float":
        return float(value)
    if kind == "int":
        if value < 0 or value != int(value):
            raise ValueError(f"The '{field}' field must be an integer >= 0, got {value!r}.")
        return int(value)
    return datetime.fromtimestamp(value, UTC).replace(tzinfo=None)  # kind == "time"


def _clean(doc: Mapping[str, Any], fields: Mapping[str, tuple[str, str, int]], what: str) -> dict[str, Any]:
    """The columns ``doc`` names, converted; its ``query_id`` checked (keys not listed in ``fields`` are ignored)."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"The {what} document must be a mapping with a 'query_id', got {type(doc).__name__}.")
    if "query_id" not in doc:
        raise ValueError(f"The {what} document must have a 'query_id' field (a non-empty string), "
                         f"got keys {sorted(map(str, doc))}.")
    qid = doc["query_id"]
    if not isinstance(qid, str) or not qid:
        raise ValueError(f"The 'query_id' field of the {what} document must be a non-empty string, got {qid!r}.")
    values = {"query_id": _text(qid, _NAME_CHARS)}
    for key, (column, kind, limit) in fields.items():
        if key in doc:
            value = doc[key]
            if kind == "time" and isinstance(value, datetime):
                values[column] = _utc(value)
            else:
                values[column] = _convert(key, kind, limit, value)
    return values


def _attempt_values(doc: Mapping[str, Any]) -> dict[str, Any]:
    values = _clean(doc, _ATTEMPT_FIELDS, "attempt")
    number = doc.get("attempt")
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"The 'attempt' field of the attempt document must be an integer >= 1 (1 for the first "
                         f"attempt), got {number!r}.")
    values["attempt"] = number
    return values


def _engine_url(url: str | None, path_default: Path | None) -> Any:
    """The SQLAlchemy URL to open (see the module docstring for the forms accepted)."""
    import sqlalchemy as sa

    if url is None:
        if path_default is None:
            raise ValueError("The 'path_default' parameter of QueryHistory must be a file path when 'url' is None "
                             "(e.g. <log_dir>/history.sqlite), got None.")
        Path(path_default).parent.mkdir(parents=True, exist_ok=True)
        return sa.URL.create("sqlite+pysqlite", database=str(path_default))
    try:
        parsed = sa.make_url(url)
    except (sa.exc.ArgumentError, TypeError, ValueError):
        raise ValueError(f"The 'url' parameter of QueryHistory must be one of {_ACCEPTED}, got {url!r}.") from None
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    shown = parsed.render_as_string(hide_password=True)
    if backend == "sqlite" and driver in ("pysqlite", ""):
        if parsed.database in (None, "", ":memory:"):
            raise ValueError(f"The 'url' parameter of QueryHistory must be one of {_ACCEPTED} (an in-memory "
                             f"SQLite database would not outlive the gateway), got {shown!r}.")
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        return parsed.set(drivername="sqlite+pysqlite")
    if backend == "postgresql" and driver in ("psycopg", ""):
        return parsed.set(drivername="postgresql+psycopg")
    raise ValueError(f"The 'url' parameter of QueryHistory must be one of {_ACCEPTED}, got {shown!r}.")


class QueryHistory:
    """The gateway's query history in SQLite or PostgreSQL (see the module docstring).

    The database is opened and its tables created here, so a bad URL or an
    unreachable server stops the gateway at start, not at its first query.

    Args:
        url: an SQLAlchemy URL: ``sqlite:///PATH``, ``postgresql://...`` or
            ``postgresql+psycopg://...``; ``None``: the SQLite file ``path_default``.
        retention_hours: queries submitted longer ago than this are deleted by
            :meth:`prune` (``math.inf``: never).
        path_default: the SQLite file when ``url`` is ``None``; its folder is
            created if missing.

    Raises:
        ValueError: a URL of another dialect or driver, an in-memory SQLite
            database, no ``path_default`` without a URL, or ``retention_hours`` not > 0.

    Attributes:
        failures: writes that failed under ``safe=True``.
        last_error: the last of them (``"ExceptionType: message"``), or ``None``.
    """

    def __init__(self, url: str | None = None, *, retention_hours: float = 24.0,
                 path_default: Path | None = None) -> None:
        import sqlalchemy as sa

        if isinstance(retention_hours, bool) or not isinstance(retention_hours, int | float) or not (
                retention_hours > 0):
            raise ValueError(f"The 'retention_hours' parameter of QueryHistory must be a number of hours > 0 "
                             f"(math.inf: keep forever), got {retention_hours!r}.")
        self.url = url
        self.retention_hours = float(retention_hours)
        self.path_default = path_default
        self.failures = 0
        self.last_error: str | None = None
        self._warned_s = -math.inf
        self._unsaid = 0
        self._failure_lock = threading.Lock()
        self._closed = False
        target = _engine_url(url, path_default)
        self.dialect = target.get_backend_name()
        self.shown_url = target.render_as_string(hide_password=True)
        if self.dialect == "sqlite":
            self._engine = sa.create_engine(target, connect_args={"timeout": _BUSY_TIMEOUT_S})
            sa.event.listen(self._engine, "connect", _sqlite_pragmas)
            self._write_lock: threading.Lock | contextlib.nullcontext = threading.Lock()  # one writer per file
        else:
            self._engine = sa.create_engine(target, pool_pre_ping=True)
            self._write_lock = contextlib.nullcontext()  # the server orders concurrent writers
        from sqlalchemy.dialects import postgresql, sqlite

        self._insert = sqlite.insert if self.dialect == "sqlite" else postgresql.insert
        try:
            self._create_tables()
        except BaseException:
            self._engine.dispose()
            raise

    def _create_tables(self, tries: int = 3) -> None:
        """``CREATE TABLE`` the missing tables; two gateways starting at once on one server may race (retried)."""
        import sqlalchemy as sa

        meta = _schema()[0]
        for attempt in range(tries):
            try:
                meta.create_all(self._engine)
                return
            except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
                if attempt == tries - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    # -- writes --------------------------------------------------------------------------
    def record_query(self, doc: Mapping[str, Any], *, safe: bool = False) -> bool:
        """Insert a query, or update the fields ``doc`` names of a recorded one.

        Args:
            doc: ``query_id`` (required) and any of ``user``, ``source``,
                ``class``, ``template``, ``sql``, ``state`` (one of
                :data:`STATES`), ``outcome``, ``error_name``, ``error_message``,
                ``submitted_at`` and ``ended_at`` (datetimes, UTC when without a
                zone, or POSIX seconds; ``submitted_at`` is now when a new row
                names none), ``elapsed_s``, ``slo_s``, ``rows``,
                ``routing_group``, ``backend`` and ``attempts``: a count, or the
                gateway's list of attempt dicts (each recorded as by
                :meth:`record_attempt`; its length is the count and its last
                ``cluster_id`` the ``backend``). Other keys are ignored.
            safe: never raise; count a failure instead (see the class).

        Returns:
            Whether it was written (always ``True`` unless ``safe``).

        Raises:
            ValueError: no ``query_id``, or a field of the wrong type (not with ``safe``).
            sqlalchemy.exc.SQLAlchemyError: the database refused the write (not with ``safe``).
        """
        return self._guard(safe, self._record_query, doc)

    def _record_query(self, doc: Mapping[str, Any]) -> None:
        values = _clean(doc, _QUERY_FIELDS, "query")
        attempts = doc.get("attempts")
        rows: list[dict[str, Any]] = []
        if isinstance(attempts, list | tuple):
            rows = [_attempt_values({**a, "query_id": doc["query_id"]}) if isinstance(a, Mapping) else
                    _attempt_values(a) for a in attempts]
            values["attempt_count"] = len(rows)
            if rows and rows[-1].get("cluster_id") is not None and "backend" not in doc:
                values["backend"] = rows[-1]["cluster_id"]
        elif attempts is not None:
            values["attempt_count"] = _convert("attempts", "int", 0, attempts)
        _, queries, _ = _schema()
        fresh = {"submitted_at": _utc(datetime.now(UTC)), "state": "QUEUED", "attempt_count": 0, **values}
        stmt = self._insert(queries).values(fresh)
        changed = {k: stmt.excluded[k] for k in values if k != "query_id"}
        stmt = (stmt.on_conflict_do_update(index_elements=[queries.c.query_id], set_=changed) if changed
                else stmt.on_conflict_do_nothing(index_elements=[queries.c.query_id]))
        with self._writing() as conn:
            conn.execute(stmt)
            for row in rows:
                conn.execute(self._upsert_attempt(row))

    def record_attempt(self, doc: Mapping[str, Any], *, safe: bool = False) -> bool:
        """Insert an attempt, or update the fields ``doc`` names of a recorded one.

        The query's ``attempt_count`` is raised to ``attempt`` (and its
        ``backend`` set to ``cluster_id``) unless it already counts more.

        Args:
            doc: ``query_id`` and ``attempt`` (1, 2, ...; required) and any of
                ``cluster_id``, ``backend_kind``, ``arrival_s``, ``start_s``,
                ``end_s``, ``status``, ``error``, ``predicted_s`` (the
                gateway's attempt dicts carry these). Other keys are ignored.
            safe: never raise; count a failure instead (see the class).

        Returns:
            Whether it was written (always ``True`` unless ``safe``).

        Raises:
            ValueError: no ``query_id``, no ``attempt`` >= 1, or a field of the
                wrong type (not with ``safe``).
            sqlalchemy.exc.SQLAlchemyError: the database refused the write (not with ``safe``).
        """
        return self._guard(safe, self._record_attempt, doc)

    def _record_attempt(self, doc: Mapping[str, Any]) -> None:
        import sqlalchemy as sa

        row = _attempt_values(doc)
        _, queries, _ = _schema()
        count = {"attempt_count": row["attempt"]}
        if row.get("cluster_id") is not None:
            count["backend"] = row["cluster_id"]
        with self._writing() as conn:
            conn.execute(self._upsert_attempt(row))
            conn.execute(sa.update(queries).where(queries.c.query_id == row["query_id"],
                                                  queries.c.attempt_count <= row["attempt"]).values(count))

    def _upsert_attempt(self, row: dict[str, Any]) -> Any:
        attempts = _schema()[2]
        stmt = self._insert(attempts).values(row)
        changed = {k: stmt.excluded[k] for k in row if k not in ("query_id", "attempt")}
        keys = [attempts.c.query_id, attempts.c.attempt]
        return (stmt.on_conflict_do_update(index_elements=keys, set_=changed) if changed
                else stmt.on_conflict_do_nothing(index_elements=keys))

    def prune(self, now: datetime | None = None) -> int:
        """Delete the queries submitted more than ``retention_hours`` before ``now``, and their attempts.

        Args:
            now: the current time (default: the clock's; UTC when without a zone).

        Returns:
            How many queries were deleted.

        Raises:
            ValueError: ``now`` not a datetime.
        """
        import sqlalchemy as sa

        if now is not None and not isinstance(now, datetime):
            raise ValueError(f"The 'now' parameter of QueryHistory.prune must be a datetime or None, got {now!r}.")
        if math.isinf(self.retention_hours):
            return 0
        cutoff = _utc(now or datetime.now(UTC)) - timedelta(hours=self.retention_hours)
        _, queries, attempts = _schema()
        old = sa.select(queries.c.query_id).where(queries.c.submitted_at < cutoff)
        with self._writing() as conn:
            conn.execute(sa.delete(attempts).where(attempts.c.query_id.in_(old)))
            return conn.execute(sa.delete(queries).where(queries.c.submitted_at < cutoff)).rowcount

    # -- reads ---------------------------------------------------------------------------
    def list_queries(self, *, user: str | None = None, state: str | None = None, limit: int = 100,
                     since: datetime | None = None) -> list[dict[str, Any]]:
        """The recorded queries, newest first, each with its ``attempts`` (a list, first attempt first).

        Args:
            user: only this user's.
            state: only those in this state (one of :data:`STATES`).
            limit: at most this many (1 to 10,000).
            since: only those submitted at or after this time (UTC when without a zone).

        Returns:
            One dict per query: the keys :meth:`record_query` takes (``attempts``
            the list of attempt dicts, ``attempt_count`` the count), times as UTC
            datetimes.

        Raises:
            ValueError: a bad ``state``, ``limit`` or ``since``.
        """
        import sqlalchemy as sa

        if state is not None and state not in STATES:
            raise ValueError(f"The 'state' parameter of QueryHistory.list_queries must be one of "
                             f"{', '.join(STATES)} or None, got {state!r}.")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _LIST_LIMIT:
            raise ValueError(f"The 'limit' parameter of QueryHistory.list_queries must be an integer from 1 to "
                             f"{_LIST_LIMIT}, got {limit!r}.")
        if since is not None and not isinstance(since, datetime):
            raise ValueError(f"The 'since' parameter of QueryHistory.list_queries must be a datetime or None, "
                             f"got {since!r}.")
        _, queries, _ = _schema()
        stmt = sa.select(queries).order_by(queries.c.submitted_at.desc(), queries.c.query_id.desc()).limit(limit)
        if user is not None:
            stmt = stmt.where(queries.c.user_name == _text(user, _NAME_CHARS))
        if state is not None:
            stmt = stmt.where(queries.c.state == state)
        if since is not None:
            stmt = stmt.where(queries.c.submitted_at >= _utc(since))
        return self._read(stmt)

    def get(self, query_id: str) -> dict[str, Any] | None:
        """One query as :meth:`list_queries` gives it, or ``None`` when it was never recorded (or pruned)."""
        import sqlalchemy as sa

        queries = _schema()[1]
        rows = self._read(sa.select(queries).where(queries.c.query_id == _text(query_id, _NAME_CHARS)))
        return rows[0] if rows else None

    def _read(self, stmt: Any) -> list[dict[str, Any]]:
        import sqlalchemy as sa

        self._check_open()
        attempts = _schema()[2]
        with self._engine.connect() as conn:
            found = [dict(r) for r in conn.execute(stmt).mappings()]
            ids = [r["query_id"] for r in found]
            tried = conn.execute(sa.select(attempts).where(attempts.c.query_id.in_(ids)).order_by(
                attempts.c.query_id, attempts.c.attempt)).mappings().all() if ids else []
        by_query: dict[str, list[dict[str, Any]]] = {}
        for a in tried:
            by_query.setdefault(a["query_id"], []).append(dict(a))
        return [_query_doc(r, by_query.get(r["query_id"], [])) for r in found]

    # -- plumbing ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What the gateway's status shows of the history: store (password hidden), retention, failures."""
        return {"url": self.shown_url, "dialect": self.dialect, "retention_hours": self.retention_hours,
                "failures": self.failures, "last_error": self.last_error}

    def close(self) -> None:
        """Close the database's connections (a second call does nothing)."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    def __enter__(self) -> QueryHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"The query history at {self.shown_url} is closed.")

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Any]:
        self._check_open()
        with self._write_lock, self._engine.begin() as conn:
            yield conn

    def _guard(self, safe: bool, write: Callable[[Mapping[str, Any]], None], doc: Mapping[str, Any]) -> bool:
        if not safe:
            write(doc)
            return True
        try:
            write(doc)
            return True
        except Exception as exc:  # the gateway's hot path: a lost history row never fails a query
            with self._failure_lock:
                self.failures += 1
                message = self.last_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
                now = time.monotonic()
                if now - self._warned_s < _WARN_INTERVAL_S:
                    self._unsaid += 1
                    return False
                more = f" (and {self._unsaid} more since the last warning)" if self._unsaid else ""
                self._warned_s, self._unsaid = now, 0
            print(f"warning: gateway query history: a write failed: {message}{more}", file=sys.stderr,
                  flush=True)
            return False


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """WAL (readers never block the writer), and a busy wait instead of 'database is locked'."""
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_S * 1000)}")
    cursor.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; a power cut may lose the last writes
    cursor.close()


def _aware(value: datetime | None) -> datetime | None:
    return None if value is None else value.replace(tzinfo=UTC)


def _query_doc(row: Mapping[str, Any], attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``queries`` row in the keys :meth:`QueryHistory.record_query` takes."""
    doc: dict[str, Any] = {"query_id": row["query_id"]}
    for key, (column, kind, _) in _QUERY_FIELDS.items():
        doc[key] = _aware(row[column]) if kind == "time" else row[column]
    doc["attempt_count"] = row["attempt_count"]
    doc["attempts"] = [{"query_id": a["query_id"], "attempt": a["attempt"],
                        **{key: a[column] for key, (column, _, _) in _ATTEMPT_FIELDS.items()}} for a in attempts]
    return doc


def _cell(value: str, width: int = 48) -> str:
    """One line, printable, at most ``width`` characters (user-controlled text must not break the table)."""
    text = "".join(ch if ch.isprintable() else " " for ch in value)
    return text if len(text) <= width else text[:width - 1] + "…"


def format_history(rows: list[dict[str, Any]]) -> str:
    """Queries (as :meth:`QueryHistory.list_queries` gives them) as a plain text table, for ``sloctl gateway history``.

    Columns: query id, user, class, state, submission (UTC), elapsed seconds,
    and the attempts as ``backend:status``, first attempt first.

    Args:
        rows: the queries.

    Returns:
        The table (a header and one line per query), or ``no queries`` when ``rows`` is empty.
    """
    if not rows:
        return "no queries"
    header = ("QUERY ID", "USER", "CLASS", "STATE", "SUBMITTED (UTC)", "ELAPSED", "ATTEMPTS")
    lines = [header]
    for r in rows:
        submitted = r.get("submitted_at")
        elapsed = r.get("elapsed_s")
        tried = " ".join(f"{a.get('cluster_id') or '?'}:{a.get('status') or '?'}" for a in r.get("attempts") or [])
        lines.append((
            _cell(str(r.get("query_id", ""))), _cell(r.get("user") or "-", 24), _cell(r.get("class") or "-", 16),
            str(r.get("state") or "-"), submitted.strftime("%Y-%m-%d %H:%M:%S") if submitted else "-",
            f"{elapsed:.3f}s" if elapsed is not None else "-", _cell(tried or "-", 80)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)
