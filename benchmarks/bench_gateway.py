"""The gateway's overhead over DuckDB, measured side by side in one run.

Starts ``sloctl gateway`` as a process (two size-1 clusters, least-queued) on
a TPC-H database (``--sf``, built under ``--data-dir`` if missing) and
measures, in this order:

1. ``SELECT 1``, ``--rounds`` times each: through the ``trino`` client, in
   DuckDB's Python API directly, and the HTTP floor: a bare FastAPI endpoint
   under uvicorn in its own process, called with ``requests`` as the trino
   client calls the gateway (what any Python HTTP gateway costs here before
   it does anything). p50 and p99 of each.
2. ``--rows`` lineitem rows (``SELECT * FROM lineitem LIMIT n``): DuckDB's
   Python API in this process (``fetchmany``), the raw protocol (follow
   ``nextUri``, decode the JSON; no type mapping) and the trino client (its
   row mapping included), with where the time goes (the worker's run from
   the gateway's attempt record, the gateway and transport, the client's
   decode) and the peak resident memory of the gateway and of its workers.
3. ``--clients`` concurrent trino clients, each running TPC-H Q6 ``--repeat``
   times: the wall time and the p50 latency, beside the same queries run one
   after another through the gateway.

Usage: python benchmarks/bench_gateway.py [--sf 0.3] [--rows 1000000] [--rounds 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_gateway_memory import children, rss_mb  # the same /proc readings (run as a script from benchmarks/)

_FLOOR_APP = '''
import sys, uvicorn
from fastapi import FastAPI
app = FastAPI()
@app.post("/v1/statement")
async def statement():
    return {"id": "x", "stats": {"state": "FINISHED"}}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
'''


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def timed(fn, rounds: int) -> dict[str, float]:
    for _ in range(max(5, rounds // 10)):  # warm up
        fn()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t))
    return {"p50_ms": round(statistics.median(out), 3), "p99_ms": round(pct(out, 0.99), 3)}


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def select_one(args: argparse.Namespace, port: int, db: Path) -> dict[str, object]:
    import duckdb
    import requests
    import trino

    from sloctl.serving.local import free_port

    cur = trino.dbapi.connect(host="127.0.0.1", port=port, user="bench").cursor()

    def via_gateway() -> None:
        cur.execute("SELECT 1")
        cur.fetchall()

    con = duckdb.connect(str(db), read_only=True)
    floor_port = free_port()
    floor = subprocess.Popen([sys.executable, "-c", _FLOOR_APP, str(floor_port)])
    try:
        wait_port(floor_port)
        session = requests.Session()
        url = f"http://127.0.0.1:{floor_port}/v1/statement"
        out = {"gateway": timed(via_gateway, args.rounds),
               "duckdb": timed(lambda: con.execute("SELECT 1").fetchall(), args.rounds),
               "http_floor": timed(lambda: session.post(url, data="SELECT 1").json(), args.rounds)}
    finally:
        floor.terminate()
        floor.wait()
        con.close()
    out["gateway_minus_duckdb_ms"] = round(out["gateway"]["p50_ms"] - out["duckdb"]["p50_ms"], 3)
    out["gateway_minus_http_floor_ms"] = round(out["gateway"]["p50_ms"] - out["http_floor"]["p50_ms"], 3)
    return out


def big_fetch(args: argparse.Namespace, port: int, db: Path, gateway_pid: int) -> dict[str, object]:
    import duckdb
    import httpx
    import trino

    sql = f"SELECT * FROM lineitem LIMIT {args.rows}"
    con = duckdb.connect(str(db), read_only=True)
    started = time.perf_counter()
    result, n = con.execute(sql), 0
    while batch := result.fetchmany(10_000):
        n += len(batch)
    duck_s = time.perf_counter() - started
    con.close()
    workers = children(gateway_pid)
    peaks = {"gateway": rss_mb(gateway_pid), "worker": max((rss_mb(w) for w in workers), default=float("nan"))}
    idle_gateway = peaks["gateway"]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            peaks["gateway"] = max(peaks["gateway"], rss_mb(gateway_pid))
            peaks["worker"] = max([peaks["worker"], *(rss_mb(w) for w in workers)])

    threading.Thread(target=sample, daemon=True).start()
    headers = {"X-Trino-User": "bench"}
    started, raw_rows = time.perf_counter(), 0
    with httpx.Client(timeout=60) as client:
        doc = client.post(f"http://127.0.0.1:{port}/v1/statement", content=sql, headers=headers).json()
        query_id = doc["id"]
        while True:
            raw_rows += len(doc.get("data") or [])
            if "nextUri" not in doc:
                break
            doc = client.get(doc["nextUri"], headers=headers).json()
        raw_s = time.perf_counter() - started
        attempts = client.get(f"http://127.0.0.1:{port}/v1/query/{query_id}", headers=headers).json()["attempts"]
    worker_s = attempts[-1]["end_s"] - attempts[-1]["start_s"]
    cur = trino.dbapi.connect(host="127.0.0.1", port=port, user="bench").cursor()
    started, rows = time.perf_counter(), 0
    cur.execute(sql)
    while batch := cur.fetchmany(10_000):
        rows += len(batch)
    trino_s = time.perf_counter() - started
    stop.set()
    return {"rows": rows, "raw_rows": raw_rows, "duckdb_s": round(duck_s, 2), "raw_protocol_s": round(raw_s, 2),
            "trino_client_s": round(trino_s, 2), "ratio_trino_vs_duckdb": round(trino_s / duck_s, 2),
            "worker_run_s": round(worker_s, 2), "client_decode_s": round(max(0.0, trino_s - raw_s), 2),
            "gateway_idle_mb": round(idle_gateway, 1), "gateway_peak_mb": round(peaks["gateway"], 1),
            "gateway_growth_mb": round(peaks["gateway"] - idle_gateway, 1),
            "worker_peak_mb": round(peaks["worker"], 1)}


def concurrent(args: argparse.Namespace, port: int) -> dict[str, object]:
    import trino

    from sloctl.datasets import load_templates

    q6 = next(t.sql for t in load_templates("tpch") if t.name == "tpch-q06")

    def run(latencies: list[float]) -> None:
        cur = trino.dbapi.connect(host="127.0.0.1", port=port, user="bench").cursor()
        for _ in range(args.repeat):
            t = time.perf_counter()
            cur.execute(q6)
            cur.fetchall()
            latencies.append(time.perf_counter() - t)

    serial: list[float] = []
    started = time.perf_counter()
    for _ in range(args.clients):
        run(serial)
    serial_s = time.perf_counter() - started
    shared: list[float] = []
    threads = [threading.Thread(target=run, args=(shared,)) for _ in range(args.clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"clients": args.clients, "queries": len(shared), "wall_s": round(wall, 2),
            "p50_ms": round(1000 * statistics.median(shared), 1), "serial_wall_s": round(serial_s, 2),
            "serial_p50_ms": round(1000 * statistics.median(serial), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=0.3)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from sloctl.datasets.tpc import ensure_database
    from sloctl.serving.local import free_port

    db = ensure_database("tpch", args.sf, Path(args.data_dir), log=None)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sloctl.cli", "gateway", "--db", str(db), "--port", str(port),
                             "--router", "least-queued", "--json", "--log-dir",
                             str(Path(args.data_dir) / "bench-gateway-logs")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        json.loads(proc.stdout.readline())
        time.sleep(1.0)
        result = {"sf": args.sf, "select_1": select_one(args, port, db),
                  "fetch": big_fetch(args, port, db, proc.pid), "concurrent": concurrent(args, port)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if args.json:
        print(json.dumps(result))
        return 0
    s, f, c = result["select_1"], result["fetch"], result["concurrent"]
    print(f"SELECT 1 ({args.rounds} rounds), p50 / p99 ms:")
    for name in ("gateway", "duckdb", "http_floor"):
        print(f"  {name:<11} {s[name]['p50_ms']:8.2f} / {s[name]['p99_ms']:.2f}")
    print(f"  gateway - duckdb {s['gateway_minus_duckdb_ms']:.2f} ms; gateway - HTTP floor "
          f"{s['gateway_minus_http_floor_ms']:.2f} ms")
    print(f"{f['rows']:,} lineitem rows: DuckDB API {f['duckdb_s']} s, raw protocol {f['raw_protocol_s']} s, "
          f"trino client {f['trino_client_s']} s ({f['ratio_trino_vs_duckdb']}x DuckDB)")
    print(f"  worker run {f['worker_run_s']} s, client decode {f['client_decode_s']} s; gateway RSS "
          f"{f['gateway_idle_mb']} -> {f['gateway_peak_mb']} MB, worker peak {f['worker_peak_mb']} MB")
    print(f"{c['clients']} clients x {args.repeat} TPC-H Q6: {c['wall_s']} s wall, p50 {c['p50_ms']} ms "
          f"(one after another: {c['serial_wall_s']} s, p50 {c['serial_p50_ms']} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
