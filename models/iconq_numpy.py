"""Incremental Iconq+ inference in NumPy: what a simulation's router asks thousands of times a day, without PyTorch.

:class:`NumpyIncrementalIconq` does the arithmetic of
:class:`~sloctl.models.iconq.IncrementalIconq` (AutoSLO §4.4) on the trained
network's weights, copied once into float32 arrays, with the same methods and
the same state. A router's question is a handful of products of 64-wide
matrices; in PyTorch each costs a module call, a dispatch and tensor
bookkeeping, which is most of the time a simulated day spends on it
(``benchmarks/bench_policy_tuner.py`` reports the ratio). The predictions equal
PyTorch's to float32 rounding (``tests/models/test_iconq_numpy.py``).

Long before-sequences (more than :attr:`NumpyIncrementalIconq.torch_from`
running neighbours) still run through PyTorch's LSTM, whose loop over steps is
compiled; short ones, the common case, loop here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from scipy.special import expit

from sloctl.models.iconq import IconqNet, NeighbourStep, QueryEmbedding, RunningSlots

# the per-slot state arrays (rows are slots), besides RunningSlots' guard
_STATE = ("_self_e", "_h_before", "_h", "_c", "_base_log")

__all__ = ["NumpyIncrementalIconq"]


class _Weights:
    """The network's inference weights as float32 arrays, laid out for ``x @ W``."""

    def __init__(self, net: IconqNet) -> None:
        def a(t: Any) -> np.ndarray:
            return np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32))

        self.net = net
        self.pair_w, self.pair_b = a(net.pair_embed[0].weight).T.copy(), a(net.pair_embed[0].bias)
        self.self_w, self.self_b = a(net.self_embed[0].weight).T.copy(), a(net.self_embed[0].bias)
        before = net.before_lstm
        self.before_wih = a(before.weight_ih_l0).T.copy()  # (E, 4H)
        self.before_whh = a(before.weight_hh_l0).T.copy()  # (H, 4H)
        self.before_b = a(before.bias_ih_l0 + before.bias_hh_l0)
        after = net.after_lstm
        self.after_w = np.concatenate([a(after.weight_ih_l0), a(after.weight_hh_l0)], axis=1).T.copy()  # (E+H, 4H)
        self.after_b = a(after.bias_ih_l0 + after.bias_hh_l0)
        self.head1_w, self.head1_b = a(net.head[0].weight).T.copy(), a(net.head[0].bias)
        self.head2_w, self.head2_b = a(net.head[3].weight).T.copy(), a(net.head[3].bias)
        self.E, self.H = net.config.embed_dim, net.config.hidden_dim
        self.pair_dim, self.self_dim = net.config.pair_dim, net.config.self_dim


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=x)


def _cell(gates: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One LSTM cell from its pre-activations (gates in PyTorch's order i, f, g, o)."""
    H = c.shape[1]
    i, f, o = expit(gates[:, :H]), expit(gates[:, H:2 * H]), expit(gates[:, 3 * H:])
    c = f * c + i * np.tanh(gates[:, 2 * H:3 * H])
    return o * np.tanh(c), c


class NumpyIncrementalIconq(RunningSlots):
    """:class:`~sloctl.models.iconq.IncrementalIconq` in NumPy (same methods, same state, same guard).

    Inputs may be NumPy arrays or tensors; :class:`NeighbourStep` and
    :class:`QueryEmbedding` carry NumPy arrays.

    Args:
        net: a chronological :class:`~sloctl.models.iconq.IconqNet` (switched to eval mode).
    """

    torch_from: int = 24  # before-sequences longer than this run through PyTorch's LSTM

    def __init__(self, net: IconqNet) -> None:
        if net.config.after_order != "chronological":
            raise ValueError(
                "The 'after_order' parameter of IconqConfig must be 'chronological' for incremental inference, "
                f"got {net.config.after_order!r}.")
        net.eval()
        self.w = _Weights(net)
        E, H = self.w.E, self.w.H
        self._init_slots()
        self._self_e = np.zeros((0, E), np.float32)
        self._h_before = np.zeros((0, H), np.float32)
        self._h = np.zeros((0, H), np.float32)
        self._c = np.zeros((0, H), np.float32)
        self._base_log = np.zeros(0, np.float32)

    @property
    def net(self) -> IconqNet:
        return self.w.net

    def fork(self) -> NumpyIncrementalIconq:
        """An independent copy of every running query's state, sharing the weights."""
        twin = NumpyIncrementalIconq.__new__(NumpyIncrementalIconq)
        twin.w = self.w
        self._copy_slots(twin)
        for name in _STATE:
            setattr(twin, name, getattr(self, name).copy())
        return twin

    # -- the network's pieces ----------------------------------------------------------------------------------
    def _pair_embed(self, x: np.ndarray) -> np.ndarray:
        return _relu(x @ self.w.pair_w + self.w.pair_b)

    def _head_log(self, self_e: np.ndarray, h_before: np.ndarray, h_after: np.ndarray, base_log: np.ndarray
                  ) -> np.ndarray:
        z = np.concatenate([self_e, h_before, h_after], axis=1)
        return base_log + (_relu(z @ self.w.head1_w + self.w.head1_b) @ self.w.head2_w + self.w.head2_b)[:, 0]

    def _summarize_before(self, x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The before-LSTM's hidden state after each row's last valid step; zeros for empty rows."""
        B, T, _ = x.shape
        H = self.w.H
        out = np.zeros((B, H), np.float32)
        top = int(lengths.max()) if B else 0
        if top == 0:
            return out
        if top > self.torch_from:
            return self._summarize_with_torch(x, lengths)
        xw = self._pair_embed(x[:, :top].reshape(B * top, -1)).reshape(B, top, -1) @ self.w.before_wih \
            + self.w.before_b  # (B, top, 4H)
        h = np.zeros((B, H), np.float32)
        c = np.zeros((B, H), np.float32)
        for t in range(top):
            h, c = _cell(xw[:, t] + h @ self.w.before_whh, c)
            ends = lengths == t + 1
            if ends.any():
                out[ends] = h[ends]
        return out

    def _summarize_with_torch(self, x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        import torch

        net = self.w.net
        with torch.no_grad():
            h = net.summarize(net.before_lstm, torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                              torch.from_numpy(np.asarray(lengths, dtype=np.int64)))
        return h.numpy()

    # -- slots and the guard (RunningSlots) -------------------------------------------------------------------
    def _grow(self, rows: int) -> None:
        for name in _STATE:
            old = getattr(self, name)
            setattr(self, name, np.concatenate([old, np.zeros((rows, *old.shape[1:]), old.dtype)]))

    def _raw_s(self, slots: list[int]) -> np.ndarray:
        raw_log = self._head_log(self._self_e[slots], self._h_before[slots], self._h[slots], self._base_log[slots])
        return np.exp(raw_log.astype(np.float64))

    # -- IncrementalIconq's methods ----------------------------------------------------------------------------
    def add_query(self, key: Hashable, self_x: Any, before_x: Any, base_log: float) -> float:
        """Start tracking a query that has just arrived (see :meth:`IncrementalIconq.add_query`)."""
        if key in self._slot:
            raise ValueError(f"Query {key!r} is already running.")
        self_x, before_x = _array(self_x), _array(before_x)
        if self_x.shape != (self.w.self_dim,):
            raise ValueError(f"'self_x' must have shape ({self.w.self_dim},), got {tuple(self_x.shape)}.")
        if before_x.ndim != 2:
            raise ValueError(f"'before_x' must have shape (T, {self.w.pair_dim}), got {tuple(before_x.shape)}.")
        embedding = self.embed_queries(self_x[None], before_x[None], np.array([before_x.shape[0]]),
                                       np.array([base_log], np.float32))
        return self.add_embedded(key, embedding, 0)

    def _step(self, slots: list[int], pair_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = self._pair_embed(pair_x)
        gates = np.concatenate([x, self._h[slots]], axis=1) @ self.w.after_w + self.w.after_b
        return _cell(gates, self._c[slots])

    def _check_pairs(self, keys: list[Hashable], pair_x: np.ndarray) -> list[int]:
        if pair_x.shape != (len(keys), self.w.pair_dim):
            raise ValueError(f"'pair_x' must have shape ({len(keys)}, {self.w.pair_dim}), got {tuple(pair_x.shape)}.")
        return self._slots(keys)

    def add_neighbour(self, keys: Sequence[Hashable], pair_x: Any) -> np.ndarray:
        """Account for a new arrival overlapping ``keys`` (see :meth:`IncrementalIconq.add_neighbour`)."""
        return self.apply_neighbour(self.step_neighbour(keys, pair_x), None)

    def step_neighbour(self, keys: Sequence[Hashable], pair_x: Any) -> NeighbourStep:
        """The after-LSTM step a newcomer would cause for ``keys``, computed but not stored."""
        keys = list(keys)
        pair_x = _array(pair_x)
        slots = self._check_pairs(keys, pair_x)
        if not slots:
            empty = np.zeros((0, self.w.H), np.float32)
            return NeighbourStep(keys, [], empty, empty, np.zeros(0))
        h, c = self._step(slots, pair_x)
        raw_log = self._head_log(self._self_e[slots], self._h_before[slots], h, self._base_log[slots])
        return NeighbourStep(keys, slots, h, c, np.exp(raw_log.astype(np.float64)))

    def peek_neighbour(self, keys: Sequence[Hashable], pair_x: Any,
                       elapsed_s: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
        """What :meth:`add_neighbour` would predict (guarded), without changing any state."""
        return self.guard_step(self.step_neighbour(keys, pair_x), elapsed_s)

    def apply_neighbour(self, step: NeighbourStep, elapsed_s: Sequence[float] | np.ndarray | None = None
                        ) -> np.ndarray:
        """Store a step from :meth:`step_neighbour` (state unchanged since); returns the guarded predictions."""
        if not step.slots:
            return np.zeros(0)
        self._check_step(step)
        self._h[step.slots] = step.h
        self._c[step.slots] = step.c
        out = self.guard_step(step, elapsed_s)
        self._guard_s[step.slots] = out
        return out

    def embed_queries(self, self_x: Any, before_x: Any, before_len: Any, base_log: Any) -> QueryEmbedding:
        """Embeddings and raw predictions of hypothetical new queries, batched; no state changes."""
        self_x, before_x = _array(self_x), _array(before_x)
        lengths = np.asarray(_array(before_len, np.int64))
        base = _array(base_log)
        B, T = before_x.shape[0], before_x.shape[1]
        if lengths.shape != (B,) or (B and (int(lengths.min()) < 0 or int(lengths.max()) > T)):
            raise ValueError(f"Sequence lengths must have shape ({B},) and lie in [0, {T}], got {lengths.tolist()}.")
        self_e = _relu(self_x @ self.w.self_w + self.w.self_b)
        h_before = self._summarize_before(before_x, lengths)
        raw_log = self._head_log(self_e, h_before, np.zeros_like(h_before), base)
        return QueryEmbedding(self_e, h_before, base, np.exp(raw_log.astype(np.float64)))

    def peek_queries(self, self_x: Any, before_x: Any, before_len: Any, base_log: Any) -> np.ndarray:
        """Raw predicted latencies (seconds) of hypothetical new queries, batched; no state changes."""
        return self.embed_queries(self_x, before_x, before_len, base_log).raw_s

    def add_embedded(self, key: Hashable, embedding: QueryEmbedding, row: int) -> float:
        """Start tracking ``key`` from row ``row`` of :meth:`embed_queries`."""
        slot = self._claim(key)
        self._self_e[slot] = _array(embedding.self_e[row])
        self._h_before[slot] = _array(embedding.h_before[row])
        self._h[slot] = 0.0
        self._c[slot] = 0.0
        self._base_log[slot] = float(embedding.base_log[row])
        raw_s = float(embedding.raw_s[row])
        self._guard_s[slot] = raw_s
        return raw_s

    def raw_predict(self, keys: Sequence[Hashable]) -> np.ndarray:
        """Current unguarded predicted latencies of ``keys`` in seconds."""
        slots = self._slots(list(keys))
        return self._raw_s(slots) if slots else np.zeros(0)

    def predict(self, keys: Sequence[Hashable], elapsed_s: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
        """Guarded predicted latencies of ``keys`` in seconds; the result becomes the new guard."""
        slots = self._slots(list(keys))
        if not slots:
            return np.zeros(0)
        return self._guarded(slots, self._raw_s(slots), elapsed_s)


def _array(x: Any, dtype: Any = np.float32) -> np.ndarray:
    """A NumPy array of ``x`` (an array or a CPU tensor)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)
