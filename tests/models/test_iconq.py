"""Iconq+ (AutoSLO section 4): the network, the censored loss and incremental inference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sloctl.models.iconq import IconqConfig, IconqNet, IncrementalIconq, qerror_loss

D, S = 7, 5


def make_net(after_order="chronological", seed=0):
    torch.manual_seed(seed)
    cfg = IconqConfig(pair_dim=D, self_dim=S, embed_dim=8, hidden_dim=6, head_dim=10, after_order=after_order)
    return IconqNet(cfg).double().eval()


def pad(seqs, dim=D):
    """Stack a list of (T_i, dim) tensors into (B, T, dim) padded at the end, plus lengths."""
    T = max((s.shape[0] for s in seqs), default=0)
    out = torch.zeros(len(seqs), T, dim, dtype=torch.float64)
    for b, s in enumerate(seqs):
        out[b, : s.shape[0]] = s
    return out, torch.tensor([s.shape[0] for s in seqs], dtype=torch.long)


def test_censored_loss_is_zero_above_lower_bound_and_positive_below():
    label = torch.tensor([1.0, 1.0])
    censored = torch.tensor([True, True])
    assert qerror_loss(torch.tensor([1.5, 1.0]), label, censored).item() == 0.0
    assert qerror_loss(torch.tensor([0.5, 0.25]), label, censored).item() == pytest.approx((0.5 + 0.75) / 2)


def test_uncensored_loss_is_symmetric_absolute_log_error():
    label = torch.tensor([2.0, 2.0])
    censored = torch.tensor([0, 0])
    assert qerror_loss(torch.tensor([2.5, 1.5]), label, censored).item() == pytest.approx(0.5)
    # mixed batch: the censored row above its bound costs nothing
    mixed = qerror_loss(torch.tensor([3.0, 3.0]), label, torch.tensor([False, True]))
    assert mixed.item() == pytest.approx(0.5)


def test_loss_weights_give_a_weighted_mean():
    pred, label, censored = torch.tensor([1.0, 4.0]), torch.zeros(2), torch.zeros(2, dtype=torch.bool)
    assert qerror_loss(pred, label, censored, weight=torch.tensor([3.0, 1.0])).item() == pytest.approx(7 / 4)


def test_loss_has_gradient_only_below_a_censored_bound():
    pred = torch.tensor([0.0, 2.0], requires_grad=True)
    qerror_loss(pred, torch.ones(2), torch.tensor([True, True])).backward()
    assert pred.grad.tolist() == [-0.5, 0.0]


@pytest.mark.parametrize(
    ("field", "value"),
    [("pair_dim", 0), ("self_dim", 2.0), ("hidden_dim", True), ("dropout", 1.0), ("after_order", "backward")],
)
def test_config_rejects_out_of_range_values(field, value):
    kwargs = {"pair_dim": D, "self_dim": S, field: value}
    with pytest.raises(ValueError, match=f"'{field}' parameter of IconqConfig"):
        IconqNet(IconqConfig(**kwargs))


def test_incremental_equals_full_recomputation():
    net = make_net(seed=1)
    gen = torch.Generator().manual_seed(7)
    rng = np.random.default_rng(7)
    n = 12
    arrivals = np.cumsum(rng.exponential(1.0, n))
    ends = arrivals + rng.exponential(3.0, n)
    self_x = torch.randn(n, S, generator=gen, dtype=torch.float64)
    base_log = torch.randn(n, generator=gen, dtype=torch.float64)
    pair = torch.randn(n, n, D, generator=gen, dtype=torch.float64)  # pair[q, m]: interaction of (q, m)

    inc = IncrementalIconq(net)
    running: list[int] = []
    before: dict[int, list[int]] = {}
    after: dict[int, list[int]] = {}
    max_err, checked = 0.0, 0
    for q in range(n):
        for m in [m for m in running if ends[m] <= arrivals[q]]:
            running.remove(m)
            inc.remove(m)
        before[q], after[q] = list(running), []
        before_x = pair[q, running] if running else torch.zeros(0, D, dtype=torch.float64)
        first_s = inc.add_query(q, self_x[q], before_x, float(base_log[q]))
        if running:
            inc.add_neighbour(running, pair[running, q])
            for m in running:
                after[m].append(q)
        running.append(q)

        # full recomputation for every running query, padded to different lengths
        bx, bl = pad([pair[m, before[m]] for m in running])
        ax, al = pad([pair[m, after[m]] for m in running])
        full = net(self_x[running], bx, bl, ax, al, base_log[running])
        inc_log = torch.from_numpy(np.log(inc.raw_predict(running)))
        max_err = max(max_err, (full - inc_log).abs().max().item())
        assert math.log(first_s) == pytest.approx(full[-1].item(), abs=1e-9)
        checked += len(running)
    assert max_err <= 1e-5
    assert checked > n  # the arrival pattern really produced concurrency
    assert max(len(a) for a in after.values()) >= 2
    assert len(inc) == len(running) and all(q in inc for q in running) and 0 not in inc


def test_reverse_order_changes_the_after_pass_and_flips_only_valid_steps():
    chrono = make_net("chronological", seed=2)
    reverse = make_net("reverse", seed=99)
    reverse.load_state_dict(chrono.state_dict())
    g = torch.Generator().manual_seed(3)
    B, T = 3, 4
    self_x = torch.randn(B, S, generator=g, dtype=torch.float64)
    before_x = torch.randn(B, 2, D, generator=g, dtype=torch.float64)
    before_len = torch.tensor([2, 1, 0])
    after_x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    after_len = torch.tensor([3, 4, 2])
    base = torch.zeros(B, dtype=torch.float64)

    out_c = chrono(self_x, before_x, before_len, after_x, after_len, base)
    out_r = reverse(self_x, before_x, before_len, after_x, after_len, base)
    assert (out_c - out_r).abs().min().item() > 1e-6

    flipped = after_x.clone()
    for b, n in enumerate(after_len.tolist()):
        flipped[b, :n] = after_x[b, :n].flip(0)
    torch.testing.assert_close(
        reverse(self_x, before_x, before_len, after_x, after_len, base),
        chrono(self_x, before_x, before_len, flipped, after_len, base),
    )


def test_incremental_inference_refuses_a_reverse_net():
    with pytest.raises(ValueError, match="chronological"):
        IncrementalIconq(make_net("reverse"))


def test_empty_sequences_equal_the_zero_state_result():
    net = make_net(seed=4)
    g = torch.Generator().manual_seed(4)
    B, H = 3, net.config.hidden_dim
    self_x = torch.randn(B, S, generator=g, dtype=torch.float64)
    base = torch.randn(B, generator=g, dtype=torch.float64)
    zeros = torch.zeros(B, H, dtype=torch.float64)
    expected = base + net.head(torch.cat([net.self_embed(self_x), zeros, zeros], dim=1)).squeeze(1)
    none = torch.zeros(B, dtype=torch.long)

    empty = torch.zeros(B, 0, D, dtype=torch.float64)
    torch.testing.assert_close(net(self_x, empty, none, empty, none, base), expected)
    garbage = torch.randn(B, 3, D, generator=g, dtype=torch.float64) * 100
    torch.testing.assert_close(net(self_x, garbage, none, garbage, none, base), expected)

    inc = IncrementalIconq(net)
    got = [inc.add_query(b, self_x[b], torch.zeros(0, D, dtype=torch.float64), float(base[b])) for b in range(B)]
    np.testing.assert_allclose(np.log(got), expected.detach().numpy(), atol=1e-12)
    # but a non-empty sequence does matter
    one = torch.ones(B, dtype=torch.long)
    assert (net(self_x, garbage, one, empty, none, base) - expected).abs().min().item() > 1e-6


def test_padding_beyond_length_does_not_change_the_output():
    for order in ("chronological", "reverse"):
        net = make_net(order, seed=5)
        g = torch.Generator().manual_seed(5)
        B = 4
        self_x = torch.randn(B, S, generator=g, dtype=torch.float64)
        base = torch.randn(B, generator=g, dtype=torch.float64)
        bx = torch.randn(B, 3, D, generator=g, dtype=torch.float64)
        ax = torch.randn(B, 2, D, generator=g, dtype=torch.float64)
        bl, al = torch.tensor([3, 0, 1, 2]), torch.tensor([1, 2, 0, 2])
        ref = net(self_x, bx, bl, ax, al, base)
        junk = 1e3 * torch.randn(B, 5, D, generator=g, dtype=torch.float64)
        out = net(self_x, torch.cat([bx, junk], 1), bl, torch.cat([ax, -junk], 1), al, base)
        torch.testing.assert_close(out, ref)


def test_lengths_outside_the_padded_range_are_rejected():
    net = make_net()
    x = torch.zeros(1, 2, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="lengths"):
        net(torch.zeros(1, S, dtype=torch.float64), x, torch.tensor([3]), x, torch.tensor([0]), torch.zeros(1))


def test_guard_never_decreases_and_respects_elapsed_time():
    net = make_net(seed=6)
    inc = IncrementalIconq(net)
    g = torch.Generator().manual_seed(6)
    first = inc.add_query("a", torch.randn(S, generator=g, dtype=torch.float64), torch.zeros(0, D), 0.0)
    with torch.no_grad():
        net.head[-1].bias -= 3.0  # every raw prediction now drops by a factor e^3
    raw = inc.raw_predict(["a"])[0]
    assert raw == pytest.approx(first * math.exp(-3.0))

    assert inc.predict(["a"])[0] == pytest.approx(first)
    stepped = inc.add_neighbour(["a"], torch.randn(1, D, generator=g, dtype=torch.float64))
    assert stepped[0] == pytest.approx(first) and inc.raw_predict(["a"])[0] < first

    late = 5.0 * first
    assert inc.predict(["a"], elapsed_s=[late])[0] == pytest.approx(late)
    assert inc.predict(["a"])[0] == pytest.approx(late)  # the guard remembers the elapsed floor

    with torch.no_grad():
        net.head[-1].bias += 10.0  # a raw rise above the guard passes through
    assert inc.predict(["a"])[0] == pytest.approx(inc.raw_predict(["a"])[0]) and inc.predict(["a"])[0] > late


def test_removed_slots_are_reused_without_leaking_state():
    net = make_net(seed=8)
    inc = IncrementalIconq(net)
    x = torch.ones(S, dtype=torch.float64)
    empty = torch.zeros(0, D, dtype=torch.float64)
    fresh = inc.add_query("a", x, empty, 0.0)
    inc.add_neighbour(["a"], torch.ones(1, D, dtype=torch.float64))
    inc.remove("a")
    assert "a" not in inc and len(inc) == 0
    assert inc.add_query("b", x, empty, 0.0) == pytest.approx(fresh)
    with pytest.raises(KeyError):
        inc.add_neighbour(["a"], torch.ones(1, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="already running"):
        inc.add_query("b", x, empty, 0.0)
    with pytest.raises(ValueError, match="distinct"):
        inc.add_neighbour(["b", "b"], torch.ones(2, D, dtype=torch.float64))


def test_peeks_match_what_committing_would_predict_and_change_nothing():
    torch.manual_seed(3)
    net = IconqNet(IconqConfig(pair_dim=7, self_dim=5, embed_dim=8, hidden_dim=6, head_dim=8)).double().eval()
    inc = IncrementalIconq(net)
    gen = torch.Generator().manual_seed(1)
    for key in range(3):
        inc.add_query(key, torch.randn(5, generator=gen, dtype=torch.float64),
                      torch.randn(key, 7, generator=gen, dtype=torch.float64), 0.1 * key)
    pairs = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    before = inc.raw_predict([0, 1, 2])
    peeked = inc.peek_neighbour([0, 1, 2], pairs)
    np.testing.assert_allclose(inc.raw_predict([0, 1, 2]), before)  # nothing changed
    np.testing.assert_allclose(inc.add_neighbour([0, 1, 2], pairs), peeked, rtol=1e-12)
    own = torch.randn(5, generator=gen, dtype=torch.float64)
    befores = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    expected = inc.peek_queries(own[None], befores[None], torch.tensor([3]), torch.tensor([0.2], dtype=torch.float64))
    assert expected[0] == pytest.approx(inc.add_query(9, own, befores, 0.2), rel=1e-12)
