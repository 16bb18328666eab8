from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sloctl.datasets.plan_features import PLAN_FEATURES
from sloctl.models.stage import StageConfig, StageModel


def frame(n: int, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(rng.uniform(0, 2, size=(n, len(PLAN_FEATURES))), columns=list(PLAN_FEATURES))
    X["cluster_size"] = rng.choice([1, 2, 4], size=n)
    X["sql_hash"] = [f"h{i}" for i in range(n)]
    y = np.exp(X["f_nodes"] - np.log2(X["cluster_size"]))  # work shrinks with size
    return X, y.to_numpy()


def test_stage_learns_plan_and_size_effects():
    X, y = frame(400)
    model = StageModel(StageConfig(use_cache=False)).fit(X, y)
    Xt, yt = frame(100, seed=1)
    q = np.maximum(model.predict(Xt) / yt, yt / model.predict(Xt))
    assert np.median(q) < 1.3


def test_exact_repeat_cache_returns_observed_median():
    X, y = frame(50)
    X = pd.concat([X, X.iloc[[0, 0]]], ignore_index=True)
    y = np.concatenate([y, [y[0] * 2, y[0] * 3]])
    model = StageModel(StageConfig(n_estimators=5)).fit(X, y)
    assert model.predict(X.iloc[[0]])[0] == pytest.approx(np.median([y[0], y[0] * 2, y[0] * 3]))
    assert model.predict(X.iloc[[0]], use_cache=False)[0] != pytest.approx(np.median([y[0], y[0] * 2, y[0] * 3]))
    other_size = X.iloc[[0]].assign(cluster_size=8)  # the key includes the cluster size
    assert model.predict(other_size)[0] != pytest.approx(np.median([y[0], y[0] * 2, y[0] * 3]))


def test_round_trip_keeps_predictions():
    X, y = frame(80)
    model = StageModel().fit(X, y)
    again = StageModel.from_dict(model.to_dict())
    np.testing.assert_allclose(again.predict(X), model.predict(X))


@pytest.mark.parametrize("config, message", [
    (StageConfig(num_leaves=0), "'num_leaves'"),
    (StageConfig(learning_rate=0.0), "'learning_rate'"),
    (StageConfig(train_on="concurrent"), "'train_on'"),
])
def test_bad_config_is_named(config, message):
    X, y = frame(10)
    with pytest.raises(ValueError, match=message):
        StageModel(config).fit(X, y)


def test_bad_labels_and_unfitted_use_are_clear_errors():
    X, y = frame(10)
    with pytest.raises(ValueError, match="> 0"):
        StageModel().fit(X, -y)
    with pytest.raises(ValueError, match="not fitted"):
        StageModel().predict(X)
    with pytest.raises(ValueError, match="at least 2 executions"):
        StageModel().fit(X.iloc[:1], y[:1])
