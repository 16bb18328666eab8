"""Client SQL on a cluster worker cannot reach the host, the network or the worker's own settings."""

from __future__ import annotations

import hashlib
import importlib.util
import socket
import time
from pathlib import Path

import duckdb
import pytest

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets.duckdb_pool import DuckDBClusterPool
from sloctl.datasets.pool import QueryRequest

OOM_SQL = "SELECT max(length(s)) FROM (SELECT string_agg(md5(i::varchar), ',') s FROM range(3000000) t(i))"


def _worker_module():
    """The worker module itself (it is started as ``-m``; loaded by path here to call its sandbox directly)."""
    path = Path(__file__).resolve().parents[2] / "datasets" / "_cluster_worker.py"
    spec = importlib.util.spec_from_file_location("sloctl_test_cluster_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(pool, cluster_id, sql, query_id=[0]):  # noqa: B006 - a counter shared by the module's calls
    query_id[0] += 1
    pool.submit(cluster_id, QueryRequest(query_id[0], sql, timeout_s=20, fetch=True))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for done in pool.completions(timeout_s=0.5):
            if done.query_id == query_id[0]:
                return done
    raise AssertionError(f"no completion for {sql!r}")


@pytest.fixture(scope="module")
def cluster(tpch_db):
    with DuckDBClusterPool(tpch_db, memory_limit="64MB", temp_dir_limit="0GB") as pool:
        cid = pool.spin_up(1)
        pool.wait_ready(cid, timeout_s=60)
        yield pool, cid


@pytest.fixture
def listener():
    """A TCP listener on loopback; ``listener.connected()`` says whether anything connected to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.3)

    class Listener:
        port = server.getsockname()[1]

        @staticmethod
        def connected() -> bool:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return False
            conn.close()
            return True

    yield Listener
    server.close()


@pytest.mark.parametrize("sql", ["SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM read_csv('/etc/passwd')",
                                 "SELECT * FROM glob('/etc/*')", "SELECT * FROM read_parquet('/tmp/*.parquet')"])
def test_host_files_are_unreadable(cluster, sql):
    done = run(*cluster, sql)
    assert done.status == "error" and done.error.startswith("PermissionException:"), done.error
    assert done.data is None


def test_copy_onto_the_database_file_leaves_it_unchanged(cluster, tpch_db):
    before = hashlib.sha256(Path(tpch_db).read_bytes()).hexdigest()
    done = run(*cluster, f"COPY (SELECT 'x') TO '{tpch_db}' (FORMAT csv)")
    assert done.status == "error" and done.error.startswith("PermissionException:")
    assert hashlib.sha256(Path(tpch_db).read_bytes()).hexdigest() == before


def test_copy_elsewhere_writes_no_file(cluster, tmp_path):
    target = tmp_path / "out.csv"
    done = run(*cluster, f"COPY (SELECT 'x') TO '{target}'")
    assert done.status == "error" and done.error.startswith("PermissionException:")
    assert not target.exists()


def test_attach_install_and_urls_never_leave_the_worker(cluster, tpch_db, listener):
    for sql in (f"ATTACH '{tpch_db}' AS w (READ_WRITE)", f"INSTALL httpfs FROM 'http://127.0.0.1:{listener.port}/x'",
                f"SELECT * FROM read_csv('http://127.0.0.1:{listener.port}/x')", "LOAD httpfs"):
        done = run(*cluster, sql)
        assert done.status == "error" and done.error.startswith("PermissionException:"), (sql, done.error)
    assert not listener.connected()


def test_settings_stay_as_the_pool_set_them(cluster):
    before = run(*cluster, "SELECT current_setting('threads'), current_setting('memory_limit')").data
    for sql in ("SET GLOBAL threads = 7", "SET threads = 7", "PRAGMA memory_limit = '10GB'",
                "SET enable_external_access = true", "RESET lock_configuration"):
        done = run(*cluster, sql)
        assert done.status == "error", sql
    after = run(*cluster, "SELECT current_setting('threads'), current_setting('memory_limit')").data
    assert after == before and before[0][0] == 1


def test_one_statement_per_request(cluster):
    done = run(*cluster, "SELECT 1; SELECT 2")
    assert done.status == "error" and done.error == "InvalidInputException: one statement per request, got 2"
    assert run(*cluster, "SELECT 1;").data == [[1]]
    assert run(*cluster, "EXPLAIN SELECT 1").status == "ok"


def test_out_of_memory_is_an_error_and_the_worker_lives_on(cluster):
    done = run(*cluster, OOM_SQL)
    assert done.status == "error" and done.error.startswith("OutOfMemoryException:"), done.error
    pool, cid = cluster
    assert pool.clusters()[0].state == "ready"
    assert run(pool, cid, "SELECT 42").data == [[42]]


# -- the sandbox itself, below the worker's statement check ------------------------------------------------------

@pytest.fixture
def sandboxed(tmp_path):
    db = tmp_path / "w.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS i")
    con = _worker_module().connect_sandboxed(str(db), threads=1, memory_limit="256MB", temp_dir=str(tmp_path / "tmp"))
    yield con, db
    con.close()


def test_sandbox_refuses_files_attach_and_network(sandboxed, tmp_path, listener):
    con, db = sandboxed
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for sql in ("SELECT * FROM read_text('/etc/hostname')", f"COPY (SELECT 'x') TO '{db}'",
                f"COPY (SELECT 'x') TO '{tmp_path / 'x.csv'}'", f"ATTACH '{tmp_path / 'other.duckdb'}' (READ_WRITE)",
                f"INSTALL httpfs FROM 'http://127.0.0.1:{listener.port}/x'",
                f"SELECT * FROM read_csv('http://127.0.0.1:{listener.port}/x')"):
        with pytest.raises(duckdb.PermissionException):
            con.execute(sql)
    assert not listener.connected()
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "other.duckdb").exists()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_sandbox_settings_are_locked(sandboxed):
    con, _ = sandboxed
    for sql in ("SET GLOBAL threads = 7", "SET threads = 7", "PRAGMA memory_limit = '10GB'",
                "SET enable_external_access = true", "SET allowed_directories = ['/']", "RESET lock_configuration"):
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute(sql)
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1


# -- the pool's options --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "match"), [
    ({"memory_limit": "lots"}, "'memory_limit' parameter must be a DuckDB size"),
    ({"memory_limit": "0GB"}, "'memory_limit' parameter must be > 0"),
    ({"temp_dir_limit": 10}, "'temp_dir_limit' parameter must be a DuckDB size"),
])
def test_bad_limits_are_refused_by_name(tpch_db, options, match):
    with pytest.raises(ClusterPoolError, match=match):
        DuckDBClusterPool(tpch_db, **options)


def test_temp_dir_must_be_a_folder(tpch_db, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ClusterPoolError, match="'temp_dir' parameter must name a folder"):
        DuckDBClusterPool(tpch_db, temp_dir=tmp_path / "file")


def _worker_temp_dir(pid: int) -> Path:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(args[args.index(b"--temp-dir") + 1].decode())


def test_temp_folders_go_with_their_cluster_and_pool(tpch_db, tmp_path):
    with DuckDBClusterPool(tpch_db) as pool:
        cid = pool.spin_up(1)
        own = _worker_temp_dir(pool.wait_ready(cid, timeout_s=60).pid)
        assert own.is_dir()
    assert not own.exists() and not own.parent.exists()  # the pool's own folder is removed on close
    given = tmp_path / "spill"
    with DuckDBClusterPool(tpch_db, temp_dir=given) as pool:
        cid = pool.spin_up(1)
        own = _worker_temp_dir(pool.wait_ready(cid, timeout_s=60).pid)
        assert own.parent == given
        pool.tear_down(cid)
        assert not own.exists()
    assert given.is_dir()  # a folder the caller gave stays
