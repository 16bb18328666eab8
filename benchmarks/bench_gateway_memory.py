"""A big result through the gateway: does its memory stay flat, and the worker's under its memory_limit?

Starts ``sloctl gateway`` as a process on a TPC-H database (``--sf``, built
if missing under ``--data-dir``), reads ``SELECT * FROM lineitem`` through
the real ``trino`` client, and samples the resident memory (``VmRSS``) of the
gateway process and of its cluster workers every ``--every-s`` seconds. It
prints the gateway's growth over its idle figure, the workers' peak against
``--memory-limit``, rows, time to the first row and in all, and whether
both clusters serve the next query. The issue's bound (docs/gateway.md):
the gateway grows by at most 200 MB, each worker stays under its limit, or
the query fails with ``EXCEEDED_LOCAL_MEMORY_LIMIT`` and the clusters go on.

Usage: python benchmarks/bench_gateway_memory.py [--sf 1] [--memory-limit 1GB] [--sql ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--memory-limit", default="1GB")
    parser.add_argument("--sql", default="SELECT * FROM lineitem")
    parser.add_argument("--every-s", type=float, default=1.0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import trino

    from sloctl.datasets.tpc import ensure_database
    from sloctl.serving.local import free_port

    db = ensure_database("tpch", args.sf, Path(args.data_dir), log=None)
    port = args.port or free_port()
    log_dir = Path(args.data_dir) / "bench-gateway-logs"
    proc = subprocess.Popen([sys.executable, "-m", "sloctl.cli", "gateway", "--db", str(db), "--port", str(port),
                             "--router", "least-queued", "--memory-limit", args.memory_limit, "--json",
                             "--log-dir", str(log_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, float, float]] = []
    stop = threading.Event()
    try:
        json.loads(proc.stdout.readline())
        time.sleep(1.0)
        workers = children(proc.pid)
        idle = rss_mb(proc.pid)

        def sample() -> None:
            while not stop.wait(args.every_s):
                samples.append((time.monotonic(), rss_mb(proc.pid), max((rss_mb(w) for w in workers), default=0.0)))

        threading.Thread(target=sample, daemon=True).start()
        conn = trino.dbapi.connect(host="127.0.0.1", port=port, user="bench")
        cur = conn.cursor()
        started = time.monotonic()
        first_row_s, rows, error = None, 0, None
        try:
            cur.execute(args.sql)
            while batch := cur.fetchmany(10_000):
                if first_row_s is None:
                    first_row_s = time.monotonic() - started
                rows += len(batch)
        except trino.exceptions.TrinoQueryError as exc:
            error = exc.error_name
        elapsed = time.monotonic() - started
        stop.set()
        next_ok = 0
        for _ in range(4):
            cur.execute("SELECT count(*) FROM nation")
            next_ok += cur.fetchall() == [[25]]
        peak_gw = max((s[1] for s in samples), default=idle)
        peak_worker = max((s[2] for s in samples), default=float("nan"))
        result = {"sql": args.sql, "sf": args.sf, "memory_limit": args.memory_limit, "rows": rows, "error": error,
                  "elapsed_s": round(elapsed, 1), "first_row_s": None if first_row_s is None else round(first_row_s, 1),
                  "gateway_idle_mb": round(idle, 1), "gateway_peak_mb": round(peak_gw, 1),
                  "gateway_growth_mb": round(peak_gw - idle, 1), "worker_peak_mb": round(peak_worker, 1),
                  "next_queries_ok": f"{next_ok}/4", "samples": len(samples)}
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.sql} at SF {args.sf:g} through the gateway (worker memory_limit {args.memory_limit}):")
        print(f"  {rows:,} rows{' then ' + error if error else ''} in {result['elapsed_s']} s "
              f"(first row at {result['first_row_s']} s)")
        print(f"  gateway RSS {result['gateway_idle_mb']} MB idle, {result['gateway_peak_mb']} MB peak: "
              f"+{result['gateway_growth_mb']} MB (bound +200 MB)")
        print(f"  worker RSS peak {result['worker_peak_mb']} MB (limit {args.memory_limit}); "
              f"next queries served: {result['next_queries_ok']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
