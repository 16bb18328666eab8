"""Readers of engines' execution histories, for :mod:`sloctl.datasets.executions`.

Each reader turns one file into batches of *normalised rows*: a DataFrame
with the columns of :data:`ROW_COLUMNS` (times in seconds on the source's
clock, epoch seconds for timestamps) plus extra columns prefixed ``x:``. A row
the reader can already tell is unusable carries its reason in ``refused``; the
core adds the reasons it can tell (no size, no end, ...) and counts them all.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.core.errors import QueryLogError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

#: What a reader yields (``x:<name>`` columns are extras kept in the log).
ROW_COLUMNS = ("sql", "arrival", "start", "end", "status", "cluster_id", "cluster_size", "template",
               "source_query_id", "slo_s", "refused")

_DOC = "docs/querylog.md, 'Importing executions'"
#: The document each format follows (named in every error about its columns).
DOCS = {
    "csv": f"the canonical form ({_DOC})",
    "parquet": f"the canonical form ({_DOC})",
    "trino-events": "Trino's QueryCompletedEvent (io.trino.spi.eventlistener; Trino docs, 'HTTP event listener')",
    "snowflake": "Snowflake's ACCOUNT_USAGE.QUERY_HISTORY view (docs.snowflake.com, 'QUERY_HISTORY view')",
    "redshift": "Amazon Redshift's SYS_QUERY_HISTORY view (Redshift Database Developer Guide, 'SYS_QUERY_HISTORY')",
    "postgres-csvlog": "PostgreSQL's csvlog (PostgreSQL manual, 'Using CSV-Format Log Output')",
}
NAMES = {
    "csv": "canonical execution CSV", "parquet": "canonical execution Parquet file",
    "trino-events": "Trino QueryCompletedEvent log", "snowflake": "Snowflake QUERY_HISTORY export",
    "redshift": "Redshift SYS_QUERY_HISTORY export", "postgres-csvlog": "PostgreSQL csvlog",
    "redshift-slots": "Redshift STL_WLM_QUERY export (slots side table)",
}

_ZONE = re.compile(r"\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?\s*(?:Z|[+-]\d{2}(?::?\d{2})?|UTC|GMT)\s*$", re.IGNORECASE)
_UTC_WORD = re.compile(r"\s*(?:UTC|GMT)\s*$", re.IGNORECASE)


@dataclass
class ReadContext:
    """Options every reader sees, and what it reports back."""

    fmt: str
    batch_rows: int = 100_000
    status_map: Mapping[str, str] | None = None
    statement_timeout_s: float | None = None
    zone_less: int = 0        # timestamps read without a zone (taken as UTC)
    zoned: int = 0            # timestamps read with a zone
    numeric_clock: bool = False
    mapped: dict[str, str] | None = None
    ignored: tuple[str, ...] = ()


def missing(path: Path, fmt: str, column: str, required: str) -> QueryLogError:
    return QueryLogError(f"{path}: missing column '{column}' required by the {fmt} format (required: {required}; "
                         f"see {DOCS[fmt]}).")


def to_epoch_s(values: pd.Series, ctx: ReadContext) -> np.ndarray:
    """Timestamps (strings, datetimes or epoch seconds) as float epoch seconds; NaN when missing or unreadable."""
    import numpy as np
    import pandas as pd

    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        return pd.to_numeric(values, errors="coerce").to_numpy(dtype="float64")
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        stamps = values.dt.tz_convert("UTC")
        ctx.zoned += int(values.notna().sum())
    elif pd.api.types.is_datetime64_dtype(values):
        ctx.zone_less += int(values.notna().sum())
        stamps = values.dt.tz_localize("UTC")
    else:
        text = values.astype("string").fillna("").str.strip()
        zoned = text.str.contains(_ZONE).to_numpy(dtype=bool)
        ctx.zoned += int(zoned.sum())
        ctx.zone_less += int(((text != "").to_numpy(dtype=bool) & ~zoned).sum())
        text = text.str.replace(_UTC_WORD, "+00:00", regex=True).replace("", None)
        stamps = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
    return ((stamps - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).to_numpy(dtype="float64", na_value=np.nan)


def _numbers(df: pd.DataFrame, column: str | None) -> np.ndarray:
    import numpy as np
    import pandas as pd

    if column is None:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[column], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


def _text(df: pd.DataFrame, column: str | None):
    import pandas as pd

    if column is None:
        return pd.Series([None] * len(df), index=df.index, dtype="object")
    return df[column].astype("object").where(df[column].notna(), None)


def _lookup(columns, *names: str) -> str | None:
    """The actual name of the first of ``names`` present (case-insensitive)."""
    lower = {str(c).lower(): c for c in columns}
    for name in names:
        if name.lower() in lower:
            return lower[name.lower()]
    return None


# --- table formats: canonical, Snowflake, Redshift --------------------------------------------------------------

def table_batches(path: Path, batch_rows: int, strings: tuple[str, ...] = ()) -> Iterator[pd.DataFrame]:
    """A CSV or Parquet file in batches of about ``batch_rows`` rows (CSV: ``strings`` read as text)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    try:
        if path.suffix.lower() == ".parquet":
            for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
                yield batch.to_pandas()
            return
        header = csv_header(path)
        lower = {s.lower() for s in strings}
        types = {c: pa.string() for c in header if c.lower() in lower}
        reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=max(1 << 20, batch_rows * 256)),
                               parse_options=pcsv.ParseOptions(newlines_in_values=True),
                               convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True))
        for batch in reader:
            yield batch.to_pandas()
    except pa.ArrowException as exc:
        raise QueryLogError(f"{path}: not a readable CSV or Parquet file ({' '.join(str(exc).split())}).") from exc


def csv_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        return next(csv.reader(fh), [])


def table_columns(path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix.lower() == ".parquet":
        try:
            return list(pq.read_schema(path).names)
        except (OSError, pa.ArrowException) as exc:
            raise QueryLogError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())}).") from exc
    return csv_header(path)


_CANONICAL = ("sql", "start_s", "end_s", "arrival_s", "start", "end", "arrival", "duration_s", "status",
              "cluster_id", "cluster_size", "query_id", "template", "slo_s")
#: Columns of a sloctl log that an import computes itself (an exported log's copies are ignored).
_COMPUTED = ("latency_s", "sql_hash", "oversubscribed", "f_source", "cpu_budget", "source_query_id")

_STATUS = {"ok": "ok", "timeout": "timeout", "error": "error"}


def read_canonical(path: Path, ctx: ReadContext) -> Iterator[pd.DataFrame]:
    import numpy as np
    import pandas as pd

    columns = table_columns(path)
    need = "sql, status, and start_s+end_s (or ISO start+end, or either with duration_s)"
    for column in ("sql", "status"):
        if column not in columns:
            raise missing(path, ctx.fmt, column, need)
    numeric = "start_s" in columns or "end_s" in columns
    s_col, e_col, a_col = ("start_s", "end_s", "arrival_s") if numeric else ("start", "end", "arrival")
    has_d = "duration_s" in columns
    if not ((s_col in columns and (e_col in columns or has_d)) or (e_col in columns and has_d)):
        first = next(c for c in (s_col, e_col) if c not in columns)
        raise missing(path, ctx.fmt, first, need)
    ctx.numeric_clock = numeric
    extras = [c for c in columns if c not in _CANONICAL and c not in _COMPUTED and not c.startswith("f_")]
    ctx.ignored = tuple(c for c in columns if c in _COMPUTED or c.startswith("f_"))
    ctx.mapped = {c: c for c in columns if c in _CANONICAL}
    ctx.mapped.update({"query_id": "source_query_id"} if "query_id" in columns else {})
    status_map = {**_STATUS, **{k: v for k, v in (ctx.status_map or {}).items()}}
    strings = ("sql", "status", "cluster_id", "template", "query_id", "start", "end", "arrival", *extras)
    for df in table_batches(path, ctx.batch_rows, strings):
        times = {}
        for key, col in (("start", s_col), ("end", e_col), ("arrival", a_col)):
            if col not in df.columns:
                times[key] = np.full(len(df), np.nan)
            elif numeric:
                times[key] = _numbers(df, col)
            else:
                times[key] = to_epoch_s(df[col], ctx)
        if has_d:
            duration = _numbers(df, "duration_s")
            times["start"] = np.where(np.isnan(times["start"]), times["end"] - duration, times["start"])
            times["end"] = np.where(np.isnan(times["end"]), times["start"] + duration, times["end"])
        raw = df["status"].astype("string")
        status = raw.map(status_map, na_action="ignore")
        status = status.where(status.notna(), raw.str.strip().str.lower().map(_STATUS))
        refused = pd.Series(None, index=df.index, dtype="object")
        bad = status.isna()
        if bad.any():
            refused[bad] = "status not ok/timeout/error: " + raw[bad].fillna("<empty>").astype(str) + \
                " (pass --status-map)"
        out = pd.DataFrame({
            "sql": _text(df, "sql"), "arrival": times["arrival"], "start": times["start"], "end": times["end"],
            "status": status.astype("object"),
            "cluster_id": _text(df, "cluster_id" if "cluster_id" in df.columns else None),
            "cluster_size": _numbers(df, "cluster_size" if "cluster_size" in df.columns else None),
            "template": _text(df, "template" if "template" in df.columns else None),
            "source_query_id": _text(df, "query_id" if "query_id" in df.columns else None),
            "slo_s": _numbers(df, "slo_s" if "slo_s" in df.columns else None), "refused": refused,
        })
        for column in extras:
            out[f"x:{column}"] = df[column].to_numpy()
        yield out


#: Snowflake warehouse sizes -> credits per hour (the size unit of a Snowflake log).
SNOWFLAKE_SIZES = {"xsmall": 1, "small": 2, "medium": 4, "large": 8, "xlarge": 16, "2xlarge": 32, "xxlarge": 32,
                   "3xlarge": 64, "xxxlarge": 64, "4xlarge": 128, "5xlarge": 256, "6xlarge": 512}
#: Snowflake error codes that stop a statement before it ends: statement timeout, cancelled.
SNOWFLAKE_CENSORING = {"000630", "000604"}


def read_snowflake(path: Path, ctx: ReadContext) -> Iterator[pd.DataFrame]:
    import numpy as np
    import pandas as pd

    columns = table_columns(path)
    required = ("QUERY_TEXT", "START_TIME", "END_TIME", "EXECUTION_STATUS", "WAREHOUSE_NAME")
    col = {name: _lookup(columns, name) for name in (*required, "WAREHOUSE_SIZE", "CLUSTER_NUMBER", "QUERY_ID",
                                                       "QUERY_PARAMETERIZED_HASH", "EXECUTION_TIME", "ERROR_CODE",
                                                       "BYTES_SCANNED", "ERROR_MESSAGE")}
    for name in required:
        if col[name] is None:
            raise missing(path, ctx.fmt, name, ", ".join(required))
    ctx.mapped = {k: v for k, v in {
        "QUERY_TEXT": "sql", "START_TIME": "arrival_s", "END_TIME": "end_s",
        "EXECUTION_TIME": "start_s = end_s - EXECUTION_TIME (ms)", "EXECUTION_STATUS": "status",
        "ERROR_CODE": "status (000630, 000604 -> timeout)", "WAREHOUSE_NAME": "cluster_id",
        "CLUSTER_NUMBER": "cluster_id (#N)", "WAREHOUSE_SIZE": "cluster_size (credits/hour)",
        "QUERY_ID": "source_query_id", "QUERY_PARAMETERIZED_HASH": "template (sf-<hash>)",
        "BYTES_SCANNED": "bytes_scanned"}.items() if col[k] is not None}
    strings = ("QUERY_TEXT", "START_TIME", "END_TIME", "EXECUTION_STATUS", "WAREHOUSE_NAME", "WAREHOUSE_SIZE",
               "QUERY_ID", "QUERY_PARAMETERIZED_HASH", "ERROR_CODE", "ERROR_MESSAGE")
    for df in table_batches(path, ctx.batch_rows, strings):
        arrival = to_epoch_s(df[col["START_TIME"]], ctx)
        end = to_epoch_s(df[col["END_TIME"]], ctx)
        execution_ms = _numbers(df, col["EXECUTION_TIME"])
        start = np.where(np.isnan(execution_ms), arrival, np.maximum(arrival, end - execution_ms / 1000.0))
        state = df[col["EXECUTION_STATUS"]].astype("string").str.upper().str.strip()
        code = (_text(df, col["ERROR_CODE"]).astype("string").str.strip().str.replace(r"\.0$", "", regex=True)
                .str.zfill(6))
        status = pd.Series(np.where(state == "SUCCESS", "ok", "error"), index=df.index, dtype="object")
        status[code.isin(SNOWFLAKE_CENSORING).fillna(False).to_numpy()] = "timeout"
        refused = pd.Series(None, index=df.index, dtype="object")
        unfinished = ~state.isin(["SUCCESS", "FAIL", "FAILED_WITH_ERROR", "INCIDENT"]).fillna(False)
        refused[unfinished.to_numpy()] = "not finished (EXECUTION_STATUS " + state[unfinished].fillna("<empty>") + ")"
        warehouse = _text(df, col["WAREHOUSE_NAME"])
        refused[(warehouse.isna() & refused.isna()).to_numpy()] = "no warehouse (ran in cloud services only)"
        if col["CLUSTER_NUMBER"] is not None:
            number = _text(df, col["CLUSTER_NUMBER"]).astype("string").str.replace(r"\.0$", "", regex=True)
            warehouse = (warehouse.astype("string") + ("#" + number).fillna("")).astype("object")
        size = np.full(len(df), np.nan)
        if col["WAREHOUSE_SIZE"] is not None:
            key = df[col["WAREHOUSE_SIZE"]].astype("string").str.lower().str.replace(r"[^0-9a-z]", "", regex=True)
            size = key.map(SNOWFLAKE_SIZES).to_numpy(dtype="float64", na_value=np.nan)
        template = _text(df, col["QUERY_PARAMETERIZED_HASH"])
        out = pd.DataFrame({
            "sql": _text(df, col["QUERY_TEXT"]), "arrival": arrival, "start": start, "end": end, "status": status,
            "cluster_id": warehouse.where(warehouse.notna(), None), "cluster_size": size,
            "template": ("sf-" + template.astype("string")).astype("object").where(template.notna(), None),
            "source_query_id": _text(df, col["QUERY_ID"]), "slo_s": np.nan, "refused": refused,
        })
        if col["BYTES_SCANNED"] is not None:
            out["x:bytes_scanned"] = _numbers(df, col["BYTES_SCANNED"])
        if col["ERROR_MESSAGE"] is not None:
            out["x:error"] = _text(df, col["ERROR_MESSAGE"]).to_numpy()
        yield out


def read_redshift(path: Path, ctx: ReadContext, slots: Mapping[str, float] | None = None) -> Iterator[pd.DataFrame]:
    import numpy as np
    import pandas as pd

    columns = table_columns(path)
    required = ("query_text", "start_time", "end_time", "status")
    col = {name: _lookup(columns, name) for name in (*required, "query_id", "execution_time", "queue_time",
                                                       "generic_query_hash", "error_message", "compute_type",
                                                       "cluster_id")}
    for name in required:
        if col[name] is None:
            raise missing(path, ctx.fmt, name, ", ".join(required))
    ctx.mapped = {k: v for k, v in {
        "query_text": "sql", "start_time": "arrival_s", "end_time": "end_s",
        "execution_time": "start_s = end_s - execution_time (us)", "queue_time": "start_s = arrival_s + queue (us)",
        "status": "status (canceled -> timeout)", "generic_query_hash": "template (rs-<hash>)",
        "query_id": "source_query_id", "compute_type": "cluster_id (redshift-<compute_type>)",
        "cluster_id": "cluster_id"}.items() if col[k] is not None}
    strings = ("query_text", "start_time", "end_time", "status", "query_id", "generic_query_hash", "error_message",
               "compute_type", "cluster_id")
    for df in table_batches(path, ctx.batch_rows, strings):
        arrival = to_epoch_s(df[col["start_time"]], ctx)
        end = to_epoch_s(df[col["end_time"]], ctx)
        execution = _numbers(df, col["execution_time"]) / 1e6
        queue = _numbers(df, col["queue_time"]) / 1e6
        start = np.where(np.isnan(execution), arrival + np.nan_to_num(queue), np.maximum(arrival, end - execution))
        state = df[col["status"]].astype("string").str.strip().str.lower()
        message = _text(df, col["error_message"]).astype("string").str.lower()
        timed_out = message.str.contains("statement timeout|query timeout", regex=True).fillna(False)
        status = pd.Series(np.select([state == "success", (state == "canceled") | (state == "cancelled")
                                      | ((state == "failed") & timed_out), state == "failed"],
                                     ["ok", "timeout", "error"], "none"), index=df.index, dtype="object")
        refused = pd.Series(None, index=df.index, dtype="object")
        unfinished = (status == "none").to_numpy()
        refused[unfinished] = "not finished (status " + state[unfinished].fillna("<empty>") + ")"
        if col["cluster_id"] is not None:
            cluster = _text(df, col["cluster_id"])
        elif col["compute_type"] is not None:
            cluster = ("redshift-" + df[col["compute_type"]].astype("string").fillna("primary")).astype("object")
        else:
            cluster = pd.Series("redshift", index=df.index, dtype="object")
        template = _text(df, col["generic_query_hash"])
        out = pd.DataFrame({
            "sql": _text(df, col["query_text"]), "arrival": arrival, "start": start, "end": end, "status": status,
            "cluster_id": cluster, "cluster_size": np.nan,
            "template": ("rs-" + template.astype("string")).astype("object").where(template.notna(), None),
            "source_query_id": _text(df, col["query_id"]), "slo_s": np.nan, "refused": refused,
        })
        if slots is not None and col["query_id"] is not None:
            out["x:wlm_slot_count"] = out["source_query_id"].astype("string").map(slots).to_numpy(dtype="float64")
        if col["error_message"] is not None:
            out["x:error"] = _text(df, col["error_message"]).to_numpy()
        yield out


def read_slots(path: Path) -> dict[str, float]:
    """STL_WLM_QUERY: query id -> slot_count (the WLM slots the query held)."""
    import pandas as pd

    frames = list(table_batches(path, 1_000_000, ("query",)))
    df = pd.concat(frames) if frames else pd.DataFrame(columns=["query", "slot_count"])
    q, s = _lookup(df.columns, "query"), _lookup(df.columns, "slot_count")
    if q is None or s is None:
        raise missing(path, "redshift", "query" if q is None else "slot_count", "query, slot_count (STL_WLM_QUERY)")
    return dict(zip(df[q].astype(str), pd.to_numeric(df[s], errors="coerce"), strict=True))


# --- Trino QueryCompletedEvent, one JSON object per line ---------------------------------------------------------

_TRINO_CENSORING = {"EXCEEDED_TIME_LIMIT", "USER_CANCELED", "ADMINISTRATIVELY_KILLED", "ABANDONED_QUERY"}
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_ISO_DURATION = re.compile(r"^P(?:(\d+(?:\.\d+)?)D)?(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?"
                           r"(?:(-?\d+(?:\.\d+)?)S)?)?$")


def duration_s(value: Any) -> float:
    """A Java ``Duration`` as Jackson writes it (decimal seconds or ISO ``PT1.5S``), or airlift's ``1.50s``."""
    if value is None:
        return math.nan
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    match = _ISO_DURATION.match(text)
    if match and any(match.groups()):
        d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
        return d * 86400 + h * 3600 + m * 60 + s
    unit = re.match(r"^(-?\d+(?:\.\d+)?)\s*([a-z]+)$", text)
    if unit and unit.group(2) in _UNITS:
        return float(unit.group(1)) * _UNITS[unit.group(2)]
    try:
        return float(text)
    except ValueError:
        return math.nan


def read_trino(path: Path, ctx: ReadContext) -> Iterator[pd.DataFrame]:
    import numpy as np
    import pandas as pd

    ctx.mapped = {"metadata.query": "sql", "createTime": "arrival_s", "executionStartTime": "start_s",
                  "statistics.queuedTime": "start_s when executionStartTime is missing", "endTime": "end_s",
                  "metadata.queryState + failureInfo.errorCode.name": "status (EXCEEDED_TIME_LIMIT, USER_CANCELED, "
                  "ADMINISTRATIVELY_KILLED, ABANDONED_QUERY -> timeout)", "context.environment": "cluster_id",
                  "metadata.queryId": "source_query_id", "statistics.physicalInputBytes": "physical_input_bytes"}
    rows: list[dict] = []

    def flush() -> pd.DataFrame:
        df = pd.DataFrame(rows, columns=["sql", "created", "started", "ended", "queued", "state", "error", "env",
                                         "qid", "bytes", "message", "refused"])
        rows.clear()
        arrival = to_epoch_s(df["created"].astype("object"), ctx)
        start = to_epoch_s(df["started"].astype("object"), ctx)
        queued = df["queued"].map(duration_s).to_numpy(dtype="float64")
        start = np.where(np.isnan(start), arrival + np.nan_to_num(queued), start)
        state = df["state"].astype("string")
        status = np.where(state == "FINISHED", "ok",
                          np.where(df["error"].isin(_TRINO_CENSORING), "timeout", "error"))
        return pd.DataFrame({
            "sql": df["sql"], "arrival": arrival, "start": start, "end": to_epoch_s(df["ended"].astype("object"), ctx),
            "status": status.astype(object), "cluster_id": df["env"], "cluster_size": np.nan, "template": None,
            "source_query_id": df["qid"], "slo_s": np.nan, "refused": df["refused"],
            "x:physical_input_bytes": pd.to_numeric(df["bytes"], errors="coerce").to_numpy(dtype="float64"),
            "x:error": df["message"],
        })

    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                raise QueryLogError(f"{path}: line {number} is not JSON; the trino-events format is one "
                                    f"QueryCompletedEvent object per line (see {DOCS['trino-events']}).") from None
            if not isinstance(event, dict) or "metadata" not in event:
                raise missing(path, ctx.fmt, "metadata", "metadata, createTime, endTime (line "
                              f"{number})")
            meta, stats = event.get("metadata") or {}, event.get("statistics") or {}
            context, failure = event.get("context") or {}, event.get("failureInfo") or {}
            code = failure.get("errorCode") or {}
            state = meta.get("queryState")
            rows.append({"sql": meta.get("query"), "created": event.get("createTime"),
                         "started": event.get("executionStartTime"), "ended": event.get("endTime"),
                         "queued": stats.get("queuedTime"), "state": state,
                         "error": code.get("name") if isinstance(code, dict) else None,
                         "env": context.get("environment") or "trino", "qid": meta.get("queryId"),
                         "bytes": stats.get("physicalInputBytes"), "message": failure.get("failureMessage"),
                         "refused": None if state in ("FINISHED", "FAILED") else f"not finished (queryState {state})"})
            if len(rows) >= ctx.batch_rows:
                yield flush()
    if rows:
        yield flush()


# --- PostgreSQL csvlog --------------------------------------------------------------------------------------------

#: csvlog columns (PostgreSQL manual, "Using CSV-Format Log Output"): 23 up to 12, backend_type from 13,
#: leader_pid and query_id from 14.
PG_COLUMNS = ("log_time", "user_name", "database_name", "process_id", "connection_from", "session_id",
              "session_line_num", "command_tag", "session_start_time", "virtual_transaction_id", "transaction_id",
              "error_severity", "sql_state_code", "message", "detail", "hint", "internal_query",
              "internal_query_pos", "context", "query", "query_pos", "location", "application_name",
              "backend_type", "leader_pid", "query_id")
PG_WIDTHS = (23, 24, 26)
PG_TIME = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)? [A-Za-z0-9+\-:]+$")
#: Zone abbreviations log_timezone may print, as UTC offsets in hours (others: the row is refused).
PG_ZONES = {"UTC": 0, "GMT": 0, "Z": 0, "WET": 0, "WEST": 1, "BST": 1, "CET": 1, "CEST": 2, "EET": 2, "EEST": 3,
            "MSK": 3, "IST": 5.5, "JST": 9, "KST": 9, "AEST": 10, "AEDT": 11, "EST": -5, "EDT": -4, "CST": -6,
            "CDT": -5, "MST": -7, "MDT": -6, "PST": -8, "PDT": -7}
_PG_DURATION = re.compile(r"^duration: ([0-9.]+) ms(?:\s+(statement|execute [^:]*|parse [^:]*|bind [^:]*): (.*))?$",
                          re.DOTALL)
_PG_START = re.compile(r"^(?:statement|execute [^:]*): (.*)$", re.DOTALL)
PG_CANCELED = "57014"  # query_canceled: statement_timeout and pg_cancel_backend


def pg_width(path: Path) -> int | None:
    """The csvlog's column count when its first record looks like one, else None."""
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            first = next(csv.reader(fh), None)
    except (OSError, csv.Error):
        return None
    if first and len(first) in PG_WIDTHS and PG_TIME.match(first[0]):
        return len(first)
    return None


def _pg_epoch(text: str) -> float:
    import datetime as dt

    stamp, _, zone = text.rpartition(" ")
    offset = PG_ZONES.get(zone.upper())
    if offset is None:
        match = re.match(r"^([+-])(\d{1,2})(?::?(\d{2}))?$", zone)
        if not match:
            return math.nan
        offset = (int(match.group(2)) + int(match.group(3) or 0) / 60) * (-1 if match.group(1) == "-" else 1)
    try:
        naive = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f" if "." in stamp else "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return math.nan
    return naive.replace(tzinfo=dt.UTC).timestamp() - offset * 3600.0


def read_postgres(path: Path, ctx: ReadContext) -> Iterator[pd.DataFrame]:
    """Statement executions of a csvlog; lines that describe none are not rows (and not read)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as pcsv

    width = pg_width(path)
    if width is None:
        raise QueryLogError(f"{path}: not a PostgreSQL csvlog (expected {', '.join(map(str, PG_WIDTHS))} columns "
                            f"starting with log_time; see {DOCS['postgres-csvlog']}).")
    names = PG_COLUMNS[:width]
    ctx.mapped = {"message 'duration: N ms  statement: TEXT'": "sql; end_s = log_time, start_s = end_s - N ms",
                  "message 'statement: TEXT' + later 'duration: N ms' (same session_id)": "sql, start_s, end_s",
                  "error_severity ERROR, sql_state_code 57014": "status timeout (censored)",
                  "error_severity ERROR, other codes": "status error", "query": "sql of an ERROR row",
                  "session_id": "pairs start and end lines",
                  "backend_type": "only 'client backend' lines (13+; parallel workers' errors are not executions)",
                  "query_id": "template (pg-<query_id>), PostgreSQL 14+",
                  "log_time": "times (its zone abbreviation)"}
    reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(column_names=list(names),
                                                               block_size=max(1 << 20, ctx.batch_rows * 256)),
                           parse_options=pcsv.ParseOptions(newlines_in_values=True),
                           convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                               strings_can_be_null=False))
    pending: dict[str, tuple[float, str, str | None]] = {}   # session_id -> (log_time, text, query_id)
    # session_id -> its last ok row, held back from the batch: PostgreSQL can log a statement's
    # duration line and then its ERROR (a statement_timeout that fires as it finishes)
    last_ok: dict[str, dict] = {}
    rows: list[dict] = []

    def row(sql, start, end, status, qid, refused=None, error=None):
        qid = qid if qid not in (None, "", "0") else None
        rows.append({"sql": sql, "arrival": start, "start": start, "end": end, "status": status,
                     "cluster_id": "postgres", "cluster_size": math.nan,
                     "template": f"pg-{qid}" if qid else None, "source_query_id": None, "slo_s": math.nan,
                     "refused": refused, "x:error": error})
        return rows[-1]

    def unended(session: str) -> None:
        if session in pending:
            _, text, qid = pending.pop(session)
            row(text, math.nan, math.nan, None, qid, refused="statement without an end (no duration or ERROR line "
                "in its session)")

    try:
        for batch in reader:
            df = batch.to_pandas()
            message = df["message"]
            keep = (df["error_severity"] == "ERROR") | message.str.startswith(("duration:", "statement:", "execute "))
            if "backend_type" in df.columns:  # 13+: a parallel worker's or autovacuum's line is no execution
                keep &= df["backend_type"].isin(("client backend", ""))
            qids = df["query_id"] if "query_id" in df.columns else pd.Series("", index=df.index)
            for t, session, severity, code, msg, query, qid in zip(
                    df["log_time"][keep], df["session_id"][keep], df["error_severity"][keep],
                    df["sql_state_code"][keep], message[keep], df["query"][keep], qids[keep], strict=True):
                when = _pg_epoch(t)
                ctx.zoned += 1
                if severity == "ERROR":
                    started = pending.pop(session, None)
                    text = query or (started[1] if started else "")
                    qid = qid or (started[2] if started else None)
                    status = "timeout" if code == PG_CANCELED else "error"
                    ended = last_ok.pop(session, None)
                    if started is None and ended is not None and ended["sql"] == text and when - ended["end"] < 1.0:
                        ended.update(status=status, end=when, **{"x:error": msg})  # its duration, then its ERROR
                    elif started is not None:
                        row(text, started[0], when, status, qid, error=msg)
                    elif status == "timeout" and ctx.statement_timeout_s is not None:
                        row(text, when - ctx.statement_timeout_s, when, status, qid, error=msg)
                    else:
                        why = ("timeout without a start (no statement line; pass --statement-timeout-s)"
                               if status == "timeout" else "error without a start (no statement line in its session)")
                        row(text, math.nan, when, status, qid, refused=why, error=msg)
                    continue
                duration = _PG_DURATION.match(msg)
                if duration is None:                        # a start line: statement: / execute <name>:
                    start = _PG_START.match(msg)
                    if start is not None:
                        unended(session)
                        last_ok.pop(session, None)
                        pending[session] = (when, start.group(1), qid)
                    continue
                took = float(duration.group(1)) / 1000.0
                if duration.group(2) is not None:           # log_min_duration_statement: one complete line
                    if duration.group(2).startswith(("parse", "bind")):
                        continue                            # a protocol step, not an execution
                    unended(session)
                    last_ok[session] = row(duration.group(3), when - took, when, "ok", qid)
                elif session in pending:                    # the end of a logged statement
                    _, text, start_qid = pending.pop(session)
                    last_ok[session] = row(text, when - took, when, "ok", qid or start_qid)
                else:
                    row(None, when - took, when, "ok", qid, refused="duration without a statement (no statement "
                        "line in its session)")
            held = {id(r) for r in last_ok.values()}
            ready = [r for r in rows if id(r) not in held]
            if ready:
                yield pd.DataFrame(ready)
                rows[:] = [r for r in rows if id(r) in held]
    except pa.ArrowException as exc:
        raise QueryLogError(f"{path}: not a readable PostgreSQL csvlog ({' '.join(str(exc).split())}; see "
                            f"{DOCS['postgres-csvlog']}).") from exc
    for session in list(pending):
        unended(session)
    if rows:
        yield pd.DataFrame(rows)
