"""The controller runtime's state: models hot-swapped from the registry, the routed pool, admission, retry budgets.

:class:`Runtime` holds everything the HTTP layer (:mod:`sloctl.serving.app`)
serves, behind one lock:

* **Models by alias.** Each :class:`ModelSlot` follows one registry alias
  (``models:/iconq@champion``, ...). :meth:`Runtime.refresh` (called by a
  background watcher) loads a new version when the alias moves; a failed load
  keeps the last good model and records the error. With no latency model at
  all the runtime still routes: Iconq+ first, then Stage (concurrency-unaware,
  ``StageCostRouter``), then round-robin; every answer names the one in use.
* **The pool.** Clusters come from the config; ``route`` runs the Query
  Router and records the query as running, ``complete`` ends it. Billing
  timers give accrued cost.
* **Durable state.** Running queries and accrued cost live in SQLite, written
  on every change, so a restart reconciles: running queries are re-committed
  (those older than ``stale_after_s`` are dropped and counted), cost carries
  on from where it was.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ModelSlot", "Runtime", "RuntimeError_"]


class RuntimeError_(ValueError):
    """A request the runtime refuses (unknown template, cluster or query); the HTTP layer answers 4xx."""

    def __init__(self, message: str, *, status: int = 422, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


def _parse_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("models:/") or "@" not in uri:
        raise ValueError(f"The model URI must look like models:/NAME@ALIAS, got {uri!r}.")
    name, alias = uri.removeprefix("models:/").split("@", 1)
    return name, alias


@dataclass
class ModelSlot:
    """One registry alias and the last good object loaded from it."""

    uri: str
    tracking_uri: str
    kind: str  # "latency" or "policy"
    version: str | None = None
    value: Any = None
    error: str | None = None
    loaded_at: float | None = None
    swaps: int = 0

    def refresh(self) -> bool:
        """Load the alias's version if it moved; returns True on a swap. Never raises."""
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        from sloctl.registry.store import connect, load_model, load_policy

        name, alias = _parse_uri(self.uri)
        try:
            connect(self.tracking_uri)
            client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
            version = str(client.get_model_version_by_alias(name, alias).version)
        except MlflowException as exc:
            self.error = f"no model at {self.uri}" if self.value is None else str(exc)[:300]
            return False
        except Exception as exc:  # registry unreachable: keep serving what we have
            self.error = f"{type(exc).__name__}: {str(exc)[:300]}"
            return False
        if version == self.version:
            return False
        try:
            uri = f"models:/{name}/{version}"
            value = (load_model(uri, tracking_uri=self.tracking_uri) if self.kind == "latency"
                     else load_policy(uri, tracking_uri=self.tracking_uri))
        except Exception as exc:  # a bad version: keep the last good one and say so
            self.error = f"version {version} failed to load ({type(exc).__name__}: {str(exc)[:300]}); " \
                         f"serving version {self.version}"
            return False
        self.value, self.version, self.error, self.loaded_at = value, version, None, time.time()
        self.swaps += 1
        return True

    def status(self) -> dict[str, Any]:
        return {"uri": self.uri, "version": self.version, "loaded": self.value is not None, "error": self.error,
                "swaps": self.swaps}


@dataclass
class _Running:
    query_id: int
    template: str
    cluster_id: str
    arrival_wall: float
    slo_s: float
    predicted_s: float


@dataclass
class Runtime:
    """All state behind the HTTP endpoints (see the module docstring)."""

    cfg: Any
    templates: Any  # pandas DataFrame: one log row (plan features) per known template, or None
    state_db: str
    stale_after_s: float = 3600.0
    slots: dict[str, ModelSlot] = field(default_factory=dict)
    decisions: deque = field(default_factory=lambda: deque(maxlen=50))
    history: deque = field(default_factory=lambda: deque(maxlen=500))

    def __post_init__(self) -> None:
        from sloctl.control.billing import BillingTimer
        from sloctl.control.router import ClusterState

        serve, registry = self.cfg.serve, self.cfg.registry
        self.lock = threading.RLock()
        self.admission_lock = threading.Lock()
        self.wall0 = time.time()
        self.slots = {name: ModelSlot(uri, registry.tracking_uri, kind) for name, uri, kind in (
            ("iconq", serve.model_uri, "latency"), ("stage", serve.fallback_uri, "latency"),
            ("admission", serve.admission_uri, "policy"), ("retry", serve.retry_uri, "policy"),
            ("execution", serve.execution_uri, "policy"))}
        router = self.cfg.router
        self.clusters = {f"c{i}": ClusterState(f"c{i}", size, BillingTimer(router.minimum_s), router.price_per_unit_s)
                         for i, size in enumerate(serve.cluster_sizes)}
        self.running: dict[int, _Running] = {}
        self.violations = 0
        self.completed = 0
        self.reconciled = {"restored": 0, "dropped_stale": 0}
        self._db = sqlite3.connect(self.state_db, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS cost (cluster_id TEXT PRIMARY KEY, accrued REAL NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS running (query_id INTEGER PRIMARY KEY, template TEXT, "
                         "cluster_id TEXT, arrival_wall REAL, slo_s REAL, predicted_s REAL)")
        self.cost_offset = dict(self._db.execute("SELECT cluster_id, accrued FROM cost").fetchall())
        for cid in list(self.cost_offset):  # clusters retired in an earlier run keep their cost
            if cid not in self.clusters and cid != "_retired":
                self.cost_offset["_retired"] = self.cost_offset.get("_retired", 0.0) + self.cost_offset.pop(cid)
        self.admission = None
        self.refresh()
        self._reconcile()

    # -- time and models -------------------------------------------------------------
    def now_s(self) -> float:
        return time.time() - self.wall0

    def refresh(self) -> dict[str, bool]:
        """Poll every alias; rebuild the router when a latency model changed."""
        swapped = {name: slot.refresh() for name, slot in self.slots.items()}
        with self.lock:
            if swapped["iconq"] or swapped["stage"] or not hasattr(self, "router"):
                self._build_router()
            if swapped["admission"] or self.admission is None:
                with self.admission_lock:
                    self._build_admission()
        return swapped

    def latency_model(self) -> str:
        """Which model routes now: iconq, stage or round-robin (the documented fallback order)."""
        if self.slots["iconq"].value is not None and self.templates is not None:
            return "iconq"
        if self.slots["stage"].value is not None and self.templates is not None:
            return "stage"
        return "round-robin"

    def _build_router(self) -> None:
        from sloctl.control.router import IconqRouter, RoundRobinRouter, StageCostRouter
        from sloctl.models.online import OnlinePredictor

        kind = self.latency_model()
        if kind == "round-robin":
            self.online, self.router = None, RoundRobinRouter()
        else:
            predictor = self.slots[kind].value
            self.online = OnlinePredictor(predictor, self.templates, use_iconq=kind == "iconq")
            margin = self.cfg.router.slo_margin if self.cfg.router.slo_margin is not None else 0.3
            self.router = (IconqRouter(self.online, slo_margin=margin, cost_tolerance=self.cfg.router.cost_tolerance)
                           if kind == "iconq" else StageCostRouter(self.online))
        self.router_kind = kind
        if self.online is not None:  # running queries move over to the new model
            for r in sorted(self.running.values(), key=lambda r: r.arrival_wall):
                c = self.clusters[r.cluster_id]
                r.predicted_s = self.online.commit(r.query_id, r.template, r.arrival_wall - self.wall0, r.slo_s,
                                                   c.cluster_id, c.size, self.now_s())

    def _build_admission(self) -> None:
        from sloctl.control.credits import ClassShare, CreditController
        from sloctl.training.admission_policy import controller_from_policy

        policy = self.slots["admission"].value
        if policy is not None:
            self.admission = controller_from_policy(policy)
            self.admission_source = f"{self.slots['admission'].uri} v{self.slots['admission'].version}"
        else:
            self.admission = CreditController(classes=[ClassShare("high", 2), ClassShare("low", 1)])
            self.admission_source = "library defaults (no admission-policy registered)"

    def _reconcile(self) -> None:
        now_wall = time.time()
        rows = self._db.execute("SELECT query_id, template, cluster_id, arrival_wall, slo_s, predicted_s "
                                "FROM running").fetchall()
        with self.lock:
            for qid, template, cid, arrival_wall, slo_s, predicted in rows:
                if cid not in self.clusters or now_wall - arrival_wall > self.stale_after_s:
                    self._db.execute("DELETE FROM running WHERE query_id = ?", (qid,))
                    self.reconciled["dropped_stale"] += 1
                    continue
                self.running[qid] = _Running(qid, template, cid, arrival_wall, slo_s, predicted)
                self.clusters[cid].timer.query_arrived(max(0.0, arrival_wall - self.wall0))
                self.reconciled["restored"] += 1
            self._build_router()

    # -- routing ---------------------------------------------------------------------
    def check_template(self, template: str) -> None:
        if self.templates is not None and template not in self.templates["template"].to_numpy():
            known = ", ".join(sorted(self.templates["template"].unique())[:8])
            raise RuntimeError_(f"unknown template {template!r} (known: {known}, ...)", field="template")

    def route(self, query_id: int, template: str, slo_s: float) -> dict[str, Any]:
        from sloctl.control.router import Query

        with self.lock:
            if query_id in self.running:
                raise RuntimeError_(f"query {query_id} is already running", status=409, field="query_id")
            if self.router_kind != "round-robin":
                self.check_template(template)
            if not self.clusters:
                raise RuntimeError_("the pool has no cluster to route to", status=409)
            now = self.now_s()
            started = time.perf_counter()
            decision = self.router.route(Query(query_id, template, now, slo_s), list(self.clusters.values()), now)
            decision_ms = (time.perf_counter() - started) * 1e3
            cluster = self.clusters[decision.cluster_id]
            cluster.timer.query_arrived(now)
            predicted = None if not np.isfinite(decision.predicted_s) else float(decision.predicted_s)
            self.running[query_id] = _Running(query_id, template, cluster.cluster_id, self.wall0 + now, slo_s,
                                              predicted if predicted is not None else float("nan"))
            self._db.execute("INSERT INTO running VALUES (?, ?, ?, ?, ?, ?)",
                             (query_id, template, cluster.cluster_id, self.wall0 + now, slo_s,
                              predicted if predicted is not None else None))
            out = {"query_id": query_id, "cluster_id": cluster.cluster_id, "cluster_size": cluster.size,
                   "predicted_latency_s": predicted, "model": self.router_kind,
                   "model_version": self.slots[self.router_kind].version if self.router_kind != "round-robin"
                   else None, "fallback": self.router_kind != "iconq", "decision_ms": decision_ms,
                   "explanation": {cid: {k: float(v) for k, v in e.items()} for cid, e in decision.explanation.items()}}
            self.decisions.append({"t": now, "query_id": query_id, "template": template,
                                   "cluster_id": cluster.cluster_id, "model": self.router_kind,
                                   "predicted_s": predicted})
            return out

    def complete(self, query_id: int, latency_s: float, status: str) -> dict[str, Any]:
        with self.lock:
            r = self.running.pop(query_id, None)
            if r is None:
                raise RuntimeError_(f"query {query_id} is not running", status=404, field="query_id")
            now = self.now_s()
            cluster = self.clusters[r.cluster_id]
            cluster.timer.query_finished(now)
            self.router.on_complete(query_id, now)
            violated = status != "ok" or latency_s > r.slo_s
            self.completed += 1
            self.violations += int(violated)
            self._db.execute("DELETE FROM running WHERE query_id = ?", (query_id,))
            self._persist_cost(now)
            self.history.append({"t": now, "vr": self.violations / self.completed, "cost": self.total_cost(now)})
            return {"query_id": query_id, "cluster_id": r.cluster_id, "violated": violated,
                    "predicted_latency_s": None if not np.isfinite(r.predicted_s) else r.predicted_s}

    def put_cluster(self, cluster_id: str, size: int) -> dict[str, Any]:
        """Add a cluster (or resize an idle one), e.g. after a spin-up."""
        from sloctl.control.billing import BillingTimer
        from sloctl.control.router import ClusterState

        with self.lock:
            current = self.clusters.get(cluster_id)
            if current is not None and current.size == size:
                return {"cluster_id": cluster_id, "size": size, "changed": False}
            if current is not None:
                self._check_idle(cluster_id)
                self._retire_cost(cluster_id)
            self.clusters[cluster_id] = ClusterState(cluster_id, size, BillingTimer(self.cfg.router.minimum_s),
                                                     self.cfg.router.price_per_unit_s)
            self._persist_cost(self.now_s())
            return {"cluster_id": cluster_id, "size": size, "changed": True}

    def delete_cluster(self, cluster_id: str) -> dict[str, Any]:
        """Retire an idle cluster (its accrued cost stays in the total)."""
        with self.lock:
            if cluster_id not in self.clusters:
                raise RuntimeError_(f"unknown cluster {cluster_id!r}", status=404, field="cluster_id")
            self._check_idle(cluster_id)
            self._retire_cost(cluster_id)
            del self.clusters[cluster_id]
            self._db.execute("DELETE FROM cost WHERE cluster_id = ?", (cluster_id,))
            self._persist_cost(self.now_s())
            return {"cluster_id": cluster_id, "retired": True}

    def _check_idle(self, cluster_id: str) -> None:
        busy = [r.query_id for r in self.running.values() if r.cluster_id == cluster_id]
        if busy:
            raise RuntimeError_(f"cluster {cluster_id!r} still runs {len(busy)} queries", status=409,
                                field="cluster_id")

    def _retire_cost(self, cluster_id: str) -> None:
        self.cost_offset["_retired"] = self.cost_offset.get("_retired", 0.0) + self.cost(cluster_id, self.now_s())
        self.cost_offset.pop(cluster_id, None)

    def cost(self, cluster_id: str, now: float) -> float:
        c = self.clusters[cluster_id]
        return self.cost_offset.get(cluster_id, 0.0) + c.price_per_unit_s * c.size * c.timer.active_s(now)

    def total_cost(self, now: float) -> float:
        return self.cost_offset.get("_retired", 0.0) + sum(self.cost(cid, now) for cid in self.clusters)

    def _persist_cost(self, now: float) -> None:
        rows = [(cid, self.cost(cid, now)) for cid in self.clusters]
        rows.append(("_retired", self.cost_offset.get("_retired", 0.0)))
        self._db.executemany("INSERT INTO cost VALUES (?, ?) ON CONFLICT(cluster_id) DO UPDATE SET accrued = "
                             "excluded.accrued", rows)

    def clusters_view(self) -> dict[str, Any]:
        with self.lock:
            now = self.now_s()
            return {"clusters": [{"cluster_id": cid, "size": c.size, "running": sorted(
                r.query_id for r in self.running.values() if r.cluster_id == cid),
                "accrued_cost": self.cost(cid, now)} for cid, c in self.clusters.items()],
                "total_cost": self.total_cost(now), "completed": self.completed,
                "violation_rate": self.violations / self.completed if self.completed else 0.0,
                "model": self.router_kind, "reconciled": dict(self.reconciled)}

    def close(self) -> None:
        with self.lock:
            self._persist_cost(self.now_s())
            self._db.close()


def load_templates_table(path: str | Path | None):
    """One row per template (plan features) from a query log, or None without a log."""
    if path is None:
        return None
    from sloctl.datasets.querylog import read_log

    log = read_log(path)
    return log.drop_duplicates("template").reset_index(drop=True)
