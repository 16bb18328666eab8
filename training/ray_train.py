"""Iconq+ training under Ray Train: the same Lightning fit, in ``iconq.devices`` Ray workers.

:func:`fit_on_ray` is what :func:`sloctl.training.pipeline.train_iconq` calls
when ``iconq.ray_address`` is set, in place of a local Lightning fit. A
``TorchTrainer`` starts ``iconq.devices`` workers (one GPU each with
``accelerator: gpu``); each seeds itself with ``iconq.seed`` and runs
:func:`~sloctl.training.pipeline.fit_iconq_module` with the module, data
module and callbacks the driver built, under Ray's DDP strategy and cluster
environment, so that ``IconqDataModule`` shards its batches by Ray's ranks.
The first worker hands the best checkpoint's weights, SampleRate's ``fit_*``
figures and the best ``val_loss`` back through a small actor the driver owns:
a cluster needs no storage shared with the driver, and the driver builds the
same ``TrainResult`` as a local fit.

Callbacks travel pickled. An Optuna trial does not pickle, so a study's
pruning callback (``optuna_integration.PyTorchLightningPruningCallback``)
travels as :class:`StudyPruning`, which opens the trial again in the worker
from the study's RDB storage (an SQLite file on this machine, PostgreSQL for
a cluster); the driver's callback then reads the decision back
(``check_pruned``), so a study's trials train on Ray as they would here.

The workers import sloctl, so a remote cluster needs it installed (the same
version). Progress lines (``LineProgress``) print in the first worker, into
Ray's worker logs.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import TYPE_CHECKING, Any

import lightning as L

if TYPE_CHECKING:
    from sloctl.core.config import IconqSection

__all__ = ["StudyPruning", "connect", "fit_on_ray"]


def connect(address: str, num_cpus: int | None = None) -> Any:
    """The ``ray`` module, connected: to the cluster at ``address``, or (``"local"``) to one started here.

    A Ray already initialised in this process is kept as it is (a study's
    trials share it). ``num_cpus``: the local cluster's CPUs (default: the machine's).

    Raises:
        ImportError: Ray is not installed.
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError("Ray is not installed (iconq.ray_address needs it): pip install 'sloctl[ray]'") from exc
    if not ray.is_initialized():
        local = address == "local"
        if local:  # a cluster of this machine only, started here (token auth would only bar us)
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=None if local else address, include_dashboard=False, log_to_driver=False,
                 num_cpus=(num_cpus or os.cpu_count() or 1) if local else None, configure_logging=False)
    return ray


class StudyPruning(L.Callback):
    """An Optuna pruning callback that pickles: the trial is opened again where the fit runs.

    Args:
        pruning: an ``optuna_integration.PyTorchLightningPruningCallback`` of a
            study kept in RDB storage; its ``check_pruned()`` after the fit
            raises ``TrialPruned`` when this one stopped the trial.

    Raises:
        ValueError: the study lives in memory, out of other processes' reach.
    """

    def __init__(self, pruning: Any) -> None:
        from optuna.storages import RDBStorage

        trial = pruning._trial
        storage = getattr(trial.study._storage, "_backend", trial.study._storage)
        if not isinstance(storage, RDBStorage):
            raise ValueError("An Optuna study whose trials train on Ray must keep its trials in RDB storage "
                             f"(sqlite:///..., postgresql://...), got {type(storage).__name__}.")
        self.url = _absolute_sqlite(storage.url)
        self.study_name = trial.study.study_name
        self.pruner = trial.study.pruner  # the study's, which its storage does not keep
        self.trial_id = trial._trial_id
        self.monitor = pruning.monitor
        self._pruning: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pruning": None}

    def _opened(self) -> Any:
        if self._pruning is None:
            import optuna
            from optuna_integration import PyTorchLightningPruningCallback

            study = optuna.load_study(study_name=self.study_name, storage=self.url, pruner=self.pruner)
            self._pruning = PyTorchLightningPruningCallback(optuna.trial.Trial(study, self.trial_id), self.monitor)
        return self._pruning

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._opened().on_fit_start(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._opened().on_validation_end(trainer, pl_module)


def _absolute_sqlite(url: str) -> str:
    """A relative ``sqlite:///file.db`` made absolute, so that workers elsewhere in the tree find the same file."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and url != prefix + ":memory:":
        return prefix + os.path.abspath(url[len(prefix):])
    return url


def _portable(callbacks: list[Any]) -> list[Any]:
    """``callbacks`` with Optuna's pruning callbacks as :class:`StudyPruning`."""
    try:
        from optuna_integration import PyTorchLightningPruningCallback
    except ImportError:
        return list(callbacks)
    return [StudyPruning(c) if isinstance(c, PyTorchLightningPruningCallback) else c for c in callbacks]


class _Inbox:
    """Holds what the first worker hands back until the driver takes it (a Ray actor)."""

    def __init__(self) -> None:
        self.value: Any = None

    def put(self, value: Any) -> None:
        self.value = value

    def take(self) -> Any:
        return self.value


def fit_on_ray(module: Any, data: Any, cfg: IconqSection, callbacks: list[Any], *,
               val_check_interval: float | int = 1.0) -> tuple[dict[str, Any], dict[str, float], float]:
    """:func:`~sloctl.training.pipeline.fit_iconq_module` in ``cfg.devices`` Ray Train workers.

    Args:
        module: the ``IconqLightning`` to train (its initial weights travel, so a seed gives the same start).
        data: its ``IconqDataModule``.
        cfg: the Iconq section; ``ray_address`` says where, ``devices`` how many workers.
        callbacks: further Lightning callbacks; they must pickle (no calls back into this process), Optuna's
            pruning callback travels as :class:`StudyPruning`.
        val_check_interval: Lightning's.

    Returns:
        As ``fit_iconq_module`` on the first worker: the best state_dict, the
        ``fit_*`` figures and the best ``val_loss``.
    """
    if cfg.ray_address is None:
        raise ValueError("The 'ray_address' parameter of fit_on_ray must be a Ray address or 'local', got None.")
    # a local cluster as large as the workers asked for, if the machine has fewer cores (they share them)
    ray = connect(cfg.ray_address, max(os.cpu_count() or 1, cfg.devices))
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    local = cfg.ray_address == "local"
    unit = "GPU" if cfg.accelerator == "gpu" else "CPU"
    if local and ray.cluster_resources().get(unit, 0) < cfg.devices:  # Ray would wait for them forever
        raise ValueError(f"The local Ray has {ray.cluster_resources().get(unit, 0):g} {unit}s; iconq.devices asks "
                         f"for {cfg.devices} workers of one {unit} each.")
    job = ray.put({"module": module, "data": data, "cfg": cfg, "callbacks": _portable(callbacks),
                   "val_check_interval": val_check_interval})
    inbox = ray.remote(num_cpus=0)(_Inbox).remote()
    try:
        with tempfile.TemporaryDirectory(prefix="sloctl-ray-") as storage:
            # Ray Train's run state; a cluster elsewhere keeps it in its own default folder
            trainer = TorchTrainer(
                _worker, train_loop_config={"job": job, "inbox": inbox},
                scaling_config=ScalingConfig(num_workers=cfg.devices, use_gpu=cfg.accelerator == "gpu"),
                run_config=RunConfig(name=f"sloctl-iconq-{uuid.uuid4().hex[:12]}",  # never a run to resume
                                     storage_path=storage if local else None))
            trainer.fit()
        out = ray.get(inbox.take.remote())
    finally:
        ray.kill(inbox)
    if out is None:
        raise RuntimeError("Ray Train finished without the first worker's result.")
    return out


def _worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: the seeded fit under Ray's DDP; the first hands its result to the inbox."""
    import lightning as L
    import ray
    import ray.train
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    from sloctl.training.pipeline import _quiet_lightning, fit_iconq_module

    job = ray.get(config["job"])
    cfg = job["cfg"]
    _quiet_lightning()
    L.seed_everything(cfg.seed, verbose=False)
    state, fit, best_val_loss = fit_iconq_module(
        job["module"], job["data"], cfg, job["callbacks"], val_check_interval=job["val_check_interval"],
        # a batch whose queries all lack after-neighbours leaves the after-LSTM out of the graph
        strategy=RayDDPStrategy(find_unused_parameters=True), plugins=[RayLightningEnvironment()], devices="auto",
        prepare=prepare_trainer)
    if ray.train.get_context().get_world_rank() == 0:
        ray.get(config["inbox"].put.remote(({k: v.cpu() for k, v in state.items()}, fit, best_val_loss)))
