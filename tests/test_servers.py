"""The PostgreSQL and Redis servers that tests start for real (tests/servers.py, issue 20)."""

from __future__ import annotations


def test_postgres_server_answers_on_loopback_and_gives_each_test_its_database(postgres_server):
    import psycopg

    assert postgres_server.host == "127.0.0.1"
    url = postgres_server.create_database("servers_smoke")
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        conn.commit()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT v FROM t ORDER BY k").fetchall() == [("a",), ("b",)]
    # created again: empty
    with psycopg.connect(postgres_server.create_database("servers_smoke")) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename = 't'").fetchone() == (0,)


def test_redis_server_answers_on_loopback_without_persistence(redis_server):
    client = redis_server.client()
    assert redis_server.url.startswith("redis://127.0.0.1:")
    client.set("servers:k", "v")
    assert client.get("servers:k") == b"v"
    config = client.config_get("save") | client.config_get("appendonly")
    assert config == {"save": "", "appendonly": "no"}
    assert client.config_get("bind")["bind"] == "127.0.0.1"
