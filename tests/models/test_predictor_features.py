"""A model knows which feature groups it learned from, hides the others, and refuses rows without them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sloctl.core.errors import FeatureError
from sloctl.datasets.plan_features import PLAN_FEATURES
from sloctl.datasets.querylog import validate_log
from sloctl.models.predictor import feature_group
from sloctl.models.stage import StageConfig
from sloctl.registry.bundles import load_predictor, save_predictor
from sloctl.registry.routers import router_templates
from sloctl.training.pipeline import train_stage

PLAN = [c for c in PLAN_FEATURES if feature_group(c) == "plan"]
TEXT = [c for c in PLAN_FEATURES if feature_group(c) == "text"]
CATALOG = [c for c in PLAN_FEATURES if feature_group(c) == "catalog"]


@pytest.fixture(scope="module")
def text_log(sim_log):
    """The synthetic log as an import from another engine would give it: no engine plan, text and catalog known."""
    log = sim_log.drop(columns=["f_source"], errors="ignore")
    log[PLAN] = math.nan
    return validate_log(log, source="text-only log")


@pytest.fixture(scope="module")
def text_model(text_log):
    return train_stage(text_log, StageConfig(n_estimators=30), risk_quantile=None).predictor


def test_groups_cover_every_feature_column():
    assert TEXT and CATALOG and PLAN
    assert set(PLAN) | set(TEXT) | set(CATALOG) == set(PLAN_FEATURES)


def test_model_of_a_text_log_names_its_feature_source(text_model):
    assert text_model.feature_source == "text+catalog"
    assert set(text_model.feature_columns) == set(TEXT) | set(CATALOG)


def test_plan_features_the_model_never_saw_do_not_change_its_predictions(text_model, text_log):
    with_plan = text_log.copy()
    with_plan[PLAN] = np.random.default_rng(0).uniform(0, 50, size=(len(text_log), len(PLAN)))
    np.testing.assert_allclose(text_model.predict(with_plan), text_model.predict(text_log))


def test_a_row_without_the_features_the_model_needs_is_refused(text_model, text_log):
    frame = text_log.head(3).copy()
    frame.loc[1, TEXT] = math.nan
    frame.loc[1, CATALOG] = math.nan
    missing = text_model.missing_features(frame)
    assert [int(r) for r in missing["text"]] == [1]
    with pytest.raises(FeatureError, match="no text features .*1 of 3"):
        text_model.check_features(frame, what="the request")
    text_model.check_features(text_log.head(3))  # complete rows pass


def test_bundle_keeps_the_feature_columns(text_model, tmp_path):
    loaded = load_predictor(save_predictor(text_model, tmp_path / "bundle"))
    assert loaded.feature_columns == text_model.feature_columns
    assert loaded.feature_source == "text+catalog"


def test_router_table_without_the_needed_features_is_refused(text_model, text_log):
    table = text_log.drop_duplicates("template").reset_index(drop=True)
    partial = table.copy()
    partial.loc[0, TEXT + CATALOG] = math.nan
    assert len(router_templates(text_model, partial)) == len(table) - 1  # that template routes as unknown
    nothing = table.copy()
    nothing[TEXT + CATALOG] = math.nan
    with pytest.raises(FeatureError, match="template table"):
        router_templates(text_model, nothing)
