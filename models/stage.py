"""Stage: a query's isolated (concurrency-unaware) latency from its plan.

A LightGBM regressor on log latency, trained on isolated executions only
(queries with no neighbour), so that it reflects a query's intrinsic cost
rather than interference (AutoSLO §8.3.2). Inputs are the plan features plus
cluster-size features; an exact-repeat cache keyed by (query text hash,
cluster size) answers queries seen in training with their observed median
latency, as the Stage paper's first tier does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sloctl.datasets.plan_features import PLAN_FEATURES

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["StageConfig", "StageModel", "size_features"]

SIZE_FEATURES = ("s_size", "s_log2_size", "s_inv_size")


def size_features(size: np.ndarray) -> np.ndarray:
    """Cluster-size columns (i)–(iii) of AutoSLO §4.2: size, log2(size), 1/size."""
    size = np.asarray(size, dtype=float)
    return np.stack([size, np.log2(size), 1.0 / size], axis=-1)


@dataclass(frozen=True)
class StageConfig:
    """LightGBM settings of :class:`StageModel` (small data: small leaves)."""

    n_estimators: int = 300
    learning_rate: float = 0.05
    num_leaves: int = 15
    min_child_samples: int = 3
    subsample: float = 1.0
    colsample_bytree: float = 1.0
    reg_lambda: float = 0.0
    use_cache: bool = True
    seed: int = 0
    #: ``isolated``: learn from executions that ran alone (AutoSLO §8: Stage as Iconq+'s measure of a
    #: query's own cost); ``all``: from every ``ok`` execution, concurrency unseen (Stage as Redshift
    #: trains it on a cluster's whole history; for logs with few or no isolated runs).
    train_on: str = "isolated"

    def validate(self) -> None:
        if self.train_on not in ("isolated", "all"):
            raise ValueError(f"The 'train_on' parameter of StageConfig must be 'isolated' or 'all', got "
                             f"{self.train_on!r}.")
        for name in ("n_estimators", "num_leaves", "min_child_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"The '{name}' parameter of StageConfig must be an integer >= 1, got {value!r}.")
        for name in ("learning_rate", "subsample", "colsample_bytree"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"The '{name}' parameter of StageConfig must be in (0, 1], got {value!r}.")


class StageModel:
    """Concurrency-unaware latency model (scikit-learn style).

    Args:
        config: LightGBM settings and whether to use the exact-repeat cache.

    ``fit(X, y)`` takes a frame with the plan features, ``cluster_size`` and
    (for the cache) ``sql_hash``, and latencies in seconds; ``predict(X)``
    returns seconds.
    """

    def __init__(self, config: StageConfig | None = None) -> None:
        self.config = config

    @property
    def feature_names_(self) -> list[str]:
        return [*PLAN_FEATURES, *SIZE_FEATURES]

    def _matrix(self, X: pd.DataFrame) -> np.ndarray:
        missing = [c for c in (*PLAN_FEATURES, "cluster_size") if c not in X.columns]
        if missing:
            raise ValueError(f"Stage input is missing column '{missing[0]}'.")
        plan = X[list(PLAN_FEATURES)].to_numpy(dtype=float)
        return np.hstack([plan, size_features(X["cluster_size"].to_numpy())])

    def fit(self, X: pd.DataFrame, y: np.ndarray, *, eval_set: tuple[pd.DataFrame, np.ndarray] | None = None,
            callbacks: list[Any] | None = None) -> StageModel:
        """Fit on executions (isolated ones, as ``config.train_on`` chooses): ``y`` are latencies in seconds (> 0)."""
        import lightgbm as lgb

        config = self.config or StageConfig()
        config.validate()
        y = np.asarray(y, dtype=float)
        if len(X) != len(y):
            raise ValueError(f"Stage fit got {len(X)} rows but {len(y)} labels.")
        if len(y) < 2:
            raise ValueError(
                f"Stage needs at least 2 executions to train, got {len(y)}; "
                "collect an isolated workload (sloctl collect --workload isolated).")
        if (y <= 0).any() or not np.isfinite(y).all():
            raise ValueError("Stage labels must be finite latencies > 0 seconds.")
        self.booster_ = lgb.LGBMRegressor(
            n_estimators=config.n_estimators, learning_rate=config.learning_rate,
            num_leaves=config.num_leaves, min_child_samples=config.min_child_samples,
            subsample=config.subsample, subsample_freq=1 if config.subsample < 1 else 0,
            colsample_bytree=config.colsample_bytree, reg_lambda=config.reg_lambda,
            min_data_in_bin=1, random_state=config.seed, deterministic=True, n_jobs=1, verbose=-1)
        fit_kwargs: dict[str, Any] = {}
        if eval_set is not None:
            fit_kwargs["eval_X"] = (self._matrix(eval_set[0]),)
            fit_kwargs["eval_y"] = (np.log(np.asarray(eval_set[1], dtype=float)),)
            fit_kwargs["eval_metric"] = "l1"
        if callbacks:
            fit_kwargs["callbacks"] = callbacks
        self.booster_.fit(self._matrix(X), np.log(y), **fit_kwargs)
        self.cache_: dict[tuple[str, int], float] = {}
        if config.use_cache and "sql_hash" in X.columns:
            frame = X[["sql_hash", "cluster_size"]].assign(y=y)
            for (key, size), value in frame.groupby(["sql_hash", "cluster_size"])["y"].median().items():
                self.cache_[(str(key), int(size))] = float(value)
        self.config_ = config
        return self

    def predict_log(self, X: pd.DataFrame, *, use_cache: bool = True) -> np.ndarray:
        """Natural-log latency predictions."""
        if not hasattr(self, "booster_"):
            raise ValueError("This StageModel is not fitted yet; call fit() first.")
        out = self.booster_.predict(self._matrix(X))
        if use_cache and self.cache_ and "sql_hash" in X.columns:
            keys = zip(X["sql_hash"].astype(str), X["cluster_size"].astype(int), strict=True)
            for i, key in enumerate(keys):
                hit = self.cache_.get(key)
                if hit is not None:
                    out[i] = math.log(hit)
        return out

    def predict(self, X: pd.DataFrame, *, use_cache: bool = True) -> np.ndarray:
        """Latency predictions in seconds."""
        return np.exp(self.predict_log(X, use_cache=use_cache))

    # -- persistence (used by the MLflow pyfunc wrapper) ---------------------
    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config_), "booster": self.booster_.booster_.model_to_string(),
                "cache": [[k[0], k[1], v] for k, v in self.cache_.items()]}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> StageModel:
        import lightgbm as lgb

        model = cls(StageConfig(**state["config"]))
        model.config_ = model.config
        booster = lgb.Booster(model_str=state["booster"])
        model.booster_ = _BoosterAdapter(booster)
        model.cache_ = {(k, int(s)): float(v) for k, s, v in state["cache"]}
        return model


class _BoosterAdapter:
    """A loaded LightGBM Booster with the regressor's ``predict`` / ``booster_``."""

    def __init__(self, booster: Any) -> None:
        self.booster_ = booster

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.booster_.predict(X)
