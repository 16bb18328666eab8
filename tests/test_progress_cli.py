"""Long jobs report progress on stderr, never on stdout (issue 18: `experiment admission`, `experiment trigger`,
`tune iconq` showed one line, then nothing for minutes; results and progress shared stdout)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sloctl._cli_retry import retry_app

TANDEM = str(Path(__file__).resolve().parents[1] / "configs" / "networks" / "tandem.yaml")


def test_retry_simulate_progress_is_on_stderr_and_json_stays_clean(monkeypatch):
    monkeypatch.setenv("SLOCTL_PROGRESS", "lines")
    out = CliRunner().invoke(retry_app, ["simulate", "-n", TANDEM, "--duration-s", "20", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["duration_s"] == 20.0
    assert "retry simulate: simulated seconds: 20/20 (100%)" in out.stderr and "(done)" in out.stderr


def test_retry_sweep_counts_points_with_an_eta_on_stderr(monkeypatch):
    monkeypatch.setenv("SLOCTL_PROGRESS", "lines")
    out = CliRunner().invoke(retry_app, ["sweep", "-n", TANDEM, "--rho", "0.5,2", "--no-simulate", "--json"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.stdout)["points"]) == 4
    assert "retry sweep: points: 4/4 (100%)" in out.stderr
    assert "retry sweep" not in out.stdout
