"""Query Router decision time (AutoSLO Algorithm 1) as the pool grows.

For C active clusters with R running queries on each, times one routing
decision of the Iconq+ router (counterfactual predictions for every cluster
in one batched incremental step, guard, violations, billing projection,
commit), then completes the routed query so that the load stays at C × R.
Round-robin is timed in the same run for scale. Target: p99 under 10 ms at
4 clusters × 32 running queries each.

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_router.py --model models:/iconq@champion``
(needs a trained Iconq+ model: ``make demo`` registers one).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from sloctl.config import load_config
from sloctl.control.billing import BillingTimer
from sloctl.control.router import ClusterState, IconqRouter, Query, RoundRobinRouter
from sloctl.datasets.querylog import read_log
from sloctl.models.online import OnlinePredictor
from sloctl.registry.store import load_model


class _RecomputingPredictor(OnlinePredictor):
    """The commit path before it stored the router's counterfactual step (for the side-by-side ratio)."""

    def commit(self, *args, **kwargs):
        self._pending = None
        return super().commit(*args, **kwargs)


def time_decisions(predictor, table, n_clusters: int, running: int, decisions: int, seed: int,
                   recompute: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    templates = table["template"].tolist()
    model = (_RecomputingPredictor if recompute else OnlinePredictor)(predictor, table)
    router = IconqRouter(model)
    clusters = [ClusterState(f"c{i}", 1 + i % 2, BillingTimer(60.0)) for i in range(n_clusters)]
    qid, now = 0, 0.0
    for t in templates:  # features (plan vector, Stage estimate) are computed once per template and size
        for size in (1, 2):
            model.features(t, size)
    for c in clusters:
        for _ in range(running):
            now += 0.001
            model.commit(qid, rng.choice(templates), now, 10.0, c.cluster_id, c.size, now)
            c.timer.query_arrived(now)
            qid += 1
    samples = []
    for _ in range(decisions):
        now += 0.001
        query = Query(qid, rng.choice(templates), now, 10.0)
        started = time.perf_counter()
        decision = router.route(query, clusters, now)
        samples.append(time.perf_counter() - started)
        router.on_complete(qid, now)  # keep the load constant
        del decision
        qid += 1
    return np.asarray(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description="Router decision time vs clusters and running queries.")
    parser.add_argument("--model", default=None,
                        help="default: reports/bench_iconq_plus (from bench_latency_models.py), else the champion")
    parser.add_argument("--log", default=None, help="log whose templates give features (default: the bench log, "
                        "else the demo log)")
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = args.model or ("reports/bench_iconq_plus" if Path("reports/bench_iconq_plus").is_dir()
                           else "models:/iconq@champion")
    predictor = load_model(model, tracking_uri=load_config().registry.tracking_uri)
    print(f"model: {model}")
    log = args.log or ("reports/bench_latency_log.parquet" if Path("reports/bench_latency_log.parquet").is_file()
                       else "reports/demo_log.parquet")
    table = read_log(log).drop_duplicates("template").reset_index(drop=True)
    rr = RoundRobinRouter()
    clusters = [ClusterState(f"c{i}", 1, BillingTimer(60.0)) for i in range(4)]
    rr_ms = []
    for i in range(1000):
        started = time.perf_counter()
        rr.route(Query(i, "t", 0.0, 1.0), clusters, 0.0)
        rr_ms.append((time.perf_counter() - started) * 1000)
    print(f"round-robin decision: p50 {np.percentile(rr_ms, 50):.4f} ms (for scale)")
    print(f"{'clusters':>8}{'running/cluster':>17}{'N':>6}{'p50 ms':>9}{'p99 ms':>9}")
    target = None
    for n_clusters in (2, 4, 8):
        for running in (8, 32, 64):
            ms = time_decisions(predictor, table, n_clusters, running, args.decisions, args.seed)
            p50, p99 = np.percentile(ms, 50), np.percentile(ms, 99)
            print(f"{n_clusters:8d}{running:17d}{n_clusters * running:6d}{p50:9.3f}{p99:9.3f}", flush=True)
            if (n_clusters, running) == (4, 32):
                target = p99
    print(f"4 clusters x 32 running: p99 {target:.2f} ms (target < 10 ms): {'OK' if target < 10 else 'ABOVE TARGET'}")
    print("commit storing the router's step vs recomputing it (same run, same seed):")
    for n_clusters, running in ((2, 8), (2, 16), (4, 32)):
        reuse = np.percentile(time_decisions(predictor, table, n_clusters, running, args.decisions, args.seed), 50)
        again = np.percentile(time_decisions(predictor, table, n_clusters, running, args.decisions, args.seed,
                                             recompute=True), 50)
        print(f"  {n_clusters} x {running}: p50 {reuse:.3f} ms vs {again:.3f} ms, ratio {reuse / again:.2f}")


if __name__ == "__main__":
    main()
