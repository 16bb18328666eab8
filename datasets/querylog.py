"""The query log: one row per query execution, stored as Parquet.

Schema (version 1, plan features version 2). Times are seconds on the run's
own clock (0 = start of the run); ``latency_s`` is what the client saw,
``end_s - arrival_s``.

| column         | type    | rule                                                  |
| -------------- | ------- | ----------------------------------------------------- |
| query_id       | int64   | unique within the log                                 |
| template       | string  | non-empty (e.g. ``tpch-q05``)                         |
| sql_hash       | string  | non-empty; SHA-256 prefix of the query text           |
| cluster_id     | string  | non-empty                                             |
| cluster_size   | int64   | >= 1 (cores, or the warehouse's own size unit)        |
| arrival_s      | float64 | finite, >= 0                                          |
| start_s        | float64 | finite, >= arrival_s                                  |
| end_s          | float64 | finite, >= start_s                                    |
| latency_s      | float64 | >= 0 and equal to end_s - arrival_s                   |
| status         | string  | ``ok``, ``timeout`` or ``error``                      |
| slo_s          | float64 | > 0, or NaN when no SLO was assigned                  |
| oversubscribed | bool    | true when the cluster shared cores with another       |
| f_*            | float64 | features (:data:`PLAN_FEATURES`: engine plan, SQL     |
|                |         | text ``f_t_*``, catalog ``f_c_*``); NaN = unknown     |
| f_source       | string  | the feature groups a row has, e.g.                    |
|                |         | ``plan:duckdb+text+catalog``, ``text``, ``none``      |

A ``timeout`` row is a censored observation: ``latency_s`` is the time to
failure, a lower bound on the true latency. Extra columns are kept as they
are. The file's metadata records the schema and plan-feature versions.
Older logs still read: missing text and catalog columns (a version-1 log, or
a writer that does not know them) become NaN, and a missing ``f_source`` is
derived from each row's features
(:func:`~sloctl.datasets.sql_features.feature_source`, plan engine DuckDB).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from sloctl.core.errors import QueryLogError
from sloctl.core.files import atomic_write
from sloctl.datasets.plan_features import ENGINE_PLAN_FEATURES, PLAN_FEATURE_VERSION, PLAN_FEATURES
from sloctl.datasets.sql_features import CATALOG_FEATURES, TEXT_COUNT_FEATURES, TEXT_FEATURES

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "STATUSES",
    "empty_features",
    "feature_sources",
    "read_log",
    "read_metadata",
    "template_table",
    "validate_log",
    "write_log",
]

SCHEMA_VERSION = "1"
STATUSES = ("ok", "timeout", "error")

#: Required columns and their pandas dtypes, in file order.
COLUMNS: dict[str, str] = {
    "query_id": "int64",
    "template": "str",
    "sql_hash": "str",
    "cluster_id": "str",
    "cluster_size": "int64",
    "arrival_s": "float64",
    "start_s": "float64",
    "end_s": "float64",
    "latency_s": "float64",
    "status": "str",
    "slo_s": "float64",
    "oversubscribed": "bool",
    **{name: "float64" for name in PLAN_FEATURES},
    "f_source": "str",
}

_TOLERANCE_S = 1e-6


def _bad(source: str, column: str, rule: str, df: pd.DataFrame, mask) -> QueryLogError:
    import numpy as np

    rows = np.flatnonzero(np.asarray(mask))
    row = int(rows[0])
    value = df[column].iloc[row]
    value = value.item() if hasattr(value, "item") else value
    qid = df["query_id"].iloc[row] if "query_id" in df.columns else "?"
    return QueryLogError(
        f"{source}: column '{column}' {rule}, got {value!r} at row {row} (query_id={qid}); "
        f"{len(rows)} bad row(s) in all."
    )


def validate_log(df: pd.DataFrame, source: str = "query log") -> pd.DataFrame:
    """Check ``df`` against the schema and return it with canonical dtypes.

    Args:
        df: the log as a DataFrame.
        source: a name for messages (usually the file path).

    Returns:
        A copy with the documented column order and dtypes (extra columns last).

    Raises:
        QueryLogError: naming the first bad column and, for values, the first
            bad row.
    """
    import numpy as np
    import pandas as pd

    df = _upgrade(df)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise QueryLogError(
            f"{source}: missing column '{missing[0]}' (required: {', '.join(COLUMNS)})."
        )
    out = pd.DataFrame(index=range(len(df)))
    for column, dtype in COLUMNS.items():
        series = df[column].reset_index(drop=True)
        try:
            if dtype == "str":
                if series.isna().any():
                    raise _bad(source, column, "must not be empty", df.reset_index(drop=True), series.isna())
                series = series.astype("str")
            elif dtype == "int64":
                as_float = pd.to_numeric(series, errors="raise").astype("float64")
                bad = ~np.isfinite(as_float) | (as_float != np.round(as_float))
                if bad.any():
                    raise _bad(source, column, "must hold whole numbers", df.reset_index(drop=True), bad)
                series = as_float.astype("int64")
            elif dtype == "bool":
                if series.dtype != bool and not set(pd.unique(series)) <= {True, False}:
                    raise QueryLogError(f"{source}: column '{column}' must be true/false.")
                series = series.astype("bool")
            else:
                series = pd.to_numeric(series, errors="raise").astype("float64")
        except (TypeError, ValueError) as exc:
            if isinstance(exc, QueryLogError):
                raise
            raise QueryLogError(
                f"{source}: column '{column}' must have type {dtype} ({exc})."
            ) from exc
        out[column] = series
    for column in df.columns:
        if column not in COLUMNS:
            out[column] = df[column].reset_index(drop=True)

    def check(column: str, rule: str, bad) -> None:
        if bool(np.any(bad)):
            raise _bad(source, column, rule, out, bad)

    for column in ("template", "sql_hash", "cluster_id"):
        check(column, "must not be empty", out[column].str.len() == 0)
    check("query_id", "must be unique", out["query_id"].duplicated())
    check("cluster_size", "must be >= 1", out["cluster_size"] < 1)
    for column in ("arrival_s", "start_s", "end_s", "latency_s"):
        check(column, "must be finite", ~np.isfinite(out[column]))
    check("arrival_s", "must be >= 0", out["arrival_s"] < 0)
    check("start_s", "must be >= arrival_s", out["start_s"] < out["arrival_s"] - _TOLERANCE_S)
    check("end_s", "must be >= start_s", out["end_s"] < out["start_s"] - _TOLERANCE_S)
    check("latency_s", "must be >= 0", out["latency_s"] < 0)
    expected = out["end_s"] - out["arrival_s"]
    check(
        "latency_s",
        "must equal end_s - arrival_s",
        (out["latency_s"] - expected).abs() > _TOLERANCE_S + 1e-9 * expected.abs(),
    )
    check("status", f"must be one of {', '.join(STATUSES)}", ~out["status"].isin(STATUSES))
    slo = out["slo_s"]
    check("slo_s", "must be > 0 or NaN", ~(slo.isna() | (slo > 0)) | np.isinf(slo))
    return out


def _upgrade(df: pd.DataFrame) -> pd.DataFrame:
    """Add what older writers did not write: NaN text/catalog features, ``f_source`` from the features."""
    missing_text = [name for name in TEXT_FEATURES if name not in df.columns]
    fill_source = "f_source" not in df.columns or df["f_source"].isna().any()
    if not missing_text and not fill_source:
        return df
    df = df.copy()
    for name in missing_text:
        df[name] = math.nan
    if fill_source and all(name in df.columns for name in PLAN_FEATURES):
        sources = feature_sources(df)
        df["f_source"] = sources if "f_source" not in df.columns else df["f_source"].where(
            df["f_source"].notna(), sources)
    return df


def feature_sources(df: pd.DataFrame, plan_engine: str | None = "duckdb") -> pd.Series:
    """Each row's ``f_source`` from its features (vectorised :func:`~sloctl.datasets.sql_features.feature_source`)."""
    import numpy as np
    import pandas as pd

    def known(names: tuple[str, ...]):
        return df[list(names)].apply(pd.to_numeric, errors="coerce").notna().any(axis=1).to_numpy()

    plan = "plan" if plan_engine is None else f"plan:{plan_engine}"
    parts = [np.where(known(ENGINE_PLAN_FEATURES), plan, ""), np.where(known(TEXT_COUNT_FEATURES), "text", ""),
             np.where(known(CATALOG_FEATURES), "catalog", "")]
    joined = ["+".join(p for p in row if p) or "none" for row in zip(*parts, strict=True)]
    return pd.Series(joined, index=df.index, dtype=object)


def read_log(path: str | Path) -> pd.DataFrame:
    """Read and validate a query log.

    Raises:
        QueryLogError: the file is missing, unreadable or breaks the schema.
    """
    import pandas as pd
    import pyarrow as pa

    path = Path(path)
    if not path.is_file():
        raise QueryLogError(f"{path}: query log not found.")
    try:
        df = pd.read_parquet(path)
    except (OSError, pa.ArrowException) as exc:
        raise QueryLogError(f"{path}: not a readable Parquet file ({exc}).") from exc
    return validate_log(df, source=str(path))


def write_log(df: pd.DataFrame, path: str | Path, *, metadata: dict[str, str] | None = None) -> Path:
    """Validate ``df`` and write it to ``path`` atomically.

    The log is written to a temporary file in the same folder, flushed to disk
    and renamed over ``path``, so a reader sees the old file or the new one,
    never a partial one; on any failure the temporary file is removed and the
    old file is left untouched.

    Args:
        df: the log.
        path: destination ``.parquet`` file.
        metadata: extra key/value pairs stored in the file (run parameters).

    Returns:
        The destination path.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    table = pa.Table.from_pandas(validate_log(df, source=str(path)), preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"sloctl.schema_version"] = SCHEMA_VERSION.encode()
    meta[b"sloctl.plan_feature_version"] = PLAN_FEATURE_VERSION.encode()
    for key, value in (metadata or {}).items():
        meta[f"sloctl.{key}".encode()] = str(value).encode()
    table = table.replace_schema_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as fh:  # readers never see half a file; mode 0o666 & ~umask
        pq.write_table(table, fh)
    return path


def read_metadata(path: str | Path) -> dict[str, str]:
    """The ``sloctl.*`` key/value pairs stored with a log."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return {
        k.decode()[len("sloctl."):]: v.decode()
        for k, v in meta.items()
        if k.startswith(b"sloctl.")
    }


def empty_features() -> dict[str, float]:
    """A feature row with every feature unknown (NaN): every name in :data:`PLAN_FEATURES`."""
    return {name: math.nan for name in PLAN_FEATURES}


def template_table(log: pd.DataFrame) -> pd.DataFrame:
    """One row per template of ``log`` (its first): ``template``, ``sql_hash``, the features and ``f_source``.

    This is what routers look a template up in (plan features for Iconq+,
    ``sql_hash`` for Stage's cache of measured latencies); a model bundle
    carries the table of its training log. A log without ``f_source`` or
    the text features (an older one) gets them as :func:`validate_log` does.
    """
    log = _upgrade(log)
    return log.drop_duplicates("template")[["template", "sql_hash", *PLAN_FEATURES, "f_source"]].reset_index(
        drop=True)
