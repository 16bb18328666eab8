"""Typed responses (issue 18, API): the Envoy routes and the execution-config have response models in OpenAPI,
and the models pass what the runtime serves through unchanged."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from sloctl.config import load_config

TOKEN = "s3cret-token-0123456789"
HOTEL = Path(__file__).resolve().parents[2] / "configs" / "networks" / "hotel.yaml"


def _spec(tmp_path) -> dict:
    from sloctl.serving.runtime.app import create_app

    base = load_config()
    cfg = dataclasses.replace(
        base, registry=dataclasses.replace(base.registry, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
        serve=dataclasses.replace(base.serve, state_db=str(tmp_path / "state.db")))
    return create_app(cfg, token=TOKEN, watch=False).fastapi.openapi()  # the spec needs no running runtime


def _ok_schema(spec: dict, path: str) -> str:
    return spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]


def test_the_spec_names_the_envoy_and_execution_config_models(tmp_path):
    spec = _spec(tmp_path)
    schemas = spec["components"]["schemas"]
    assert _ok_schema(spec, "/v1/retry-policy/envoy").endswith("/EnvoyRouteConfigOut")
    envoy = schemas["EnvoyRouteConfigOut"]
    assert set(envoy["required"]) == {"name", "virtual_hosts"}
    assert set(schemas["EnvoyVirtualHostOut"]["required"]) == {"name", "domains", "routes"}
    assert set(schemas["EnvoyRouteOut"]["required"]) == {"name", "match", "route"}
    assert _ok_schema(spec, "/v1/execution-config").endswith("/ExecutionConfigOut")
    plan = schemas["ExecutionConfigOut"]
    assert {"source", "in_force", "next_spinup", "enacted", "missed", "start_sizes", "spinups",
            "provenance"} <= set(plan["required"])
    assert plan["properties"]["in_force"]["$ref"].endswith("/InForceOut")
    assert schemas["InForceOut"]["properties"]["since"]["type"] == "string"
    assert {"404", "503"} <= set(spec["paths"]["/v1/execution-config"]["get"]["responses"])


def test_the_models_pass_served_documents_through_unchanged():
    from sloctl.control.policies import ExecutionPlan
    from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup
    from sloctl.models.retry_network import load_network
    from sloctl.serving.runtime.app import EnvoyRouteConfigOut, ExecutionConfigOut
    from sloctl.serving.runtime.envoy import envoy_route_config

    network = load_network(HOTEL).to_mapping()
    services = list(network["services"])
    policy = {"kind": "retry-policy", "retries": {"high": dict.fromkeys(services, 3),
                                                  "low": dict.fromkeys(services, 1)}, "network": network}
    routes = json.loads(json.dumps(envoy_route_config(policy, service=services[0])))
    assert EnvoyRouteConfigOut.model_validate(routes).model_dump(mode="json") == routes

    plan = ExecutionPlan(ExecutionConfig(spinups=(ScheduledSpinup(3.0, 2),)), knobs={"start_clusters": 2},
                         provenance={"seed": "0"})
    view = {"source": "models:/execution-config@champion v1",
            "in_force": {"since": "2024-03-04T00:30:00.000+00:00", "start_sizes": [1], "start_sizes_applied": True,
                         "start_sizes_note": None, "autoscaler": None, "reactive": None,
                         "day_start": "2024-03-04T00:00:00.000+00:00", "plan_clock": "real", "spinup_delay_s": 30.0,
                         "max_clusters": 4, "upcoming": 1},
            "next_spinup": {"at": "2024-03-04T01:00:00.000+00:00", "size": 2, "mode": "add"},
            "enacted": [], "missed": []}
    served = json.loads(json.dumps({**plan.to_doc(), **view}))
    assert "real_time" not in served["spinups"][0]  # an optional key the runtime left out stays out
    assert ExecutionConfigOut.model_validate(served).model_dump(mode="json", exclude_unset=True) == served
