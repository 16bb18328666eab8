from __future__ import annotations

import pandas as pd
import pytest

from sloctl.core.errors import QueryLogError
from sloctl.datasets.querylog import read_log, write_log
from sloctl.datasets.redset import import_redset


def redset_rows() -> pd.DataFrame:
    return pd.DataFrame({
        "instance_id": [7, 7, 7, 9],
        "query_id": [101, 100, 102, 5],
        "arrival_timestamp": ["2024-03-01 00:00:02", "2024-03-01 00:00:00",
                              "2024-03-01 00:00:05", "2024-03-01 00:00:01"],
        "queue_duration_ms": [500, 0, None, 0],
        "execution_duration_ms": [1500, 250, 10, 40],
        "was_aborted": [False, True, False, False],
        "feature_fingerprint": [11, 22, 11, 33],
        "num_joins": [2, 0, 1, 0],
        "num_scans": [3, 1, 2, 1],
        "num_aggregations": [1, 0, 0, 1],
        "mbytes_scanned": [12.5, 0.1, 3.0, 1.0],
    })


def test_rows_map_onto_the_log_schema(tmp_path):
    log, skipped = import_redset(redset_rows(), instance=7, default_size=4)
    assert skipped == 1  # the row without a queue time
    assert log["redset_query_id"].tolist() == [100, 101]  # arrival order
    first, second = log.iloc[0], log.iloc[1]
    assert (first["arrival_s"], first["start_s"], first["end_s"]) == (0.0, 0.0, 0.25)
    assert (second["arrival_s"], second["start_s"], second["end_s"]) == (2.0, 2.5, 4.0)
    assert second["latency_s"] == 2.0
    assert log["status"].tolist() == ["error", "ok"]
    assert log["cluster_id"].unique().tolist() == ["redset-7"]
    assert (log["cluster_size"] == 4).all()
    assert second["f_joins"] == 2 and second["f_scan_mbytes"] == 12.5
    assert pd.isna(second["f_depth"])  # Redset has no plan depth: unknown
    assert second["template"] == "fp-11"
    path = write_log(log, tmp_path / "redset.parquet")
    assert len(read_log(path)) == 2


def test_missing_redset_column_is_named():
    with pytest.raises(QueryLogError, match="missing Redset column 'queue_duration_ms'"):
        import_redset(redset_rows().drop(columns=["queue_duration_ms"]))
