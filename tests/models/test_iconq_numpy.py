"""Incremental Iconq+ in NumPy gives PyTorch's predictions (AutoSLO §4.4), state for state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sloctl.models.iconq import IconqConfig, IconqNet, IncrementalIconq
from sloctl.models.iconq_numpy import NumpyIncrementalIconq

D, S = 7, 5


def make_net(seed: int = 0) -> IconqNet:
    torch.manual_seed(seed)
    return IconqNet(IconqConfig(pair_dim=D, self_dim=S, embed_dim=16, hidden_dim=12, head_dim=10)).eval()


def close(a, b) -> None:
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_day_of_arrivals_steps_and_departures_predicts_the_same(seed):
    """Random arrivals with before-sequences short and long (past the PyTorch hand-over), steps, forks, removals."""
    net = make_net(seed)
    rng = np.random.default_rng(seed)
    ref, fast = IncrementalIconq(net), NumpyIncrementalIconq(net)
    running: list[int] = []
    for key in range(60):
        if running and rng.random() < 0.3:  # a departure
            gone = running.pop(int(rng.integers(len(running))))
            ref.remove(gone)
            fast.remove(gone)
        if running:  # the newcomer steps every running query's after-LSTM, peeked first, then applied
            pairs = rng.normal(size=(len(running), D)).astype(np.float32)
            elapsed = rng.uniform(0, 2, len(running))
            step_ref, step_fast = ref.step_neighbour(running, torch.from_numpy(pairs)), fast.step_neighbour(running,
                                                                                                             pairs)
            close(ref.guard_step(step_ref, elapsed), fast.guard_step(step_fast, elapsed))
            close(ref.apply_neighbour(step_ref, elapsed), fast.apply_neighbour(step_fast, elapsed))
        n_before = int(rng.choice([0, 1, 3, 30]))  # 30 > torch_from: the long path
        before = rng.normal(size=(n_before, D)).astype(np.float32)
        own = rng.normal(size=S).astype(np.float32)
        base = float(rng.normal())
        close(ref.add_query(key, torch.from_numpy(own), torch.from_numpy(before), base),
              fast.add_query(key, own, before, base))
        running.append(key)
        close(ref.predict(running), fast.predict(running))
        if key == 30:  # forks are independent copies of the state
            ref_twin, fast_twin = ref.fork(), fast.fork()
            close(ref_twin.add_neighbour(running, torch.ones(len(running), D)),
                  fast_twin.add_neighbour(running, np.ones((len(running), D), np.float32)))
            close(ref.raw_predict(running), fast.raw_predict(running))  # the originals did not move
    assert NumpyIncrementalIconq.torch_from < 30


def test_batched_hypothetical_queries_match_padded_rows_of_any_length():
    net = make_net(4)
    rng = np.random.default_rng(4)
    lengths = np.array([0, 2, 5, 1, 40])
    before = rng.normal(size=(5, 40, D)).astype(np.float32)
    own, base = rng.normal(size=(5, S)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    ref = IncrementalIconq(net).embed_queries(torch.from_numpy(own), torch.from_numpy(before),
                                              torch.from_numpy(lengths), torch.from_numpy(base))
    fast = NumpyIncrementalIconq(net).embed_queries(own, before, lengths, base)
    close(ref.raw_s, fast.raw_s)
    close(ref.h_before.numpy(), fast.h_before)
    short = NumpyIncrementalIconq(net).embed_queries(own[:4], before[:4, :5], lengths[:4], base[:4])
    close(short.raw_s, fast.raw_s[:4])  # padding past a row's length changes nothing


def test_errors_name_what_is_wrong():
    fast = NumpyIncrementalIconq(make_net())
    fast.add_query("a", np.zeros(S), np.zeros((0, D)), 0.0)
    with pytest.raises(ValueError, match="already running"):
        fast.add_query("a", np.zeros(S), np.zeros((0, D)), 0.0)
    with pytest.raises(KeyError, match="not running"):
        fast.step_neighbour(["b"], np.zeros((1, D)))
    with pytest.raises(ValueError, match="'pair_x' must have shape"):
        fast.step_neighbour(["a"], np.zeros((1, D + 1)))
    with pytest.raises(ValueError, match="lengths"):
        fast.embed_queries(np.zeros((1, S)), np.zeros((1, 2, D)), np.array([3]), np.zeros(1))
    with pytest.raises(ValueError, match="chronological"):
        torch.manual_seed(0)
        NumpyIncrementalIconq(IconqNet(IconqConfig(pair_dim=D, self_dim=S, after_order="reverse")))


def test_online_predictor_answers_the_same_with_either_engine(trained_models, sim_log):
    """The router's questions on a trained model: counterfactuals, commits and completions, engine for engine."""
    from sloctl.datasets.querylog import template_table
    from sloctl.models.online import OnlinePredictor

    predictor, table = trained_models["iconq"].predictor, template_table(sim_log)
    templates = sorted(table["template"].unique())
    models = {e: OnlinePredictor(predictor, table, engine=e) for e in ("torch", "numpy")}
    rng = np.random.default_rng(0)
    t, running = 0.0, []
    for qid in range(80):
        t += float(rng.exponential(0.05))
        template = templates[int(rng.integers(len(templates)))]
        clusters = {"c1": 1, "c2": 2}
        answers = {e: m.counterfactuals(template, t, clusters, t) for e, m in models.items()}
        for cid in clusters:
            a, b = answers["torch"][cid], answers["numpy"][cid]
            close(a.query_s, b.query_s)
            close(a.running_after_s, b.running_after_s)
        cid = "c1" if qid % 3 else "c2"
        close(*[m.commit(qid, template, t, 1.0, cid, clusters[cid], t) for m in models.values()])
        running.append(qid)
        if len(running) > 6:
            done = running.pop(int(rng.integers(len(running))))
            for m in models.values():
                m.complete(done)
    with pytest.raises(ValueError, match="'engine'"):
        OnlinePredictor(predictor, table, engine="jax")
