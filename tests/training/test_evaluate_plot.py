"""`sloctl evaluate predictor --plot`: predicted vs actual written where asked, results still on stdout."""

from __future__ import annotations

import json

import matplotlib
import pytest
from typer.testing import CliRunner

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def stage_bundle(tmp_path_factory, sim_log):
    from sloctl.config import load_config
    from sloctl.datasets.querylog import write_log
    from sloctl.registry.bundles import save_predictor
    from sloctl.training.pipeline import train_stage

    folder = tmp_path_factory.mktemp("evaluate")
    write_log(sim_log, folder / "log.parquet")
    result = train_stage(sim_log, load_config().stage)
    save_predictor(result.predictor, folder / "stage_bundle")
    return folder


@pytest.mark.slow  # trains a Stage model (about 10-20 s on 2 cores)
def test_evaluate_plot_writes_predicted_vs_actual_and_keeps_json_on_stdout(stage_bundle, monkeypatch):
    import sloctl.plots as plots
    from sloctl.cli import app

    figures = []
    real = plots.predicted_vs_actual_figure
    monkeypatch.setattr(plots, "predicted_vs_actual_figure", lambda *a, **k: figures.append(real(*a, **k)) or
                        figures[-1])
    monkeypatch.chdir(stage_bundle)
    out = CliRunner().invoke(app, ["evaluate", "predictor", "--log", "log.parquet", "--model", "stage_bundle",
                                   "--json", "--plot", "reports/evaluate.png"])
    assert out.exit_code == 0, out.output
    n = json.loads(out.stdout)["n"]
    assert (stage_bundle / "reports" / "evaluate.png").is_file() and "wrote reports/evaluate.png" in out.stderr
    (ax,) = figures[0].axes
    assert ax.get_xlabel() == "actual latency (s)" and ax.get_ylabel() == "predicted latency (s)"
    points = sum(len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets") and
                 c.get_offsets().shape[1:] == (2,) and len(c.get_offsets()) > 2)
    assert points == n  # one point per ok query, the rows the Q-errors are computed on
