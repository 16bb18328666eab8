"""Latency models on real DuckDB runs: accuracy of the ablation variants and
the cost per arrival of incremental inference.

1. Collects a TPC-H log on clusters of size 1 and 2 across light to heavy
   load: an isolated pass, BaseWorkload(λ) at several rates and a phased
   workload (AutoSLO §8.3.2, scaled to this machine). The log is kept in
   ``reports/bench_latency_log.parquet`` and reused with ``--reuse-log``.
2. Trains Stage and the four variants of §8.3.1 (Iconq, +Size, +Censored,
   Iconq+) on the same split and prints Q-error p50/p90/p95 on the held-out
   test queries that ran with neighbours (and on all test queries).
3. Times one arrival with R running queries (R = 10, 50, 100): Iconq+'s
   incremental update (one LSTM step for every running query, batched, plus
   the new query's before-pass) against re-ingesting every running query's
   neighbour sequences, both on the trained network, side by side.

Targets: Iconq+ p90 <= 0.7 x Stage p90 on queries with neighbours;
incremental >= 10x faster than re-ingestion at R = 100 and < 5 ms.

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_latency_models.py [--quick] [--reuse-log]``
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from sloctl.config import load_config
from sloctl.datasets.collect import collect, concat_logs
from sloctl.datasets.querylog import read_log, write_log
from sloctl.datasets.tpc import ensure_database, load_templates
from sloctl.datasets.workloads import base_workload, isolated_workload, phased_workload
from sloctl.models.batches import collate_rows
from sloctl.models.iconq import IncrementalIconq
from sloctl.training.pipeline import train_iconq, train_stage

LOG_PATH = Path("reports/bench_latency_log.parquet")
BUNDLE_PATH = Path("reports/bench_iconq_plus")
VARIANT_NAMES = {"iconq": "Iconq", "size": "+Size", "censored": "+Censored", "iconq_plus": "Iconq+"}


def collect_log(sf: float, quick: bool, seed: int) -> object:
    cfg = load_config()
    db = ensure_database("tpch", sf, cfg.warehouse.data_dir)
    templates = load_templates("tpch")
    rates = (3.0, 8.0) if quick else (2.0, 4.0, 8.0)
    copies = 2 if quick else 3
    workloads = [isolated_workload(templates, 1, seed=seed)]
    workloads += [base_workload(templates, rate, copies, seed=seed + i) for i, rate in enumerate(rates)]
    workloads.append(phased_workload(templates, copies, low_rate_per_s=1.0, high_rate_per_s=12.0, low_count=10,
                                     high_count=10, seed=seed + 10))
    parts, labels = [], []
    for i, workload in enumerate(workloads):
        print(f"collecting {workload.name} {workload.params} on sizes 1,2 ...", flush=True)
        parts.append(collect(db, workload, [1, 2], timeout_s=30.0, log=None).log)
        labels.append(f"{workload.name}{i}")
    log = concat_logs(parts, labels)
    write_log(log, LOG_PATH, metadata={"benchmark": "tpch", "scale_factor": sf, "purpose": "bench_latency_models"})
    return log


def accuracy(log, max_epochs: int, seed: int) -> dict[str, dict[str, float]]:
    cfg = load_config()
    iconq = dataclasses.replace(cfg.iconq, max_epochs=max_epochs, seed=seed)
    results = {"Stage-only": train_stage(log, cfg.stage, val_fraction=iconq.val_fraction,
                                         test_fraction=iconq.test_fraction, seed=seed).metrics}
    trained = {}
    for variant, label in VARIANT_NAMES.items():
        started = time.perf_counter()
        result = train_iconq(log, cfg.stage, dataclasses.replace(iconq, variant=variant))
        results[label] = result.metrics
        trained[variant] = result
        print(f"trained {label:<10} in {time.perf_counter() - started:5.1f} s "
              f"({result.metrics['epochs']:.0f} epochs)", flush=True)
    return results, trained["iconq_plus"]


def time_arrival(net, pair_dim: int, self_dim: int, running: int, repeats: int, seed: int) -> tuple[float, float]:
    """Median ms per arrival: (incremental, full re-ingestion), same network and inputs."""
    rng = np.random.default_rng(seed)
    pairs = rng.normal(size=(running + 1, running + 1, pair_dim)).astype(np.float32)  # pairs[q, n]
    own = rng.normal(size=(running + 1, self_dim)).astype(np.float32)
    items = [{"self_x": own[i], "before": pairs[i, :i], "after": pairs[i, i + 1:], "base_log": 0.0}
             for i in range(running + 1)]

    def full() -> None:  # Iconq: every running query's sequences are ingested again
        batch = collate_rows(items)
        with torch.no_grad():
            net(batch["self_x"], batch["before_x"], batch["before_len"], batch["after_x"], batch["after_len"],
                batch["base_log"])

    inc = IncrementalIconq(net)
    for i in range(running):
        inc.add_query(i, torch.from_numpy(own[i]), torch.from_numpy(pairs[i, :i]), 0.0)
    keys = list(range(running))
    new_before = torch.from_numpy(pairs[running, :running])
    new_as_neighbour = torch.from_numpy(pairs[:running, running])
    counter = iter(range(running, running + 10 * repeats + 10))

    def incremental() -> None:  # Iconq+: the new query's before-pass + one step per running query
        key = next(counter)
        inc.add_query(key, torch.from_numpy(own[running]), new_before, 0.0)
        inc.add_neighbour(keys, new_as_neighbour)
        inc.remove(key)

    timings = {}
    for name, fn in (("incremental", incremental), ("full", full)):
        fn()
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
        timings[name] = float(np.median(samples)) * 1000
    return timings["incremental"], timings["full"]


def main() -> None:
    parser = argparse.ArgumentParser(description="Latency-model accuracy and incremental-inference speed.")
    parser.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--quick", action="store_true", help="fewer workloads and epochs")
    parser.add_argument("--reuse-log", action="store_true", help=f"reuse {LOG_PATH} if present")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # per-arrival latency on one core, as in a router's hot path
    if args.reuse_log and LOG_PATH.is_file():
        log = read_log(LOG_PATH)
        print(f"reusing {LOG_PATH} ({len(log)} rows)")
    else:
        log = collect_log(args.sf, args.quick, args.seed)
    print(f"log: {len(log)} queries, {int((log['status'] == 'ok').sum())} ok, sizes "
          f"{sorted(log['cluster_size'].unique().tolist())}")
    results, iconq_plus = accuracy(log, max_epochs=30 if args.quick else 100, seed=args.seed)

    print("\nQ-error on held-out test queries (same split for every model)")
    print(f"{'model':<12}{'with neighbours: n':>20}{'p50':>8}{'p90':>8}{'p95':>8}   {'all: n':>7}{'p50':>8}"
          f"{'p90':>8}{'p95':>8}")
    stats = ("p50", "p90", "p95")
    for label, m in results.items():
        concurrent = "".join(f"{m[f'test_concurrent_q_error_{s}']:8.3f}" for s in stats)
        every = "".join(f"{m[f'test_q_error_{s}']:8.3f}" for s in stats)
        print(f"{label:<12}{m['test_concurrent_n']:20.0f}{concurrent}   {m['test_n']:7.0f}{every}")
    ratio = results["Iconq+"]["test_concurrent_q_error_p90"] / results["Stage-only"]["test_concurrent_q_error_p90"]
    verdict = "OK" if ratio <= 0.7 else "ABOVE TARGET"
    print(f"Iconq+ p90 / Stage-only p90 on queries with neighbours: {ratio:.2f} (target <= 0.70): {verdict}")

    from sloctl.registry.bundles import save_predictor

    save_predictor(iconq_plus.predictor, BUNDLE_PATH)
    print(f"saved the Iconq+ model to {BUNDLE_PATH} (used by bench_router.py)")
    net = iconq_plus.predictor.net.eval()
    print("\nTime per arrival with R running queries (trained Iconq+ network, median of 50, one thread)")
    print(f"{'R':>5}{'incremental ms':>16}{'re-ingestion ms':>17}{'speed-up':>10}")
    for running in (10, 50, 100):
        inc_ms, full_ms = time_arrival(net, net.config.pair_dim, net.config.self_dim, running, 50, args.seed)
        print(f"{running:5d}{inc_ms:16.3f}{full_ms:17.3f}{full_ms / inc_ms:9.1f}x")
        if running == 100:
            ok = full_ms / inc_ms >= 10 and inc_ms < 5
            print(f"R=100: incremental {inc_ms:.2f} ms, {full_ms / inc_ms:.1f}x faster (targets: >= 10x, < 5 ms): "
                  f"{'OK' if ok else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
