"""Retry budgets for a stated load, and why a class gets no retries (issue 18: `retry optimise` had no load
option and registered k = 0 for every class on hotel.yaml without saying why)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sloctl._cli_retry import retry_app
from sloctl.control.policies import RetryPolicy
from sloctl.models.retry import offered_rho, scale_to_load
from sloctl.models.retry_network import load_network
from sloctl.training.retry_budget import BudgetSearch, explain_no_retries, optimise_budgets

ROOT = Path(__file__).resolve().parents[2]
HOTEL = ROOT / "configs" / "networks" / "hotel.yaml"
TANDEM = ROOT / "configs" / "networks" / "tandem.yaml"


def test_scale_to_load_hits_the_load_and_keeps_the_class_mix():
    spec = load_network(HOTEL)
    assert offered_rho(spec) == pytest.approx(0.5)
    loaded = scale_to_load(spec, 2.0)
    assert offered_rho(loaded) == pytest.approx(2.0)
    assert loaded.arrivals["high"]["frontend"] == pytest.approx(4 * spec.arrivals["high"]["frontend"])
    assert loaded.arrivals["low"]["frontend"] == pytest.approx(4 * spec.arrivals["low"]["frontend"])
    with pytest.raises(ValueError, match="'rho'"):
        scale_to_load(spec, 0)


def test_load_changes_the_budgets_and_is_recorded():
    spec = load_network(HOTEL)
    light = optimise_budgets(spec, BudgetSearch(max_retries=3))
    heavy = optimise_budgets(spec, BudgetSearch(max_retries=3), load=2.0)
    assert light.search["offered_rho"] == pytest.approx(0.5) and light.search["load_scale"] == pytest.approx(1.0)
    assert heavy.search["offered_rho"] == pytest.approx(2.0) and heavy.search["load_scale"] == pytest.approx(4.0)
    assert heavy.network["arrivals"]["high"]["frontend"] == pytest.approx(200.0)
    assert max(light.retries["high"].values()) == 0 < max(heavy.retries["high"].values())


def test_k0_at_light_load_says_a_retry_wins_nothing_and_points_to_the_load_option():
    policy = optimise_budgets(load_network(HOTEL), BudgetSearch(max_retries=2))
    assert set(policy.explanation) == {"high", "low"}
    for why in policy.explanation.values():
        assert "ρ = 0.50" in why and "wins nothing" in why and "--rho" in why


def test_k0_under_overload_names_the_cost_to_the_other_classes():
    policy = optimise_budgets(load_network(HOTEL), BudgetSearch(max_retries=3), load=2.0)
    assert max(policy.retries["low"].values()) == 0 and "high" not in policy.explanation
    why = policy.explanation["low"]
    assert "other classes" in why and "weighted goodput" in why


def test_k0_under_an_amplification_cap_names_the_cap():
    policy = optimise_budgets(load_network(HOTEL), BudgetSearch(max_retries=3, max_amplification=1.2), load=2.0)
    assert "above the cap 1.2" in policy.explanation["low"]


def test_explanation_is_empty_when_every_class_retries():
    spec = load_network(TANDEM)  # k = (5, 1) in the file
    assert explain_no_retries(spec, BudgetSearch()) == {}


def test_explanation_travels_with_the_policy_document():
    policy = optimise_budgets(load_network(HOTEL), BudgetSearch(max_retries=1))
    back = RetryPolicy.from_doc(json.loads(json.dumps(policy.to_doc())))
    assert back.explanation == policy.explanation and back.search["offered_rho"] == pytest.approx(0.5)


def test_cli_rho_scales_the_load_and_prints_why_k0():
    runner = CliRunner()
    args = ["optimise", "-n", str(HOTEL), "--confirm-s", "0", "--no-register", "--max-retries", "2"]
    light = runner.invoke(retry_app, args)
    heavy = runner.invoke(retry_app, [*args, "--rho", "2", "--json"])
    assert light.exit_code == 0 and heavy.exit_code == 0, light.output + heavy.output
    assert "ρ = 0.50" in light.stdout and "why k=0" in light.stdout
    doc = json.loads(heavy.stdout)
    assert doc["search"]["offered_rho"] == pytest.approx(2.0)
    assert doc["network"]["arrivals"]["low"]["frontend"] == pytest.approx(200.0)
    assert set(doc["explanation"]) == {"low"}
    bad = runner.invoke(retry_app, [*args, "--load", "-1"])
    assert bad.exit_code == 2 and "--rho" in bad.output


@pytest.mark.slow  # a fresh MLflow store and a registration: 10-20 s on 2 cores
def test_registered_policy_carries_the_load_and_each_k0_reason_as_tags(tmp_path):
    from mlflow import MlflowClient

    from sloctl.training.retry_budget import load_retry_policy, register_retry_policy, retry_policy_name

    policy = optimise_budgets(load_network(HOTEL), BudgetSearch(max_retries=2), load=2.0)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    version = register_retry_policy(policy, tracking_uri=uri, experiment="t", source=str(HOTEL))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(client.get_model_version(retry_policy_name("hotel"), version).run_id)
    assert run.data.tags["why_k0.low"] == policy.explanation["low"] and "why_k0.high" not in run.data.tags
    assert float(run.data.tags["provenance.offered_rho"]) == pytest.approx(2.0)
    loaded = load_retry_policy(f"models:/{retry_policy_name('hotel')}@champion", tracking_uri=uri)
    assert loaded.explanation == policy.explanation
