"""The process behind one DuckDB cluster (``python -m sloctl.datasets._cluster_worker``).

It enrols itself in its CPU-budget cgroup (``--cgroup-procs``, before any
work starts, so every thread it makes is budgeted), pins itself to its cores,
opens the database read-only with ``threads = size``, waits out the warm-up delay, then reads JSON-line commands
on stdin and answers JSON lines on stdout:

* in:  ``{"op": "run", "query_id": 1, "sql": "...", "timeout_s": 5.0}`` (with
  ``"fetch": true`` the answer carries the result), ``{"op": "cancel",
  "query_id": 1}``, ``{"op": "stop"}``
* out: ``{"kind": "ready", "t": ...}``, ``{"kind": "failed", "error": "..."}``,
  ``{"kind": "done", "query_id": 1, "start_s": ..., "end_s": ..., "status":
  "ok", "error": "", "rows": 4}`` (plus ``"columns": [[name, type], ...]`` and
  ``"data": [[...], ...]`` when fetched), ``{"kind": "stopped", "t": ...}``

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

TORN_DOWN = "cluster torn down while the query ran"
CANCELLED = "cancelled by the client"  # sloctl.datasets.pool.CANCELLED (this module imports nothing of sloctl)


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
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sloctl-cluster-worker")
    parser.add_argument("--db", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--cores", required=True, help="comma-separated core ids")
    parser.add_argument("--warmup-s", type=float, default=0.0)
    parser.add_argument("--cgroup-procs", default=None, help="a cgroup's cgroup.procs file to join first")
    args = parser.parse_args(argv)
    out_lock = threading.Lock()

    def emit(message: dict) -> None:
        line = json.dumps(message)
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    try:
        if args.cgroup_procs:
            with open(args.cgroup_procs, "w") as procs:
                procs.write(str(os.getpid()))
        os.sched_setaffinity(0, [int(c) for c in args.cores.split(",")])
        import duckdb

        con = duckdb.connect(args.db, read_only=True, config={"threads": args.size})
        if args.warmup_s > 0:
            time.sleep(args.warmup_s)
    except Exception as exc:  # report, so the pool does not wait forever
        emit({"kind": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    emit({"kind": "ready", "t": time.monotonic()})

    running: dict[int, object] = {}
    lock = threading.Lock()
    stopping = threading.Event()

    cancelled: set[int] = set()

    def interrupt_until_gone(query_id: int) -> None:
        # an interrupt that lands just before the query starts executing is lost: repeat until it ends
        for _ in range(200):
            with lock:
                cur = running.get(query_id)
            if cur is None and query_id not in cancelled:
                return
            if cur is not None:
                cur.interrupt()
            time.sleep(0.05)

    def run(query_id: int, sql: str, timeout_s: float | None, fetch: bool = False) -> None:
        cur = con.cursor()
        with lock:
            running[query_id] = cur
        timer = threading.Timer(timeout_s, cur.interrupt) if timeout_s is not None else None
        status, error, n_rows, result = "ok", "", 0, None
        start_s = time.monotonic()
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            with lock:
                if query_id in cancelled or stopping.is_set():  # cancelled, or torn down, before it started
                    raise duckdb.InterruptException("stopped before it started")
            rows = cur.execute(sql).fetchall()
            n_rows = len(rows)
            if fetch:
                columns = [[d[0], str(d[1])] for d in (cur.description or [])]
                result = {"columns": columns, "data": [[_json_value(v) for v in row] for row in rows]}
        except duckdb.InterruptException:
            with lock:
                was_cancelled = query_id in cancelled
            status, error = (("error", TORN_DOWN) if stopping.is_set() else ("error", CANCELLED) if was_cancelled
                             else ("timeout", ""))
        except duckdb.Error as exc:
            status, error = "error", f"{type(exc).__name__}: {exc}"
        end_s = time.monotonic()
        if timer is not None:
            timer.cancel()
        with lock:
            running.pop(query_id, None)
            cancelled.discard(query_id)
        cur.close()
        emit({"kind": "done", "query_id": query_id, "start_s": start_s, "end_s": end_s,
              "status": status, "error": error, "rows": n_rows, **(result or {})})

    threads: list[threading.Thread] = []
    for line in sys.stdin:
        message = json.loads(line)
        if message["op"] == "run":
            thread = threading.Thread(
                target=run, args=(message["query_id"], message["sql"], message.get("timeout_s"),
                                  bool(message.get("fetch", False))),
                daemon=True)
            thread.start()
            threads = [t for t in threads if t.is_alive()]
            threads.append(thread)
        elif message["op"] == "cancel":
            with lock:
                cancelled.add(message["query_id"])
            threading.Thread(target=interrupt_until_gone, args=(message["query_id"],), daemon=True).start()
        elif message["op"] == "stop":
            break
    stopping.set()
    deadline = time.monotonic() + 10
    # an interrupt that lands just before a query starts executing is lost: repeat until every query ended
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        with lock:
            for cur in running.values():
                cur.interrupt()
        time.sleep(0.02)
    con.close()
    emit({"kind": "stopped", "t": time.monotonic()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
