"""Retry-budget search, its registration, the load sweep and the `sloctl retry` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sloctl.models.retry_network import load_network
from sloctl.training.retry_budget import BudgetSearch, optimise_budgets

TANDEM = "configs/networks/tandem.yaml"


@pytest.fixture(scope="module")
def overloaded():
    """The tandem at twice its capacity, high priority worth 10x low."""
    return load_network(TANDEM).scale_arrivals({"high": 2.0, "low": 6.0})


def test_goodput_search_gives_the_valuable_class_more_retries(overloaded):
    policy = optimise_budgets(overloaded, BudgetSearch(max_retries=5))
    k_high = set(policy.retries["high"].values())
    k_low = set(policy.retries["low"].values())
    assert max(k_high) > max(k_low)
    assert policy.predicted["high"]["end_to_end_rejection"] < policy.predicted["low"]["end_to_end_rejection"]
    assert policy.evaluated == 36 and policy.feasible


def test_amplification_cap_is_respected(overloaded):
    free = optimise_budgets(overloaded, BudgetSearch(max_retries=5))
    capped = optimise_budgets(overloaded, BudgetSearch(max_retries=5, max_amplification=1.2))
    assert capped.amplification <= 1.2 < free.amplification
    assert capped.feasible


def test_targets_that_cannot_be_met_are_reported_infeasible(overloaded):
    policy = optimise_budgets(overloaded, BudgetSearch(objective="targets", targets={"high": 0.0, "low": 0.0},
                                                       max_retries=3))
    assert not policy.feasible
    met = optimise_budgets(overloaded, BudgetSearch(objective="targets", targets={"high": 0.05}, max_retries=6))
    assert met.feasible and met.predicted["high"]["end_to_end_rejection"] <= 0.05


def test_bad_search_parameters_are_named(overloaded):
    with pytest.raises(ValueError, match="unknown class 'mid'"):
        optimise_budgets(overloaded, BudgetSearch(objective="targets", targets={"mid": 0.1}))
    with pytest.raises(ValueError, match="'max_amplification' parameter must be >= 1"):
        optimise_budgets(overloaded, BudgetSearch(max_amplification=0.5))


def test_policy_is_confirmed_registered_and_loaded_back(overloaded, tmp_path):
    from sloctl.training.retry_budget import confirm_by_simulation, load_retry_policy, register_retry_policy

    policy = confirm_by_simulation(optimise_budgets(overloaded, BudgetSearch(max_retries=3)), duration_s=60)
    for klass, row in policy.simulated.items():
        assert abs(row["end_to_end_rejection"] - policy.predicted[klass]["end_to_end_rejection"]) < 0.05
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    version = register_retry_policy(policy, tracking_uri=uri, experiment="t", source=TANDEM)
    loaded = load_retry_policy("models:/retry-policy-tandem@champion", tracking_uri=uri)
    assert version == "1"
    assert loaded.retries == policy.retries and loaded.kind == "retry-policy"
    assert loaded.provenance["source"] == TANDEM and loaded.provenance["data_hash"] == policy.provenance["data_hash"]


def test_sweep_holds_the_fixed_class_and_hits_each_load():
    from sloctl.models.retry import offered_rho
    from sloctl.simulation.retry_sweep import retry_sweep, sweep_spec

    spec = load_network(TANDEM)
    loaded = sweep_spec(spec, 2.0, ("high",))
    assert offered_rho(loaded) == pytest.approx(2.0, rel=1e-6)
    assert loaded.external("high").tolist() == spec.external("high").tolist()
    result = retry_sweep(spec, [0.5, 2.0], [{"high": 5, "low": 1}, {"high": 5, "low": 5}], simulate=False)
    at2 = {p["k"]["low"]: p["analysis"] for p in result["points"] if p["offered_rho"] == 2.0}
    assert at2[1]["high"] < at2[5]["high"] / 3  # DiffTry: k=(5,1) protects the high class
    with pytest.raises(ValueError, match="fixed classes alone offer"):
        sweep_spec(spec.scale_arrivals({"high": 10.0}), 1.0, ("high",))


def test_cli_solve_and_simulate_print_the_documented_json(tmp_path, run_sloctl):
    solved = run_sloctl("retry", "solve", "--network", TANDEM, "--model", "fluid", "--json")
    assert solved.returncode == 0, solved.stderr
    out = json.loads(solved.stdout)
    assert set(out["classes"]["high"]) >= {"completion_probability", "end_to_end_rejection"}
    assert set(out["services"]["backend"]["low"]) >= {"offered_per_s", "accepted_per_s", "attempt_rejection",
                                                     "final_rejection"}
    assert {"converged", "iterations", "uniqueness"} <= set(out)
    simulated = run_sloctl("retry", "simulate", "--network", TANDEM, "--seed", "3", "--duration-s", "60", "--json")
    assert simulated.returncode == 0, simulated.stderr
    sim = json.loads(simulated.stdout)
    assert len(sim["classes"]["low"]["end_to_end_rejection_ci"]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(TANDEM).read_text().replace("backend: 1.0", "backnd: 1.0"))
    refused = run_sloctl("retry", "solve", "--network", str(bad))
    assert refused.returncode == 2
    assert "unknown service 'backnd'" in refused.stderr
