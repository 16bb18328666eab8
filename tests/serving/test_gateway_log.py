"""The gateway's query log cannot silently stop, and never runs a client's text (issue 33, items 4 and 5)."""

from __future__ import annotations

import json
import math

import pytest

from sloctl.core.errors import QueryLogError
from sloctl.datasets.plan_features import ENGINE_PLAN_FEATURES, PLAN_FEATURES, sql_hash
from sloctl.datasets.sql_features import CATALOG_FEATURES
from sloctl.serving.gateway.log import MANIFEST_NAME, AttemptLog, file_sha256, read_manifest

HOSTILE = "SELECT 1 AS a; SELECT count(*) FROM lineitem a, lineitem b"


def _row(i: int, sql: str = "SELECT 1", template: str = "adhoc", **extra) -> dict:
    return {"query_id": i, "template": template, "sql_hash": sql_hash(sql), "cluster_id": "c0", "cluster_size": 1,
            "arrival_s": float(i), "start_s": float(i), "end_s": i + 0.5, "latency_s": 0.5, "status": "ok",
            "slo_s": math.nan, "oversubscribed": False, "gateway_query": f"q{i}", "query_class": "low",
            "attempt": 1, "error": "", "cancelled": False, **extra}


def _add(log: AttemptLog, i: int, sql: str = "SELECT 1", **extra) -> None:
    log.append(_row(i, sql, **extra), sql)


@pytest.fixture
def plan_json():
    """A real ``EXPLAIN (FORMAT JSON)`` text, as a sandboxed worker would return it."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(100)")
    text = con.execute("EXPLAIN (FORMAT JSON) SELECT count(*) FROM t WHERE i > 5").fetchall()[0][1]
    con.close()
    return text


@pytest.fixture
def no_duckdb(monkeypatch):
    """The log must never open a database: any connection is a failure."""
    import duckdb

    def refuse(*args, **kwargs):
        raise AssertionError("AttemptLog opened a DuckDB connection")

    monkeypatch.setattr(duckdb, "connect", refuse)


def test_plan_features_come_only_from_the_explain_callable(tmp_path, plan_json, no_duckdb):
    asked = []

    def explain(sql):
        asked.append(sql)
        return None if ";" in sql else plan_json  # a multi-statement text cannot be planned

    log = AttemptLog(tmp_path / "tpch_sf0.01.duckdb", tmp_path / "logs", "s", explain=explain)
    _add(log, 0, HOSTILE)
    _add(log, 1, "SELECT count(*) FROM t WHERE i > 5")
    _add(log, 2, "SELECT count(*) FROM t WHERE i > 5")
    frame = log.frame()
    log.flush()
    _add(log, 3, HOSTILE)
    log.flush()
    assert asked == [HOSTILE, "SELECT count(*) FROM t WHERE i > 5"]  # once per text, cached across flushes
    assert frame.loc[0, list(PLAN_FEATURES)].isna().all()  # could not be planned: unknown, not an error
    assert frame.loc[1, "f_nodes"] >= 1 and not frame.loc[1:2, list(ENGINE_PLAN_FEATURES)].isna().any(axis=None)
    # the text's counts come with the plan; no catalog in the gateway: its columns stay unknown
    assert frame.loc[1, "f_t_predicates"] == 1 and frame.loc[1, "f_t_tables"] == 1
    assert frame.loc[1:2, list(CATALOG_FEATURES)].isna().all(axis=None)
    assert log.errors == {"featurize": 0, "invalid": 0, "write": 0}


def test_without_explain_unknown_texts_get_nan_and_known_templates_the_table(tmp_path, no_duckdb):
    import pandas as pd

    table = pd.DataFrame([{"template": "tpch-q01", "sql_hash": "x", **dict.fromkeys(PLAN_FEATURES, 2.0)}])
    log = AttemptLog(tmp_path / "db.duckdb", None, "s")
    _add(log, 0, HOSTILE)
    _add(log, 1, "SELECT 2", template="tpch-q01")
    frame = log.frame(table)
    assert frame.loc[0, list(PLAN_FEATURES)].isna().all() and (frame.loc[1, list(PLAN_FEATURES)] == 2.0).all()
    assert log.flush(table) is None and sum(log.errors.values()) == 0  # no log_dir: nothing written


def test_a_template_table_from_before_text_features_gives_them_as_unknown(tmp_path, no_duckdb):
    import pandas as pd

    table = pd.DataFrame([{"template": "tpch-q01", "sql_hash": "x", **dict.fromkeys(ENGINE_PLAN_FEATURES, 3.0)}])
    log = AttemptLog(tmp_path / "db.duckdb", None, "s")
    _add(log, 0, "SELECT 2", template="tpch-q01")
    frame = log.frame(table)
    assert (frame.loc[0, list(ENGINE_PLAN_FEATURES)] == 3.0).all()
    assert frame.loc[0, [c for c in PLAN_FEATURES if c not in ENGINE_PLAN_FEATURES]].isna().all()
    assert sum(log.errors.values()) == 0


@pytest.mark.parametrize("answer", [
    "raise", "not json", "[1, 2]", "{\"name\": \"SEQ_SCAN\", \"extra_info\": {\"Estimated Cardinality\": \"inf\"}}",
])
def test_a_featurizer_failure_gives_nan_and_a_counted_error_and_the_log_goes_on(tmp_path, capsys, answer, plan_json):
    def explain(sql):
        if sql == "SELECT 2":
            return plan_json
        if answer == "raise":
            raise TimeoutError("EXPLAIN ran past 2 s on the worker")
        return answer

    log = AttemptLog(tmp_path / "db.duckdb", tmp_path / "logs", "s", explain=explain)
    _add(log, 0, "SELECT broken")
    assert log.flush() == log.path
    _add(log, 1, "SELECT 2")
    _add(log, 2, "SELECT broken")
    path = log.flush()
    from sloctl.datasets.querylog import read_log

    written = read_log(path)
    assert len(written) == 3 and not log.dirty
    assert written.loc[written["query_id"] != 1, list(PLAN_FEATURES)].isna().all(axis=None)
    assert not written.loc[written["query_id"] == 1, list(ENGINE_PLAN_FEATURES)].isna().any(axis=None)
    assert log.errors["featurize"] == 1 and log.last_error.startswith("featurize: ")  # once per text
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("warning: gateway query log: ")


def test_repeated_errors_are_rate_limited_on_stderr_but_all_counted(tmp_path, capsys):
    def explain(sql):
        raise RuntimeError("worker gone")

    log = AttemptLog(tmp_path / "db.duckdb", None, "s", explain=explain)
    for i in range(5):
        _add(log, i, f"SELECT {i}")
    log.frame()
    assert log.errors["featurize"] == 5
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    log.warn_interval_s = 0.0
    _add(log, 5, "SELECT 5")
    log.frame()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "and 4 more featurize error(s)" in line


def test_a_failed_write_is_counted_the_old_file_stays_and_the_next_flush_writes_the_rows(tmp_path, monkeypatch,
                                                                                           capsys):
    import sloctl.datasets.querylog as querylog

    log = AttemptLog(tmp_path / "db.duckdb", tmp_path / "logs", "s")
    _add(log, 0)
    path = log.flush()
    before = path.read_bytes()
    real = querylog.write_log

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(querylog, "write_log", full_disk)
    _add(log, 1)
    with pytest.raises(OSError):
        log.flush()
    assert log.dirty and log.errors["write"] == 1 and "No space left" in log.last_error
    assert path.read_bytes() == before and log.status()["written_rows"] == 1
    assert "warning: gateway query log: " in capsys.readouterr().err
    assert b'sloctl_gateway_log_unwritten_rows 1.0' in log.metrics_text()
    monkeypatch.setattr(querylog, "write_log", real)
    assert log.flush() == path and not log.dirty
    assert len(querylog.read_log(path)) == 2 and log.status()["written_rows"] == 2
    assert read_manifest(path.parent)[path.name] == {**read_manifest(path.parent)[path.name], "rows": 2,
                                                     "sha256": file_sha256(path)}


def test_a_read_only_folder_is_a_counted_write_error_not_a_stop(tmp_path):
    import os

    folder = tmp_path / "logs"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user who writes anywhere")
        log = AttemptLog(tmp_path / "db.duckdb", folder, "s")
        _add(log, 0)
        with pytest.raises(OSError):
            log.flush()
        assert log.errors["write"] == 1 and log.dirty
    finally:
        folder.chmod(0o700)
    assert log.flush() == log.path and not log.dirty


def test_the_final_flush_retries_never_raises_and_plans_nothing(tmp_path, monkeypatch, capsys):
    import sloctl.datasets.querylog as querylog

    asked = []
    log = AttemptLog(tmp_path / "db.duckdb", tmp_path / "logs", "s", explain=lambda sql: asked.append(sql))
    _add(log, 0, "SELECT 1", status="error", error="gateway shut down")
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise OSError("disk gone")

    monkeypatch.setattr(querylog, "write_log", broken)
    assert log.flush(final=True) is None
    assert len(calls) == 3 and asked == [] and log.errors["write"] == 1
    assert "lost" in capsys.readouterr().err
    monkeypatch.undo()
    path = log.flush(final=True)
    written = querylog.read_log(path)
    assert written.loc[0, "error"] == "gateway shut down" and written.loc[0, list(PLAN_FEATURES)].isna().all()


def test_a_row_that_breaks_the_schema_is_dropped_and_counted_not_the_log(tmp_path):
    from sloctl.datasets.querylog import read_log

    log = AttemptLog(tmp_path / "db.duckdb", tmp_path / "logs", "s")
    _add(log, 0)
    log.append({**_row(1), "start_s": -5.0}, "SELECT 1")  # starts before it arrived
    _add(log, 0)  # a repeated query_id
    _add(log, 2)
    path = log.flush()
    assert list(read_log(path)["query_id"]) == [0, 2] and len(log) == 2
    assert log.errors["invalid"] == 2 and "start_s" in log.last_error


def test_every_flush_lists_the_file_with_its_sha256_in_the_manifest_shared_by_runs(tmp_path):
    folder = tmp_path / "logs"
    first = AttemptLog(tmp_path / "db.duckdb", folder, "run1")
    second = AttemptLog(tmp_path / "db.duckdb", folder, "run2")
    _add(first, 0)
    _add(second, 0)
    _add(second, 1)
    a, b = first.flush(), second.flush()
    listed = read_manifest(folder)
    assert set(listed) == {a.name, b.name}
    assert listed[a.name]["sha256"] == file_sha256(a) and listed[a.name]["rows"] == 1
    assert listed[b.name]["sha256"] == file_sha256(b) and listed[b.name]["rows"] == 2
    assert json.loads((folder / MANIFEST_NAME).read_text())["kind"] == "sloctl gateway query logs"


def test_metrics_and_status_show_the_errors(tmp_path):
    log = AttemptLog(tmp_path / "db.duckdb", None, "s", explain=lambda sql: "junk")
    _add(log, 0)
    log.frame()
    text = log.metrics_text().decode()
    assert 'sloctl_gateway_log_errors_total{kind="featurize"} 1.0' in text
    assert 'sloctl_gateway_log_errors_total{kind="write"} 0.0' in text
    assert log.status()["errors"] == {"featurize": 1, "invalid": 0, "write": 0}
    other = AttemptLog(tmp_path / "db.duckdb", None, "s")  # a registry of its own: no collision
    assert 'kind="featurize"} 0.0' in other.metrics_text().decode()


# -- what `--log LOG_DIR` reads ----------------------------------------------------------------
@pytest.fixture
def gateway_dir(tmp_path):
    log = AttemptLog(tmp_path / "db.duckdb", tmp_path / "logs", "s")
    _add(log, 0)
    _add(log, 1)
    return log.flush()


def test_log_files_skips_a_foreign_parquet_copied_into_a_gateway_folder(gateway_dir, sim_log, capsys):
    from sloctl._cli_common import log_files, read_logs
    from sloctl.datasets.querylog import write_log

    write_log(sim_log, gateway_dir.parent / "copied-in.parquet")
    assert log_files([gateway_dir.parent]) == [gateway_dir]
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "copied-in.parquet (not listed)" in err and "read the 1 of 2" in err
    assert len(read_logs([gateway_dir.parent])) == 2


def test_log_files_skips_a_listed_file_changed_after_the_gateway_wrote_it(gateway_dir, sim_log, capsys):
    from sloctl._cli_common import log_files
    from sloctl.datasets.querylog import write_log

    write_log(sim_log, gateway_dir)  # same name, other rows
    with pytest.raises(QueryLogError, match="checksum changed"):
        log_files([gateway_dir.parent], "--log")
    assert "checksum changed" in capsys.readouterr().err
    assert log_files([gateway_dir]) == [gateway_dir]  # a file named on its own is read as it is


def test_a_broken_manifest_is_refused_not_overwritten(gateway_dir):
    from sloctl._cli_common import log_files

    manifest = gateway_dir.parent / MANIFEST_NAME
    manifest.write_text("{not json")
    with pytest.raises(QueryLogError, match="--log .*not a readable gateway manifest"):
        log_files([gateway_dir.parent])
    log = AttemptLog(gateway_dir.parent / "db.duckdb", gateway_dir.parent, "s2")
    _add(log, 0)
    with pytest.raises(QueryLogError):
        log.flush()
    assert log.errors["write"] == 1 and manifest.read_text() == "{not json"


def test_a_folder_without_a_manifest_reads_every_parquet_as_before(tmp_path, sim_log, capsys):
    from sloctl._cli_common import log_files
    from sloctl.datasets.querylog import write_log

    paths = [write_log(sim_log, tmp_path / name) for name in ("b.parquet", "a.parquet")]
    assert log_files([tmp_path]) == sorted(paths) and capsys.readouterr().err == ""
