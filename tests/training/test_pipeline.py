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


def test_batches_grow_with_the_data_and_the_learning_rate_with_them():
    from sloctl.core.config import IconqSection
    from sloctl.training.pipeline import batch_plan

    cfg = IconqSection()
    assert batch_plan(cfg, 2_000) == (32, pytest.approx(cfg.lr))  # small logs train as before
    batch, lr = batch_plan(cfg, 26_000)
    assert batch == 128 and lr == pytest.approx(cfg.lr * 2.0)
    assert batch_plan(cfg, 5_000_000)[0] == cfg.max_batch_size
    assert batch_plan(dataclasses.replace(cfg, lr_scaling="none"), 26_000)[1] == pytest.approx(cfg.lr)


def test_auto_precision_is_bfloat16_only_for_large_batches_on_hardware_that_has_it(monkeypatch):
    import torch

    from sloctl.core.config import IconqSection
    from sloctl.training.pipeline import BF16_MIN_BATCH, precision_plan

    cfg = IconqSection()
    assert cfg.precision == "auto" and precision_plan(cfg, 32) == "32-true"  # small logs train as before
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert precision_plan(cfg, BF16_MIN_BATCH) == "bf16-mixed"
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert precision_plan(cfg, 1024) == "32-true"
    assert precision_plan(dataclasses.replace(cfg, precision="bf16-mixed"), 32) == "bf16-mixed"  # as asked


def test_a_wall_clock_budget_ends_training_with_the_best_checkpoint_and_says_so(sim_log, cfg):
    from sloctl.training.pipeline import train_iconq

    budget = dataclasses.replace(cfg.iconq, max_epochs=1000, patience=1000, max_train_s=3.0)
    result = train_iconq(sim_log, cfg.stage, budget, risk_quantile=None)
    assert result.params["iconq_stopped_by"] == "max_train_s" and result.metrics["epochs"] < 1000
    assert np.isfinite(result.metrics["val_q_error_p90"]) and result.metrics["train_wall_s"] < 60


def test_each_epoch_reports_its_progress_and_the_rate_is_recorded(sim_log, cfg):
    from sloctl.training.pipeline import train_iconq

    seen: list[tuple[int, int, int]] = []
    result = train_iconq(sim_log, cfg.stage, dataclasses.replace(cfg.iconq, max_epochs=2), risk_quantile=None,
                         on_batch=lambda e, done, total, rate: seen.append((e, done, total)))
    total = int(result.metrics["train_samples"])
    assert result.params["iconq_stopped_by"] == "max_epochs" and result.metrics["train_samples_per_s"] > 0
    for epoch in (0, 1):  # each epoch starts at 0 and ends having seen every training sample once
        done = [d for e, d, t in seen if e == epoch and t == total]
        assert done[0] == 0 and done[-1] == total and done == sorted(done)


def test_config_refuses_a_batch_cap_below_the_batch_and_a_bad_budget():
    from sloctl.core.config import IconqSection
    from sloctl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="iconq.max_batch_size"):
        IconqSection(batch_size=64, max_batch_size=32)
    with pytest.raises(ConfigError, match="iconq.max_train_s"):
        IconqSection(max_train_s=0.0)


def test_the_learning_curve_adds_data_while_it_helps_and_keeps_the_best(sim_log, cfg):
    from sloctl.training.pipeline import curve_rows, iconq_splits, learn_iconq, train_iconq_curve

    assert curve_rows(250_000) == [10_000, 30_000, 100_000, 250_000] and curve_rows(5_000) == [5_000]
    small = dataclasses.replace(cfg.iconq, max_epochs=4, split="time")
    points = []
    result = train_iconq_curve(sim_log, cfg.stage, small, points=(60, 150), full=True, risk_quantile=None,
                               on_point=points.append)
    pool = len(iconq_splits(sim_log, small)["train"])
    assert [p.rows for p in points] == [60, 150, pool]
    assert [p["rows"] for p in result.params["iconq_curve"]] == [60, 150, pool]
    best = min(points, key=lambda p: p.val_q_error_p90)
    assert result.params["iconq_learned_rows"] == best.rows == result.metrics["learned_rows"]
    assert result.metrics["val_q_error_p90"] == pytest.approx(best.val_q_error_p90)
    # a tolerance no larger prefix can meet stops after the second point, keeping the better of the two
    strict = dataclasses.replace(small, curve_tolerance=0.99)
    stopped = train_iconq_curve(sim_log, cfg.stage, strict, points=(60, 150), risk_quantile=None)
    assert len(stopped.params["iconq_curve"]) == 2 and stopped.params["iconq_curve_stop"].startswith("plateau")
    # a log smaller than the first point trains once, on every training row, as before
    once = learn_iconq(sim_log, cfg.stage, small, risk_quantile=None)
    assert "iconq_curve" not in once.params


def test_a_time_split_validates_and_tests_on_the_latest_rows(sim_log, cfg):
    from sloctl.training.pipeline import iconq_splits

    splits = iconq_splits(sim_log, dataclasses.replace(cfg.iconq, split="time"))
    arrival = sim_log["arrival_s"].to_numpy()
    assert arrival[splits["train"]].max() <= arrival[splits["val"]].min()
    assert arrival[splits["val"]].max() <= arrival[splits["test"]].min()
    assert sorted(np.concatenate(list(splits.values()))) == list(range(len(sim_log)))


def test_large_logs_validate_every_check_every_samples_small_ones_once_an_epoch():
    from sloctl.core.config import IconqSection
    from sloctl.training.pipeline import check_interval

    cfg = IconqSection()
    assert check_interval(cfg, 50_000, 256) == 1.0
    assert check_interval(cfg, 2_000_000, 256) == -(-250_000 // 256)
    # each of 2 data-parallel processes takes half the batches: a check every 250k samples over both
    two = dataclasses.replace(cfg, devices=2)
    assert check_interval(two, 2_000_000, 256) == -(-250_000 // 512)
    assert check_interval(two, 200_000, 256) == 1.0


def test_validation_during_training_watches_a_seeded_sample_of_a_large_split(cfg):
    from sloctl.training.pipeline import watched_rows

    rows = np.arange(100_000)
    picked = watched_rows(rows, cfg.iconq)
    assert len(picked) == cfg.iconq.max_val_rows and np.array_equal(picked, watched_rows(rows, cfg.iconq))
    assert np.isin(picked, rows).all() and np.array_equal(picked, np.sort(picked))
    assert np.array_equal(watched_rows(rows[:500], cfg.iconq), rows[:500])
    assert len(watched_rows(rows, dataclasses.replace(cfg.iconq, max_val_rows=None))) == len(rows)


def test_a_margin_on_a_long_log_is_calibrated_on_whole_clusters_or_a_window(sim_log):
    import pandas as pd

    from sloctl.models.calibration import calibration_rows

    assert calibration_rows(sim_log, max_rows=len(sim_log)) is sim_log
    many = pd.concat([sim_log.assign(cluster_id=sim_log["cluster_id"] + f"/{k}") for k in range(20)],
                     ignore_index=True)
    part = calibration_rows(many, max_rows=1000, seed=1)
    sizes = many["cluster_id"].value_counts()
    kept = part["cluster_id"].value_counts()
    assert 1000 <= len(part) < 1000 + sizes.max() and (kept == sizes[kept.index]).all()  # clusters kept whole
    one = sim_log.assign(cluster_id="all")
    window = calibration_rows(one, max_rows=100)
    assert len(window) == 100
    middle = one["arrival_s"].sort_values().iloc[(len(one) - 100) // 2]
    assert window["arrival_s"].min() == middle


def test_shared_passes_are_for_large_batches_unless_asked(sim_log, cfg):
    """Small logs train exactly as before (each sample drawn alone); ``on`` shares, and the model still learns."""
    from sloctl.training.pipeline import train_iconq

    few = dataclasses.replace(cfg.iconq, max_epochs=2, learn_rows="all")
    auto = train_iconq(sim_log, cfg.stage, few, risk_quantile=None)
    assert auto.params["iconq_batch_size_used"] < 512 and auto.params["iconq_shared_passes_used"] is False
    on = train_iconq(sim_log, cfg.stage, dataclasses.replace(few, shared_passes="on"), risk_quantile=None)
    assert on.params["iconq_shared_passes_used"] is True and np.isfinite(on.metrics["test_q_error_p90"])
    off = train_iconq(sim_log, cfg.stage, dataclasses.replace(few, shared_passes="off"), risk_quantile=None)
    assert off.metrics["test_q_error_p90"] == pytest.approx(auto.metrics["test_q_error_p90"])
