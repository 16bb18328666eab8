"""A log imported from another engine's history trains, tunes, evaluates and predicts with no database present.

The executions are the synthetic processor-sharing log of conftest (exact
concurrency, isolated passes for Stage), each template given a TPC-H query's
text, written in the canonical CSV form of docs/querylog.md ("Importing
executions") and imported with ``sloctl import executions``. The data folder
the CLI is pointed at is empty, so any step that reached for a DuckDB
database would fail.
"""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def imported(sim_log, tpch_templates, tmp_path_factory, run_sloctl):
    root = tmp_path_factory.mktemp("imported")
    texts = {f"t{i:02d}": t.sql for i, t in enumerate(tpch_templates[:12])}
    log = sim_log[sim_log["cluster_size"] == 1]
    csv = log.assign(sql=log["template"].map(texts))[
        ["sql", "arrival_s", "start_s", "end_s", "status", "cluster_id", "cluster_size"]]
    csv.to_csv(root / "history.csv", index=False)
    (root / "catalog.csv").write_text("table,rows,bytes\nlineitem,60175,8000000\norders,15000,1700000\n"
                                      "customer,1500,250000\npart,2000,260000\npartsupp,8000,1200000\n"
                                      "supplier,100,15000\nnation,25,3000\nregion,5,600\n")
    (root / "data").mkdir()
    result = run_sloctl("import", "executions", root / "history.csv", "--catalog", root / "catalog.csv",
                        "--out", root / "log.parquet", "--json")
    assert result.returncode == 0, result.stderr
    return root, json.loads(result.stdout), len(log)


def test_import_accounts_for_every_row(imported):
    _, report, n = imported
    counts = report.get("report", report)
    assert counts["read"] == n
    assert counts["imported"] + counts["censored"] + counts["refused"] == counts["read"]
    assert counts["refused"] == 0


@pytest.mark.slow
def test_train_tune_evaluate_predict_and_ablation_without_a_database(imported, run_sloctl):
    root, _, _ = imported
    log = root / "log.parquet"
    data = ["--data-dir", root / "data"]
    stage = run_sloctl("train", "stage", "--log", log, "--no-register", "--out", root / "stage", "--json")
    assert stage.returncode == 0, stage.stderr
    meta = json.loads((root / "stage" / "meta.json").read_text())
    assert meta["provenance"]["feature_sources"] == ["text+catalog"]
    assert not [c for c in meta["feature_columns"] if not c.startswith(("f_t_", "f_c_"))]

    iconq = run_sloctl("train", "iconq", "--log", log, "--no-register", "--out", root / "iconq", "--max-epochs",
                       "3", "--variant", "iconq_plus")
    assert iconq.returncode == 0, iconq.stderr
    scored = run_sloctl("evaluate", "predictor", "--log", log, "--model", root / "iconq", "--json")
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)["n"] > 0

    template = meta_template(root / "stage")
    predicted = run_sloctl("predict", "--template", template, "--size", "1", "--model", root / "stage", *data,
                           "--json")
    assert predicted.returncode == 0, predicted.stderr
    assert json.loads(predicted.stdout)["latency_s"] > 0

    tuned = run_sloctl("tune", "stage", "--log", log, "--trials", "2", "--storage",
                       f"sqlite:///{root / 'optuna.db'}", "--json")
    assert tuned.returncode == 0, tuned.stderr
    ablation = run_sloctl("experiment", "ablation", "--log", log, "--models", "Stage", "--seeds", "0", "--json",
                          env={"SLOCTL_PROGRESS": "lines"})
    assert ablation.returncode == 0, ablation.stderr
    assert "experiment ablation: runs: 1/1 (100%)" in ablation.stderr and "seed 0 Stage" in ablation.stderr


def meta_template(bundle) -> str:
    import pandas as pd

    return str(pd.read_parquet(bundle / "templates.parquet")["template"].iloc[0])


def test_stage_learns_from_every_execution_when_a_log_has_no_isolated_run(sim_log):
    """Users' logs may have no query that ran alone: ``stage.train_on: all`` trains Stage on them anyway."""
    import dataclasses

    from sloctl.datasets.analysis import overlap_counts
    from sloctl.models.stage import StageConfig
    from sloctl.training.pipeline import train_stage

    # overlap is mutual: dropping the rows that ran alone leaves every other row with its neighbours
    busy = sim_log[(overlap_counts(sim_log) > 0).to_numpy()].reset_index(drop=True)
    config = StageConfig(n_estimators=20)
    with pytest.raises(ValueError, match="stage.train_on: all"):
        train_stage(busy, config, risk_quantile=None)
    result = train_stage(busy, dataclasses.replace(config, train_on="all"), risk_quantile=None)
    assert result.selection_metric == "val_q_error_p90" and result.params["train_on"] == "all"
    assert result.metrics["val_q_error_p90"] >= 1.0


def test_train_stage_on_every_execution_from_the_cli(imported, run_sloctl):
    root, _, _ = imported
    bad = run_sloctl("train", "stage", "--log", root / "log.parquet", "--train-on", "busy", "--no-register")
    assert bad.returncode == 2 and "--train-on" in bad.stderr
    out = root / "stage-all"
    done = run_sloctl("train", "stage", "--log", root / "log.parquet", "--train-on", "all", "--no-register",
                      "--out", out, "--json")
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stage"]["config"]["train_on"] == "all"  # the bundle says what Stage learnt from
