"""The retry-network simulator: exact single-queue results, determinism, retries, routing, ciw."""

from __future__ import annotations

import collections
import json

import pytest

from sloctl.models.retry_network import network_from_mapping
from sloctl.simulation.retry_sim import expected_events, simulate_network

BIG = 10**9  # a buffer that never fills


def _net(services, retries, arrivals, routing=None, mode="independent", retry_delay_s=None):
    raw = {"services": services, "classes": {c: {"retries": k} for c, k in retries.items()},
           "arrivals": arrivals, "routing": routing or {}, "routing_mode": mode}
    if retry_delay_s is not None:
        raw["retry_delay_s"] = retry_delay_s
    return network_from_mapping(raw)


def _mm1k_blocking(rho: float, K: int) -> float:
    if rho == 1.0:
        return 1.0 / (K + 1)
    return (1 - rho) * rho**K / (1 - rho ** (K + 1))


@pytest.mark.parametrize("rho", [0.8, 1.0, 1.5])
def test_single_service_without_retries_blocks_like_mm1k(rho):
    """With k = 0 the one service is an M/M/1/K queue: attempt rejection is its blocking probability.

    The tolerance is two half-widths of the simulator's own 95% batch-means
    interval (about four standard errors), and the interval itself must be
    narrower than 0.01 on each side so the check has teeth.
    """
    K = 5
    spec = _net({"s": {"capacity_per_s": 100, "buffer": K}}, {"c": 0}, {"c": {"s": 100.0 * rho}})
    res = simulate_network(spec, seed=11, duration_s=500.0)
    exact = _mm1k_blocking(rho, K)
    svc = res.services["s"]["c"]
    cls = res.classes["c"]
    lo, hi = cls.end_to_end_rejection_ci
    half = (hi - lo) / 2
    assert half < 0.01
    assert abs(svc.attempt_rejection - exact) < 2 * half
    assert abs(cls.end_to_end_rejection - exact) < 2 * half
    assert svc.final_rejection == pytest.approx(svc.attempt_rejection, abs=2e-3)  # no retries: same thing
    assert res.utilisation["s"] == pytest.approx(rho * (1 - exact), rel=0.03)  # throughput / mu


def test_same_seed_gives_identical_json_and_another_seed_differs():
    spec = _net({"a": {"capacity_per_s": 50, "buffer": 4}, "b": {"capacity_per_s": 40, "buffer": 3}},
                {"hi": 3, "lo": 1}, {"hi": {"a": 25.0}, "lo": {"a": 30.0}},
                {"hi": {"a": {"b": 0.8}}, "lo": {"a": {"b": 0.8}}})
    one = json.dumps(simulate_network(spec, seed=5, duration_s=60.0).to_json(), sort_keys=True)
    two = json.dumps(simulate_network(spec, seed=5, duration_s=60.0).to_json(), sort_keys=True)
    other = json.dumps(simulate_network(spec, seed=6, duration_s=60.0).to_json(), sort_keys=True)
    assert one == two
    assert one != other


def test_more_retries_give_lower_rejection_and_more_attempts_under_overload():
    """Two classes share one service at twice its capacity: k = 5 beats k = 1 end to end (DiffTry §V)."""
    spec = _net({"s": {"capacity_per_s": 100, "buffer": 10}}, {"high": 5, "low": 1},
                {"high": {"s": 100.0}, "low": {"s": 100.0}}, retry_delay_s=0.1)
    res = simulate_network(spec, seed=2, duration_s=200.0)
    high, low = res.classes["high"], res.classes["low"]
    assert high.end_to_end_rejection < 0.5 * low.end_to_end_rejection
    assert high.end_to_end_rejection_ci[1] < low.end_to_end_rejection_ci[0]
    s_high, s_low = res.services["s"]["high"], res.services["s"]["low"]
    assert s_high.offered_per_s == pytest.approx(s_low.offered_per_s, rel=0.05)
    assert s_high.attempts_per_s > 1.5 * s_low.attempts_per_s
    assert high.calls_per_request > low.calls_per_request
    # both classes meet the same full buffer, so one attempt fares alike; only the retry budget differs
    assert s_high.attempt_rejection == pytest.approx(s_low.attempt_rejection, abs=0.02)
    assert s_high.final_rejection == pytest.approx(high.end_to_end_rejection, abs=1e-2)


def test_exclusive_routing_sends_each_success_to_one_service_and_independent_fans_out():
    services = {"a": {"capacity_per_s": 100, "buffer": BIG}, "b": {"capacity_per_s": 100, "buffer": BIG},
                "c": {"capacity_per_s": 100, "buffer": BIG}}
    arrivals = {"c1": {"a": 40.0}}
    exclusive = simulate_network(_net(services, {"c1": 0}, arrivals, {"c1": {"a": {"b": 0.6, "c": 0.4}}},
                                      mode="exclusive"), seed=1, duration_s=200.0)
    a = exclusive.services["a"]["c1"].accepted_per_s
    assert exclusive.services["b"]["c1"].offered_per_s == pytest.approx(0.6 * a, rel=0.05)
    assert exclusive.services["c"]["c1"].offered_per_s == pytest.approx(0.4 * a, rel=0.05)
    assert exclusive.classes["c1"].calls_per_request == 2.0  # exactly one downstream call per request

    fanout = simulate_network(_net(services, {"c1": 0}, arrivals, {"c1": {"a": {"b": 1.5, "c": 0.4}}}),
                              seed=1, duration_s=200.0)
    a = fanout.services["a"]["c1"].accepted_per_s
    assert fanout.services["b"]["c1"].offered_per_s == pytest.approx(1.5 * a, rel=0.05)
    assert fanout.services["c"]["c1"].offered_per_s == pytest.approx(0.4 * a, rel=0.05)
    assert fanout.classes["c1"].calls_per_request == pytest.approx(2.9, rel=0.03)
    assert fanout.classes["c1"].end_to_end_rejection == 0.0


def test_failing_branch_fails_the_request_while_siblings_are_still_served():
    """a calls b (fine) and c (tiny, rejects often, no retries); b goes on to d.

    A request fails exactly when its c call fails, yet b and d still see every
    call a makes: siblings are not cancelled.
    """
    services = {"a": {"capacity_per_s": 200, "buffer": BIG}, "b": {"capacity_per_s": 200, "buffer": BIG},
                "c": {"capacity_per_s": 30, "buffer": 2}, "d": {"capacity_per_s": 200, "buffer": BIG}}
    spec = _net(services, {"x": 0}, {"x": {"a": 50.0}}, {"x": {"a": {"b": 1.0, "c": 1.0}, "b": {"d": 1.0}}})
    res = simulate_network(spec, seed=4, duration_s=300.0)
    s = res.services
    c_fail = s["c"]["x"].final_rejection
    assert c_fail > 0.3
    assert res.classes["x"].end_to_end_rejection == pytest.approx(c_fail, abs=0.02)
    a_rate = s["a"]["x"].accepted_per_s
    assert s["b"]["x"].accepted_per_s == pytest.approx(a_rate, rel=0.03)
    assert s["d"]["x"].accepted_per_s == pytest.approx(a_rate, rel=0.03)
    assert res.utilisation["d"] == pytest.approx(a_rate / 200, rel=0.05)


def test_matches_ciw_on_a_lossy_entry_with_an_unbounded_downstream_service():
    """Cross-check against ciw on the one kind of network where both mean the same thing.

    ciw rejects (loses) an *external* arrival that finds a full node, but an
    internal transfer to a full node blocks the sender instead of failing the
    call. So: no retries (k = 0), a finite buffer only at the entry, where both
    simulators lose the arrival, and an effectively infinite buffer downstream,
    where neither ever blocks. ciw's probabilistic routing is our ``exclusive``
    mode. Then entry blocking, downstream throughput and utilisation, and the
    mean time in system of accepted requests must agree within noise.
    """
    ciw = pytest.importorskip("ciw")
    lam, mu1, mu2, K, p12, T, W = 9.0, 10.0, 8.0, 4, 0.7, 3000.0, 300.0
    ciw.seed(3)
    net = ciw.create_network(
        arrival_distributions=[ciw.dists.Exponential(rate=lam), None],
        service_distributions=[ciw.dists.Exponential(rate=mu1), ciw.dists.Exponential(rate=mu2)],
        number_of_servers=[1, 1],
        queue_capacities=[K - 1, float("inf")],  # ciw's capacity excludes the one in service
        routing=[[0.0, p12], [0.0, 0.0]],
    )
    sim = ciw.Simulation(net)
    sim.simulate_until_max_time(T)
    recs = sim.get_all_records()
    rejected = sum(1 for r in recs if r.record_type == "rejection" and W <= r.arrival_date < T)
    entered = sum(1 for r in recs if r.record_type == "service" and r.node == 1 and W <= r.arrival_date < T)
    served2 = [r for r in recs if r.record_type == "service" and r.node == 2 and W <= r.service_end_date < T]
    visits = collections.defaultdict(list)
    for r in recs:
        if r.record_type == "service":
            visits[r.id_number].append(r)
    stays = [max(v.exit_date for v in vs) - vs[0].arrival_date for vs in visits.values()
             if W <= vs[0].arrival_date < T - 50]
    ciw_block = rejected / (rejected + entered)
    ciw_thr2 = len(served2) / (T - W)
    ciw_util2 = sum(r.service_time for r in served2) / (T - W)
    ciw_stay = sum(stays) / len(stays)

    spec = _net({"a": {"capacity_per_s": mu1, "buffer": K}, "b": {"capacity_per_s": mu2, "buffer": BIG}},
                {"c": 0}, {"c": {"a": lam}}, {"c": {"a": {"b": p12}}}, mode="exclusive")
    res = simulate_network(spec, seed=3, duration_s=T, warmup_s=W)
    ours = res.services
    assert ours["a"]["c"].attempt_rejection == pytest.approx(ciw_block, abs=0.015)
    assert ours["a"]["c"].attempt_rejection == pytest.approx(_mm1k_blocking(lam / mu1, K), abs=0.015)
    assert ours["b"]["c"].accepted_per_s == pytest.approx(ciw_thr2, rel=0.04)
    assert res.utilisation["b"] == pytest.approx(ciw_util2, rel=0.05)
    assert res.classes["c"].latency_s["mean"] == pytest.approx(ciw_stay, rel=0.08)


def test_refuses_a_run_larger_than_max_events_and_reports_progress():
    spec = _net({"s": {"capacity_per_s": 1000, "buffer": 5}}, {"c": 2}, {"c": {"s": 900.0}})
    assert expected_events(spec, 100.0, 0.02) > 1e5
    with pytest.raises(ValueError, match="max_events"):
        simulate_network(spec, duration_s=100.0, max_events=100_000)
    seen = []
    simulate_network(spec, duration_s=2.0, progress=lambda now_s, total_s, events: seen.append((now_s, events)))
    assert seen[-1][0] == 2.0
    assert [t for t, _ in seen] == sorted(t for t, _ in seen)
    with pytest.raises(ValueError, match="warmup_s"):
        simulate_network(spec, duration_s=2.0, warmup_s=3.0)
    with pytest.raises(ValueError, match="retry_delay"):
        simulate_network(spec, duration_s=2.0, retry_delay="constant")


def test_fixed_retry_delay_and_service_time_variability_keep_the_mean_load():
    """Non-exponential service times keep the mean (utilisation = lambda / mu) whatever the cv."""
    for cv in (0.0, 0.5, 3.0):
        spec = _net({"s": {"capacity_per_s": 100, "buffer": BIG, "service_cv": cv}}, {"c": 2}, {"c": {"s": 60.0}})
        res = simulate_network(spec, seed=8, duration_s=300.0, retry_delay="fixed")
        assert res.utilisation["s"] == pytest.approx(0.6, rel=0.04), cv
    # waiting grows with variability: deterministic < hyperexponential mean latency (Pollaczek-Khinchine)
    lat = {cv: simulate_network(_net({"s": {"capacity_per_s": 100, "buffer": BIG, "service_cv": cv}}, {"c": 0},
                                     {"c": {"s": 60.0}}), seed=8, duration_s=300.0).classes["c"].latency_s["mean"]
           for cv in (0.0, 3.0)}
    mean_s, rho = 0.01, 0.6
    for cv, got in lat.items():
        pk = mean_s + rho * mean_s * (1 + cv**2) / (2 * (1 - rho))
        assert got == pytest.approx(pk, rel=0.15 if cv > 1 else 0.05), cv
