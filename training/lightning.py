"""Lightning wrappers for Iconq+: the module, the data module, a pruning hook.

The pure network lives in :mod:`sloctl.models.iconq`; this file owns the
optimisation (Adam, ExponentialLR, gradient clipping through the Trainer)
and the data loaders built from a query log.
"""

from __future__ import annotations

import os
import time
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from torch.utils.data import DataLoader

from sloctl.models.batches import BucketBatchSampler, IconqSamples, identity
from sloctl.models.iconq import IconqConfig, IconqNet, qerror_loss
from sloctl.models.metrics import q_error_summary

__all__ = ["EpochReporter", "IconqDataModule", "IconqLightning", "OptunaPruning", "SampleRate", "TrainingProgress",
           "LineProgress"]


class IconqLightning(L.LightningModule):
    """Trains an :class:`IconqNet` with the (censored) log-space Q-error loss.

    Besides ``val_loss`` (the loss on every validation sample, censored ones
    as lower bounds), each validation epoch logs ``val_q_error_p90``: the p90
    Q-error on the uncensored samples, i.e. every ``ok`` validation query with
    all its neighbours, the rows and the measure the pipeline reports as
    ``val_q_error_p90`` and Optuna studies minimise, so that pruning compares
    trials on their objective.
    """

    def __init__(self, config: dict[str, Any], lr: float = 5e-3, weight_decay: float = 2e-5,
                 lr_gamma: float = 0.9) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = IconqNet(IconqConfig(**config))

    def setup(self, stage: str) -> None:
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and trainer.world_size > 1 and isinstance(trainer.accelerator, CPUAccelerator):
            # data-parallel processes on CPUs share the cores instead of each taking all of them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // trainer.world_size))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if "owner" in batch:  # samples sharing their queries' neighbour passes (IconqSamples(shared=True))
            return self.net.forward_shared(batch["self_x"], batch["before_x"], batch["before_len"], batch["after_x"],
                                           batch["after_len"], batch["base_log"], batch["owner"],
                                           batch["take_after"])
        return self.net(batch["self_x"], batch["before_x"], batch["before_len"], batch["after_x"],
                        batch["after_len"], batch["base_log"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = qerror_loss(self(batch), batch["label_log"], batch["censored"])
        self.log("train_loss", loss, batch_size=len(batch["label_log"]), prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._val_pairs: list[tuple[np.ndarray, np.ndarray]] = []

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        pred = self(batch)
        loss = qerror_loss(pred, batch["label_log"], batch["censored"])
        self.log("val_loss", loss, batch_size=len(pred), prog_bar=True)
        exact = ~batch["censored"].bool()
        self._val_pairs.append((pred[exact].double().cpu().numpy(), batch["label_log"][exact].double().cpu().numpy()))

    def on_validation_epoch_end(self) -> None:
        pairs = getattr(self, "_val_pairs", [])
        if pairs:
            pred = np.concatenate([p for p, _ in pairs])
            label = np.concatenate([y for _, y in pairs])
            if len(pred):
                self.log("val_q_error_p90", q_error_summary(np.exp(pred), np.exp(label))["p90"])

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=self.hparams.lr_gamma)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class IconqDataModule(L.LightningDataModule):
    """Loaders over prepared train / validation samples, in batches of similar neighbour counts.

    Args:
        train, val: the splits' samples.
        batch_size: training samples per batch (validation batches hold 4x).
        seed: the training batches' shuffle (epoch ``e`` uses ``seed + e``).
        workers: loader worker processes building batches beside training (0: in the training process).
        num_replicas, rank: data parallelism: each process trains on every ``num_replicas``-th batch.
    """

    def __init__(self, train: IconqSamples, val: IconqSamples, batch_size: int = 32, seed: int = 0,
                 workers: int = 0, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__()
        self.train = train
        self.val = val
        self.batch_size = batch_size
        self.seed = seed
        self.workers = workers
        self.num_replicas = num_replicas
        self.rank = rank

    def _loader(self, samples: IconqSamples, sampler: BucketBatchSampler) -> DataLoader:
        return DataLoader(samples, batch_sampler=sampler, collate_fn=identity, num_workers=self.workers,
                          persistent_workers=self.workers > 0)

    def _replicas(self) -> tuple[int, int]:
        """(processes, this one's rank): the trainer's under data parallelism, else the constructor's."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.world_size > 1:
            return trainer.world_size, trainer.global_rank
        return self.num_replicas, self.rank

    def train_dataloader(self) -> DataLoader:
        replicas, rank = self._replicas()
        sampler = BucketBatchSampler(self.train.lengths(), self.batch_size, shuffle=True, seed=self.seed,
                                     num_replicas=replicas, rank=rank, groups=self.train.groups())
        return self._loader(self.train, sampler)

    def val_dataloader(self) -> DataLoader:
        # every process validates on all of it: the metrics early stopping and checkpoints read agree everywhere
        sampler = BucketBatchSampler(self.val.lengths(), max(4 * self.batch_size, 256), shuffle=False,
                                     groups=self.val.groups())
        return self._loader(self.val, sampler)


class OptunaPruning(L.Callback):
    """Reports a validation metric to an Optuna trial each epoch; stops pruned trials.

    Kept for callers that must not raise inside ``fit``; studies use
    ``optuna_integration.PyTorchLightningPruningCallback`` on ``val_q_error_p90``.
    """

    def __init__(self, trial: Any, monitor: str = "val_q_error_p90") -> None:
        self.trial = trial
        self.monitor = monitor
        self.pruned = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            return
        self.trial.report(float(value), step=trainer.current_epoch)
        if self.trial.should_prune():
            self.pruned = True
            trainer.should_stop = True


class EpochReporter(L.Callback):
    """Calls ``fn(epoch, val_loss)`` after each validation (progress for long runs)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get("val_loss")
        if value is not None and not trainer.sanity_checking:
            self.fn(trainer.current_epoch, float(value))


class SampleRate(L.Callback):
    """Training samples per second over a fit (validation excluded), and the fit's wall time."""

    def __init__(self) -> None:
        self.samples = 0
        self.train_s = 0.0
        self.wall_s = 0.0
        self._fit = 0.0
        self._epoch: float | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit = time.perf_counter()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()
        self.wall_s = time.perf_counter() - self._fit
        # every data-parallel process trains as many samples; the spawning process gets these metrics back
        self.samples *= trainer.world_size
        from lightning.pytorch.callbacks import EarlyStopping

        stopped = max([c.stopped_epoch for c in trainer.callbacks if isinstance(c, EarlyStopping)], default=0)
        trainer.callback_metrics.update({name: torch.tensor(float(value)) for name, value in (
            ("fit_samples", self.samples), ("fit_train_s", self.train_s), ("fit_wall_s", self.wall_s),
            ("fit_epochs", trainer.current_epoch), ("fit_early_stopped", stopped > 0))})

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.samples += len(batch["label_log"])

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:  # a validation within the epoch: training goes on
            self._epoch = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()

    def _close(self) -> None:
        if self._epoch is not None:
            self.train_s += time.perf_counter() - self._epoch
            self._epoch = None

    def rate(self) -> float:
        """Samples per second of training so far (NaN before any)."""
        return self.samples / self.train_s if self.train_s > 0 else float("nan")


class TrainingProgress(L.Callback):
    """Reports each training batch as ``fn(epoch, samples done, samples this epoch, samples/s)``.

    The rate is over the epoch so far; a caller shows it as a bar with an ETA
    (:mod:`sloctl.core.progress`).
    """

    def __init__(self, fn: Any, samples_per_epoch: int) -> None:
        self.fn = fn
        self.total = int(samples_per_epoch)
        self.done = 0
        self._start = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.done, self._start = 0, time.perf_counter()
        self.fn(trainer.current_epoch, 0, self.total, float("nan"))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.done += len(batch["label_log"])
        elapsed = time.perf_counter() - self._start
        self.fn(trainer.current_epoch, self.done, self.total, self.done / elapsed if elapsed > 0 else float("nan"))


class LineProgress(L.Callback):
    """Progress lines on stderr from the first data-parallel process (picklable, so spawned processes take it).

    Every ``every_s`` seconds and at each validation: the epoch, samples done
    of the epoch's, samples per second over all processes and the epoch's ETA.
    """

    def __init__(self, samples_per_epoch: int, every_s: float = 10.0) -> None:
        self.total = int(samples_per_epoch)
        self.every_s = every_s
        self.done = 0
        self._start = self._last = 0.0

    def _line(self, trainer: L.Trainer, text: str) -> None:
        if trainer.global_rank == 0:
            import sys

            print(text, file=sys.stderr, flush=True)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.done, self._start = 0, time.perf_counter()
        self._last = self._start

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.done += len(batch["label_log"]) * trainer.world_size
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            rate = self.done / max(now - self._start, 1e-9)
            eta = max(self.total - self.done, 0) / rate if rate > 0 else float("nan")
            self._line(trainer, f"train iconq: epoch {trainer.current_epoch + 1}: {self.done}/{self.total} "
                                f"({100 * self.done / max(self.total, 1):.0f}%), {rate:,.0f} samples/s, "
                                f"ETA {eta:.0f} s ({trainer.world_size} processes)")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get("val_loss")
        if value is not None and not trainer.sanity_checking:
            self._line(trainer, f"epoch {trainer.current_epoch:3d}  val_loss {float(value):.4f}")
