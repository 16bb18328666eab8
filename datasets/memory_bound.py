"""Memory bounds for warehouse workers, enforced by the operating system.

DuckDB's ``memory_limit`` covers its buffer manager, not every allocation: a
single expression that builds a huge list or string (``repeat``, ``range``,
``list_concat``) allocates outside it and can take a worker, and the host, to
many gigabytes. Each worker therefore also runs under an operating-system
bound a margin above its ``memory_limit`` (:func:`bound_bytes`: 25 %, at least
64 MB), so that what DuckDB does not count still cannot pass it:

* **cgroup** (where a memory hierarchy is writable): a group per worker with
  ``memory.limit_in_bytes`` (v1, and ``memory.memsw.limit_in_bytes`` so that
  swap cannot stretch it) or ``memory.max`` (v2, ``memory.swap.max = 0``). It
  bounds resident memory; a worker that passes it is killed by the kernel,
  which :meth:`MemoryBounds.oom_killed` reads back so the pool can say why.
  v1 groups nest under this process's own memory group (its limits still
  hold); v2 groups live under the hierarchy's root, with the same names as
  the CPU budgets' groups (:mod:`sloctl.datasets.cpu_budget`), so one group
  carries both where both are v2.
* **rlimit** (everywhere): ``RLIMIT_DATA``, set by the worker itself before
  it imports DuckDB, at the bound plus :data:`STACK_ALLOWANCE_BYTES`
  (:func:`data_limit_bytes`). It counts private writable mappings, touched
  or not, and so every thread's stack (8 MiB each): the allowance keeps a
  worker running many queries at once from being refused a thread. An
  allocation past it fails at once, which DuckDB reports as
  ``OutOfMemoryException``, and the worker lives on; so an expression that
  asks for gigabytes in one piece fails alone, before it touches any of it.
  Where no cgroup can be made it is the only bound, and a looser one: while
  few threads run, resident memory may pass the bound by up to the allowance.
  Workers also start with :data:`MALLOC_ENV`, so freed memory goes back.

Memory the kernel charged elsewhere is not in a worker's group: the pages of
shared libraries another process loaded first (DuckDB's own code, some
40 MB) count in the worker's RSS but not against its cgroup bound.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets._cgroup import GROUP_NAME, remove_group, remove_stale_groups

__all__ = ["MALLOC_ENV", "MemoryBound", "MemoryBounds", "MemoryRoot", "bound_bytes", "data_limit_bytes",
           "find_memory_root", "size_bytes"]

_PARENT = "sloctl"
#: The smallest margin above ``memory_limit``: the interpreter and DuckDB's own code and caches live outside it.
MIN_MARGIN_BYTES = 64_000_000
#: The margin as a share of ``memory_limit``.
MARGIN_RATIO = 0.25
#: ``RLIMIT_DATA`` above the bound: room for 128 thread stacks of 8 MiB (each running query holds two threads).
STACK_ALLOWANCE_BYTES = 128 * 8 * 1024**2
#: The worker's malloc settings (glibc): few arenas, and blocks of 1 MiB and more mapped apart and handed back
#: on free, so that memory a query freed does not stay with the worker, counted against its bound.
MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(1024**2)}
_UNITS = {"b": 1, "bytes": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", re.IGNORECASE)


def size_bytes(size: str) -> int:
    """A DuckDB size (``"2GB"``: 1000-based; ``"512MiB"``: 1024-based) in bytes, as DuckDB reads it."""
    match = _SIZE.fullmatch(size)
    unit = match.group(2).lower() if match is not None else ""
    if match is None or unit not in _UNITS:
        raise ClusterPoolError(f"The 'memory_limit' parameter must be a DuckDB size such as '2GB' or '512MiB', "
                               f"got {size!r}.")
    return int(float(match.group(1)) * _UNITS[unit])


def bound_bytes(memory_limit: str) -> int:
    """The operating-system bound of a worker whose DuckDB ``memory_limit`` is ``memory_limit``, in bytes.

    ``memory_limit`` plus a margin of 25 % (at least :data:`MIN_MARGIN_BYTES`):
    the margin holds the interpreter, DuckDB's code and the Python objects of
    result pages, which DuckDB's limit does not count.
    """
    limit = size_bytes(memory_limit)
    return limit + max(int(limit * MARGIN_RATIO), MIN_MARGIN_BYTES)


def data_limit_bytes(bound: int) -> int:
    """The ``RLIMIT_DATA`` of a worker bounded at ``bound`` bytes: the bound plus room for thread stacks."""
    return bound + STACK_ALLOWANCE_BYTES


@dataclass(frozen=True)
class MemoryRoot:
    """A writable hierarchy with the ``memory`` controller.

    Attributes:
        path: where this process's groups are made (their parent's parent).
        version: 1 (``memory.limit_in_bytes``) or 2 (``memory.max``).
    """

    path: Path
    version: int


def _own_v1_group(mount: Path) -> Path:
    """This process's memory group in a v1 mount (the mount itself when its path is not visible there)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                own = mount / path.lstrip("/")
                return own if own.is_dir() else mount
    except OSError:
        pass
    return mount


def find_memory_root(candidates: tuple[str, ...] | None = None) -> MemoryRoot | None:
    """The first writable hierarchy that can bound memory, or ``None``.

    Args:
        candidates: mount points to try (default: the v1 ``memory`` mount,
            then v2 unified mounts whose root delegates ``memory`` to its children).
    """
    paths = candidates or ("/sys/fs/cgroup/memory", "/sys/fs/cgroup", "/sys/fs/cgroup/unified")
    for raw in paths:
        path = Path(raw)
        if (path / "memory.limit_in_bytes").is_file():
            own = _own_v1_group(path) if candidates is None else path
            if os.access(own, os.W_OK):
                return MemoryRoot(own, 1)
            continue
        control = path / "cgroup.subtree_control"
        if control.is_file() and "memory" in control.read_text().split() and os.access(path, os.W_OK):
            return MemoryRoot(path, 2)
    return None


@dataclass(frozen=True)
class MemoryBound:
    """One worker's memory group.

    Attributes:
        path: the group's folder (write a PID into ``procs_file`` to enrol it).
        bytes: the bound.
        version: the hierarchy's version (1 or 2).
    """

    path: Path
    bytes: int
    version: int

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"


def _counter(path: Path, key: str) -> int | None:
    """``key``'s value in a flat-keyed cgroup file (``memory.events``, ``memory.oom_control``), if it is there."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


class MemoryBounds:
    """Makes, reads and removes the memory groups of this process's workers.

    Args:
        root: the hierarchy (see :func:`find_memory_root`).
    """

    def __init__(self, root: MemoryRoot) -> None:
        self.root = root

    @property
    def parent(self) -> Path:
        return self.root.path / _PARENT

    def _ensure_parent(self) -> None:
        self.parent.mkdir(exist_ok=True)
        if self.root.version == 2:  # children of the parent need the memory controller delegated to them
            control = self.parent / "cgroup.subtree_control"
            if "memory" not in (control.read_text().split() if control.is_file() else []):
                control.write_text("+memory")

    def create(self, cluster_id: str, bound: int) -> MemoryBound:
        """Make the group of ``cluster_id`` bounded at ``bound`` bytes, swap included.

        Raises:
            ClusterPoolError: a bad bound or id, or the kernel refused the group.
        """
        if isinstance(bound, bool) or not isinstance(bound, int) or bound <= 0:
            raise ClusterPoolError(f"The 'bound' parameter of MemoryBounds.create must be a positive number of "
                                   f"bytes, got {bound!r}.")
        name = f"p{os.getpid()}-{cluster_id}"
        if not GROUP_NAME.match(name):
            raise ClusterPoolError(f"The 'cluster_id' {cluster_id!r} cannot name a cgroup "
                                   "(letters, digits, '_', '.', '-' only).")
        path = self.parent / name
        try:
            self._ensure_parent()
            path.mkdir(exist_ok=True)
            if self.root.version == 1:
                # memory + swap (memsw) may never be under memory alone: raise it first, lower it last
                names = ["memory.limit_in_bytes"]
                if (path / "memory.memsw.limit_in_bytes").is_file():
                    raising = bound > int((path / "memory.limit_in_bytes").read_text() or 0)
                    names = ["memory.memsw.limit_in_bytes", *names] if raising else [*names,
                                                                                     "memory.memsw.limit_in_bytes"]
                for name in names:
                    (path / name).write_text(str(bound))
            else:
                (path / "memory.max").write_text(str(bound))
                if (path / "memory.swap.max").is_file():
                    (path / "memory.swap.max").write_text("0")
        except OSError as exc:
            raise ClusterPoolError(f"Could not make a memory cgroup for cluster {cluster_id!r} under "
                                   f"{self.parent} ({exc}).") from exc
        return MemoryBound(path, bound, self.root.version)

    @staticmethod
    def read(bound: MemoryBound) -> int:
        """The bound as the kernel holds it now, in bytes."""
        name = "memory.limit_in_bytes" if bound.version == 1 else "memory.max"
        return int((bound.path / name).read_text().split()[0])

    @staticmethod
    def oom_killed(bound: MemoryBound) -> bool:
        """Whether the kernel killed a process of the group for passing its bound.

        Reads the group's ``oom_kill`` count (v1 ``memory.oom_control``, v2
        ``memory.events``); a kernel without that count says so through the
        times the bound was hit (v1 ``memory.failcnt``, v2 ``max`` events).
        """
        if bound.version == 1:
            kills = _counter(bound.path / "memory.oom_control", "oom_kill")
            if kills is None:
                try:
                    return int((bound.path / "memory.failcnt").read_text()) > 0
                except (OSError, ValueError):
                    return False
            return kills > 0
        events = bound.path / "memory.events"
        kills = _counter(events, "oom_kill")
        return (kills if kills is not None else _counter(events, "max") or 0) > 0

    def remove(self, bound: MemoryBound, timeout_s: float = 5.0) -> None:
        """Remove a group once its processes have exited (waits up to ``timeout_s`` for them)."""
        remove_group(bound.path, timeout_s, "memory")

    def remove_stale(self) -> list[str]:
        """Remove the groups of processes that no longer run (a crashed run's leftovers); their names."""
        return remove_stale_groups(self.parent, "memory")

