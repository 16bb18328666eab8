"""`sloctl train admission`: tune in the simulator, register, and configure the live middleware from the alias."""

from __future__ import annotations

import pytest

from sloctl.training.admission_policy import load_workload, register_admission_policy, tune_admission

WORKLOAD = "configs/admission_workload.yaml"


def test_tuned_policy_registers_and_configures_the_middleware(tmp_path):
    from sloctl.serving.runtime.admission import AdmissionMiddleware, AsyncMSemaphore

    policy = tune_admission(load_workload(WORKLOAD), trials=2, duration_s=0.02, seed=1)
    assert policy.kind == "admission-policy"
    assert policy.metrics["weighted_goodput_per_s"] >= policy.metrics["default_weighted_goodput_per_s"] * 0.999
    assert {c.name for c in policy.classes} == {"high", "low"}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert register_admission_policy(policy, tracking_uri=uri, experiment="t", source=WORKLOAD) == "1"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(client.get_model_version_by_alias("admission-policy", "champion").run_id)
    assert run.data.tags["provenance.workload"] == "admission_workload"  # what it was tuned on
    assert run.data.tags["provenance.load_factor"] == "2.0" and run.data.tags["provenance.workload_hash"]
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["workload-admission_workload"]
    middleware = AdmissionMiddleware.from_registry(object(), tracking_uri=uri)
    assert middleware.settings.classes == ("high", "low")
    assert middleware.controller.credits == policy.credits.initial_credits
    sem = AsyncMSemaphore.from_policy(policy, tune=True, max_bandwidth=1e9)
    assert sem.capacity == policy.msem.capacity


def test_bad_workload_description_is_named(tmp_path):
    bad = tmp_path / "w.yaml"
    bad.write_text("types:\n  - {name: cpu, klass: high, cpu_s: -1, slo_s: 1.0e-5}\n")
    with pytest.raises(ValueError, match=r"types\[0\].cpu_s must be a positive number"):
        load_workload(bad)
    bad.write_text("loadfactor: 2\ntypes: []\n")
    with pytest.raises(ValueError, match="unknown key 'loadfactor'"):
        load_workload(bad)
