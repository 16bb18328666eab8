"""Fixtures shared by the serving tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def empty_registry_uri(tmp_path_factory) -> str:
    """A registry nobody registers in: runtimes started on it route round-robin.

    Shared by the tests that only read it (MLflow takes seconds to create a database).
    """
    return f"sqlite:///{tmp_path_factory.mktemp('empty-registry') / 'mlflow.db'}"
