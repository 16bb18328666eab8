"""The gateway's query history keeps queries and attempts across restarts, in SQLite and PostgreSQL."""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta

import pytest

from sloctl.serving.gateway.history import MAX_SQL_CHARS, QueryHistory, format_history

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _submitted(qid: str, *, user: str = "alice", klass: str = "interactive", at: datetime = T0, **extra) -> dict:
    return {"query_id": qid, "user": user, "source": "trino-cli", "class": klass, "template": "q1",
            "sql": "SELECT 1", "state": "QUEUED", "submitted_at": at, "slo_s": 2.0, "routing_group": "default",
            **extra}


def _attempt(qid: str, n: int, cluster: str = "c0", status: str = "ok", **extra) -> dict:
    return {"query_id": qid, "attempt": n, "cluster_id": cluster, "backend_kind": "duckdb", "arrival_s": 1.0 * n,
            "start_s": 1.0 * n + 0.1, "end_s": 1.0 * n + 0.5, "status": status, "error": None, "predicted_s": 0.4,
            **extra}


@pytest.fixture
def history(tmp_path):
    store = QueryHistory(path_default=tmp_path / "logs" / "history.sqlite")
    yield store
    store.close()


def _round_trip(store: QueryHistory) -> None:
    store.record_query(_submitted("q1"))
    store.record_attempt(_attempt("q1", 1, "c0", "timeout", error="timed out"))
    store.record_attempt(_attempt("q1", 2, "c1", "ok"))
    store.record_query({"query_id": "q1", "state": "FINISHED", "outcome": "admitted", "ended_at": T0 + timedelta(
        seconds=3), "elapsed_s": 2.5, "rows": 7})
    row = store.get("q1")
    assert row["user"] == "alice" and row["class"] == "interactive" and row["sql"] == "SELECT 1"
    assert row["state"] == "FINISHED" and row["outcome"] == "admitted" and row["rows"] == 7
    assert row["submitted_at"] == T0 and row["ended_at"] == T0 + timedelta(seconds=3)
    assert row["elapsed_s"] == 2.5 and row["slo_s"] == 2.0 and row["routing_group"] == "default"
    assert row["attempt_count"] == 2 and row["backend"] == "c1"
    assert [(a["attempt"], a["cluster_id"], a["status"], a["error"]) for a in row["attempts"]] == [
        (1, "c0", "timeout", "timed out"), (2, "c1", "ok", None)]
    assert row["attempts"][1]["backend_kind"] == "duckdb" and row["attempts"][1]["predicted_s"] == 0.4
    assert store.list_queries() == [row]
    assert store.get("never") is None


def _prune(store: QueryHistory) -> None:
    old, new = T0 - timedelta(hours=30), T0 - timedelta(hours=1)
    store.record_query(_submitted("old", at=old, attempts=[_attempt("old", 1)]))
    store.record_query(_submitted("new", at=new, attempts=[_attempt("new", 1)]))
    assert store.prune(now=T0) == 1
    assert store.get("old") is None and "old" not in [q["query_id"] for q in store.list_queries()]
    assert store.get("new")["attempts"][0]["cluster_id"] == "c0"
    store.record_query(_submitted("old", at=old))  # the same id again: its attempts went with it
    assert store.get("old")["attempts"] == []
    assert store.prune(now=T0) == 1


def test_a_query_and_its_attempts_round_trip(history):
    _round_trip(history)


def test_a_later_record_updates_only_the_fields_it_names(history):
    history.record_query(_submitted("q1"))
    history.record_query({"query_id": "q1", "state": "RUNNING"})
    row = history.get("q1")
    assert row["state"] == "RUNNING" and row["sql"] == "SELECT 1" and row["user"] == "alice"
    history.record_attempt({"query_id": "q1", "attempt": 1, "cluster_id": "c3", "arrival_s": 0.5,
                            "status": "running"})
    history.record_attempt({"query_id": "q1", "attempt": 1, "status": "ok", "end_s": 0.9})
    attempt = history.get("q1")["attempts"][0]
    assert (attempt["cluster_id"], attempt["arrival_s"], attempt["status"], attempt["end_s"]) == ("c3", 0.5, "ok", 0.9)
    history.record_query({"query_id": "q1", "state": "FAILED", "error_name": "EXCEEDED_TIME_LIMIT"})
    assert history.get("q1")["state"] == "FAILED" and history.get("q1")["error_name"] == "EXCEEDED_TIME_LIMIT"


def test_the_gateways_attempt_list_is_recorded_with_the_query(history):
    gateway_attempts = [{"attempt": 1, "attempt_id": 11, "cluster_id": "c0", "arrival_s": 0.0, "predicted_s": None,
                         "status": "error", "fallback": None, "error": "cluster c0 stopped", "start_s": 0.0,
                         "end_s": 0.2},
                        {"attempt": 2, "attempt_id": 12, "cluster_id": "c2", "arrival_s": 0.2,
                         "predicted_s": math.nan, "status": "ok", "fallback": None, "start_s": 0.2, "end_s": 0.6}]
    history.record_query(_submitted("q1", state="FINISHED", attempts=gateway_attempts))
    row = history.get("q1")
    assert row["attempt_count"] == 2 and row["backend"] == "c2"
    assert [a["cluster_id"] for a in row["attempts"]] == ["c0", "c2"] and row["attempts"][1]["predicted_s"] is None


def test_list_filters_by_user_state_and_time_newest_first(history):
    for i in range(5):
        history.record_query(_submitted(f"q{i}", user="bob" if i % 2 else "alice", at=T0 + timedelta(minutes=i),
                                        state="FINISHED" if i < 3 else "RUNNING"))
    assert [q["query_id"] for q in history.list_queries()] == ["q4", "q3", "q2", "q1", "q0"]
    assert [q["query_id"] for q in history.list_queries(user="bob")] == ["q3", "q1"]
    assert [q["query_id"] for q in history.list_queries(state="RUNNING")] == ["q4", "q3"]
    assert [q["query_id"] for q in history.list_queries(since=T0 + timedelta(minutes=2))] == ["q4", "q3", "q2"]
    naive = (T0 + timedelta(minutes=3)).replace(tzinfo=None)  # a time without a zone is UTC
    assert [q["query_id"] for q in history.list_queries(since=naive)] == ["q4", "q3"]
    assert [q["query_id"] for q in history.list_queries(user="alice", state="FINISHED", limit=1)] == ["q2"]


def test_prune_removes_old_queries_and_their_attempts_but_not_new_ones(history):
    _prune(history)


def test_a_new_store_on_the_same_file_sees_the_history(tmp_path):
    import sqlite3

    path = tmp_path / "history.sqlite"
    with QueryHistory(path_default=path) as first:
        first.record_query(_submitted("q1", attempts=[_attempt("q1", 1)]))
    with sqlite3.connect(path) as db:  # readers (sloctl gateway history) never wait for the gateway's writes
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    with QueryHistory(f"sqlite:///{path}") as second:
        assert second.get("q1")["attempts"][0]["status"] == "ok"
        second.record_query({"query_id": "q1", "state": "FINISHED"})
    with QueryHistory(path_default=path) as third:
        assert third.get("q1")["state"] == "FINISHED"


def test_concurrent_writes_from_eight_threads_lose_nothing(history):
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer(t: int) -> None:
        try:
            start.wait()
            for i in range(25):
                qid = f"t{t}-{i}"
                history.record_query(_submitted(qid, at=T0 + timedelta(seconds=i)))
                history.record_attempt(_attempt(qid, 1))
                history.record_query({"query_id": qid, "state": "FINISHED"})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = history.list_queries(limit=1000)
    assert len(rows) == 200 and {r["state"] for r in rows} == {"FINISHED"}
    assert all(len(r["attempts"]) == 1 and r["attempt_count"] == 1 for r in rows)


@pytest.mark.parametrize("url", ["mysql+pymysql://u@h/db", "postgresql+asyncpg://u@h/db", "sqlite://",
                                 "not a url", "oracle://u:secret@h/db"])
def test_a_url_of_another_kind_is_refused_naming_the_accepted_forms(url):
    with pytest.raises(ValueError, match="'url'.*postgresql\\+psycopg") as caught:
        QueryHistory(url)
    assert "secret" not in str(caught.value)


def test_no_url_and_no_default_path_is_refused():
    with pytest.raises(ValueError, match="path_default"):
        QueryHistory()
    with pytest.raises(ValueError, match="retention_hours"):
        QueryHistory(path_default="x.sqlite", retention_hours=0)


@pytest.mark.parametrize(("doc", "field"), [
    ({"user": "alice"}, "query_id"), ({"query_id": ""}, "query_id"), ({"query_id": 7}, "query_id"),
    ({"query_id": "q", "state": "DONE"}, "state"), ({"query_id": "q", "elapsed_s": "fast"}, "elapsed_s"),
    ({"query_id": "q", "rows": -1}, "rows"), ({"query_id": "q", "submitted_at": "yesterday"}, "submitted_at"),
])
def test_a_bad_query_document_names_the_field(history, doc, field):
    with pytest.raises(ValueError, match=f"'{field}'"):
        history.record_query(doc)


def test_a_bad_attempt_document_names_the_field(history):
    with pytest.raises(ValueError, match="'query_id'"):
        history.record_attempt({"attempt": 1})
    with pytest.raises(ValueError, match="'attempt'"):
        history.record_attempt({"query_id": "q"})
    with pytest.raises(ValueError, match="'attempt'"):
        history.record_attempt({"query_id": "q", "attempt": 0})


def test_bad_read_arguments_name_the_parameter(history):
    for kwargs, name in [({"state": "done"}, "state"), ({"limit": 0}, "limit"), ({"since": "today"}, "since")]:
        with pytest.raises(ValueError, match=f"'{name}'"):
            history.list_queries(**kwargs)


def test_long_strings_are_truncated_never_refused(history):
    history.record_query(_submitted("q1", sql="SELECT 1 -- " + "x" * (2 * MAX_SQL_CHARS), user="u" * 1000,
                                    error_message="e\x00" * 50_000))
    row = history.get("q1")
    assert len(row["sql"]) == MAX_SQL_CHARS and len(row["user"]) == 256 and "\x00" not in row["error_message"]
    assert history.list_queries(user="u" * 1000)[0]["query_id"] == "q1"


def test_a_safe_write_that_fails_is_counted_not_raised(history, capsys):
    assert history.record_query({"user": "no id"}, safe=True) is False
    history.close()
    assert history.record_query(_submitted("q1"), safe=True) is False
    assert history.failures == 2 and "closed" in history.last_error
    assert capsys.readouterr().err.count("warning: gateway query history") == 1  # at most once a minute
    assert history.status()["failures"] == 2


def test_format_history_renders_one_line_per_query(history):
    _round_trip(history)
    history.record_query(_submitted("q2\nspoof", user="bob\tx"))
    text = format_history(history.list_queries())
    lines = text.splitlines()
    assert len(lines) == 3 and lines[0].split()[:2] == ["QUERY", "ID"]
    q1 = next(line for line in lines if line.startswith("q1 "))
    assert "alice" in q1 and "FINISHED" in q1 and "2.500s" in q1 and "c0:timeout c1:ok" in q1
    assert format_history([]) == "no queries"


@pytest.fixture(scope="module")
def postgres_url():
    """A database of its own on a PostgreSQL server for this module (skipped where no server binary exists)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "sloctl_tests_servers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "servers.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    servers = sys.modules[name]
    try:
        server = servers.start_postgres()
    except servers.ServerUnavailable as exc:
        pytest.skip(str(exc))
    server.create_database("history")
    yield server.url_for("history", driver="psycopg")
    server.stop()


def test_postgres_round_trip_prune_and_reopen(postgres_url):
    with QueryHistory(postgres_url) as store:
        _round_trip(store)
        _prune(store)
    with QueryHistory(postgres_url.replace("postgresql+psycopg://", "postgresql://")) as again:
        assert again.get("q1")["backend"] == "c1" and again.get("new") is not None
        again.record_query(_submitted("nul", sql="SELECT '\x00'"))  # PostgreSQL refuses NUL in text
        assert again.get("nul")["sql"] == "SELECT '\ufffd'"


def test_the_gateways_history_survives_a_restart_and_shows_every_attempt(tpch_db, tmp_path):
    """A gateway run's queries, read back through ``GET /v1/query`` of the next gateway on the same folder."""
    pytest.importorskip("trino")
    import trino

    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    options = GatewayOptions(cluster_sizes=(1,), router="least-queued", log_dir=tmp_path, scratch_memory_limit=None)
    first = Gateway(tpch_db, options).start()
    try:
        with LocalServer(create_gateway_app(first)) as client:
            cur = trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), user="tester").cursor()
            cur.execute("SELECT count(*) FROM nation")
            assert cur.fetchall() == [[25]]
            ran = cur.query_id
            with pytest.raises(trino.exceptions.TrinoUserError):
                cur.execute("SELECT nope FROM nation")
                cur.fetchall()
    finally:
        first.close()
    second = Gateway(tpch_db, options).start()
    try:
        with LocalServer(create_gateway_app(second)) as client:
            listed = {d["queryId"]: d for d in client.get("/v1/query", headers={"X-Trino-User": "tester"}).json()}
            assert listed[ran]["state"] == "FINISHED" and listed[ran]["attempts"] == 1
            (failed,) = [d for d in listed.values() if d["state"] == "FAILED"]
            assert failed["errorName"] == "COLUMN_NOT_FOUND" and failed["query"] == "SELECT nope FROM nation"
            doc = client.get(f"/v1/query/{ran}", headers={"X-Trino-User": "tester"}).json()
            assert doc["sql"] == "SELECT count(*) FROM nation" and doc["user"] == "tester"
            assert [(a["attempt"], a["cluster_id"], a["status"], a["backend_kind"]) for a in doc["attempts"]] == [
                (1, "c0", "ok", "duckdb")]
            assert doc["attempts"][0]["start_s"] <= doc["attempts"][0]["end_s"]
            # another user sees none of them
            assert ran not in {d["queryId"] for d in client.get("/v1/query", headers={"X-Trino-User": "x"}).json()}
    finally:
        second.close()
