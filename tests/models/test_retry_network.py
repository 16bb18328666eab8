"""The network file: what it means and how a bad one is refused."""

from __future__ import annotations

import copy

import pytest

from sloctl.models.retry_network import NetworkError, load_network, network_from_mapping

BASE = {
    "services": {"frontend": {"capacity_per_s": 100, "buffer": 50}, "search": {"capacity_per_s": 120, "buffer": 50}},
    "classes": {"high": {"retries": 5}, "low": {"retries": {"frontend": 1, "search": 2}}},
    "arrivals": {"high": {"frontend": 50}, "low": {"frontend": 100}},
    "routing": {"high": {"frontend": {"search": 0.6}}, "low": {"frontend": {"search": 0.6}}},
}


def _with(path: list[str], value):
    raw = copy.deepcopy(BASE)
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


def test_example_networks_load_and_round_trip():
    for name in ("tandem", "hotel"):
        spec = load_network(f"configs/networks/{name}.yaml")
        again = network_from_mapping(spec.to_mapping())
        assert again == spec
    spec = network_from_mapping(BASE)
    assert spec.retry_vector("high").tolist() == [5, 5]
    assert spec.retry_vector("low").tolist() == [1, 2]
    assert spec.routing_matrix("high")[0, 1] == 0.6
    assert spec.is_dag()


@pytest.mark.parametrize(("path", "value", "message"), [
    (["routing", "high", "frontend"], {"serach": 0.6}, "unknown service 'serach'"),
    (["arrivals", "low", "frontend"], -5, r"arrivals.low.frontend must be a rate >= 0"),
    (["services", "search", "buffer"], 0, r"services.search.buffer must be a whole number >= 1"),
    (["services", "search", "capacity_per_s"], "fast", r"capacity_per_s must be a positive number"),
    (["classes", "high", "retries"], -1, r"classes.high.retries must be a whole number >= 0"),
    (["classes", "low", "retries"], {"frontend": 1}, "no retry limit for service 'search'"),
    (["arrivals", "medium"], {"frontend": 1}, "unknown class 'medium'"),
    (["routing_mode"], "random", "routing_mode must be 'independent' or 'exclusive'"),
    (["retry_delay_s"], 0, "retry_delay_s must be a positive number"),
    (["extra"], 1, "unknown key 'extra'"),
])
def test_malformed_network_is_refused_with_its_field_named(path, value, message):
    with pytest.raises(NetworkError, match=message):
        network_from_mapping(_with(path, value), source="net.yaml")


def test_routing_weights_giving_a_divergent_flow_are_refused():
    raw = _with(["routing", "low"], {"frontend": {"search": 1.0}, "search": {"frontend": 1.2}})
    with pytest.raises(NetworkError, match=r"routing.low: the routing weights give a divergent flow"):
        network_from_mapping(raw)
    raw["routing"]["low"]["search"]["frontend"] = 0.5
    assert not network_from_mapping(raw).is_dag()


def test_exclusive_routing_rows_may_not_exceed_one():
    raw = _with(["routing", "high", "frontend"], {"search": 0.7, "frontend": 0.0})
    raw["routing_mode"] = "exclusive"
    network_from_mapping(raw)
    raw["routing"]["high"]["frontend"] = {"search": 1.5}
    with pytest.raises(NetworkError, match="sum to 1.5 > 1"):
        network_from_mapping(raw)


def test_missing_file_and_bad_yaml_are_named(tmp_path):
    with pytest.raises(NetworkError, match="network file not found"):
        load_network(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("services: [\n")
    with pytest.raises(NetworkError, match="not valid YAML"):
        load_network(bad)


def test_with_retries_and_scale_arrivals_leave_the_original_alone():
    spec = network_from_mapping(BASE)
    more = spec.with_retries({"low": 4}).scale_arrivals({"low": 2.0})
    assert more.retry_vector("low").tolist() == [4, 4]
    assert more.external("low")[0] == 200.0
    assert spec.retry_vector("low").tolist() == [1, 2] and spec.external("low")[0] == 100.0
    with pytest.raises(NetworkError, match="unknown class 'mid'"):
        spec.with_retries({"mid": 1})
