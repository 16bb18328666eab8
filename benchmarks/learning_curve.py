"""Iconq+'s learning curve on a simulated log of a warehouse's size, graded on a later time slice (issue 53).

1. Simulates ``--rows`` executions from the world of ``--world`` (default: the
   SF 0.1 training logs, as ``benchmarks/bench_training.py`` does; same seed,
   same log).
2. Splits it by time (``iconq.split: time``): the earliest rows train, the
   next 15% validate, the latest 15% test.
3. Trains Iconq+ to its early stopping on the first 10k, 30k, 100k, 300k, ...
   rows of the training split in time, then on all of it (each point as
   ``train_iconq_curve(full=True)`` trains it: the same seeds, the same
   validation rows), and reports each point's validation and test p50 / p90
   Q-error, epochs and wall time.
4. Applies the automatic stopping rule (``iconq.learn_rows: curve``: stop once
   a larger prefix improves validation p90 by less than
   ``iconq.curve_tolerance``) to the same points, and reports the test p90 of
   the model it keeps against the curve's best test p90.

Run: ``.venv/bin/python benchmarks/learning_curve.py [--rows 1000000] [--json]`` (about 40 minutes at 1M
rows on 2 cores; ``--max-point-s`` bounds each point).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WORLD = sorted((REPO / "data" / "logs").glob("train3-0.1-r*.parquet"))


def rule_pick(points: list[dict], tolerance: float) -> int:
    """The point ``iconq.learn_rows: curve`` keeps: it adds data while validation p90 improves by at least
    ``tolerance`` (relative) on the best so far, and keeps the best point seen (``train_iconq_curve``)."""
    best = 0
    for i in range(1, len(points)):
        gain = 1.0 - points[i]["val_p90"] / points[best]["val_p90"]
        if points[i]["val_p90"] < points[best]["val_p90"]:
            best = i
        if gain < tolerance:
            break
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--world", type=Path, action="append")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-point-s", type=float, default=None, help="iconq.max_train_s of each point.")
    parser.add_argument("--log", type=Path, default=None, help="Use this log instead of simulating one.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from sloctl.core.config import IconqSection
    from sloctl.datasets.merge import merge_logs
    from sloctl.datasets.querylog import read_log
    from sloctl.models.stage import StageConfig
    from sloctl.simulation.log_synth import simulate_log
    from sloctl.training.pipeline import CURVE_ROWS, curve_rows, iconq_splits, train_iconq

    if args.log is not None:
        log = read_log(args.log)
    else:
        worlds = args.world or DEFAULT_WORLD
        world = read_log(worlds[0]) if len(worlds) == 1 else merge_logs(worlds)[0]
        log = simulate_log(world, args.rows, seed=args.seed)
        from sloctl.datasets.querylog import validate_log

        log = validate_log(log, source="simulated log")
    cfg = IconqSection(seed=args.seed, split="time", learn_rows="all", max_train_s=args.max_point_s)
    pool = iconq_splits(log, cfg)["train"]
    pool = pool[np.lexsort((log["query_id"].to_numpy()[pool], log["arrival_s"].to_numpy(dtype=float)[pool]))]
    points = []
    for n in curve_rows(len(pool), CURVE_ROWS):
        t = time.perf_counter()
        result = train_iconq(log, StageConfig(), replace(cfg), train_rows=pool[:n], risk_quantile=None)
        m, p = result.metrics, result.params
        point = {"rows": int(n), "val_p50": m["val_q_error_p50"], "val_p90": m["val_q_error_p90"],
                 "test_p50": m["test_q_error_p50"], "test_p90": m["test_q_error_p90"], "epochs": int(m["epochs"]),
                 "stopped_by": p["iconq_stopped_by"], "batch": p["iconq_batch_size_used"],
                 "precision": p["iconq_precision_used"], "samples_per_s": m["train_samples_per_s"],
                 "wall_s": time.perf_counter() - t}
        points.append(point)
        print(f"{n:>9,} rows: val p50/p90 {point['val_p50']:.3f}/{point['val_p90']:.3f}, test p50/p90 "
              f"{point['test_p50']:.3f}/{point['test_p90']:.3f}, {point['epochs']} epochs ({point['stopped_by']}), "
              f"{point['wall_s']:.0f} s", file=sys.stderr, flush=True)
    pick = rule_pick(points, cfg.curve_tolerance)
    best_test = min(p["test_p90"] for p in points)
    report = {"rows": len(log), "train_rows": len(pool), "split": "time", "seed": args.seed, "points": points,
              "rule_rows": points[pick]["rows"], "rule_test_p90": points[pick]["test_p90"],
              "best_test_p90": best_test, "rule_vs_best": points[pick]["test_p90"] / best_test - 1.0}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"stopping rule keeps {report['rule_rows']:,} rows: test p90 {report['rule_test_p90']:.3f}, "
              f"{100 * report['rule_vs_best']:+.1f}% against the curve's best ({best_test:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
