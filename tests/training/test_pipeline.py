"""Training, registry and tuning on a small simulated log (fast, deterministic)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sloctl.config import load_config
from sloctl.datasets.interactions import FEATURE_SCHEMA_VERSION
from sloctl.registry.bundles import ModelSchemaError, check_log_schema, load_predictor, save_predictor
from sloctl.training.pipeline import evaluate_predictor, split_rows, train_stage


@pytest.fixture(scope="module")
def cfg():
    base = load_config()
    return dataclasses.replace(base, iconq=dataclasses.replace(base.iconq, max_epochs=25))


@pytest.fixture(scope="module")
def trained(trained_models):
    return {"stage": trained_models["stage"], "iconq": trained_models["iconq"]}


def test_split_is_by_query_seeded_and_disjoint():
    a, b = split_rows(100, 0.15, 0.15, seed=3), split_rows(100, 0.15, 0.15, seed=3)
    assert all((a[k] == b[k]).all() for k in a)
    assert sorted(np.concatenate(list(a.values()))) == list(range(100))
    assert len(a["val"]) == 15 and len(a["test"]) == 15


def test_iconq_beats_stage_on_queries_with_neighbours(trained):
    stage = trained["stage"].metrics["test_concurrent_q_error_p90"]
    iconq = trained["iconq"].metrics["test_concurrent_q_error_p90"]
    assert iconq < 0.7 * stage


def test_metrics_record_every_split(trained):
    for split in ("train", "val", "test"):
        for stat in ("p50", "p90", "p95"):
            assert trained["iconq"].metrics[f"{split}_q_error_{stat}"] >= 1.0


def test_bundle_round_trip_predicts_the_same(trained, sim_log, tmp_path):
    for result in trained.values():
        folder = save_predictor(result.predictor, tmp_path / result.predictor.kind)
        again = load_predictor(folder)
        np.testing.assert_allclose(again.predict(sim_log), result.predictor.predict(sim_log), rtol=1e-5)


def test_model_refuses_a_log_of_another_feature_schema(trained, tmp_path):
    predictor = trained["iconq"].predictor
    check_log_schema(predictor, {"plan_feature_version": predictor.plan_feature_version}, "log")
    check_log_schema(predictor, {"plan_feature_version": "1"}, "v1.parquet")  # upgraded on read: text columns NaN
    with pytest.raises(ModelSchemaError, match="schema version '0'.*trained on version"):
        check_log_schema(predictor, {"plan_feature_version": "0"}, "old.parquet")
    folder = save_predictor(predictor, tmp_path / "bundle")
    meta = (folder / "meta.json").read_text().replace(FEATURE_SCHEMA_VERSION, "iconq-0/plan-0")
    (folder / "meta.json").write_text(meta)
    with pytest.raises(ModelSchemaError, match="feature schema"):
        load_predictor(folder)


def test_evaluate_refuses_an_empty_log(trained, sim_log):
    with pytest.raises(ValueError, match="empty"):
        evaluate_predictor(trained["stage"].predictor, sim_log.iloc[:0])


def test_champion_alias_moves_only_on_improvement(sim_log, cfg, tmp_path):
    from mlflow import MlflowClient

    from sloctl.registry.store import register

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    good = train_stage(sim_log, cfg.stage)
    bad = train_stage(sim_log, dataclasses.replace(cfg.stage, n_estimators=1, use_cache=False))
    first = register(bad, sim_log, name="stage", tracking_uri=uri, experiment="t")
    assert first.champion and first.reason == "no champion yet"
    second = register(good, sim_log, name="stage", tracking_uri=uri, experiment="t")
    assert second.champion and second.new_score < second.old_score
    third = register(bad, sim_log, name="stage", tracking_uri=uri, experiment="t")
    assert not third.champion and "does not beat" in third.reason
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert str(client.get_model_version_by_alias("stage", "champion").version) == second.version
    run = client.get_run(third.run_id)
    assert run.data.tags["data_hash"] == good.data_hash
    assert run.data.tags["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert "val_q_error_p90" in run.data.metrics and "n_estimators" in run.data.params


def test_optuna_study_resumes_from_storage(sim_log, cfg, tmp_path):
    from sloctl.training.tune import tune

    cfg = dataclasses.replace(cfg, registry=dataclasses.replace(
        cfg.registry, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    storage = f"sqlite:///{tmp_path}/optuna.db"
    first = tune("stage", sim_log, cfg, trials=2, storage=storage, study_name="s")
    second = tune("stage", sim_log, cfg, trials=2, storage=storage, study_name="s")
    assert (first.n_trials, second.n_trials, second.n_new) == (2, 4, 2)
    assert second.best_value <= first.best_value
    assert second.mlflow_run_id is not None


def test_arrival_neighbours_see_only_earlier_queries(trained, sim_log):
    predictor = trained["iconq"].predictor
    before, after = predictor._neighbours(sim_log, "arrival").lists()
    overlap_before, _ = predictor._neighbours(sim_log, "overlap").lists()
    assert all(len(a) == 0 for a in after)
    assert all(np.array_equal(b, o) for b, o in zip(before, overlap_before, strict=True))


def test_router_margin_is_calibrated_from_the_log_and_grows_with_risk(trained, sim_log):
    from sloctl.models.calibration import calibrate_slo_margin

    predictor = trained["iconq"].predictor
    low = calibrate_slo_margin(predictor, sim_log, 0.5)
    high = calibrate_slo_margin(predictor, sim_log, 0.9)
    assert 0.0 <= low.slo_margin <= high.slo_margin < 1.0
    assert high.ratio_at_quantile >= low.ratio_at_quantile
    assert high.queries == int((sim_log["status"] == "ok").sum())
    with pytest.raises(ValueError, match="risk_quantile"):
        calibrate_slo_margin(predictor, sim_log, 1.5)
