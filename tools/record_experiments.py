"""Record every simulated experiment's JSON for one seed, to check that a refactor changes no result.

Usage:
    python tools/record_experiments.py prepare WORKDIR   # synthetic log + tiny Iconq+ bundle (once)
    python tools/record_experiments.py run WORKDIR OUTDIR [NAME ...]  # every (or the named) experiment, seed 0
    (history and the simulated day need ../shared/data/redset_serverless_hourly.parquet, or SLOCTL_SHARED)
    diff -r BEFORE AFTER

``prepare`` is run once, before the change; ``run`` before and after it on the
same WORKDIR, so both runs read the same log and the same model bundle. The
experiments run through the CLI (``sloctl experiment ... --json``) so that the
command a user types is what is compared. Wall-clock fields (``wall_s``) are
dropped: they measure the machine, not the result.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLOCTL = [sys.executable, "-m", "sloctl.cli"]
# the Redset hourly contour beside the checkout (``../shared/data``); SLOCTL_SHARED names another shared folder
HOURLY = Path(os.environ.get("SLOCTL_SHARED", ROOT.parent / "shared")) / "data" / "redset_serverless_hourly.parquet"


def _first(*names: str):
    for name in names:
        module, attr = name.rsplit(".", 1)
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {names}")


def prepare(work: Path) -> None:
    import dataclasses

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import synthetic_log

    load_config = _first("sloctl.config.load_config")
    train_iconq = _first("sloctl.training.pipeline.train_iconq")
    save_predictor = _first("sloctl.registry.bundles.save_predictor", "sloctl.training.artifacts.save_predictor")
    work.mkdir(parents=True, exist_ok=True)
    validate_log = _first("sloctl.datasets.querylog.validate_log")
    log = validate_log(synthetic_log())  # the schema's defaults (f_source, ...) filled in, as a read log has them
    log.to_parquet(work / "log.parquet")
    cfg = load_config()
    predictor = train_iconq(log, cfg.stage, dataclasses.replace(cfg.iconq, max_epochs=3)).predictor
    save_predictor(predictor, work / "model")
    print(f"prepared {work}")


def _without_wall_clock(doc):
    if isinstance(doc, dict):
        return {k: _without_wall_clock(v) for k, v in doc.items() if k != "wall_s"}
    if isinstance(doc, list):
        return [_without_wall_clock(v) for v in doc]
    return doc


def _cli(args: list[str], out: Path, cwd: Path) -> None:
    proc = subprocess.run([*SLOCTL, *args, "--json"], capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    doc = _without_wall_clock(json.loads(proc.stdout.strip().splitlines()[-1]))
    out.write_text(json.dumps(doc, indent=1, sort_keys=True, default=float))
    print(f"wrote {out}")


def run(work: Path, out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log, model = str(work / "log.parquet"), str(work / "model")
    common = ["--log", log, "--model", model, "--seed", "0", "--copies", "2"]
    commands = {
        "router": ["experiment", "router", *common],
        "sizer": ["experiment", "sizer", *common],
        "trigger": ["experiment", "trigger", *common],
        "admission": ["experiment", "admission", "--seed", "0", "--duration-s", "0.05", "--plots", ""],
        "history": ["experiment", "history", "--hourly", str(HOURLY), "--log", log, "--seed", "0", "--quick"],
        "retry_sweep": ["retry", "sweep", "--network", str(ROOT / "configs/networks/tandem.yaml"), "--rho",
                        "0.5,1.5", "--seed", "0", "--duration-s", "60"],
    }
    for name, args in commands.items():
        if name in ("history", "day") and not HOURLY.is_file():
            print(f"skipped {name}: no Redset hourly contour at {HOURLY} (set SLOCTL_SHARED)")
            continue
        if not names or name in names:
            _cli(args, out / f"{name}.json", work)
    if (names and "day" not in names) or not HOURLY.is_file():
        return
    # the simulated day of `make demo` (no CLI of its own), on the shared contour wherever the code lives
    import pandas as pd

    simulated_day = _first("sloctl.simulation.day.simulated_day", "sloctl.experiments.day.simulated_day")
    load_predictor = _first("sloctl.registry.bundles.load_predictor", "sloctl.training.artifacts.load_predictor")
    day = simulated_day(pd.read_parquet(log), load_predictor(work / "model"), hours=6, seed=0,
                        contour_file=str(HOURLY))
    (out / "day.json").write_text(json.dumps(day, indent=1, sort_keys=True, default=float))
    print(f"wrote {out / 'day.json'}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("prepare", "run"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]).resolve())
    else:
        run(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve(), sys.argv[4:])
