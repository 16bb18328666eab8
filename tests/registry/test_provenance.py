"""Provenance: models record what they were trained on; the champion gate, predict, evaluate and serve use it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sloctl.registry.provenance import Provenance, log_provenance, row_sources, source_key

SF1 = {"benchmark": "tpch", "scale_factor": "1"}
SF01 = {"benchmark": "tpch", "scale_factor": "0.1"}


@pytest.fixture(scope="module")
def stages(sim_log):
    """A weak Stage (one tree, no cache) and a good one, both on the synthetic log."""
    from sloctl.config import load_config
    from sloctl.training.pipeline import train_stage

    cfg = load_config()
    return {"bad": train_stage(sim_log, dataclasses.replace(cfg.stage, n_estimators=1, use_cache=False),
                               risk_quantile=None),
            "good": train_stage(sim_log, cfg.stage, risk_quantile=None)}


def _merged_metadata(first: dict, second: dict) -> dict[str, str]:
    """Metadata of a two-run merged log (as sloctl log merge writes it)."""
    return {"merged_from": json.dumps([{"run": 0, "metadata": first}, {"run": 1, "metadata": second}])}


def test_scale_factors_are_compared_as_numbers_and_merged_logs_per_run(sim_log):
    assert source_key("TPCH", "1.0") == source_key("tpch", 1) == "tpch@1"
    assert source_key(None, None) == "unknown@unknown"
    log = sim_log.assign(run=np.where(np.arange(len(sim_log)) < 100, 0, 1))
    rows = row_sources(log, _merged_metadata(SF1, SF01))
    assert set(rows[:100]) == {"tpch@1"} and set(rows[100:]) == {"tpch@0.1"}
    prov = log_provenance(log, _merged_metadata(SF1, SF01), logs="a.parquet,b.parquet")
    assert prov.sources == ("tpch@0.1", "tpch@1") and prov.cluster_sizes == (1, 2) and len(prov.run_hashes) == 2
    assert Provenance.from_tags(prov.to_tags()) == prov
    assert Provenance.from_dict(json.loads(json.dumps(prov.to_dict()))) == prov


@pytest.mark.slow
def test_a_model_of_another_scale_factor_does_not_replace_the_champion(stages, sim_log, tmp_path):
    """Issue 18: an SF 0.1 model replaced the SF 1 champion because it was scored on SF 0.1 rows."""
    from mlflow import MlflowClient

    from sloctl.registry.store import register

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = register(stages["bad"], sim_log, name="stage", tracking_uri=uri, experiment="t", log_metadata=SF1)
    assert first.champion
    # the candidate is much better on its own rows: the old gate moved the alias to it
    second = register(stages["good"], sim_log, name="stage", tracking_uri=uri, experiment="t", log_metadata=SF01)
    assert not second.champion
    assert second.reason.startswith("refused") and "tpch SF 1" in second.reason and "tpch SF 0.1" in second.reason
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert str(client.get_model_version_by_alias("stage", "champion").version) == first.version
    run = client.get_run(second.run_id)
    assert run.data.tags["provenance.benchmark"] == "tpch" and run.data.tags["provenance.scale_factor"] == "0.1"
    assert run.data.tags["provenance.cluster_sizes"] == "1,2"
    assert run.data.tags["provenance.log_hash"] == second.provenance.log_hash
    contexts = {d.dataset.name: [t.value for t in d.tags if t.key == "mlflow.data.context"]
                for d in run.inputs.dataset_inputs}
    assert contexts == {"stage-train": ["training"], "stage-val": ["validation"], "stage-test": ["test"]}


def test_a_candidate_covering_the_champion_is_scored_on_the_champions_rows_only(stages, sim_log, tmp_path):
    from sloctl.registry.store import register

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert register(stages["bad"], sim_log, name="stage", tracking_uri=uri, experiment="t", log_metadata=SF1).champion
    merged = sim_log.assign(run=np.where(np.arange(len(sim_log)) % 2 == 0, 0, 1))
    meta = _merged_metadata(SF1, SF01)
    second = register(stages["good"], merged, name="stage", tracking_uri=uri, experiment="t", log_metadata=meta)
    assert second.champion and "validation rows of the champion's provenance" in second.reason
    val = np.asarray(stages["good"].splits["val"])
    n_sf1 = int((row_sources(merged, meta)[val] == "tpch@1").sum())
    assert f"on the {n_sf1} validation rows" in second.reason and 0 < n_sf1 < len(val)


def test_a_champion_without_provenance_is_still_compared(stages, sim_log, tmp_path):
    from sloctl.registry.store import register

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    register(stages["bad"], sim_log, name="stage", tracking_uri=uri, experiment="t")
    second = register(stages["good"], sim_log, name="stage", tracking_uri=uri, experiment="t")
    assert second.champion and "beats" in second.reason  # both unknown@unknown: same provenance


def test_mismatch_names_what_the_model_was_not_trained_on():
    prov = Provenance(sources=("tpch@1",), cluster_sizes=(1, 2))
    assert prov.mismatch(sources=["tpch@1"], cluster_sizes=[2]) is None
    why = prov.mismatch(sources=["tpch@0.1"], cluster_sizes=[4])
    assert "tpch SF 1" in why and "tpch SF 0.1" in why and "cluster size 4" in why
    assert prov.mismatch(sources=["unknown@unknown"], cluster_sizes=[1]) is None  # nothing says they differ


def test_predict_and_evaluate_check_the_models_provenance(stages, sim_log, tmp_path, tpch_db, iso_log):
    """Issue 18: predict never checked benchmark, scale factor or cluster sizes."""
    from typer.testing import CliRunner

    from sloctl.cli import app
    from sloctl.datasets.querylog import write_log
    from sloctl.models.predictor import LatencyPredictor
    from sloctl.registry.bundles import save_predictor
    from sloctl.training.pipeline import fit_stage

    stage = fit_stage(iso_log, np.arange(len(iso_log)), stages["good"].predictor.stage.config_,
                      np.zeros(len(iso_log), int))
    bundle = save_predictor(LatencyPredictor(stage), tmp_path / "b",
                            provenance=Provenance(sources=("tpch@1",), cluster_sizes=(1,)))
    runner = CliRunner()
    args = ["predict", "--template", "tpch-q05", "--size", "1", "--model", str(bundle), "--sf", "0.01",
            "--data-dir", str(tpch_db.parent), "--json"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    assert "tpch SF 1" in refused.output and "tpch SF 0.01" in refused.output and "--allow-mismatch" in refused.output
    allowed = runner.invoke(app, [*args, "--allow-mismatch"])
    assert allowed.exit_code == 0, allowed.output
    write_log(sim_log, tmp_path / "log.parquet", metadata=SF01)
    bundle2 = save_predictor(stages["good"].predictor, tmp_path / "b2",
                             provenance=Provenance(sources=("tpch@1",), cluster_sizes=(1, 2)))
    scored = runner.invoke(app, ["evaluate", "predictor", "--log", str(tmp_path / "log.parquet"), "--model",
                                 str(bundle2), "--json"])
    assert scored.exit_code == 0, scored.output
    assert "warning:" in scored.stderr and "tpch SF 0.1" in scored.stderr
    assert "tpch SF 0.1" in json.loads(scored.stdout)["provenance_mismatch"]


def test_serve_is_told_when_its_templates_log_is_not_the_models(stages, sim_log, tmp_path):
    from sloctl.datasets.querylog import write_log
    from sloctl.registry.store import log_mismatch, register

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    register(stages["good"], sim_log, name="stage", tracking_uri=uri, experiment="t", log_metadata=SF1)
    write_log(sim_log, tmp_path / "sf01.parquet", metadata=SF01)
    write_log(sim_log, tmp_path / "sf1.parquet", metadata=SF1)
    assert "tpch SF 0.1" in log_mismatch("models:/stage@champion", tmp_path / "sf01.parquet", tracking_uri=uri)
    assert log_mismatch("models:/stage@champion", tmp_path / "sf1.parquet", tracking_uri=uri) is None
    assert log_mismatch("models:/iconq@champion", tmp_path / "sf01.parquet", tracking_uri=uri) is None  # none
