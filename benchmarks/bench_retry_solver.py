"""DiffTry network solver time (``sloctl.models.retry.solve_network``) on large random networks.

Two cases, each solved with the three rejection functions and timed as the
median of a few runs: a 500-service random DAG with 3 classes (one topological
pass; target under 200 ms) and a 200-service random network with cycles
(fixed-point iteration; must converge, iterations reported). Arrivals are
scaled so that the bottleneck's offered utilisation (no losses, no retries)
is 1.5, i.e. the network is overloaded and retries matter.

Run: ``.venv/bin/python benchmarks/bench_retry_solver.py`` (``--json`` for a machine-readable line).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from sloctl.models.retry import MODELS, offered_rho, solve_network
from sloctl.models.retry_network import NetworkSpec, network_from_mapping

TARGET_DAG_MS = 200.0


def random_network(n_services: int, n_classes: int, *, cyclic: bool, rho: float, seed: int) -> NetworkSpec:
    """A random service network: callers have lower indices, plus back edges when ``cyclic``.

    Every service but the first is called by one to three earlier services;
    rows are scaled to sum to at most 0.9 so that the flow stays bounded along
    long chains, and back edges (about one per ten services) close cycles.
    """
    rng = np.random.default_rng(seed)
    names = [f"s{i}" for i in range(n_services)]
    F = np.zeros((n_services, n_services))
    for i in range(1, n_services):
        for j in rng.choice(i, size=min(i, int(rng.integers(1, 4))), replace=False):
            F[j, i] = rng.uniform(0.2, 1.0)
    if cyclic:
        for _ in range(n_services // 10):
            j = int(rng.integers(1, n_services))
            F[j, int(rng.integers(0, j))] = rng.uniform(0.1, 0.5)
    F *= np.minimum(1.0, 0.9 / np.maximum(F.sum(axis=1), 1e-12))[:, None]
    entries = rng.choice(n_services, size=max(1, n_services // 20), replace=False)
    classes = {f"c{p}": {"retries": int(r)} for p, r in zip(range(n_classes), (5, 3, 1, 0), strict=False)}
    raw = {
        "services": {s: {"capacity_per_s": float(rng.uniform(50, 200)), "buffer": 50} for s in names},
        "classes": classes,
        "arrivals": {c: {names[e]: float(rng.uniform(5, 20)) for e in entries} for c in classes},
        "routing": {c: {names[a]: {names[b]: float(F[a, b]) for b in np.flatnonzero(F[a])}
                        for a in range(n_services) if F[a].any()} for c in classes},
    }
    spec = network_from_mapping(raw, source="<bench>")
    scale = rho / offered_rho(spec)
    return spec.scale_arrivals({c: scale for c in classes})


def time_solve(spec: NetworkSpec, model: str, runs: int) -> tuple[float, int, bool]:
    solve_network(spec, model)  # warm-up
    times, sol = [], None
    for _ in range(runs):
        started = time.perf_counter()
        sol = solve_network(spec, model)
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1000), sol.iterations, sol.converged


def main() -> None:
    parser = argparse.ArgumentParser(description="DiffTry network solver time on random networks.")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rho", type=float, default=1.5, help="bottleneck offered utilisation")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    args = parser.parse_args()
    cases = [("DAG", random_network(500, 3, cyclic=False, rho=args.rho, seed=args.seed)),
             ("cyclic", random_network(200, 3, cyclic=True, rho=args.rho, seed=args.seed))]
    rows = []
    for label, spec in cases:
        for model in MODELS:
            ms, iterations, converged = time_solve(spec, model, args.runs)
            rows.append({"network": label, "services": len(spec.services), "classes": len(spec.classes),
                         "model": model, "median_ms": ms, "iterations": iterations, "converged": converged})
    dag_ms = max(r["median_ms"] for r in rows if r["network"] == "DAG")
    ok = dag_ms < TARGET_DAG_MS and all(r["converged"] for r in rows)
    if args.json:
        print(json.dumps({"rows": rows, "dag_target_ms": TARGET_DAG_MS, "ok": ok}))
        return
    header = ("network", 8), ("services", 10), ("classes", 9), ("model", 7), ("median ms", 11), ("iterations", 12), \
        ("converged", 11)
    print("".join(f"{name:>{width}}" for name, width in header))
    for r in rows:
        print(f"{r['network']:>8}{r['services']:>10}{r['classes']:>9}{r['model']:>7}{r['median_ms']:>11.1f}"
              f"{r['iterations']:>12}{r['converged']!s:>11}")
    print(f"500-service DAG: slowest model {dag_ms:.1f} ms (target < {TARGET_DAG_MS:.0f} ms); cyclic converged: "
          f"{all(r['converged'] for r in rows)}: {'OK' if ok else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
