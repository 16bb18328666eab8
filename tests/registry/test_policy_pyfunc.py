"""The policy pyfunc: one answer type for every kind, the typed policy on ``.policy``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from sloctl.control.credits import ClassShare
from sloctl.control.policies import AdmissionPolicy, CreditSettings, ExecutionPlan, MSemaphoreSettings, RetryPolicy
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup

POLICIES = [
    RetryPolicy(retries={"high": {"backend": 5}, "low": {"backend": 1}}, feasible=True, score=3.0,
                amplification=1.2, predicted={}, search={}, network={}, evaluated=4),
    AdmissionPolicy(credits=CreditSettings(0.1, 0.02, 0.002, 64), msem=MSemaphoreSettings(2, {1: 0.5, 2: 0.8}),
                    classes=(ClassShare("high", 1, 0.5), ClassShare("low", 0, 0.5))),
    ExecutionPlan(ExecutionConfig(spinups=(ScheduledSpinup(3.0, 2),)), time_scale={"hour_s": 4.0}),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.kind)
def test_predict_returns_the_document_for_every_kind(policy, tmp_path):
    from sloctl.registry.pyfunc import PolicyPyfunc

    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy.to_doc()))
    model = PolicyPyfunc()
    model.load_context(SimpleNamespace(artifacts={"policy": str(path)}))
    assert model.policy == policy
    rows = pd.DataFrame({"class": ["high"], "service": ["backend"]})
    assert model.predict(None, rows) == policy.to_doc() == model.predict(None, pd.DataFrame())


def test_a_bad_document_fails_to_load_with_its_field_named(tmp_path):
    from sloctl.registry.pyfunc import PolicyPyfunc

    path = tmp_path / "policy.json"
    path.write_text(json.dumps({**POLICIES[0].to_doc(), "retries": {"high": {"backend": -2}}}))
    with pytest.raises(ValueError, match="'retries.high.backend'"):
        PolicyPyfunc().load_context(SimpleNamespace(artifacts={"policy": str(path)}))
