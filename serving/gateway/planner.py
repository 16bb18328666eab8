"""Planning a stranger's text off the event loop: planner processes with a time and memory budget.

:func:`~sloctl.serving.gateway.dialect.plan` parses and translates the
client's text (sqlglot, DuckDB's parser): pure work, but work whose cost a
client chooses. A 1 MB ``IN`` list takes sqlglot seconds; a text aimed at a
parser's worst case could take longer. Run on the gateway's event loop, one
such text would stop every other request, ``/healthz`` included; run on a
thread it would still hold the GIL and a core after its client gave up.

So the gateway plans in :class:`Planner` processes (``python -m
sloctl.serving.gateway.planner``; a few, each one text at a time). The
request waits on a worker thread for its answer, at most ``timeout_s``
(``plan_timeout_s``, 2 s by default: Trino's ``query.max-planning-time``
in spirit). Past it the planner process is killed and replaced, and the
query fails with ``EXCEEDED_TIME_LIMIT``; the server never stopped serving.
Each planner process runs under an address-space limit (``memory_bytes``),
so a text that makes the parser allocate without end fails with
``EXCEEDED_LOCAL_MEMORY_LIMIT`` and the process is replaced.

The wire between the gateway and a planner is length-prefixed pickles over
the child's stdin and stdout: ``(text, catalog, session)`` in, a
:class:`~sloctl.serving.gateway.dialect.Plan` out.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from sloctl.serving.gateway.dialect import Catalog, Plan, Session

__all__ = ["DEFAULT_PLAN_TIMEOUT_S", "Planner"]

#: How long one text may take to plan (seconds) before its query fails and its planner is replaced.
DEFAULT_PLAN_TIMEOUT_S = 2.0

#: Each planner process's address-space limit, bytes.
DEFAULT_PLANNER_MEMORY_BYTES = 2 << 30

_HEADER = struct.Struct("!I")


def _refused(name: str, message: str) -> Plan:
    return Plan("refused", error_name=name, message=message)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """``n`` bytes from ``fd``, waiting at most until ``deadline`` (monotonic); raises TimeoutError or EOFError."""
    chunks: list[bytes] = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _write_frame(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


class _Process:
    """One planner process and its pipes."""

    def __init__(self, memory_bytes: int) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "sloctl.serving.gateway.planner", str(memory_bytes)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, close_fds=True)

    def ask(self, request: tuple[str, Catalog, Session | None], timeout_s: float) -> Plan:
        _write_frame(self.proc.stdin, request)
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
        return pickle.loads(_read_exact(fd, size, deadline))

    def kill(self) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.proc.kill()
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(Exception):
                stream.close()


class Planner:
    """A few planner processes that :meth:`plan` texts with a time budget (see the module docstring).

    Args:
        catalog: the warehouse catalog every text is planned in.
        processes: planner processes (texts planned at once).
        timeout_s: one text's planning budget, seconds.
        memory_bytes: each process's address-space limit.
    """

    def __init__(self, catalog: Catalog, *, processes: int = 2, timeout_s: float = DEFAULT_PLAN_TIMEOUT_S,
                 memory_bytes: int = DEFAULT_PLANNER_MEMORY_BYTES) -> None:
        self.catalog = catalog
        self.processes = processes
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes

    def start(self) -> Planner:
        if isinstance(self.processes, bool) or not isinstance(self.processes, int) or self.processes < 1:
            raise ValueError(f"The 'plan_processes' option of the gateway must be an integer >= 1, "
                             f"got {self.processes!r}.")
        if not (isinstance(self.timeout_s, int | float) and self.timeout_s > 0):
            raise ValueError(f"The 'plan_timeout_s' option of the gateway must be a number of seconds > 0, "
                             f"got {self.timeout_s!r}.")
        self._idle: queue.Queue[_Process] = queue.Queue()
        self._lock = threading.Lock()
        self._all: list[_Process] = []
        self.counts = {"planned": 0, "timed_out": 0, "crashed": 0, "busy": 0, "replaced": 0}
        for _ in range(self.processes):
            self._add()
        # the first answer of each process pays for its imports: ask once now, not on a client's time
        for _ in range(self.processes):
            self.plan("SELECT 1", timeout_s=60.0)
        self.counts["planned"] = 0
        return self

    def _add(self) -> None:
        process = _Process(self.memory_bytes)
        with self._lock:
            self._all.append(process)
        self._idle.put(process)

    def _replace(self, process: _Process) -> None:
        process.kill()
        with self._lock:
            if process in self._all:
                self._all.remove(process)
            self.counts["replaced"] += 1
        self._add()

    def plan(self, text: str, session: Session | None = None, *, timeout_s: float | None = None) -> Plan:
        """``text`` planned in ``session`` (blocking; call it from a worker thread). Never raises."""
        budget = self.timeout_s if timeout_s is None else timeout_s
        try:
            process = self._idle.get(timeout=budget)
        except queue.Empty:
            self.counts["busy"] += 1
            return _refused("EXCEEDED_TIME_LIMIT", (
                f"Query exceeded the maximum planning time limit of {budget:g} s (plan_timeout_s): every one "
                f"of the gateway's {self.processes} planner(s) was busy for that long."))
        try:
            answer = process.ask((text, self.catalog, session), budget)
        except TimeoutError:
            self.counts["timed_out"] += 1
            self._replace(process)
            return _refused("EXCEEDED_TIME_LIMIT", (
                f"Query exceeded the maximum planning time limit of {budget:g} s (plan_timeout_s); the sloctl "
                f"gateway stopped planning it."))
        except (EOFError, OSError, pickle.UnpicklingError, struct.error):
            self.counts["crashed"] += 1
            self._replace(process)
            return _refused("EXCEEDED_LOCAL_MEMORY_LIMIT", (
                f"Query text could not be planned: the planner ended while reading it (memory bound "
                f"{self.memory_bytes // (1 << 20)} MB per planner); the sloctl gateway replaced it."))
        self._idle.put(process)
        self.counts["planned"] += 1
        return answer if isinstance(answer, Plan) else _refused("GENERIC_INTERNAL_ERROR",
                                                                 "The planner answered something other than a plan.")

    def status(self) -> dict[str, Any]:
        return {"processes": self.processes, "timeout_s": self.timeout_s,
                "memory_mb": self.memory_bytes // (1 << 20), **self.counts}

    def close(self) -> None:
        with self._lock:
            processes, self._all = list(getattr(self, "_all", [])), []
        for process in processes:
            process.kill()


# -- the planner process ------------------------------------------------------------------
def _limit_memory(memory_bytes: int) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ImportError, ValueError, OSError):  # not on this platform: the time budget still holds
        pass


def _serve(memory_bytes: int) -> None:
    """Read ``(text, catalog, session)`` frames from stdin, answer each with its Plan on stdout, until EOF."""
    _limit_memory(memory_bytes)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    threading.stack_size(256 << 20)  # deep ASTs recurse deeply: plan on a thread with room for it

    from sloctl.serving.gateway.dialect import plan

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the wire

    def one(request: tuple[str, Catalog, Session | None], out: list[Plan]) -> None:
        text, catalog, session = request
        try:
            out.append(plan(text, catalog, session))
        except MemoryError:
            out.append(_refused("EXCEEDED_LOCAL_MEMORY_LIMIT", (
                f"Query text needs more memory to plan than the gateway's planner may use "
                f"({memory_bytes // (1 << 20)} MB).")))
        except RecursionError:
            out.append(_refused("SYNTAX_ERROR", "Query text is nested too deeply to plan."))
        except BaseException as exc:  # noqa: BLE001  (one bad text never ends the planner)
            out.append(_refused("GENERIC_INTERNAL_ERROR", f"The query text could not be planned: "
                                                         f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"))

    while True:
        header = stdin.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        (size,) = _HEADER.unpack(header)
        request = pickle.loads(stdin.read(size))
        out: list[Plan] = []
        worker = threading.Thread(target=one, args=(request, out))
        worker.start()
        worker.join()
        _write_frame(stdout, out[0] if out else _refused("GENERIC_INTERNAL_ERROR", "The planner gave no answer."))


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PLANNER_MEMORY_BYTES)
