"""Policy documents: round trips, one place of validation, old documents, dispatch by kind."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sloctl.control.autoscaler import AutoscalerConfig
from sloctl.control.credits import ClassShare
from sloctl.control.policies import (
    POLICY_TYPES,
    AdmissionPolicy,
    CreditSettings,
    ExecutionPlan,
    MSemaphoreSettings,
    RetryPolicy,
    policy_from_doc,
)
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup

RETRY = RetryPolicy(
    retries={"high": {"frontend": 5, "backend": 4}, "low": {"frontend": 1, "backend": 0}}, feasible=True,
    score=12.5, amplification=1.4,
    predicted={"high": {"end_to_end_rejection": 0.01, "success_per_s": 9.9},
               "low": {"end_to_end_rejection": 0.3, "success_per_s": 2.6}},
    search={"objective": "goodput", "targets": {}, "max_amplification": None, "max_retries": 6, "per_hop": False,
            "model": "mm1m"},
    network={"services": {"frontend": {"capacity_per_s": 10.0}, "backend": {"capacity_per_s": 8.0}}}, evaluated=49,
    simulated={"high": {"end_to_end_rejection": 0.012, "end_to_end_rejection_ci": [0.01, 0.014],
                        "success_per_s": 9.8, "calls_per_success": 1.2}},
    provenance={"data_hash": "0123456789abcdef", "seed": "0", "source": "configs/networks/tandem.yaml"})
ADMISSION = AdmissionPolicy(
    credits=CreditSettings(epsilon=0.12, dead_band=0.03, experiment_s=0.0015, initial_credits=48),
    msem=MSemaphoreSettings(capacity=3, arm_values={1: 0.4, 2: 0.7, 3: 0.9}),
    classes=(ClassShare("high", 1, 0.6), ClassShare("low", 0, 0.4)),
    metrics={"weighted_goodput_per_s": 81000.0, "drop_rate": 0.2, "p99_s_cpu": 1.2e-5},
    search={"trials": 12, "seed": 0, "duration_s": 0.08},
    workload={"server": {}, "load_factor": 2.0, "priorities": {"high": 1, "low": 0}, "weights": {},
              "types": [{"name": "cpu", "klass": "high", "cpu_s": 5e-6, "slo_s": 1.5e-5}]},
    provenance={"data_hash": "fedcba9876543210", "seed": "0"})
PLAN = ExecutionPlan(
    config=ExecutionConfig(spinups=(ScheduledSpinup(12.5, 2), ScheduledSpinup(30.0, 1, "vertical")),
                           autoscaler=AutoscalerConfig(window_s=2.0, candidate_sizes=(1, 2, 4)), start_sizes=(2, 2)),
    target_date="2024-05-31", knobs={"theta": 12, "tau_trigger": 0.08},
    predicted={"validation_vr": 0.04, "validation_cost": 508.0},
    time_scale={"hour_s": 4.0, "mean_isolated_s": 0.1, "hour_units": 40.0, "kept_fraction": 1.0},
    router="iconq", strategy="grid", budget=3, order="knobs_first",
    forecasts={"train": 2, "validation": 1, "policy": "decay", "queries": [120, 131, 118]},
    history={"history": "hourly.parquet", "instance": 134, "days": 7}, evaluated=3, simulations=9,
    trials=({"params": {"theta": 12}, "train": [0.05, 500.0], "validation": None},),
    provenance={"data_hash": "00ff00ff00ff00ff", "seed": "0", "source": "hourly.parquet"})
EXAMPLES = {"retry-policy": RETRY, "admission-policy": ADMISSION, "execution-config": PLAN}


def _through_json(doc):
    return json.loads(json.dumps(doc, allow_nan=False))  # strict JSON: what HTTP clients and the registry see


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_every_kind_is_a_frozen_versioned_document_that_round_trips(kind):
    policy = EXAMPLES[kind]
    cls = type(policy)
    assert POLICY_TYPES[kind] is cls and cls.kind == kind and cls.version >= 1
    doc = policy.to_doc()
    assert doc["kind"] == kind and doc["version"] == cls.version and doc["provenance"] == dict(policy.provenance)
    assert cls.from_doc(_through_json(doc)) == policy
    assert policy_from_doc(_through_json(doc)) == policy
    # a document is a copy: changing it leaves the policy alone
    copy = policy.to_doc()
    copy["provenance"]["seed"] = "99"
    assert policy.provenance["seed"] == "0"
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.provenance = {}  # type: ignore[misc]
    # one place of validation: every kind refuses a foreign kind, a future version and an unknown field
    with pytest.raises(ValueError, match=f"'kind' field of the {kind} document must be '{kind}'"):
        cls.from_doc({**doc, "kind": "other"})
    with pytest.raises(ValueError, match=f"'version' field of the {kind} document .* got {cls.version + 1}"):
        cls.from_doc({**doc, "version": cls.version + 1})
    with pytest.raises(ValueError, match=f"{kind} document has an unknown field 'colour'"):
        cls.from_doc({**doc, "colour": "blue"})
    with pytest.raises(ValueError, match=f"'provenance' field of the {kind} document must map strings to strings"):
        cls.from_doc({**doc, "provenance": {"seed": 0}})
    # without a version it was written before versions existed: version 1
    unversioned = {k: v for k, v in doc.items() if k != "version"}
    assert cls.from_doc(unversioned) == policy


def test_retry_policy_errors_name_the_field_the_rule_and_the_value():
    doc = RETRY.to_doc()
    with pytest.raises(ValueError, match=r"'retries.low.backend' field of the retry-policy document must be a whole "
                                         r"number >= 0, got -1\."):
        RetryPolicy.from_doc({**doc, "retries": {**doc["retries"], "low": {"frontend": 1, "backend": -1}}})
    with pytest.raises(ValueError, match=r"'retries.high.frontend' .* whole number >= 0, got 2.5"):
        RetryPolicy.from_doc({**doc, "retries": {"high": {"frontend": 2.5}}})
    with pytest.raises(ValueError, match=r"'feasible' field .* must be true or false, got 'yes'"):
        RetryPolicy.from_doc({**doc, "feasible": "yes"})
    with pytest.raises(ValueError, match=r"'evaluated' field of the retry-policy document is required"):
        RetryPolicy.from_doc({k: v for k, v in doc.items() if k != "evaluated"})
    with pytest.raises(ValueError, match=r"'retries' field .*\(at least one class\)"):
        RetryPolicy.from_doc({**doc, "retries": {}})


def test_admission_policy_errors_name_the_field_the_rule_and_the_value():
    doc = ADMISSION.to_doc()
    with pytest.raises(ValueError, match=r"'credits.epsilon' field of the admission-policy document must be a "
                                         r"number in \(0, 1\], got 0\.0\."):
        AdmissionPolicy.from_doc({**doc, "credits": {**doc["credits"], "epsilon": 0.0}})
    with pytest.raises(ValueError, match=r"'msem.capacity' .* whole number >= 1, got 0"):
        AdmissionPolicy.from_doc({**doc, "msem": {**doc["msem"], "capacity": 0}})
    with pytest.raises(ValueError, match=r"'msem.arm_values' .* capacities .* got 'two'"):
        AdmissionPolicy.from_doc({**doc, "msem": {**doc["msem"], "arm_values": {"two": 0.5}}})
    with pytest.raises(ValueError, match=r"'classes\[1\].share' .* > 0, got -1"):
        AdmissionPolicy.from_doc({**doc, "classes": [doc["classes"][0], {"name": "low", "priority": 0,
                                                                        "share": -1}]})
    with pytest.raises(ValueError, match=r"'classes' .* name each class once"):
        AdmissionPolicy.from_doc({**doc, "classes": [doc["classes"][0], doc["classes"][0]]})
    with pytest.raises(ValueError, match=r"admission-policy document has an unknown field 'credits.step'"):
        AdmissionPolicy.from_doc({**doc, "credits": {**doc["credits"], "step": 1}})


def test_execution_plan_errors_name_the_field_the_rule_and_the_value():
    doc = PLAN.to_doc()
    with pytest.raises(ValueError, match=r"'spinups\[1\].mode' field of the execution-config document must be "
                                         r"'add' or 'vertical', got 'sideways'"):
        ExecutionPlan.from_doc({**doc, "spinups": [doc["spinups"][0], {"time_s": 1.0, "size": 1,
                                                                       "mode": "sideways"}]})
    with pytest.raises(ValueError, match=r"'start_sizes' .* cluster sizes .* got \[0\]"):
        ExecutionPlan.from_doc({**doc, "start_sizes": [0]})
    with pytest.raises(ValueError, match=r"'target_date' .* ISO date .* got '31/05/2024'"):
        ExecutionPlan.from_doc({**doc, "target_date": "31/05/2024"})
    with pytest.raises(ValueError, match=r"'autoscaler.theta' .* whole number, got 'ten'"):
        ExecutionPlan.from_doc({**doc, "autoscaler": {**doc["autoscaler"], "theta": "ten"}})
    with pytest.raises(ValueError, match=r"'autoscaler' field .* invalid: The 'window_s' parameter of "
                                         r"AutoscalerConfig must be > 0"):
        ExecutionPlan.from_doc({**doc, "autoscaler": {**doc["autoscaler"], "window_s": 0.0}})


def test_documents_registered_by_older_code_still_load():
    # exactly the shapes RetryPolicy.to_json, tune_admission and `sloctl tune policy` wrote: no version, no provenance
    retry = {"kind": "retry-policy", "retries": {"high": {"backend": 5}, "low": {"backend": 1}}, "feasible": True,
             "score": 3.5, "amplification": 1.2, "predicted": {"high": {"end_to_end_rejection": 0.02,
                                                                        "success_per_s": 2.0}},
             "simulated": None, "search": {"objective": "goodput", "max_amplification": None}, "evaluated": 36,
             "network": {"services": {"backend": {}}}}
    admission = {"kind": "admission-policy",
                 "credits": {"epsilon": 0.1, "dead_band": 0.02, "experiment_s": 0.002, "initial_credits": 64},
                 "classes": [{"name": "high", "priority": 1, "share": 0.5}, {"name": "low", "priority": 0,
                                                                            "share": 0.5}],
                 "msem": {"capacity": 2, "arm_values": {"1": 0.5, "2": 0.8}, "alpha": 0.7, "omega": 0.8,
                          "epsilon": 0.3},
                 "metrics": {"weighted_goodput_per_s": 1.0, "p99_s_cpu": float("nan")},
                 "search": {"trials": 2, "seed": 1, "duration_s": 0.02}, "workload": {"load_factor": 2.0}}
    execution = {"kind": "execution-config", "target_date": "2024-03-04", "start_sizes": [2],
                 "spinups": [{"time_s": 3.0, "real_time": "00:45", "size": 2, "mode": "add"}], "autoscaler": None,
                 "knobs": {"start_clusters": 1, "start_size": 2}, "predicted": {"validation_vr": 0.1},
                 "time_scale": {"hour_s": 4.0}, "router": "round-robin", "strategy": "grid", "budget": 3,
                 "order": "knobs_first", "forecasts": {"train": 2}, "history": {"days": 2}, "evaluated": 3,
                 "simulations": 9, "trials": []}
    loaded = [policy_from_doc(json.loads(json.dumps(d))) for d in (retry, admission, execution)]
    assert [type(p) for p in loaded] == [RetryPolicy, AdmissionPolicy, ExecutionPlan]
    assert all(p.version == 1 and p.provenance == {} for p in loaded)
    assert loaded[0].budget("high", "backend") == 5
    assert loaded[1].msem.arm_values == {1: 0.5, 2: 0.8}
    assert loaded[2].config.spinups == (ScheduledSpinup(3.0, 2, "add"),)
    # what is served is what older code wrote, plus kind's version and provenance
    assert {k: v for k, v in loaded[2].to_doc().items() if k not in ("version", "provenance")} == execution
    assert {k: v for k, v in loaded[0].to_doc().items() if k not in ("version", "provenance")} == retry


def test_policy_from_doc_refuses_an_unknown_kind_and_a_non_mapping():
    with pytest.raises(ValueError, match=r"'kind' field of a policy document must be one of 'retry-policy', "
                                         r"'admission-policy', 'execution-config', got 'stage'"):
        policy_from_doc({"kind": "stage"})
    with pytest.raises(ValueError, match="got None"):
        policy_from_doc({"retries": {}})
    with pytest.raises(ValueError, match="must be a mapping, got list"):
        policy_from_doc([RETRY.to_doc()])


def test_retry_budgets_are_looked_up_per_class_and_service():
    assert RETRY.budget("high", "backend") == 4
    assert RETRY.budgets(["high", "low", "low"], ["frontend", "frontend", "backend"]) == [5, 1, 0]
    with pytest.raises(ValueError, match="unknown class 'mid'"):
        RETRY.budget("mid", "backend")
    with pytest.raises(ValueError, match="unknown service 'db'"):
        RETRY.budget("low", "db")


def test_admission_policy_configures_a_fresh_controller():
    controller = ADMISSION.controller(seed=3)
    assert controller.credits == 48 and controller.epsilon == 0.12 and controller.dead_band == 0.03
    assert controller.experiment_s == 0.0015 and [c.name for c in controller.classes] == ["high", "low"]
    assert ADMISSION.class_names() == ("high", "low")
    one_class = dataclasses.replace(ADMISSION, classes=(ClassShare("only", 1),))
    assert one_class.controller().classes == ()  # one class reserves nothing


def test_execution_plan_writes_each_spinup_at_its_real_time():
    doc = PLAN.to_doc()
    # an hour lasts 4 compressed seconds: 12.5 s is 03:07:30 of the real day, 30 s is 07:30
    assert [s["real_time"] for s in doc["spinups"]] == ["03:07", "07:30"]
    assert doc["autoscaler"]["candidate_sizes"] == [1, 2, 4] and doc["start_sizes"] == [2, 2]
    no_scale = ExecutionPlan(PLAN.config)
    assert "real_time" not in no_scale.to_doc()["spinups"][0]
    assert ExecutionPlan.from_doc(no_scale.to_doc()) == no_scale
