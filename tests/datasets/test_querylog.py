from __future__ import annotations

import math

import pandas as pd
import pytest

from sloctl.core.errors import QueryLogError
from sloctl.datasets.plan_features import PLAN_FEATURES
from sloctl.datasets.querylog import COLUMNS, read_log, read_metadata, validate_log, write_log


def make_log(n: int = 3) -> pd.DataFrame:
    rows = []
    for i in range(n):
        arrival = float(i)
        rows.append({
            "query_id": i, "template": f"t{i % 2}", "sql_hash": f"h{i % 2}",
            "cluster_id": "c1", "cluster_size": 1, "arrival_s": arrival,
            "start_s": arrival + 0.01, "end_s": arrival + 0.51, "latency_s": 0.51,
            "status": "ok", "slo_s": math.nan, "oversubscribed": False,
            **{f: 1.0 for f in PLAN_FEATURES},
        })
    return pd.DataFrame(rows)


def test_round_trip_keeps_rows_dtypes_and_metadata(tmp_path):
    path = write_log(make_log(), tmp_path / "q.parquet", metadata={"benchmark": "tpch"})
    df = read_log(path)
    assert list(df.columns)[: len(COLUMNS)] == list(COLUMNS)
    assert df["query_id"].dtype == "int64" and df["latency_s"].dtype == "float64"
    assert read_metadata(path)["benchmark"] == "tpch"
    assert read_metadata(path)["schema_version"] == "1"


def test_missing_column_is_named():
    with pytest.raises(QueryLogError, match="missing column 'latency_s'"):
        validate_log(make_log().drop(columns=["latency_s"]))


def test_negative_latency_names_column_and_row():
    df = make_log()
    df.loc[1, "latency_s"] = -1.0
    with pytest.raises(QueryLogError, match=r"column 'latency_s' must be >= 0.*row 1 \(query_id=1\)"):
        validate_log(df)


def test_end_before_start_names_column():
    df = make_log()
    df.loc[2, "end_s"] = df.loc[2, "start_s"] - 0.1
    df.loc[2, "latency_s"] = df.loc[2, "end_s"] - df.loc[2, "arrival_s"]
    with pytest.raises(QueryLogError, match=r"column 'end_s' must be >= start_s.*row 2"):
        validate_log(df)


@pytest.mark.parametrize("column, value, rule", [
    ("status", "done", "must be one of"),
    ("cluster_size", 0, "must be >= 1"),
    ("start_s", -5.0, "must be >= arrival_s"),
    ("latency_s", 9.0, "must equal end_s - arrival_s"),
    ("slo_s", -1.0, "must be > 0 or NaN"),
    ("query_id", 0, "must be unique"),
    ("template", "", "must not be empty"),
])
def test_bad_values_are_reported_by_column(column, value, rule):
    df = make_log()
    df.loc[1, column] = value
    with pytest.raises(QueryLogError, match=rf"column '{column}' {rule}"):
        validate_log(df)


def test_wrong_type_is_reported():
    df = make_log()
    df["arrival_s"] = ["a", "b", "c"]
    with pytest.raises(QueryLogError, match="column 'arrival_s' must have type float64"):
        validate_log(df)


def test_invalid_log_is_never_written(tmp_path):
    path = tmp_path / "q.parquet"
    write_log(make_log(), path)
    before = path.read_bytes()
    bad = make_log(5)
    bad.loc[0, "latency_s"] = -1.0
    with pytest.raises(QueryLogError):
        write_log(bad, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["q.parquet"]


def test_interrupted_write_leaves_old_log_and_no_temp_file(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    path = tmp_path / "q.parquet"
    write_log(make_log(), path)
    before = path.read_bytes()

    def crash(table, where, **kwargs):
        where.write(b"PAR1 partial bytes")
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of the write

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(KeyboardInterrupt):
        write_log(make_log(10), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["q.parquet"]
    assert len(read_log(path)) == 3


def test_unreadable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "q.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(QueryLogError, match="not a readable Parquet file"):
        read_log(path)
