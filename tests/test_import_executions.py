"""``sloctl import executions``: every format's documented schema, every row accounted for (issue 34).

Fixtures in tests/data/executions/ are written from each engine's documented
schema (README.md there names the documents).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sloctl.cli import app
from sloctl.core.errors import QueryLogError
from sloctl.datasets.executions import detect_format, import_executions

DATA = Path(__file__).parent / "data" / "executions"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def accounted(result) -> None:
    r = result.report
    assert r.imported + r.censored + r.refused == r.read
    assert len(result.log) == r.imported + r.censored
    assert r.refused == sum(v["count"] for v in r.refusals.values())


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("name,fmt,options,counts", [
    ("canonical.csv", "csv", {}, (6, 4, 1, 1)),
    ("trino_events.jsonl", "trino-events", {"size": 4}, (4, 3, 1, 0)),
    ("snowflake_query_history.csv", "snowflake", {}, (7, 3, 2, 2)),
    ("redshift_sys_query_history.csv", "redshift", {"size": 2}, (5, 3, 1, 1)),
    ("postgres_csvlog.csv", "postgres-csvlog", {"size": 2}, (10, 4, 3, 3)),
    ("postgres_csvlog.csv", "postgres-csvlog", {"size": 2, "statement_timeout_s": 30.0}, (10, 4, 4, 2)),
])
def test_each_format_imports_and_accounts_for_every_row(name, fmt, options, counts):
    from sloctl.datasets.merge import merge_logs
    from sloctl.datasets.querylog import validate_log

    assert detect_format(DATA / name) == fmt
    result = import_executions(DATA / name, **options)
    accounted(result)
    r = result.report
    assert (r.read, r.imported, r.censored, r.refused) == counts
    assert r.format == fmt and r.columns_mapped
    log = validate_log(result.log)
    assert log["arrival_s"].min() == 0.0 and (log["arrival_s"].diff().dropna() >= 0).all()
    assert (log["status"] == "timeout").sum() == r.censored
    assert "f_source" in log.columns and log["template"].str.len().min() > 0
    merged, _ = merge_logs([log, log])
    assert len(merged) == 2 * len(log)
    for cluster, summary in r.concurrency.items():
        assert summary["max_concurrent"] >= 1 and summary["queries"] == (log["cluster_id"] == cluster).sum()


def test_engine_specific_mappings():
    sf = import_executions(DATA / "snowflake_query_history.csv").log
    assert set(sf["cluster_size"]) == {1, 4}                      # X-Small = 1, Medium = 4 credits per hour
    assert set(sf["cluster_id"]) == {"ANALYTICS_WH#1", "ANALYTICS_WH#2"}
    assert sf.loc[sf["source_query_id"] == "01b2-0003", "status"].item() == "timeout"   # 000630
    assert sf.loc[sf["source_query_id"] == "01b2-0004", "status"].item() == "timeout"   # 000604, cancelled
    assert sf["template"].str.startswith("sf-").all()
    first = sf.iloc[0]
    assert first["start_s"] == pytest.approx(0.5) and first["end_s"] == pytest.approx(3.0)  # end - EXECUTION_TIME

    rs = import_executions(DATA / "redshift_sys_query_history.csv", size=2,
                           slots=DATA / "redshift_stl_wlm_query.csv")
    log = rs.log
    assert log.loc[log["source_query_id"] == "5003", "status"].item() == "timeout"      # canceled
    assert log.loc[log["source_query_id"] == "5001", "wlm_slot_count"].item() == 1
    assert "taken as UTC" in rs.report.timezone                   # SYS_QUERY_HISTORY times carry no zone

    trino = import_executions(DATA / "trino_events.jsonl", size=4)
    assert set(trino.log["cluster_id"]) == {"prod-etl", "prod-adhoc"}
    assert trino.log.iloc[3]["arrival_s"] == pytest.approx(3.0)   # 11:00:03+01:00 is 10:00:03Z
    assert "normalised to UTC" in trino.report.timezone

    pg = import_executions(DATA / "postgres_csvlog.csv", size=2).log
    paired = pg[pg["template"] == "pg-1234"].iloc[0]              # statement line + later duration line
    assert paired["end_s"] - paired["start_s"] == pytest.approx(0.05)
    assert pg["template"].str.startswith("pg-").sum() == 5        # query_id, PostgreSQL 14+
    # a duration line and then the statement's ERROR (statement_timeout fired as it finished): one censored row
    late = pg[pg["template"] == "pg-555"].sort_values("arrival_s")
    assert list(late["status"]) == ["timeout", "timeout"]
    assert late.iloc[0]["end_s"] - late.iloc[0]["start_s"] == pytest.approx(8.0001)
    # the second was cancelled before it was parsed (query_id 0): the template its text's fingerprint carries
    assert late.iloc[1]["end_s"] - late.iloc[1]["start_s"] == pytest.approx(1.0)


def test_sizes_file_and_refusal_without_a_size(tmp_path):
    sizes = tmp_path / "sizes.csv"
    sizes.write_text("cluster,from,to,size\nprod-etl,,2024-03-01T10:00:01.75Z,2\nprod-etl,2024-03-01T10:00:01.75Z,,8\n")
    result = import_executions(DATA / "trino_events.jsonl", sizes=sizes)
    accounted(result)
    assert list(result.log["cluster_size"]) == [2, 2, 8]
    assert result.report.refusals["no cluster size (pass --sizes FILE or --size N)"]["count"] == 1


def test_status_map_and_kept_columns(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("sql,start,end,status,team\n"
                    "SELECT 1,2024-01-01 00:00:00,2024-01-01 00:00:01,SUCCESS,a\n"
                    "SELECT 2,2024-01-01 00:00:00.5,2024-01-01 00:00:02,FAILED_WITH_ERROR,b\n"
                    "SELECT 3,2024-01-01 00:00:01,2024-01-01 00:00:03,WEIRD,c\n")
    result = import_executions(path, size=1, status_map="SUCCESS=ok,FAILED_WITH_ERROR=error")
    accounted(result)
    assert list(result.log["status"]) == ["ok", "error"] and list(result.log["team"]) == ["a", "b"]
    assert "taken as UTC" in result.report.timezone
    assert any("WEIRD" in reason for reason in result.report.refusals)


def test_unparseable_sql_never_fails_the_import(tmp_path):
    path = tmp_path / "junk.csv"
    path.write_text('sql,start_s,end_s,status\n"SELEC ))) FROM",0,1,ok\n"\x01\x02 not sql at all",0.5,2,ok\n'
                    "SELECT 1,1,2,ok\n")
    result = import_executions(path, size=1)
    accounted(result)
    assert len(result.log) == 3
    assert result.report.parse_failures["rows"] >= 1


def test_missing_required_column_is_one_line_naming_it_and_the_doc(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("sql,start_s,end_s\nSELECT 1,0,1\n")
    line = one_line_error(invoke("import", "executions", path, "--out", tmp_path / "o.parquet", "--size", 1),
                          "'status'", "Importing executions")
    assert str(path) in line
    bad = tmp_path / "sf.csv"
    text = (DATA / "snowflake_query_history.csv").read_text().replace("EXECUTION_STATUS", "STATE", 1)
    bad.write_text(text)
    one_line_error(invoke("import", "executions", bad, "--format", "snowflake", "--out", tmp_path / "o.parquet"),
                   "'EXECUTION_STATUS'", "QUERY_HISTORY")


def test_a_file_of_another_format_is_recognised_and_named(tmp_path):
    one_line_error(invoke("import", "executions", DATA / "trino_events.jsonl", "--format", "csv", "--out",
                          tmp_path / "o.parquet"), "Trino QueryCompletedEvent", "--format trino-events")
    one_line_error(invoke("import", "executions", DATA / "snowflake_query_history.csv", "--format", "redshift",
                          "--out", tmp_path / "o.parquet"), "Snowflake", "--format snowflake")
    with pytest.raises(QueryLogError, match="postgres-csvlog"):
        import_executions(DATA / "postgres_csvlog.csv", format="csv", size=1)


def test_dry_run_writes_nothing_and_json_reports(tmp_path):
    out = tmp_path / "log.parquet"
    result = invoke("import", "executions", DATA / "snowflake_query_history.csv", "--out", out, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert not out.exists() and doc["dry_run"] and doc["refused"] == 2
    assert doc["imported"] + doc["censored"] + doc["refused"] == doc["read"]
    assert doc["concurrency"]["ANALYTICS_WH#2"]["max_concurrent"] == 2
    text = invoke("import", "executions", DATA / "postgres_csvlog.csv", "--out", out, "--dry-run", "--size", "2")
    assert text.exit_code == 0 and "refused 1: statement without an end" in text.stdout and not out.exists()


def test_written_log_records_sources_and_passes_log_validate(tmp_path):
    from sloctl.datasets.querylog import read_metadata

    out = tmp_path / "pg.parquet"
    result = invoke("import", "executions", DATA / "postgres_csvlog.csv", "--out", out, "--size", "2")
    assert result.exit_code == 0, result.output
    assert invoke("log", "validate", out).exit_code == 0
    meta = read_metadata(out)
    assert meta["import_format"] == "postgres-csvlog" and meta["dialect"] == "postgres"
    assert len(json.loads(meta["source"])[0]["sha256"]) == 64
    assert json.loads(meta["import_counts"])["read"] == 10


def test_a_collected_log_exported_as_csv_imports_back_with_identical_concurrency(tpch_db, tpch_templates, tmp_path):
    from sloctl.datasets.analysis import overlap_counts
    from sloctl.datasets.collect import collect
    from sloctl.datasets.workloads import base_workload

    small = [t for t in tpch_templates if t.name in ("tpch-q01", "tpch-q03", "tpch-q06", "tpch-q14")] or \
        tpch_templates[:4]
    log = collect(tpch_db, base_workload(small, 2000.0, copies=3), [1], log=None).log  # arrivals 0.5 ms apart
    sql = {t.name: t.sql for t in tpch_templates}
    export = pd.DataFrame({"query_id": log["query_id"], "template": log["template"],
                           "sql": log["template"].map(sql), "arrival_s": log["arrival_s"] + 1000.0,
                           "start_s": log["start_s"] + 1000.0, "end_s": log["end_s"] + 1000.0,
                           "status": log["status"], "cluster_id": log["cluster_id"],
                           "cluster_size": log["cluster_size"]})
    path = tmp_path / "collected.csv"
    export.to_csv(path, index=False, float_format="%.9f")
    result = import_executions(path)
    accounted(result)
    assert result.report.refused == 0
    back = result.log.sort_values("source_query_id", key=lambda s: s.astype(int)).reset_index(drop=True)
    original = log.sort_values("query_id").reset_index(drop=True)
    assert list(back["template"]) == list(original["template"])
    assert np.allclose(back["latency_s"], original["latency_s"], atol=1e-6)
    assert list(overlap_counts(back)) == list(overlap_counts(original))
    assert overlap_counts(original).max() >= 1                   # the workload did overlap


def test_catalog_statistics_reach_the_features(tmp_path):
    catalog = tmp_path / "tables.csv"
    catalog.write_text("table,rows,bytes\nlineitem,6000000,700000000\norders,1500000,160000000\n")
    out = tmp_path / "sf.parquet"
    result = invoke("import", "executions", DATA / "snowflake_query_history.csv", "--out", out, "--catalog", catalog,
                    "--json")
    assert result.exit_code == 0, result.output
    log = pd.read_parquet(out)
    catalog_columns = [c for c in log.columns if c.startswith("f_c_")]
    assert catalog_columns and log[catalog_columns].notna().any(axis=None)
    assert log["f_source"].str.contains("catalog").any()
    from sloctl.datasets.querylog import read_metadata
    from sloctl.datasets.sql_features import catalog_from_metadata

    kept = catalog_from_metadata(read_metadata(out))  # travels with the log, for the model trained on it
    assert kept.tables == {"lineitem": (6e6, 7e8), "orders": (1.5e6, 1.6e8)}
