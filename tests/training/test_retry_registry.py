"""Retry policies in the registry: one registered model per network, with what it was optimised on."""

from __future__ import annotations

import pytest

from sloctl.models.retry_network import load_network
from sloctl.training.retry_budget import (
    BudgetSearch,
    network_name,
    optimise_budgets,
    register_retry_policy,
    retry_policy_name,
    zero_budget_note,
)

TANDEM = "configs/networks/tandem.yaml"
HOTEL = "configs/networks/hotel.yaml"


def test_each_network_has_its_own_registered_policy(tmp_path):
    """Issue 18: one 'retry-policy' name served every network; optimising tandem replaced hotel's budgets."""
    from mlflow import MlflowClient

    from sloctl.training.retry_budget import load_retry_policy

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    hotel = optimise_budgets(load_network(HOTEL), BudgetSearch(max_retries=2), load=1.5)
    tandem = optimise_budgets(load_network(TANDEM), BudgetSearch(max_retries=2), load=1.5)
    register_retry_policy(hotel, tracking_uri=uri, experiment="t", source=HOTEL)
    register_retry_policy(tandem, tracking_uri=uri, experiment="t", source=TANDEM)  # after hotel
    assert retry_policy_name(network_name(HOTEL)) == "retry-policy-hotel"
    served = load_retry_policy("models:/retry-policy-hotel@champion", tracking_uri=uri)
    assert served.retries == hotel.retries and "search" in served.retries["high"]  # hotel's services
    assert load_retry_policy("models:/retry-policy-tandem@champion", tracking_uri=uri).retries == tandem.retries
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    version = client.get_model_version_by_alias("retry-policy-hotel", "champion")
    run = client.get_run(version.run_id)
    tags = run.data.tags
    assert tags["provenance.network"] == "hotel" and tags["provenance.network_hash"]
    assert float(tags["provenance.offered_rho"]) == pytest.approx(1.5, rel=1e-6)
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["network-hotel"]


def test_serve_gives_each_networks_sidecars_their_own_budgets(tmp_path):
    """Issue 18: after optimising tandem, hotel's sidecars got 422 (tandem's policy has no 'search' service)."""
    import dataclasses

    from sloctl.config import load_config
    from sloctl.serving.local import LocalServer
    from sloctl.serving.runtime.app import create_app
    from sloctl.serving.runtime.retry_sync import sync_once

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for path in (HOTEL, TANDEM):
        register_retry_policy(optimise_budgets(load_network(path), BudgetSearch(max_retries=2), load=1.5),
                              tracking_uri=uri, experiment="t", source=path)
    base = load_config()
    cfg = dataclasses.replace(base, registry=dataclasses.replace(base.registry, tracking_uri=uri),
                              serve=dataclasses.replace(base.serve, state_db=str(tmp_path / "state.db")))
    token = "t0ken-0123456789abcdef"
    with LocalServer(create_app(cfg, token=token)) as client:
        client.headers["Authorization"] = f"Bearer {token}"  # as sidecars sync (not the small public lane)
        hotel = client.get("/v1/retry-policy/envoy", params={"service": "search", "network": "hotel"})
        assert hotel.status_code == 200, hotel.text
        tandem = client.get("/v1/retry-policy/envoy", params={"service": "backend", "network": "tandem"})
        assert tandem.status_code == 200, tandem.text
        assert client.get("/v1/retry-policy", params={"network": "hotel"}).json()["source"] == \
            "models:/retry-policy-hotel@champion v1"
        assert client.get("/v1/retry-policy", params={"network": "nope"}).status_code == 404
        assert client.get("/v1/retry-policy", params={"network": "a/b"}).status_code == 422
        synced = sync_once(str(client.base_url).rstrip("/"), "search", tmp_path / "routes.json", network="hotel",
                           client=client, token=token)
        assert synced.source == "models:/retry-policy-hotel@champion v1" and synced.num_retries


def test_registering_no_retries_at_all_says_why(tmp_path):
    """Issue 18: retry optimise on hotel.yaml registered k = 0 for every class as champion without saying why."""
    from mlflow import MlflowClient

    light = optimise_budgets(load_network(HOTEL), BudgetSearch(max_retries=2), load=0.3)
    assert not any(k for row in light.retries.values() for k in row.values())
    note = zero_budget_note(light)
    assert note.startswith("every class gets k = 0") and "ρ = 0.30" in note and "high" in note and "low" in note
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    register_retry_policy(light, tracking_uri=uri, experiment="t", source=HOTEL)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(client.get_model_version_by_alias("retry-policy-hotel", "champion").run_id)
    assert run.data.tags["registration_note"] == note
    busy = optimise_budgets(load_network(HOTEL), BudgetSearch(max_retries=2), load=1.5)
    assert zero_budget_note(busy) is None


def test_retry_optimise_registers_per_network_and_prints_why_no_retries(tmp_path):
    import json

    from typer.testing import CliRunner

    from sloctl.cli import app

    (tmp_path / "c.yaml").write_text(f"registry:\n  tracking_uri: sqlite:///{tmp_path / 'mlflow.db'}\n")
    out = CliRunner().invoke(app, ["retry", "optimise", "-n", HOTEL, "--rho", "0.3", "--max-retries", "2",
                                   "--confirm-s", "0", "--json", "--config", str(tmp_path / "c.yaml")])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["registered"]["name"] == "retry-policy-hotel"
    assert "registered retry-policy-hotel v1" in out.stderr and "every class gets k = 0" in out.stderr
