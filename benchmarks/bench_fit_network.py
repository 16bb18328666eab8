"""Fitting a network from a million spans: wall time and peak memory of ``sloctl fit network``.

Simulates the hotel network (configs/networks/hotel.yaml, capacities and
arrivals scaled by ``--scale``) with :mod:`sloctl.simulation.trace_synth` until
``--spans`` spans are written as OTLP/JSON lines (100 spans per line, 200,000
per file, as a Collector's file exporter with rotation leaves them), then runs
``sloctl fit network --traces DIR --json`` as a child process and reports its
wall time and peak resident memory (the child's own ``ru_maxrss``), with the
parse alone (reading the spans, no fit) measured the same way beside it. The
fitted capacities are set beside the simulated ones, so a fast wrong fit shows.

Usage: python benchmarks/bench_fit_network.py [--spans 1000000] [--scale 4] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sloctl.models.retry_network import load_network
from sloctl.simulation.retry_sweep import sweep_spec
from sloctl.simulation.trace_synth import synthesize_spans, write_otlp_json

PARSE_ONLY = ("import sys; from sloctl.datasets.traces import iter_spans, trace_files; "
              "print(sum(1 for _ in iter_spans(trace_files(sys.argv[1]))))")
# the fit as a user runs it, in a child that reports its own peak resident memory on exit
FIT = ("import resource, sys\nfrom sloctl.cli import main\nsys.argv = ['sloctl', 'fit', 'network', '--traces', "
       "sys.argv[1], '--json']\ntry:\n    main()\nfinally:\n    print(f'maxrss_kb={resource.getrusage("
       "resource.RUSAGE_SELF).ru_maxrss}', file=sys.stderr)")
MEASURE = ("\nimport resource; print(f'maxrss_kb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}', "
           "file=sys.stderr)")


def _child(code: str, folder: Path) -> tuple[float, float, str]:
    """Run ``code`` in a child Python on ``folder``: its wall seconds, its peak RSS in MB and its stdout."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    peak_kb = max(int(line.split("=", 1)[1]) for line in done.stderr.splitlines() if line.startswith("maxrss_kb="))
    return wall, peak_kb / 1024, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--scale", type=float, default=4.0, help="capacity and arrival scale of the hotel network")
    ap.add_argument("--rho", type=float, default=1.5, help="offered load at the bottleneck")
    ap.add_argument("--keep", type=Path, default=None, help="write the traces here and keep them")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from sloctl.experiments.retry_live import scaled_spec

    base = scaled_spec(load_network("configs/networks/hotel.yaml"), capacity_scale=args.scale, buffer=50,
                       retry_delay_s=0.2)
    spec = sweep_spec(base, args.rho, ("high",)).with_retries({"high": 5, "low": 1})
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp:
        folder = args.keep or Path(tmp) / "traces"
        t = time.perf_counter()
        spans = itertools.islice(synthesize_spans(spec, duration_s=1e9, seed=0), args.spans)
        files = write_otlp_json(spans, folder)
        gen_s = time.perf_counter() - t
        size_mb = sum(f.stat().st_size for f in files) / 2**20
        parse_s, parse_mb, counted = _child(PARSE_ONLY + MEASURE, folder)
        fit_s, fit_mb, out = _child(FIT, folder)
    doc = json.loads(out.strip().splitlines()[-1])
    fitted = doc["network"]["services"]
    truth = {s.name: s.capacity_per_s for s in spec.services}
    errors = {name: row["capacity_per_s"] / truth[name] - 1 for name, row in fitted.items()}
    worst_name = max(errors, key=lambda n: abs(errors[n]))
    worst = abs(errors[worst_name])
    spans_of = {name: row.get("rests_on_spans") for name, row in doc["report"]["services"].items()}
    result = {"spans": int(counted), "files": len(files), "trace_mb": round(size_mb, 1),
              "generate_s": round(gen_s, 1), "parse_s": round(parse_s, 2), "parse_peak_mb": round(parse_mb, 1),
              "fit_s": round(fit_s, 2), "fit_peak_mb": round(fit_mb, 1),
              "max_capacity_rel_error": round(worst, 4), "worst_service": worst_name,
              "worst_service_spans": spans_of.get(worst_name), "services_fitted": len(fitted)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['spans']:,} spans in {result['files']} OTLP/JSON files ({result['trace_mb']} MB), "
          f"simulated in {result['generate_s']} s")
    print(f"  parse only       {result['parse_s']:8.2f} s   peak {result['parse_peak_mb']:8.1f} MB")
    print(f"  sloctl fit       {result['fit_s']:8.2f} s   peak {result['fit_peak_mb']:8.1f} MB")
    print(f"  {result['services_fitted']} services fitted; largest capacity error {worst:.2%} ({worst_name}, "
          f"{result['worst_service_spans']} admitted spans)")


if __name__ == "__main__":
    main()
