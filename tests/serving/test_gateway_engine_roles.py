"""Least-privilege engines (issue 51): the gateway refuses a PostgreSQL role that holds too much, at start and on
``backends add``, and a plain reader cannot reach outside its query through the gateway.

One PostgreSQL server (the session's ``postgres_server``, whose ``postgres``
superuser only creates the roles) holds a served table and one the reader is
not granted; the roles are a reader made by ``create_reader_role``, the same
plus ``pg_signal_backend``, and the superuser itself.
"""

from __future__ import annotations

import pytest

from sloctl.core.errors import ClusterPoolError

pytest.importorskip("psycopg")
trino = pytest.importorskip("trino")


@pytest.fixture(scope="module")
def shop(postgres_server):
    """``{"admin", "reader", "signaller"}``: URLs of one database as each role."""
    import psycopg

    from sloctl.datasets.pg_roles import create_reader_role

    admin = postgres_server.create_database("engine_roles")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int, name text)")
        conn.execute("INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 40) i")
        conn.execute("CREATE TABLE payroll (who text, salary int)")
        conn.execute("INSERT INTO payroll VALUES ('ceo', 1000000)")
    reader = create_reader_role(admin, "er_reader", "reader-secret", ["items"])
    signaller = create_reader_role(admin, "er_signaller", "signal-secret", ["items"])
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("GRANT pg_signal_backend TO er_signaller")
    return {"admin": admin, "reader": reader, "signaller": signaller}


def _gateway(tpch_db, tmp_path, url, name="pg1", **options):
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.backends import BackendSpec

    spec = BackendSpec(name, "postgresql", 1, url, options={"pool_connections": 3, **options})
    return Gateway(tpch_db, GatewayOptions(backends=(spec,), router="random", scratch_memory_limit=None,
                                           log_dir=tmp_path, health_interval_s=0.3))


@pytest.fixture(scope="module")
def reader_gateway(shop, tpch_db, tmp_path_factory):
    """A gateway on the reader role, served on loopback: ``(gateway, client, log_dir)``."""
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    log_dir = tmp_path_factory.mktemp("engine-roles")
    gateway = _gateway(tpch_db, log_dir, shop["reader"]).start()
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, client, log_dir
    finally:
        gateway.close()


def _cursor(client, user):
    return trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), user=user).cursor()


def _fails(client, sql, user="mallory"):
    cur = _cursor(client, user)
    with pytest.raises(trino.exceptions.TrinoQueryError) as caught:
        cur.execute(sql)
        cur.fetchall()
    return caught.value


def _admin_headers(log_dir):
    from sloctl.serving.gateway.auth import admin_token

    return admin_token(log_dir).headers()


@pytest.mark.parametrize(("role", "revoke"), [("admin", "ALTER ROLE postgres NOSUPERUSER;"),
                                              ("signaller", "REVOKE pg_signal_backend FROM er_signaller;")])
def test_a_privileged_role_stops_the_gateway_at_start_naming_role_backend_and_revoke(shop, tpch_db, tmp_path, role,
                                                                                     revoke):
    gateway = _gateway(tpch_db, tmp_path, shop[role], name="risky")
    with pytest.raises(ClusterPoolError) as caught:
        gateway.start()
    message = str(caught.value)
    who = "postgres" if role == "admin" else "er_signaller"
    assert f"role {who!r}" in message and "Backend 'risky'" in message and revoke in message


def test_the_cli_exits_2_with_one_line_naming_the_revoke(shop, tpch_db, tmp_path, run_sloctl):
    backends = tmp_path / "backends.yaml"
    backends.write_text(f"backends:\n  - {{name: pgs, kind: postgresql, url: '{shop['signaller']}'}}\n")
    proc = run_sloctl("gateway", "--db", tpch_db, "--backends", backends, "--port", "1",
                      "--log-dir", tmp_path / "logs", timeout_s=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error:"), proc.stderr[-2000:]
    assert "er_signaller" in proc.stderr and "REVOKE pg_signal_backend FROM er_signaller;" in proc.stderr


def test_backends_add_refuses_a_privileged_role_with_a_400_and_the_override_lets_it_in_loudly(reader_gateway, shop,
                                                                                              capfd, wait_until):
    gateway, client, log_dir = reader_gateway
    headers = _admin_headers(log_dir)
    refused = client.post("/v1/gateway/backends", headers=headers,
                          json={"name": "sig", "kind": "postgresql", "url": shop["signaller"]})
    assert refused.status_code == 400, refused.text
    assert "er_signaller" in refused.text and "REVOKE pg_signal_backend FROM er_signaller;" in refused.text
    assert "sig" not in gateway.backends
    capfd.readouterr()
    allowed = client.post("/v1/gateway/backends", headers=headers,
                          json={"name": "sig", "kind": "postgresql", "url": shop["signaller"], "group": "ops",
                                "options": {"allow_privileged_role": True}})
    assert allowed.status_code == 200, allowed.text
    err = capfd.readouterr().err
    assert "warning: backend 'sig': allow_privileged_role is on" in err and "pg_signal_backend" in err
    view = next(b for b in client.get("/v1/gateway/backends", headers=headers).json() if b["name"] == "sig")
    assert any("allow_privileged_role" in w for w in view["warnings"])
    wait_until(lambda: (gateway.backend_health.get("sig") or {}).get("role", {}).get("allowed"),
               "the health view to show the overridden role check", 10)
    assert client.delete("/v1/gateway/backends/sig", headers=headers).status_code == 200


def test_a_reader_cannot_read_host_files_or_end_other_sessions_and_the_next_user_is_served(reader_gateway):
    _, client, _ = reader_gateway
    for sql, function in (("SELECT pg_read_file('/etc/hostname')", "pg_read_file"),
                          ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity", "pg_terminate_backend"),
                          ("SELECT pg_catalog.pg_cancel_backend(pid) FROM pg_stat_activity", "pg_cancel_backend")):
        err = _fails(client, sql)
        assert err.error_name == "PERMISSION_DENIED" and f"function {function} is not allowed" in err.message
    err = _fails(client, "SELECT pid, query FROM pg_stat_activity")  # the other users' query text
    assert err.error_name == "PERMISSION_DENIED" and "relation pg_stat_activity is not allowed" in err.message
    cur = _cursor(client, "alice")
    cur.execute("SELECT count(*) FROM items")
    assert cur.fetchall() == [[40]]


def test_a_reader_sees_only_its_granted_tables_and_errors_keep_their_postgresql_class(reader_gateway):
    _, client, _ = reader_gateway
    err = _fails(client, "SELECT * FROM payroll")
    assert err.error_name == "PERMISSION_DENIED" and "payroll" in err.message and "42501" in err.message
    assert _fails(client, "SELECT nope FROM items").error_name == "COLUMN_NOT_FOUND"
    assert _fails(client, "SELECT * FROM no_such_table").error_name == "TABLE_NOT_FOUND"
    cur = _cursor(client, "alice")
    cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1")
    assert cur.fetchall() == [["items"]]  # the schema survives translation; PostgreSQL hides what is not granted


def test_the_backends_view_shows_a_clean_role_check(reader_gateway, wait_until):
    gateway, client, log_dir = reader_gateway
    role = wait_until(lambda: (gateway.backend_health.get("pg1") or {}).get("role"), "a health round", 10)
    assert role == {"role": "er_reader", "held": [], "revoke": [], "warnings": [], "allowed": False}
    view = next(b for b in client.get("/v1/gateway/backends", headers=_admin_headers(log_dir)).json()
                if b["name"] == "pg1")
    assert "warnings" not in view


def test_a_trino_backend_warns_once_that_its_coordinators_access_control_decides():
    from sloctl.serving.gateway.backends import BackendSpec, engine_pool

    lines: list[str] = []
    spec = BackendSpec("t1", "trino", 1, "http://127.0.0.1:1")
    engine_pool(spec, warn=lines.append).close()
    assert len(lines) == 1 and "t1" in lines[0] and "access control" in lines[0] and "X-Trino-User" in lines[0]
    assert spec.public()["warnings"] == lines


@pytest.mark.parametrize("relation", ["pg_stat_activity", "pg_catalog.pg_stat_activity", "PG_LOCKS"])
def test_views_of_other_sessions_are_refused_on_postgresql(relation):
    """Every gateway user shares the backend's role: its views of other sessions would show their query text."""
    from sloctl.serving.gateway.backends import postgres_text
    from sloctl.serving.gateway.denylist import DENIED_RELATIONS

    assert {"pg_stat_activity", "pg_locks", "pg_stat_statements"} <= set(DENIED_RELATIONS)
    with pytest.raises(ValueError, match=r"Access Denied: relation pg_(stat_activity|locks) "):
        postgres_text(f"SELECT * FROM {relation}")
    assert postgres_text("SELECT count(*) FROM items").startswith("SELECT")
