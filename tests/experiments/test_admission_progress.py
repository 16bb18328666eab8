"""`sloctl experiment admission` reports its progress with a total, so a bar or line shows an ETA (issue 18:
long jobs showed one line, then nothing for minutes); progress goes to stderr, the JSON result to stdout."""

from __future__ import annotations

import functools
import json

import pytest
from typer.testing import CliRunner

from sloctl.experiments import admission
from sloctl.experiments.admission_bandit import tuner_factories

TINY = {"load_factor": 2.0, "duration_s": 0.004, "loads": (2.0,), "mixes": ("50/50",), "sweep_duration_s": 0.004,
        "bandit_seeds": (0,), "bus_losses": (0.2,), "convergence_change_s": 0.002, "convergence_end_s": 0.004,
        "convergence_probe_s": 0.001}


@pytest.mark.slow
def test_the_callback_counts_every_run_and_reaches_a_total_known_from_the_start():
    calls: list[tuple[int, int]] = []
    result = admission.admission_experiment(**TINY, on_progress=lambda done, total: calls.append((done, total)))
    n = len(admission.APPROACHES)
    # overload + sweep (1 mix x 1 load) + 16 static capacities before and after + Svalinn + 2 drop-utility runs
    # + one seed per bandit tuner + two runs per bus-loss γ
    expected = n + n + (2 * 16 + 1) + 2 + len(tuner_factories()) + 2
    assert calls[0] == (0, expected)
    assert {total for _, total in calls} == {expected}
    assert [done for done, _ in calls] == list(range(expected + 1))  # one call per unit, in order
    assert result["sweep"] and result["bandit"]["clean"] and result["bus_loss_sensitivity"]


def test_the_cli_shows_runs_done_of_the_total_on_stderr_and_keeps_stdout_json(monkeypatch):
    tiny = {k: v for k, v in TINY.items() if k.startswith("convergence_")}
    monkeypatch.setattr(admission, "admission_experiment", functools.partial(admission.admission_experiment, **tiny))
    monkeypatch.setenv("SLOCTL_PROGRESS", "lines")
    from sloctl.cli import app

    out = CliRunner().invoke(app, ["experiment", "admission", "--json", "--loads", "2", "--mixes", "50/50",
                                   "--duration-s", "0.004", "--sweep-duration-s", "0.004", "--bandit-seeds", "0",
                                   "--plots", ""])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["sweep"][0]["mix"] == "50/50"
    total = 5 + 5 + 33 + 2
    assert f"experiment admission: runs: {total}/{total} (100%)" in out.stderr and "(done)" in out.stderr
    assert "experiment admission" not in out.stdout
