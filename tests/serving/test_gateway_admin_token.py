"""The gateway's admin API with authentication off: only the holder of the admin token, only allowed addresses."""

from __future__ import annotations

import os
import stat

import pytest

from sloctl.serving.gateway.auth import (
    ADMIN_TOKEN_FILE,
    ADMIN_TOKEN_HEADER,
    AuthError,
    admin_token,
    allowed_origins,
    check_backend_url,
    read_admin_token,
    url_origin,
)

USER = {"X-Trino-User": "someone"}
ROUTES = [("GET", "/v1/gateway/backends", None),
          ("POST", "/v1/gateway/backends", {"name": "mine", "kind": "trino", "url": "http://127.0.0.1:9"}),
          ("POST", "/v1/gateway/backends/c0/drain", None),
          ("DELETE", "/v1/gateway/backends/c0", None)]


@pytest.fixture(scope="module")
def served(tpch_db, tmp_path_factory):
    """A one-cluster DuckDB gateway (no backends file) on loopback, authentication off; its log folder."""
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    log_dir = tmp_path_factory.mktemp("admin-token-logs")
    gateway = Gateway(tpch_db, GatewayOptions(cluster_sizes=(1,), router="least-queued", log_dir=log_dir,
                                              scratch_memory_limit=None)).start()
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, client, log_dir
    finally:
        gateway.close()


def test_every_backends_route_refuses_a_caller_without_the_token_and_changes_nothing(served):
    gateway, client, log_dir = served
    token = admin_token(log_dir)
    before = client.get("/v1/gateway/backends", headers={**USER, **token.headers()}).json()
    for method, path, body in ROUTES:
        missing = client.request(method, path, json=body, headers=USER)
        assert missing.status_code == 401, (method, path, missing.text)
        assert missing.json()["field"] == ADMIN_TOKEN_HEADER.lower()
        said = missing.json()["error"]
        assert ADMIN_TOKEN_HEADER in said and str(log_dir / ADMIN_TOKEN_FILE) in said
        forged = {**USER, ADMIN_TOKEN_HEADER: token.value[:-1] + ("y" if token.value.endswith("x") else "x")}
        wrong = client.request(method, path, json=body, headers=forged)
        assert wrong.status_code == 403, (method, path, wrong.text)
        bearer = {**USER, "Authorization": f"Bearer {token.value}"}
        trino_style = client.request(method, path, json=body, headers=bearer)
        assert trino_style.status_code == 401  # the token travels in its own header only
    after = client.get("/v1/gateway/backends", headers={**USER, **token.headers()}).json()
    assert [(b["name"], b["state"]) for b in after] == [(b["name"], b["state"]) for b in before]
    assert gateway.backend_state.get("c0", "active") == "active" and "mine" not in gateway.backends


def test_the_read_views_stay_open_to_local_users_with_authentication_off(served):
    _, client, _ = served
    assert client.get("/v1/gateway", headers=USER).status_code == 200
    assert client.get("/metrics", headers=USER).status_code == 200


def test_the_token_opens_the_backends_routes(served, wait_until):
    gateway, client, log_dir = served
    admin = {**USER, **admin_token(log_dir).headers()}
    assert {b["name"] for b in client.get("/v1/gateway/backends", headers=admin).json()} == {"c0"}
    added = client.post("/v1/gateway/backends", headers=admin, json={"name": "extra", "kind": "duckdb"})
    assert added.status_code == 200, added.text
    assert client.post("/v1/gateway/backends/extra/drain", headers=admin).json()["state"] in ("draining", "drained")
    assert client.delete("/v1/gateway/backends/extra", headers=admin).status_code == 200
    wait_until(lambda: "extra" not in gateway.backends, "the added backend to be forgotten", 20)
    assert client.post("/v1/gateway/backends/nope/drain", headers=admin).status_code == 404


def test_a_backend_address_outside_the_allow_list_is_refused(served):
    gateway, client, log_dir = served
    admin = {**USER, **admin_token(log_dir).headers()}
    for url in ("http://127.0.0.1:9", "postgresql://u:secret@127.0.0.1:5432/tpch"):
        kind = "trino" if url.startswith("http") else "postgresql"
        refused = client.post("/v1/gateway/backends", headers=admin, json={"name": "stranger", "kind": kind,
                                                                          "url": url})
        assert refused.status_code == 403, refused.text
        assert refused.json()["field"] == "url" and "allow-list" in refused.json()["error"]
        assert "secret" not in refused.json()["error"]
    assert "stranger" not in gateway.backends


def test_the_token_file_is_readable_by_its_owner_only_and_a_restart_renews_it(tmp_path):
    first = admin_token(tmp_path)
    assert first.path == tmp_path / ADMIN_TOKEN_FILE and len(first.value) >= 40
    assert stat.S_IMODE(os.stat(first.path).st_mode) == 0o600
    assert read_admin_token(first.path) == first.value and admin_token(tmp_path) == first
    again = admin_token(tmp_path, renew=True)
    assert again.value != first.value and read_admin_token(again.path) == again.value
    assert stat.S_IMODE(os.stat(again.path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [ADMIN_TOKEN_FILE]  # no temporary file left behind
    assert again.matches(again.value) and not again.matches(first.value) and not again.matches(None)


def test_without_a_log_folder_the_token_lives_in_a_private_temporary_folder():
    token = admin_token(None)
    assert token.path.name == ADMIN_TOKEN_FILE
    assert stat.S_IMODE(os.stat(token.path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(token.path).st_mode) == 0o600


def test_a_missing_token_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="cannot read the gateway's admin token from .*missing"):
        read_admin_token(tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="does not hold an admin token"):
        read_admin_token(tmp_path / "empty")


def test_backend_addresses_match_by_scheme_host_and_port_not_by_prefix():
    assert url_origin("http://Coordinator.Example:80/") == ("http", "coordinator.example", 80)
    assert url_origin("https://c.example") == ("https", "c.example", 443)
    assert url_origin("postgres://u:p@db.example/tpch") == ("postgresql", "db.example", 5432)
    allowed = ["http://trino.example:8080", "postgresql://db.example:5432/tpch"]
    check_backend_url("http://TRINO.example:8080/", allowed)
    check_backend_url("postgresql://reader:pw@db.example/other_db", allowed)
    check_backend_url(None, [])  # a duckdb backend: the gateway's own worker
    for stranger in ("http://trino.example:8081", "https://trino.example:8080", "http://trino.example:8080.evil.io",
                     "http://trino.example:8080@evil.io", "http://evil.io/trino.example:8080",
                     "postgresql://db.example:5433/tpch", "ftp://trino.example:8080"):
        with pytest.raises(AuthError) as refused:
            check_backend_url(stranger, allowed)
        assert refused.value.status == 403 and refused.value.field == "url"
    with pytest.raises(AuthError, match="empty: only duckdb backends"):
        check_backend_url("http://trino.example:8080", [])


def test_a_bad_allow_list_entry_is_named():
    with pytest.raises(ValueError, match=r"'allowed_urls\[1\]'"):
        allowed_origins(["http://a:1", "mysql://b"])
    with pytest.raises(ValueError, match="'allowed_urls' field must be a list"):
        allowed_origins("http://a:1")


def test_the_backends_file_reads_its_allow_list(tmp_path):
    import typer

    from sloctl._cli_gateway import backends_file

    path = tmp_path / "backends.yaml"
    path.write_text("backends:\n  - {name: t1, kind: trino, url: 'http://127.0.0.1:8080'}\n"
                    "allowed_urls: ['http://127.0.0.1:8080', 'http://127.0.0.1:8090']\n")
    specs, allowed = backends_file(path)
    assert [s.name for s in specs] == ["t1"] and allowed == ("http://127.0.0.1:8080", "http://127.0.0.1:8090")
    path.write_text("backends:\n  - {name: t1, kind: trino, url: 'http://127.0.0.1:8080'}\n")
    assert backends_file(path)[1] is None  # the gateway then allows the file's own URLs
    path.write_text("backends:\n  - {name: t1, kind: duckdb}\nallowed_urls: ['gopher://x']\n")
    with pytest.raises(typer.BadParameter, match=r"allowed_urls\[0\]"):
        backends_file(path)


def test_the_cli_sends_the_token_of_the_log_folder_and_fails_in_one_line_without_it(served, run_sloctl, tmp_path):
    import json

    _, client, log_dir = served
    url = str(client.base_url).rstrip("/")
    listed = run_sloctl("gateway", "backends", "list", "--url", url, "--log-dir", log_dir, "--json", timeout_s=120)
    assert listed.returncode == 0, listed.stderr
    assert "c0" in {b["name"] for b in json.loads(listed.stdout)}
    by_file = run_sloctl("gateway", "backends", "list", "--url", url, "--admin-token-file", log_dir / ADMIN_TOKEN_FILE,
                         "--log-dir", tmp_path, timeout_s=120)
    assert by_file.returncode == 0, by_file.stderr
    by_env = run_sloctl("gateway", "backends", "list", "--url", url, "--log-dir", tmp_path, timeout_s=120,
                        env={"SLOCTL_GATEWAY_ADMIN_TOKEN": admin_token(log_dir).value})
    assert by_env.returncode == 0, by_env.stderr
    missing = run_sloctl("gateway", "backends", "drain", "c0", "--url", url, "--log-dir", tmp_path, timeout_s=120)
    assert missing.returncode == 2 and missing.stderr.startswith("error:") and "admin.token" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    wrong = run_sloctl("gateway", "backends", "drain", "c0", "--url", url, "--log-dir", tmp_path, timeout_s=120,
                       env={"SLOCTL_GATEWAY_ADMIN_TOKEN": "not-the-token"})
    assert wrong.returncode == 2 and "403" in wrong.stderr
    assert client.get("/v1/gateway/backends", headers={**USER, **admin_token(log_dir).headers()}).json()[0][
        "state"] == "active"
