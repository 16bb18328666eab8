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

Client SQL runs only in the workers, each sealed in DuckDB's sandbox (see
:mod:`sloctl.datasets._cluster_worker`): read-only, no files outside its own
temp folder, no network, no extensions, settings locked, one ``SELECT`` or
``EXPLAIN`` per request, memory and spilling bounded by ``memory_limit``,
``temp_dir_limit`` and the attempt's ``timeout_s``. Results come back whole
(``fetch``) or in pages under credit-based flow control (``stream``), and
:meth:`DuckDBClusterPool.explain` plans a statement on a worker. A worker that
dies marks its cluster ``failed`` and ends every query on it as ``error``;
those completions are handed out before :meth:`DuckDBClusterPool.clusters`
shows the cluster ``failed`` (for up to a second), so a caller that reads
completions first learns why its queries ended from the completions.

**Memory bounded by bytes.** DuckDB's ``memory_limit`` does not count every
allocation, so each worker with a ``memory_limit`` (the scratch worker too)
also runs under an operating-system bound a margin above it
(:mod:`sloctl.datasets.memory_bound`): a memory cgroup where one is writable
(the kernel kills a worker that passes it), and ``RLIMIT_DATA`` a little above
(an allocation past it fails at once). Either way its queries end as
``OutOfMemoryException``: a worker killed at its bound ends every query it ran with
``"OutOfMemoryException: ... exceeded its memory bound ..."``, never as a
worker that merely stopped, so a caller fails them rather than retrying them
elsewhere. :attr:`DuckDBClusterPool.memory_mode` and ``memory_note`` say
which mechanism holds, and each cluster's ``memory_bound`` its bytes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.cpu_budget import DEFAULT_PERIOD_S, CpuBudget, CpuBudgets, find_cgroup_root
from sloctl.datasets.memory_bound import (
    MALLOC_ENV,
    MemoryBound,
    MemoryBounds,
    bound_bytes,
    data_limit_bytes,
    find_memory_root,
    size_bytes,
)
from sloctl.datasets.pool import ClusterInfo, QueryCompletion, QueryRequest, RawPage, drain

__all__ = ["DuckDBClusterPool"]

# A DuckDB size: a number and a unit (1000^i or 1024^i bytes), e.g. "2GB", "512 MiB".
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(b|bytes|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)\s*", re.IGNORECASE)
_TORN_DOWN = "cluster torn down while the query ran"  # the worker's words for the same end
#: The head of a worker's page line (``_cluster_worker`` writes it so): query id and row count, then the rows.
_PAGE = re.compile(r'^\{"kind": "page", "query_id": (\d+), "n": (\d+), "rows": ')
#: How long a dead worker's completions wait to be taken before its cluster shows as failed.
_HANDOVER_S = 1.0


def _check_size(name: str, value: Any, *, allow_zero: bool) -> None:
    """Refuse anything DuckDB would not read as a size (its own message comes only from the worker, too late)."""
    if value is None:
        return
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ClusterPoolError(f"The '{name}' parameter must be a DuckDB size such as '2GB' or '512MiB' (units B, KB, "
                               f"MB, GB, TB, KiB, MiB, GiB, TiB), got {value!r}.")
    if float(match.group(1)) <= 0 and not allow_zero:
        raise ClusterPoolError(f"The '{name}' parameter must be > 0, got {value!r}.")


def _exit_text(pid: int, returncode: int | None) -> str:
    if returncode is None:
        return f"worker process {pid} closed its output"
    if returncode < 0:
        try:
            name = f" ({signal.Signals(-returncode).name})"
        except ValueError:
            name = ""
        return f"worker process {pid} was killed by signal {-returncode}{name}"
    return f"worker process {pid} exited with code {returncode}"


def _memory_text(cluster: _Cluster, how: str) -> str:
    """Why a worker killed at its memory bound ended its queries (the class name first, as the worker writes it)."""
    margin = cluster.memory_bound - size_bytes(cluster.memory_limit)
    return (f"OutOfMemoryException: the cluster worker of {cluster.cluster_id} exceeded its memory bound of "
            f"{cluster.memory_bound} bytes (memory_limit {cluster.memory_limit} + margin {margin} bytes) and was "
            f"killed by the operating system ({how}); its cluster failed (the gateway replaces it)")


@dataclass
class _Stream:
    on_page: Callable[[tuple[tuple[str, str], ...], Any], None] | None
    raw: bool = False
    columns: tuple[tuple[str, str], ...] = ()
    rows: int = 0
    error: str = ""  # set when on_page raised: the query is cancelled and ends with this error


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
    temp_dir: Path | None = None
    scratch: bool = False  # the gateway's memory-catalog worker: holds no cores or budget of the clusters
    stopping: bool = False  # tear_down asked for it: an exit is no failure
    streams: dict[int, _Stream] = field(default_factory=dict)
    explains: dict[int, dict | None] = field(default_factory=dict)  # explain id -> the worker's answer, once in
    memory_limit: str | None = None  # DuckDB's memory_limit of the worker
    memory_bound: int | None = None  # the operating system's bound, bytes (None: not bounded)
    memory_group: MemoryBound | None = None  # the cgroup that holds it (None: RLIMIT_DATA or unbounded)
    exited: bool = False  # the worker's output ended: nothing more can be sent to it
    exit_pending: tuple[int, str] | None = None  # (completions put, why): the failure waits for them to be taken


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
        memory_limit: each worker's DuckDB ``memory_limit``, a DuckDB size such
            as ``"2GB"`` (default: DuckDB's own, 80 % of the machine's memory);
            a query that needs more fails as ``OutOfMemoryException``.
        temp_dir_limit: each worker's ``max_temp_directory_size`` (spilling), a
            DuckDB size (default: DuckDB's own, 90 % of the free disk).
        temp_dir: where workers spill, each in a folder of its own that goes
            when its cluster is torn down (default: a fresh folder per pool,
            removed on :meth:`close`).
        integer_division: run every worker with DuckDB's ``integer_division``
            (``/`` between integers truncates, as in Trino; the gateway's).
        memory_mode: how a worker's memory is bounded a margin above its
            ``memory_limit`` (:mod:`sloctl.datasets.memory_bound`): ``"auto"``
            (a memory cgroup where writable, else ``RLIMIT_DATA``, said once),
            ``"cgroup"`` (refuse to start without one) or ``"rlimit"``. A
            worker without a ``memory_limit`` is not bounded.
        memory_cgroup_root: where to make the memory groups (a
            :class:`~sloctl.datasets.memory_bound.MemoryRoot`; default: found
            on the machine).
    """

    def __init__(self, db_path: str | Path, *, warmup_s: float = 0.0,
                 allow_oversubscribe: bool = False, cores: list[int] | None = None,
                 size_unit_cores: float | None = None, reserved_cores: int = 0, budget_mode: str = "auto",
                 period_s: float = DEFAULT_PERIOD_S, cgroup_root: Any = None,
                 log: Any = None, memory_limit: str | None = None, temp_dir_limit: str | None = None,
                 temp_dir: str | Path | None = None, integer_division: bool = False, memory_mode: str = "auto",
                 memory_cgroup_root: Any = None) -> None:
        self.db_path = Path(db_path)
        self.integer_division = bool(integer_division)
        self.warmup_s = warmup_s
        self.allow_oversubscribe = allow_oversubscribe
        self.cores = cores
        self.size_unit_cores = size_unit_cores
        self.reserved_cores = reserved_cores
        self.period_s = period_s
        self.memory_limit = memory_limit
        self.temp_dir_limit = temp_dir_limit
        self.temp_dir = None if temp_dir is None else Path(temp_dir)
        _check_size("memory_limit", memory_limit, allow_zero=False)
        _check_size("temp_dir_limit", temp_dir_limit, allow_zero=True)
        if self.temp_dir is not None and self.temp_dir.exists() and not self.temp_dir.is_dir():
            raise ClusterPoolError(f"The 'temp_dir' parameter must name a folder, got a file: {self.temp_dir}.")
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
        if memory_mode not in ("auto", "cgroup", "rlimit"):
            raise ClusterPoolError(f"The 'memory_mode' parameter must be 'auto', 'cgroup' or 'rlimit', "
                                   f"got {memory_mode!r}.")
        self._memory: MemoryBounds | None = None
        self.memory_mode = "rlimit"
        self.memory_note = "worker memory bounded by RLIMIT_DATA only (memory_mode: rlimit)"
        if memory_mode != "rlimit":
            memory_root = memory_cgroup_root if memory_cgroup_root is not None else find_memory_root()
            if memory_root is None:
                self.memory_note = ("no writable cgroup hierarchy with the memory controller: each worker's memory "
                                    "is bounded by RLIMIT_DATA only (virtual memory, thread stacks included)")
                if memory_mode == "cgroup":
                    raise ClusterPoolError(f"memory_mode 'cgroup': {self.memory_note}.")
                if self.memory_limit is not None:
                    (log or (lambda m: print(m, file=sys.stderr)))(f"warning: {self.memory_note}")
            else:
                self._memory = MemoryBounds(memory_root)
                self._memory.remove_stale()
                self.memory_mode = "cgroup"
                self.memory_note = (f"cgroup v{memory_root.version} memory bounds under {self._memory.parent}, "
                                    "RLIMIT_DATA above them")
        self._completions: queue.Queue[QueryCompletion] = queue.Queue()
        self._put = 0  # completions put into / taken from the queue: a dead worker's failure waits for its own
        self._taken = 0
        self._clusters: dict[str, _Cluster] = {}
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._explain_ids = itertools.count(1)
        self._closed = False
        self._temp_root: Path | None = None  # made at the first spin-up
        self._own_temp_root = False

    # -- CPU allocation --------------------------------------------------
    def budget_cores(self, size: int) -> float:
        """The CPU a cluster of ``size`` may use, in cores."""
        return size * self.size_unit_cores if self.size_unit_cores is not None else float(size)

    def memory_bound(self, memory_limit: str | None = None) -> int | None:
        """The bytes a worker with ``memory_limit`` (default: the pool's) may hold; ``None``: not bounded."""
        limit = memory_limit or self.memory_limit
        return None if limit is None else bound_bytes(limit)

    def _allocate_budget(self, size: int) -> tuple[tuple[int, ...], bool]:
        """Budgets: every cluster runs on all the pool's cores; their budgets must fit in them."""
        live = [c for c in self._clusters.values() if c.state in ("starting", "ready") and not c.scratch]
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
        live = [c for c in self._clusters.values() if c.state in ("starting", "ready") and not c.scratch]
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
    def spin_up(self, size: int, *, cluster_id: str | None = None, scratch_catalog: str | None = None,
                memory_limit: str | None = None) -> str:
        """Start a cluster process pinned to ``size`` cores; return its id.

        ``scratch_catalog``: a scratch worker instead (the SLO gateway's
        ``memory`` catalog): an in-memory database that may be written, with
        the warehouse attached read-only under that name, bounded by
        ``memory_limit`` (default: the pool's); it takes no CPU budget (it
        runs on the clusters' cores, unbudgeted).
        """
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ClusterPoolError(f"The 'size' parameter must be an integer >= 1, got {size!r}.")
        _check_size("memory_limit", memory_limit, allow_zero=False)
        with self._cond:
            if self._closed:
                raise ClusterPoolError("The pool is closed.")
            cluster_id = cluster_id or f"c{next(self._ids)}-s{size}"
            if cluster_id in self._clusters and self._clusters[cluster_id].state != "stopped":
                raise ClusterPoolError(f"The 'cluster_id' {cluster_id!r} is already in use.")
            if scratch_catalog is None:
                cores, oversubscribed = self._allocate(size)
                budget = self.budget_cores(size) if self._budgets is not None else float(len(cores))
                cgroup = self._budgets.create(cluster_id, budget) if self._budgets is not None else None
            else:
                cores, oversubscribed, budget, cgroup = tuple(self._cores), False, float(size), None
            threads = max(1, math.ceil(budget - 1e-9))
            command = [sys.executable, "-m", "sloctl.datasets._cluster_worker", "--db", str(self.db_path),
                       "--size", str(threads), "--cores", ",".join(map(str, cores)), "--warmup-s", repr(self.warmup_s)]
            if cgroup is not None:
                command += ["--cgroup-procs", str(cgroup.procs_file)]
            limit = memory_limit or self.memory_limit
            bound = self.memory_bound(limit)
            group = None
            if limit:
                command += ["--memory-limit", limit]
            if bound is not None and self._memory is not None:
                try:
                    group = self._memory.create(cluster_id, bound)
                except ClusterPoolError:
                    if cgroup is not None:
                        self._budgets.remove(cgroup)
                    raise
                if cgroup is None or group.procs_file != cgroup.procs_file:  # v2: one group may hold both
                    command += ["--cgroup-procs", str(group.procs_file)]
            if bound is not None:  # with a cgroup too: an allocation of gigabytes fails at once, the query's alone
                command += ["--rlimit-data", str(data_limit_bytes(bound))]
            if scratch_catalog is not None:  # its tables live in memory_limit: it never spills (the worker's rule)
                command += ["--scratch", scratch_catalog]
            if self.temp_dir_limit is not None:
                command += ["--temp-dir-limit", self.temp_dir_limit]
            if self.integer_division:
                command += ["--integer-division"]
            try:
                temp_dir = self._cluster_temp_dir(cluster_id)
                command += ["--temp-dir", str(temp_dir)]
                env = None if bound is None else {**os.environ, **MALLOC_ENV}  # freed memory goes back
                process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                           bufsize=1, env=env)
            except OSError:
                if cgroup is not None:
                    self._budgets.remove(cgroup)
                if group is not None:
                    self._memory.remove(group)
                raise
            cluster = _Cluster(
                cluster_id=cluster_id, size=size, cores=cores, process=process,
                requested_s=time.monotonic(),
                oversubscribed=oversubscribed or (cgroup is None and threads > len(cores)),
                cpu_budget=budget, cgroup=cgroup, temp_dir=temp_dir, scratch=scratch_catalog is not None,
                memory_limit=limit, memory_bound=bound, memory_group=group)
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
                    cluster.state = "failed"
                    cluster.failure = cluster.failure or _exit_text(cluster.process.pid, cluster.process.returncode)
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
        """Hand ``request`` to the cluster; it starts on a thread of its own.

        A ``stream`` request's pages go to ``request.on_page`` (see
        :class:`~sloctl.datasets.pool.QueryRequest`); let more come with :meth:`credit`.
        """
        message: dict[str, Any] = {"op": "run", "query_id": request.query_id, "sql": request.sql,
                                   "timeout_s": request.timeout_s}
        if request.stream:
            if request.fetch:
                raise ClusterPoolError("The 'fetch' and 'stream' parameters of a QueryRequest exclude each other: "
                                       "a streamed result comes through 'on_page'.")
            for name in ("page_rows", "buffer_pages"):
                value = getattr(request, name)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ClusterPoolError(f"The '{name}' parameter of a QueryRequest must be an integer >= 1, "
                                           f"got {value!r}.")
            message.update(stream=True, page_rows=request.page_rows, buffer_pages=request.buffer_pages)
            if request.page_bytes is not None:
                if isinstance(request.page_bytes, bool) or not isinstance(request.page_bytes, int) \
                        or request.page_bytes < 1:
                    raise ClusterPoolError(f"The 'page_bytes' parameter of a QueryRequest must be an integer >= 1 "
                                           f"or None, got {request.page_bytes!r}.")
                message["page_bytes"] = request.page_bytes
            if request.stream_timeout_s is not None:
                message["stream_timeout_s"] = request.stream_timeout_s
        elif request.fetch:
            message["fetch"] = True
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state != "ready":
                raise ClusterPoolError(
                    f"Cluster {cluster_id!r} is {cluster.state}; queries need a ready cluster.")
            if cluster.exited:
                raise ClusterPoolError(f"Cluster {cluster_id!r} is gone (its worker exited).")
            cluster.running.add(request.query_id)
            if request.stream:
                cluster.streams[request.query_id] = _Stream(request.on_page, raw=request.raw_pages)
        try:
            self._send(cluster, message)
        except ClusterPoolError:  # never handed over: the caller hears it here, not in a completion too
            with self._cond:
                cluster.running.discard(request.query_id)
                cluster.streams.pop(request.query_id, None)
            raise

    def credit(self, cluster_id: str, query_id: int, pages: int = 1) -> None:
        """Let streamed query ``query_id`` send ``pages`` more pages (call it once per page consumed).

        A query that already ended (or does not stream), or whose worker is
        gone, is left alone: its completion says how it ended.
        """
        if isinstance(pages, bool) or not isinstance(pages, int) or pages < 1:
            raise ClusterPoolError(f"The 'pages' parameter of credit must be an integer >= 1, got {pages!r}.")
        with self._cond:
            cluster = self._get(cluster_id)
            if query_id not in cluster.streams or cluster.state != "ready":
                return
        with contextlib.suppress(ClusterPoolError):  # the worker died: the reader ends its queries
            self._send(cluster, {"op": "credit", "query_id": query_id, "pages": pages})

    def explain(self, cluster_id: str, sql: str, timeout_s: float = 5.0) -> str | None:
        """``EXPLAIN (FORMAT JSON) sql`` on a worker of ``cluster_id`` (sandboxed, never in this process).

        Returns:
            The JSON plan text (what :class:`~sloctl.datasets.plan_features.PlanFeaturizer`
            parses), or ``None`` when the statement cannot be planned (or is
            not one ``SELECT``) or planning took longer than ``timeout_s``.

        Raises:
            ClusterPoolError: the cluster is unknown, not ready, or died before it answered.
        """
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
            raise ClusterPoolError(f"The 'timeout_s' parameter of explain must be > 0 seconds, got {timeout_s!r}.")
        with self._cond:
            cluster = self._get(cluster_id)
            if cluster.state != "ready":
                raise ClusterPoolError(f"Cluster {cluster_id!r} is {cluster.state}; EXPLAIN needs a ready cluster.")
            explain_id = next(self._explain_ids)
            cluster.explains[explain_id] = None
        try:
            self._send(cluster, {"op": "explain", "explain_id": explain_id, "sql": sql, "timeout_s": timeout_s})
            deadline = time.monotonic() + timeout_s + 1.0  # the worker interrupts itself at timeout_s
            with self._cond:
                while (answer := cluster.explains.get(explain_id)) is None:
                    if cluster.state != "ready":
                        raise ClusterPoolError(f"Cluster {cluster_id!r} is {cluster.state} "
                                               f"({cluster.failure or 'torn down'}); its EXPLAIN was lost.")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    self._cond.wait(remaining)
        finally:
            with self._cond:
                cluster.explains.pop(explain_id, None)
        return answer.get("plan")

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
        out = drain(self._completions, timeout_s)
        if out:
            with self._cond:
                self._taken += len(out)
                for cluster in self._clusters.values():
                    if cluster.exit_pending is not None and self._taken >= cluster.exit_pending[0]:
                        self._publish_exit(cluster, cluster.exit_pending[1])
                self._cond.notify_all()
        return out

    def _publish_exit(self, cluster: _Cluster, how: str) -> None:
        """Show an exited worker's cluster as failed (or stopped, when torn down); under the lock."""
        cluster.exit_pending = None
        if cluster.state in ("starting", "ready"):
            if cluster.stopping:
                cluster.state = "stopped"
            else:
                cluster.state, cluster.failure = "failed", cluster.failure or how

    def tear_down(self, cluster_id: str, timeout_s: float = 15.0) -> None:
        """Stop the cluster's process; its cores become free again."""
        with self._cond:
            cluster = self._get(cluster_id)
            stopped = cluster.state == "stopped"
            cluster.stopping = True
        if stopped:  # the worker already exited; its group and temp folder may still be there
            if cluster.process.poll() is not None:
                self._release_cgroup(cluster)
                self._remove_temp_dir(cluster)
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
        self._remove_temp_dir(cluster)

    def _cluster_temp_dir(self, cluster_id: str) -> Path:
        """A fresh spill folder for one cluster, inside the pool's (made on first use)."""
        if self._temp_root is None:
            if self.temp_dir is not None:
                self.temp_dir.mkdir(parents=True, exist_ok=True)
                self._temp_root = self.temp_dir
            else:
                self._temp_root = Path(tempfile.mkdtemp(prefix="sloctl-pool-"))
                self._own_temp_root = True
        return Path(tempfile.mkdtemp(prefix=f"{cluster_id}-", dir=self._temp_root))

    @staticmethod
    def _remove_temp_dir(cluster: _Cluster) -> None:
        if cluster.temp_dir is not None:
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)
            cluster.temp_dir = None

    def _release_cgroup(self, cluster: _Cluster) -> None:
        if cluster.cgroup is not None and self._budgets is not None:
            try:
                self._budgets.remove(cluster.cgroup)
            except ClusterPoolError as exc:  # a stray process still in it: the next pool's start removes it
                print(f"warning: {exc}", file=sys.stderr)
            cluster.cgroup = None
        if cluster.memory_group is not None and self._memory is not None:
            try:
                self._memory.remove(cluster.memory_group)
            except ClusterPoolError as exc:
                print(f"warning: {exc}", file=sys.stderr)
            cluster.memory_group = None

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
        if self._own_temp_root and self._temp_root is not None:
            shutil.rmtree(self._temp_root, ignore_errors=True)

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
                           oversubscribed=c.oversubscribed, cpu_budget=c.cpu_budget, pid=c.process.pid,
                           failure=c.failure, memory_bound=c.memory_bound)

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
        """Follow one worker's stdout until it exits; then end whatever still ran on it."""
        for line in cluster.process.stdout:
            page = _PAGE.match(line)
            if page is not None:  # rows stay JSON text until a consumer wants them decoded
                body = line.rstrip()
                self._deliver_page(cluster, int(page.group(1)), RawPage(body[page.end():-1], int(page.group(2))))
                continue
            message = json.loads(line)
            kind = message["kind"]
            with self._cond:
                if kind == "done":
                    self._completions.put(self._completion(cluster, message))
                    self._put += 1
                elif kind == "columns":
                    stream = cluster.streams.get(message["query_id"])
                    if stream is not None:
                        stream.columns = tuple((str(n), str(t)) for n, t in message["columns"])
                elif kind == "explained":
                    if message["explain_id"] in cluster.explains:  # else its caller gave up waiting
                        cluster.explains[message["explain_id"]] = message
                elif kind == "ready":
                    cluster.state, cluster.ready_s = "ready", message["t"]
                elif kind == "failed":
                    cluster.state, cluster.failure = "failed", message["error"]
                self._cond.notify_all()
        cluster.process.stdout.close()
        try:
            returncode = cluster.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            returncode = None
        how = _exit_text(cluster.process.pid, returncode)
        t = time.monotonic()
        killed_at_bound = (not cluster.stopping and cluster.memory_group is not None and returncode is not None
                           and returncode < 0 and MemoryBounds.oom_killed(cluster.memory_group))
        with self._cond:
            cluster.exited = True
            if killed_at_bound:
                how = _memory_text(cluster, how)
            error = (f"{_TORN_DOWN} ({how})" if cluster.stopping else how if killed_at_bound
                     else f"cluster {cluster.cluster_id} stopped while the query ran: {how}")
            for query_id in sorted(cluster.running):
                stream = cluster.streams.get(query_id)
                self._completions.put(QueryCompletion(
                    query_id=query_id, cluster_id=cluster.cluster_id, start_s=t, end_s=t, status="error",
                    error=error, rows=stream.rows if stream is not None else 0,
                    oversubscribed=cluster.oversubscribed, cpu_budget=cluster.cpu_budget))
                self._put += 1
            handed_over = not cluster.running
            cluster.running.clear()
            cluster.streams.clear()
            # a caller that reads completions, then states, must learn from the completions why its queries
            # ended (a memory failure is never retried; a cluster that merely failed is): the state waits for
            # them to be taken (completions() shows it then), for _HANDOVER_S at most
            cluster.exit_pending = (self._put, how)
            deadline = time.monotonic() + _HANDOVER_S
            while not handed_over and cluster.exit_pending is not None and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            if cluster.exit_pending is not None:
                self._publish_exit(cluster, how)
            self._cond.notify_all()

    def _completion(self, cluster: _Cluster, message: dict[str, Any]) -> QueryCompletion:
        """The completion of a ``done`` message (called under the lock)."""
        query_id = message["query_id"]
        cluster.running.discard(query_id)
        stream = cluster.streams.pop(query_id, None)
        status, error = message["status"], message["error"]
        if stream is not None and stream.error:
            status, error = "error", stream.error
        return QueryCompletion(
            query_id=query_id, cluster_id=cluster.cluster_id, start_s=message["start_s"], end_s=message["end_s"],
            status=status, error=error, rows=message["rows"], oversubscribed=cluster.oversubscribed,
            cpu_budget=cluster.cpu_budget,
            columns=(tuple((str(n), str(t)) for n, t in message["columns"]) if "columns" in message else None),
            data=message.get("data"))

    def _deliver_page(self, cluster: _Cluster, query_id: int, page: RawPage) -> None:
        """Hand one page to its consumer, outside the lock (``on_page`` may call :meth:`credit`)."""
        with self._cond:
            stream = cluster.streams.get(query_id)
        if stream is None or stream.error:  # a consumer that failed gets no more pages
            return
        stream.rows += page.count
        if stream.on_page is None:
            self.credit(cluster.cluster_id, query_id)
            return
        try:
            stream.on_page(stream.columns, page if stream.raw else page.rows())
        except Exception as exc:  # the consumer cannot take the rest: stop the query, say why
            stream.error = f"on_page raised {type(exc).__name__}: {exc}"
            with contextlib.suppress(ClusterPoolError):
                self.cancel(cluster.cluster_id, query_id)
