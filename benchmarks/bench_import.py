"""Import speed and memory on a log of real size (issue 34, Build 5).

Generates a canonical execution CSV of ``--rows`` rows (default 1,000,000)
drawn from ``--texts`` distinct query texts (default 5,000: 500 shapes with
10 literal variants each, so fingerprints repeat), seeded, on 4 clusters with
Poisson arrivals and log-normal latencies, 2 % timeouts and 1 % errors; then
imports it with :func:`sloctl.datasets.executions.import_executions` and
writes the log, reporting rows per second for the import and for the write,
and the peak resident memory of the process (``ru_maxrss``, which includes
generating the CSV, done first in a child process so that it does not count).

Target (issue 34): 1,000,000 rows in under 3 minutes with peak memory under
2 GB on the 2-core development machine.

Run: ``.venv/bin/python benchmarks/bench_import.py [--rows 1000000] [--texts 5000] [--keep DIR]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

_TABLES = ("lineitem", "orders", "customer", "part", "supplier", "partsupp", "nation", "region")


def _shape(i: int) -> str:
    """One of the query shapes, with ``{v}`` where a literal goes."""
    a, b = _TABLES[i % 8], _TABLES[(i // 8) % 8]
    kind = i % 5
    if kind == 0:
        return f"SELECT count(*) FROM {a} WHERE {a[0]}_key{i} > {{v}}"
    if kind == 1:
        return (f"SELECT x.k{i}, sum(y.v) FROM {a} x JOIN {b} y ON x.k = y.k "
                f"WHERE y.d < DATE '1995-01-{{v2}}' GROUP BY 1")
    if kind == 2:
        return (f"WITH t AS (SELECT k, avg(v) AS m FROM {a} GROUP BY k) SELECT * FROM t WHERE m > {{v}} "
                f"AND k IN (SELECT k FROM {b} WHERE c{i} = 'x{{v}}')")
    if kind == 3:
        return f"SELECT k, rank() OVER (PARTITION BY g{i} ORDER BY v) FROM {a} WHERE v BETWEEN {{v}} AND {{v}} + 10"
    return f"SELECT * FROM {a} WHERE name{i} LIKE '%{{v}}%' ORDER BY 1 LIMIT 100"


def generate(path: Path, rows: int, texts: int, seed: int = 0) -> None:
    """Write the canonical CSV (sql, arrival_s, start_s, end_s, status, cluster_id, cluster_size, query_id)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(seed)
    variants = 10
    pool = np.array([_shape(i // variants).replace("{v2}", f"{(i % variants) + 10:02d}").replace(
        "{v}", str(100 + i % variants)) for i in range(texts)], dtype=object)
    clusters = np.array(["wh-a", "wh-b", "wh-c", "wh-d"], dtype=object)
    sizes = np.array([1, 2, 4, 8])
    chunk = 250_000
    writer = None
    t0 = 0.0
    for lo in range(0, rows, chunk):
        n = min(chunk, rows - lo)
        arrival = t0 + np.cumsum(rng.exponential(0.05, n))
        t0 = float(arrival[-1])
        queue = rng.exponential(0.02, n) * (rng.random(n) < 0.3)
        latency = rng.lognormal(0.0, 1.0, n)
        status = np.where(rng.random(n) < 0.02, "timeout", np.where(rng.random(n) < 0.01, "error", "ok"))
        c = rng.integers(0, 4, n)
        table = pa.table({
            "query_id": np.arange(lo, lo + n), "sql": pool[rng.integers(0, texts, n)],
            "arrival_s": arrival, "start_s": arrival + queue, "end_s": arrival + queue + latency,
            "status": status, "cluster_id": clusters[c], "cluster_size": sizes[c]})
        if writer is None:
            writer = pcsv.CSVWriter(str(path), table.schema)
        writer.write_table(table)
    writer.close()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--texts", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="write the CSV and log here (default: a temp dir)")
    args = parser.parse_args(argv)

    from sloctl.datasets.executions import import_executions
    from sloctl.datasets.querylog import write_log

    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-import-"))
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, out = folder / "executions.csv", folder / "imported.parquet"
    t = time.perf_counter()
    child = multiprocessing.get_context("spawn").Process(target=generate, args=(csv_path, args.rows, args.texts,
                                                                                 args.seed))
    child.start()
    child.join()
    if child.exitcode != 0:
        print("error: generating the CSV failed", file=sys.stderr)
        return 1
    gen_s = time.perf_counter() - t
    print(f"generated {args.rows:,} rows, {args.texts:,} distinct texts, "
          f"{csv_path.stat().st_size / 1e6:.0f} MB CSV in {gen_s:.1f} s")
    base_mb = _peak_rss_mb()
    t = time.perf_counter()
    result = import_executions(csv_path)
    import_s = time.perf_counter() - t
    import_peak_mb = _peak_rss_mb()
    t = time.perf_counter()
    write_log(result.log, out, metadata=result.metadata)
    write_s = time.perf_counter() - t
    r = result.report
    assert r.imported + r.censored + r.refused == r.read == args.rows
    peak_mb = _peak_rss_mb()
    total_s = import_s + write_s
    print(f"import: {import_s:.1f} s ({r.read / import_s:,.0f} rows/s); write: {write_s:.1f} s; "
          f"total {total_s:.1f} s ({r.read / total_s:,.0f} rows/s)")
    print(f"rows: read {r.read:,}, imported {r.imported:,}, censored {r.censored:,}, refused {r.refused:,}; "
          f"features: {r.feature_source}; unparseable: {r.parse_failures}")
    print(f"peak RSS: {peak_mb:,.0f} MB (before the import: {base_mb:,.0f} MB, after it: {import_peak_mb:,.0f} MB); "
          f"targets: < 180 s -> {'met' if total_s < 180 else 'MISSED'}, < 2048 MB -> "
          f"{'met' if peak_mb < 2048 else 'MISSED'}")
    print(f"command: .venv/bin/python benchmarks/bench_import.py --rows {args.rows} --texts {args.texts} "
          f"--seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
