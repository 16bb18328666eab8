"""Merge query logs of separate runs into one log a model can train on.

Every run has its own clock (0 = the start of its collection), its own
``query_id`` numbering and its own cluster names, so two runs cannot simply be
stacked: ids would clash, and the latency models, which find a query's
neighbours by overlapping ``[start_s, end_s]`` intervals on the same
``cluster_id`` (:func:`sloctl.datasets.interactions.neighbour_lists`,
:func:`sloctl.datasets.analysis.overlap_counts`), would pair queries of
different runs that never met. :func:`merge_logs` keeps the runs apart three
ways:

* ``query_id`` is renumbered ``0 .. n-1`` over the merged log, run after run,
  keeping each run's own id order (the neighbour code breaks arrival ties by
  id);
* each run's ``arrival_s``, ``start_s`` and ``end_s`` are shifted by one
  offset so that its first arrival comes ``gap_s`` after the previous runs'
  last ``end_s`` (``latency_s`` is a difference and stays as it was);
* each ``cluster_id`` gets the run's prefix (``r0/``, ``r1/``, ...), so two
  runs' clusters can never be confused even by code that ignores time.

A ``run`` column (the input's index) is added, replacing one the input may
already have (a merged log merged again keeps its old runs in the nested
cluster prefixes, ``r1/r0/...``), and the metadata records every input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sloctl.core.errors import QueryLogError
from sloctl.datasets.plan_features import PLAN_FEATURE_VERSION, plan_feature_version_on_read
from sloctl.datasets.querylog import read_log, read_metadata, validate_log

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DEFAULT_GAP_S", "merge_logs", "run_prefix"]

#: Idle seconds between one run's last ``end_s`` and the next run's first arrival.
DEFAULT_GAP_S = 60.0

#: Metadata keys the merge writes itself; never copied from the inputs.
_OWN_KEYS = ("schema_version", "plan_feature_version", "merged_from", "merge_gap_s")


def run_prefix(run: int) -> str:
    """The ``cluster_id`` prefix of run ``run`` in a merged log (``r0/``, ``r1/``, ...)."""
    return f"r{run}/"


def merge_logs(
    logs: Sequence[str | Path | pd.DataFrame],
    *,
    gap_s: float = DEFAULT_GAP_S,
    metadata: Sequence[Mapping[str, str] | None] | None = None,
) -> tuple[pd.DataFrame, dict[str, str]]:
    """Merge the query logs of several runs, laid end to end, into one valid log.

    Args:
        logs: the runs, in order: paths of query logs (read and validated
            with :func:`~sloctl.datasets.querylog.read_log`, their metadata
            with :func:`~sloctl.datasets.querylog.read_metadata`) or
            DataFrames.
        gap_s: idle seconds between one run's last ``end_s`` and the next
            run's first ``arrival_s``.
        metadata: per input, its metadata (``None`` entries, or no list:
            a path's file metadata, nothing for a DataFrame).

    Returns:
        ``(log, metadata)``: the validated merged log (every input row, in
        input order, with the ``run`` column) and the key/value pairs to
        store with it (:func:`~sloctl.datasets.querylog.write_log`):
        ``plan_feature_version``, ``merge_gap_s``, ``merged_from`` (a JSON
        list with each input's ``run``, ``path``, ``rows``, ``offset_s``,
        ``first_query_id``, ``cluster_prefix`` and original ``metadata``) and
        every other key that all inputs share with one value.

    Raises:
        QueryLogError: no inputs, an input that is missing or breaks the
            schema, or inputs whose plan features have different versions
            (version 1 reads as version 2 and merges with it).
        ValueError: ``gap_s`` is negative or not finite, or ``metadata`` does
            not have one entry per input.
    """
    import numpy as np
    import pandas as pd

    if not isinstance(gap_s, int | float) or not math.isfinite(gap_s) or gap_s < 0:
        raise ValueError(f"The 'gap_s' parameter of merge_logs must be a finite number >= 0, got {gap_s!r}.")
    if len(logs) == 0:
        raise QueryLogError("The 'logs' parameter of merge_logs must name at least one query log, got none.")
    if metadata is not None and len(metadata) != len(logs):
        raise ValueError(f"The 'metadata' parameter of merge_logs must have one entry per log ({len(logs)}), "
                         f"got {len(metadata)}.")

    runs: list[tuple[pd.DataFrame, dict[str, str], str | None, str]] = []
    for index, item in enumerate(logs):
        given = None if metadata is None else metadata[index]
        if isinstance(item, pd.DataFrame):
            source = f"log {index}"
            frame, meta, path = validate_log(item, source=source), dict(given or {}), None
        else:
            path = str(item)
            source = path
            frame = read_log(path)
            meta = dict(given) if given is not None else read_metadata(path)
        runs.append((frame, meta, path, source))

    # a version-1 log reads as version 2 (validate_log adds its text/catalog columns as NaN)
    versions = [plan_feature_version_on_read(meta.get("plan_feature_version", PLAN_FEATURE_VERSION))
                for _, meta, _, _ in runs]
    for (_, _, _, source), version in zip(runs, versions, strict=True):
        if version != versions[0]:
            raise QueryLogError(
                f"{source}: plan features are version {version!r}, but {runs[0][3]} has version "
                f"{versions[0]!r}; merge only logs with one plan-feature version (recollect the older ones).")

    parts: list[pd.DataFrame] = []
    inputs: list[dict[str, object]] = []
    first_id = 0
    previous_end_s: float | None = None
    for run, (frame, meta, path, _) in enumerate(runs):
        part = frame.copy()
        if len(part) and previous_end_s is not None:
            offset_s = previous_end_s + gap_s - float(part["arrival_s"].min())
        else:
            offset_s = 0.0
        for column in ("arrival_s", "start_s", "end_s"):
            part[column] = part[column] + offset_s
        # rank of the old id within the run: unique ids, the run's own order kept
        rank = np.argsort(np.argsort(part["query_id"].to_numpy(), kind="stable"), kind="stable")
        part["query_id"] = first_id + rank.astype(np.int64)
        part["cluster_id"] = run_prefix(run) + part["cluster_id"]
        part["run"] = np.int64(run)
        if len(part):
            end_s = float(part["end_s"].max())
            previous_end_s = end_s if previous_end_s is None else max(previous_end_s, end_s)
        inputs.append({"run": run, "path": path, "rows": len(part), "offset_s": offset_s,
                       "first_query_id": first_id, "cluster_prefix": run_prefix(run), "metadata": meta})
        first_id += len(part)
        parts.append(part)

    merged = validate_log(pd.concat(parts, ignore_index=True), source="merged log")
    merged["run"] = merged["run"].astype("int64")
    shared = {key: value for key, value in runs[0][1].items()
              if key not in _OWN_KEYS and all(meta.get(key) == value for _, meta, _, _ in runs[1:])}
    out_meta = {**shared, "plan_feature_version": versions[0], "merge_gap_s": json.dumps(gap_s),
                "merged_from": json.dumps(inputs)}
    return merged, out_meta
