"""Iconq+ training throughput at a warehouse's scale (issue 53): the data path before and after, side by side.

1. Simulates a query log of ``--rows`` executions (``sloctl simulate log``'s
   :func:`~sloctl.simulation.log_synth.simulate_log`) from the world of
   ``--world`` (default: the SF 0.1 training logs data/logs/train3-0.1-r*.parquet,
   collected with ``sloctl collect``).
2. **Before** (the data path up to 2026-12-07): one Python dict per sample with
   its interaction vectors built per sample, ``collate_rows`` padding, random
   batches of ``iconq.batch_size`` (32) at ``iconq.lr``; the same network,
   loss, optimiser and clipping. It trains for ``--before-s`` seconds (its
   samples are built as they are drawn, so its set-up time, which grows with
   the log, is not counted against it) and reports samples per second.
3. **After, every row**: ``train_iconq`` on every training row, as the
   before path trains, for the same ``--before-s`` seconds of training
   (batch and precision as planned for them): the samples per second compared.
4. **After**: ``learn_iconq`` as ``sloctl train iconq`` runs it (neighbour
   CSR, vectorised batches of similar lengths, batches sized for the data with
   the learning rate scaled, the learning curve, ``--max-train-s``,
   ``--devices``), to its stopping rule; it reports samples per second of
   training (the last curve point's), the wall time of the whole call, the
   rows it learned from and why it stopped, and the Q-errors.

Each side runs in its own child process (the peak RSS of each is its own,
``ru_maxrss``); the ratio of samples per second is measured in this one run.

Run: ``.venv/bin/python benchmarks/bench_training.py [--rows 1000000] [--before-s 60] [--json]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WORLD = sorted((REPO / "data" / "logs").glob("train3-0.1-r*.parquet"))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _before(log_path: str, seconds: float, seed: int, out: multiprocessing.Queue) -> None:
    """The data path before issue 53, timed for ``seconds`` of training."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    from sloctl.core.config import IconqSection
    from sloctl.datasets.analysis import overlap_counts
    from sloctl.datasets.interactions import (
        FeatureScaler,
        neighbour_index,
        pair_dim,
        pair_vectors,
        sample_table,
        self_vectors,
    )
    from sloctl.datasets.querylog import read_log
    from sloctl.models.batches import collate_rows
    from sloctl.models.iconq import IconqConfig, IconqNet, qerror_loss
    from sloctl.models.predictor import VARIANTS
    from sloctl.models.stage import StageConfig
    from sloctl.training.pipeline import fit_stage, split_rows

    cfg, variant = IconqSection(seed=seed), VARIANTS["iconq_plus"]
    log = read_log(log_path)
    splits = split_rows(len(log), cfg.val_fraction, cfg.test_fraction, cfg.seed)
    stage = fit_stage(log, splits["train"], StageConfig(), overlap_counts(log).to_numpy())
    stage_s = stage.predict(log)
    plan = FeatureScaler.fit(log.iloc[splits["train"]]).transform(log)
    arrival, size = log["arrival_s"].to_numpy(float), log["cluster_size"].to_numpy(float)
    own = self_vectors(plan, stage_s, size, variant.size_features)
    index = neighbour_index(log)
    table = sample_table(log, splits["train"], censored=variant.censored, seed=cfg.seed, index=index)
    sf = variant.size_features

    class PerSample(Dataset):  # what IconqDataset held per sample, built when drawn
        def __len__(self) -> int:
            return len(table)

        def __getitem__(self, i: int) -> dict:
            r = int(table.row[i])
            before = index.before[index.before_ptr[r]:index.before_ptr[r + 1]]
            after = index.after[index.after_ptr[r]:index.after_ptr[r] + int(table.after_len[i])]
            item = {"self_x": own[r],
                    "before": pair_vectors(plan, stage_s, arrival, size, np.full(len(before), r), before, sf),
                    "after": pair_vectors(plan, stage_s, arrival, size, np.full(len(after), r), after, sf),
                    "base_log": float(np.log(stage_s[r]))}
            item.update(label_log=float(table.label_log[i]), censored=bool(table.censored[i]))
            return item

    def collate(items: list[dict]) -> dict:
        batch = collate_rows(items)
        batch["label_log"] = torch.tensor([it["label_log"] for it in items], dtype=torch.float32)
        batch["censored"] = torch.tensor([it["censored"] for it in items], dtype=torch.bool)
        return batch

    torch.manual_seed(seed)
    net = IconqNet(IconqConfig(pair_dim=pair_dim(sf),
                               self_dim=own.shape[1], embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
                               head_dim=cfg.head_dim, dropout=cfg.dropout, after_order=variant.after_order))
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loader = DataLoader(PerSample(), batch_size=cfg.batch_size, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(seed))
    net.train()
    samples, started = 0, time.perf_counter()
    for batch in loader:
        loss = qerror_loss(net(batch["self_x"], batch["before_x"], batch["before_len"], batch["after_x"],
                               batch["after_len"], batch["base_log"]), batch["label_log"], batch["censored"])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
        optimizer.step()
        samples += len(batch["label_log"])
        if time.perf_counter() - started >= seconds:
            break
    elapsed = time.perf_counter() - started
    out.put({"samples": samples, "train_s": elapsed, "samples_per_s": samples / elapsed, "peak_rss_mb": _rss_mb()})


def _after(log_path: str, max_train_s: float | None, seed: int, devices: int, out: multiprocessing.Queue) -> None:
    """``train_iconq`` as the CLI runs it, to its stopping rule."""
    from sloctl.core.config import IconqSection
    from sloctl.datasets.querylog import read_log
    from sloctl.models.stage import StageConfig
    from sloctl.training.pipeline import learn_iconq

    log = read_log(log_path)
    started = time.perf_counter()
    result = learn_iconq(log, StageConfig(), IconqSection(seed=seed, max_train_s=max_train_s, devices=devices),
                         on_point=lambda p: print(f"  after: {p.rows:,} rows -> val p90 {p.val_q_error_p90:.3f} "
                                                  f"({p.epochs} epochs, {p.wall_s:.0f} s)", file=sys.stderr,
                                                  flush=True),
                         on_epoch=lambda e, v: print(f"  after: epoch {e} val_loss {v:.4f} "
                                                     f"({time.perf_counter() - started:.0f} s)", file=sys.stderr,
                                                     flush=True))
    m, p = result.metrics, result.params
    out.put({"samples_per_s": m["train_samples_per_s"], "train_samples": m["train_samples"],
             "epochs": m["epochs"], "fit_wall_s": m["train_wall_s"], "wall_s": time.perf_counter() - started,
             "stopped_by": p["iconq_stopped_by"], "batch_size": p["iconq_batch_size_used"],
             "lr": p["iconq_lr_used"], "val_q_error_p90": m["val_q_error_p90"],
             "test_q_error_p50": m["test_q_error_p50"], "test_q_error_p90": m["test_q_error_p90"],
             "learned_rows": p.get("iconq_learned_rows"), "curve_stop": p.get("iconq_curve_stop"),
             "curve": p.get("iconq_curve"), "devices": devices,
             # the spawned DDP processes' memory is their own; ru_maxrss of children covers them
             "peak_rss_mb": _rss_mb(),
             "peak_rss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0})


def _after_all(log_path: str, seconds: float, seed: int, out: multiprocessing.Queue) -> None:
    """The after path on every training row (as the before path trains), for ``seconds`` of training."""
    from sloctl.core.config import IconqSection
    from sloctl.datasets.querylog import read_log
    from sloctl.models.stage import StageConfig
    from sloctl.training.pipeline import train_iconq

    log = read_log(log_path)
    result = train_iconq(log, StageConfig(), IconqSection(seed=seed, learn_rows="all", max_train_s=seconds),
                         risk_quantile=None)
    m, p = result.metrics, result.params
    out.put({"samples_per_s": m["train_samples_per_s"], "train_samples": m["train_samples"],
             "batch_size": p["iconq_batch_size_used"], "lr": p["iconq_lr_used"],
             "precision": p["iconq_precision_used"], "peak_rss_mb": _rss_mb()})


def _child(target, *args):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--world", type=Path, action="append", help="Real log(s) the simulated one is drawn from.")
    parser.add_argument("--before-s", type=float, default=60.0, help="Seconds the before path trains.")
    parser.add_argument("--max-train-s", type=float, default=None, help="iconq.max_train_s of the after path.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=1, help="iconq.devices of the after path (DDP processes).")
    parser.add_argument("--keep", type=Path, default=None, help="Keep the simulated log here.")
    parser.add_argument("--skip-before", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from sloctl.datasets.merge import merge_logs
    from sloctl.datasets.querylog import read_log, write_log
    from sloctl.simulation.log_synth import simulate_log

    worlds = args.world or DEFAULT_WORLD
    if not worlds:
        parser.error("no --world log given and none under data/logs/train3-0.1-r*.parquet: collect one with "
                     "`sloctl collect` and pass it as --world")
    world = read_log(worlds[0]) if len(worlds) == 1 else merge_logs(worlds)[0]
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        path = args.keep or Path(tmp) / "simulated.parquet"
        t = time.perf_counter()
        write_log(simulate_log(world, args.rows, seed=args.seed), path)
        simulate_s = time.perf_counter() - t
        print(f"simulated {args.rows:,} rows from {len(worlds)} log(s) in {simulate_s:.1f} s -> {path}",
              file=sys.stderr)
        before = None if args.skip_before else _child(_before, str(path), args.before_s, args.seed)
        if before:
            print(f"before: {before['samples_per_s']:,.0f} samples/s", file=sys.stderr)
        after_all = None if args.skip_before else _child(_after_all, str(path), args.before_s, args.seed)
        if after_all:
            print(f"after, every row: {after_all['samples_per_s']:,.0f} samples/s", file=sys.stderr)
        after = _child(_after, str(path), args.max_train_s, args.seed, args.devices)
    report = {"rows": args.rows, "world": [str(w) for w in worlds], "simulate_s": simulate_s,
              "before": before, "after_all_rows": after_all, "after": after,
              "speedup": None if before is None else after_all["samples_per_s"] / before["samples_per_s"],
              "speedup_kept_model": None if before is None else after["samples_per_s"] / before["samples_per_s"]}
    if args.json:
        print(json.dumps(report))
    else:
        if before:
            print(f"before: {before['samples_per_s']:,.0f} samples/s (batch 32, {before['train_s']:.0f} s timed), "
                  f"peak RSS {before['peak_rss_mb']:,.0f} MB")
        print(f"after:  {after['samples_per_s']:,.0f} samples/s (batch {after['batch_size']}, lr {after['lr']:.4g}, "
              f"{after['devices']} process(es)), learned from {after['learned_rows']} rows ({after['curve_stop']}), "
              f"{after['epochs']:.0f} epochs, stopped by {after['stopped_by']}, training {after['wall_s'] / 60:.1f} "
              f"min, peak RSS {after['peak_rss_mb']:,.0f} MB, test p50/p90 {after['test_q_error_p50']:.3f}/"
              f"{after['test_q_error_p90']:.3f}")
        if report["speedup"]:
            print(f"after, every row: {after_all['samples_per_s']:,.0f} samples/s (batch {after_all['batch_size']}, "
                  f"{after_all['precision']}, {args.before_s:.0f} s timed)")
            print(f"speed-up: {report['speedup']:.1f}x samples per second on every row, side by side "
                  f"({report['speedup_kept_model']:.1f}x for the kept model's curve point)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
