"""TPC-H and TPC-DS databases generated offline, and their query templates.

DuckDB's ``tpch`` / ``tpcds`` extensions come from the PyPI wheels
``duckdb-extension-tpch`` / ``duckdb-extension-tpcds``, which match only
``duckdb==1.5.5``; loading them from disk needs no network. A database is
generated once per (benchmark, scale factor) into ``data_dir`` and reused;
generation writes a temporary file and renames it, so an interrupted run
never leaves a half-built database behind.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sloctl.core.errors import WorkloadError
from sloctl.datasets.plan_features import PlanFeaturizer, sql_hash

__all__ = ["BENCHMARKS", "Template", "database_path", "ensure_database", "load_templates"]

#: benchmark -> (extension name, generator call, query-list function)
BENCHMARKS = {
    "tpch": ("tpch", "dbgen", "tpch_queries"),
    "tpcds": ("tpcds", "dsdgen", "tpcds_queries"),
}


@dataclass(frozen=True)
class Template:
    """One query template: a stable name (``tpch-q05``) and its SQL text."""

    name: str
    sql: str


def _check_benchmark(benchmark: str) -> None:
    if benchmark not in BENCHMARKS:
        raise WorkloadError(
            f"The 'benchmark' parameter must be one of {', '.join(BENCHMARKS)}, got {benchmark!r}."
        )


def _extension_path(name: str) -> Path:
    import importlib

    import duckdb

    module = importlib.import_module(f"duckdb_extension_{name}")
    path = (
        Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}"
        / f"{name}.duckdb_extension"
    )
    if not path.is_file():
        raise WorkloadError(
            f"The DuckDB '{name}' extension for duckdb {duckdb.__version__} is not installed "
            f"(looked for {path}); install duckdb==1.5.5 with duckdb-extension-{name}==1.5.5."
        )
    return path


def _connect_with_extension(benchmark: str, database: str = ":memory:"):
    import duckdb

    ext, _, _ = BENCHMARKS[benchmark]
    con = duckdb.connect(database)
    con.execute(f"LOAD '{_extension_path(ext)}'")
    return con


def database_path(benchmark: str, scale_factor: float, data_dir: str | Path) -> Path:
    """Where the database for ``benchmark`` at ``scale_factor`` lives."""
    _check_benchmark(benchmark)
    return Path(data_dir) / f"{benchmark}_sf{scale_factor:g}.duckdb"


def ensure_database(
    benchmark: str, scale_factor: float, data_dir: str | Path, *, log=print
) -> Path:
    """Generate the database unless it already exists; return its path.

    Args:
        benchmark: ``tpch`` or ``tpcds``.
        scale_factor: TPC scale factor (> 0; 1 is about 1 GB of raw data).
        data_dir: folder that holds generated databases.
        log: where to report progress (``None`` for silence).
    """
    _check_benchmark(benchmark)
    if not scale_factor > 0:
        raise WorkloadError(
            f"The 'scale_factor' parameter must be > 0, got {scale_factor!r}."
        )
    path = database_path(benchmark, scale_factor, data_dir)
    if path.is_file():
        if log:
            log(f"Reusing {benchmark} SF {scale_factor:g} database at {path}.")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _, generator, _ = BENCHMARKS[benchmark]
    if log:
        log(f"Generating {benchmark} SF {scale_factor:g} into {path} ...")
    started = time.monotonic()
    try:
        con = _connect_with_extension(benchmark, str(tmp))
        try:
            con.execute(f"CALL {generator}(sf={float(scale_factor)})")
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
            if leftover.exists():
                leftover.unlink()
    if log:
        log(f"Generated {path} in {time.monotonic() - started:.1f} s.")
    return path


@functools.cache
def _templates(benchmark: str) -> tuple[Template, ...]:
    _, _, query_fn = BENCHMARKS[benchmark]
    con = _connect_with_extension(benchmark)
    try:
        rows = con.execute(f"SELECT query_nr, query FROM {query_fn}() ORDER BY query_nr").fetchall()
    finally:
        con.close()
    return tuple(Template(name=f"{benchmark}-q{nr:02d}", sql=sql.strip()) for nr, sql in rows)


def load_templates(benchmark: str, only: list[str] | None = None) -> list[Template]:
    """The benchmark's query templates (22 for TPC-H, 99 for TPC-DS).

    Args:
        benchmark: ``tpch`` or ``tpcds``.
        only: keep just these template names (e.g. ``["tpch-q01"]``).
    """
    _check_benchmark(benchmark)
    templates = list(_templates(benchmark))
    if only:
        known = {t.name for t in templates}
        unknown = [name for name in only if name not in known]
        if unknown:
            raise WorkloadError(
                f"The 'templates' parameter names unknown template {unknown[0]!r} "
                f"(expected names like {templates[0].name!r})."
            )
        templates = [t for t in templates if t.name in set(only)]
    return templates


def template_frame(benchmark: str, scale_factor: float, data_dir: str | Path,
                   arrivals: list[tuple[str, float]], cluster_size: int):
    """A log-shaped frame of templates arriving at given offsets on one cluster.

    Plan features come from EXPLAIN on the benchmark's database (generated if
    missing). Used to ask a model about a hypothetical set of queries.

    Args:
        arrivals: ``(template name, arrival offset in seconds)`` pairs.
        cluster_size: the cluster they share.
    """
    import math

    import duckdb
    import pandas as pd


    by_name = {t.name: t for t in load_templates(benchmark, sorted({name for name, _ in arrivals}))}
    db = ensure_database(benchmark, scale_factor, data_dir, log=None)
    con = duckdb.connect(str(db), read_only=True)
    try:
        featurize = PlanFeaturizer(con)
        zero = min(offset for _, offset in arrivals)
        rows = [{"query_id": i, "template": name, "sql_hash": sql_hash(by_name[name].sql), "cluster_id": "what-if",
                 "cluster_size": cluster_size, "arrival_s": offset - zero, "start_s": offset - zero,
                 "end_s": math.nan, "status": "ok", "slo_s": math.nan, "oversubscribed": False,
                 **featurize(by_name[name].sql)} for i, (name, offset) in enumerate(arrivals)]
    finally:
        con.close()
    return pd.DataFrame(rows)
