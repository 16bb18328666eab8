"""The process behind one DuckDB cluster (``python -m sloctl.datasets._cluster_worker``).

It first bounds its own memory (``--rlimit-data``, a byte count) and enrols
itself in its CPU-budget and memory cgroups (``--cgroup-procs``, once per
group), before DuckDB is imported and any work starts, so every thread and
every allocation it makes is budgeted and bounded
(:mod:`sloctl.datasets.memory_bound`). It then pins itself to its cores,
opens the database read-only with ``threads = size``, seals itself in a
sandbox (below), waits out the warm-up delay, then reads JSON-line commands on
stdin and answers JSON lines on stdout:

* in:  ``{"op": "run", "query_id": 1, "sql": "...", "timeout_s": 5.0}`` (with
  ``"fetch": true`` the answer carries the result; with ``"stream": true,
  "page_rows": 1000, "buffer_pages": 4`` the result comes in pages, and
  ``"stream_timeout_s"`` replaces ``timeout_s`` once the first page has left),
  ``{"op": "credit", "query_id": 1, "pages": 1}`` (a streamed query may send
  that many more pages), ``{"op": "cancel", "query_id": 1}``, ``{"op":
  "explain", "explain_id": 1, "sql": "...", "timeout_s": 5.0}``, ``{"op": "stop"}``
* out: ``{"kind": "ready", "t": ...}``, ``{"kind": "failed", "error": "..."}``,
  ``{"kind": "done", "query_id": 1, "start_s": ..., "end_s": ..., "status":
  "ok", "error": "", "rows": 4}`` (plus ``"columns": [[name, type], ...]`` and
  ``"data": [[...], ...]`` when fetched, ``"columns"`` alone when streamed),
  ``{"kind": "columns", "query_id": 1, "columns": [...]}`` then ``{"kind":
  "page", "query_id": 1, "n": 2, "rows": [[...], ...]}`` for a streamed query (before
  its ``done``), ``{"kind": "explained", "explain_id": 1, "plan": "..." | null,
  "error": ""}``, ``{"kind": "stopped", "t": ...}``

The sandbox (always on): extensions are neither installed nor loaded
automatically, community extensions are refused, external access is off (no
file outside the worker's own temp folder, no URL, no ``ATTACH``, no
``INSTALL``/``LOAD``), and the configuration is locked, so no statement can
change ``threads``, ``memory_limit`` or the sandbox itself. Each request is one
statement, a ``SELECT`` or an ``EXPLAIN`` (``COPY`` could still write into
the temp folder, outside the temp-size limit). ``--memory-limit``,
``--temp-dir`` and ``--temp-dir-limit`` bound memory and spilling. An allocation that fails
(past ``--rlimit-data``, or Python's own ``MemoryError``) ends its query as
``OutOfMemoryException``, as DuckDB's own memory errors do.

A streamed query never runs more than ``buffer_pages`` pages ahead of the
credit it was given: the reader fetches with ``fetchmany`` from DuckDB's
streaming result, so the worker's memory does not grow with the result.

Every query runs on a thread of its own; start and end are read on the
machine-wide monotonic clock right around the query's execution.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from sloctl.datasets.duckdb_types import parse_type

TORN_DOWN = "cluster torn down while the query ran"
CANCELLED = "cancelled by the client"  # sloctl.datasets.pool.CANCELLED (the worker loads only duckdb_types)
#: The statement types a request may hold (``SHOW``, ``DESCRIBE``, ``PRAGMA`` and ``VALUES`` parse as ``SELECT``).
RUNNABLE = ("SELECT", "EXPLAIN")
#: ... and on a scratch worker (the gateway's ``memory`` catalog), whose own database may be written.
RUNNABLE_SCRATCH = (*RUNNABLE, "CREATE", "INSERT", "DELETE", "UPDATE", "DROP")
#: The class name every memory failure is reported under (the gateway maps it to EXCEEDED_LOCAL_MEMORY_LIMIT).
OUT_OF_MEMORY = "OutOfMemoryException"


def error_text(exc: BaseException) -> str:
    """A query's failure as ``"<DuckDB exception class>: message"``; every memory failure as :data:`OUT_OF_MEMORY`.

    A C++ ``std::bad_alloc`` that DuckDB passes on under another class, and
    Python's ``MemoryError`` (a page of rows that cannot be built), are
    memory failures too: a caller must not retry them elsewhere.
    """
    text = str(exc)
    if isinstance(exc, MemoryError) or "bad_alloc" in text or "bad allocation" in text:
        return f"{OUT_OF_MEMORY}: {text or 'an allocation failed (the worker is at its memory bound)'}"
    return f"{type(exc).__name__}: {text}"


def _json_value(value):
    """One result value as JSON: numbers and strings as they are, decimals, dates and times as text."""
    import base64
    import datetime
    import decimal
    import math

    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return value if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        offset = value.utcoffset()
        if offset is None:
            return value.isoformat(sep=" ")
        # Trino's `timestamp with time zone`: the local time, a space, then the zone (here its offset)
        sign, minutes = ("-" if offset < datetime.timedelta(0) else "+"), abs(offset) // datetime.timedelta(minutes=1)
        return f"{value.replace(tzinfo=None).isoformat(sep=' ')} {sign}{minutes // 60:02d}:{minutes % 60:02d}"
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


def _json_default(value):
    """``json.dumps``' fallback for the values it cannot write itself: as :func:`_json_value` writes them."""
    if isinstance(value, list | tuple | dict):  # only reached for containers json cannot walk (odd keys)
        raise TypeError("container")
    return _json_value(value)


#: DuckDB integer types wider than 64 bits (or unsigned 64): Trino decimals, which it sends as JSON strings
#: (a client that parses JSON numbers as doubles would round them).
WIDE_INTEGERS = ("HUGEINT", "UHUGEINT", "UBIGINT")


def _interval_text(value) -> str:
    """A ``timedelta`` as Trino's ``interval day to second`` text: ``[-]D HH:MM:SS.mmm`` (milliseconds)."""
    import datetime

    sign = "-" if value < datetime.timedelta(0) else ""
    value = abs(value)
    seconds = value.seconds
    return (f"{sign}{value.days} {seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}."
            f"{value.microseconds // 1000:03d}")


def _encoder(t):
    """How to turn a value of DuckDB type ``t`` (a :class:`DuckType`) into Trino's JSON value; ``None``: as it is.

    Wide integers become strings, intervals Trino's interval text, structs
    (dicts) the list of their field values (Trino's ``row``), and lists and
    maps apply their element's encoder.
    """
    if t.name in WIDE_INTEGERS:
        return str
    if t.name == "INTERVAL":
        return _interval_text
    if t.name == "UNION":  # no Trino counterpart: its member's text (the column is a varchar)
        return lambda v: _json_value(v) if isinstance(v, str) else json.dumps(_json_value(v))
    if t.name in ("LIST", "ARRAY"):
        inner = _encoder(t.children[0])
        return None if inner is None else (lambda v: [None if x is None else inner(x) for x in v])
    if t.name == "MAP":
        key, value = _encoder(t.children[0]), _encoder(t.children[1])
        if key is None and value is None:
            return None
        key, value = key or (lambda x: x), value or (lambda x: x)
        return lambda v: {key(k): None if x is None else value(x) for k, x in v.items()}
    if t.name == "STRUCT":
        inner = [_encoder(c) for c in t.children]
        return lambda v: [None if x is None else (f(x) if f is not None else x)
                          for f, x in zip(inner, v.values(), strict=True)]
    return None


def encoders(columns: list) -> dict[int, object]:
    """The encoder of each column that needs one (``[[name, duckdb_type], ...]`` → ``{index: function}``)."""
    out = {}
    for i, (_, kind) in enumerate(columns):
        try:
            f = _encoder(parse_type(kind))
        except ValueError:
            f = None
        if f is not None:
            out[i] = f
    return out


def _encoded(rows: list, encode: dict[int, object]) -> list:
    """``rows`` with the columns at ``encode`` turned into Trino's values (see :func:`encoders`)."""
    if not encode:
        return rows
    return [[encode[i](v) if i in encode and v is not None else v for i, v in enumerate(row)] for row in rows]


def _pages_within(rows: list, encode: dict[int, object] | None, limit: int | None):
    """``rows`` as JSON pages of at most ``limit`` bytes each, in order: ``(json, row count)`` pairs.

    A page over the limit is halved until its parts fit; a single row over it
    fails the query with ``OutOfMemoryException`` (the consumer bounds its
    memory by bytes: a 200 MB value must not reach it, whatever its row count).
    """
    import duckdb  # the worker imports it once its memory bound is set

    parts = [rows]
    while parts:
        part = parts.pop()
        page = _page_json(part, encode)
        if limit is None or len(page) <= limit:  # ASCII JSON (ensure_ascii): characters are bytes
            yield page, len(part)
        elif len(part) == 1:
            raise duckdb.OutOfMemoryException(
                f"a result row of {len(page)} bytes is larger than a result page may be ({limit} bytes: the "
                f"gateway's buffer_bytes / buffer_pages); the query fails rather than the gateway's memory")
        else:
            del page
            half = len(part) // 2
            parts += [part[half:], part[:half]]


def _page_json(rows: list, encode: dict[int, object] | None = None) -> str:
    """A page of rows as JSON text: the C encoder for every native value, :func:`_json_value` for the rest.

    Columns with an encoder (:func:`encoders`: wide integers, intervals,
    structs, ...) are converted first. NaN and infinities (and maps with keys
    JSON cannot hold) make the C encoder refuse the page; it is then
    converted value by value.
    """
    rows = _encoded(rows, encode or {})
    try:
        return json.dumps(rows, default=_json_default, allow_nan=False)
    except (ValueError, TypeError):
        return json.dumps([[_json_value(v) for v in row] for row in rows])


#: Types DuckDB writes as Trino's JSON text faster than Python can: cast to VARCHAR on the cluster, they never
#: become Python objects (a decimal, date or timestamp costs a constructor and a json.dumps callback each).
AS_TEXT = ("DECIMAL", "DATE", "TIME", "TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS", "UUID",
           *WIDE_INTEGERS)


_SHAPES: dict[str, tuple[str, list] | None] = {}  # query text -> (wrapped text, columns), None: run as it is


def open_stream(cur, sql: str, kind: str = "SELECT"):
    """Start ``sql`` (a statement of type ``kind``) as a streaming result: ``(result, [[name, type], ...])``.

    Columns of :data:`AS_TEXT` types come back as text, cast by DuckDB: the
    query is wrapped in a projection (``SELECT CAST(#1 AS VARCHAR), #2 FROM
    (sql)``) that keeps its order and names; the columns name DuckDB's own
    types. Text that cannot be wrapped (not a ``SELECT``; a trailing comment)
    runs as it is. What a text needs is remembered (the database is read-only).
    """
    import duckdb

    shape = _SHAPES.get(sql, ())
    if shape == () and kind == "SELECT":
        shape = None
        try:
            relation = cur.sql(sql)
            names, types = list(relation.columns), [str(t) for t in relation.types]
            cast = [t.split("(")[0] in AS_TEXT for t in types]
            if any(cast):
                body = sql.rstrip().rstrip(";")
                listed = ", ".join(f"CAST(#{i + 1} AS VARCHAR)" if c else f"#{i + 1}" for i, c in enumerate(cast))
                shape = (f"SELECT {listed} FROM (\n{body}\n) AS _sloctl_q",
                         [list(c) for c in zip(names, types, strict=True)])
                cur.extract_statements(shape[0])  # a trailing comment would swallow the parenthesis
        except duckdb.ParserException:
            shape = None
        if len(_SHAPES) >= 1024:
            _SHAPES.clear()
        _SHAPES[sql] = shape
    if shape:
        return cur.execute(shape[0]), shape[1]
    answer = cur.execute(sql)
    return answer, [[d[0], str(d[1])] for d in (cur.description or [])]


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect_sandboxed(db: str, *, threads: int, memory_limit: str | None = None, temp_dir: str | None = None,
                      temp_dir_limit: str | None = None, integer_division: bool = False, scratch: str | None = None):
    """Open ``db`` read-only and seal the connection: no extensions, no external access, settings locked.

    ``integer_division``: ``/`` between integers truncates (Trino's rule), set before the lock.
    ``scratch``: open an empty in-memory database instead (named ``memory``,
    with a schema ``default``, as Trino's memory catalog) and attach ``db``
    read-only under this name.
    """
    import duckdb

    config: dict[str, object] = {"threads": threads, "autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False, "allow_community_extensions": False}
    if memory_limit:
        config["memory_limit"] = memory_limit
    if temp_dir:
        config["temp_directory"] = temp_dir
    if temp_dir_limit:
        config["max_temp_directory_size"] = temp_dir_limit
    if integer_division:
        config["integer_division"] = True
    if scratch is not None:  # its tables must fit memory_limit: DuckDB would spill them past any temp limit
        config["temp_directory"] = ""
        config.pop("max_temp_directory_size", None)
    if scratch is None:
        con = duckdb.connect(db, read_only=True, config=config)
    else:
        con = duckdb.connect(":memory:", config=config)
        con.execute(f'ATTACH {_sql_literal(db)} AS "{scratch}" (READ_ONLY)')
        con.execute('CREATE SCHEMA memory."default"')
    # The database file is open already and DuckDB lets its own temp folder through: no other folder is needed.
    con.execute("SET allowed_directories = []")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def check_statement(cur, sql: str, allowed: tuple[str, ...] = RUNNABLE) -> str:
    """Refuse anything but one statement of an ``allowed`` type (DuckDB's exceptions, so callers see their names).

    Returns the statement's type (``SELECT``, ``EXPLAIN``).
    """
    import duckdb

    statements = cur.extract_statements(sql)
    if len(statements) != 1:
        raise duckdb.InvalidInputException(f"one statement per request, got {len(statements)}")
    kind = statements[0].type.name
    if kind not in allowed:
        raise duckdb.PermissionException(f"the sandbox runs {' and '.join(allowed)} statements only, got {kind}")
    return kind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sloctl-cluster-worker")
    parser.add_argument("--db", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--cores", required=True, help="comma-separated core ids")
    parser.add_argument("--warmup-s", type=float, default=0.0)
    parser.add_argument("--cgroup-procs", action="append", default=[],
                        help="a cgroup's cgroup.procs file to join first (once per group: CPU budget, memory bound)")
    parser.add_argument("--rlimit-data", type=int, default=None,
                        help="RLIMIT_DATA in bytes, set before DuckDB is imported (the memory bound without cgroups)")
    parser.add_argument("--memory-limit", default=None, help="DuckDB memory_limit, e.g. 2GB")
    parser.add_argument("--temp-dir", default=None, help="DuckDB temp_directory (spilling)")
    parser.add_argument("--temp-dir-limit", default=None, help="DuckDB max_temp_directory_size, e.g. 10GB")
    parser.add_argument("--integer-division", action="store_true", help="DuckDB integer_division (Trino's `/`)")
    parser.add_argument("--scratch", default=None, help="a writable in-memory database; --db attached read-only "
                                                         "under this name")
    args = parser.parse_args(argv)
    out_lock = threading.Lock()

    def emit(message: dict) -> None:
        emit_raw(json.dumps(message))

    def emit_raw(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    try:
        if args.rlimit_data is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_DATA, (args.rlimit_data, args.rlimit_data))
        for procs_file in args.cgroup_procs:
            with open(procs_file, "w") as procs:
                procs.write(str(os.getpid()))
        os.sched_setaffinity(0, [int(c) for c in args.cores.split(",")])
        import duckdb

        con = connect_sandboxed(args.db, threads=args.size, memory_limit=args.memory_limit,
                                temp_dir=args.temp_dir, temp_dir_limit=args.temp_dir_limit,
                                integer_division=args.integer_division, scratch=args.scratch)
        if args.warmup_s > 0:
            time.sleep(args.warmup_s)
    except Exception as exc:  # report, so the pool does not wait forever
        emit({"kind": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    emit({"kind": "ready", "t": time.monotonic()})

    running: dict[int | str, object] = {}  # query ids, and "explain-<id>" for plans
    cond = threading.Condition()  # guards running, cancelled and credits; wakes streams waiting for credit
    stopping = threading.Event()
    cancelled: set[int] = set()
    credits: dict[int, int] = {}

    def interrupt_until_gone(query_id: int) -> None:
        # an interrupt that lands just before the query starts executing is lost: repeat until it ends
        for _ in range(200):
            with cond:
                cur = running.get(query_id)
            if cur is None and query_id not in cancelled:
                return
            if cur is not None:
                cur.interrupt()
            time.sleep(0.05)

    def wait_for_credit(query_id: int, deadline: float | None) -> None:
        """Block until the consumer lets one more page go; cancel, stop and the deadline end the query."""
        with cond:
            while credits.get(query_id, 0) <= 0:
                if query_id in cancelled or stopping.is_set():
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                cond.wait(remaining)
            if query_id in cancelled or stopping.is_set() or credits.get(query_id, 0) <= 0:
                raise duckdb.InterruptException("stopped while waiting for the consumer")
            credits[query_id] -= 1

    def run(query_id: int, sql: str, timeout_s: float | None, fetch: bool = False, stream: bool = False,
            page_rows: int = 1000, buffer_pages: int = 4, stream_timeout_s: float | None = None,
            page_bytes: int | None = None) -> None:
        cur = con.cursor()
        with cond:
            running[query_id] = cur
            credits[query_id] = buffer_pages
        timer = threading.Timer(timeout_s, cur.interrupt) if timeout_s is not None else None
        status, error, n_rows, result = "ok", "", 0, None
        start_s = time.monotonic()
        deadline = None if timeout_s is None else start_s + timeout_s
        try:
            if timer is not None:
                timer.daemon = True
                timer.start()
            with cond:
                if query_id in cancelled or stopping.is_set():  # cancelled, or torn down, before it started
                    raise duckdb.InterruptException("stopped before it started")
            kind = check_statement(cur, sql, RUNNABLE_SCRATCH if args.scratch else RUNNABLE)
            if stream:  # a streaming result: fetchmany pulls pages as they are produced
                answer, columns = open_stream(cur, sql, kind)
                result = {"columns": columns}
                emit({"kind": "columns", "query_id": query_id, "columns": columns})
                encode = encoders(columns)
                while columns and (rows := answer.fetchmany(page_rows)):
                    for page, count in _pages_within(rows, encode, page_bytes):
                        wait_for_credit(query_id, deadline)
                        emit_raw(f'{{"kind": "page", "query_id": {int(query_id)}, "n": {count}, "rows": {page}}}')
                        del page
                        if n_rows == 0 and stream_timeout_s is not None and timer is not None:
                            # rows have left: the attempt can no longer be retried, so from here on only the
                            # longer stream_timeout_s bounds it (the consumer's pace sets how long it takes)
                            timer.cancel()
                            deadline = start_s + max(stream_timeout_s, timeout_s or 0.0)
                            timer = threading.Timer(max(0.0, deadline - time.monotonic()), cur.interrupt)
                            timer.daemon = True
                            timer.start()
                        n_rows += count
                    del rows
            else:
                rows = cur.execute(sql).fetchall()
                n_rows = len(rows)
                if fetch:
                    columns = [[d[0], str(d[1])] for d in (cur.description or [])]
                    result = {"columns": columns,
                              "data": [[_json_value(v) for v in row] for row in _encoded(rows, encoders(columns))]}
        except duckdb.InterruptException:
            with cond:
                was_cancelled = query_id in cancelled
            status, error = (("error", TORN_DOWN) if stopping.is_set() else ("error", CANCELLED) if was_cancelled
                             else ("timeout", ""))
            result = None
        except (duckdb.Error, MemoryError) as exc:
            status, error, result = "error", error_text(exc), None
        except RuntimeError as exc:  # a timer's thread could not start: no memory left for its stack
            status, error, result = "error", error_text(MemoryError(str(exc))), None
        end_s = time.monotonic()
        if timer is not None:
            timer.cancel()
        with cond:
            running.pop(query_id, None)
            cancelled.discard(query_id)
            credits.pop(query_id, None)
        cur.close()
        emit({"kind": "done", "query_id": query_id, "start_s": start_s, "end_s": end_s,
              "status": status, "error": error, "rows": n_rows, **(result or {})})

    def explain(explain_id: int, sql: str, timeout_s: float | None) -> None:
        cur = con.cursor()
        key = f"explain-{explain_id}"
        with cond:
            running[key] = cur
        timer = threading.Timer(timeout_s, cur.interrupt) if timeout_s is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        plan, error = None, ""
        try:
            if stopping.is_set():
                raise duckdb.InterruptException("stopped before it started")
            check_statement(cur, sql, ("SELECT",))
            rows = cur.execute("EXPLAIN (FORMAT JSON) " + sql).fetchall()
            plan = rows[0][1] if rows and len(rows[0]) > 1 else None
        except (duckdb.Error, MemoryError) as exc:
            error = error_text(exc)
        if timer is not None:
            timer.cancel()
        with cond:
            running.pop(key, None)
        cur.close()
        emit({"kind": "explained", "explain_id": explain_id, "plan": plan, "error": error})

    threads: list[threading.Thread] = []

    def start(target, *thread_args) -> None:
        nonlocal threads
        thread = threading.Thread(target=target, args=thread_args, daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # no memory for its stack (RLIMIT_DATA): the request fails, the worker lives on
            error = error_text(MemoryError(f"no thread could be started for it ({exc})"))
            if target is run:
                now = time.monotonic()
                emit({"kind": "done", "query_id": thread_args[0], "start_s": now, "end_s": now, "status": "error",
                      "error": error, "rows": 0})
            else:
                emit({"kind": "explained", "explain_id": thread_args[0], "plan": None, "error": error})
            return
        threads = [t for t in threads if t.is_alive()]
        threads.append(thread)

    for line in sys.stdin:
        message = json.loads(line)
        op = message["op"]
        if op == "run":
            start(run, message["query_id"], message["sql"], message.get("timeout_s"),
                  bool(message.get("fetch", False)), bool(message.get("stream", False)),
                  int(message.get("page_rows", 1000)), int(message.get("buffer_pages", 4)),
                  message.get("stream_timeout_s"), message.get("page_bytes"))
        elif op == "credit":
            with cond:
                if message["query_id"] in credits:
                    credits[message["query_id"]] += int(message.get("pages", 1))
                    cond.notify_all()
        elif op == "cancel":
            with cond:
                cancelled.add(message["query_id"])
                cond.notify_all()
            threading.Thread(target=interrupt_until_gone, args=(message["query_id"],), daemon=True).start()
        elif op == "explain":
            start(explain, message["explain_id"], message["sql"], message.get("timeout_s"))
        elif op == "stop":
            break
    stopping.set()
    with cond:
        cond.notify_all()
    deadline = time.monotonic() + 10
    # an interrupt that lands just before a query starts executing is lost: repeat until every query ended
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        with cond:
            for cur in running.values():
                cur.interrupt()
        time.sleep(0.02)
    con.close()
    emit({"kind": "stopped", "t": time.monotonic()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
