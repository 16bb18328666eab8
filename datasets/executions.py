"""Import engines' execution histories as query logs (``sloctl import executions``).

Formats: the canonical ``csv`` / ``parquet`` form, ``trino-events``
(QueryCompletedEvent JSON per line), ``snowflake`` (ACCOUNT_USAGE.QUERY_HISTORY),
``redshift`` (SYS_QUERY_HISTORY, optional STL_WLM_QUERY slots side table) and
``postgres-csvlog``; docs/querylog.md, "Importing executions", maps each one's
fields. Files are read in batches (pyarrow); each distinct text is hashed once
and each distinct fingerprint featurized once (sqlglot, in the format's
dialect); concurrency is summarised by a sweep over start/end events.

Every row read is accounted for: ``imported + censored + refused == read``,
where ``imported`` are ``ok`` / ``error`` rows, ``censored`` the ``timeout``
rows (stopped by a timeout or a cancellation: their latency is a lower bound)
and ``refused`` rows that cannot be placed on the clock or a cluster, counted
by reason with the first such row.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sloctl.core.errors import QueryLogError
from sloctl.datasets import _execution_formats as fm

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = ["DEFAULT_DIALECTS", "FORMATS", "ImportReport", "ImportResult", "detect_format", "import_executions",
           "parse_status_map", "read_sizes"]

FORMATS = ("csv", "parquet", "trino-events", "snowflake", "redshift", "postgres-csvlog")
#: sqlglot's dialect for each format's SQL.
DEFAULT_DIALECTS = {"csv": "duckdb", "parquet": "duckdb", "trino-events": "trino", "snowflake": "snowflake",
                    "redshift": "redshift", "postgres-csvlog": "postgres"}
NO_SIZE = "no cluster size (pass --sizes FILE or --size N)"


@dataclass(frozen=True)
class ImportReport:
    """What an import read and made of it (``imported + censored + refused == read``)."""

    format: str
    dialect: str
    files: tuple[str, ...]
    read: int
    imported: int
    censored: int
    refused: int
    refusals: dict[str, dict[str, Any]]
    columns_mapped: dict[str, str]
    columns_ignored: tuple[str, ...]
    timezone: str
    parse_failures: dict[str, int]
    feature_source: str
    concurrency: dict[str, dict[str, float]]
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ImportResult:
    """The validated log, the metadata to store with it, and the report."""

    log: pd.DataFrame
    metadata: dict[str, str]
    report: ImportReport


def detect_format(path: str | Path) -> str | None:
    """The format a file looks like (``redshift-slots`` for an STL_WLM_QUERY side table), or None."""
    import json

    path = Path(path)
    if path.suffix.lower() in (".json", ".jsonl", ".ndjson"):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                first = next((line for line in fh if line.strip()), "")
            event = json.loads(first)
        except (OSError, ValueError):
            return None
        ok = isinstance(event, dict) and {"metadata", "createTime", "endTime"} <= set(event)
        return "trino-events" if ok else None
    if fm.pg_width(path) is not None:
        return "postgres-csvlog"
    try:
        columns = {str(c).lower() for c in fm.table_columns(path)}
    except (OSError, QueryLogError, UnicodeError):
        return None
    if {"query_text", "execution_status", "warehouse_name"} <= columns:
        return "snowflake"
    if {"query_text", "start_time", "end_time", "status"} <= columns:
        return "redshift"
    if {"slot_count", "service_class", "query"} <= columns:
        return "redshift-slots"
    if "sql" in columns:
        return "parquet" if path.suffix.lower() == ".parquet" else "csv"
    if path.suffix.lower() != ".parquet":
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                head = fh.read(4096).lstrip()
            if head.startswith("{") and '"createTime"' in head and '"metadata"' in head:
                return "trino-events"
        except OSError:
            return None
    return None


def parse_status_map(text: str | Mapping[str, str] | None) -> dict[str, str]:
    """``SUCCESS=ok,FAILED_WITH_ERROR=error`` as a dict; every value must be ok, timeout or error."""
    if text is None:
        return {}
    pairs = text.items() if isinstance(text, Mapping) else (
        part.split("=", 1) if "=" in part else (part, "") for part in str(text).split(",") if part.strip())
    out = {}
    for key, value in pairs:
        if value.strip() not in ("ok", "timeout", "error"):
            raise QueryLogError(f"The 'status_map' parameter must map values to ok, timeout or error "
                                f"(like SUCCESS=ok,FAILED=error), got {key.strip()}={value.strip()!r}.")
        out[key.strip()] = value.strip()
    return out


def read_sizes(path: str | Path) -> list[tuple[str, float, float, int]]:
    """``--sizes FILE``: CSV ``cluster,from,to,size`` (times as seconds or timestamps; empty = open; ``*`` = any)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise QueryLogError(f"{path}: sizes file not found.")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, UnicodeError) as exc:
        raise QueryLogError(f"{path}: not a readable sizes CSV ({' '.join(str(exc).split())}).") from exc
    for column in ("cluster", "from", "to", "size"):
        if column not in df.columns:
            raise QueryLogError(f"{path}: missing column '{column}' of the sizes file (cluster,from,to,size; "
                                f"see {fm.DOCS['csv']}).")
    ctx = fm.ReadContext("csv")
    out = []
    for i, rec in df.iterrows():
        bounds = []
        for key, default in (("from", -math.inf), ("to", math.inf)):
            text = rec[key].strip()
            try:
                bounds.append(float(text) if text else default)
            except ValueError:
                bounds.append(float(fm.to_epoch_s(pd.Series([text]), ctx)[0]))
        try:
            size = int(rec["size"])
        except ValueError:
            size = 0
        if size < 1 or any(math.isnan(b) for b in bounds):
            raise QueryLogError(f"{path}: row {i}: size must be a whole number >= 1 and from/to times, got "
                                f"{dict(rec)!r}.")
        out.append((rec["cluster"].strip(), bounds[0], bounds[1], size))
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in [paths] if isinstance(paths, str | Path) else paths:
        p = Path(p)
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")
                          and f.suffix.lower() != ".md")
        elif p.is_file():
            out.append(p)
        else:
            raise QueryLogError(f"{p}: no such file or folder.")
    if not out:
        raise QueryLogError("no input files to import.")
    return out


class _Rows:
    """Accumulates normalised batches as compact arrays: texts and names become integer codes."""

    def __init__(self) -> None:
        self.texts: dict[str, int] = {}
        self.parts: list[dict[str, Any]] = []
        self.refusals: dict[str, dict[str, Any]] = {}
        self.read = 0

    def refuse(self, reasons: pd.Series, file: Path) -> None:
        import numpy as np

        at = np.flatnonzero(reasons.notna().to_numpy())
        for reason, count in reasons.iloc[at].value_counts(sort=False).items():
            entry = self.refusals.setdefault(str(reason), {"count": 0, "first_row": None, "file": None})
            if entry["first_row"] is None:
                entry["first_row"] = int(self.read + at[(reasons.iloc[at] == reason).to_numpy()][0])
                entry["file"] = str(file)
            entry["count"] += int(count)

    def add(self, b: pd.DataFrame, file: Path, sizes, size: int | None) -> None:
        import numpy as np
        import pandas as pd

        refused = b["refused"].astype("object").copy()
        sql = b["sql"]
        ok = refused.isna()
        no_text = ok & (sql.isna() | (sql.astype("string").str.strip() == "")).to_numpy()
        refused[no_text] = "no query text"
        start, end = b["start"].to_numpy(dtype="float64"), b["end"].to_numpy(dtype="float64")
        arrival = b["arrival"].to_numpy(dtype="float64")
        arrival = np.where(np.isnan(arrival), start, np.fmin(arrival, start))
        ok = refused.isna().to_numpy()
        refused[ok & ~(np.isfinite(start) & np.isfinite(end))] = "missing or unreadable start or end time"
        refused[refused.isna().to_numpy() & (end < start)] = "ends before it starts"
        refused[refused.isna().to_numpy() & b["status"].isna().to_numpy()] = "no status"
        cluster = b["cluster_id"].astype("object").where(b["cluster_id"].notna(), "default")
        cluster_size = b["cluster_size"].to_numpy(dtype="float64").copy()
        cluster_size[~(cluster_size >= 1)] = np.nan
        for name, lo, hi, n in sizes or ():
            hit = np.isnan(cluster_size) & (start >= lo) & (start < hi)
            if name != "*":
                hit &= (cluster == name).to_numpy()
            cluster_size[hit] = n
        if size is not None:
            cluster_size[np.isnan(cluster_size)] = size
        refused[refused.isna().to_numpy() & np.isnan(cluster_size)] = NO_SIZE
        self.refuse(refused, file)
        keep = refused.isna().to_numpy()
        self.read += len(b)
        if not keep.any():
            return
        codes, uniques = pd.factorize(sql[keep].astype("object"))
        lookup = np.array([self.texts.setdefault(t, len(self.texts)) for t in uniques], dtype=np.int64)
        extras = {c[2:]: b[c].to_numpy()[keep] for c in b.columns if c.startswith("x:")}
        self.parts.append({
            "text": lookup[codes], "arrival": arrival[keep], "start": start[keep], "end": end[keep],
            "status": b["status"].to_numpy()[keep], "cluster_id": cluster.to_numpy()[keep],
            "cluster_size": np.round(cluster_size[keep]).astype(np.int64),
            "template": b["template"].to_numpy()[keep], "source_query_id": b["source_query_id"].to_numpy()[keep],
            "slo_s": b["slo_s"].to_numpy(dtype="float64")[keep], **extras})


def concurrency_summary(cluster: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[str, dict[str, float]]:
    """Per cluster: queries, the most that ran at once, and the time-weighted mean over its busy span.

    One sweep over sorted start (+1) and end (-1) events; at equal times ends
    come first, as two queries overlap only when each starts before the other ends.
    """
    import numpy as np
    import pandas as pd

    out = {}
    codes, names = pd.factorize(cluster)
    for c, name in enumerate(names):
        s, e = start[codes == c], end[codes == c]
        times = np.concatenate([s, e])
        delta = np.concatenate([np.ones(len(s), np.int64), -np.ones(len(e), np.int64)])
        order = np.lexsort((delta, times))
        level = np.cumsum(delta[order])
        span = float(times.max() - times.min())
        busy = float(np.sum(level[:-1] * np.diff(times[order])))
        out[str(name)] = {"queries": int(len(s)), "max_concurrent": int(level.max()),
                          "mean_concurrent": busy / span if span > 0 else float(level.max())}
    return out


def _featurize(texts: list[str], dialect: str, catalog) -> tuple[np.ndarray, list[str], np.ndarray, list[str],
                                                                   np.ndarray, str]:
    """Per distinct text: fingerprint id; per fingerprint: feature matrix (PLAN_FEATURES order) and source."""
    import numpy as np

    from sloctl.datasets.plan_features import PLAN_FEATURES

    try:
        from sloctl.datasets import sql_features as sf
    except ImportError:
        sf = None
    fingerprint = sf.fingerprint if sf is not None else (lambda t: hashlib.sha256(t.encode()).hexdigest()[:16])
    fps: dict[str, int] = {}
    text_fp = np.array([fps.setdefault(fingerprint(t), len(fps)) for t in texts], dtype=np.int64)
    first_text = {}
    for i, f in enumerate(text_fp):
        first_text.setdefault(int(f), texts[i])
    matrix = np.full((len(fps), len(PLAN_FEATURES)), np.nan)
    if sf is None:
        return (text_fp, list(fps), matrix, ["none"] * len(fps), np.zeros(len(fps), dtype=bool),
                "none (sloctl.datasets.sql_features is not installed)")
    if isinstance(catalog, str | Path):
        catalog = sf.Catalog.from_csv(catalog)
    featurizer = sf.TextFeaturizer(dialect=dialect, catalog=catalog)
    index = {name: j for j, name in enumerate(PLAN_FEATURES)}
    sources, unparsed, failed = [], [], 0
    for f in range(len(fps)):
        features = featurizer(first_text[f])
        for name, value in features.items():
            if name in index:
                matrix[f, index[name]] = value
        before, failed = failed, int(getattr(featurizer, "failed", failed))
        unparsed.append(failed > before)
        try:
            sources.append(sf.feature_source(features, plan_engine=None))
        except ImportError:  # plan_features without ENGINE_PLAN_FEATURES (version 1)
            sources.append("none" if all(math.isnan(v) for v in features.values()) else "text")
    return text_fp, list(fps), matrix, sources, np.array(unparsed, dtype=bool), "sql text" + (
        " + catalog" if catalog is not None else "")


def import_executions(paths: str | Path | Iterable[str | Path], *, format: str | None = None,  # noqa: A002
                      dialect: str | None = None, catalog=None, sizes=None, size: int | None = None,
                      status_map: str | Mapping[str, str] | None = None, statement_timeout_s: float | None = None,
                      slots: str | Path | None = None, batch_rows: int = 200_000,
                      progress: Callable[[int, str], None] | None = None) -> ImportResult:
    """Read execution histories and map them onto the query-log schema.

    Args:
        paths: files or folders (their files, sorted); all of one format, plus
            at most one Redshift slots side table.
        format: one of :data:`FORMATS`; None detects it from the first file.
        dialect: sqlglot dialect of the texts (default: the format's).
        catalog: table statistics, a CSV path or a ``sql_features.Catalog``.
        sizes: ``cluster,from,to,size`` CSV path, or its rows (:func:`read_sizes`).
        size: the size of every cluster a row or ``sizes`` does not size.
        status_map: canonical form: source status values -> ok/timeout/error.
        statement_timeout_s: PostgreSQL: start of a timed-out statement with no
            logged start is its end minus this.
        slots: Redshift STL_WLM_QUERY export (query, slot_count).
        batch_rows: rows per batch read.
        progress: ``(rows_read, file)`` after every batch.

    Returns:
        The validated log (rows in arrival order, clock at the first arrival),
        its file metadata and the report.

    Raises:
        QueryLogError: a missing file, an unknown or mismatched format, a
            missing required column (naming it and the format's document), or
            no usable row.
    """
    import numpy as np
    import pandas as pd

    from sloctl.datasets.plan_features import PLAN_FEATURES, sql_hash
    from sloctl.datasets.querylog import validate_log

    files = _files(paths)
    detected = {f: detect_format(f) for f in files}
    side = [f for f in files if detected[f] == "redshift-slots"]
    files = [f for f in files if detected[f] != "redshift-slots"]
    if not files:
        raise QueryLogError("no execution log among the inputs (only a Redshift slots side table).")
    if format is not None and format not in FORMATS:
        raise QueryLogError(f"The 'format' parameter must be one of {', '.join(FORMATS)}, got {format!r}.")
    fmt = format or detected[files[0]]
    if fmt is None:
        raise QueryLogError(f"{files[0]}: cannot tell its format; pass --format ({', '.join(FORMATS)}; see "
                            f"{fm.DOCS['csv']}).")
    for f in files:
        other = detected[f]
        same = other == fmt or {other, fmt} <= {"csv", "parquet"}
        if other is not None and not same:
            raise QueryLogError(f"{f}: this looks like a {fm.NAMES[other]}, not a {fm.NAMES[fmt]}; pass "
                                f"--format {other}.")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise QueryLogError(f"The 'size' parameter must be a whole number >= 1, got {size!r}.")
    if isinstance(sizes, str | Path):
        sizes = read_sizes(sizes)
    slot_map = fm.read_slots(Path(slots)) if slots is not None else (fm.read_slots(side[0]) if side else None)
    dialect = dialect or DEFAULT_DIALECTS[fmt]
    ctx = fm.ReadContext(fmt, batch_rows=batch_rows, status_map=parse_status_map(status_map),
                         statement_timeout_s=statement_timeout_s)
    rows = _Rows()
    for f in files:
        if fmt in ("csv", "parquet"):
            batches = fm.read_canonical(f, ctx)
        elif fmt == "snowflake":
            batches = fm.read_snowflake(f, ctx)
        elif fmt == "redshift":
            batches = fm.read_redshift(f, ctx, slot_map)
        elif fmt == "trino-events":
            batches = fm.read_trino(f, ctx)
        else:
            batches = fm.read_postgres(f, ctx)
        for batch in batches:
            rows.add(batch, f, sizes, size)
            if progress is not None:
                progress(rows.read, str(f))
    refused = sum(r["count"] for r in rows.refusals.values())
    if not rows.parts:
        why = "; ".join(f"{k}: {v['count']}" for k, v in rows.refusals.items()) or "no rows"
        raise QueryLogError(f"{', '.join(map(str, files))}: no usable execution rows (read {rows.read}; {why}).")
    cols = {}
    for key in list(rows.parts[0]):     # one column at a time, freeing the batches' copies as it goes
        cols[key] = np.concatenate([p.pop(key) for p in rows.parts])
    rows.parts.clear()
    order = np.argsort(cols["arrival"], kind="stable")
    for key in cols:
        cols[key] = cols[key][order]
    origin = float(cols["arrival"][0])
    texts = list(rows.texts)
    if isinstance(catalog, str | Path):  # read once: it featurizes the texts and travels in the log's metadata
        from sloctl.datasets.sql_features import load_catalog

        catalog = load_catalog(catalog)
    text_fp, fps, matrix, sources, unparsed, feature_source = _featurize(texts, dialect, catalog)
    text_hash = np.array([sql_hash(t) for t in texts], dtype=object)
    row_fp = text_fp[cols["text"]]
    own = pd.Series(cols["template"], dtype="object")
    fp_names = np.array([f"fp-{f}" for f in fps], dtype=object)
    # a row without its engine's template (a PostgreSQL statement cancelled before it was parsed has
    # query_id 0) takes the one the same fingerprint carries most often elsewhere in the log
    named = own.notna().to_numpy()
    if named.any() and not named.all():
        carried = (pd.DataFrame({"fp": row_fp[named], "template": own.to_numpy()[named]})
                   .value_counts().reset_index().drop_duplicates("fp").set_index("fp")["template"])
        for fp, name in carried.items():
            fp_names[fp] = name
    template = np.where(named, own.to_numpy(), fp_names[row_fp])
    arrival = cols["arrival"] - origin
    start, end = cols["start"] - origin, cols["end"] - origin
    log = pd.DataFrame({
        "query_id": np.arange(len(arrival), dtype=np.int64), "template": template,
        "sql_hash": text_hash[cols["text"]], "cluster_id": cols["cluster_id"], "cluster_size": cols["cluster_size"],
        "arrival_s": arrival, "start_s": start, "end_s": end, "latency_s": end - arrival,
        "status": cols["status"], "slo_s": cols["slo_s"], "oversubscribed": False,
        **{name: matrix[row_fp, j] for j, name in enumerate(PLAN_FEATURES)}})
    log["f_source"] = np.array(sources, dtype=object)[row_fp]
    failures = {"fingerprints": int(unparsed.sum()), "rows": int(unparsed[row_fp].sum())}
    if pd.Series(cols["source_query_id"]).notna().any():
        log["source_query_id"] = cols["source_query_id"]
    for key in cols:
        if key not in ("text", "arrival", "start", "end", "status", "cluster_id", "cluster_size", "template",
                       "source_query_id", "slo_s"):
            values = pd.Series(cols[key])
            numeric = pd.to_numeric(values, errors="coerce")
            log[key] = numeric if numeric.notna().sum() == values.notna().sum() else values
    log = validate_log(log, source=f"{fmt} import")
    censored = int((log["status"] == "timeout").sum())
    if ctx.numeric_clock:
        zone = "times are seconds on the log's own clock; no time zone applies"
    elif ctx.zone_less:
        zone = f"{ctx.zone_less} timestamps had no time zone and were taken as UTC"
    else:
        zone = "every timestamp carried its zone; normalised to UTC"
    concurrency = concurrency_summary(log["cluster_id"].to_numpy(), log["start_s"].to_numpy(),
                                      log["end_s"].to_numpy())
    notes = ("canonical: source columns of a sloctl log (latency_s, sql_hash, f_*) are recomputed, not kept",) \
        if ctx.ignored else ()
    report = ImportReport(
        format=fmt, dialect=dialect, files=tuple(map(str, files + side)), read=rows.read,
        imported=len(log) - censored, censored=censored, refused=refused, refusals=rows.refusals,
        columns_mapped=dict(ctx.mapped or {}), columns_ignored=ctx.ignored, timezone=zone,
        parse_failures=failures, feature_source=feature_source, concurrency=concurrency, notes=notes)
    assert report.imported + report.censored + report.refused == report.read, report
    import datetime as dt
    import json

    time_origin = ("0 (the log's own clock)" if ctx.numeric_clock else
                   dt.datetime.fromtimestamp(origin, dt.UTC).isoformat())
    metadata = {"source": json.dumps([{"path": str(f), "sha256": _sha256(f)} for f in files + side]),
                "import_format": fmt, "dialect": dialect, "time_origin": time_origin,
                "import_counts": json.dumps({"read": report.read, "imported": report.imported,
                                             "censored": censored, "refused": refused}),
                "feature_source": feature_source}
    if catalog is not None:  # what a model trained on this log needs to featurize new SQL the same way
        from sloctl.datasets.sql_features import CATALOG_KEY, catalog_metadata

        metadata[CATALOG_KEY] = catalog_metadata(catalog)
    return ImportResult(log=log, metadata=metadata, report=report)
