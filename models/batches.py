"""Batches for Iconq+ training and batched inference, built from arrays.

A log's per-row arrays (plan features, Stage estimates, arrivals, sizes) and
its :class:`~sloctl.datasets.interactions.NeighbourIndex` are kept once
(:class:`IconqInputs`); a batch gathers its queries' neighbour ranges and
computes every interaction vector of the batch in one vectorised call, then
scatters them into the padded ``(B, T, D)`` tensors :class:`IconqNet` reads.
Nothing is kept per sample besides five numbers (the
:class:`~sloctl.datasets.interactions.SampleTable`), so a log of millions of
rows fits in memory, and :class:`BucketBatchSampler` groups samples of
similar neighbour counts so that little of a batch is padding.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from sloctl.datasets.interactions import NeighbourIndex, SampleTable, pair_dim, pair_vectors

__all__ = ["BucketBatchSampler", "IconqInputs", "IconqSamples", "collate_rows", "identity", "predict_samples"]


def _pad(seqs: list[np.ndarray], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    out = torch.zeros(len(seqs), int(lengths.max()) if len(seqs) else 0, width)  # (B, T, D)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, : len(s)] = torch.from_numpy(np.asarray(s, dtype=np.float32))
    return out, lengths


def collate_rows(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad per-query items (``self_x``, ``before``, ``after``, ``base_log``) into a batch (small ad-hoc batches)."""
    width = items[0]["before"].shape[1]
    before_x, before_len = _pad([it["before"] for it in items], width)
    after_x, after_len = _pad([it["after"] for it in items], width)
    return {
        "self_x": torch.from_numpy(np.stack([it["self_x"] for it in items]).astype(np.float32)),
        "before_x": before_x, "before_len": before_len,
        "after_x": after_x, "after_len": after_len,
        "base_log": torch.tensor([float(it["base_log"]) for it in items], dtype=torch.float32),
    }


@dataclass
class IconqInputs:
    """What Iconq+ reads of a log, as arrays, and the batches built from them.

    Attributes:
        own: per-row self vectors (N, S), float32.
        plan: standardised plan features (N, P).
        stage_s: Stage (isolated) estimates in seconds (N,).
        arrival_s, size: per-row arrivals and cluster sizes (N,).
        size_features: interaction vectors carry the size features.
        index: the log's neighbours.
    """

    own: np.ndarray
    plan: np.ndarray
    stage_s: np.ndarray
    arrival_s: np.ndarray
    size: np.ndarray
    size_features: bool
    index: NeighbourIndex

    @property
    def pair_dim(self) -> int:
        return pair_dim(self.size_features)

    def _sequences(self, rows: np.ndarray, ptr: np.ndarray, flat: np.ndarray, lengths: np.ndarray
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded interaction vectors of ``rows`` with the first ``lengths`` neighbours of ``flat[ptr[r]:]``."""
        B = len(rows)
        total = int(lengths.sum())
        if total == 0:
            return torch.zeros(B, 0, self.pair_dim), torch.from_numpy(lengths.astype(np.int64))
        owner = np.repeat(np.arange(B), lengths)
        pos = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        neighbours = flat[np.repeat(ptr[rows], lengths) + pos]
        vectors = pair_vectors(self.plan, self.stage_s, self.arrival_s, self.size, rows[owner], neighbours,
                               self.size_features)
        out = torch.zeros(B, int(lengths.max()), vectors.shape[1])
        out[torch.from_numpy(owner), torch.from_numpy(pos)] = torch.from_numpy(vectors)
        return out, torch.from_numpy(lengths.astype(np.int64))

    def batch(self, rows: np.ndarray, after_len: np.ndarray | None = None,
              before_len: np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """The network's inputs for ``rows``: every before-neighbour, and the first ``after_len`` after-ones.

        ``after_len`` / ``before_len`` default to every neighbour; pass zeros
        to leave a side out (e.g. neighbours known at arrival only).
        """
        rows = np.asarray(rows, dtype=np.int64)
        index = self.index
        b_len = index.before_len()[rows] if before_len is None else np.asarray(before_len, np.int64)
        a_len = index.after_len()[rows] if after_len is None else np.asarray(after_len, np.int64)
        before_x, before_n = self._sequences(rows, index.before_ptr, index.before, b_len)
        after_x, after_n = self._sequences(rows, index.after_ptr, index.after, a_len)
        return {"self_x": torch.from_numpy(np.ascontiguousarray(self.own[rows], dtype=np.float32)),
                "before_x": before_x, "before_len": before_n, "after_x": after_x, "after_len": after_n,
                "base_log": torch.from_numpy(np.log(self.stage_s[rows]).astype(np.float32))}


class IconqSamples(Dataset):
    """A split's samples over :class:`IconqInputs`: ``dataset[i]`` is ``i``, a list of indices is a batch.

    PyTorch's ``DataLoader`` fetches a batch sampler's indices at once through
    ``__getitems__``, so building a batch is a handful of array operations
    (in loader workers when there are some), never a Python step per sample.

    With ``shared``, a batch holds each of its queries once (all its
    before-neighbours, the most after-neighbours its samples keep) and maps
    samples to them (``owner``, ``take_after``), for
    :meth:`~sloctl.models.iconq.IconqNet.forward_shared`: a query's full
    sample and its censored prefixes then cost one neighbour pass (batch them
    together: :meth:`groups` for :class:`BucketBatchSampler`).
    """

    def __init__(self, inputs: IconqInputs, table: SampleTable, *, shared: bool = False) -> None:
        self.inputs = inputs
        self.table = table
        self.shared = shared

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> int:
        return int(index)

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        t = self.table
        if self.shared:
            queries, owner = np.unique(t.row[idx], return_inverse=True)
            take = t.after_len[idx].astype(np.int64)
            longest = np.zeros(len(queries), np.int64)
            np.maximum.at(longest, owner, take)
            batch = self.inputs.batch(queries, after_len=longest)
            batch["owner"] = torch.from_numpy(owner.astype(np.int64))
            batch["take_after"] = torch.from_numpy(take)
        else:
            batch = self.inputs.batch(t.row[idx], after_len=t.after_len[idx])
        batch["label_log"] = torch.from_numpy(t.label_log[idx].astype(np.float32))
        batch["censored"] = torch.from_numpy(t.censored[idx])
        batch["full"] = torch.from_numpy(t.full[idx])
        return batch

    def lengths(self) -> np.ndarray:
        """Each sample's steps: before-neighbours plus the after-neighbours it keeps."""
        return self.inputs.index.before_len()[self.table.row] + self.table.after_len

    def groups(self) -> np.ndarray | None:
        """With ``shared``, each sample's query (row): the samples a batch should hold together; else ``None``."""
        return self.table.row if self.shared else None


def identity(batch: Any) -> Any:
    """The collate function of a loader whose dataset builds whole batches."""
    return batch


class _Epoch:
    """Holds the epoch a :class:`BucketBatchSampler` shuffles for (Lightning calls ``set_epoch`` here)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of samples with similar neighbour counts, seeded and reshuffled per epoch.

    With ``shuffle``, each epoch permutes the samples, cuts them into pools of
    ``pool_batches`` batches, sorts each pool by length, cuts it into batches
    and shuffles the batches; without, batches follow the length order (for
    evaluation). ``num_replicas``/``rank`` give each data-parallel process
    every ``num_replicas``-th batch (all processes see the same number).

    Args:
        lengths: steps per sample (:meth:`IconqSamples.lengths`).
        batch_size: samples per batch.
        shuffle: random pools (training) or the length order (evaluation).
        seed: the permutation's seed (epoch ``e`` uses ``seed + e``).
        pool_batches: batches per sorted pool (larger: less padding, less randomness).
        groups: per sample, a group (its query) whose samples always share a
            batch: groups are shuffled and sorted by their longest sample, and
            a batch closes at the first group that brings it to ``batch_size``
            samples (so it may hold a few more).
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 pool_batches: int = 50, num_replicas: int = 1, rank: int = 0,
                 groups: np.ndarray | None = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"The 'batch_size' parameter of BucketBatchSampler must be an int >= 1, "
                             f"got {batch_size!r}.")
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.pool_batches = pool_batches
        self.num_replicas = num_replicas
        self.rank = rank
        self.sampler = _Epoch()  # Lightning sets the epoch on ``batch_sampler.sampler``
        self._cache: tuple[int, list[np.ndarray]] | None = None
        self._groups = None
        if groups is not None:
            groups = np.asarray(groups)
            if groups.shape != self.lengths.shape:
                raise ValueError(f"The 'groups' parameter of BucketBatchSampler must have one entry per sample "
                                 f"({len(self.lengths)}), got {groups.shape}.")
            order = np.argsort(groups, kind="stable")
            starts = np.flatnonzero(np.r_[True, groups[order][1:] != groups[order][:-1]])
            self._groups = (order, starts, np.maximum.reduceat(self.lengths[order], starts) if len(order) else
                            np.empty(0, self.lengths.dtype))

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def _grouped(self) -> list[np.ndarray]:
        """Batches of whole groups (see ``groups``), in the same pools-of-similar-lengths scheme."""
        order, starts, longest = self._groups
        ends = np.r_[starts[1:], len(order)]
        sizes = ends - starts
        k = len(starts)
        if self.shuffle:
            rng = np.random.default_rng(self.seed + self.sampler.epoch)
            perm = rng.permutation(k)
        else:
            rng, perm = None, np.argsort(longest, kind="stable")
        per_batch = max(1, int(round(self.batch_size / max(sizes.mean(), 1.0)))) if k else 1
        pool = per_batch * self.pool_batches if self.shuffle else max(k, 1)
        batches: list[np.ndarray] = []
        for i in range(0, k, pool):
            chunk = perm[i:i + pool]
            chunk = chunk[np.argsort(longest[chunk], kind="stable")]
            total = np.cumsum(sizes[chunk])
            # close a batch at the first group that brings it to batch_size samples
            cut, first = [], 0
            while first < len(chunk):
                base = total[first - 1] if first else 0
                last = int(np.searchsorted(total, base + self.batch_size, side="left"))
                cut.append((first, min(last, len(chunk) - 1) + 1))
                first = cut[-1][1]
            for a, b in cut:
                picked = chunk[a:b]
                batches.append(np.concatenate([order[starts[g]:ends[g]] for g in picked]))
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _batches(self) -> list[np.ndarray]:
        if self._groups is not None:
            if self._cache is None or self._cache[0] != self.sampler.epoch:
                self._cache = (self.sampler.epoch, self._grouped())
            return self._cache[1]
        n = len(self.lengths)
        if not self.shuffle:
            order = np.argsort(self.lengths, kind="stable")
            return [order[i:i + self.batch_size] for i in range(0, n, self.batch_size)]
        rng = np.random.default_rng(self.seed + self.sampler.epoch)
        perm = rng.permutation(n)
        pool = self.batch_size * self.pool_batches
        batches = []
        for i in range(0, n, pool):
            chunk = perm[i:i + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches.extend(chunk[j:j + self.batch_size] for j in range(0, len(chunk), self.batch_size))
        return [batches[i] for i in rng.permutation(len(batches))]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches()
        for b in batches[self.rank::self.num_replicas][:len(batches) // self.num_replicas]:
            yield b.tolist()

    def __len__(self) -> int:
        if self._groups is not None:
            return len(self._batches()) // self.num_replicas
        n = len(self.lengths)
        pool = self.batch_size * self.pool_batches if self.shuffle else max(n, 1)  # evaluation: one sorted pool
        full, rest = divmod(n, pool)
        n_batches = full * -(-pool // self.batch_size) + -(-rest // self.batch_size)
        return n_batches // self.num_replicas


def predict_samples(net: Any, samples: IconqSamples, batch_size: int = 1024) -> np.ndarray:
    """Log-latency predictions of an :class:`~sloctl.models.iconq.IconqNet` for every sample, in their order.

    Batches follow the length order (little padding); no gradients.
    """
    net.eval()
    out = np.empty(len(samples))
    with torch.no_grad():
        for idx in BucketBatchSampler(samples.lengths(), batch_size, shuffle=False):
            batch = samples.__getitems__(idx)
            out[idx] = net(batch["self_x"], batch["before_x"], batch["before_len"], batch["after_x"],
                           batch["after_len"], batch["base_log"]).double().numpy()
    return out
