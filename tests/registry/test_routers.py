"""The model bundle carries the router's SLO margin and template table; serve and the CLI build the same router."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from sloctl.control.billing import BillingTimer
from sloctl.control.router import ClusterState, IconqRouter, Query, RoundRobinRouter, StageCostRouter
from sloctl.core.config import RouterSection
from sloctl.datasets.querylog import template_table, write_log
from sloctl.models.calibration import calibrate_slo_margin
from sloctl.registry.bundles import TEMPLATES_FILE, load_predictor, save_predictor
from sloctl.registry.routers import DEFAULT_SLO_MARGIN, build_router


@pytest.fixture(scope="module")
def cfg(trained_models):
    return trained_models["config"]


@pytest.fixture(scope="module")
def trained(trained_models):
    return trained_models["iconq"]


def _old_bundle(predictor, folder):
    """A bundle as sloctl wrote it before margins and template tables travelled with the model."""
    save_predictor(predictor, folder)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["router_calibration"], meta["templates"]
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / TEMPLATES_FILE).unlink()
    return folder


def test_trained_bundle_carries_margin_and_template_table(trained, sim_log, cfg, tmp_path):
    predictor = trained.predictor
    expected = calibrate_slo_margin(predictor, sim_log, cfg.router.risk_quantile)
    assert predictor.calibration == expected and predictor.slo_margin == expected.slo_margin
    assert trained.metrics["slo_margin"] == expected.slo_margin
    assert trained.params["router_risk_quantile"] == cfg.router.risk_quantile
    assert set(predictor.templates["template"]) == set(sim_log["template"])
    loaded = load_predictor(save_predictor(predictor, tmp_path / "bundle"))
    assert loaded.calibration == expected and loaded.calibration.risk_quantile == cfg.router.risk_quantile
    pd.testing.assert_frame_equal(loaded.templates, template_table(sim_log))


def test_old_bundle_loads_without_margin_or_table(trained, sim_log, tmp_path):
    old = load_predictor(_old_bundle(trained.predictor, tmp_path / "old"))
    assert old.calibration is None and old.slo_margin is None and old.templates is None
    np.testing.assert_allclose(old.predict(sim_log), trained.predictor.predict(sim_log), rtol=1e-5)
    # No table anywhere: round-robin, as before.
    assert isinstance(build_router(old, RouterSection()).router, RoundRobinRouter)


def test_margin_comes_from_config_then_bundle_then_log_then_default(trained, sim_log, tmp_path):
    new, table = trained.predictor, template_table(sim_log)
    old = load_predictor(_old_bundle(new, tmp_path / "old"))
    configured = build_router(new, RouterSection(slo_margin=0.05), log=sim_log)
    assert configured.margin.source == "config" and configured.router.slo_margin == 0.05
    # The bundle's margin wins over a log at hand (here a different one, which would calibrate otherwise).
    bundled = build_router(new, RouterSection(), log=sim_log.iloc[: len(sim_log) // 3])
    assert bundled.margin.source == "bundle" and bundled.router.slo_margin == new.slo_margin
    said: list[str] = []
    calibrated = build_router(old, RouterSection(risk_quantile=0.6), templates=table, log=sim_log, say=said.append)
    assert calibrated.margin.source == "calibrated" and said and "router SLO margin" in said[0]
    assert calibrated.router.slo_margin == calibrate_slo_margin(old, sim_log, 0.6).slo_margin
    with pytest.warns(UserWarning, match="default"):
        defaulted = build_router(old, RouterSection(), templates=table)
    assert defaulted.margin.source == "default" and defaulted.router.slo_margin == DEFAULT_SLO_MARGIN


def test_explicit_templates_override_the_bundle_and_stage_uses_no_margin(trained, sim_log):
    subset = template_table(sim_log).iloc[:3]
    built = build_router(trained.predictor, RouterSection(), templates=subset)
    assert isinstance(built.router, IconqRouter) and built.templates is subset
    assert list(built.online.templates["template"]) == list(subset["template"])
    stage = build_router(trained.predictor, RouterSection(), use_iconq=False)
    assert isinstance(stage.router, StageCostRouter) and stage.margin is None
    pd.testing.assert_frame_equal(stage.templates, trained.predictor.templates)


def _decisions(router, cfg, sim_log, n: int = 40) -> list[tuple[str, float]]:
    """Route the same seeded arrivals (completing some) on fresh clusters; the choices and predictions."""
    router_cfg = cfg.router
    clusters = [ClusterState(f"c{i}", size, BillingTimer(router_cfg.minimum_s), router_cfg.price_per_unit_s)
                for i, size in enumerate(cfg.serve.cluster_sizes)]
    by_id = {c.cluster_id: c for c in clusters}
    rng = np.random.default_rng(7)
    names = sorted(sim_log["template"].unique())
    slo = sim_log.groupby("template")["latency_s"].median()
    out, running, now = [], [], 0.0
    for i in range(n):
        now += float(rng.exponential(0.2))
        template = names[int(rng.integers(len(names)))]
        decision = router.route(Query(i, template, now, float(2.0 * slo[template])), clusters, now)
        by_id[decision.cluster_id].timer.query_arrived(now)
        running.append((i, decision.cluster_id))
        out.append((decision.cluster_id, float(decision.predicted_s)))
        if i % 3 == 2:  # the oldest running query finishes
            qid, cid = running.pop(0)
            router.on_complete(qid, now)
            by_id[cid].timer.query_finished(now)
    return out


def test_runtime_and_cli_build_the_same_router_from_the_same_model(trained, sim_log, cfg, tmp_path):
    from sloctl._cli_common import cli_router
    from sloctl.registry.store import load_model, register
    from sloctl.serving.runtime import Runtime

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    register(trained, sim_log, name="iconq", tracking_uri=uri, experiment="t")
    run_cfg = dataclasses.replace(cfg, registry=dataclasses.replace(cfg.registry, tracking_uri=uri),
                                  serve=dataclasses.replace(cfg.serve, state_db=str(tmp_path / "state.db")))
    runtime = Runtime(run_cfg, None, run_cfg.serve.state_db).start()  # `sloctl serve` without --templates-log
    try:
        assert runtime.router_kind == "iconq" and isinstance(runtime.router, IconqRouter)
        cli = cli_router(run_cfg, load_model(run_cfg.serve.model_uri, tracking_uri=uri), sim_log)
        assert runtime.router.slo_margin == cli.router.slo_margin == trained.predictor.slo_margin
        assert runtime.router_margin.source == cli.margin.source == "bundle"
        assert runtime.router.cost_tolerance == cli.router.cost_tolerance == cfg.router.cost_tolerance
        pd.testing.assert_frame_equal(runtime.route_templates, cli.templates)
        assert _decisions(runtime.router, run_cfg, sim_log) == _decisions(cli.router, run_cfg, sim_log)
    finally:
        runtime.close()


@pytest.mark.slow
def test_train_iconq_cli_writes_a_bundle_with_the_margin(sim_log, tmp_path):
    write_log(sim_log, tmp_path / "log.parquet")
    (tmp_path / "fast.yaml").write_text("iconq:\n  max_epochs: 2\nrouter:\n  risk_quantile: 0.6\n")
    out = subprocess.run([sys.executable, "-m", "sloctl.cli", "train", "iconq", "--log", "log.parquet", "--config",
                          "fast.yaml", "--no-register", "--out", "bundle", "--json"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    meta = json.loads((tmp_path / "bundle" / "meta.json").read_text())
    assert meta["router_calibration"]["risk_quantile"] == 0.6
    assert meta["router_calibration"]["slo_margin"] == summary["slo_margin"]
    assert "router SLO margin" in out.stderr
    loaded = load_predictor(tmp_path / "bundle")
    assert loaded.slo_margin == summary["slo_margin"] and set(loaded.templates["template"]) == set(sim_log["template"])


def test_trained_bundle_carries_the_concurrency_support_and_the_router_its_guard(trained, sim_log, tmp_path):
    from sloctl.models.calibration import concurrency_support

    support = trained.predictor.calibration.concurrency_support
    assert support == concurrency_support(sim_log) and support  # per size of the training log
    loaded = load_predictor(save_predictor(trained.predictor, tmp_path / "bundle"))
    built = build_router(loaded, RouterSection())
    assert built.guard is not None and dict(built.guard.support) == support
    assert built.router.guard == built.guard and built.router.guard_state.routes == 0
    assert build_router(loaded, RouterSection(guard_support=False)).guard.support is None
    assert built.guard.placement == "protect"
    assert build_router(loaded, RouterSection(guard_placement="load")).guard.placement == "load"
    assert build_router(loaded, RouterSection(guard=False)).router.guard is None
    assert build_router(loaded, RouterSection(), use_iconq=False).guard is None  # Stage's router has none
