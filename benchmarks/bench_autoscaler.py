"""Autoscaler decision time (AutoSLO §6, §8.8.2) as the pool and the arrival window grow.

Two costs, measured on the state a steady stream leaves behind (arrivals at
load 0.9 of C size-1 clusters, completions at their predicted latencies,
routed by the Iconq+ router, over two windows):

* the triggers, per arrival: ``Autoscaler.on_arrival`` when it does not fire
  (teardown trigger over the clusters, Algorithm 2 over the running queries
  and the completion window: O(N + |W^c|));
* the Spinup Size Selector, per decision: one ``find_best_spinup_size`` call
  (Algorithm 3: the window replayed through ``δ = w``, then candidate sizes
  1 and 2 and doing nothing each continued until ``μ = 20`` completions:
  O((|W^a| δ/w + F_max) R_max)).

Both are measured on a grid of clusters C (1, 2, 4, 8) by window length
|W^a| in queries (25, 50, 100, 200), each cell on 8 states a tenth of a
window apart, with two predictors: Iconq+ (a small one trained on the
tests' synthetic log, or ``--model``) and a cheap table predictor (isolated
latency × (1 + ½ per neighbour), same router and interface) that shows what
the simulation itself costs. Growth ratios (C = 8 over C = 1, |W^a| = 200
over 25) are taken within this run.

Last, the arrival step (autoscaler + router, as ``ManagedPool`` runs it)
while a size selection is under way, arrivals paced in real time: with the
selector inside the step (the simulator's mode) against on a
:class:`~sloctl.control.background.BackgroundSizer` (the live runner's).

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_autoscaler.py [--model BUNDLE] [--reps 8]``
(about 2 minutes on 2 cores, training included; docs/control.md has a run).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sloctl.config import load_config
from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig, autoscaler_for, find_best_spinup_size
from sloctl.control.background import BackgroundSizer
from sloctl.control.managed import ManagedPool
from sloctl.control.router import IconqRouter, Query
from sloctl.datasets.querylog import validate_log
from sloctl.datasets.slo import isolated_medians, slo_baselines
from sloctl.models.online import Counterfactual, OnlinePredictor, RunningQuery
from sloctl.registry.bundles import load_predictor
from sloctl.training.pipeline import train_iconq

ROOT = Path(__file__).resolve().parent.parent
LOAD = 0.9          # arrival rate as a fraction of the clusters' isolated capacity
KAPPA = 3.0         # SLO = κ × a template's largest isolated latency on size 1
CLUSTERS = (1, 2, 4, 8)
WINDOWS = (25, 50, 100, 200)


class TablePredictor:
    """A cheap stand-in for Iconq+ behind the same interface: isolated latency × (1 + ½ per neighbour).

    A query's neighbours are the queries on its cluster when it arrived plus
    those that arrived after it; a newcomer adds one to each running query.
    """

    def __init__(self, isolated_s: dict[tuple[str, int], float]) -> None:
        self.isolated = isolated_s
        self.running: dict[int, RunningQuery] = {}
        self._by_cluster: dict[str, list[int]] = {}

    def fork(self) -> TablePredictor:
        twin = TablePredictor(self.isolated)
        twin.running = {k: dataclasses.replace(v) for k, v in self.running.items()}
        twin._by_cluster = {k: list(v) for k, v in self._by_cluster.items()}
        return twin

    def isolated_s(self, template: str, size: int) -> float:
        return self.isolated[(template, size)]

    def running_on(self, cluster_id: str) -> list[RunningQuery]:
        return [self.running[q] for q in self._by_cluster.get(cluster_id, [])]

    def counterfactuals(self, template: str, arrival_s: float, clusters: dict[str, int], now_s: float
                        ) -> dict[str, Counterfactual]:
        out = {}
        for cid, size in clusters.items():
            running = self.running_on(cid)
            before = np.array([r.predicted_s for r in running])
            after = before + 0.5 * np.array([self.isolated[(r.template, r.size)] for r in running])
            query_s = self.isolated[(template, size)] * (1.0 + 0.5 * len(running))
            out[cid] = Counterfactual(query_s, [r.query_id for r in running], before, after)
        return out

    def commit(self, query_id: int, template: str, arrival_s: float, slo_s: float, cluster_id: str, size: int,
               now_s: float) -> float:
        running = self.running_on(cluster_id)
        for r in running:
            r.predicted_s += 0.5 * self.isolated[(r.template, r.size)]
        predicted = self.isolated[(template, size)] * (1.0 + 0.5 * len(running))
        self.running[query_id] = RunningQuery(query_id, template, cluster_id, size, arrival_s, slo_s, predicted)
        self._by_cluster.setdefault(cluster_id, []).append(query_id)
        return predicted

    def complete(self, query_id: int) -> None:
        query = self.running.pop(query_id, None)
        if query is not None:
            self._by_cluster[query.cluster_id].remove(query_id)


@dataclasses.dataclass
class Scenario:
    """A pool left by a steady stream: what the autoscaler sees at the next arrival."""

    pool: ManagedPool
    autoscaler: Autoscaler
    now_s: float
    next_id: int
    templates: list[str]
    slo_s: dict[str, float]
    rng: np.random.Generator


def _next_completion(pool: ManagedPool) -> tuple[float, int | None]:
    best = (float("inf"), None)
    for r in pool.router.model.running.values():
        if r.arrival_s + r.predicted_s < best[0]:
            best = (r.arrival_s + r.predicted_s, r.query_id)
    return best


def advance(sc: Scenario, arrivals: int, rate_per_s: float, on_step: Any = None) -> None:
    """``arrivals`` Poisson arrivals, each one control step, completions at their predicted latencies."""
    for _ in range(arrivals):
        t = sc.now_s + sc.rng.exponential(1.0 / rate_per_s)
        while True:
            t_done, qid = _next_completion(sc.pool)
            if qid is None or t_done > t:
                break
            sc.pool.complete(qid, t_done)
        template = sc.templates[int(sc.rng.integers(len(sc.templates)))]
        query = Query(sc.next_id, template, t, sc.slo_s[template])
        sc.next_id += 1
        sc.now_s = t
        started = time.perf_counter()
        sc.pool.scale(query, t)
        sc.pool.route(query, t)
        if on_step is not None:
            on_step(query, time.perf_counter() - started)


def scenario(model: Any, n_clusters: int, window: int, mean_iso_s: float, templates: list[str],
             slo_s: dict[str, float], seed: int, sizer: BackgroundSizer | None = None) -> tuple[Scenario, float]:
    """C size-1 clusters at load 0.9, ``window`` arrivals per window; warmed up over two windows."""
    rate = LOAD * n_clusters / mean_iso_s
    window_s = window / rate
    config = AutoscalerConfig(window_s=window_s, t_idle_s=1e9, t_min_lifetime_s=1e9, theta=10, tau_trigger=1.0,
                              mu=20, tau_target=0.05, candidate_sizes=(1, 2), spinup_delay_s=window_s,
                              max_clusters=n_clusters + 1)
    router = IconqRouter(model)
    # τ_trigger = 1 never fires, but Algorithm 2 still counts every recent query (|R ∪ D| ≥ θ)
    autoscaler = autoscaler_for(config, router, IconqRouter, minimum_s=5.0 * mean_iso_s, sizer=sizer)
    pool = ManagedPool(router, autoscaler=autoscaler, minimum_s=5.0 * mean_iso_s, backend=_Starting())
    for i in range(n_clusters):
        pool.add_cluster(f"c{i}", 1)
    sc = Scenario(pool, autoscaler, 0.0, 0, templates, slo_s, np.random.default_rng(seed))
    advance(sc, 2 * window, rate)
    return sc, rate


class _Starting:
    """Spun-up clusters never become ready: the pool routes as before, so inline and background compare."""

    def spin_up(self, size: int, now_s: float) -> tuple[str, None]:
        return f"new-s{size}", None

    def tear_down(self, cluster_id: str, now_s: float) -> None:
        raise AssertionError("the benchmark never tears down")


def time_trigger(sc: Scenario, reps: int) -> list[float]:
    """Seconds per ``on_arrival`` that does not fire, ``reps`` times on this state (the arrival is taken back)."""
    views = sc.pool.views(sc.now_s)
    samples = []
    for i in range(reps):
        query = Query(10**9 + i, sc.templates[0], sc.now_s, sc.slo_s[sc.templates[0]])
        started = time.perf_counter()
        actions = sc.autoscaler.on_arrival(query, views)
        samples.append(time.perf_counter() - started)
        sc.autoscaler.windows.arrivals.pop()
        assert actions == []
    return samples


def time_sizing(sc: Scenario) -> float:
    """Seconds of one ``find_best_spinup_size`` call on this state (it forks the predictor; nothing changes)."""
    a = sc.autoscaler
    started = time.perf_counter()
    find_best_spinup_size(now_s=sc.now_s, window=list(a.windows.arrivals), window_s=a.config.window_s,
                          router=a.router, clusters=[c.state for c in sc.pool.clusters.values()],
                          make_router=a.make_router, candidates=a.config.candidate_sizes,
                          delta_s=a.config.spinup_delay_s, mu=a.config.mu, tau_target=a.config.tau_target,
                          minimum_s=a.minimum_s, price_per_unit_s=a.price_per_unit_s)
    return time.perf_counter() - started


def _ms(samples: list[float]) -> tuple[float, float]:
    return float(np.percentile(samples, 50) * 1000), float(np.percentile(samples, 99) * 1000)


def sweep(name: str, make_model: Any, mean_iso_s: float, templates: list[str], slo_s: dict[str, float],
          args: argparse.Namespace) -> dict[tuple[int, int], dict[str, float]]:
    cells = [(c, w) for c in CLUSTERS for w in WINDOWS]
    out = {}
    print(f"\n{name}: {'clusters':>8}{'window':>8}{'running':>9}{'trigger p50':>13}{'p99 ms':>9}"
          f"{'sizing p50':>12}{'p99 ms':>9}")
    for n_clusters, window in cells:
        sc, rate = scenario(make_model(), n_clusters, window, mean_iso_s, templates, slo_s, args.seed)
        trigger_s, sizing_s, running = [], [], []
        for _ in range(args.reps):  # states a tenth of a window apart
            advance(sc, max(1, window // 10), rate)
            running.append(len(sc.pool.running))
            trigger_s += time_trigger(sc, args.trigger_reps // args.reps)
            sizing_s.append(time_sizing(sc))
        trig, size = _ms(trigger_s), _ms(sizing_s)
        out[(n_clusters, window)] = {"trigger": trig, "sizing": size}
        print(f"{'':{len(name) + 2}}{n_clusters:8d}{window:8d}{np.mean(running):9.1f}{trig[0]:13.3f}{trig[1]:9.3f}"
              f"{size[0]:12.1f}{size[1]:9.1f}", flush=True)
    return out


def growth(name: str, cells: dict[tuple[int, int], dict[str, Any]]) -> None:
    """p50 ratios: the most clusters over the fewest at each window, the longest window over the shortest."""
    c0, c1, w0, w1 = min(CLUSTERS), max(CLUSTERS), min(WINDOWS), max(WINDOWS)
    for what in ("trigger", "sizing"):
        by_c = ", ".join(f"x{cells[(c1, w)][what][0] / cells[(c0, w)][what][0]:.1f}" for w in WINDOWS)
        by_w = ", ".join(f"x{cells[(c, w1)][what][0] / cells[(c, w0)][what][0]:.1f}" for c in CLUSTERS)
        print(f"  {name} {what} p50: {c1} / {c0} clusters at window {', '.join(map(str, WINDOWS))}: {by_c}; "
              f"window {w1} / {w0} at {', '.join(map(str, CLUSTERS))} clusters: {by_w}")


class _FireAt:
    """Fires once, at the arrival of query ``query_id`` (a trigger whose timing the benchmark chooses)."""

    def __init__(self, query_id: int) -> None:
        self.query_id = query_id
        self.fired = False

    def check(self, now_s: float, active: Any, running: Any, windows: Any) -> bool:
        if self.fired or windows.arrivals[-1].query_id < self.query_id:
            return False
        self.fired = True
        return True

    def suppress(self, until_s: float) -> None:
        return None


def _paced_run(make_model: Any, sizer: BackgroundSizer | None, window: int, mean_iso_s: float,
               templates: list[str], slo_s: dict[str, float], args: argparse.Namespace
               ) -> tuple[float, list[float], list[float]]:
    """Arrivals every ``--gap-ms``; the trigger fires at the tenth. Returns the selector's time and the step times.

    A step counts as "during" the size selection if the trigger fired in it
    or, in the background, if a job was under way (or its result waiting)
    when it began.
    """
    sc, rate = scenario(make_model(), 2, window, mean_iso_s, templates, slo_s, args.seed, sizer)
    trigger = _FireAt(sc.next_id + 10)
    sc.autoscaler.trigger = trigger
    during: list[float] = []
    idle: list[float] = []
    state = {"due": time.perf_counter(), "fired": False, "busy": False}

    def on_step(query: Query, seconds: float) -> None:
        fired_now = trigger.fired and not state["fired"]
        (during if fired_now or state["busy"] else idle).append(seconds)
        state["fired"], state["busy"] = trigger.fired, sizer is not None and sizer.busy
        state["due"] += args.gap_ms / 1000
        time.sleep(max(0.0, state["due"] - time.perf_counter()))

    try:
        advance(sc, args.paced_steps, rate, on_step)
        deadline = time.monotonic() + 300
        while sizer is not None and sizer.busy and time.monotonic() < deadline:
            advance(sc, 1, rate, on_step)
    finally:
        if sizer is not None:
            sizer.close()
    events = [e["decision_s"] for e in sc.pool.events if e["event"] == "sizing"]
    return (during[0] if sizer is None else events[0]), during, idle


def step_while_sizing(make_model: Any, mean_iso_s: float, templates: list[str], slo_s: dict[str, float],
                      args: argparse.Namespace) -> None:
    """Arrival-step times while a size selection runs: inside the step (inline) against on a worker (background)."""
    window = 100
    print(f"\narrival step (autoscaler + Iconq+ router, ManagedPool.scale + route) while a size selection runs; "
          f"2 clusters, window {window}, arrivals every {args.gap_ms:g} ms:")
    print(f"  {'mode':<12}{'sizing s':>10}{'steps during':>14}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
          f"{'  | other steps: p50':>20}{'p99 ms':>9}")
    for mode in ("inline", "background"):
        sizer = BackgroundSizer() if mode == "background" else None
        sizing_s, during, idle = _paced_run(make_model, sizer, window, mean_iso_s, templates, slo_s, args)
        d, i = np.asarray(during) * 1000, np.asarray(idle) * 1000
        print(f"  {mode:<12}{sizing_s:10.2f}{len(d):14d}{np.percentile(d, 50):9.2f}{np.percentile(d, 99):9.2f}"
              f"{d.max():9.2f}{np.percentile(i, 50):20.2f}{np.percentile(i, 99):9.2f}", flush=True)


def predictor_and_table(args: argparse.Namespace) -> tuple[Any, Any]:
    """The Iconq+ predictor (trained here unless ``--model``) and the synthetic log it goes with."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import synthetic_log

    log = validate_log(synthetic_log(), source="synthetic log")
    if args.model:
        print(f"model: {args.model}")
        return load_predictor(args.model), log
    cfg = load_config()
    started = time.perf_counter()
    predictor = train_iconq(log, cfg.stage, dataclasses.replace(cfg.iconq, max_epochs=args.epochs)).predictor
    print(f"model: Iconq+ trained here on the synthetic log ({args.epochs} epochs, "
          f"{time.perf_counter() - started:.0f} s)")
    return predictor, log


def main() -> None:
    parser = argparse.ArgumentParser(description="Autoscaler decision time vs clusters and window length.")
    parser.add_argument("--model", default=None, help="an Iconq+ bundle folder trained on the tests' synthetic log "
                        "(default: train a small one here)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs when training here")
    parser.add_argument("--reps", type=int, default=8, help="states per cell (one size-selector call each)")
    parser.add_argument("--trigger-reps", type=int, default=300, help="trigger evaluations per cell")
    parser.add_argument("--paced-steps", type=int, default=150, help="arrivals in the inline/background comparison")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="spacing of those arrivals")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    predictor, log = predictor_and_table(args)
    table = log.drop_duplicates("template").reset_index(drop=True)
    iso = {(t, s): v for s in (1, 2) for t, v in isolated_medians(log, s).items()}
    templates = sorted(isolated_medians(log, 1))
    slo_s = {t: KAPPA * v for t, v in slo_baselines(log, 1).items()}
    mean_iso_s = float(np.mean([iso[(t, 1)] for t in templates]))

    def iconq() -> OnlinePredictor:
        model = OnlinePredictor(predictor, table)
        for t in templates:
            for size in (1, 2):
                model.features(t, size)
        return model

    print(f"{len(templates)} templates, mean isolated latency {mean_iso_s:.3f} s; load {LOAD} of C size-1 "
          f"clusters; w = δ = window length / arrival rate; candidates (1, 2), mu 20; "
          f"per cell {args.reps} states a tenth of a window apart: the trigger {args.trigger_reps // args.reps} "
          f"times and the size selector once on each (its p99 of {args.reps} is about the max)")
    results = {"iconq+": sweep("iconq+", iconq, mean_iso_s, templates, slo_s, args),
               "table": sweep("table", lambda: TablePredictor(iso), mean_iso_s, templates, slo_s, args)}
    print("\ngrowth (same run):")
    for name, cells in results.items():
        growth(name, cells)
    ratios = [results["iconq+"][cell]["sizing"][0] / results["table"][cell]["sizing"][0] for cell in results["table"]]
    print(f"  sizing p50 iconq+ / table: x{min(ratios):.1f} to x{max(ratios):.1f} over the cells "
          f"(median x{np.median(ratios):.1f})")
    step_while_sizing(iconq, mean_iso_s, templates, slo_s, args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; reproduce: .venv/bin/python benchmarks/bench_autoscaler.py"
          f" --reps {args.reps} --seed {args.seed}" + (f" --model {args.model}" if args.model else ""))


if __name__ == "__main__":
    main()
