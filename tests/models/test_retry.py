from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloctl.models.retry import (
    MODELS,
    offered_rho,
    phi,
    residual_alpha,
    solve_network,
    solve_single_service,
    uniqueness_report,
)
from sloctl.models.retry_network import NetworkError, load_network, network_from_mapping

NETWORKS = Path(__file__).resolve().parents[2] / "configs" / "networks"


def load(name: str):
    return load_network(NETWORKS / f"{name}.yaml")


def at_rho(spec, rho: float):
    """The network with every class's arrivals scaled so that the bottleneck's offered utilisation is ``rho``."""
    factor = rho / offered_rho(spec)
    return spec.scale_arrivals({c: factor for c in spec.classes})


def mm1k_blocking(rho: float, m: int) -> float:
    """Blocking of M/M/1/m straight from the stationary distribution pi_n ~ rho^n, n = 0..m."""
    weights = [rho ** (n - m) for n in range(m + 1)]  # scaled by rho^-m: no overflow
    return 1.0 / math.fsum(weights)


def chain(weights: tuple[float, ...], mode: str, **extra):
    """Services a -> b -> c ... with the given routing weights, two classes, arrivals at the first two."""
    names = [chr(ord("a") + i) for i in range(len(weights) + 1)]
    routing = {names[i]: {names[i + 1]: w} for i, w in enumerate(weights)}
    raw = {"services": {s: {"capacity_per_s": 100.0, "buffer": 20} for s in names},
           "classes": {"high": {"retries": 4}, "low": {"retries": 1}},
           "arrivals": {"high": {"a": 90.0, "b": 30.0}, "low": {"a": 120.0}},
           "routing": {"high": routing, "low": routing}, "routing_mode": mode, **extra}
    return network_from_mapping(raw)


# -- rejection functions ------------------------------------------------------------------
@pytest.mark.parametrize("rho", [0.3, 0.9, 1.0, 1.2, 3.0, 10.0])
@pytest.mark.parametrize("m", [1, 5, 50])
def test_mm1m_without_retries_matches_mm1k_formula(rho, m):
    sol = solve_single_service([rho * 40.0], [0], mu=40.0, m=m, model="mm1m")
    assert sol.s_bar == pytest.approx(mm1k_blocking(rho, m), abs=1e-9)
    assert sol.end_rejection[0] == pytest.approx(mm1k_blocking(rho, m), abs=1e-9)
    assert sol.success_per_s[0] == pytest.approx(rho * 40.0 * (1 - mm1k_blocking(rho, m)), rel=1e-9)


def test_mm1m_is_stable_for_large_load_and_buffer():
    rho = np.array([0.0, 0.5, 1.0 - 1e-13, 1.0, 1.0 + 1e-13, 2.0, 10.0, 50.0])
    for m in (1, 50, 1000):
        out = phi("mm1m", rho, m)
        assert np.all(np.isfinite(out)) and np.all((out >= 0) & (out < 1))
        assert out[2:5] == pytest.approx([1 / (m + 1)] * 3, rel=1e-9)
        assert out[6] == pytest.approx(mm1k_blocking(10.0, m), rel=1e-12)  # 0.9 for large m
    assert np.all(np.diff(phi("mm1m", np.linspace(0, 12, 2001), 1000)) >= 0)


@pytest.mark.parametrize("m", [1, 10, 200])
def test_mixed_is_continuous_increasing_and_tends_to_one(m):
    rho = np.linspace(0.0, 10.0, 100_001)
    out = phi("mixed", rho, m)
    assert np.all(np.diff(out) >= 0)
    assert np.max(np.abs(np.diff(out))) < 1e-3  # no jump at rho = 1
    assert out[rho <= 1] == pytest.approx(phi("mm1m", rho[rho <= 1], m), abs=1e-15)
    assert phi("mixed", 1e6, m) == pytest.approx(1.0, abs=1e-5)
    assert phi("fluid", [0.5, 1.0, 4.0], m) == pytest.approx([0.0, 0.0, 0.75])


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match=r"^The 'model' parameter must be one of fluid, mm1m, mixed, got 'x'\.$"):
        phi("x", 1.0, 5)
    with pytest.raises(ValueError, match="'model'"):
        solve_network(load("tandem"), "erlang")


# -- one service -------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, 3, 6])
@pytest.mark.parametrize("lam", [150.0, 400.0])
def test_fluid_matches_closed_form_in_overload(k, lam):
    sol = solve_single_service({"only": lam}, {"only": k}, mu=100.0, m=50, model="fluid")
    # (1 - s) Lam = mu and (1 - s) Lam = lam (1 - s^(k+1)), so a = 1 - mu/lam and s = a^(1/(k+1))
    assert sol.end_rejection[0] == pytest.approx(1 - 100.0 / lam, rel=1e-12)
    assert sol.s_bar == pytest.approx((1 - 100.0 / lam) ** (1 / (k + 1)), rel=1e-12)
    assert sol.rho == pytest.approx(1 / (1 - sol.s_bar), rel=1e-9)


def test_larger_retry_limit_shifts_rejection_to_the_other_class():
    sol = solve_single_service({"high": 100.0, "low": 100.0}, {"high": 5, "low": 1}, mu=100.0, m=50)
    assert sol.classes == ("high", "low")
    assert sol.end_rejection[0] < 0.5 * sol.end_rejection[1]
    same = solve_single_service([100.0, 100.0], 5, mu=100.0, m=50)
    assert same.end_rejection[0] == pytest.approx(same.end_rejection[1])
    assert sol.success_per_s[0] > same.success_per_s[0]


def test_single_service_rejects_bad_input_by_name():
    with pytest.raises(ValueError, match="'lam_p'"):
        solve_single_service([-1.0], [1], mu=1.0, m=5)
    with pytest.raises(ValueError, match="'k_p'"):
        solve_single_service([1.0, 2.0], [1.5, 2], mu=1.0, m=5)
    with pytest.raises(ValueError, match="'mu'"):
        solve_single_service([1.0], [1], mu=0.0, m=5)
    with pytest.raises(ValueError, match="'alpha'"):
        solve_single_service([1.0], [1], mu=1.0, m=5, alpha=1.5)


# -- residual-time correction ------------------------------------------------------------------
def test_alpha_matches_closed_forms_and_is_continuous_in_cv():
    mu, d = 50.0, 0.1
    assert residual_alpha(mu, d, 1.0) == pytest.approx(mu * d / (1 + mu * d))
    assert residual_alpha(mu, d, 0.0) == pytest.approx(mu * d * (1 - math.exp(-1 / (mu * d))))
    for cv in (0.0, 1.0):
        assert residual_alpha(mu, d, cv + 1e-6) == pytest.approx(residual_alpha(mu, d, cv), abs=1e-5)
    assert residual_alpha(mu, d, 1 - 1e-6) == pytest.approx(residual_alpha(mu, d, 1.0), abs=1e-5)


@pytest.mark.parametrize("cv", [0.4, 0.7, 1.5, 3.0])
def test_alpha_is_the_residual_transform_at_one_over_delay(cv):
    from scipy.integrate import quad
    from scipy.stats import expon

    mu, d = 20.0, 0.2
    c2 = cv * cv
    if cv > 1:  # balanced two-phase hyperexponential
        p1 = 0.5 * (1 + math.sqrt((c2 - 1) / (c2 + 1)))
        parts = [(p1, expon(scale=1 / (2 * p1 * mu))), (1 - p1, expon(scale=1 / (2 * (1 - p1) * mu)))]
    else:  # a constant plus an exponential
        parts = [(1.0, expon(loc=(1 - cv) / mu, scale=cv / mu))]
    mean = sum(w * dist.mean() for w, dist in parts)
    var = sum(w * (dist.var() + dist.mean() ** 2) for w, dist in parts) - mean**2
    assert mean == pytest.approx(1 / mu) and math.sqrt(var) * mu == pytest.approx(cv)
    # P(R < D) = E[exp(-R/d)], R with density P(S > r) / E[S]
    value, _ = quad(lambda r: math.exp(-r / d) * sum(w * dist.sf(r) for w, dist in parts) / mean, 0, np.inf)
    assert residual_alpha(mu, d, cv) == pytest.approx(value, rel=1e-6)


def test_alpha_one_means_independent_attempts():
    plain = solve_single_service([80.0, 90.0], [5, 1], mu=100.0, m=10, model="mm1m")
    corrected = solve_single_service([80.0, 90.0], [5, 1], mu=100.0, m=10, model="mm1m", alpha=1.0)
    assert corrected.end_rejection == pytest.approx(plain.end_rejection, rel=1e-12)
    assert corrected.attempts_per_s == pytest.approx(plain.attempts_per_s, rel=1e-12)


def test_correlated_retries_can_lower_class_success():
    """A counter-example to §VI.G once the residual correction is on (reported, not a bug).

    With alpha < 1 a retry mostly meets the job that blocked it, so extra retries add load
    but little success: one overloaded class loses throughput as k grows.
    """
    success = [solve_single_service([150.0], [k], mu=100.0, m=50, model="fluid", alpha=0.5).success_per_s[0]
               for k in range(4)]
    assert all(b < a for a, b in zip(success, success[1:], strict=False))
    plain = [solve_single_service([150.0], [k], mu=100.0, m=50, model="fluid").success_per_s[0] for k in range(4)]
    assert plain == pytest.approx([100.0] * 4)


# -- networks ---------------------------------------------------------------------------------
def check_fixed_point(sol, spec, model, tol=1e-8):
    """s = phi(rho) at every service and lam = gamma + sum_j F_p[j, i] lam (1 - a)."""
    assert sol.converged
    for arr in (sol.attempt_rejection, sol.final_rejection, sol.completion, sol.class_completion):
        assert np.all((arr >= 0) & (arr <= 1))
    assert sol.attempt_rejection == pytest.approx(phi(model, sol.utilisation, spec.buffer), abs=1e-9)
    for p, klass in enumerate(spec.classes):
        flow = spec.external(klass) + sol.accepted[p] @ spec.routing_matrix(klass)
        assert sol.offered[p] == pytest.approx(flow, rel=tol, abs=tol)


@pytest.mark.parametrize("name", ["tandem", "hotel"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("rho", [0.5, 1.0, 2.0, 10.0])
def test_fixed_point_is_found_up_to_rho_10(name, model, rho):
    spec = at_rho(load(name), rho)
    for kwargs in ({}, {"method": "iterate"}, {"residual": True}):
        sol = solve_network(spec, model, **kwargs)
        assert sol.offered_rho == pytest.approx(rho)
        check_fixed_point(sol, spec, model)
    if rho >= 2:
        high, low = spec.classes.index("high"), spec.classes.index("low")
        assert sol.class_completion[high] > sol.class_completion[low]


def test_dag_result_does_not_depend_on_topological_order():
    spec = at_rho(load("hotel"), 3.0)
    shuffled = dict(zip(range(8), np.random.default_rng(0).permutation(8).tolist(), strict=True))
    orders = {tuple(spec.topological_order(key=key)) for key in (None, lambda i: -i, shuffled.__getitem__)}
    assert len(orders) == 3
    base = solve_network(spec, residual=True)
    for key in (lambda i: -i, shuffled.__getitem__):
        other = solve_network(spec, residual=True, order_key=key)
        for field in ("offered", "attempts", "final_rejection", "attempt_rejection", "completion"):
            np.testing.assert_allclose(getattr(other, field), getattr(base, field), rtol=0, atol=1e-12)
        for name, (klass, prob) in base.requests.items():
            assert other.requests[name][0] == klass and other.requests[name][1] == pytest.approx(prob, abs=1e-12)


def test_iteration_agrees_with_topological_pass_on_a_dag():
    spec = at_rho(load("hotel"), 4.0)
    one_pass, iterated = solve_network(spec, "mm1m"), solve_network(spec, "mm1m", method="iterate")
    assert one_pass.iterations == 1 and iterated.iterations > 1
    np.testing.assert_allclose(iterated.offered, one_pass.offered, rtol=1e-10)
    np.testing.assert_allclose(iterated.completion, one_pass.completion, rtol=1e-10)


def test_cyclic_network_converges_and_matches_dag_when_cycle_weight_vanishes():
    raw = at_rho(load("tandem"), 3.0).to_mapping()
    dag = network_from_mapping(raw)
    for klass in raw["routing"]:
        raw["routing"][klass]["backend"] = {"frontend": 1e-12}
    cyclic = network_from_mapping(raw)
    assert not cyclic.is_dag()
    for model in MODELS:
        a, b = solve_network(dag, model), solve_network(cyclic, model)
        assert b.converged and b.iterations > 1
        np.testing.assert_allclose(b.offered, a.offered, rtol=1e-9)
        np.testing.assert_allclose(b.class_completion, a.class_completion, rtol=1e-9)


@pytest.mark.parametrize("model", MODELS)
def test_cyclic_hotel_converges_at_rho_10(model):
    raw = load("hotel").to_mapping()
    for klass in raw["routing"]:
        raw["routing"][klass]["profile"] = {"search": 0.3}
        raw["routing"][klass]["geo"] = {"frontend": 0.2}
    spec = at_rho(network_from_mapping(raw), 10.0)
    check_fixed_point(solve_network(spec, model), spec, model)
    assert solve_network(spec, model, residual=True).converged


def test_uniqueness_report_names_the_condition_that_holds():
    assert uniqueness_report(load("tandem"))["dag"] and uniqueness_report(load("tandem"))["guaranteed"]

    def ring(ab, ba, n_classes, same=True):
        routing = {f"c{p}": {"a": {"b": ab}, "b": {"a": ba if same or p == 0 else ba / 2}} for p in range(n_classes)}
        return network_from_mapping({
            "services": {"a": {"capacity_per_s": 10, "buffer": 5}, "b": {"capacity_per_s": 10, "buffer": 5}},
            "classes": {f"c{p}": {"retries": 1} for p in range(n_classes)},
            "arrivals": {"c0": {"a": 5}}, "routing": routing})

    report = uniqueness_report(ring(1.5, 0.5, 2))  # ||F||_inf = 1.5, spectral radius 0.87
    assert not report["dag"] and not report["norm_condition"] and report["class_independent_P_le_2"]
    assert report["guaranteed"]
    for report in (uniqueness_report(ring(0.6, 0.6, 3)), uniqueness_report(ring(1.5, 0.5, 2, same=False))):
        assert not (report["norm_condition"] or report["class_independent_P_le_2"] or report["guaranteed"])
        assert "not proven" in report["note"]
    assert uniqueness_report(ring(0.4, 0.4, 3))["norm_condition"]  # < 1/(P-1) = 0.5
    assert uniqueness_report(ring(0.6, 0.6, 2, same=False))["norm_condition"]  # < 1 for P = 2
    assert uniqueness_report(ring(1.5, 0.5, 1))["norm_condition"]  # always for one class


def test_exclusive_completion_matches_path_enumeration():
    spec = at_rho(chain((0.7, 0.4), "exclusive"), 2.5)
    sol = solve_network(spec, "mixed")
    for p, klass in enumerate(spec.classes):
        sa, sb, sc = 1 - sol.final_rejection[p]
        # paths from a: a | a b | a b c, with the chance of each route
        from_a = 0.3 * sa + 0.7 * 0.6 * sa * sb + 0.7 * 0.4 * sa * sb * sc
        from_b = 0.6 * sb + 0.4 * sb * sc
        assert sol.completion[p, :2] == pytest.approx([from_a, from_b], rel=1e-12)
        gamma = spec.external(klass)
        expected = (gamma[0] * from_a + gamma[1] * from_b) / gamma.sum()
        assert sol.class_completion[p] == pytest.approx(expected, rel=1e-12)


def test_independent_fan_out_needs_every_call_to_complete():
    spec = at_rho(chain((2.0, 1.5), "independent"), 2.0)
    sol = solve_network(spec, "mm1m")
    sa, sb, sc = 1 - sol.final_rejection[0]
    c_b = sb * sc * (0.5 + 0.5 * sc)  # one call to c, plus a second with probability 0.5
    assert sol.completion[0] == pytest.approx([sa * c_b**2, c_b, sc], rel=1e-12)


def test_fan_out_completion_can_fall_when_retries_rise():
    """Independent fan-out: completion is not monotone in k (Gamma is); reported, not a bug.

    More frontend successes of ``high`` mean more calls to an overloaded backend,
    and a request needs both of its calls to succeed there.
    """
    spec = network_from_mapping({
        "services": {"frontend": {"capacity_per_s": 100, "buffer": 50},
                     "backend": {"capacity_per_s": 60, "buffer": 50}},
        "classes": {"high": {"retries": 0}, "low": {"retries": 0}},
        "arrivals": {"high": {"frontend": 50}, "low": {"frontend": 200}},
        "routing": {"high": {"frontend": {"backend": 2.0}}}})
    sols = [solve_network(spec.with_retries({"high": k}), "fluid") for k in range(4)]
    completion = [s.class_completion[0] for s in sols]
    success = [s.class_success_per_s[0] for s in sols]
    assert completion[2] < completion[1] and completion[3] < completion[2]
    assert all(b > a for a, b in zip(success, success[1:], strict=False))


def test_request_paths_multiply_hop_success_and_json_has_the_documented_shape():
    spec = at_rho(load("hotel"), 2.0)
    sol = solve_network(spec, residual=True)
    sigma = 1 - sol.final_rejection[0]
    idx = [spec.index(s) for s in ("frontend", "recommendation", "profile")]
    assert sol.requests["recommend"] == ("high", pytest.approx(float(np.prod(sigma[idx]))))
    out = json.loads(json.dumps(sol.to_json()))
    assert set(out) == {"model", "classes", "services", "utilisation", "requests", "converged", "iterations",
                        "uniqueness", "offered_rho"}
    assert set(out["classes"]["high"]) == {"completion_probability", "end_to_end_rejection", "success_per_s",
                                           "calls_succeeded_per_s"}
    assert set(out["services"]["frontend"]["low"]) == {"offered_per_s", "attempts_per_s", "accepted_per_s",
                                                       "attempt_rejection", "final_rejection"}
    assert out["requests"]["search"]["class"] == "high"
    assert set(out["uniqueness"]) == {"dag", "norm_condition", "class_independent_P_le_2", "guaranteed", "note"}
    assert out["offered_rho"] == pytest.approx(2.0)


def test_class_without_arrivals_reports_null_completion():
    raw = load("tandem").to_mapping()
    raw["arrivals"]["low"] = {}
    out = solve_network(network_from_mapping(raw)).to_json()
    assert out["classes"]["low"]["completion_probability"] is None


def test_network_errors_name_the_parameter():
    tandem = load("tandem")
    raw = tandem.to_mapping()
    raw["routing"]["high"]["backend"] = {"frontend": 0.1}
    with pytest.raises(NetworkError, match="topological"):
        solve_network(network_from_mapping(raw), method="topological")
    with pytest.raises(ValueError, match="'alpha'.*'nowhere'"):
        solve_network(tandem, alpha={"nowhere": 0.5})
    with pytest.raises(ValueError, match="'alpha'"):
        solve_network(tandem, alpha=-0.1)
    with pytest.raises(ValueError, match="'method'"):
        solve_network(tandem, method="newton")
    with pytest.raises(ValueError, match="'tol'"):
        solve_network(tandem, tol=0)


def test_iteration_cap_is_reported_not_raised():
    raw = at_rho(load("tandem"), 5.0).to_mapping()
    for klass in raw["routing"]:
        raw["routing"][klass]["backend"] = {"frontend": 0.5}
    sol = solve_network(network_from_mapping(raw), max_iter=2)
    assert not sol.converged and sol.iterations == 2


# -- properties on small random networks (§VI.G) ------------------------------------------------
@st.composite
def networks(draw, modes=("independent", "exclusive")):
    n = draw(st.integers(2, 5))
    n_classes = draw(st.integers(1, 3))
    mode = draw(st.sampled_from(modes))
    cyclic = draw(st.booleans())
    names = [f"s{i}" for i in range(n)]
    classes = [f"c{p}" for p in range(n_classes)]
    routing = {}
    for klass in classes:
        F = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                if i != j and (j > i or cyclic) and draw(st.booleans()):
                    F[i, j] = draw(st.floats(0.05, 1.8 if mode == "independent" and j > i else 0.8))
        if mode == "exclusive":
            F *= np.minimum(1.0, 0.95 / np.maximum(F.sum(axis=1), 1e-12))[:, None]
        radius = float(np.max(np.abs(np.linalg.eigvals(F))))
        F *= min(1.0, 0.9 / radius) if radius > 0 else 1.0
        routing[klass] = {names[i]: {names[j]: float(F[i, j]) for j in np.flatnonzero(F[i])} for i in range(n)}
    rate = st.floats(1.0, 300.0)
    spec = network_from_mapping({
        "services": {s: {"capacity_per_s": draw(st.floats(20.0, 200.0)), "buffer": draw(st.integers(1, 60)),
                         "service_cv": draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]))} for s in names},
        "classes": {c: {"retries": {s: draw(st.integers(0, 6)) for s in names}} for c in classes},
        "arrivals": {c: {names[0]: draw(rate), **({names[1]: draw(rate)} if draw(st.booleans()) else {})}
                     for c in classes},
        "routing": routing, "routing_mode": mode})
    return spec


PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def raise_retries(spec, data):
    p = data.draw(st.integers(0, len(spec.classes) - 1))
    klass, extra = spec.classes[p], data.draw(st.integers(1, 3))
    return p, spec.with_retries({klass: {s: k + extra for s, k in spec.retries[klass].items()}})


@PROPERTY
@given(spec=networks(), model=st.sampled_from(MODELS), data=st.data())
def test_raising_retries_never_lowers_class_success(spec, model, data):
    p, more = raise_retries(spec, data)
    before, after = solve_network(spec, model), solve_network(more, model)
    assert before.converged and after.converged
    assert after.class_success_per_s[p] >= before.class_success_per_s[p] * (1 - 1e-9) - 1e-9


@PROPERTY
@given(spec=networks(modes=("exclusive",)), model=st.sampled_from(MODELS), data=st.data())
def test_raising_retries_never_lowers_exclusive_completion(spec, model, data):
    p, more = raise_retries(spec, data)
    before, after = solve_network(spec, model), solve_network(more, model)
    assert after.class_completion[p] >= before.class_completion[p] - 1e-9


@PROPERTY
@given(spec=networks(), model=st.sampled_from(MODELS), residual=st.booleans())
def test_rejections_and_probabilities_lie_in_unit_interval(spec, model, residual):
    sol = solve_network(spec, model, residual=residual)
    assert sol.converged
    for arr in (sol.attempt_rejection, sol.final_rejection, sol.completion, sol.class_completion):
        assert np.all((arr >= 0) & (arr <= 1))
    assert np.all(sol.attempts >= sol.offered * (1 - 1e-12)) and np.all(sol.accepted <= sol.offered)
