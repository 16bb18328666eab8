"""The control core under both front doors: model slots, the router, the reactive autoscaler.

``sloctl serve`` (:mod:`sloctl.serving.runtime`) and ``sloctl gateway``
(:mod:`sloctl.serving.gateway`) translate different protocols into the same
decisions. Each owns one :class:`Controller` over its
:class:`~sloctl.control.managed.ManagedPool`, and the controller does what
they would otherwise both write:

* **Model slots.** A :class:`ModelSlot` follows one registry alias
  (``models:/iconq@champion``, a policy's alias) and keeps the last good
  object loaded from it; :meth:`Controller.poll` asks every slot.
* **The latency model in force.** Iconq+ first, then Stage, each only when a
  template table is at hand; then a model the caller gave; else none
  (:meth:`Controller.latency_model`).
* **The router.** Built by :func:`sloctl.registry.routers.build_router`; on
  a new model, queries already running are re-committed on it at their
  arrival (:meth:`Controller.build_router`), so the new model sees the load
  the old one placed.
* **The reactive autoscaler** (AutoSLO §6): assembled by
  :func:`sloctl.control.autoscaler.autoscaler_for` over the router in force,
  its size selector on a :class:`~sloctl.control.background.BackgroundSizer`,
  its observation windows carried over a swap
  (:meth:`Controller.build_autoscaler`).

What stays in a door is its protocol and its state: HTTP resources, durable
state and replicas in the runtime; Trino sessions, queues, result pages and
retries in the gateway. Constructors do no I/O: the slots load on the first
:meth:`Controller.poll`, and :meth:`Controller.close` stops the sizer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig, autoscaler_for
from sloctl.control.background import BackgroundSizer
from sloctl.control.managed import ManagedPool
from sloctl.control.router import IconqRouter, StageCostRouter
from sloctl.core.config import RouterSection
from sloctl.core.kinds import ModelKind, RouterKind
from sloctl.datasets.querylog import read_log, template_table
from sloctl.registry.routers import BuiltRouter, build_router, router_templates
from sloctl.registry.store import connect, load_model, load_policy

__all__ = ["LATENCY", "Controller", "LatencyChoice", "ModelSlot", "PoolBackend", "load_templates_table",
           "registered_names", "reopen_if_replaced"]

#: The slot kind of a latency model (a policy slot's kind is its document's, e.g. ``retry-policy``).
LATENCY = "latency"


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
    kind: str  # LATENCY, or the policy kind the alias must hold (RetryPolicy.kind, ...)
    version: str | None = None
    value: Any = None
    error: str | None = None
    loaded_at: float | None = None
    swaps: int = 0
    load_failures: int = 0  # versions that failed to load (``sloctl_model_load_failures_total``)

    def refresh(self) -> bool:
        """Load the alias's version if it moved; returns True on a swap. Never raises.

        An alias back on the version in use clears the error of a failed
        load; a registry file replaced since the last look (new inode, or an
        older mtime) is reopened first.
        """
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        name, alias = _parse_uri(self.uri)
        try:
            reopen_if_replaced(self.tracking_uri)
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
            self.error = None  # the alias names what we serve: an earlier failure is over
            return False
        try:
            uri = f"models:/{name}/{version}"
            value = (load_model(uri, tracking_uri=self.tracking_uri) if self.kind == LATENCY
                     else load_policy(uri, tracking_uri=self.tracking_uri, kind=self.kind))
        except Exception as exc:  # a bad version: keep the last good one and say so
            self.load_failures += 1
            self.error = f"version {version} failed to load ({type(exc).__name__}: {str(exc)[:300]}); " \
                         f"serving version {self.version}"
            return False
        self.value, self.version, self.error, self.loaded_at = value, version, None, time.time()
        self.swaps += 1
        return True

    def status(self) -> dict[str, Any]:
        return {"uri": self.uri, "version": self.version, "loaded": self.value is not None, "error": self.error,
                "swaps": self.swaps, "load_failures": self.load_failures}


def registered_names(tracking_uri: str, prefix: str, *, limit: int = 10_000) -> frozenset[str]:
    """The registered model names starting with ``prefix``, ``prefix`` removed (at most ``limit``).

    One registry search (a page per 1,000 names). A door asks this to learn
    which names exist before it follows one: a slot per name a client made up
    would be polled for ever.

    Raises:
        Exception: whatever the registry raises when it cannot be read (the caller keeps what it knew).
    """
    from mlflow import MlflowClient

    reopen_if_replaced(tracking_uri)
    connect(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    escaped = prefix.replace("'", "''")
    names: set[str] = set()
    token = None
    while len(names) < limit:
        page = client.search_registered_models(filter_string=f"name LIKE '{escaped}%'", max_results=1000,
                                               page_token=token)
        names.update(m.name[len(prefix):] for m in page if m.name.startswith(prefix) and len(m.name) > len(prefix))
        token = page.token
        if not token:
            break
    return frozenset(sorted(names)[:limit])


_REGISTRY_FILES: dict[str, tuple[int, int, int]] = {}  # tracking URI -> (device, inode, mtime_ns) last seen


def reopen_if_replaced(tracking_uri: str) -> bool:
    """Drop MLflow's pooled connections to a ``sqlite:///`` registry whose file was replaced; True if it did.

    A file replaced by another (``mv new.db mlflow.db``: a new inode) or by an
    older copy (mtime going back) would otherwise keep being read through
    connections to the deleted file.
    """
    if not tracking_uri.startswith("sqlite:///"):
        return False
    try:
        st = os.stat(tracking_uri.removeprefix("sqlite:///"))
    except OSError:
        return False
    seen = _REGISTRY_FILES.get(tracking_uri)
    now = (st.st_dev, st.st_ino, st.st_mtime_ns)
    _REGISTRY_FILES[tracking_uri] = now
    if seen is None or (seen[:2] == now[:2] and now[2] >= seen[2]):
        return False
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    for store in (TrackingStore, RegistryStore):
        engine = getattr(store, "_engine_map", {}).get(tracking_uri)
        if engine is not None:
            engine.dispose()  # the next query opens the file now at that path
    return True


def load_templates_table(path: str | Path | None):
    """One row per template (plan features, :func:`~sloctl.datasets.querylog.template_table`) of a query log.

    ``None`` without a log: the router then uses the table inside the model bundle.
    """
    if path is None:
        return None
    return template_table(read_log(path))


class PoolBackend:
    """The managed pool's spin-ups and teardowns as real DuckDB cluster processes.

    Spun-up clusters are named ``auto{n}-s{size}``, ``n`` the number of
    clusters started so far; their readiness is polled by the driver. A size
    that does not fit raises :class:`~sloctl.core.errors.ClusterPoolError`,
    which the pool records as refused.
    """

    def __init__(self, pool: Any, started: int) -> None:
        self.pool = pool
        self.started = started

    def spin_up(self, size: int, now_s: float) -> tuple[str, None]:
        cid = f"auto{self.started}-s{size}"
        self.pool.spin_up(size, cluster_id=cid)
        self.started += 1
        return cid, None

    def tear_down(self, cluster_id: str, now_s: float) -> None:
        self.pool.tear_down(cluster_id)


@dataclass(frozen=True)
class LatencyChoice:
    """The latency model to route with: its kind, the object, and where it came from.

    ``slot`` names the slot it was loaded from (``None``: given by the caller,
    or no model); ``kind`` is :attr:`RouterKind.ROUND_ROBIN` without a model.
    """

    kind: RouterKind
    predictor: Any = None
    slot: str | None = None
    source: str | None = None


def _no_what_if(model: Any) -> Any:
    raise ValueError("The Spinup Size Selector needs a latency model; routing is round-robin.")


class Controller:
    """Model slots, the router and the reactive autoscaler of one front door (see the module docstring).

    Args:
        pool: the managed pool the door drives; the controller sets its
            ``router`` (unless the door wraps it) and its ``autoscaler``.
        router_cfg: the ``router:`` section (margin, cost tolerance, billing).
        templates: the template table to route with; ``None``: each bundle's.
        given: a latency model to route with when no slot holds one (tests,
            experiments); a loaded slot takes precedence.
    """

    def __init__(self, pool: ManagedPool, router_cfg: RouterSection, *, templates: Any = None,
                 given: Any = None) -> None:
        self.pool = pool
        self.router_cfg = router_cfg
        self.templates = templates
        self.given = given
        self.slots: dict[str, ModelSlot] = {}
        self.built: BuiltRouter | None = None
        self.choice = LatencyChoice(RouterKind.ROUND_ROBIN)
        self.swaps = 0
        self.reactive = "off"  # what the reactive autoscaler runs, in words (status pages show it)
        self._sizer: BackgroundSizer | None = None

    # -- models ----------------------------------------------------------------------------
    def add_slot(self, name: str, uri: str, tracking_uri: str, kind: str) -> ModelSlot:
        """Follow ``uri`` under ``name``; it loads on the next :meth:`poll`."""
        slot = ModelSlot(uri, tracking_uri, kind)
        self.slots = {**self.slots, name: slot}  # a new dict: a poll may be iterating over the old one
        return slot

    def poll(self) -> dict[str, bool]:
        """Ask every slot for its alias's version; which ones swapped. Never raises (a slot records its error)."""
        return {name: slot.refresh() for name, slot in self.slots.items()}

    def latency_model(self) -> LatencyChoice:
        """Iconq+, then Stage (each when a template table is at hand), then the given model, else none."""
        for kind in (ModelKind.ICONQ, ModelKind.STAGE):
            slot = self.slots.get(kind)
            if slot is not None and slot.value is not None and router_templates(slot.value, self.templates) is not None:
                return LatencyChoice(RouterKind(ModelKind.of(slot.value)), slot.value, kind,
                                     f"{kind}:{slot.uri} v{slot.version}")
        if self.given is not None:
            return LatencyChoice(RouterKind(ModelKind.of(self.given)), self.given, None, "given")
        return LatencyChoice(RouterKind.ROUND_ROBIN)

    def templates_for(self, slot: str | None) -> Any:
        """The template table the model of ``slot`` routes with (``None``: the door's own table)."""
        if slot is None:
            return self.templates
        return router_templates(self.slots[slot].value, self.templates)

    # -- router ----------------------------------------------------------------------------
    def build_router(self, choice: LatencyChoice, now_s: float) -> tuple[BuiltRouter, set[int]]:
        """Build the router of ``choice`` and re-commit the running queries on its model.

        Running queries are re-committed in arrival order, each at its own
        arrival, on the cluster it runs on; a template the new table lacks is
        left alone. Returns the router and the ids re-committed.
        """
        built = build_router(choice.predictor, self.router_cfg, templates=self.templates,
                             use_iconq=choice.kind == RouterKind.ICONQ)
        self.built, self.choice = built, choice
        self.swaps += 1
        committed: set[int] = set()
        if built.online is None:
            return built, committed
        known = None if built.templates is None else set(built.templates["template"])
        for r in sorted(self.pool.running.values(), key=lambda r: r.query.arrival_s):
            if known is None or r.query.template in known:
                c = self.pool.clusters[r.cluster_id]
                r.predicted_s = built.online.commit(r.query.query_id, r.query.template, r.query.arrival_s,
                                                    r.query.slo_s, r.cluster_id, c.size, now_s)
                committed.add(r.query.query_id)
        return built, committed

    def warm(self, now_s: float) -> None:
        """Compute each template's features on each cluster size now, not on a client's first query.

        The first prediction of a model loads its runtime (torch for Iconq+,
        seconds on a busy machine); without this the first queries after a
        start or a swap would wait for it.
        """
        built = self.built
        if built is None or built.online is None or built.templates is None:
            return
        import torch  # noqa: F401  (OnlinePredictor.commit imports it, even for Stage)

        sizes = sorted({c.size for c in self.pool.clusters.values()})
        names = list(built.templates["template"])
        for name in names:
            for size in sizes:
                built.online.isolated_s(name, size)
        if built.kind == RouterKind.ICONQ and names:
            built.online.counterfactuals(names[0], now_s, {"warm": sizes[0]}, now_s)

    # -- autoscaler ------------------------------------------------------------------------
    @property
    def sizer(self) -> BackgroundSizer:
        """The size selector's background worker (made on first use)."""
        if self._sizer is None:
            self._sizer = BackgroundSizer()
        return self._sizer

    def build_autoscaler(self, knobs: AutoscalerConfig | None, router: Any, *,
                         without_model: str = "off") -> Autoscaler | None:
        """The reactive autoscaler over ``router`` with ``knobs`` (``None``: none), set on the pool.

        Its spin-up trigger (Algorithm 2) and Spinup Size Selector (Algorithm
        3, mode ``add``) read the router's predictor; the teardown trigger
        retires idle clusters. Without a latency model, ``without_model``
        decides: ``"off"`` (no autoscaler) or ``"teardown"`` (the teardown
        trigger alone). The observation windows of the autoscaler it replaces
        carry over. :attr:`reactive` says what runs.
        """
        if without_model not in ("off", "teardown"):
            raise ValueError(f"without_model must be 'off' or 'teardown', got {without_model!r}.")
        old = self.pool.autoscaler if isinstance(self.pool.autoscaler, Autoscaler) else None
        if knobs is None:
            self.pool.autoscaler, self.reactive = None, "off"
            return None
        built = self.built
        cfg = self.router_cfg
        if built is None or built.online is None:
            if without_model == "off":
                self.pool.autoscaler = None
                self.reactive = "off: no latency model for the spin-up trigger and the size selector"
                return None
            trigger: Any = None
            make_router: Callable[[Any], Any] = _no_what_if
            self.reactive = "teardown only: routing is round-robin, no latency model for the spin-up trigger"
        else:
            trigger = "spinup"
            make_router = self._what_if_router(built)
            self.reactive = f"spin-up trigger, size selector (add) and teardown, over {built.kind}"
        self.pool.autoscaler = autoscaler_for(knobs, router, make_router, trigger=trigger, minimum_s=cfg.minimum_s,
                                              price_per_unit_s=cfg.price_per_unit_s, sizer=self.sizer, carry=old)
        return self.pool.autoscaler

    @staticmethod
    def _what_if_router(built: BuiltRouter) -> Callable[[Any], Any]:
        """A router like ``built``'s over a forked model, for the size selector's what-if simulations."""
        if built.kind != RouterKind.ICONQ:
            return StageCostRouter
        margin, tolerance, spread = built.slo_margin or 0.0, built.cost_tolerance, built.violation_spread

        def make_router(model: Any) -> IconqRouter:
            return IconqRouter(model, slo_margin=margin, cost_tolerance=tolerance, violation_spread=spread)

        return make_router

    def close(self) -> None:
        """Stop the size selector's worker."""
        if self._sizer is not None:
            self._sizer.close()
