"""Progress of long jobs on stderr: a bar with an ETA on a terminal, periodic one-line reports otherwise.

Results go to stdout and progress never does, so ``sloctl ... --json | jq``
keeps working while a job runs for minutes. On a terminal the bar is
``rich.progress`` (description, bar, done/total, elapsed, ETA); when stderr
is not a terminal (a log file, CI, a pipe) a bar would fill the file with
control codes, so one plain line is printed at most every ``every_s``
seconds and once at the end::

    experiment trigger: 3/8 (38%), 41 s elapsed, ETA 68 s

``SLOCTL_PROGRESS`` overrides the choice: ``bar``, ``lines`` or ``off``.

A library function takes an ``on_progress(done, total)`` callback and knows
nothing of this module; the CLI passes :meth:`Progress.callback`::

    with progress("tune iconq", total=n_trials) as bar:
        study.optimize(objective, n_trials=n_trials, callbacks=[lambda s, t: bar.advance()])
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["Progress", "format_duration", "progress", "progress_mode"]

_MODES = ("bar", "lines", "off")


def progress_mode(stream: IO[str] | None = None) -> str:
    """``bar`` when ``stream`` (default stderr) is a terminal, else ``lines``; ``SLOCTL_PROGRESS`` overrides."""
    forced = os.environ.get("SLOCTL_PROGRESS", "").strip().lower()
    if forced:
        if forced not in _MODES:
            raise ValueError(f"The 'SLOCTL_PROGRESS' environment variable must be one of {', '.join(_MODES)}, "
                             f"got {forced!r}.")
        return forced
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


def format_duration(seconds: float) -> str:
    """``41 s``, ``3 min 05 s``, ``1 h 02 min``: what a person reads next to a progress figure."""
    if not math.isfinite(seconds):
        return "?"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class Progress:
    """One job's progress; use :func:`progress` to open one.

    Args:
        description: what is running (``"experiment trigger"``).
        total: units of work (trials, points, queries); None when unknown (no ETA).
        mode: ``bar``, ``lines`` or ``off`` (default: :func:`progress_mode`).
        stream: where it goes (default stderr).
        every_s: in ``lines`` mode, the least time between two lines.
        clock: seconds, monotonic (tests pass a fake one).
        heartbeat: in ``lines`` mode, also print the status every ``every_s``
            while nothing reports (a job without callbacks still shows it is
            alive and for how long); only with the real clock.
    """

    def __init__(self, description: str, total: float | None = None, *, mode: str | None = None,
                 stream: IO[str] | None = None, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, heartbeat: bool = True) -> None:
        self.description = description
        self.total = total
        self.mode = mode
        self.stream = stream
        self.every_s = every_s
        self.clock = clock
        self.heartbeat = heartbeat

    # -- lifecycle
    def __enter__(self) -> Progress:
        self._validate()
        self.stream_ = self.stream if self.stream is not None else sys.stderr
        self.mode_ = self.mode or progress_mode(self.stream_)
        self.completed_ = 0.0
        self.note_ = ""
        self.start_ = self.clock()
        self.last_line_ = self.start_
        self.bar_: Any = None
        if self.mode_ == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self.bar_ = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                     TextColumn("{task.fields[note]}"),
                                     console=Console(file=self.stream_),
                                     transient=False)
            self.bar_.start()
            self.task_ = self.bar_.add_task(self.description, total=self.total, note="")
        self.stop_ = threading.Event()
        self.lock_ = threading.Lock()
        self.beat_ = None
        if self.mode_ == "lines" and self.heartbeat and self.every_s > 0 and self.clock is time.monotonic:
            self.beat_ = threading.Thread(target=self._beat, name="sloctl-progress", daemon=True)
            self.beat_.start()
        return self

    def _beat(self) -> None:
        while not self.stop_.wait(self.every_s / 2):
            with self.lock_:
                if self.clock() - self.last_line_ >= self.every_s:
                    self._line()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop_.set()
        if self.beat_ is not None:
            self.beat_.join()
        if self.bar_ is not None:
            self.bar_.stop()
        elif self.mode_ == "lines" and exc_type is None:
            self._line(final=True)

    def _validate(self) -> None:
        if self.mode is not None and self.mode not in _MODES:
            raise ValueError(f"The 'mode' parameter must be one of {', '.join(_MODES)}, got {self.mode!r}.")
        if self.total is not None and not self.total >= 0:
            raise ValueError(f"The 'total' parameter must be >= 0 or None, got {self.total!r}.")
        if not self.every_s >= 0:
            raise ValueError(f"The 'every_s' parameter must be >= 0 seconds, got {self.every_s!r}.")

    # -- reporting
    def advance(self, amount: float = 1.0, *, note: str | None = None) -> None:
        """``amount`` more units done; ``note`` (e.g. the last point's result) is shown beside the figure."""
        self.update(self.completed_ + amount, note=note)

    def update(self, completed: float, *, total: float | None = None, note: str | None = None,
               description: str | None = None) -> None:
        """Set the units done (and, when it becomes known, the total)."""
        self.completed_ = float(completed)
        if total is not None:
            self.total = total
        if note is not None:
            self.note_ = note
        if description is not None:
            self.description = description
        if self.bar_ is not None:
            self.bar_.update(self.task_, completed=self.completed_, total=self.total, note=self.note_,
                             description=self.description)
        elif self.mode_ == "lines":
            with self.lock_:
                if self.clock() - self.last_line_ >= self.every_s:
                    self._line()

    def restart(self, *, total: float | None = None, description: str | None = None) -> None:
        """Begin a new round of the same job (an epoch): nothing done, elapsed time and ETA from now."""
        self.start_ = self.clock()
        if self.bar_ is not None:
            self.bar_.reset(self.task_, total=total if total is not None else self.total)
        self.update(0.0, total=total, description=description)

    def callback(self) -> Callable[[float, float], None]:
        """An ``on_progress(done, total)`` callback for library functions."""
        return lambda done, total: self.update(done, total=total)

    def log(self, message: str) -> None:
        """A line of its own on the same stream (above the bar on a terminal)."""
        if self.bar_ is not None:
            self.bar_.console.print(message, markup=False, highlight=False)
        elif self.mode_ != "off":
            print(message, file=self.stream_, flush=True)

    def eta_s(self) -> float:
        """Seconds left at the rate so far (inf when nothing is done yet or the total is unknown)."""
        elapsed = self.clock() - self.start_
        if self.total is None or self.completed_ <= 0:
            return math.inf
        return max(0.0, elapsed * (self.total - self.completed_) / self.completed_)

    def status_line(self) -> str:
        """``description: 3/8 (38%), 41 s elapsed, ETA 68 s``."""
        elapsed = self.clock() - self.start_
        done = _number(self.completed_)
        if self.total:
            head = f"{done}/{_number(self.total)} ({100 * self.completed_ / self.total:.0f}%)"
        elif self.completed_ > 0:
            head = f"{done} done"
        else:
            head = "running"
        text = f"{self.description}: {head}, {format_duration(elapsed)} elapsed"
        if self.total is not None and self.completed_ < self.total:
            text += f", ETA {format_duration(self.eta_s())}"
        return text + (f"; {self.note_}" if self.note_ else "")

    def _line(self, final: bool = False) -> None:
        self.last_line_ = self.clock()
        print(self.status_line() + (" (done)" if final else ""), file=self.stream_, flush=True)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


@contextmanager
def progress(description: str, total: float | None = None, **options: Any) -> Iterator[Progress]:
    """Open a :class:`Progress` for one job (keyword options as :class:`Progress`)."""
    with Progress(description, total, **options) as bar:
        yield bar
