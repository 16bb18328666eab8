"""A model slot watching a registry alias: failures are counted, cleared when the alias is good again, and a
replaced registry file is reopened (issue 19, item 10)."""

from __future__ import annotations

import os
import sqlite3

import pytest

from sloctl.control.credits import ClassShare
from sloctl.control.policies import AdmissionPolicy, CreditSettings, MSemaphoreSettings


def _policy(initial: int) -> AdmissionPolicy:
    return AdmissionPolicy(credits=CreditSettings(0.1, 0.02, 0.002, initial), msem=MSemaphoreSettings(2, {1: 0.5}),
                           classes=(ClassShare("high", 1, 0.5), ClassShare("low", 0, 0.5)))


@pytest.mark.slow
def test_load_errors_clear_failures_count_and_a_replaced_file_is_reopened(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    import sloctl.serving.controller as controller
    from sloctl.registry.store import register_policy

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    name = AdmissionPolicy.kind
    register_policy(_policy(32), tracking_uri=uri, experiment="t")
    register_policy(_policy(48), tracking_uri=uri, experiment="t", alias="")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.set_registered_model_alias(name, "champion", "1")
    real = controller.load_policy

    def broken_v2(model_uri, **kwargs):
        if model_uri.endswith("/2"):
            raise OSError("artifact missing")
        return real(model_uri, **kwargs)

    monkeypatch.setattr(controller, "load_policy", broken_v2)
    slot = controller.ModelSlot(f"models:/{name}@champion", uri, name)
    assert slot.refresh() and slot.version == "1" and slot.error is None
    client.set_registered_model_alias(name, "champion", "2")
    assert not slot.refresh()
    assert slot.version == "1" and "version 2 failed to load" in slot.error and slot.load_failures == 1
    client.set_registered_model_alias(name, "champion", "1")
    assert not slot.refresh() and slot.error is None and slot.load_failures == 1  # good again: cleared

    # Replace the file (a new inode) with a copy whose alias names version 2: the slot must read the new file.
    copy = tmp_path / "new.db"
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    with sqlite3.connect(copy) as dst:
        dst.execute("UPDATE registered_model_aliases SET version = 2 WHERE alias = 'champion'")
    os.replace(copy, db)
    assert not slot.refresh()
    assert slot.load_failures == 2 and "version 2" in slot.error  # it saw the new file's alias
