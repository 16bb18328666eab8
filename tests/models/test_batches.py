"""Iconq+ batches from arrays: the same tensors as per-sample padding, batches of similar lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sloctl.datasets.interactions import (
    FeatureScaler,
    neighbour_index,
    pair_vectors,
    sample_table,
    self_vectors,
)
from sloctl.models.batches import BucketBatchSampler, IconqInputs, IconqSamples, collate_rows


@pytest.fixture(scope="module")
def inputs(sim_log):
    rng = np.random.default_rng(0)
    stage_s = rng.uniform(0.1, 2.0, len(sim_log))
    plan = FeatureScaler.fit(sim_log).transform(sim_log).astype(np.float32)
    size = sim_log["cluster_size"].to_numpy(float)
    return IconqInputs(self_vectors(plan, stage_s, size, True), plan, stage_s, sim_log["arrival_s"].to_numpy(float),
                       size, True, neighbour_index(sim_log))


def test_a_batch_is_the_per_sample_padding_of_the_same_samples(sim_log, inputs):
    table = sample_table(sim_log, np.arange(len(sim_log)), censored=True, seed=1, index=inputs.index)
    samples = IconqSamples(inputs, table)
    pick = [0, 5, 17, len(table) - 1, 40]
    batch = samples.__getitems__(pick)
    i = inputs.index
    items = []
    for k in pick:
        r, cut = int(table.row[k]), int(table.after_len[k])
        before = i.before[i.before_ptr[r]:i.before_ptr[r + 1]]
        after = i.after[i.after_ptr[r]:i.after_ptr[r] + cut]
        def vec(n, r=r):
            return pair_vectors(inputs.plan, inputs.stage_s, inputs.arrival_s, inputs.size, np.full(len(n), r), n,
                                True)

        items.append({"self_x": inputs.own[r], "before": vec(before), "after": vec(after),
                      "base_log": np.log(inputs.stage_s[r])})
    expected = collate_rows(items)
    for key in ("self_x", "before_x", "before_len", "after_x", "after_len", "base_log"):
        assert torch.allclose(batch[key].float(), expected[key].float()), key
    assert batch["label_log"].tolist() == pytest.approx(table.label_log[pick].tolist(), rel=1e-6)


def test_bucket_batches_cover_every_sample_once_per_epoch_and_reshuffle():
    lengths = np.random.default_rng(2).integers(0, 40, 1000)
    sampler = BucketBatchSampler(lengths, 32, seed=3, pool_batches=4)
    first = list(sampler)
    assert sorted(np.concatenate(first).tolist()) == list(range(1000)) and len(first) == len(sampler)
    assert list(sampler) == first  # same epoch, same batches
    sampler.sampler.set_epoch(1)  # where Lightning sets it
    assert list(sampler) != first
    # within a batch the lengths are close: far less spread than a random batch of the same size
    spread = np.mean([np.ptp(lengths[b]) for b in first])
    assert spread < 0.5 * np.ptp(lengths)


def test_evaluation_batches_follow_the_length_order_and_shards_are_disjoint():
    lengths = np.arange(100)[::-1]
    ordered = list(BucketBatchSampler(lengths, 10, shuffle=False))
    assert [lengths[b].max() for b in ordered] == sorted(lengths[b].max() for b in ordered)
    shards = [list(BucketBatchSampler(lengths, 10, seed=1, num_replicas=2, rank=r)) for r in (0, 1)]
    flat = [set(np.concatenate(s).tolist()) for s in shards]
    assert not flat[0] & flat[1] and len(shards[0]) == len(shards[1])
    with pytest.raises(ValueError, match="batch_size"):
        BucketBatchSampler(lengths, 0)
