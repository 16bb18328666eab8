"""Training pipelines for Stage and Iconq+ from a query log.

Both split the log by query (seeded) into train / validation / test, fit on
the training split only, and report Q-error p50/p90/p95 per split — on every
``ok`` query, on the isolated ones and on those that ran with neighbours.
Iconq trains its own Stage sub-model on the training split's isolated
executions (AutoSLO §8.3.2), so the bundle it produces is self-contained.
Both also calibrate the Query Router's SLO margin on the log they were given
and keep its template table (AutoSLO §5), so that the bundle carries what a
router needs besides the model.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sloctl.core.errors import QueryLogError
from sloctl.core.kinds import ModelKind
from sloctl.datasets.analysis import overlap_counts
from sloctl.datasets.interactions import FeatureScaler, neighbour_index, sample_table, self_vectors
from sloctl.datasets.querylog import COLUMNS, template_table
from sloctl.models.calibration import calibrate_slo_margin
from sloctl.models.metrics import q_error_summary
from sloctl.models.predictor import VARIANTS, LatencyPredictor, used_features
from sloctl.models.stage import StageConfig, StageModel

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.core.config import IconqSection

__all__ = ["CURVE_ROWS", "OBJECTIVES", "CurvePoint", "StageObjective", "TrainResult", "batch_plan", "curve_rows",
           "data_hash", "evaluate_predictor", "fit_iconq_module", "iconq_splits", "learn_iconq", "split_rows",
           "train_iconq", "train_iconq_curve", "train_stage"]

SPLITS = ("train", "val", "test")
#: What each model is selected on: the champion gate's metric and the Optuna studies' objective.
OBJECTIVES = {"stage": "val_isolated_q_error_p90", "iconq": "val_q_error_p90"}


def objective_of(model: str, stage: StageConfig | None = None) -> str:
    """The metric ``model`` is selected and tuned on: Stage trained on every execution (``train_on: all``)
    is judged on every validation execution, not only the isolated ones."""
    if model == ModelKind.STAGE and stage is not None and stage.train_on == "all":
        return "val_q_error_p90"
    return OBJECTIVES[model]


class StageObjective:
    """LightGBM callback: Stage's selection metric on the validation rows, as LightGBM's own eval results.

    Every round it appends ``("valid_0", "val_isolated_q_error_p90", value,
    False)`` to the round's evaluation list; ``value`` is computed every
    ``period`` rounds and at the last (in between it is the last computed
    one) and is what :func:`train_stage` would report for the model at that
    round: the p90 Q-error on the validation split's isolated
    ``ok`` rows, the exact-repeat cache answering the rows it knows. An
    ``optuna_integration.LightGBMPruningCallback`` placed after it (same
    ``period``) then prunes on the study's objective itself, not on
    LightGBM's log-space L1.
    """

    name = OBJECTIVES["stage"]

    def __init__(self, config: StageConfig, train: pd.DataFrame, val: pd.DataFrame, period: int = 10) -> None:
        import math

        self.name = objective_of("stage", config)
        self.period = period
        self.value = float("nan")  # the metric at the last round it was computed (every ``period`` rounds)
        self.matrix = StageModel(config)._matrix(val)
        self._raw = np.zeros(len(val))
        self.actual_s = val["latency_s"].to_numpy(dtype=float)
        self.cached_log = np.full(len(val), np.nan)
        if config.use_cache and "sql_hash" in train.columns:
            medians = train.groupby(["sql_hash", "cluster_size"])["latency_s"].median()
            known = {(str(k), int(size)): float(v) for (k, size), v in medians.items()}
            for i, key in enumerate(zip(val["sql_hash"].astype(str), val["cluster_size"].astype(int), strict=True)):
                if key in known:
                    self.cached_log[i] = math.log(known[key])

    def __call__(self, env: Any) -> None:
        # one tree's contribution per round (the running sum is the model's log prediction at this round)
        self._raw = self._raw + env.model.predict(self.matrix, start_iteration=env.iteration, num_iteration=1,
                                                  raw_score=True)
        if (env.iteration + 1) % self.period == 0 or env.iteration + 1 == env.end_iteration:
            log_pred = np.where(np.isnan(self.cached_log), self._raw, self.cached_log)
            self.value = q_error_summary(np.exp(log_pred), self.actual_s)["p90"]
        try:  # lightgbm >= 4.7 keeps results as EvalResult (a named tuple); older releases as plain tuples
            from lightgbm.basic import EvalResult
        except ImportError:
            env.evaluation_result_list.append(("valid_0", self.name, self.value, False))
        else:
            env.evaluation_result_list.append(EvalResult("valid_0", self.name, self.value, False))


@dataclass
class TrainResult:
    """A trained predictor with what MLflow records about it."""

    predictor: LatencyPredictor
    metrics: dict[str, float]
    params: dict[str, Any]
    data_hash: str
    splits: dict[str, np.ndarray] = field(repr=False)
    selection_metric: str = "val_q_error_p90"


def data_hash(log: pd.DataFrame) -> str:
    """SHA-256 (16 hex digits) of the log's schema columns, row order included."""
    import pandas as pd

    digest = pd.util.hash_pandas_object(log[list(COLUMNS)], index=False).to_numpy().tobytes()
    return hashlib.sha256(digest).hexdigest()[:16]  # as sloctl.registry.provenance hashes a log


def split_rows(n: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Seeded split of row positions by query into train / val / test."""
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError("The 'val_fraction' and 'test_fraction' parameters must be >= 0 and sum to < 1, "
                         f"got {val_fraction!r} and {test_fraction!r}.")
    order = np.random.default_rng(seed).permutation(n)
    n_val, n_test = int(round(n * val_fraction)), int(round(n * test_fraction))
    return {"val": np.sort(order[:n_val]), "test": np.sort(order[n_val:n_val + n_test]),
            "train": np.sort(order[n_val + n_test:])}


def _check_log(log: pd.DataFrame) -> None:
    if len(log) == 0:
        raise QueryLogError("The query log is empty; nothing to train or evaluate on.")
    if not (log["status"] == "ok").any():
        raise QueryLogError("The query log has no 'ok' rows; latencies are needed to train or evaluate.")


def _summaries(prefix: str, predicted_s: np.ndarray, actual_s: np.ndarray, neighbours: np.ndarray
               ) -> dict[str, float]:
    out: dict[str, float] = {}
    for part, mask in (("", np.ones(len(actual_s), bool)), ("isolated_", neighbours == 0),
                       ("concurrent_", neighbours > 0)):
        out[f"{prefix}_{part}n"] = float(mask.sum())
        for stat, value in q_error_summary(predicted_s[mask], actual_s[mask]).items():
            if stat != "mean":
                out[f"{prefix}_{part}q_error_{stat}"] = value
    return out


def fit_stage(log: pd.DataFrame, rows: np.ndarray, config: StageConfig, neighbours: np.ndarray) -> StageModel:
    """Stage fitted on the isolated ``ok`` executions among ``rows`` (every ``ok`` one with ``train_on: all``)."""
    ok = _stage_rows(log, config, neighbours)
    chosen = np.asarray(rows)[ok[rows]]
    if len(chosen) < 2 and config.train_on == "all":
        raise ValueError(f"Stage needs at least 2 ok executions in the training split; found {len(chosen)}.")
    if len(chosen) < 2:
        raise ValueError(
            f"Stage needs isolated executions (ok queries with no neighbour) in the training split; found "
            f"{len(chosen)}. Collect an isolated workload too (sloctl collect --workload isolated), or set "
            f"stage.train_on: all to learn from every execution.")
    frame = log.iloc[chosen]
    return StageModel(config).fit(frame, frame["latency_s"].to_numpy())


def _with_router_data(predictor: LatencyPredictor, log: pd.DataFrame, risk_quantile: float | None,
                      metrics: dict[str, float], params: dict[str, Any]) -> LatencyPredictor:
    """``predictor`` carrying the router's SLO margin calibrated on ``log`` and the log's template table.

    The margin is calibrated on the whole log the model was given (the same
    function and log ``sloctl experiment`` calibrated on before bundles
    carried a margin); it and the risk quantile are recorded in ``metrics``
    and ``params``. ``risk_quantile=None`` skips the calibration.
    """
    calibration = None if risk_quantile is None else calibrate_slo_margin(predictor, log, risk_quantile)
    if calibration is not None:
        metrics.update({"slo_margin": calibration.slo_margin, "slo_margin_ratio_at_quantile":
                        calibration.ratio_at_quantile, "slo_margin_ratio_p50": calibration.ratio_p50})
        params["router_risk_quantile"] = risk_quantile
    params["feature_source"] = predictor.feature_source
    params["feature_columns"] = len(predictor.feature_columns or ())
    return LatencyPredictor(predictor.stage, predictor.scaler, predictor.net, predictor.variant,
                            plan_feature_version=predictor.plan_feature_version, calibration=calibration,
                            templates=template_table(log), feature_columns=predictor.feature_columns)


def _stage_rows(log: pd.DataFrame, config: StageConfig, neighbours: np.ndarray) -> np.ndarray:
    """The rows Stage may learn from: ``ok`` ones, and with ``train_on: isolated`` only those that ran alone."""
    ok = log["status"].to_numpy() == "ok"
    return ok & (neighbours == 0) if config.train_on == "isolated" else ok


def train_stage(log: pd.DataFrame, config: StageConfig, *, val_fraction: float = 0.15,
                test_fraction: float = 0.15, seed: int = 0, callbacks: list[Any] | None = None,
                risk_quantile: float | None = 0.75) -> TrainResult:
    """Fit Stage on the training split; Q-error per split.

    Stage's job is isolated latency, so it is selected on
    ``val_isolated_q_error_p90`` (with ``train_on: all``, on ``val_q_error_p90``).
    ``risk_quantile`` (``router.risk_quantile``) calibrates the SLO margin the predictor carries; ``None`` skips it.
    With ``callbacks`` (LightGBM callbacks, e.g. Optuna pruning), Stage is
    fitted with the validation split's isolated rows as its eval set and a
    :class:`StageObjective` first in the list, so that the callbacks see the
    selection metric every 10 rounds as ``val_isolated_q_error_p90``.
    """
    _check_log(log)
    splits = split_rows(len(log), val_fraction, test_fraction, seed)
    neighbours = overlap_counts(log).to_numpy()
    ok = log["status"].to_numpy() == "ok"
    usable = _stage_rows(log, config, neighbours)
    val_iso = splits["val"][usable[splits["val"]]]
    train_iso = splits["train"][usable[splits["train"]]]
    if callbacks and len(val_iso) and len(train_iso) >= 2:  # an eval set, so that tuners can prune on it
        frame, val = log.iloc[train_iso], log.iloc[val_iso]
        stage = StageModel(config).fit(frame, frame["latency_s"].to_numpy(),
                                       callbacks=[StageObjective(config, frame, val), *callbacks],
                                       eval_set=(val, val["latency_s"].to_numpy()))
    else:
        stage = fit_stage(log, splits["train"], config, neighbours)
    predicted = stage.predict(log)
    actual = log["latency_s"].to_numpy()
    metrics: dict[str, float] = {}
    for name in SPLITS:
        rows = splits[name][ok[splits[name]]]
        metrics.update(_summaries(name, predicted[rows], actual[rows], neighbours[rows]))
    params = {"model": "stage", **asdict(config), "val_fraction": val_fraction, "test_fraction": test_fraction,
              "split_seed": seed}
    columns = used_features(log.iloc[splits["train"]])
    predictor = _with_router_data(LatencyPredictor(stage, feature_columns=columns), log, risk_quantile, metrics,
                                  params)
    return TrainResult(predictor=predictor, metrics=metrics, params=params, data_hash=data_hash(log), splits=splits,
                       selection_metric=objective_of("stage", config))


def train_iconq(log: pd.DataFrame, stage_config: StageConfig, cfg: IconqSection, *,
                callbacks: list[Any] | None = None, progress: bool = False,
                on_epoch: Callable[[int, float], None] | None = None,
                risk_quantile: float | None = 0.75,
                on_batch: Callable[[int, int, int, float], None] | None = None,
                train_rows: np.ndarray | None = None) -> TrainResult:
    """Train an Iconq variant (with its own Stage) on the training split.

    Args:
        log: a validated query log.
        stage_config: settings of the Stage sub-model.
        cfg: variant, network size, optimiser, split, and where it trains (``devices``; ``ray_address``:
            under Ray Train, :mod:`sloctl.training.ray_train`).
        callbacks: extra Lightning callbacks (e.g. Optuna pruning); with ``devices > 1`` or Ray they
            travel to other processes, pickled.
        progress: show Lightning's progress bar.
        on_epoch: called with (epoch, val_loss) after each validation.
        on_batch: called after each training batch with (epoch, samples done
            this epoch, samples per epoch, samples per second this epoch).
        train_rows: learn from these rows of the training split only (the
            learning curve's prefixes); default every training row.
        risk_quantile: ``router.risk_quantile``: the predictor carries the SLO
            margin calibrated on ``log`` at this quantile (``None``: no margin).
    """
    import lightning as L

    from sloctl.models.batches import IconqInputs, IconqSamples, predict_samples
    from sloctl.models.iconq import IconqConfig
    from sloctl.training.lightning import (
        EpochReporter,
        IconqDataModule,
        IconqLightning,
        LineProgress,
        TrainingProgress,
    )

    _check_log(log)
    _quiet_lightning()
    variant = VARIANTS[cfg.variant]
    splits = iconq_splits(log, cfg)
    if train_rows is not None:
        train_rows = np.sort(np.asarray(train_rows, dtype=np.int64))
        if not np.isin(train_rows, splits["train"]).all():
            raise ValueError("The 'train_rows' parameter of train_iconq must hold rows of the training split only.")
        splits = {**splits, "train": train_rows}
    neighbours = overlap_counts(log).to_numpy()
    stage = fit_stage(log, splits["train"], stage_config, neighbours)
    stage_s = stage.predict(log)
    scaler = FeatureScaler.fit(log.iloc[splits["train"]])
    plan = scaler.transform(log).astype(np.float32)
    arrival = log["arrival_s"].to_numpy(dtype=float)
    size = log["cluster_size"].to_numpy(dtype=float)
    inputs = IconqInputs(self_vectors(plan, stage_s, size, variant.size_features), plan, stage_s, arrival, size,
                         variant.size_features, neighbour_index(log))

    def dataset(rows: np.ndarray, censored: bool, seed: int, shared: bool = False) -> IconqSamples:
        return IconqSamples(inputs, sample_table(log, rows, censored=censored, partial_per_query=cfg.partial_per_query,
                                                 seed=seed, index=inputs.index), shared=shared)

    train_ds = dataset(splits["train"], variant.censored, cfg.seed)
    batch_size, lr = batch_plan(cfg, len(train_ds))
    # in arrival order a query's censored prefixes share its full sample's neighbour passes (large batches)
    shared = variant.censored and variant.after_order == "chronological" and (
        cfg.shared_passes == "on" or (cfg.shared_passes == "auto" and batch_size >= SHARED_MIN_BATCH))
    train_ds.shared = shared
    val_ds = dataset(watched_rows(splits["val"], cfg), variant.censored, cfg.seed + 1, shared)
    if len(train_ds) == 0 or len(val_ds) == 0:
        raise ValueError(f"Too few queries to train Iconq: {len(train_ds)} training and {len(val_ds)} validation "
                         "samples; collect a longer log.")
    net_config = IconqConfig(pair_dim=inputs.pair_dim, self_dim=inputs.own.shape[1],
                             embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim, head_dim=cfg.head_dim,
                             dropout=cfg.dropout, after_order=variant.after_order)
    precision = precision_plan(cfg, batch_size)
    fit_cfg = replace(cfg, precision=precision)
    L.seed_everything(cfg.seed, verbose=False)
    module = IconqLightning(asdict(net_config), lr=lr, weight_decay=cfg.weight_decay, lr_gamma=cfg.lr_gamma)
    if cfg.devices > 1 or cfg.ray_address is not None:
        # spawned processes and Ray workers cannot call back into this one: they print their own progress
        epoch_hook = [LineProgress(len(train_ds))] if on_epoch or on_batch else []
    else:
        epoch_hook = [EpochReporter(on_epoch)] if on_epoch else []
        if on_batch is not None:
            epoch_hook.append(TrainingProgress(on_batch, len(train_ds)))
    data = IconqDataModule(train_ds, val_ds, batch_size, cfg.seed, workers=cfg.loader_workers)
    interval = check_interval(cfg, len(train_ds), batch_size)
    if cfg.ray_address is not None:
        from sloctl.training.ray_train import fit_on_ray

        state, fit, best_val_loss = fit_on_ray(module, data, fit_cfg, [*epoch_hook, *(callbacks or [])],
                                               val_check_interval=interval)
    else:
        state, fit, best_val_loss = fit_iconq_module(module, data, fit_cfg, [*epoch_hook, *(callbacks or [])],
                                                     progress=progress, val_check_interval=interval)
    module.load_state_dict(state)
    for hook in callbacks or []:  # a pruning decided in other processes is read back from the study's storage
        if hasattr(hook, "check_pruned"):
            hook.check_pruned()
    epochs = int(fit["fit_epochs"])
    stopped_by = ("early_stopping" if fit["fit_early_stopped"] else
                  "max_epochs" if epochs >= cfg.max_epochs else
                  "max_train_s" if cfg.max_train_s is not None else "other")
    net = module.net.eval()
    predictor = LatencyPredictor(stage, scaler, net, variant,
                                 feature_columns=used_features(log.iloc[splits["train"]]))
    metrics: dict[str, float] = {"epochs": float(epochs), "best_val_loss": best_val_loss,
                                 "train_samples": float(len(train_ds)),
                                 "train_samples_per_s": (fit["fit_samples"] / fit["fit_train_s"]
                                                         if fit["fit_train_s"] > 0 else float("nan")),
                                 "train_wall_s": fit["fit_wall_s"], "devices": float(cfg.devices)}
    actual = log["latency_s"].to_numpy()
    ok = log["status"].to_numpy() == "ok"
    for name in SPLITS:
        rows = splits[name][ok[splits[name]]]
        ds = dataset(rows, False, 0)
        pred = np.exp(predict_samples(net, ds))
        eval_rows = ds.table.row
        metrics.update(_summaries(name, pred, actual[eval_rows], neighbours[eval_rows]))
    params = {"model": "iconq", "variant": variant.name, **{f"iconq_{k}": v for k, v in asdict(cfg).items()},
              "iconq_batch_size_used": batch_size, "iconq_lr_used": lr, "iconq_precision_used": precision,
              "iconq_shared_passes_used": shared,
              "iconq_stopped_by": stopped_by,
              **{f"stage_{k}": v for k, v in asdict(stage_config).items()}}
    predictor = _with_router_data(predictor, log, risk_quantile, metrics, params)
    return TrainResult(predictor=predictor, metrics=metrics, params=params, data_hash=data_hash(log), splits=splits)


def fit_iconq_module(module: Any, data: Any, cfg: IconqSection, callbacks: list[Any], *, progress: bool = False,
                     val_check_interval: float | int = 1.0, prepare: Callable[[Any], Any] | None = None,
                     **trainer_args: Any) -> tuple[dict[str, Any], dict[str, float], float]:
    """One Lightning fit of Iconq+: early stopping on ``val_loss``, the best checkpoint, :class:`SampleRate`,
    ``iconq.max_train_s`` as Lightning's ``max_time``, and ``callbacks`` after them.

    Data parallelism is Lightning's DDP over ``cfg.devices`` spawned processes
    unless ``trainer_args`` (``strategy``, ``plugins``, ``devices``) say
    otherwise: Ray Train's workers each call this with Ray's strategy and
    environment, and ``prepare`` (Ray's ``prepare_trainer``) sees the trainer
    before the fit.

    Args:
        module: an ``IconqLightning``; it ends with the last step's weights.
        data: an ``IconqDataModule`` (it shards batches by the trainer's ranks).
        cfg: epochs, patience, accelerator, devices, gradient clipping, time budget.
        callbacks: further Lightning callbacks (progress, pruning).
        progress: Lightning's progress bar.
        val_check_interval: Lightning's, from :func:`check_interval`.

    Returns:
        The best checkpoint's state_dict (on the first process; the last
        weights where none was saved), SampleRate's ``fit_*`` figures and the
        best ``val_loss`` (NaN where this process does not know it).
    """
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from sloctl.training.lightning import SampleRate

    with tempfile.TemporaryDirectory(prefix="sloctl-iconq-") as ckpt_dir:
        checkpoint = ModelCheckpoint(dirpath=ckpt_dir, monitor="val_loss", mode="min", save_top_k=1)
        stopper = EarlyStopping("val_loss", patience=cfg.patience, mode="min")
        args = {"devices": cfg.devices,
                # a batch whose queries all lack after-neighbours leaves the after-LSTM out of the graph
                "strategy": "ddp_spawn_find_unused_parameters_true" if cfg.devices > 1 else "auto", **trainer_args}
        trainer = L.Trainer(
            max_epochs=cfg.max_epochs, accelerator=cfg.accelerator, logger=False, deterministic=True,
            precision=cfg.precision,
            use_distributed_sampler=False,  # IconqDataModule shards its own batches
            gradient_clip_val=cfg.grad_clip, enable_progress_bar=progress, enable_model_summary=False,
            num_sanity_val_steps=0, default_root_dir=ckpt_dir,
            max_time=None if cfg.max_train_s is None else {"seconds": cfg.max_train_s},
            val_check_interval=val_check_interval, callbacks=[stopper, checkpoint, SampleRate(), *callbacks], **args)
        if prepare is not None:
            trainer = prepare(trainer)
        trainer.fit(module, datamodule=data)
        if checkpoint.best_model_path and trainer.is_global_zero:  # only the first process wrote it
            state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
        else:
            state = module.state_dict()
        # SampleRate's figures, which come back from spawned data-parallel processes too
        fit = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("fit_")}
        return state, fit, float(checkpoint.best_model_score or np.nan)


def iconq_splits(log: pd.DataFrame, cfg: IconqSection) -> dict[str, np.ndarray]:
    """Iconq+'s train / val / test rows: by query at random (``iconq.split: random``, seeded), or by time
    (``time``: the earliest rows train, the next ``val_fraction`` validate, the latest ``test_fraction`` test)."""
    if cfg.split == "random":
        return split_rows(len(log), cfg.val_fraction, cfg.test_fraction, cfg.seed)
    order = np.lexsort((log["query_id"].to_numpy(), log["arrival_s"].to_numpy(dtype=float)))
    n_val, n_test = int(round(len(log) * cfg.val_fraction)), int(round(len(log) * cfg.test_fraction))
    n_train = len(log) - n_val - n_test
    return {"train": np.sort(order[:n_train]), "val": np.sort(order[n_train:n_train + n_val]),
            "test": np.sort(order[n_train + n_val:])}


#: The learning curve's training sizes (rows), as far as the training split reaches; the last point is all of it.
CURVE_ROWS = (10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000, 10_000_000)


@dataclass
class CurvePoint:
    """One point of a learning curve: how many training rows, and the model's validation Q-error."""

    rows: int
    val_q_error_p50: float
    val_q_error_p90: float
    epochs: int
    wall_s: float
    stopped_by: str


def curve_rows(n_train: int, points: tuple[int, ...] = CURVE_ROWS) -> list[int]:
    """The training sizes a learning curve tries for a training split of ``n_train`` rows."""
    return [p for p in points if p < n_train] + [n_train]


def train_iconq_curve(log: pd.DataFrame, stage_config: StageConfig, cfg: IconqSection, *,
                      points: tuple[int, ...] = CURVE_ROWS, full: bool = False,
                      on_point: Callable[[CurvePoint], None] | None = None, **kwargs: Any) -> TrainResult:
    """Iconq+ trained on as much of the log as helps (``iconq.learn_rows: curve``).

    Trains on growing prefixes (in time) of the training split —
    ``points`` rows, then all of it — and stops adding data once the
    validation p90 Q-error improves by less than ``iconq.curve_tolerance``
    (relative) on the best so far; the best model is returned. With
    ``iconq.max_train_s`` the budget covers the whole curve: each training
    gets what is left, and the curve ends when it is spent. The result's
    ``params`` record the rows learned from, why the curve stopped and every
    point (``iconq_curve``). ``full``: train every point (a learning curve to
    plot), picking the same way.

    ``kwargs`` go to :func:`train_iconq` (callbacks, progress hooks, ``risk_quantile``).
    """
    import dataclasses
    import time

    pool = iconq_splits(log, cfg)["train"]
    pool = pool[np.lexsort((log["query_id"].to_numpy()[pool], log["arrival_s"].to_numpy(dtype=float)[pool]))]
    sizes = curve_rows(len(pool), points)
    started = time.monotonic()
    best: TrainResult | None = None
    curve: list[CurvePoint] = []
    why = "all rows"
    for i, n in enumerate(sizes):
        left = None if cfg.max_train_s is None else cfg.max_train_s - (time.monotonic() - started)
        if left is not None and left <= 0:
            why = f"max_train_s spent before {n} rows"
            break
        t0 = time.monotonic()
        result = train_iconq(log, stage_config, dataclasses.replace(cfg, max_train_s=left), train_rows=pool[:n],
                             **kwargs)
        point = CurvePoint(n, result.metrics["val_q_error_p50"], result.metrics["val_q_error_p90"],
                           int(result.metrics["epochs"]), time.monotonic() - t0, result.params["iconq_stopped_by"])
        curve.append(point)
        if on_point is not None:
            on_point(point)
        gain = 1.0 if best is None else 1.0 - point.val_q_error_p90 / best.metrics["val_q_error_p90"]
        if best is None or point.val_q_error_p90 < best.metrics["val_q_error_p90"]:
            best = result
        if point.stopped_by == "max_train_s":  # cut short by the budget: no verdict on the data's worth
            why = f"max_train_s spent while training on {n} rows"
            break
        if i + 1 < len(sizes) and gain < cfg.curve_tolerance and not full:
            why = (f"plateau: {n} rows improved validation p90 by {100 * gain:.1f}% "
                   f"(< {100 * cfg.curve_tolerance:g}%)")
            break
    assert best is not None
    best.params.update({"iconq_learned_rows": int(len(best.splits["train"])), "iconq_curve_stop": why,
                        "iconq_curve": [dataclasses.asdict(p) for p in curve]})
    best.metrics["learned_rows"] = float(len(best.splits["train"]))
    return best


def learn_iconq(log: pd.DataFrame, stage_config: StageConfig, cfg: IconqSection, **kwargs: Any) -> TrainResult:
    """Iconq+ as ``iconq.learn_rows`` says: every training row (``all``) or as many as help (``curve``)."""
    if cfg.learn_rows == "curve" and len(curve_rows(len(iconq_splits(log, cfg)["train"]))) > 1:
        return train_iconq_curve(log, stage_config, cfg, **kwargs)
    kwargs.pop("on_point", None)
    return train_iconq(log, stage_config, cfg, **kwargs)


def watched_rows(val_rows: np.ndarray, cfg: IconqSection) -> np.ndarray:
    """The validation rows early stopping, checkpoints and the learning curve watch: at most
    ``iconq.max_val_rows`` of them (a seeded sample, the same for every curve point); the reported
    ``val_*`` metrics are still computed on the whole validation split."""
    if cfg.max_val_rows is None or len(val_rows) <= cfg.max_val_rows:
        return val_rows
    return np.sort(np.random.default_rng(cfg.seed + 7).choice(val_rows, cfg.max_val_rows, replace=False))


def check_interval(cfg: IconqSection, n_samples: int, batch_size: int) -> float | int:
    """Lightning's ``val_check_interval``: once an epoch, or every ``iconq.check_every_samples`` on a large log.

    Early stopping's patience counts validations, so on a log whose epoch is
    millions of samples it waits a few hundred thousand samples, not epochs.
    """
    per_step = batch_size * cfg.devices  # each data-parallel process takes every devices-th batch
    batches = -(-n_samples // batch_size) // cfg.devices
    every = -(-cfg.check_every_samples // per_step)
    return 1.0 if every >= batches else int(every)


#: The smallest batch at which ``iconq.precision: auto`` trains in bfloat16 (smaller ones gain little).
BF16_MIN_BATCH = 512
#: The smallest batch at which ``iconq.shared_passes: auto`` groups a query's samples (in a smaller one the
#: group would take a large share of the batch's variety; small logs train exactly as before).
SHARED_MIN_BATCH = 512


def precision_plan(cfg: IconqSection, batch_size: int) -> str:
    """Lightning's precision for a fit: ``iconq.precision``, or for ``auto`` ``bf16-mixed`` when the batch
    is at least :data:`BF16_MIN_BATCH` and the hardware computes bfloat16 natively (CPUs with AVX-512 BF16
    or AMX, GPUs that support it), else ``32-true`` (small logs train exactly as before)."""
    if cfg.precision != "auto":
        return cfg.precision
    if batch_size < BF16_MIN_BATCH:
        return "32-true"
    import torch

    if cfg.accelerator == "gpu" or (cfg.accelerator == "auto" and torch.cuda.is_available()):
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    else:
        native = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return "bf16-mixed" if native else "32-true"


def batch_plan(cfg: IconqSection, n_samples: int) -> tuple[int, float]:
    """The batch size and learning rate for ``n_samples`` training samples.

    Batches grow with the data so that an epoch has at least 200 steps: the
    power of two nearest ``n_samples / 200``, between ``iconq.batch_size`` and
    ``iconq.max_batch_size``. With ``lr_scaling: sqrt`` the learning rate
    grows with the square root of the batch's ratio to ``batch_size``.
    """
    wanted = 2 ** round(math.log2(max(n_samples / 200, 1.0)))
    batch = int(min(max(wanted, cfg.batch_size), cfg.max_batch_size))
    lr = cfg.lr * (math.sqrt(batch / cfg.batch_size) if cfg.lr_scaling == "sqrt" else 1.0)
    return batch, float(lr)


def _quiet_lightning() -> None:
    """Keep Lightning's start-up banners and tips out of sloctl's output."""
    import logging
    import warnings

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def evaluate_predictor(predictor: LatencyPredictor, log: pd.DataFrame) -> dict[str, Any]:
    """Q-error of ``predictor`` on the ``ok`` rows of ``log`` (neighbours as logged)."""
    _check_log(log)
    predicted = predictor.predict(log, neighbours="overlap")
    ok = log["status"].to_numpy() == "ok"
    neighbours = overlap_counts(log).to_numpy()
    summary = q_error_summary(predicted[ok], log["latency_s"].to_numpy()[ok])
    concurrent = ok & (neighbours > 0)
    return {
        "n": int(ok.sum()),
        "q_error": {k: summary[k] for k in ("p50", "p90", "p95")},
        "n_concurrent": int(concurrent.sum()),
        "q_error_concurrent": {k: v for k, v in q_error_summary(
            predicted[concurrent], log["latency_s"].to_numpy()[concurrent]).items() if k != "mean"},
    }
