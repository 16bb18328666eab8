"""Policy Tuner efficiency (AutoSLO §8.8.3): SimulateBatch throughput and FindGoodSpinupTime time.

The paper's sizes are 15,000 queries per forecast and 10 forecasts. This
bench builds that many seeded forecasts with a day-shaped arrival contour in
a synthetic emulated warehouse (22 templates, sizes 1 and 2, two size-1
clusters at the start, the busiest hours above their capacity) and times:

* SimulateBatch of 2 configurations (no schedule; one scheduled spin-up) × the
  forecasts on a process pool: simulated queries per second per core;
* FindGoodSpinupTime, the linear scan of Algorithm 5 over the 10 timelines;
* one attempt of Algorithm 4 (a spin-up of each of 2 sizes at the first
  candidate time, simulated on every forecast).

The runner routes round-robin with scheduled spin-ups only (no reactive
autoscaler, no latency model), so the throughput is that of the simulator
itself; an Iconq+ router adds its per-decision cost on top (bench_router.py).
``--scale`` shrinks the forecasts (0.1: 1,500 queries); the scan and the
simulation are close to linear in the query count, and the script prints the
linear extrapolation to full size, labelled as such.

With ``--log`` and ``--model`` it times instead what the Policy Tuner of
``sloctl experiment end-to-end`` runs: the first scenario's forecast days
(``--hourly``, default the Redset file in ../shared/data), simulated in the
training log's world with each reactive layer side by side, one day at a
time in this process — the cheap layer (packing router + Queue@N) and the
layer that enacts the plan (the Iconq+ Query Router and the Autoscaler) —
and then the same days as one SimulateBatch on ``--workers`` processes.
It reports seconds per simulated day for both.

Run: ``.venv/bin/python benchmarks/bench_policy_tuner.py [--scale 1.0] [--workers N]``
or ``.venv/bin/python benchmarks/bench_policy_tuner.py --log L [--log L2 ...] --model M [--days 3]``
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from sloctl.control.router import Query
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup, find_good_spinup_times, try_spinup_at
from sloctl.simulation.batch import SimulationPool, WarehouseRunner, simulate_batch
from sloctl.simulation.emulator import WarehouseEmulator

SHARED_HOURLY = Path(__file__).resolve().parents[2] / "shared" / "data" / "redset_serverless_hourly.parquet"
FULL_QUERIES = 15_000
FULL_FORECASTS = 10


def world(seed: int = 0) -> WarehouseEmulator:
    rng = np.random.default_rng(seed)
    iso = rng.lognormal(0.0, 0.6, 22)
    isolated = {(f"q{t:02d}", 1): float(v) for t, v in enumerate(iso)}
    isolated.update({(f"q{t:02d}", 2): float(v) * 0.55 for t, v in enumerate(iso)})
    return WarehouseEmulator(isolated, {1: 0.9, 2: 0.9}, noise_sigma=0.2, sizes=(1, 2))


def forecast(w: WarehouseEmulator, n: int, seed: int) -> list[Query]:
    """``n`` arrivals over a 24-'hour' contour peaking at 1.3x the two starting clusters' capacity."""
    rng = np.random.default_rng(seed)
    templates = w.templates()
    mean_iso = float(np.mean([w.isolated_s[(t, 1)] for t in templates]))
    hours = np.arange(24)
    shape = 0.25 + np.exp(-0.5 * ((hours - 14) / 3.0) ** 2)  # one afternoon peak
    shape *= rng.uniform(0.9, 1.1, 24)
    counts = rng.multinomial(n, shape / shape.sum())
    hour_s = counts.max() * mean_iso / (1.3 * 2)  # busiest hour: 1.3 x two size-1 clusters
    arrivals = np.sort(np.concatenate([rng.uniform(h * hour_s, (h + 1) * hour_s, c) for h, c in enumerate(counts)]))
    picks = rng.integers(0, len(templates), n)
    return [Query(i, templates[p], float(t), 4.0 * w.isolated_s[(templates[p], 1)])
            for i, (p, t) in enumerate(zip(picks, arrivals, strict=True))]


def layers(args: argparse.Namespace) -> None:
    """Seconds per simulated forecast day for each reactive layer the Policy Tuner can plan with."""
    from sloctl.datasets.merge import merge_logs
    from sloctl.datasets.querylog import read_log
    from sloctl.experiments.end_to_end import EndToEndConfig, tuner_layers

    log = read_log(args.log[0]) if len(args.log) == 1 else merge_logs(args.log)[0]  # as the CLI merges them
    cfg = EndToEndConfig()
    cfg = cfg.quick() if args.quick else cfg
    workloads, by_layer = tuner_layers(args.hourly, log, args.model, config=cfg, seed=args.seed)
    workloads = workloads[:args.days]
    n = int(np.mean([len(w) for w in workloads]))
    workers = args.workers or os.cpu_count() or 1
    print(f"ran: {len(workloads)} forecast days of the first end-to-end scenario, {n} queries a day on the mean; "
          f"{os.cpu_count()} cores")
    per_day = {}
    for name, (runner, base) in by_layer.items():
        runner(base, workloads[0], args.seed)  # warm: model load, feature cache
        times, cells = [], []
        for j, day in enumerate(workloads):
            started = time.perf_counter()
            cells.append(runner(base, day, args.seed + j))
            times.append(time.perf_counter() - started)
        per_day[name] = float(np.mean(times))
        with SimulationPool(runner, workers) as pool:  # as the tuner holds it: started once, then batch after batch
            pool.simulate([base], workloads[:workers], seed=args.seed)  # start the workers, load the model
            batch = pool.simulate([base], workloads, seed=args.seed)
        print(f"  {name:6s} one process: {per_day[name]:.2f} s per simulated day (min {min(times):.2f}, "
              f"max {max(times):.2f}); VR {np.mean([c.vr for c in cells]):.3f}; a warm pool of "
              f"{batch.workers} workers ({batch.backend}): {len(workloads)} days in {batch.wall_s:.1f} s, "
              f"{batch.wall_s / len(workloads):.2f} s per day")
    print(f"iconq / queue, seconds per simulated day (same run): {per_day['iconq'] / per_day['queue']:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description="SimulateBatch throughput and FindGoodSpinupTime time.")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of 15,000 queries per forecast")
    parser.add_argument("--forecasts", type=int, default=FULL_FORECASTS)
    parser.add_argument("--workers", type=int, default=None, help="default: all cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", action="append", default=None,
                        help="a training log (repeat): time both reactive layers on its end-to-end forecasts")
    parser.add_argument("--model", default=None, help="the Iconq+ bundle trained on --log")
    parser.add_argument("--hourly", default=str(SHARED_HOURLY), help="Redset hourly counts")
    parser.add_argument("--days", type=int, default=3, help="forecast days timed per layer")
    parser.add_argument("--quick", action="store_true", help="the end-to-end's quick settings (a shorter day)")
    args = parser.parse_args()
    if args.log or args.model:
        if not (args.log and args.model):
            parser.error("--log and --model go together")
        layers(args)
        return
    n = max(int(FULL_QUERIES * args.scale), 10)
    workers = args.workers or os.cpu_count() or 1
    w = world(args.seed)
    mean_iso = float(np.mean([w.isolated_s[(t, 1)] for t in w.templates()]))
    runner = WarehouseRunner(w, minimum_s=5 * mean_iso, spinup_delay_s=20 * mean_iso, max_clusters=4)
    forecasts = [forecast(w, n, args.seed + j) for j in range(args.forecasts)]
    span_s = max(q[-1].arrival_s for q in forecasts)
    print(f"ran: {args.forecasts} forecasts x {n} queries (scale {args.scale:g}), {workers} workers, "
          f"{os.cpu_count()} cores")

    configs = [ExecutionConfig(start_sizes=(1, 1)),
               ExecutionConfig(spinups=(ScheduledSpinup(0.45 * span_s, 2),), start_sizes=(1, 1))]
    batch = simulate_batch(configs, forecasts, runner=runner, workers=workers, seed=args.seed)
    simulated = batch.n_queries()
    per_core = simulated / batch.wall_s / batch.workers
    print(f"SimulateBatch: {len(configs)} configs x {args.forecasts} forecasts = {simulated} queries in "
          f"{batch.wall_s:.1f} s on {batch.workers} workers ({batch.backend}): {per_core:,.0f} queries/s/core; "
          f"VR {batch.vr().mean(axis=1).round(3).tolist()}, cost {batch.cost().mean(axis=1).round(0).tolist()}")

    timelines = [c.timeline for c in batch[0]]
    scan_s = []
    for _ in range(3):
        started = time.perf_counter()
        gamma = find_good_spinup_times(timelines, tau_target=0.05, delta_s=runner.spinup_delay_s,
                                       sigma_min_s=runner.spinup_delay_s)
        scan_s.append(time.perf_counter() - started)
    print(f"FindGoodSpinupTime (Algorithm 5 scan, {2 * args.forecasts * n} events): median "
          f"{np.median(scan_s):.3f} s, {len(gamma)} candidate times")

    def evaluate(cfgs, workloads):
        return simulate_batch(cfgs, workloads, runner=runner, workers=workers, seed=args.seed)

    started = time.perf_counter()
    base = (float(batch.vr()[0].mean()), float(batch.cost()[0].mean()))
    accepted = try_spinup_at(configs[0], base, gamma[0] if gamma else 0.0, (1, 2), evaluate=evaluate,
                             workloads=forecasts, tau_target=0.05) if gamma else None
    attempt_s = time.perf_counter() - started
    print(f"one Algorithm 4 attempt (2 sizes x {args.forecasts} forecasts simulated): {attempt_s:.1f} s, "
          f"{'accepted' if accepted else 'rejected'}")

    if args.scale != 1.0 or args.forecasts != FULL_FORECASTS:
        factor = FULL_QUERIES * FULL_FORECASTS / (n * args.forecasts)
        print(f"EXTRAPOLATED (linear in queries, x{factor:.1f}) to {FULL_FORECASTS} x {FULL_QUERIES}: "
              f"SimulateBatch of 2 configs ~{batch.wall_s * factor:.0f} s on {batch.workers} workers, "
              f"scan ~{np.median(scan_s) * factor:.2f} s, one attempt ~{attempt_s * factor:.0f} s")


if __name__ == "__main__":
    main()
