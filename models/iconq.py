"""Iconq+: a concurrency-aware latency model over interaction sequences (AutoSLO, section 4).

A query's latency is read from three things: its own features, an LSTM summary
of the neighbours that arrived before it, and an LSTM summary of those that
arrived after it while it was still running. Each step of either sequence is an
interaction vector for the pair (query, neighbour), built elsewhere (section
4.2). The network predicts a log-latency correction over the concurrency-unaware
Stage estimate, so an empty neighbourhood starts from that estimate.

The original Iconq feeds the after-neighbours newest first, so each new arrival
forces the whole after pass to be re-run (section 4.4, Figure 2D). Iconq+ feeds
them oldest first, so a new arrival is one LSTM step from the cached state
(Figure 2F); :class:`IncrementalIconq` does exactly that for a set of running
queries. :func:`qerror_loss` trains on exact and censored labels (section 4.3).

All latencies inside the network are natural logs of seconds.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["IconqConfig", "IconqNet", "IncrementalIconq", "NeighbourStep", "QueryEmbedding", "RunningSlots",
           "qerror_loss"]

_AFTER_ORDERS = ("chronological", "reverse")


@dataclass(frozen=True)
class IconqConfig:
    """Sizes of an :class:`IconqNet`.

    Attributes:
        pair_dim: Width D of one interaction vector (query, neighbour).
        self_dim: Width S of a query's own feature vector.
        embed_dim: Width E of the embeddings fed to the LSTMs and the head.
        hidden_dim: Hidden width H of each of the two LSTMs.
        head_dim: Width of the head's hidden layer.
        dropout: Dropout rate after the pair embedding and in the head.
        after_order: Order in which the after-neighbours are ingested.
            ``"chronological"`` is Iconq+ and allows incremental inference;
            ``"reverse"`` is the original Iconq, newest neighbour first
            (section 4.4).
    """

    pair_dim: int
    self_dim: int
    embed_dim: int = 64
    hidden_dim: int = 64
    head_dim: int = 64
    dropout: float = 0.2
    after_order: Literal["chronological", "reverse"] = "chronological"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that is out of range."""
        for name in ("pair_dim", "self_dim", "embed_dim", "hidden_dim", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"The '{name}' parameter of IconqConfig must be an int > 0, got {value!r}.")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) or not 0 <= self.dropout < 1:
            raise ValueError(f"The 'dropout' parameter of IconqConfig must be in [0, 1), got {self.dropout!r}.")
        if self.after_order not in _AFTER_ORDERS:
            raise ValueError(
                f"The 'after_order' parameter of IconqConfig must be one of {_AFTER_ORDERS}, got {self.after_order!r}."
            )


def _reverse_valid(x: Tensor, lengths: Tensor) -> Tensor:
    """Reverse the first ``lengths[b]`` steps of each sequence, leaving the padding in place."""
    T = x.shape[1]
    t = torch.arange(T, device=x.device).unsqueeze(0)  # (1, T)
    n = lengths.unsqueeze(1)  # (B, 1)
    index = torch.where(t < n, n - 1 - t, t)  # (B, T)
    return torch.gather(x, 1, index.unsqueeze(-1).expand_as(x))


class IconqNet(nn.Module):
    """The Iconq+ network (section 4.1, with the after-order of section 4.4).

    Args:
        config: Sizes and the after-neighbour order; validated here.
    """

    def __init__(self, config: IconqConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        E, H = config.embed_dim, config.hidden_dim
        # One pair embedding for both passes: an interaction vector means the same thing before and after.
        self.pair_embed = nn.Sequential(nn.Linear(config.pair_dim, E), nn.ReLU(), nn.Dropout(config.dropout))
        self.before_lstm = nn.LSTM(E, H, batch_first=True)
        self.after_lstm = nn.LSTM(E, H, batch_first=True)
        self.self_embed = nn.Sequential(nn.Linear(config.self_dim, E), nn.ReLU())
        self.head = nn.Sequential(
            nn.Linear(E + 2 * H, config.head_dim),
            nn.ReLU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.head_dim, 1),
        )

    def summarize(self, lstm: nn.LSTM, x: Tensor, lengths: Tensor, reverse: bool = False) -> Tensor:
        """Hidden state of ``lstm`` after the last valid step of each padded sequence.

        Padding sits after the valid steps, so it cannot reach the output read at
        step ``len - 1``; that is why no packing is needed. Empty sequences give
        the zero initial state.

        Args:
            lstm: ``before_lstm`` or ``after_lstm``.
            x: Interaction vectors, shape (B, T, D); T may be 0.
            lengths: Valid steps per sequence, shape (B,), integers in [0, T].
            reverse: Ingest each valid part newest first (original Iconq after pass).

        Returns:
            Summaries of shape (B, H).
        """
        B, T, D = x.shape
        H = lstm.hidden_size
        if self.config.pair_dim != D:
            raise ValueError(f"Interaction vectors must have {self.config.pair_dim} features, got {D}.")
        lengths = lengths.to(device=x.device, dtype=torch.long)
        if lengths.shape != (B,):
            raise ValueError(f"Sequence lengths must have shape ({B},), got {tuple(lengths.shape)}.")
        if B and (int(lengths.min()) < 0 or int(lengths.max()) > T):
            raise ValueError(f"Sequence lengths must lie in [0, {T}], got {lengths.tolist()}.")
        if T == 0:
            return x.new_zeros(B, H)
        if reverse:
            x = _reverse_valid(x, lengths)
        out, _ = lstm(self.pair_embed(x))  # (B, T, H)
        last = (lengths - 1).clamp(min=0)  # (B,)
        h = out[torch.arange(B, device=x.device), last]  # (B, H)
        return torch.where((lengths > 0).unsqueeze(1), h, torch.zeros_like(h))

    def forward_shared(self, self_x: Tensor, before_x: Tensor, before_len: Tensor, after_x: Tensor,
                       after_len: Tensor, base_log: Tensor, owner: Tensor, take_after: Tensor) -> Tensor:
        """Predict log latencies of samples that share their queries' neighbour passes.

        The first six inputs describe ``U`` queries, each with all its
        before-neighbours and the most after-neighbours any of its samples
        keeps (as :meth:`forward` reads them); sample ``b`` is query
        ``owner[b]`` with its first ``take_after[b]`` after-neighbours. In
        arrival order a prefix's summary is the after-LSTM's state at step
        ``take_after - 1`` of the whole sequence, so the full sample of a
        query and its censored prefixes (section 4.3) cost one pass, not one
        each; the result equals :meth:`forward` on the samples one by one.
        Only for ``after_order == "chronological"`` (a reversed prefix is not
        a prefix of the reversed sequence).

        Args:
            owner: (B,) indices into the ``U`` queries.
            take_after: (B,) after-neighbours each sample keeps, in ``[0, after_len[owner]]``.

        Returns:
            Predicted log latency of each sample, (B,).
        """
        if self.config.after_order != "chronological":
            raise ValueError("forward_shared needs after_order 'chronological' (a reversed prefix is not a prefix "
                             f"of the reversed sequence), got {self.config.after_order!r}.")
        owner = owner.to(device=self_x.device, dtype=torch.long)
        take = take_after.to(device=self_x.device, dtype=torch.long)
        U, B = self_x.shape[0], owner.shape[0]
        if owner.shape != take.shape or (B and (int(owner.min()) < 0 or int(owner.max()) >= U)):
            raise ValueError(f"owner must index the {U} queries and match take_after's shape {tuple(take.shape)}.")
        after_len = after_len.to(device=self_x.device, dtype=torch.long)
        if B and (int(take.min()) < 0 or bool((take > after_len[owner]).any())):
            raise ValueError("take_after must lie in [0, after_len[owner]] for every sample.")
        self_e = self.self_embed(self_x)  # (U, E)
        h_before = self.summarize(self.before_lstm, before_x, before_len)  # (U, H)
        H = self.after_lstm.hidden_size
        if after_x.shape[1] == 0 or B == 0:
            h_after = self_e.new_zeros(B, H)
        else:
            if self.config.pair_dim != after_x.shape[2]:
                raise ValueError(f"Interaction vectors must have {self.config.pair_dim} features, "
                                 f"got {after_x.shape[2]}.")
            out, _ = self.after_lstm(self.pair_embed(after_x))  # (U, T, H)
            h = out[owner, (take - 1).clamp(min=0)]  # (B, H)
            h_after = torch.where((take > 0).unsqueeze(1), h, torch.zeros_like(h))
        return self.head_log(self_e[owner], h_before[owner], h_after, base_log.to(self_e.dtype)[owner])

    def head_log(self, self_e: Tensor, h_before: Tensor, h_after: Tensor, base_log: Tensor) -> Tensor:
        """Log latency from the self embedding (B, E) and the two summaries (B, H); returns (B,)."""
        z = torch.cat([self_e, h_before, h_after], dim=1)  # (B, E + 2H)
        return base_log + self.head(z).squeeze(1)  # (B,)

    def forward(
        self,
        self_x: Tensor,
        before_x: Tensor,
        before_len: Tensor,
        after_x: Tensor,
        after_len: Tensor,
        base_log: Tensor,
    ) -> Tensor:
        """Predict log latencies.

        Both sequences are padded at the end and hold their valid steps in
        arrival order; the after pass reverses them itself when
        ``after_order == "reverse"``.

        Args:
            self_x: The queries' own features, (B, S).
            before_x: Interactions with neighbours that arrived earlier, (B, Tb, D).
            before_len: Valid steps of ``before_x``, (B,) integers.
            after_x: Interactions with neighbours that arrived later, (B, Ta, D).
            after_len: Valid steps of ``after_x``, (B,) integers.
            base_log: Log of the concurrency-unaware (Stage) latency estimate, (B,).

        Returns:
            Predicted log latency in log-seconds, (B,): ``base_log`` plus a learned correction.
        """
        reverse = self.config.after_order == "reverse"
        self_e = self.self_embed(self_x)  # (B, E)
        h_before = self.summarize(self.before_lstm, before_x, before_len)  # (B, H)
        h_after = self.summarize(self.after_lstm, after_x, after_len, reverse=reverse)  # (B, H)
        return self.head_log(self_e, h_before, h_after, base_log.to(self_e.dtype))


def qerror_loss(pred_log: Tensor, label_log: Tensor, censored: Tensor, weight: Tensor | None = None) -> Tensor:
    """Log-space Q-error that treats censored labels as lower bounds (section 4.3).

    An exact label costs ``|pred_log - label_log|``, the log of the Q-error. A
    censored label only says the query ran at least that long (it was still
    running when a sampled-away neighbour arrived, or it timed out), so it costs
    ``relu(label_log - pred_log)``: nothing once the prediction reaches it.

    Args:
        pred_log: Predicted log latencies, (B,).
        label_log: Observed log latencies or lower bounds, (B,).
        censored: True (or 1) where ``label_log`` is a lower bound, (B,).
        weight: Optional non-negative row weights, (B,); the loss is then their weighted mean.

    Returns:
        A scalar tensor.
    """
    diff = pred_log - label_log  # (B,)
    per_row = torch.where(censored.to(torch.bool), torch.relu(-diff), diff.abs())  # (B,)
    if weight is None:
        return per_row.mean()
    weight = weight.to(per_row.dtype)
    return (weight * per_row).sum() / weight.sum().clamp_min(torch.finfo(per_row.dtype).tiny)


@dataclass(frozen=True)
class NeighbourStep:
    """One after-LSTM step for running queries, from :meth:`IncrementalIconq.step_neighbour`.

    Attributes:
        keys: the running queries, in order.
        slots: their rows in the model's state.
        h, c: their new after-LSTM state, (K, H) each.
        raw_s: their unguarded predicted latencies after the step (seconds), (K,).
    """

    keys: list
    slots: list[int]
    h: Tensor
    c: Tensor
    raw_s: np.ndarray

    def subset(self, start: int, stop: int) -> NeighbourStep:
        """The step of ``keys[start:stop]``."""
        return NeighbourStep(self.keys[start:stop], self.slots[start:stop], self.h[start:stop],
                             self.c[start:stop], self.raw_s[start:stop])


@dataclass(frozen=True)
class QueryEmbedding:
    """Hypothetical new queries, from :meth:`IncrementalIconq.embed_queries`: (B, ·) rows.

    Attributes:
        self_e: self embeddings, (B, E).
        h_before: before-LSTM summaries, (B, H).
        base_log: log Stage estimates, (B,).
        raw_s: raw predicted latencies with no after-neighbour (seconds), (B,).
    """

    self_e: Tensor
    h_before: Tensor
    base_log: Tensor
    raw_s: np.ndarray


class RunningSlots:
    """What both incremental Iconq+ engines keep alike: the slot each running query owns, and the guard.

    A running query owns one row ("slot") of the engine's state arrays
    until it is removed; freed slots are reused, and the arrays grow by
    doubling (:meth:`_grow` is the engine's part). The guard is the last
    guarded prediction per slot, which a running query's prediction never
    falls below.
    """

    _slot: dict[Hashable, int]
    _free: list[int]
    _guard_s: np.ndarray

    def _init_slots(self) -> None:
        self._slot, self._free, self._guard_s = {}, [], np.zeros(0)

    def _copy_slots(self, twin: RunningSlots) -> None:
        twin._slot, twin._free, twin._guard_s = dict(self._slot), list(self._free), self._guard_s.copy()

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, key: object) -> bool:
        return key in self._slot

    def _slots(self, keys: Sequence[Hashable]) -> list[int]:
        try:
            slots = [self._slot[k] for k in keys]
        except KeyError as exc:
            raise KeyError(f"Query {exc.args[0]!r} is not running.") from None
        if len(set(slots)) != len(slots):
            raise ValueError(f"Keys must be distinct, got {list(keys)!r}.")
        return slots

    def _grow(self, rows: int) -> None:
        """Append ``rows`` zero rows to each of the engine's state arrays."""
        raise NotImplementedError

    def _new_slot(self) -> int:
        if self._free:
            return self._free.pop()
        n = len(self._guard_s)
        grow = max(n, 16)
        self._grow(grow)
        self._guard_s = np.concatenate([self._guard_s, np.zeros(grow)])
        self._free.extend(range(n + grow - 1, n, -1))
        return n

    def _claim(self, key: Hashable) -> int:
        """A slot for a query that has just arrived (refused if it already runs)."""
        if key in self._slot:
            raise ValueError(f"Query {key!r} is already running.")
        slot = self._new_slot()
        self._slot[key] = slot
        return slot

    def _guarded(self, slots: list[int], raw_s: np.ndarray, elapsed_s: Sequence[float] | np.ndarray | None
                 ) -> np.ndarray:
        """``raw_s`` raised to the guard and to ``elapsed_s``; the result becomes the new guard."""
        out = np.maximum(raw_s, self._guard_s[slots])
        if elapsed_s is not None:
            elapsed = np.asarray(elapsed_s, dtype=np.float64)
            if elapsed.shape != out.shape:
                raise ValueError(f"'elapsed_s' must have shape {out.shape}, got {elapsed.shape}.")
            out = np.maximum(out, elapsed)
        self._guard_s[slots] = out
        return out

    def guard_step(self, step: NeighbourStep, elapsed_s: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
        """Guarded predictions of a step from ``step_neighbour``, as ``peek_neighbour`` returns them."""
        out = np.maximum(step.raw_s, self._guard_s[step.slots])
        if elapsed_s is not None:
            out = np.maximum(out, np.asarray(elapsed_s, dtype=np.float64))
        return out

    def _check_step(self, step: NeighbourStep) -> None:
        if self._slots(step.keys) != step.slots:
            raise ValueError("The step was computed for another set of running queries; compute it again.")

    def remove(self, key: Hashable) -> None:
        """Stop tracking ``key`` (finished or aborted); its slot is reused."""
        try:
            slot = self._slot.pop(key)
        except KeyError:
            raise KeyError(f"Query {key!r} is not running.") from None
        self._free.append(slot)


class IncrementalIconq(RunningSlots):
    """Latency predictions for running queries, updated one arrival at a time (section 4.4).

    Each running query keeps its self embedding, its before-pass summary and its
    after-LSTM state. When a new query arrives, every running query it overlaps
    advances its after-LSTM by one step, all in one batched LSTM cell, which is
    what the chronological after-order of Iconq+ allows.

    Predictions are guarded: a running query's predicted latency never falls
    below an earlier prediction or below the time it has already run.

    Args:
        net: A chronological :class:`IconqNet`; it is switched to eval mode.

    Raises:
        ValueError: If ``net`` ingests after-neighbours in reverse order.
    """

    def __init__(self, net: IconqNet) -> None:
        if net.config.after_order != "chronological":
            raise ValueError(
                "The 'after_order' parameter of IconqConfig must be 'chronological' for incremental inference, "
                f"got {net.config.after_order!r}."
            )
        self.net = net.eval()
        self._init_slots()
        p = next(net.parameters())
        E, H = net.config.embed_dim, net.config.hidden_dim
        # Rows are slots; a key owns one row of each tensor until it is removed.
        self._self_e = p.new_zeros(0, E)  # (N, E)
        self._h_before = p.new_zeros(0, H)  # (N, H)
        self._h = p.new_zeros(0, H)  # (N, H)
        self._c = p.new_zeros(0, H)  # (N, H)
        self._base_log = p.new_zeros(0)  # (N,)

    def fork(self) -> IncrementalIconq:
        """An independent copy of every running query's state, sharing the network."""
        twin = IncrementalIconq.__new__(IncrementalIconq)
        twin.net = self.net
        self._copy_slots(twin)
        for name in ("_self_e", "_h_before", "_h", "_c", "_base_log"):
            setattr(twin, name, getattr(self, name).clone())
        return twin

    def _grow(self, rows: int) -> None:
        for name in ("_self_e", "_h_before", "_h", "_c", "_base_log"):
            old = getattr(self, name)
            setattr(self, name, torch.cat([old, old.new_zeros(rows, *old.shape[1:])]))

    def _raw_log(self, idx: Tensor) -> Tensor:
        return self.net.head_log(self._self_e[idx], self._h_before[idx], self._h[idx], self._base_log[idx])  # (K,)

    @staticmethod
    def _seconds(raw_log: Tensor) -> np.ndarray:
        return np.exp(raw_log.detach().cpu().double().numpy())

    @torch.no_grad()
    def add_query(self, key: Hashable, self_x: Tensor, before_x: Tensor, base_log: float) -> float:
        """Start tracking a query that has just arrived.

        Args:
            key: Any hashable id, unique among running queries.
            self_x: The query's own features, (S,).
            before_x: Interactions with the running neighbours that arrived
                before it, oldest first, (T, D); T may be 0.
            base_log: Log of its Stage latency estimate, in log-seconds.

        Returns:
            Its predicted latency in seconds (no neighbour after it yet).
        """
        if key in self._slot:
            raise ValueError(f"Query {key!r} is already running.")
        net = self.net
        p = self._h
        self_x = self_x.to(device=p.device, dtype=p.dtype)
        before_x = before_x.to(device=p.device, dtype=p.dtype)
        if self_x.shape != (net.config.self_dim,):
            raise ValueError(f"'self_x' must have shape ({net.config.self_dim},), got {tuple(self_x.shape)}.")
        if before_x.ndim != 2:
            raise ValueError(f"'before_x' must have shape (T, {net.config.pair_dim}), got {tuple(before_x.shape)}.")
        n_before = torch.tensor([before_x.shape[0]], device=p.device)
        embedding = self.embed_queries(self_x.unsqueeze(0), before_x.unsqueeze(0), n_before,
                                       torch.tensor([float(base_log)], dtype=p.dtype, device=p.device))
        return self.add_embedded(key, embedding, 0)

    def _step(self, slots: list[int], pair_x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One after-LSTM step for ``slots``; returns (idx, h, c) without storing them."""
        idx = torch.tensor(slots, device=self._h.device)
        lstm = self.net.after_lstm
        x = self.net.pair_embed(pair_x.to(device=self._h.device, dtype=self._h.dtype))  # (K, E)
        h, c = self._h[idx], self._c[idx]  # (K, H)
        # One matmul for input and recurrent terms; PyTorch orders the gates i, f, g, o.
        w = torch.cat([lstm.weight_ih_l0, lstm.weight_hh_l0], dim=1)  # (4H, E + H)
        gates = torch.addmm(lstm.bias_ih_l0 + lstm.bias_hh_l0, torch.cat([x, h], dim=1), w.t())  # (K, 4H)
        i, f, g, o = gates.chunk(4, dim=1)  # (K, H) each
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return idx, h, c

    def _check_pairs(self, keys: list[Hashable], pair_x: Tensor) -> list[int]:
        D = self.net.config.pair_dim
        if pair_x.shape != (len(keys), D):
            raise ValueError(f"'pair_x' must have shape ({len(keys)}, {D}), got {tuple(pair_x.shape)}.")
        return self._slots(keys)

    @torch.no_grad()
    def add_neighbour(self, keys: Sequence[Hashable], pair_x: Tensor) -> np.ndarray:
        """Account for a new arrival that overlaps the running queries ``keys``.

        Args:
            keys: Running queries the newcomer overlaps, distinct.
            pair_x: ``pair_x[i]`` is the interaction vector of (``keys[i]``, newcomer), (K, D).

        Returns:
            Guarded predicted latencies of ``keys`` in seconds, (K,).
        """
        keys = list(keys)
        slots = self._check_pairs(keys, pair_x)
        if not slots:
            return np.zeros(0)
        idx, h, c = self._step(slots, pair_x)
        self._h[idx] = h
        self._c[idx] = c
        return self._guarded(slots, self._seconds(self._raw_log(idx)), None)

    @torch.no_grad()
    def step_neighbour(self, keys: Sequence[Hashable], pair_x: Tensor) -> NeighbourStep:
        """The after-LSTM step a newcomer would cause for ``keys``, computed but not stored.

        :meth:`peek_neighbour` reads predictions from it; :meth:`apply_neighbour`
        stores it, so a router that asked first does not run the step twice.
        """
        keys = list(keys)
        slots = self._check_pairs(keys, pair_x)
        if not slots:
            empty = self._h.new_zeros(0, self._h.shape[1])
            return NeighbourStep(keys, [], empty, empty, np.zeros(0))
        idx, h, c = self._step(slots, pair_x)
        raw_log = self.net.head_log(self._self_e[idx], self._h_before[idx], h, self._base_log[idx])
        return NeighbourStep(keys, slots, h, c, np.exp(raw_log.cpu().double().numpy()))

    @torch.no_grad()
    def peek_neighbour(self, keys: Sequence[Hashable], pair_x: Tensor,
                       elapsed_s: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
        """What :meth:`add_neighbour` would predict (guarded), without changing any state.

        This is the counterfactual a router needs: the running queries'
        latencies if a newcomer joined them (AutoSLO Algorithm 1, line 5).
        """
        return self.guard_step(self.step_neighbour(keys, pair_x), elapsed_s)

    @torch.no_grad()
    def apply_neighbour(self, step: NeighbourStep, elapsed_s: Sequence[float] | np.ndarray | None = None
                        ) -> np.ndarray:
        """Store a step from :meth:`step_neighbour` (state unchanged since); returns the guarded predictions.

        The same as :meth:`add_neighbour` with the step's pairs followed by
        :meth:`predict` with ``elapsed_s``.
        """
        if not step.slots:
            return np.zeros(0)
        self._check_step(step)
        idx = torch.tensor(step.slots, device=self._h.device)
        self._h[idx] = step.h
        self._c[idx] = step.c
        out = self.guard_step(step, elapsed_s)
        self._guard_s[step.slots] = out
        return out

    @torch.no_grad()
    def embed_queries(self, self_x: Tensor, before_x: Tensor, before_len: Tensor, base_log: Tensor
                      ) -> QueryEmbedding:
        """Embeddings and raw predictions of hypothetical new queries, batched; no state changes.

        Args:
            self_x: (B, S) own features of each hypothetical query.
            before_x: (B, T, D) interactions with the running queries it would join, padded.
            before_len: (B,) valid steps per row.
            base_log: (B,) log Stage estimates.
        """
        net = self.net
        dtype, device = self._h.dtype, self._h.device
        self_e = net.self_embed(self_x.to(device=device, dtype=dtype))  # (B, E)
        h_before = net.summarize(net.before_lstm, before_x.to(device=device, dtype=dtype), before_len)  # (B, H)
        base = base_log.to(device=device, dtype=dtype)
        raw_log = net.head_log(self_e, h_before, torch.zeros_like(h_before), base)
        return QueryEmbedding(self_e, h_before, base, np.exp(raw_log.cpu().double().numpy()))

    @torch.no_grad()
    def peek_queries(self, self_x: Tensor, before_x: Tensor, before_len: Tensor, base_log: Tensor) -> np.ndarray:
        """Raw predicted latencies (seconds) of hypothetical new queries, batched; no state changes.

        Args: as :meth:`embed_queries`.
        """
        return self.embed_queries(self_x, before_x, before_len, base_log).raw_s

    @torch.no_grad()
    def add_embedded(self, key: Hashable, embedding: QueryEmbedding, row: int) -> float:
        """Start tracking ``key`` from row ``row`` of :meth:`embed_queries`; as :meth:`add_query`."""
        slot = self._claim(key)
        self._self_e[slot] = embedding.self_e[row]
        self._h_before[slot] = embedding.h_before[row]
        self._h[slot] = 0.0
        self._c[slot] = 0.0
        self._base_log[slot] = embedding.base_log[row]
        raw_s = float(embedding.raw_s[row])
        self._guard_s[slot] = raw_s
        return raw_s

    @torch.no_grad()
    def raw_predict(self, keys: Sequence[Hashable]) -> np.ndarray:
        """Current unguarded predicted latencies of ``keys`` in seconds, (K,)."""
        slots = self._slots(list(keys))
        if not slots:
            return np.zeros(0)
        raw_log = self._raw_log(torch.tensor(slots, device=self._h.device))
        return np.exp(raw_log.cpu().double().numpy())

    @torch.no_grad()
    def predict(self, keys: Sequence[Hashable], elapsed_s: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
        """Guarded predicted latencies of ``keys`` in seconds, (K,).

        Each is the largest of the current raw prediction, the last guarded one,
        and ``elapsed_s[i]`` when given; the result becomes the new guard.

        Args:
            keys: Running queries, distinct.
            elapsed_s: Optional time each has run so far, in seconds, (K,).
        """
        slots = self._slots(list(keys))
        if not slots:
            return np.zeros(0)
        return self._guarded(slots, self._seconds(self._raw_log(torch.tensor(slots, device=self._h.device))),
                             elapsed_s)
