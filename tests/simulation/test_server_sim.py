"""The multi-bottleneck server simulator, its baselines and Svalinn (fast: short runs only)."""

from __future__ import annotations

import pytest

from sloctl.control.admission import AdmitAll
from sloctl.control.admission_baselines import ProtegoAdmission
from sloctl.experiments.admission import APPROACHES, make_policy, synthetic_workload, three_bottleneck_workload
from sloctl.simulation.server_sim import (
    Request,
    RequestType,
    ServerConfig,
    capacity_per_s,
    isolated_service_s,
    simulate,
)

CONFIG = ServerConfig()
TYPES = synthetic_workload(config=CONFIG)
CAPACITY, _ = capacity_per_s(TYPES, CONFIG)


def _run(name, load, *, types=TYPES, duration_s=0.04, seed=0, capacity=CAPACITY):
    policy = make_policy(name, types, CONFIG, capacity=capacity, seed=seed)
    return simulate(types, policy, rate_per_s=load * capacity, duration_s=duration_s, warmup_s=duration_s / 4,
                    config=CONFIG, seed=seed)


def test_capacity_is_where_six_memory_sections_saturate_the_bus():
    capacity, k = capacity_per_s(TYPES, CONFIG)
    mem = next(t for t in TYPES if t.name == "mem")
    assert k == 6
    assert capacity == pytest.approx(2 * CONFIG.bandwidth_bytes_per_s / mem.mem_bytes)


def test_same_seed_same_result_and_other_seed_differs():
    a, b, c = _run("svalinn", 1.5, seed=3), _run("svalinn", 1.5, seed=3), _run("svalinn", 1.5, seed=4)
    assert a.to_dict() == b.to_dict()
    assert a.series == b.series
    assert a.to_dict() != c.to_dict()


def test_bandwidth_saturation_slows_memory_requests_and_keeps_cores_busy():
    mem = RequestType("mem", "be", cpu_s=1e-6, mem_bytes=600e3, slo_s=1.0)
    alone = isolated_service_s(mem, CONFIG)
    saturating = 1.3 * CONFIG.bandwidth_bytes_per_s / mem.mem_bytes
    light = simulate([mem], AdmitAll(), rate_per_s=0.05 * saturating, duration_s=0.05, warmup_s=0.01)
    heavy = simulate([mem], AdmitAll(), rate_per_s=saturating, duration_s=0.05, warmup_s=0.01)
    assert light.p_latency_s("mem", 0.5) == pytest.approx(alone, rel=0.05)
    assert heavy.p_latency_s("mem", 0.5) > 2 * alone
    assert heavy.bandwidth_bytes_per_s == pytest.approx(CONFIG.bandwidth_bytes_per_s, rel=0.02)
    assert heavy.utilisation > 0.95  # sixteen cores busy, yet only six sections' worth of bytes move


@pytest.mark.slow
def test_an_oversubscribed_bus_loses_the_configured_share_only_when_asked():
    import dataclasses

    mem = RequestType("mem", "be", cpu_s=1e-6, mem_bytes=600e3, slo_s=1.0)
    heavy = 3.0 * CONFIG.bandwidth_bytes_per_s / mem.mem_bytes  # the sixteen cores all end up in memory sections
    lossy = dataclasses.replace(CONFIG, oversubscription_loss=0.2)
    plain = simulate([mem], AdmitAll(), rate_per_s=heavy, duration_s=0.05, warmup_s=0.01)
    hurt = simulate([mem], AdmitAll(), rate_per_s=heavy, duration_s=0.05, warmup_s=0.01, config=lossy)
    assert plain.bandwidth_bytes_per_s == pytest.approx(CONFIG.bandwidth_bytes_per_s, rel=0.02)
    # 16 sections asking 10 GB/s each of a 60 GB/s bus: r = 8/3, so the bus keeps 1 / (1 + 0.2 * 5/3)
    assert hurt.bandwidth_bytes_per_s == pytest.approx(CONFIG.bandwidth_bytes_per_s / (1 + 0.2 * 5 / 3), rel=0.03)
    light = simulate([mem], AdmitAll(), rate_per_s=0.05 * heavy, duration_s=0.05, warmup_s=0.01, config=lossy)
    assert light.p_latency_s("mem", 0.5) == pytest.approx(isolated_service_s(mem, CONFIG), rel=0.05)  # not below
    with pytest.raises(ValueError, match="oversubscription_loss"):
        ServerConfig(oversubscription_loss=-0.1)


def test_cpu_only_throughput_at_saturation_is_cores_over_cpu_time():
    cpu = RequestType("cpu", "be", cpu_s=100e-6, slo_s=10.0)
    result = simulate([cpu], AdmitAll(), rate_per_s=1.5 * CONFIG.cores / cpu.cpu_s, duration_s=0.06,
                      warmup_s=0.01, sample_interval_s=0.005)
    rates = [r for t, r in zip(result.series["t_s"], result.series["good_cpu_per_s"], strict=True) if 0.01 < t <= 0.06]
    assert sum(rates) / len(rates) == pytest.approx(CONFIG.cores / cpu.cpu_s, rel=0.02)
    assert result.utilisation == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("name", ["single-queue", "seda"])
def test_baseline_admits_all_when_light_and_drops_under_overload(name):
    assert _run(name, 0.3).drop_rate == 0.0
    assert _run(name, 2.0).drop_rate > 0.2


def test_protego_lock_aqm_admits_all_when_light_and_drops_at_a_hot_lock_under_overload():
    hot = RequestType("write", "be", cpu_s=2e-6, lock="row", lock_s=10e-6, slo_s=100e-6)
    capacity, _ = capacity_per_s([hot], CONFIG)

    def run(load):
        return simulate([hot], ProtegoAdmission(credits=False), rate_per_s=load * capacity, duration_s=0.04,
                        warmup_s=0.01, config=CONFIG)

    assert run(0.3).drop_rate == 0.0
    overloaded = run(2.0)
    assert overloaded.drop_rate > 0.3
    assert overloaded.locks["row"]["dropped"] > 0  # refused at the lock, not before
    assert overloaded.p_latency_s("write", 0.99) <= hot.slo_s


def test_protego_credits_grow_only_while_throughput_rises_and_the_pool_is_used():
    policy = ProtegoAdmission(initial_credits=4, credit_interval_s=1e-3)
    policy.tick(1e-3)  # the first interval has nothing to compare with: the pool shrinks
    assert policy.credits_ == 3
    req = [Request(i, TYPES[0], 1e-3) for i in range(5)]
    assert [policy.on_arrival(r, 1e-3) for r in req] == [True, True, True, False, False]  # used up
    for r in req[:3]:
        policy.on_complete(r, 1.5e-3)
    policy.tick(2e-3)  # out rose 0 → 3 with the credits all used: grow
    assert policy.credits_ == 4
    policy.tick(3e-3)  # nothing completed: shrink
    assert policy.credits_ == 3


def test_the_three_bottleneck_mix_runs_through_the_lock():
    types = three_bottleneck_workload(config=CONFIG)
    capacity, _ = capacity_per_s(types, CONFIG)
    assert {t.lock for t in types} == {None, "hot"}
    light = _run("svalinn", 0.5, types=types, capacity=capacity)
    hot = light.locks["hot"]
    assert hot["held"] == light.types["lock"].completed > 0  # every completed lock request held the lock
    assert hot["waited"] > 0  # and some waited for its holder
    overloaded = _run("protego", 2.0, types=types, capacity=capacity)
    # Under overload the lock is contended: its AQM refuses requests at the lock, and never more than
    # one second of lock sections runs per second.
    lock = next(t for t in types if t.name == "lock")
    assert overloaded.locks["hot"]["dropped"] > 0 and overloaded.locks["hot"]["waited"] > 0
    assert overloaded.locks["hot"]["held"] * lock.lock_s / overloaded.window_s <= 1.0 + 1e-9


@pytest.mark.parametrize("name", APPROACHES)
def test_every_approach_accounts_for_every_request_when_light(name):
    result = _run(name, 0.3)
    for stats in result.types.values():
        assert stats.offered == stats.completed + stats.dropped
        assert stats.admitted <= stats.offered


def test_svalinn_beats_single_queue_on_cpu_goodput_under_overload():
    svalinn, single = _run("svalinn", 2.0, duration_s=0.06), _run("single-queue", 2.0, duration_s=0.06)
    assert svalinn.goodput_per_s("cpu") > 1.6 * single.goodput_per_s("cpu")
    assert svalinn.goodput_per_s("mem") > 0.8 * single.goodput_per_s("mem")
    for name in ("cpu", "mem"):
        assert svalinn.p_latency_s(name, 0.99) <= svalinn.slo_s[name]


def test_svalinn_sheds_the_low_class_first():
    # A generous SLO lets the run queue grow past the credit pool, so the pool (not the AQM) decides.
    high = RequestType("hi", "high", cpu_s=10e-6, slo_s=2e-3)
    low = RequestType("lo", "low", cpu_s=10e-6, slo_s=2e-3)
    capacity, _ = capacity_per_s([high, low], CONFIG)
    result = _run("svalinn", 2.0, types=[high, low], capacity=capacity)
    drop = {n: s.dropped / s.offered for n, s in result.types.items()}
    assert drop["lo"] > drop["hi"] + 0.3


def test_the_tuner_steps_every_500_us_exactly():
    # Issue 21: tick times built by repeated addition and a strict comparison made half the intervals 600 µs.
    policy = make_policy("svalinn", TYPES, CONFIG, capacity=CAPACITY)
    simulate(TYPES, policy, rate_per_s=2 * CAPACITY, duration_s=0.02, config=CONFIG)
    steps = [t for t, _, _ in policy.capacity_log_]
    gaps = [b - a for a, b in zip(steps[1:-1], steps[2:], strict=True)]
    assert len(gaps) > 30
    assert all(gap == pytest.approx(500e-6, abs=1e-12) for gap in gaps)


def test_the_oracle_of_the_50_50_mix_is_all_cpu_requests_and_the_bus_worth_of_memory_requests():
    from sloctl.simulation.server_sim import oracle_bound

    bound = oracle_bound(TYPES, CONFIG, 2 * CAPACITY)  # 200 000/s of each type offered
    # The bus carries 60 GB/s ÷ 600 kB = 100 000 memory requests/s; the cores (0.45 busy) take every CPU request.
    assert bound.goodput_per_s == pytest.approx({"cpu": 200_000.0, "mem": 100_000.0})
    assert bound.utilisation["bandwidth"] == pytest.approx(1.0)


def test_svalinn_lock_requests_meet_their_slo_behind_a_hot_lock():
    # Its lock AQM counts the holder's remaining time (count_in_service), so a request admitted to the
    # lock finishes in time: the lock's time goes to goodput, not to requests that end late.
    types = three_bottleneck_workload(config=CONFIG)
    capacity, _ = capacity_per_s(types, CONFIG)
    lock = next(t for t in types if t.name == "lock")
    result = _run("svalinn", 2.0, types=types, capacity=capacity, duration_s=0.02)
    assert result.locks["hot"]["dropped"] > 0 and result.locks["hot"]["waited"] > 0
    assert result.p_latency_s("lock", 0.99) <= lock.slo_s


def test_the_lock_ceiling_matches_queueing_theory_where_it_is_known():
    from sloctl.simulation.server_sim import lock_ceiling_per_s

    # No allowance: a one-server loss system, which serves lambda / (1 + lambda * hold) whatever the holds' law
    assert lock_ceiling_per_s(1e5, 1e-5, 0.0, seed=3) == pytest.approx(1e5 / 2, rel=0.02)
    # Room for everything at half load: every arrival is served
    assert lock_ceiling_per_s(5e4, 1e-5, 1.0, seed=3) == pytest.approx(5e4, rel=0.02)
    # Far above capacity with an allowance of two sections: the lock never idles
    assert lock_ceiling_per_s(1e6, 1e-5, 20e-6, seed=3) == pytest.approx(1e5, rel=0.01)
    # At capacity with two and a half sections of allowance, bursts cost about a sixth of the lock
    assert 0.8 < lock_ceiling_per_s(1e5, 1e-5, 24e-6, seed=3) / 1e5 < 0.87
    with pytest.raises(ValueError, match="'allowance_s' parameter of lock_ceiling_per_s"):
        lock_ceiling_per_s(1e5, 1e-5, -1.0)
    with pytest.raises(ValueError, match="'hold_s' parameter of lock_ceiling_per_s must be > 0"):
        lock_ceiling_per_s(1e5, 0.0, 1.0)
