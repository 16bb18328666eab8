"""Predictions for SQL text a model never saw: the bundle keeps how its log's text became features.

The models come from conftest's ``sql_models`` (the synthetic log, its
templates standing for TPC-H queries, text and catalog features only).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from sloctl.config import load_config
from sloctl.serving.local import LocalServer

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: Never in the training log: other literals than any template's, and a query of no template.
UNSEEN = ("SELECT l_returnflag, sum(l_quantity) FROM lineitem WHERE l_shipdate <= DATE '1995-01-01' "
          "GROUP BY l_returnflag",
          "SELECT c_name, count(*) FROM customer JOIN orders ON c_custkey = o_custkey "
          "JOIN lineitem ON l_orderkey = o_orderkey WHERE o_totalprice > 1000 GROUP BY c_name")


def test_a_bundle_keeps_how_sql_became_features_and_predicts_unseen_text(sql_models, tmp_path):
    from sloctl.models.predictor import queries_frame
    from sloctl.registry.bundles import load_predictor, save_predictor

    trained = sql_models["iconq"].predictor
    loaded = load_predictor(save_predictor(trained, tmp_path / "bundle"))
    assert loaded.sql.dialect == "duckdb" and loaded.sql.catalog.tables == trained.sql.catalog.tables
    assert loaded.sql_refusal() is None and loaded.feature_source == "text+catalog"
    queries = pd.DataFrame({"sql": [*UNSEEN, UNSEEN[0]], "cluster_size": [1, 2, 2], "arrival_s": [0.0, 0.0, 0.5],
                            "cluster_id": ["a", "b", "b"]})
    frame = queries_frame(queries, loaded.templates, sql=loaded.sql_features)
    assert frame["f_t_joins"].tolist() == [0.0, 2.0, 0.0] and np.isfinite(frame["f_c_log_rows_sum"]).all()
    assert frame["template"].iloc[0].startswith("sql:") and frame["template"].iloc[0] == frame["template"].iloc[2]
    seconds = loaded.predict(frame, neighbours="all")
    assert np.isfinite(seconds).all() and (seconds > 0).all()
    np.testing.assert_allclose(seconds, trained.predict(frame, neighbours="all"), rtol=1e-5)
    # the session's catalog and schema complete unqualified names; a table the catalog lacks is unknown
    qualified = loaded.sql_features(np.array([UNSEEN[0], "SELECT * FROM nowhere"], dtype=object),
                                    [("tpch", "main"), ("", "")])
    assert np.isfinite(qualified[0]).sum() > 0 and not np.isfinite(qualified[1][-4:]).any()


def test_a_model_that_learned_plan_features_refuses_sql_naming_what_to_train(trained_models):
    from sloctl.core.errors import FeatureError
    from sloctl.models.predictor import queries_frame

    predictor = trained_models["iconq"].predictor
    assert "--features text+catalog" in predictor.sql_refusal()
    with pytest.raises(FeatureError, match="--features text\\+catalog"):
        queries_frame(pd.DataFrame({"sql": [UNSEEN[0]], "cluster_size": [1], "arrival_s": [0.0]}),
                      predictor.templates, sql=predictor.sql_features)


def _cfg(uri: str, state_db: str, **serve):
    base = load_config()
    return dataclasses.replace(base, registry=dataclasses.replace(base.registry, tracking_uri=uri),
                               serve=dataclasses.replace(base.serve, watch_interval_s=0.2, state_db=state_db,
                                                         **serve))


def test_the_runtime_predicts_sql_text_one_query_and_batches(sql_models, trained_models, sim_log, tmp_path,
                                                              wait_until):
    from sloctl.registry.store import register
    from sloctl.serving.runtime.app import create_app

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(uri, str(tmp_path / "state.db"), predict_max_batch=1500)
    log = sql_models["log"]
    with LocalServer(create_app(cfg, token=TOKEN)) as client:
        register(sql_models["iconq"], log, name="iconq", tracking_uri=uri, experiment="t")
        wait_until(lambda: client.get("/readyz").json()["router"] == "iconq", "the SQL model loaded", 30)
        one = client.post("/v1/predict", json={"sql": UNSEEN[1], "cluster_size": 2,
                                               "neighbours": [{"sql": UNSEEN[0], "offset_s": -0.5},
                                                              {"template": "t03", "offset_s": 0.2}]})
        assert one.status_code == 200, one.text
        assert one.json()["model"] == "iconq" and one.json()["latency_s"] > 0 and one.json()["predictions"] is None
        # a batch: queries sharing a cluster id are each other's neighbours
        queries = [{"sql": UNSEEN[i % 2], "cluster_size": 1 + i % 2, "cluster_id": f"c{i // 4}",
                    "arrival_s": 0.1 * (i % 4)} for i in range(1000)]
        batch = client.post("/v1/predict", json={"queries": queries}, headers=AUTH)
        assert batch.status_code == 200, batch.text
        predictions = batch.json()["predictions"]
        assert len(predictions) == 1000 and all(p["latency_s"] > 0 for p in predictions)
        alone = client.post("/v1/predict", json={"queries": [{**queries[0], "cluster_id": None}]}).json()
        assert alone["predictions"][0]["latency_s"] != predictions[0]["latency_s"]  # neighbours matter
        # bounds: a stranger's body stays small; a batch over the limit and a crowded cluster are refused
        assert client.post("/v1/predict", json={"queries": queries}).status_code == 413
        many = client.post("/v1/predict", json={"queries": queries * 2}, headers=AUTH)
        assert many.status_code == 422 and many.json()["field"] == "queries"
        crowded = client.post("/v1/predict", json={"queries": [{**q, "cluster_id": "all"} for q in queries[:100]]},
                              headers=AUTH)
        assert crowded.status_code == 422 and "share a cluster" in crowded.json()["detail"]
        both = client.post("/v1/predict", json={"sql": UNSEEN[0], "template": "t01", "cluster_size": 1})
        assert both.status_code == 422 and "exactly one" in both.json()["detail"]


def test_the_runtime_refuses_sql_for_a_plan_feature_model_naming_what_to_train(trained_models, sim_log, tmp_path,
                                                                                 wait_until):
    from sloctl.registry.store import register
    from sloctl.serving.runtime.app import create_app

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with LocalServer(create_app(_cfg(uri, str(tmp_path / "state.db")), token=TOKEN)) as client:
        register(trained_models["iconq"], sim_log, name="iconq", tracking_uri=uri, experiment="t")
        wait_until(lambda: client.get("/readyz").json()["router"] == "iconq", "the model loaded", 30)
        refused = client.post("/v1/predict", json={"sql": UNSEEN[0], "cluster_size": 1})
        assert refused.status_code == 422 and refused.json()["field"] == "sql"
        assert "--features text+catalog" in refused.json()["detail"]
        ok = client.post("/v1/predict", json={"queries": [{"template": "t01", "cluster_size": 1}]})
        assert ok.status_code == 200 and ok.json()["predictions"][0]["latency_s"] > 0
