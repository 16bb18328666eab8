"""Progress of long jobs: on stderr, a bar on a terminal, periodic lines elsewhere, never on stdout."""

from __future__ import annotations

import io
import threading

import pytest

from sloctl.core.progress import Progress, format_duration, progress, progress_mode


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_mode_prints_periodic_lines_with_eta_and_a_final_line():
    out, clock = io.StringIO(), FakeClock()
    with progress("experiment trigger", total=4, mode="lines", stream=out, every_s=10, clock=clock) as bar:
        clock.now = 5
        bar.advance()          # 5 s since start: too soon for a line
        clock.now = 20
        bar.advance(note="vr 0.12")
    lines = out.getvalue().splitlines()
    assert lines[0] == "experiment trigger: 2/4 (50%), 20 s elapsed, ETA 20 s; vr 0.12"
    assert lines[-1].startswith("experiment trigger: 2/4") and lines[-1].endswith("(done)")
    assert len(lines) == 2


def test_progress_goes_to_stderr_not_stdout(capsys, monkeypatch):
    monkeypatch.delenv("SLOCTL_PROGRESS", raising=False)
    with progress("retry sweep", total=2, every_s=0) as bar:
        bar.advance()
        bar.log("point 1 done")
        bar.advance()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "retry sweep: 1/2 (50%)" in captured.err and "point 1 done" in captured.err


def test_bar_mode_renders_with_rich_and_stops():
    out = io.StringIO()
    with Progress("tune iconq", total=3, mode="bar", stream=out) as bar:
        for _ in range(3):
            bar.advance()
    assert "tune iconq" in out.getvalue() and "3/3" in out.getvalue()


def test_off_mode_prints_nothing():
    out = io.StringIO()
    with progress("x", total=1, mode="off", stream=out) as bar:
        bar.advance()
        bar.log("hidden")
    assert out.getvalue() == ""


def test_mode_follows_the_terminal_and_the_environment(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("SLOCTL_PROGRESS", raising=False)
    assert progress_mode(Tty()) == "bar"
    assert progress_mode(io.StringIO()) == "lines"
    monkeypatch.setenv("SLOCTL_PROGRESS", "off")
    assert progress_mode(Tty()) == "off"
    monkeypatch.setenv("SLOCTL_PROGRESS", "sometimes")
    with pytest.raises(ValueError, match="SLOCTL_PROGRESS"):
        progress_mode()


def test_unknown_total_has_no_eta_and_callback_sets_the_total():
    out, clock = io.StringIO(), FakeClock()
    with progress("collect", mode="lines", stream=out, every_s=0, clock=clock) as bar:
        clock.now = 3
        bar.update(2)
        assert "ETA" not in bar.status_line()
        bar.callback()(3, 6)
        assert bar.total == 6 and "ETA 3 s" in bar.status_line()


def test_format_duration_reads_like_a_person_writes():
    assert format_duration(41.4) == "41 s"
    assert format_duration(185) == "3 min 05 s"
    assert format_duration(3720) == "1 h 02 min"
    assert format_duration(float("inf")) == "?"


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="'mode'"), progress("x", mode="fancy"):
        pass
    with pytest.raises(ValueError, match="'total'"), progress("x", total=-1):
        pass


def test_a_job_without_callbacks_still_reports_that_it_runs():
    out = io.StringIO()
    with progress("experiment admission", mode="lines", stream=out, every_s=0.05) as bar:
        for _ in range(500):  # wait for the heartbeat's first line (no assertion on how long it takes)
            if "running" in out.getvalue():
                break
            threading.Event().wait(0.01)
        assert bar.beat_ is not None
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("experiment admission: running, ") and lines[-1].endswith("(done)")
