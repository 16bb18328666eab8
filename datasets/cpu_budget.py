"""CPU budgets for warehouse clusters: CFS bandwidth control through cgroups.

A cluster of size ``N`` gets ``N × unit`` cores of CPU time (default unit: a
quarter of a core), enforced by the kernel's CFS bandwidth control on a cgroup
of its own: every ``period_s`` the group may run for ``quota = budget ×
period_s`` seconds of CPU, across however many cores it touches. A short
period (10 ms) keeps throttling stalls short, so a throttled query is slowed
rather than frozen for a long slice.

Both kernel interfaces are supported: cgroup v1 (``cpu.cfs_quota_us`` and
``cpu.cfs_period_us`` under the ``cpu`` controller's mount, e.g.
``/sys/fs/cgroup/cpu``) and cgroup v2 (``cpu.max`` in a unified hierarchy whose
root enables the ``cpu`` controller). Groups live under one parent named
``sloctl``, each named ``p<pid>-<cluster id>`` after the process that made it,
so a group left behind by a crashed run is recognised and removed at the next
start (:meth:`CpuBudgets.remove_stale`).

Where no hierarchy is writable (no root, a container without delegation),
:func:`find_cgroup_root` returns ``None`` and the warehouse falls back to
pinning whole cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets._cgroup import GROUP_NAME, remove_group, remove_stale_groups

__all__ = ["CgroupRoot", "CpuBudget", "CpuBudgets", "find_cgroup_root"]

#: Default CFS period: short, so that throttling adds millisecond stalls, not 100 ms ones.
DEFAULT_PERIOD_S = 0.01
_PARENT = "sloctl"


@dataclass(frozen=True)
class CgroupRoot:
    """A writable cgroup hierarchy with the ``cpu`` controller.

    Attributes:
        path: the hierarchy's mount point (where groups are made).
        version: 1 (``cpu.cfs_quota_us``) or 2 (``cpu.max``).
    """

    path: Path
    version: int


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def find_cgroup_root(candidates: tuple[str, ...] | None = None) -> CgroupRoot | None:
    """The first writable hierarchy that can limit CPU bandwidth, or ``None``.

    Args:
        candidates: mount points to try (default: the usual v1 ``cpu`` mounts,
            then v2 unified mounts whose ``cgroup.controllers`` lists ``cpu``).
    """
    paths = candidates or ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup",
                           "/sys/fs/cgroup/unified")
    for raw in paths:
        path = Path(raw)
        if (path / "cpu.cfs_quota_us").is_file() and _writable_dir(path):
            return CgroupRoot(path, 1)
        controllers = path / "cgroup.controllers"
        if controllers.is_file() and "cpu" in controllers.read_text().split() and _writable_dir(path):
            return CgroupRoot(path, 2)
    return None


@dataclass(frozen=True)
class CpuBudget:
    """One cluster's group: where it is and what it allows.

    Attributes:
        path: the group's folder (write a PID into ``procs_file`` to enrol it).
        cores: the budget in cores (quota / period).
        period_s: the CFS period.
    """

    path: Path
    cores: float
    period_s: float

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"


class CpuBudgets:
    """Makes, lists and removes the CPU-budget groups of this process's clusters.

    Args:
        root: the hierarchy (see :func:`find_cgroup_root`).
        period_s: CFS period of every group (default 10 ms).
    """

    def __init__(self, root: CgroupRoot, *, period_s: float = DEFAULT_PERIOD_S) -> None:
        self.root = root
        self.period_s = period_s

    @property
    def parent(self) -> Path:
        return self.root.path / _PARENT

    def _ensure_parent(self) -> None:
        self.parent.mkdir(exist_ok=True)
        if self.root.version == 2:  # children of the parent need the cpu controller delegated to them
            control = self.parent / "cgroup.subtree_control"  # (the memory bounds may have made the parent)
            if "cpu" not in (control.read_text().split() if control.is_file() else []):
                control.write_text("+cpu")

    def create(self, cluster_id: str, cores: float) -> CpuBudget:
        """Make the group of ``cluster_id`` allowing ``cores`` cores of CPU time.

        Raises:
            ClusterPoolError: a bad budget or id, or the kernel refused the group.
        """
        if not cores > 0:
            raise ClusterPoolError(f"The 'cores' parameter of CpuBudgets.create must be > 0, got {cores!r}.")
        name = f"p{os.getpid()}-{cluster_id}"
        if not GROUP_NAME.match(name):
            raise ClusterPoolError(f"The 'cluster_id' {cluster_id!r} cannot name a cgroup "
                                   "(letters, digits, '_', '.', '-' only).")
        period_us = max(1000, round(self.period_s * 1e6))
        quota_us = max(1000, round(cores * period_us))
        try:
            self._ensure_parent()
            path = self.parent / name
            path.mkdir(exist_ok=True)
            if self.root.version == 1:
                # the period first: a quota above the old period's limits could otherwise be refused
                (path / "cpu.cfs_period_us").write_text(str(period_us))
                (path / "cpu.cfs_quota_us").write_text(str(quota_us))
            else:
                (path / "cpu.max").write_text(f"{quota_us} {period_us}")
        except OSError as exc:
            raise ClusterPoolError(f"Could not make a CPU-budget cgroup for cluster {cluster_id!r} under "
                                   f"{self.parent} ({exc}).") from exc
        return CpuBudget(path, quota_us / period_us, period_us / 1e6)

    @staticmethod
    def read(budget: CpuBudget, version: int) -> tuple[int, int]:
        """``(quota_us, period_us)`` as the kernel holds them now."""
        if version == 1:
            return (int((budget.path / "cpu.cfs_quota_us").read_text()),
                    int((budget.path / "cpu.cfs_period_us").read_text()))
        quota, period = (budget.path / "cpu.max").read_text().split()
        return int(quota), int(period)

    def remove(self, budget: CpuBudget, timeout_s: float = 5.0) -> None:
        """Remove a group once its processes have exited (waits up to ``timeout_s`` for them)."""
        remove_group(budget.path, timeout_s, "CPU-budget")

    def remove_stale(self) -> list[str]:
        """Remove the groups of processes that no longer run (a crashed run's leftovers); their names."""
        return remove_stale_groups(self.parent, "CPU-budget")

