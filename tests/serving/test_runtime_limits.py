"""The runtime's limits against a stranger: names it keeps nothing for, names it refuses, heads it refuses."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time

import pytest

from sloctl.config import load_config
from sloctl.serving.local import LocalServer, server_options

TOKEN = "limits-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _cfg(uri: str, state_db: str, **serve):
    base = load_config()
    return dataclasses.replace(base, registry=dataclasses.replace(base.registry, tracking_uri=uri),
                               serve=dataclasses.replace(base.serve, state_db=state_db, **serve))


def _server(cfg, templates=None) -> LocalServer:
    from sloctl.serving.runtime.app import create_app

    return LocalServer(create_app(cfg, token=TOKEN, templates=templates, watch=False),
                       options=server_options(cfg.serve))


def _slots(client) -> set[str]:
    return set(client.get("/readyz").json()["models"])


def test_unknown_networks_answer_404_and_leave_no_slot_behind(tmp_path, empty_registry_uri):
    cfg = _cfg(empty_registry_uri, str(tmp_path / "state.db"))
    with _server(cfg) as client:
        before = _slots(client)
        for i in range(40):
            answer = client.get("/v1/retry-policy", params={"network": f"made-up-{i}"}, headers=AUTH)
            assert answer.status_code == 404, answer.text
            assert answer.json()["field"] == "network" and f"made-up-{i}" in answer.json()["detail"]
            envoy = client.get("/v1/retry-policy/envoy", params={"network": f"made-up-{i}", "service": "s"})
            assert envoy.status_code == 404
        assert _slots(client) == before
        assert not any(name.startswith("retry-") for name in _slots(client))
        assert 'slot="retry-made-up' not in client.get("/metrics").text  # no per-name series either


def test_a_configured_network_gets_a_slot_even_before_its_policy_is_registered(tmp_path, empty_registry_uri):
    cfg = _cfg(empty_registry_uri, str(tmp_path / "state.db"), retry_networks=("mesh",))
    with _server(cfg) as client:
        answer = client.get("/v1/retry-policy", params={"network": "mesh"})
        assert answer.status_code == 404 and "models:/retry-policy-mesh@champion" in answer.json()["detail"]
        assert "retry-mesh" in _slots(client)
        assert client.get("/v1/retry-policy", params={"network": "other"}).status_code == 404
        assert "retry-other" not in _slots(client)


def test_a_network_registered_after_the_start_is_served_without_a_restart(tmp_path):
    from sloctl.models.retry_network import load_network
    from sloctl.training.retry_budget import BudgetSearch, optimise_budgets, register_retry_policy

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(uri, str(tmp_path / "state.db"))
    with _server(cfg) as client:
        assert client.get("/v1/retry-policy", params={"network": "tandem"}).status_code == 404
        spec = load_network("configs/networks/tandem.yaml")
        register_retry_policy(optimise_budgets(spec, BudgetSearch(max_retries=1)), tracking_uri=uri,
                              experiment="t", network="tandem")
        deadline = time.monotonic() + 10
        while (served := client.get("/v1/retry-policy", params={"network": "tandem"})).status_code == 404:
            assert time.monotonic() < deadline, served.text
            time.sleep(0.2)  # unknown names re-read the registry at most once a second
        assert served.json()["source"] == "models:/retry-policy-tandem@champion v1"
    from sloctl.serving.controller import registered_names

    assert registered_names(uri, "retry-policy-") == {"tandem"}
    assert registered_names(uri, "nothing-") == frozenset()


CONTROL = ["a\x00b", "\x00", "tab\there", "bell\x07", "del\x7f", "c1\x85"]


@pytest.mark.parametrize("name", CONTROL, ids=repr)
def test_control_characters_in_any_name_are_a_422_naming_the_field(tmp_path, empty_registry_uri, sim_log, name):
    templates = sim_log.drop_duplicates("template").reset_index(drop=True)
    template = str(templates["template"].iloc[0])
    cfg = _cfg(empty_registry_uri, str(tmp_path / "state.db"))
    with _server(cfg, templates) as client:
        cases = [
            ("/v1/route", {"query_id": 1, "template": name, "slo_s": 5.0}, "template"),
            ("/v1/predict", {"template": name, "cluster_size": 1}, "template"),
            ("/v1/predict", {"template": template, "cluster_size": 1,
                             "neighbours": [{"template": name, "offset_s": 0.0}]}, "neighbours.0.template"),
            ("/v1/admit", {"class": name}, "class"),
            ("/v1/admit", {"class": "high", "holder": name}, "holder"),
            ("/v1/release", {"lease_id": name}, "lease_id"),
        ]
        for path, body, field in cases:
            answer = client.post(path, json=body, headers=AUTH)
            assert answer.status_code == 422, (path, answer.text)
            assert answer.headers["content-type"].startswith("application/problem+json")
            assert answer.json()["field"] == field and "control characters" in answer.json()["detail"]
        envoy = client.get("/v1/retry-policy/envoy", params={"service": name})
        assert envoy.status_code == 422 and envoy.json()["field"] == "service"
        view = client.get("/v1/clusters").json()
        assert all(c["running"] == [] for c in view["clusters"])  # nothing was routed
        assert client.get("/readyz").json()["leases"]["outstanding"] == 0


def test_over_long_names_are_a_422_naming_the_field(tmp_path, empty_registry_uri):
    from sloctl.serving.runtime.app import MAX_NAME_CHARS

    cfg = _cfg(empty_registry_uri, str(tmp_path / "state.db"))
    with _server(cfg) as client:
        long = "t" * (MAX_NAME_CHARS + 1)
        for path, body, field in [("/v1/route", {"query_id": 1, "template": long, "slo_s": 5.0}, "template"),
                                  ("/v1/predict", {"template": long, "cluster_size": 1}, "template"),
                                  ("/v1/admit", {"class": "c" * 65}, "class")]:
            answer = client.post(path, json=body, headers=AUTH)
            assert answer.status_code == 422 and answer.json()["field"] == field, answer.text
        assert client.get("/v1/retry-policy", params={"network": "n" * 101}).status_code == 422


def test_a_60_kb_request_head_is_refused_and_the_runtime_keeps_serving(tmp_path, empty_registry_uri):
    cfg = _cfg(empty_registry_uri, str(tmp_path / "state.db"))
    assert cfg.serve.max_header_bytes == 16384  # what docs/serving.md promises
    with (server := _server(cfg)) as client:
        head = (b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * 60_000 + b"\r\n\r\n")
        with socket.create_connection(("127.0.0.1", client.base_url.port), timeout=10) as sock:
            with contextlib.suppress(OSError):
                sock.sendall(head)
            answer = b""
            with contextlib.suppress(OSError):
                while chunk := sock.recv(4096):
                    answer += chunk
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert server.guard.closed["header_too_large"] == 1
        assert client.get("/healthz").json() == {"ok": True}
