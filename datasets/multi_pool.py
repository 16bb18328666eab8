"""Several cluster pools behind one: each cluster id belongs to the pool that runs it.

The SLO gateway drives one :class:`~sloctl.datasets.pool.ClusterPool`. When
its clusters are of several kinds (DuckDB workers, PostgreSQL servers, Trino
coordinators), :class:`MultiPool` holds one pool per kind and sends every
call about a cluster to the pool that owns it; :meth:`MultiPool.completions`
gathers the completions of all of them. A cluster id is owned by the pool
that :meth:`MultiPool.own` names for it, else by the ``default`` pool (the
one the autoscaler's spin-ups go to).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.pool import ClusterInfo, QueryCompletion, QueryRequest

__all__ = ["MultiPool"]


class MultiPool:
    """One pool interface over several pools (see the module docstring).

    Args:
        pools: the pools by name (e.g. ``{"duckdb": ..., "postgresql": ...}``).
        default: the name of the pool that owns every cluster id no other pool
            was given (``None``: such an id is refused).

    Raises:
        ClusterPoolError: ``pools`` is empty or ``default`` names none of them.
    """

    def __init__(self, pools: Mapping[str, Any], default: str | None = None) -> None:
        if not pools:
            raise ClusterPoolError("The 'pools' parameter of MultiPool must name at least one pool.")
        if default is not None and default not in pools:
            raise ClusterPoolError(f"The 'default' parameter of MultiPool must name one of {sorted(pools)}, "
                                   f"got {default!r}.")
        self.pools = dict(pools)
        self.default = default
        self._owner: dict[str, str] = {}

    def own(self, cluster_id: str, pool: str) -> None:
        """Let ``pool`` own ``cluster_id`` (before its :meth:`spin_up`)."""
        if pool not in self.pools:
            raise ClusterPoolError(f"The 'pool' parameter must name one of {sorted(self.pools)}, got {pool!r}.")
        self._owner[cluster_id] = pool

    def add(self, name: str, pool: Any, cluster_ids: tuple[str, ...] = ()) -> None:
        """Add ``pool`` under ``name`` at run time, owning ``cluster_ids``."""
        if name in self.pools:
            raise ClusterPoolError(f"The 'name' parameter must be a new pool name, got {name!r} (already used).")
        self.pools[name] = pool
        for cid in cluster_ids:
            self._owner[cid] = name

    def remove(self, name: str) -> None:
        """Close the pool ``name`` and forget it and the cluster ids it owned (never the default pool)."""
        if name not in self.pools or name == self.default:
            raise ClusterPoolError(f"The 'name' parameter must name a pool other than the default, got {name!r} "
                                   f"(pools: {sorted(self.pools)}).")
        pool = self.pools.pop(name)
        for cid in [c for c, owner in self._owner.items() if owner == name]:
            del self._owner[cid]
        pool.close()

    def kind_of(self, cluster_id: str) -> str:
        """The name of the pool that owns ``cluster_id``."""
        name = self._owner.get(cluster_id, self.default)
        if name is None:
            raise ClusterPoolError(f"Unknown cluster {cluster_id!r}: no pool owns it "
                                   f"(known: {sorted(self._owner)}).")
        return name

    def pool_of(self, cluster_id: str) -> Any:
        """The pool that owns ``cluster_id``."""
        return self.pools[self.kind_of(cluster_id)]

    # -- ClusterPool -------------------------------------------------------
    def spin_up(self, size: int, *, cluster_id: str | None = None, **options: Any) -> str:
        """Start (or attach) ``cluster_id`` on its pool; an id no pool owns goes to the default pool."""
        if cluster_id is None:
            if self.default is None:
                raise ClusterPoolError("The 'cluster_id' parameter is required: this MultiPool has no default pool.")
            cid = self.pools[self.default].spin_up(size, **options)
            self._owner[cid] = self.default
            return cid
        return self.pool_of(cluster_id).spin_up(size, cluster_id=cluster_id, **options)

    def wait_ready(self, cluster_id: str, timeout_s: float | None = None) -> ClusterInfo:
        return self.pool_of(cluster_id).wait_ready(cluster_id, timeout_s=timeout_s)

    def submit(self, cluster_id: str, request: QueryRequest) -> None:
        self.pool_of(cluster_id).submit(cluster_id, request)

    def credit(self, cluster_id: str, query_id: int, pages: int = 1) -> None:
        self.pool_of(cluster_id).credit(cluster_id, query_id, pages)

    def explain(self, cluster_id: str, sql: str, timeout_s: float = 5.0) -> str | None:
        return self.pool_of(cluster_id).explain(cluster_id, sql, timeout_s=timeout_s)

    def cancel(self, cluster_id: str, query_id: int) -> None:
        self.pool_of(cluster_id).cancel(cluster_id, query_id)

    def tear_down(self, cluster_id: str, **options: Any) -> None:
        self.pool_of(cluster_id).tear_down(cluster_id, **options)

    def health(self, cluster_id: str) -> dict[str, Any]:
        """The owning pool's health check of ``cluster_id`` (a pool without one: its cluster state)."""
        pool = self.pool_of(cluster_id)
        if hasattr(pool, "health"):
            return pool.health(cluster_id)
        info = next((c for c in pool.clusters() if c.cluster_id == cluster_id), None)
        ok = info is not None and info.state == "ready"
        return {"ok": ok, "error": "" if ok else (info.failure or info.state if info else "unknown cluster")}

    def completions(self, timeout_s: float | None = None) -> list[QueryCompletion]:
        """Completions of every pool since the last call, waiting up to ``timeout_s`` for the first."""
        pools = list(self.pools.values())
        if len(pools) == 1:
            return pools[0].completions(timeout_s=timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            out = [c for pool in pools for c in pool.completions(timeout_s=0)]
            if out:
                return out
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            # wait on each pool in turn for a short slice, so that no pool's completion waits long
            step = 0.01 if left is None else max(0.0, min(0.01, left / len(pools)))
            for pool in pools:
                got = pool.completions(timeout_s=step)
                if got:
                    return got + [c for other in pools if other is not pool for c in other.completions(timeout_s=0)]

    def clusters(self) -> list[ClusterInfo]:
        """Every cluster of every pool."""
        return [info for pool in self.pools.values() for info in pool.clusters()]

    def close(self) -> None:
        """Close every pool (each even when another fails; the first failure is raised)."""
        first: BaseException | None = None
        for pool in self.pools.values():
            try:
                pool.close()
            except BaseException as exc:  # noqa: BLE001 - the others must still close
                first = first or exc
        if first is not None:
            raise first
