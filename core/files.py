"""Files sloctl writes: atomically, and readable as any newly created file is.

A reader that watches a path (Envoy's RDS file) or another process opening a
log must never see a half-written file, so writers go through a temporary file
in the same folder and rename it over the destination. ``tempfile.mkstemp``
creates that file 0600; renamed, it would keep a mode that an Envoy running as
another user cannot read. :func:`atomic_write` gives the result the mode an
ordinary ``open(path, "w")`` would: the mode of the file it replaces, else
``0o666`` less the process umask (0644 under the usual umask 022), or the
mode asked for.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "current_umask", "default_file_mode"]

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows.

    Linux reports it in ``/proc/self/status``; elsewhere it is read by setting
    and restoring it under a lock (the window is a few instructions long).
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: ``0o666 & ~umask``."""
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", *, file_mode: int | None = None,
                 **open_kwargs: Any) -> Iterator[IO[Any]]:
    """Write ``path`` through a temporary file in its folder, renamed over it on success.

    The data is flushed and fsync'ed before the rename; on any error the
    temporary file is removed and ``path`` is left as it was.

    Args:
        path: the destination; its folder must exist.
        mode: ``"w"`` (text) or ``"wb"`` (binary).
        file_mode: permission bits of the result; ``None`` keeps the mode of
            the file it replaces, and gives a new file
            :func:`default_file_mode` (0644 under umask 022).
        **open_kwargs: passed to :func:`os.fdopen` (``encoding``, ...).

    Yields:
        The open file object.

    Raises:
        ValueError: ``mode`` is not ``"w"`` or ``"wb"``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"The 'mode' parameter of atomic_write must be 'w' or 'wb', got {mode!r}.")
    path = Path(path)
    bits = file_mode
    if bits is None:  # a rewrite keeps the file's mode (as open(path, "w") would); a new file gets the default
        try:
            bits = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            bits = default_file_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as fh:
            os.fchmod(fh.fileno(), bits)
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
