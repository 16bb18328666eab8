"""Dispatch lag on idle clusters: scheduled arrival -> query start.

Every query is a trivial ``SELECT``, spaced far enough apart that the cluster
is idle when it arrives, so the lag measures sloctl's own path (coordinator
timer, pipe to the worker, thread start, cursor). Target: p99 under 5 ms.
For scale it also times, in the same run, a bare ``time.sleep`` to the same
deadlines (the floor any dispatcher on this machine pays).

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_dispatch_lag.py [--n 400]``
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from sloctl.datasets.collect import collect
from sloctl.datasets.tpc import ensure_database
from sloctl.datasets.workloads import Workload, WorkloadQuery


def sleep_floor(n: int, gap_s: float) -> np.ndarray:
    lags = []
    base = time.monotonic() + 0.05
    for i in range(n):
        due = base + i * gap_s
        time.sleep(max(0.0, due - time.monotonic()))
        lags.append(time.monotonic() - due)
    return np.asarray(lags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=400, help="queries per cluster size")
    parser.add_argument("--gap-s", type=float, default=0.02, help="spacing between arrivals")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = ensure_database("tpch", 0.01, tmp, log=None)
        wl = Workload("idle-probe", tuple(WorkloadQuery("select", f"SELECT {i}", i * args.gap_s)
                                          for i in range(args.n)))
        floor = sleep_floor(args.n, args.gap_s) * 1000
        print(f"{'case':<22}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}")
        print(f"{'time.sleep floor':<22}" + "".join(f"{np.percentile(floor, q):9.3f}" for q in (50, 90, 99, 100)))
        p99s = {}
        for size in (1, 2):
            lags = np.asarray(collect(db, wl, [size], log=None).dispatch_lag_s) * 1000
            p99s[size] = np.percentile(lags, 99)
            print(f"{f'idle cluster size {size}':<22}" + "".join(f"{np.percentile(lags, q):9.3f}"
                                                          for q in (50, 90, 99, 100)))
        floor99 = max(np.percentile(floor, 99), 1e-3)
        for size, p99 in p99s.items():
            verdict = "OK" if p99 < 5.0 else "ABOVE TARGET"
            print(f"size {size}: p99 {p99:.2f} ms = {p99 / floor99:.1f}x the sleep floor; target < 5 ms: {verdict}")


if __name__ == "__main__":
    main()
