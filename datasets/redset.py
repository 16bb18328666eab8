"""Import per-query Redset rows (Amazon Redshift fleet trace) as a query log.

Column mapping (Redset -> sloctl query log):

| Redset                                   | query log                          |
| ---------------------------------------- | ---------------------------------- |
| ``instance_id``                          | ``cluster_id`` = ``redset-<id>``   |
| ``query_id``                             | ``redset_query_id`` (``query_id`` is renumbered 0..n-1) |
| ``feature_fingerprint`` (else ``query_type``) | ``template``; ``sql_hash``    |
| ``cluster_size`` (provisioned only)      | ``cluster_size`` (missing -> ``default_size``) |
| ``arrival_timestamp``                    | ``arrival_s`` (seconds after the first arrival) |
| ``queue_duration_ms``                    | ``start_s = arrival_s + queue``    |
| ``execution_duration_ms``                | ``end_s = start_s + execution``    |
| ``was_aborted``                          | ``status`` = ``error`` if true else ``ok`` |
| ``num_joins`` / ``num_scans`` / ``num_aggregations`` | ``f_joins`` / ``f_scans`` / ``f_aggregates`` |
| ``num_permanent_tables_accessed``        | ``f_tables``                       |
| ``mbytes_scanned``                       | ``f_scan_mbytes``                  |

``latency_s = end_s - arrival_s``; ``slo_s`` is NaN. Plan features that
Redset does not carry are NaN (unknown), the SQL-text and catalog features
too (Redset has no text); ``f_source`` is ``redset``. Rows with a missing
arrival or duration are skipped and counted. ``compile_duration_ms`` is not
added: it is part of Redshift's execution path before the queue, and Redset
does not say how it overlaps.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from sloctl.core.errors import QueryLogError
from sloctl.datasets.plan_features import PLAN_FEATURES, sql_hash
from sloctl.datasets.querylog import validate_log

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["REQUIRED_COLUMNS", "import_redset"]

REQUIRED_COLUMNS = ("instance_id", "arrival_timestamp", "queue_duration_ms",
                    "execution_duration_ms")
_FEATURES = {
    "num_joins": "f_joins",
    "num_scans": "f_scans",
    "num_aggregations": "f_aggregates",
    "num_permanent_tables_accessed": "f_tables",
    "mbytes_scanned": "f_scan_mbytes",
}


def import_redset(source: str | Path | pd.DataFrame, *, default_size: int = 1,
                  instance: int | None = None, limit: int | None = None
                  ) -> tuple[pd.DataFrame, int]:
    """Map Redset rows onto the query-log schema.

    Args:
        source: a Redset Parquet/CSV file, or its rows as a DataFrame.
        default_size: ``cluster_size`` for rows without one (serverless).
        instance: keep only this ``instance_id``.
        limit: keep the first ``limit`` rows by arrival.

    Returns:
        ``(log, skipped)``: the validated log and the number of rows dropped
        for missing times.
    """
    import numpy as np
    import pandas as pd


    name = "Redset rows"
    if not isinstance(source, pd.DataFrame):
        path = Path(source)
        name = str(path)
        if not path.is_file():
            raise QueryLogError(f"{path}: Redset file not found.")
        raw = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    else:
        raw = source
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise QueryLogError(
            f"{name}: missing Redset column '{missing[0]}' (required: {', '.join(REQUIRED_COLUMNS)}).")
    if isinstance(default_size, bool) or not isinstance(default_size, int) or default_size < 1:
        raise QueryLogError(f"The 'default_size' parameter must be an integer >= 1, got {default_size!r}.")
    df = raw if instance is None else raw[raw["instance_id"] == instance]
    arrival = pd.to_datetime(df["arrival_timestamp"], errors="coerce")
    queue_ms = pd.to_numeric(df["queue_duration_ms"], errors="coerce")
    exec_ms = pd.to_numeric(df["execution_duration_ms"], errors="coerce")
    keep = arrival.notna() & queue_ms.notna() & exec_ms.notna() & (queue_ms >= 0) & (exec_ms >= 0)
    skipped = int((~keep).sum())
    df, arrival, queue_ms, exec_ms = df[keep], arrival[keep], queue_ms[keep], exec_ms[keep]
    order = np.argsort(arrival.to_numpy(), kind="stable")
    df, arrival = df.iloc[order], arrival.iloc[order]
    queue_ms, exec_ms = queue_ms.iloc[order], exec_ms.iloc[order]
    if limit is not None:
        df, arrival = df.iloc[:limit], arrival.iloc[:limit]
        queue_ms, exec_ms = queue_ms.iloc[:limit], exec_ms.iloc[:limit]
    if df.empty:
        raise QueryLogError(f"{name}: no usable Redset rows (skipped {skipped}).")
    arrival_s = (arrival - arrival.iloc[0]).dt.total_seconds().to_numpy()
    start_s = arrival_s + queue_ms.to_numpy() / 1000.0
    end_s = start_s + exec_ms.to_numpy() / 1000.0
    if "feature_fingerprint" in df.columns:
        template = "fp-" + df["feature_fingerprint"].astype("str")
    elif "query_type" in df.columns:
        template = "type-" + df["query_type"].astype("str")
    else:
        template = pd.Series("unknown", index=df.index)
    if "cluster_size" in df.columns:
        size = pd.to_numeric(df["cluster_size"], errors="coerce").fillna(default_size)
        size = size.clip(lower=1).round().astype("int64")
    else:
        size = pd.Series(default_size, index=df.index, dtype="int64")
    status = np.where(df["was_aborted"].fillna(False).astype(bool), "error", "ok") \
        if "was_aborted" in df.columns else "ok"
    out = pd.DataFrame({
        "query_id": np.arange(len(df), dtype=np.int64),
        "template": template.to_numpy(),
        "sql_hash": [sql_hash(t) for t in template],
        "cluster_id": ("redset-" + df["instance_id"].astype("str")).to_numpy(),
        "cluster_size": size.to_numpy(),
        "arrival_s": arrival_s,
        "start_s": start_s,
        "end_s": end_s,
        "latency_s": end_s - arrival_s,
        "status": status,
        "slo_s": math.nan,
        "oversubscribed": False,
    })
    for feature in PLAN_FEATURES:
        out[feature] = math.nan
    for column, feature in _FEATURES.items():
        if column in df.columns:
            out[feature] = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=float)
    out["f_source"] = "redset"  # Redset's own counts, not a plan we built
    if "query_id" in df.columns:
        out["redset_query_id"] = df["query_id"].to_numpy()
    return validate_log(out, source=name), skipped
