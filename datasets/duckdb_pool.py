"""A live warehouse: DuckDB clusters as worker processes with a CPU budget each.

Each cluster is one process that runs every query it receives on a thread of
its own, so queries on one cluster overlap and interfere as they would on a
real warehouse. Start and end times are read in the worker, on the
machine-wide monotonic clock, around the query itself. DuckDB's ``threads``
setting alone does not cap CPU (every running cursor also works on its own
OS thread), so the pool caps it in one of two ways:

* **CPU budgets** (``size_unit_cores`` given): a cluster of size ``N`` may use
  ``N × size_unit_cores`` cores of CPU time, enforced by a cgroup of its own
  (CFS bandwidth, :mod:`sloctl.datasets.cpu_budget`) with a short period, on
  the cores not reserved for the controller (``reserved_cores``); DuckDB's
  ``threads`` is the budget rounded up. The budgets of the live clusters must
  fit in those cores. Where no cgroup hierarchy is writable the pool falls
  back to pinning, says so once, and reports it (:attr:`budget_mode`).
* **Pinning** (the default, and the fallback): a cluster of size ``N`` is
  pinned to ``N`` whole cores (``os.sched_setaffinity``), ``threads = N``; with
  CPU budgets asked for but not enforceable, to the budget rounded up.

Spin-up is real: a process start (interpreter, DuckDB import, database open)
plus a configurable warm-up delay. Clusters get disjoint core sets; a pool
that would need more cores than it may use is refused unless
``allow_oversubscribe`` is set, in which case clusters share the least-used
cores and every completion on them is marked ``oversubscribed``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.cpu_budget import DEFAULT_PERIOD_S, CpuBudget, CpuBudgets, find_cgroup_root
from sloctl.datasets.pool import ClusterInfo, QueryCompletion, QueryRequest

__all__ = ["DuckDBClusterPool"]

@dataclass
class _Cluster:
    cluster_id: str
    size: int
    cores: tuple[int, ...]
    process: subprocess.Popen
    requested_s: float
    oversubscribed: bool
    state: str = "starting"
    ready_s: float | None = None
    failure: str = ""
    cpu_budget: float = float("nan")
    cgroup: CpuBudget | None = None
    running: set[int] = field(default_factory=set)
    send_lock: threading.Lock = field(default_factory=threading.Lock)


class DuckDBClusterPool:
    """:class:`~sloctl.datasets.pool.ClusterPool` over a DuckDB database file.

    Args:
        db_path: the database (opened read-only by every cluster).
        warmup_s: delay added to each spin-up after the process is ready.
        allow_oversubscribe: share cores instead of refusing a cluster that
            does not fit; completions on shared cores are marked.
        cores: the cores the pool may use (default: this process's affinity).
        size_unit_cores: CPU budget of one size unit, in cores (e.g. 0.25);
            ``None`` pins ``size`` whole cores per cluster (no budgets).
        reserved_cores: with budgets, how many of ``cores`` (the first ones)
            are kept for the controller; clusters run on the others.
        budget_mode: ``"auto"`` (cgroups where writable, else pinning, said
            once), ``"cgroup"`` (refuse to start without them) or
            ``"pinning"``; ignored without ``size_unit_cores``.
        period_s: CFS period of the budgets (short: throttling stalls stay short).
        cgroup_root: where to make the groups (default: found on the machine).
        log: where the one-time fallback notice goes (default: stderr).
    """

    def __init__(self, db_path: str | Path, *, warmup_s: float = 0.0,
                 allow_oversubscribe: bool = False, cores: list[int] | None = None,
                 size_unit_cores: float | None = None, reserved_cores: int = 0, budget_mode: str = "auto",
                 period_s: float = DEFAULT_PERIOD_S, cgroup_root: Any = None,
                 log: Any = None) -> None:
        self.db_path = Path(db_path)
        self.warmup_s = warmup_s
        self.allow_oversubscribe = allow_oversubscribe
        self.cores = cores
        self.size_unit_cores = size_unit_cores
        self.reserved_cores = reserved_cores
        self.period_s = period_s
        if not self.db_path.is_file():
            raise ClusterPoolError(f"The 'db_path' parameter names no database file: {self.db_path}.")
        if warmup_s < 0:
            raise ClusterPoolError(f"The 'warmup_s' parameter must be >= 0, got {warmup_s!r}.")
        if size_unit_cores is not None and not 0 < size_unit_cores <= 64:
            raise ClusterPoolError(f"The 'size_unit_cores' parameter must be in (0, 64] cores, "
                                   f"got {size_unit_cores!r}.")
        if budget_mode not in ("auto", "cgroup", "pinning"):
            raise ClusterPoolError(f"The 'budget_mode' parameter must be 'auto', 'cgroup' or 'pinning', "
                                   f"got {budget_mode!r}.")
        if not 0.001 <= period_s <= 1.0:
            raise ClusterPoolError(f"The 'period_s' parameter must be in [0.001, 1] seconds, got {period_s!r}.")
        allowed = tuple(sorted(cores if cores is not None else os.sched_getaffinity(0)))
        if isinstance(reserved_cores, bool) or not isinstance(reserved_cores, int) or reserved_cores < 0:
            raise ClusterPoolError(f"The 'reserved_cores' parameter must be an integer >= 0, got {reserved_cores!r}.")
        if size_unit_cores is not None and reserved_cores >= len(allowed):
            raise ClusterPoolError(
                f"The 'reserved_cores' parameter ({reserved_cores}) leaves no core for clusters: this pool may use "
                f"{len(allowed)} core(s) {list(allowed)}. Reserve fewer (warehouse.reserved_cores).")
        self._cores = allowed[reserved_cores:] if size_unit_cores is not None else allowed
        self.reserved = allowed[:reserved_cores] if size_unit_cores is not None else ()
        self._budgets: CpuBudgets | None = None
        self.budget_mode = "pinning"
        self.budget_note = "" if size_unit_cores is None else "CPU budgets off (budget_mode: pinning)"
        if size_unit_cores is not None and budget_mode != "pinning":
            root = cgroup_root if cgroup_root is not None else find_cgroup_root()
            if root is None:
                self.budget_note = ("no writable cgroup hierarchy with the cpu controller: CPU budgets are not "
                                    "enforced; each cluster is pinned to its budget rounded up to whole cores")
                if budget_mode == "cgroup":
                    raise ClusterPoolError(f"budget_mode 'cgroup': {self.budget_note}.")
                (log or (lambda m: print(m, file=sys.stderr)))(f"warning: {self.budget_note}")
            else:
                self._budgets = CpuBudgets(root, period_s=period_s)
                self._budgets.remove_stale()
                self.budget_mode = "cgroup"
                self.budget_note = f"cgroup v{root.version} CPU budgets under {self._budgets.parent}"
        self._completions: queue.Queue[QueryCompletion] = queue.Queue()
        self._clusters: dict[str, _Cluster] = {}
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._closed = False

    # -- CPU allocation --------------------------------------------------
    def budget_cores(self, size: int) -> float:
        """The CPU a cluster of ``size`` may use, in cores."""
        return size * self.size_unit_cores if self.size_unit_cores is not None else float(size)

    def _allocate_budget(self, size: int) -> tuple[tuple[int, ...], bool]:
        """Budgets: every cluster runs on all the pool's cores; their budgets must fit in them."""
        live = [c for c in self._clusters.values() if c.state in ("starting", "ready")]
        held = sum(c.cpu_budget for c in live)
        want = self.budget_cores(size)
        if held + want > len(self._cores) + 1e-9:
            if not self.allow_oversubscribe:
                raise ClusterPoolError(
                    f"A cluster of size {size} needs a CPU budget of {want:g} cores "
                    f"({size} × {self.size_unit_cores:g}), but only {max(0.0, len(self._cores) - held):g} of the "
                    f"{len(self._cores)} cluster cores {list(self._cores)} are free ({held:g} held by {len(live)} "
                    f"cluster(s); {len(self.reserved)} core(s) {list(self.reserved)} reserved for the controller). "
                    "Tear a cluster down, use smaller sizes, or allow oversubscription "
                    "(--allow-oversubscribe), which marks every row it affects.")
            for c in live:
                c.oversubscribed = True
            return self._cores, True
        return self._cores, False

    def _allocate(self, size: int) -> tuple[tuple[int, ...], bool]:
        if self._budgets is not None:
            return self._allocate_budget(size)
        needed = size
        if self.size_unit_cores is not None:  # budgets asked for, not enforceable: pin the budget rounded up
            needed = max(1, math.ceil(self.budget_cores(size) - 1e-9))
        live = [c for c in self._clusters.values() if c.state in ("starting", "ready")]
        used = {core for c in live for core in c.cores}
        free = [core for core in self._cores if core not in used]
        if needed <= len(free):
            return tuple(free[:needed]), False
        if not self.allow_oversubscribe:
            raise ClusterPoolError(
                f"A cluster of size {size} needs {needed} free cores, but only {len(free)} of the "
                f"{len(self._cores)} cores this pool may use are free "
                f"({sum(len(c.cores) for c in live)} held by {len(live)} running cluster(s)). "
                "Tear a cluster down, use smaller sizes, or allow oversubscription "
                "(--allow-oversubscribe), which marks every row it affects."
            )
        load = {core: 0 for core in self._cores}
        for c in live:
            for core in c.cores:
                load[core] += 1
        chosen = sorted(self._cores, key=lambda core: (load[core], core))[: min(needed, len(self._cores))]
        for c in live:
            if set(c.cores) & set(chosen):
                c.oversubscribed = True
        return tuple(sorted(chosen)), True

    # -- ClusterPool -------------------------------------------------------
    def spin_up(self, size: int, *, cluster_id: str | None = None) -> str:
        """Start a cluster process pinned to ``size`` cores; return its id."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ClusterPoolError(f"The 'size' parameter must be an integer >= 1, got {size!r}.")
        with self._cond:
            if self._closed:
                raise ClusterPoolError("The pool is closed.")
            cluster_id = cluster_id or f"c{next(self._ids)}-s{size}"
            if cluster_id in self._clusters and self._clusters[cluster_id].state != "stopped":
                raise ClusterPoolError(f"The 'cluster_id' {cluster_id!r} is already in use.")
            cores, oversubscribed = self._allocate(size)
            budget = self.budget_cores(size) if self._budgets is not None else float(len(cores))
            cgroup = self._budgets.create(cluster_id, budget) if self._budgets is not None else None
            threads = max(1, math.ceil(budget - 1e-9))
            command = [sys.executable, "-m", "sloctl.datasets._cluster_worker", "--db", str(self.db_path),
                       "--size", str(threads), "--cores", ",".join(map(str, cores)), "--warmup-s", repr(self.warmup_s)]
            if cgroup is not None:
                command += ["--cgroup-procs", str(cgroup.procs_file)]
            try:
                process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                           bufsize=1)
            except OSError:
                if cgroup is not None:
                    self._budgets.remove(cgroup)
                raise
            cluster = _Cluster(
                cluster_id=cluster_id, size=size, cores=cores, process=process,
                requested_s=time.monotonic(),
                oversubscribed=oversubscribed or (cgroup is None and threads > len(cores)),
                cpu_budget=budget, cgroup=cgroup)
            self._clusters[cluster_id] = cluster
            threading.Thread(target=self._read_results, args=(cluster,), daemon=True,
                             name=f"sloctl-pool-{cluster_id}").start()
        return cluster_id

    def wait_ready(self, cluster_id: str, timeout_s: float | None = None) -> ClusterInfo:
        """Block until the cluster is ready; raise if it failed or timed out."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            cluster = self._get(cluster_id)
            while cluster.state == "starting":
                if cluster.process.poll() is not None:
                    cluster.state, cluster.failure = "failed", f"exit code {cluster.process.returncode}"
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ClusterPoolError(f"Cluster {cluster_id!r} was not ready after {timeout_s} s.")
                self._cond.wait(timeout=0.2 if remaining is None else min(remaining, 0.2))
            if cluster.state != "ready":
                raise ClusterPoolError(
                    f"Cluster {cluster_id!r} failed to start ({cluster.failure or cluster.state}).")
            return self._info(cluster)

    def submit(self, cluster_id: str, request: QueryRequest) -> None:
        """Hand ``request`` to the cluster; it starts on a thread of its own."""
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state != "ready":
                raise ClusterPoolError(
                    f"Cluster {cluster_id!r} is {cluster.state}; queries need a ready cluster.")
            cluster.running.add(request.query_id)
        self._send(cluster, {"op": "run", "query_id": request.query_id, "sql": request.sql,
                             "timeout_s": request.timeout_s, **({"fetch": True} if request.fetch else {})})

    def cancel(self, cluster_id: str, query_id: int) -> None:
        """Interrupt ``query_id`` on ``cluster_id``; it completes as ``error`` (``pool.CANCELLED``).

        A query that already finished (or never ran there) is left alone.
        """
        with self._cond:
            cluster = self._get(cluster_id)
            if query_id not in cluster.running or cluster.state != "ready":
                return
        self._send(cluster, {"op": "cancel", "query_id": query_id})

    def completions(self, timeout_s: float | None = None) -> list[QueryCompletion]:
        """Completions since the last call, waiting up to ``timeout_s`` for the first."""
        out: list[QueryCompletion] = []
        try:
            out.append(self._completions.get(timeout=timeout_s))
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self._completions.get_nowait())
            except queue.Empty:
                return out

    def tear_down(self, cluster_id: str, timeout_s: float = 15.0) -> None:
        """Stop the cluster's process; its cores become free again."""
        with self._cond:
            cluster = self._get(cluster_id)
            stopped = cluster.state == "stopped"
        if stopped:  # the worker already exited; its group may still be there
            if cluster.process.poll() is not None:
                self._release_cgroup(cluster)
            return
        if cluster.process.poll() is None:
            self._send(cluster, {"op": "stop"})
            try:
                cluster.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                cluster.process.kill()
                cluster.process.wait(timeout=5)
        with self._cond:
            cluster.state = "stopped"
            if cluster.process.stdin is not None:
                cluster.process.stdin.close()
            self._cond.notify_all()
        self._release_cgroup(cluster)

    def _release_cgroup(self, cluster: _Cluster) -> None:
        if cluster.cgroup is not None and self._budgets is not None:
            try:
                self._budgets.remove(cluster.cgroup)
            except ClusterPoolError as exc:  # a stray process still in it: the next pool's start removes it
                print(f"warning: {exc}", file=sys.stderr)
            cluster.cgroup = None

    def clusters(self) -> list[ClusterInfo]:
        """Every cluster this pool started, in start order."""
        with self._cond:
            return [self._info(c) for c in self._clusters.values()]

    def close(self) -> None:
        """Tear down every cluster and stop the result reader."""
        for cluster_id in list(self._clusters):
            self.tear_down(cluster_id)
        with self._cond:
            self._closed = True

    def __enter__(self) -> DuckDBClusterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------
    def _get(self, cluster_id: str) -> _Cluster:
        try:
            return self._clusters[cluster_id]
        except KeyError:
            raise ClusterPoolError(
                f"Unknown cluster {cluster_id!r} (known: {', '.join(self._clusters) or 'none'})."
            ) from None

    @staticmethod
    def _info(c: _Cluster) -> ClusterInfo:
        return ClusterInfo(cluster_id=c.cluster_id, size=c.size, cores=c.cores, state=c.state,
                           requested_s=c.requested_s, ready_s=c.ready_s, running=len(c.running),
                           oversubscribed=c.oversubscribed, cpu_budget=c.cpu_budget)

    @staticmethod
    def _send(cluster: _Cluster, message: dict[str, Any]) -> None:
        line = json.dumps(message) + "\n"
        with cluster.send_lock:
            try:
                cluster.process.stdin.write(line)
                cluster.process.stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as exc:
                if message["op"] != "stop":
                    raise ClusterPoolError(
                        f"Cluster {cluster.cluster_id!r} is gone ({exc}).") from exc

    def _read_results(self, cluster: _Cluster) -> None:
        """Follow one worker's stdout until it exits."""
        for line in cluster.process.stdout:
            message = json.loads(line)
            kind = message["kind"]
            with self._cond:
                if kind == "done":
                    cluster.running.discard(message["query_id"])
                    self._completions.put(QueryCompletion(
                        query_id=message["query_id"], cluster_id=cluster.cluster_id,
                        start_s=message["start_s"], end_s=message["end_s"],
                        status=message["status"], error=message["error"],
                        rows=message["rows"], oversubscribed=cluster.oversubscribed,
                        cpu_budget=cluster.cpu_budget,
                        columns=(tuple((str(n), str(t)) for n, t in message["columns"])
                                 if "columns" in message else None),
                        data=message.get("data")))
                elif kind == "ready":
                    cluster.state, cluster.ready_s = "ready", message["t"]
                elif kind == "failed":
                    cluster.state, cluster.failure = "failed", message["error"]
                self._cond.notify_all()
        cluster.process.stdout.close()
        with self._cond:
            if cluster.state in ("starting", "ready"):
                cluster.state = "failed" if cluster.state == "starting" else "stopped"
                cluster.failure = cluster.failure or "worker exited"
            self._cond.notify_all()
