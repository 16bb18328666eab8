"""The gateway's query log: one row per attempt, in the schema of :mod:`sloctl.datasets.querylog`.

Rows are kept in memory and rewritten atomically to one Parquet file per
gateway run (``gateway-<start>-<id>.parquet`` in ``log_dir``), so that
``sloctl train iconq --log LOG_DIR`` reads every run. Plan features come
from the router's template table, else from ``EXPLAIN`` of the text (once
per text, when the log is read or written, never on a query's path). The
file's metadata names the database's benchmark and scale factor when its
name says them (``tpch_sf1.duckdb``): the provenance of a model trained on it.
"""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path
from typing import Any

from sloctl.datasets.plan_features import PLAN_FEATURES

__all__ = ["AttemptLog", "db_source"]


def db_source(db_path: Path) -> dict[str, str]:
    """``benchmark`` and ``scale_factor`` of a database named as ``sloctl warehouse generate`` names it (or none)."""
    match = re.match(r"^(tpch|tpcds)_sf([0-9.]+)\.duckdb$", Path(db_path).name)
    return {} if match is None else {"benchmark": match.group(1), "scale_factor": match.group(2)}


class AttemptLog:
    """Attempts as query-log rows; ``path`` is ``None`` when nothing is written (no ``log_dir``).

    Args:
        db_path: the database the clusters serve (``EXPLAIN`` runs on it, read-only).
        log_dir: where the file goes, or ``None``.
        stamp: the gateway's start, in the file name.
    """

    def __init__(self, db_path: str | Path, log_dir: str | Path | None, stamp: str) -> None:
        self.db_path = Path(db_path)
        self.path = None if log_dir is None else Path(log_dir) / f"gateway-{stamp}-{uuid.uuid4().hex[:6]}.parquet"
        self.rows: list[dict[str, Any]] = []
        self.dirty = False
        self._features: dict[str, dict[str, float]] = {}
        self._rows_lock = threading.Lock()
        self._file_lock = threading.Lock()  # one writer of the file (and one EXPLAIN connection) at a time

    def append(self, row: dict[str, Any], sql: str) -> None:
        """One attempt; ``sql`` is kept to plan it later if the template table does not know it."""
        with self._rows_lock:
            self.rows.append({**row, "_sql": sql})
            self.dirty = True

    def __len__(self) -> int:
        return len(self.rows)

    def _fill_features(self, rows: list[dict[str, Any]], table: Any) -> None:
        con = featurize = None
        try:
            for row in rows:
                features = self._features.get(row["sql_hash"])
                if features is None and table is not None:
                    match = table.loc[table["template"] == row["template"]]
                    if len(match):
                        features = {name: float(match[name].iloc[0]) for name in PLAN_FEATURES}
                if features is None:
                    if con is None:
                        import duckdb

                        from sloctl.datasets.plan_features import PlanFeaturizer

                        con = duckdb.connect(str(self.db_path), read_only=True)
                        featurize = PlanFeaturizer(con)
                    features = featurize(row["_sql"])
                self._features[row["sql_hash"]] = features
                row.update(features)
        finally:
            if con is not None:
                con.close()

    def frame(self, table: Any = None) -> Any:
        """The rows so far as a validated query log (a DataFrame); ``table``: the router's template table."""
        import pandas as pd

        from sloctl.datasets.querylog import COLUMNS, validate_log

        with self._rows_lock:
            rows = [dict(row) for row in self.rows]
        with self._file_lock:
            self._fill_features(rows, table)
        rows = [{k: v for k, v in row.items() if k != "_sql"} for row in rows]
        return validate_log(pd.DataFrame(rows, columns=None if rows else list(COLUMNS)), source="gateway query log")

    def flush(self, table: Any = None, *, router: str = "") -> Path | None:
        """Rewrite the file atomically; ``None`` without a ``log_dir`` or rows."""
        from sloctl.datasets.querylog import write_log

        if self.path is None or not self.rows:
            return None
        self.dirty = False
        frame = self.frame(table)
        with self._file_lock:
            return write_log(frame, self.path, metadata={"source": "sloctl gateway", "workload": "gateway",
                                                         "router": router, **db_source(self.db_path)})
