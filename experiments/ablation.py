"""The latency-model ablation (AutoSLO §8.3.1): Stage and the four Iconq variants over several seeds.

Every seed draws its own split of the log by query (``iconq.val_fraction``,
``iconq.test_fraction``) and its own initialisation; within a seed, every
model trains on the same training queries and is scored on the same held-out
test queries. Q-error is reported on the test queries that ran with
neighbours (the ones a concurrency model is for) and on all test queries, as
p50 / p90 / p95 per seed, with the mean and the range over seeds.

Nothing here is registered: ``sloctl train`` registers a model; this compares
configurations of one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sloctl.training.pipeline import train_iconq, train_stage

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.core.config import IconqSection, StageConfig

__all__ = ["MODELS", "STATS", "ablation"]

#: Model label -> Iconq variant (``None``: Stage alone), in the order of the paper's table.
MODELS: dict[str, str | None] = {"Stage": None, "Iconq": "iconq", "+Size": "size", "+Censored": "censored",
                                 "Iconq+": "iconq_plus"}
STATS = ("p50", "p90", "p95")
_SCOPES = {"concurrent": "test_concurrent_q_error", "all": "test_q_error"}


def _describe_log(log: pd.DataFrame) -> dict[str, Any]:
    status = log["status"].value_counts().to_dict() if "status" in log.columns else {}
    return {"queries": len(log), "sizes": sorted(int(s) for s in log["cluster_size"].unique()),
            "censored": int(sum(n for s, n in status.items() if s != "ok")), "status": status}


def ablation(log: pd.DataFrame, stage_config: StageConfig, iconq: IconqSection, seeds: Sequence[int], *,
             models: Sequence[str] = tuple(MODELS), on_result: Callable[[dict[str, Any]], None] | None = None
             ) -> dict[str, Any]:
    """Train every model of ``models`` on ``log`` for every seed; JSON-ready results.

    Args:
        log: a validated query log (finished and censored rows).
        stage_config: Stage's settings (also the Iconq variants' Stage).
        iconq: Iconq's settings; ``variant`` and ``seed`` are set per run.
        seeds: split and initialisation seeds.
        models: labels of :data:`MODELS` to run.
        on_result: called after each model and seed with ``{model, seed, seconds, metrics}``.

    Returns:
        ``{"log", "seeds", "runs": [...], "summary": {model: {scope: {stat: {mean, min, max, per_seed}}}},
        "iconq_plus_over_stage_p90": {mean, min, max, per_seed}}`` where scope is ``concurrent`` (test
        queries with neighbours) or ``all``.
    """
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"Unknown model(s) {unknown}; expected some of {list(MODELS)}.")
    if not seeds:
        raise ValueError("Give at least one seed.")
    runs = []
    for seed in seeds:
        for label in models:
            variant = MODELS[label]
            started = time.perf_counter()
            if variant is None:
                result = train_stage(log, stage_config, val_fraction=iconq.val_fraction,
                                     test_fraction=iconq.test_fraction, seed=seed)
            else:
                result = train_iconq(log, stage_config, dataclasses.replace(iconq, variant=variant, seed=seed),
                                     risk_quantile=None)
            run = {"model": label, "seed": int(seed), "seconds": time.perf_counter() - started,
                   "epochs": result.metrics.get("epochs"),
                   **{scope: {s: float(result.metrics[f"{prefix}_{s}"]) for s in STATS}
                      for scope, prefix in _SCOPES.items()},
                   "n": {scope: int(result.metrics[f"test_{'concurrent_' if scope == 'concurrent' else ''}n"])
                         for scope in _SCOPES}}
            runs.append(run)
            if on_result is not None:
                on_result(run)
    summary: dict[str, Any] = {}
    for label in models:
        mine = [r for r in runs if r["model"] == label]
        summary[label] = {scope: {s: _spread([r[scope][s] for r in mine]) for s in STATS} for scope in _SCOPES}
    out: dict[str, Any] = {"log": _describe_log(log), "seeds": [int(s) for s in seeds], "runs": runs,
                           "summary": summary}
    if "Stage" in models and "Iconq+" in models:
        by = {(r["model"], r["seed"]): r for r in runs}
        out["iconq_plus_over_stage_p90"] = _spread(
            [by[("Iconq+", s)]["concurrent"]["p90"] / by[("Stage", s)]["concurrent"]["p90"] for s in seeds])
    return out


def _spread(values: list[float]) -> dict[str, Any]:
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max()),
            "per_seed": [float(v) for v in arr]}
