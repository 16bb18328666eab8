"""Route+complete throughput of one runtime replica vs two on one Redis (issue 20), measured side by side.

Trains the tiny Iconq+ model of ``bench_runtime.py`` (registered in a
temporary SQLite registry, routed with its template table), starts a Redis
server on loopback (the test suite's ``tests/servers.py``) and then, for
several rounds alternating the two set-ups, ``N`` ``sloctl serve`` processes
sharing ``state.url`` (N = 1, then 2) on a pool of 4 clusters. A closed-loop
load of 96 keep-alive clients (``sloctl.experiments.replicas.drive``: one
asyncio process, a hand-written HTTP/1.1 client) routes a query on one
replica and completes it on the next, for ``--seconds`` per round after a
short warm-up. Throughput is completed pairs per second; the figure is the
ratio of the medians over rounds (with each round's ratio), both set-ups
measured in the same run on the same machine.

The load generator and Redis run on the same cores as the replicas: on a
2-core machine two replicas compete with them, so the ratio is a floor for
replicas on machines of their own. Each round also reports who spent the
CPU, in milliseconds per completed pair (replicas, Redis, the load
generator, the rest of the machine from ``/proc/stat``) and how busy the
machine was: what bounds the ratio here.

Run: ``.venv/bin/python benchmarks/bench_replicas.py [--rounds 3] [--seconds 15] [--json]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-replicas-token-0123456789"
CLUSTER_SIZES = (1, 1, 2, 2)


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def run_round(n: int, folder: Path, redis_url: str, info: dict[str, str | None], *, seconds: float, workers: int,
              round_no: int, redis_pid: int) -> dict[str, float]:
    from sloctl.experiments.replicas import drive, start_replicas, write_config

    prefix = f"bench{n}r{round_no}"
    config = write_config(folder / f"{prefix}.yaml", state_url=redis_url, prefix=prefix,
                          tracking_uri=info["tracking_uri"], cluster_sizes=CLUSTER_SIZES, minimum_s=60.0,
                          templates_log=info["templates"])
    replicas = start_replicas(n, config, TOKEN, folder)
    try:
        templates = ["t00", "t01", "t02", "t03", "t04", "t05"]
        drive(replicas, TOKEN, route_pairs=10**7, workers=workers, seed=round_no, templates=templates,
              duration_s=2.0, first_id=0)  # warm-up: models loaded, connections open, caches hot
        pids = [r.process.pid for r in replicas]
        before = ([cpu_s(p) for p in pids], cpu_s(redis_pid), os.times(), machine_busy_s())
        load = drive(replicas, TOKEN, route_pairs=10**7, workers=workers, seed=round_no, templates=templates,
                     duration_s=seconds, first_id=10**8)
        after = ([cpu_s(p) for p in pids], cpu_s(redis_pid), os.times(), machine_busy_s())
    finally:
        for r in replicas:
            r.stop()
    if load.server_errors:
        raise RuntimeError(f"{load.server_errors} server errors with {n} replicas: {dict(load.statuses)}")
    pairs = len(load.completed)
    per_pair_ms = 1e3 / pairs  # CPU milliseconds per completed pair, by who spent them
    replicas_s = sum(b - a for a, b in zip(before[0], after[0], strict=True))
    loadgen_s = (after[2].user - before[2].user) + (after[2].system - before[2].system)
    busy_s, total_s = after[3][0] - before[3][0], after[3][1] - before[3][1]
    return {"replicas": n, "pairs": pairs, "wall_s": load.wall_s, "pairs_per_s": pairs / load.wall_s,
            "cpu_ms_per_pair": {"replicas": replicas_s * per_pair_ms, "redis": (after[1] - before[1]) * per_pair_ms,
                                "load_generator": loadgen_s * per_pair_ms,
                                "other": (busy_s - replicas_s - (after[1] - before[1]) - loadgen_s) * per_pair_ms},
            "machine_busy": busy_s / total_s}


def prepare_stage(bench_runtime, folder: Path) -> dict[str, str]:
    """A Stage model alone in the registry (the runtime's first fallback router), on bench_runtime's log."""
    from sloctl.config import load_config
    from sloctl.datasets.querylog import write_log
    from sloctl.registry.store import register
    from sloctl.training.pipeline import train_stage

    log = bench_runtime.synthetic_log()
    uri = f"sqlite:///{folder / 'mlflow-stage.db'}"
    register(train_stage(log, load_config().stage), log, name="stage", tracking_uri=uri, experiment="bench")
    return {"tracking_uri": uri, "templates": str(write_log(log, folder / "templates-stage.parquet"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=96, help="closed-loop clients (enough to keep two busy)")
    parser.add_argument("--router", choices=["iconq", "stage", "round-robin"], default="iconq",
                        help="iconq: the tiny Iconq+ model routes (each replica keeps every running query's "
                             "incremental state); stage: a Stage model only (concurrency-unaware, cost-aware); "
                             "round-robin: no model registered")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    bench_runtime = _module(ROOT / "benchmarks" / "bench_runtime.py", "_bench_runtime")
    servers = _module(ROOT / "tests" / "servers.py", "_sloctl_test_servers")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.router == "iconq":
            print("training the tiny Iconq+ model ...", file=sys.stderr)
            info = bench_runtime.prepare(folder)
        elif args.router == "stage":
            info = prepare_stage(bench_runtime, folder)
        else:
            from sloctl.registry.store import connect

            info = {"tracking_uri": f"sqlite:///{folder / 'empty.db'}", "templates": None}
            connect(info["tracking_uri"])
        redis = servers.start_redis()
        rows = []
        try:
            for k in range(args.rounds):
                for n in ((1, 2) if k % 2 == 0 else (2, 1)):  # alternate the order: drift hits both alike
                    row = run_round(n, folder, redis.url, info, seconds=args.seconds, workers=args.workers,
                                    round_no=k, redis_pid=redis.process.pid)
                    cpu = ", ".join(f"{who} {ms:.2f}" for who, ms in row["cpu_ms_per_pair"].items())
                    print(f"round {k}: {n} replica(s): {row['pairs_per_s']:.1f} route+complete pairs/s; CPU ms per "
                          f"pair: {cpu}; machine busy {row['machine_busy']:.0%}", file=sys.stderr)
                    rows.append({**row, "round": k})
        finally:
            redis.stop()
    one = [r["pairs_per_s"] for r in rows if r["replicas"] == 1]
    two = [r["pairs_per_s"] for r in rows if r["replicas"] == 2]
    per_round = [b / a for a, b in zip(one, two, strict=True)]
    out = {"bench": "replicas", "router": args.router, "cluster_sizes": list(CLUSTER_SIZES), "workers": args.workers,
           "seconds": args.seconds, "rounds": rows, "one_replica_pairs_per_s": statistics.median(one),
           "two_replicas_pairs_per_s": statistics.median(two),
           "ratio": statistics.median(two) / statistics.median(one), "ratio_per_round": per_round,
           "cpu_ms_per_pair": {n: {who: statistics.median(r["cpu_ms_per_pair"][who] for r in rows
                                                          if r["replicas"] == n)
                                   for who in rows[0]["cpu_ms_per_pair"]} for n in (1, 2)},
           "command": "python benchmarks/bench_replicas.py " + " ".join(sys.argv[1:])}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{args.router}: route+complete pairs/s: 1 replica {out['one_replica_pairs_per_s']:.1f}, 2 replicas "
              f"{out['two_replicas_pairs_per_s']:.1f}: ratio {out['ratio']:.2f} "
              f"(per round {', '.join(f'{r:.2f}' for r in per_round)})")
        for n, cpu in out["cpu_ms_per_pair"].items():
            print(f"  CPU ms per pair with {n} replica(s): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))


if __name__ == "__main__":
    main()
