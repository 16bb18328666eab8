"""What the CPU-budget and memory-bound cgroups share: their names, and removing them safely.

Each group is named ``p<pid>-<cluster>`` after the process that made it,
so a later run can tell a crashed run's leftovers (their maker no longer
runs) from a live run's groups.
"""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

from sloctl.core.errors import ClusterPoolError

__all__ = ["GROUP_NAME", "remove_group", "remove_stale_groups"]

#: A group's name: the making process's id, then the cluster.
GROUP_NAME = re.compile(r"^p(\d+)-[A-Za-z0-9_.-]+$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_group(path: Path, timeout_s: float, what: str) -> None:
    """Remove the group at ``path`` once its processes have exited (waits up to ``timeout_s`` for them).

    Raises:
        ClusterPoolError: it still holds a process after ``timeout_s`` (``what`` names the kind of group).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                raise ClusterPoolError(f"Could not remove the {what} cgroup {path} ({exc}).") from exc
            time.sleep(0.05)


def remove_stale_groups(parent: Path, what: str) -> list[str]:
    """Remove the groups under ``parent`` whose making process no longer runs; their names."""
    if not parent.is_dir():
        return []
    removed = []
    for path in sorted(parent.iterdir()):
        match = GROUP_NAME.match(path.name)
        if not path.is_dir() or match is None or _alive(int(match.group(1))):
            continue
        try:
            remove_group(path, 0.5, what)
            removed.append(path.name)
        except ClusterPoolError:
            continue  # still holds a process (an orphaned worker): leave it
    return removed
