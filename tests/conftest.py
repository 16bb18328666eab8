"""Shared fixtures: one tiny TPC-H database (SF 0.01) per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tpch_db(tmp_path_factory):
    from sloctl.datasets.tpc import ensure_database

    return ensure_database("tpch", 0.01, tmp_path_factory.mktemp("warehouse"), log=None)


@pytest.fixture(scope="session")
def tpch_templates():
    from sloctl.datasets.tpc import load_templates

    return load_templates("tpch")
