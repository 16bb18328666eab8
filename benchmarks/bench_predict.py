"""Predictions for SQL text: ``POST /v1/predict`` batches and ``sloctl predict --input``.

Trains Iconq+ on text and catalog features only (as ``sloctl train iconq
--features text+catalog --catalog DB`` does) on a collected log, registers it
into a temporary SQLite registry and starts the controller runtime in a
subprocess on a free loopback port (``create_app`` under uvicorn, as ``sloctl
serve`` runs it), so that client and server do not share a GIL. Then, side by
side in one run:

* **batch**: one ``/v1/predict`` with ``queries`` of 1,000 SQL texts (TPC-H
  queries with fresh literals, in clusters of 4 that run together), against
  the same 1,000 queries sent one request each (a single query with its 3
  cluster mates as neighbours). Texts repeat only by template: a batch of
  new literals is parsed per fingerprint, once; ``--distinct`` also times 1,000
  texts of 1,000 different shapes: the first round parses every one (cold), the
  next rounds send the same shapes with new literals (the featurizer's cache).
* **file**: ``sloctl predict --input`` on 10,000 SQL queries (a subprocess,
  timed in all: start, model load, featurize, predict, write).

Targets (issue 53): a batch of 1,000 under 1 s; the file under 15 s.

Run: ``.venv/bin/python benchmarks/bench_predict.py [--log L] [--catalog DB] [--json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BATCH = 1000
FILE_ROWS = 10_000


def _cfg(tracking_uri: str, state_db: str) -> Any:
    from sloctl.config import load_config

    base = load_config()
    return dataclasses.replace(
        base, registry=dataclasses.replace(base.registry, tracking_uri=tracking_uri),
        iconq=dataclasses.replace(base.iconq, max_epochs=3, learn_rows="all"),
        serve=dataclasses.replace(base.serve, state_db=state_db))


def prepare(folder: Path, log_path: Path, catalog_path: Path) -> dict[str, str]:
    """Train Iconq+ on the log's text and catalog features, register it, save its bundle."""
    from sloctl.datasets.querylog import read_log
    from sloctl.datasets.sql_features import load_catalog
    from sloctl.models.predictor import SqlSpec, mask_features
    from sloctl.registry.bundles import save_predictor
    from sloctl.registry.store import register
    from sloctl.training.pipeline import train_iconq

    log = read_log(log_path)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    cfg = _cfg(uri, str(folder / "state.db"))
    result = train_iconq(mask_features(log, ("text", "catalog")), cfg.stage, cfg.iconq)
    result.predictor.sql = SqlSpec("duckdb", load_catalog(catalog_path))
    register(result, log, name="iconq", tracking_uri=uri, experiment="bench")
    save_predictor(result.predictor, folder / "bundle")
    return {"tracking_uri": uri, "state_db": str(folder / "state.db"), "bundle": str(folder / "bundle")}


def serve(tracking_uri: str, state_db: str, port: int) -> None:
    """The server side (run in a subprocess): the app as ``sloctl serve`` builds it."""
    import uvicorn

    from sloctl.serving.runtime.app import create_app

    uvicorn.run(create_app(_cfg(tracking_uri, state_db), token=TOKEN), host="127.0.0.1", port=port,
                log_level="warning")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def texts(n: int, seed: int, *, distinct: bool = False) -> list[str]:
    """``n`` TPC-H query texts with fresh literals (numbers nudged); ``distinct``: every one a new shape."""
    from sloctl.datasets.tpc import load_templates

    rng = np.random.default_rng(seed)
    templates = [t.sql.rstrip().rstrip(";") for t in load_templates("tpch")]
    out = []
    for i in range(n):
        sql = re.sub(r"\b(\d+)\b(?!-)", lambda m: str(int(m.group(1)) + int(rng.integers(0, 3))),
                     templates[i % len(templates)])
        if distinct:  # a different select list: a new fingerprint, parsed once more
            sql = f"SELECT * FROM ({sql}) AS q{i} LIMIT {i + 1}" if i % 2 else \
                f"SELECT count(*) AS n{i} FROM ({sql}) AS q"
        out.append(sql)
    return out


def batch_body(sql: list[str]) -> dict[str, Any]:
    return {"queries": [{"sql": s, "cluster_size": 1 + (i // 4) % 2, "cluster_id": f"c{i // 4}",
                         "arrival_s": 0.2 * (i % 4)} for i, s in enumerate(sql)]}


def one_bodies(sql: list[str]) -> list[dict[str, Any]]:
    """Each query of :func:`batch_body` alone, its three cluster mates as neighbours."""
    out = []
    for i, s in enumerate(sql):
        first = i - i % 4
        mates = [j for j in range(first, min(first + 4, len(sql))) if j != i]
        out.append({"sql": s, "cluster_size": 1 + (i // 4) % 2,
                    "neighbours": [{"sql": sql[j], "offset_s": 0.2 * (j % 4 - i % 4)} for j in mates]})
    return out


def run(log_path: Path, catalog_path: Path, distinct: bool, rounds: int) -> dict[str, Any]:
    import httpx
    import pandas as pd

    out: dict[str, Any] = {"log": str(log_path), "catalog": str(catalog_path), "batch": BATCH,
                           "file_rows": FILE_ROWS, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="sloctl-bench-predict-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        args = prepare(folder, log_path, catalog_path)
        out["train_s"] = round(time.perf_counter() - t0, 1)
        port = _free_port()
        proc = subprocess.Popen([sys.executable, __file__, "--serve", args["tracking_uri"], args["state_db"],
                                 str(port)])
        url = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                deadline = time.monotonic() + 120
                while True:
                    try:
                        if client.get("/readyz").json().get("router") == "iconq":
                            break
                    except (httpx.HTTPError, ValueError):
                        pass
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the runtime did not become ready")
                    time.sleep(0.2)
                sets = {"batch_s": texts(BATCH, 1)}
                if distinct:
                    sets["batch_distinct_s"] = texts(BATCH, 2, distinct=True)
                warm = client.post("/v1/predict", json=batch_body(texts(BATCH, 0)), headers=AUTH)
                warm.raise_for_status()
                for name, sql in sets.items():
                    times = []
                    for r in range(rounds):
                        body = batch_body(sql if r == 0 else texts(BATCH, 10 + r, distinct=name != "batch_s"))
                        t = time.perf_counter()
                        answer = client.post("/v1/predict", json=body, headers=AUTH)
                        times.append(time.perf_counter() - t)
                        answer.raise_for_status()
                        assert len(answer.json()["predictions"]) == BATCH
                    out[name] = [round(x, 3) for x in times]
                t = time.perf_counter()
                for body in one_bodies(sets["batch_s"]):
                    client.post("/v1/predict", json=body).raise_for_status()
                out["one_by_one_s"] = round(time.perf_counter() - t, 3)
                out["one_by_one_per_batch"] = round(out["one_by_one_s"] / float(np.median(out["batch_s"])), 1)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        sql = texts(FILE_ROWS, 5)
        pd.DataFrame({"sql": sql, "cluster_size": [1 + (i // 4) % 2 for i in range(FILE_ROWS)],
                      "cluster_id": [f"c{i // 4}" for i in range(FILE_ROWS)],
                      "arrival_s": [0.2 * (i % 4) for i in range(FILE_ROWS)]}).to_csv(folder / "q.csv", index=False)
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "sloctl.cli", "predict", "--input", str(folder / "q.csv"),
                               "--out", str(folder / "p.parquet"), "--model", args["bundle"]],
                              capture_output=True, text=True)
        out["file_s"] = round(time.perf_counter() - t, 2)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        predicted = pd.read_parquet(folder / "p.parquet")["predicted_latency_s"]
        out["file_predictions_positive"] = bool((predicted > 0).all())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", type=Path, default=ROOT / "data" / "logs" / "train3-0.1-r10.parquet",
                        help="A collected or imported log with text and catalog features.")
    parser.add_argument("--catalog", type=Path, default=ROOT / "data" / "tpch_sf0.1.duckdb",
                        help="Its warehouse (.duckdb) or a table,rows,bytes CSV.")
    parser.add_argument("--distinct", action="store_true", help="Also time 1,000 texts of 1,000 shapes.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1], int(args.serve[2]))
        return
    for option, path in (("--log", args.log), ("--catalog", args.catalog)):
        if not path.is_file():
            parser.error(f"{option}: no such file {path} (collect one: `sloctl collect --sf 0.1 --out L`)")
    out = run(args.log, args.catalog, args.distinct, args.rounds)
    if args.json:
        print(json.dumps(out))
        return
    print(f"trained in {out['train_s']} s on {out['log']}")
    print(f"/v1/predict, {BATCH} SQL texts in one batch: {out['batch_s']} s (rounds)")
    if "batch_distinct_s" in out:
        print(f"/v1/predict, {BATCH} texts of {BATCH} shapes: {out['batch_distinct_s']} s")
    print(f"the same {BATCH} one request each: {out['one_by_one_s']} s ({out['one_by_one_per_batch']}x the batch)")
    print(f"sloctl predict --input, {FILE_ROWS:,} SQL queries, in all: {out['file_s']} s")


if __name__ == "__main__":
    main()
