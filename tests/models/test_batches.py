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


def test_shared_batches_predict_what_each_sample_alone_predicts(sim_log, inputs):
    """A query's full sample and its censored prefixes share one neighbour pass (arrival order, §4.3 prefixes):
    the shared forward equals the plain one sample by sample, and so do the gradients."""
    from sloctl.models.iconq import IconqConfig, IconqNet

    table = sample_table(sim_log, np.arange(len(sim_log)), censored=True, seed=1, index=inputs.index)
    plain, shared = IconqSamples(inputs, table), IconqSamples(inputs, table, shared=True)
    rows = table.row
    many = np.flatnonzero(np.isin(rows, rows[np.flatnonzero(~table.full)][:20]))  # queries with prefixes, all samples
    pick = np.r_[many, [0, 3]].tolist()
    torch.manual_seed(0)
    net = IconqNet(IconqConfig(pair_dim=inputs.pair_dim, self_dim=inputs.own.shape[1], embed_dim=16, hidden_dim=16,
                               head_dim=16, dropout=0.0, after_order="chronological"))
    a, b = plain.__getitems__(pick), shared.__getitems__(pick)
    assert len(b["self_x"]) < len(pick) == len(b["owner"])  # fewer queries than samples: passes shared
    out_a = net(a["self_x"], a["before_x"], a["before_len"], a["after_x"], a["after_len"], a["base_log"])
    out_b = net.forward_shared(b["self_x"], b["before_x"], b["before_len"], b["after_x"], b["after_len"],
                               b["base_log"], b["owner"], b["take_after"])
    torch.testing.assert_close(out_b, out_a, rtol=1e-5, atol=1e-5)
    grads = []
    for out in (out_a, out_b):
        net.zero_grad()
        out.sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in net.parameters()])
    for ga, gb in zip(*grads, strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-5)
    reverse = IconqNet(IconqConfig(pair_dim=inputs.pair_dim, self_dim=inputs.own.shape[1], after_order="reverse"))
    with pytest.raises(ValueError, match="chronological"):
        reverse.forward_shared(b["self_x"], b["before_x"], b["before_len"], b["after_x"], b["after_len"],
                               b["base_log"], b["owner"], b["take_after"])


def test_grouped_batches_keep_a_query_s_samples_together_and_cover_each_once():
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(400), rng.integers(1, 4, 400))
    lengths = rng.integers(0, 30, len(groups))
    sampler = BucketBatchSampler(lengths, 32, seed=1, pool_batches=4, groups=groups)
    batches = list(sampler)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(groups))) and len(batches) == len(sampler)
    owner = {}
    for k, b in enumerate(batches):
        for g in set(groups[b].tolist()):
            assert owner.setdefault(g, k) == k  # every sample of a query in one batch
    assert max(len(b) for b in batches) <= 32 + 2  # closed at the group that reaches 32
    pools = -(-400 // (round(32 / (len(groups) / 400)) * 4))
    assert sum(len(b) < 32 for b in batches) <= pools  # only each pool's last batch is short
    sampler.sampler.set_epoch(1)
    assert list(sampler) != batches
    ordered = list(BucketBatchSampler(lengths, 32, shuffle=False, groups=groups))
    assert sorted(np.concatenate(ordered).tolist()) == list(range(len(groups)))
