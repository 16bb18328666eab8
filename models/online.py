"""Online latency prediction for queries as they arrive and run (AutoSLO §4.4, §5).

:class:`OnlinePredictor` keeps, for every running query, the state Iconq+
needs to update its prediction when a neighbour arrives, and answers the
router's counterfactual question — "what would every latency be if this query
joined that cluster?" — for all clusters in one batched step, without
changing anything until :meth:`commit`.

Queries are described by their template: plan features and Stage estimates
per (template, cluster size) are computed once from a feature table (one row
per template with the plan-feature columns).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sloctl.datasets.interactions import pair_vectors, self_vectors

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.models.iconq import NeighbourStep, QueryEmbedding
    from sloctl.models.predictor import LatencyPredictor

__all__ = ["Counterfactual", "OnlinePredictor", "RunningQuery", "one_inference_thread"]


def _as_is(x: np.ndarray) -> np.ndarray:
    return x


@contextlib.contextmanager
def one_inference_thread() -> Iterator[None]:
    """Run PyTorch and NumPy's BLAS on one thread inside the block (a simulation's many tiny steps).

    Online prediction runs a few small matrix products per step: one thread
    does them as fast as several, and the libraries' spinning worker threads,
    one per core, fight the other simulations of a process pool for the cores.
    """
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


@dataclass
class RunningQuery:
    """What the predictor remembers about a routed query."""

    query_id: int
    template: str
    cluster_id: str
    size: int
    arrival_s: float
    slo_s: float
    predicted_s: float


@dataclass(frozen=True)
class _PendingStep:
    """The last :meth:`OnlinePredictor.counterfactuals` answer, kept for the commit that follows it."""

    version: int
    template: str
    arrival_s: float
    now_s: float
    embedding: QueryEmbedding
    clusters: dict[str, tuple[int, int, NeighbourStep | None]]  # id -> (size, row in embedding, its step)


@dataclass
class Counterfactual:
    """Predictions if the new query joined one cluster.

    Attributes:
        query_s: the new query's predicted latency there.
        running_ids: the cluster's running queries.
        running_before_s: their current (guarded) predictions.
        running_after_s: their predictions with the newcomer (guarded).
    """

    query_s: float
    running_ids: list[int]
    running_before_s: np.ndarray
    running_after_s: np.ndarray


class OnlinePredictor:
    """Incremental Iconq+ (or Stage-only) predictions for live or simulated routing.

    Args:
        predictor: a trained :class:`~sloctl.models.predictor.LatencyPredictor`.
        templates: feature table, one row per template (``template`` and the
            plan-feature columns).
        use_iconq: ``False`` ignores neighbours (Stage only, concurrency-unaware).
        engine: ``numpy`` (:class:`~sloctl.models.iconq_numpy.NumpyIncrementalIconq`,
            the default: the same predictions at a fraction of the per-call cost)
            or ``torch`` (:class:`~sloctl.models.iconq.IncrementalIconq`).

    A new query's before-sequence holds at most :attr:`max_before` running
    neighbours, the newest: the before-LSTM runs once per arrival over that
    sequence, so a cluster with a backlog of thousands would otherwise cost
    thousands of sequential LSTM steps at every arrival. Every model here was
    trained on far fewer neighbours (the bundle records how many).
    """

    max_before: int = 128

    def __init__(self, predictor: LatencyPredictor, templates: pd.DataFrame, use_iconq: bool = True,
                 engine: str = "numpy") -> None:
        self.predictor = predictor
        self.templates = templates.drop_duplicates("template").set_index("template", drop=False)
        self.use_iconq = use_iconq and predictor.net is not None
        if self.use_iconq and predictor.variant.after_order != "chronological":
            raise ValueError("Online prediction needs an Iconq+ model (chronological after-pass); "
                             f"got variant {predictor.variant.name!r}.")
        self._features: dict[tuple[str, int], tuple[np.ndarray, float, np.ndarray]] = {}
        self.running: dict[int, RunningQuery] = {}
        self._by_cluster: dict[str, list[int]] = {}
        self._inc = None
        # The last counterfactual step, kept so that commit() stores it instead of recomputing it;
        # valid while _version (bumped by every commit and complete) is unchanged.
        self._pending: _PendingStep | None = None
        self._version = 0
        if engine not in ("numpy", "torch"):
            raise ValueError(f"The 'engine' parameter of OnlinePredictor must be 'numpy' or 'torch', got {engine!r}.")
        self.engine = engine
        self._x = _as_is
        if self.use_iconq and engine == "numpy":
            from sloctl.models.iconq_numpy import NumpyIncrementalIconq

            self._inc = NumpyIncrementalIconq(predictor.net)
        elif self.use_iconq:
            import torch

            from sloctl.models.iconq import IncrementalIconq

            self._inc = IncrementalIconq(predictor.net)
            self._x = torch.from_numpy

    def fork(self) -> OnlinePredictor:
        """An independent copy of the running state (features and the model are shared)."""
        import copy

        twin = copy.copy(self)
        twin.running = {k: copy.copy(v) for k, v in self.running.items()}
        twin._by_cluster = {k: list(v) for k, v in self._by_cluster.items()}
        twin._inc = self._inc.fork() if self._inc is not None else None
        twin._pending = None
        return twin

    # -- features ------------------------------------------------------------
    def features(self, template: str, size: int) -> tuple[np.ndarray, float, np.ndarray]:
        """(scaled plan vector, Stage estimate in seconds, self vector) of a template on a size."""
        key = (template, int(size))
        if key not in self._features:
            if template not in self.templates.index:
                raise KeyError(f"Unknown template {template!r}: it is not in the feature table.")
            row = self.templates.loc[[template]].assign(cluster_size=int(size))
            stage_s = float(self.predictor.stage.predict(row)[0])
            if self.use_iconq:
                plan = self.predictor.scaler.transform(row)[0]
                own = self_vectors(plan[None], np.array([stage_s]), np.array([size]),
                                   self.predictor.variant.size_features)[0]
            else:
                plan, own = np.zeros(0), np.zeros(0)
            self._features[key] = (plan, stage_s, own)
        return self._features[key]

    def isolated_s(self, template: str, size: int) -> float:
        """Stage's concurrency-unaware estimate."""
        return self.features(template, size)[1]

    def _pair_blocks(self, running: list[tuple[str, float]], new: tuple[str, float], size: int
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Interaction vectors (running_i, new) and (new, running_i), each (R, D)."""
        rows = [*running, new]
        plan = np.stack([self.features(t, size)[0] for t, _ in rows])
        stage = np.array([self.features(t, size)[1] for t, _ in rows])
        arrival = np.array([a for _, a in rows])
        sizes = np.full(len(rows), size)
        r = len(running)
        others, me = np.arange(r), np.full(r, r)
        sf = self.predictor.variant.size_features
        return (pair_vectors(plan, stage, arrival, sizes, others, me, sf),
                pair_vectors(plan, stage, arrival, sizes, me, others, sf))

    # -- the router's questions ------------------------------------------------
    def counterfactuals(self, template: str, arrival_s: float, clusters: dict[str, int], now_s: float
                        ) -> dict[str, Counterfactual]:
        """Predictions if the query joined each of ``clusters`` (id -> size); nothing changes."""
        out: dict[str, Counterfactual] = {}
        ids = list(clusters)
        if not self.use_iconq:
            for cid in ids:
                running = self._by_cluster.get(cid, [])
                current = np.array([self.running[r].predicted_s for r in running])
                out[cid] = Counterfactual(self.isolated_s(template, clusters[cid]), list(running), current,
                                          current.copy())
            return out
        # one batched step for every running query on every cluster (Algorithm 1, line 5)
        keys, pairs = [], []
        befores, lengths, own, base = [], [], [], []
        for cid in ids:
            size = clusters[cid]
            running = self._by_cluster.get(cid, [])
            if running:
                info = [(self.running[r].template, self.running[r].arrival_s) for r in running]
                as_target, as_neighbour = self._pair_blocks(info, (template, arrival_s), size)
                pairs.append(as_target)
                befores.append(as_neighbour[-self.max_before:])
                keys.extend(running)
            else:
                befores.append(np.zeros((0, self.predictor.net.config.pair_dim), np.float32))
            lengths.append(len(befores[-1]))
            plan, stage_s, vec = self.features(template, size)
            own.append(vec)
            base.append(np.log(stage_s))
        after = np.zeros(0)
        step = None
        if keys:
            elapsed = np.array([max(0.0, now_s - self.running[k].arrival_s) for k in keys])
            step = self._inc.step_neighbour(keys, self._x(np.concatenate(pairs)))
            after = self._inc.guard_step(step, elapsed)
        width = max(lengths) if lengths else 0
        before_x = np.zeros((len(ids), width, self.predictor.net.config.pair_dim), np.float32)
        for i, b in enumerate(befores):
            before_x[i, : len(b)] = b
        x = self._x
        embedding = self._inc.embed_queries(x(np.stack(own)), x(before_x), x(np.array(lengths, np.int64)),
                                            x(np.array(base, np.float32)))
        query_s = embedding.raw_s
        position, by_cluster = 0, {}
        for i, cid in enumerate(ids):
            running = self._by_cluster.get(cid, [])
            current = np.array([self.running[r].predicted_s for r in running])
            out[cid] = Counterfactual(float(query_s[i]), list(running), current,
                                      after[position:position + len(running)])
            by_cluster[cid] = (clusters[cid], i, step.subset(position, position + len(running)) if running else None)
            position += len(running)
        self._pending = _PendingStep(self._version, template, arrival_s, now_s, embedding, by_cluster)
        return out

    def commit(self, query_id: int, template: str, arrival_s: float, slo_s: float, cluster_id: str, size: int,
               now_s: float) -> float:
        """Record that the query runs on ``cluster_id``; returns its predicted latency."""
        if query_id in self.running:
            raise ValueError(f"Query {query_id} is already running.")
        running = self._by_cluster.setdefault(cluster_id, [])
        pending = self._pending
        self._pending = None
        if self.use_iconq and pending is not None \
                and (pending.version, pending.template, pending.arrival_s, pending.now_s) == (
                    self._version, template, arrival_s, now_s) \
                and pending.clusters.get(cluster_id, (None,))[0] == size:
            # the router just asked about this very arrival: store the step it computed
            _, row, step = pending.clusters[cluster_id]
            if step is not None:
                elapsed = np.array([max(0.0, now_s - self.running[r].arrival_s) for r in running])
                for r, value in zip(running, self._inc.apply_neighbour(step, elapsed), strict=True):
                    self.running[r].predicted_s = float(value)
            predicted = self._inc.add_embedded(query_id, pending.embedding, row)
        elif self.use_iconq:
            info = [(self.running[r].template, self.running[r].arrival_s) for r in running]
            if running:
                pairs, before = self._pair_blocks(info, (template, arrival_s), size)
                before = before[-self.max_before:]
                elapsed = np.array([max(0.0, now_s - self.running[r].arrival_s) for r in running])
                # add_neighbour then predict(elapsed), in one head evaluation instead of two
                guarded = self._inc.apply_neighbour(self._inc.step_neighbour(running, self._x(pairs)), elapsed)
                for r, value in zip(running, guarded, strict=True):
                    self.running[r].predicted_s = float(value)
            else:
                before = np.zeros((0, self.predictor.net.config.pair_dim), np.float32)
            plan, stage_s, vec = self.features(template, size)
            predicted = self._inc.add_query(query_id, self._x(vec), self._x(before), float(np.log(stage_s)))
        else:
            predicted = self.isolated_s(template, size)
        self.running[query_id] = RunningQuery(query_id, template, cluster_id, size, arrival_s, slo_s, predicted)
        running.append(query_id)
        self._version += 1
        return predicted

    def complete(self, query_id: int) -> None:
        """Forget a finished query."""
        query = self.running.pop(query_id, None)
        if query is None:
            return
        self._version += 1
        self._by_cluster[query.cluster_id].remove(query_id)
        if self._inc is not None:
            self._inc.remove(query_id)

    def running_on(self, cluster_id: str) -> list[RunningQuery]:
        return [self.running[r] for r in self._by_cluster.get(cluster_id, [])]
