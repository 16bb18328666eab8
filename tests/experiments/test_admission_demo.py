"""The live admission demo: the ASGI middleware protects a light endpoint from a memory flood, on loopback."""

from __future__ import annotations

import pytest

from sloctl.experiments.admission_demo import live_admission_experiment


@pytest.mark.slow
def test_live_middleware_protects_the_light_endpoint_from_a_memory_flood():
    result = live_admission_experiment(duration_s=3.0, mem_rate_per_s=150.0, cpu_rate_per_s=100.0, mem_mb=64)
    without, with_control = result["without"]["/cpu"], result["with"]["/cpu"]
    assert with_control["goodput_per_s"] > without["goodput_per_s"]
    assert with_control["p99_s"] < without["p99_s"]
