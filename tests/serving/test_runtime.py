"""The controller runtime end to end: a real server on a loopback port, a temporary SQLite registry."""

from __future__ import annotations

import dataclasses
import time

import pytest

from sloctl.config import load_config
from sloctl.serving.controller import load_templates_table
from sloctl.serving.local import LocalServer

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory, trained_models):
    """A registry folder and the two trained models (registered later, per test)."""
    return {"folder": tmp_path_factory.mktemp("registry"), "stage": trained_models["stage"],
            "iconq": trained_models["iconq"]}


def _cfg(uri: str, state_db: str):
    base = load_config()
    return dataclasses.replace(base, registry=dataclasses.replace(base.registry, tracking_uri=uri),
                               serve=dataclasses.replace(base.serve, watch_interval_s=0.2, state_db=state_db))


def _wait(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def test_runtime_serves_every_endpoint_swaps_models_and_survives_a_restart(registry, sim_log, tmp_path):
    from sloctl.registry.store import register
    from sloctl.serving.runtime.app import create_app

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(uri, str(tmp_path / "state.db"))
    templates = load_templates_table_from(sim_log)
    template = str(templates["template"].iloc[0])
    with LocalServer(create_app(cfg, token=TOKEN, templates=templates)) as client:
        # Fallback: no model registered yet -> round-robin, and the answer says so.
        ready = client.get("/readyz").json()
        assert ready["router"] == "round-robin"
        first = client.post("/v1/route", json={"query_id": 1, "template": template, "slo_s": 5.0}, headers=AUTH)
        assert first.status_code == 200 and first.json()["fallback"] and first.json()["model"] == "round-robin"
        assert client.post("/v1/predict", json={"template": template, "cluster_size": 1}).json()["model"] is None
        # Auth on mutating endpoints.
        assert client.post("/v1/route", json={"query_id": 2, "template": template, "slo_s": 5.0}).status_code == 401
        bad = client.post("/v1/route", json={"query_id": 2, "template": template, "slo_s": 5.0},
                          headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["field"] == "authorization"
        # Validation: a 422 naming the field; an unknown query a 404 with a JSON body.
        invalid = client.post("/v1/route", json={"query_id": 2, "template": template, "slo_s": -1}, headers=AUTH)
        assert invalid.status_code == 422 and "slo_s" in str(invalid.json())
        missing = client.post("/v1/complete", json={"query_id": 99, "latency_s": 1.0}, headers=AUTH)
        assert missing.status_code == 404 and missing.json()["field"] == "query_id"
        # Hot swap: register Stage, then Iconq+; the watcher picks each up without a restart.
        register(registry["stage"], sim_log, name="stage", tracking_uri=uri, experiment="t")
        _wait(lambda: client.get("/readyz").json()["router"] == "stage")
        register(registry["iconq"], sim_log, name="iconq", tracking_uri=uri, experiment="t")
        _wait(lambda: client.get("/readyz").json()["router"] == "iconq")
        routed = client.post("/v1/route", json={"query_id": 2, "template": template, "slo_s": 5.0}, headers=AUTH)
        body = routed.json()
        assert routed.status_code == 200 and body["model"] == "iconq" and not body["fallback"]
        assert set(body["explanation"]) == {"c0", "c1"} and body["predicted_latency_s"] > 0
        assert body["guard"] is None  # the model decided; the guard placed nothing by load
        guard = client.get("/readyz").json()["router_guard"]
        assert guard["routes"] == 1 and guard["fallbacks"] == {"error": 0, "support": 0}
        unknown = client.post("/v1/route", json={"query_id": 3, "template": "nope", "slo_s": 5.0}, headers=AUTH)
        assert unknown.status_code == 422 and unknown.json()["field"] == "template"
        predicted = client.post("/v1/predict", json={"template": template, "cluster_size": 2,
                                                     "neighbours": [{"template": template, "offset_s": -0.1}]})
        assert predicted.json()["model"] == "iconq" and predicted.json()["latency_s"] > 0
        done = client.post("/v1/complete", json={"query_id": 1, "latency_s": 0.5}, headers=AUTH)
        assert done.status_code == 200 and done.json()["violated"] is False
        view = client.get("/v1/clusters").json()
        assert sum(len(c["running"]) for c in view["clusters"]) == 1 and view["completed"] == 1
        cost_before = view["total_cost"]
        # Admission, retry policy, metrics, status page.
        admitted = client.post("/v1/admit", json={"class": "low", "budget_ms": 50, "holder": "t"},
                               headers=AUTH).json()
        assert admitted["admitted"] is True and admitted["holder"] == "t" and admitted["expires_in_s"] > 0
        lease = {"lease_id": admitted["lease_id"]}
        assert client.post("/v1/release", json={**lease, "holder": "other"}, headers=AUTH).status_code == 409
        assert client.post("/v1/release", json=lease, headers=AUTH).json()["released"]
        assert client.post("/v1/release", json=lease, headers=AUTH).status_code == 404  # only once
        assert client.post("/v1/admit", json={"class": "vip"}, headers=AUTH).status_code == 422
        assert client.get("/v1/retry-policy").status_code == 404
        metrics = client.get("/metrics").text
        assert "sloctl_decisions_total" in metrics and 'sloctl_model_version{slot="iconq"} 1.0' in metrics
        assert 'sloctl_router_guard_fallbacks{reason="support"} 0.0' in metrics
        page = client.get("/")
        assert page.status_code == 200 and "sloctl controller runtime" in page.text
        # The demo workload replays through the service.
        from sloctl.serving.local import replay_log

        replayed = replay_log(client, sim_log.head(40), token=TOKEN, duration_s=0.5, first_query_id=1000)
        assert replayed["queries"] == int((sim_log.head(40)["status"] == "ok").sum())
        assert replayed["models"] == ["iconq"]
    # Restart: the running query is reconciled and the cost carries on.
    with LocalServer(create_app(cfg, token=TOKEN, templates=templates)) as client:
        view = client.get("/v1/clusters").json()
        assert view["reconciled"]["restored"] == 1
        assert view["total_cost"] >= cost_before
        assert client.post("/v1/complete", json={"query_id": 2, "latency_s": 0.2}, headers=AUTH).status_code == 200


def test_retry_policy_is_served_as_json_and_as_envoy_routes(tmp_path):
    from sloctl.models.retry_network import load_network
    from sloctl.serving.runtime.app import create_app
    from sloctl.training.retry_budget import BudgetSearch, optimise_budgets, register_retry_policy

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = load_network("configs/networks/tandem.yaml").scale_arrivals({"high": 2.0, "low": 6.0})
    register_retry_policy(optimise_budgets(spec, BudgetSearch(max_retries=3)), tracking_uri=uri, experiment="t")
    with LocalServer(create_app(_cfg(uri, str(tmp_path / "state.db")), token=TOKEN)) as client:
        policy = client.get("/v1/retry-policy").json()
        assert set(policy["retries"]) == {"high", "low"}
        envoy = client.get("/v1/retry-policy/envoy", params={"service": "backend"})
        assert envoy.status_code == 200
        assert client.get("/v1/retry-policy/envoy", params={"service": "nope"}).status_code == 422
        assert client.get("/v1/execution-config").status_code == 404
    # The Policy Tuner's execution configuration is served by alias too.
    from sloctl.control.policies import ExecutionPlan
    from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup
    from sloctl.registry.store import register_policy

    plan = ExecutionPlan(ExecutionConfig(spinups=(ScheduledSpinup(3.0, 2),)), knobs={"start_clusters": 2})
    register_policy(plan, tracking_uri=uri, experiment="t", metrics={"validation_vr": 0.1})
    with LocalServer(create_app(_cfg(uri, str(tmp_path / "state.db")), token=TOKEN)) as client:
        served = client.get("/v1/execution-config").json()
        assert served["spinups"] == [{"time_s": 3.0, "size": 2, "mode": "add"}] and served["source"].endswith("v1")
        assert {k: served[k] for k in plan.to_doc()} == plan.to_doc()  # plus what is in force (test_execution_plan)


def load_templates_table_from(log):
    return log.drop_duplicates("template").reset_index(drop=True)


def test_load_templates_table_reads_a_log(tmp_path, sim_log):
    from sloctl.datasets.querylog import write_log

    path = tmp_path / "log.parquet"
    write_log(sim_log, path)
    assert load_templates_table(path)["template"].is_unique
    assert load_templates_table(None) is None


def test_clusters_can_be_added_and_retired_and_keep_their_cost(tmp_path):
    from sloctl.serving.runtime.app import create_app

    cfg = _cfg(f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "state.db"))
    with LocalServer(create_app(cfg, token=TOKEN)) as client:
        assert client.put("/v1/clusters/auto1", json={"size": 2}).status_code == 401
        assert client.put("/v1/clusters/auto1", json={"size": 2}, headers=AUTH).json()["changed"]
        assert client.put("/v1/clusters/bad id", json={"size": 2}, headers=AUTH).status_code == 422
        for cid in ("c0", "c1"):
            assert client.delete(f"/v1/clusters/{cid}", headers=AUTH).json()["retired"]
        routed = client.post("/v1/route", json={"query_id": 7, "template": "t", "slo_s": 1.0}, headers=AUTH).json()
        assert routed["cluster_id"] == "auto1"
        assert client.delete("/v1/clusters/auto1", headers=AUTH).status_code == 409  # still running a query
        client.post("/v1/complete", json={"query_id": 7, "latency_s": 0.1}, headers=AUTH).raise_for_status()
        cost = client.get("/v1/clusters").json()["total_cost"]
        assert client.delete("/v1/clusters/auto1", headers=AUTH).status_code == 200
        after = client.get("/v1/clusters").json()
        assert after["clusters"] == [] and after["total_cost"] >= cost > 0
        assert client.post("/v1/route", json={"query_id": 8, "template": "t", "slo_s": 1.0},
                           headers=AUTH).status_code == 409


def test_a_version_that_fails_to_load_keeps_the_last_good_model(registry, sim_log, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    import sloctl.registry.store as reg
    import sloctl.serving.controller as controller_module
    from sloctl.serving.controller import ModelSlot

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    reg.register(registry["stage"], sim_log, name="stage", tracking_uri=uri, experiment="t")
    slot = ModelSlot("models:/stage@champion", uri, "latency")
    assert slot.refresh() and slot.version == "1"
    reg.register(registry["stage"], sim_log, name="stage", tracking_uri=uri, experiment="t")
    MlflowClient(tracking_uri=uri, registry_uri=uri).set_registered_model_alias("stage", "champion", "2")
    real = reg.load_model

    def broken(model_uri, **kwargs):
        if model_uri.endswith("/2"):
            raise OSError("artifact store unreachable")
        return real(model_uri, **kwargs)

    monkeypatch.setattr(controller_module, "load_model", broken)  # where a slot looks it up
    assert not slot.refresh()
    assert slot.version == "1" and slot.value is not None
    assert "version 2 failed to load" in slot.error and "serving version 1" in slot.error
    monkeypatch.setattr(controller_module, "load_model", real)
    assert slot.refresh() and slot.version == "2" and slot.error is None


def test_drift_calibration_follows_completions_and_shows_in_clusters(registry, sim_log, tmp_path):
    """router.drift_window_s: queries that finish far sooner than predicted pull every prediction down."""
    from sloctl.registry.store import register
    from sloctl.serving.runtime.app import create_app

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(uri, str(tmp_path / "state.db"))
    cfg = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, drift_window_s=600.0,
                                                              drift_min_observations=3, guard=False))
    register(registry["iconq"], sim_log, name="iconq", tracking_uri=uri, experiment="t")
    templates = load_templates_table_from(sim_log)
    template = str(templates["template"].iloc[0])
    with LocalServer(create_app(cfg, token=TOKEN, templates=templates)) as client:
        _wait(lambda: client.get("/readyz").json()["router"] == "iconq")
        assert client.get("/v1/clusters").json()["drift_calibration"]["pooled"] == {"factor": 1.0,
                                                                                      "observations": 0}
        first = client.post("/v1/route", json={"query_id": 1, "template": template, "slo_s": 60.0},
                            headers=AUTH).json()["predicted_latency_s"]
        client.post("/v1/complete", json={"query_id": 1, "latency_s": 0.01}, headers=AUTH)
        for qid in range(2, 6):  # each finishes at once: far faster than the model says
            client.post("/v1/route", json={"query_id": qid, "template": template, "slo_s": 60.0}, headers=AUTH)
            client.post("/v1/complete", json={"query_id": qid, "latency_s": 0.01}, headers=AUTH)
        drift = client.get("/v1/clusters").json()["drift_calibration"]
        assert drift["window_s"] == 600.0 and drift["pooled"]["observations"] == 5
        assert drift["pooled"]["factor"] < 1.0
        later = client.post("/v1/route", json={"query_id": 9, "template": template, "slo_s": 60.0},
                            headers=AUTH).json()["predicted_latency_s"]
        assert later < first
