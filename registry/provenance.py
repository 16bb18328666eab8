"""Provenance: what a model or policy was trained or optimised on, recorded and compared.

A latency model is only as good as the data it saw: a Stage trained on TPC-H
at scale factor 0.1 predicts SF 0.1 latencies, and a model never shown a
size-4 cluster extrapolates there. :class:`Provenance` records, for the log a
model was trained on,

* ``sources`` — the (benchmark, scale factor) pairs of its rows, each written
  ``"tpch@0.1"`` (``"unknown@unknown"`` for rows whose log did not say: a
  synthetic or imported log);
* ``cluster_sizes`` — the cluster sizes its rows ran on;
* ``log_hash`` and ``run_hashes`` — :func:`~sloctl.training.pipeline.data_hash`
  of the whole log and of each input run of a merged log;
* ``logs`` — the paths it was read from.

It travels as MLflow run tags (``provenance.*``, :meth:`Provenance.to_tags`)
and inside the model bundle (``meta.json`` ``provenance``). The champion gate
(:func:`sloctl.registry.store.register`) uses :meth:`Provenance.lacks` to
refuse a candidate that does not cover what the champion was trained on, and
:func:`row_sources` to score both only on rows of the champion's provenance;
``sloctl predict``, ``evaluate`` and ``serve`` use :meth:`Provenance.mismatch`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PREFIX", "UNKNOWN", "Provenance", "log_provenance", "row_sources", "source_key"]

#: Prefix of the MLflow run tags that hold a provenance.
PREFIX = "provenance."
#: The benchmark or scale factor of rows whose log did not record it.
UNKNOWN = "unknown"


def source_key(benchmark: Any, scale_factor: Any) -> str:
    """``"tpch@0.1"``: one benchmark and scale factor, the scale factor written as ``%g`` (``1.0`` is ``1``)."""
    bench = str(benchmark).strip().lower() if benchmark not in (None, "") else UNKNOWN
    try:
        sf = format(float(scale_factor), "g")
    except (TypeError, ValueError):
        sf = UNKNOWN
    return f"{bench}@{sf}"


def _describe_source(key: str) -> str:
    bench, _, sf = key.partition("@")
    if bench == UNKNOWN and sf == UNKNOWN:
        return "an unrecorded benchmark"
    return f"{bench} SF {sf}" if sf != UNKNOWN else f"{bench} (scale factor not recorded)"


def row_sources(log: pd.DataFrame, metadata: Mapping[str, str] | None = None) -> np.ndarray:
    """The (benchmark, scale factor) of every row of ``log`` as :func:`source_key` strings.

    A log file's metadata (``benchmark``, ``scale_factor``, written by ``sloctl
    collect``) applies to all its rows; a merged log (``sloctl log merge``, or
    several ``--log``) says it per input run (``merged_from``, rows by the
    ``run`` column).
    """
    metadata = dict(metadata or {})
    default = source_key(metadata.get("benchmark"), metadata.get("scale_factor"))
    out = np.full(len(log), default, dtype=object)
    merged = metadata.get("merged_from")
    if merged and "run" in log.columns:
        try:
            inputs = json.loads(merged)
        except ValueError:
            inputs = []
        runs = log["run"].to_numpy()
        for item in inputs:
            meta = item.get("metadata") or {}
            out[runs == item.get("run")] = source_key(meta.get("benchmark"), meta.get("scale_factor"))
    return out


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(sorted({int(s) for s in text.split(",") if s.strip()}))


@dataclass(frozen=True)
class Provenance:
    """What a model was trained on (see the module docstring).

    Attributes:
        sources: sorted ``"benchmark@sf"`` keys of the training log's rows.
        cluster_sizes: sorted cluster sizes of its rows.
        log_hash: data hash of the whole log ("" when not known).
        run_hashes: data hash of each input run of a merged log.
        logs: the log paths it was read from ("" when not known).
        feature_sources: the distinct ``f_source`` values of its rows (how
            their features were built: ``plan:duckdb+text+catalog``,
            ``text+catalog``, ...); empty when not known.
    """

    sources: tuple[str, ...]
    cluster_sizes: tuple[int, ...]
    log_hash: str = ""
    run_hashes: tuple[str, ...] = field(default_factory=tuple)
    logs: str = ""
    feature_sources: tuple[str, ...] = field(default_factory=tuple)

    @property
    def benchmarks(self) -> tuple[str, ...]:
        return tuple(sorted({s.partition("@")[0] for s in self.sources}))

    @property
    def scale_factors(self) -> tuple[str, ...]:
        return tuple(sorted({s.partition("@")[2] for s in self.sources}))

    def describe(self) -> str:
        """``tpch SF 0.1 on cluster sizes 1, 2 (log 3fa2c1d09e8b7a65)``."""
        data = " + ".join(_describe_source(s) for s in self.sources) or "no rows"
        sizes = ", ".join(map(str, self.cluster_sizes)) or "none"
        features = f", features from {' / '.join(self.feature_sources)}" if self.feature_sources else ""
        return f"{data} on cluster sizes {sizes}{features}" + (f" (log {self.log_hash})" if self.log_hash else "")

    def lacks(self, other: Provenance) -> list[str]:
        """What ``other`` covers and this provenance does not (benchmark/scale factors and sizes), in words."""
        missing = [_describe_source(s) for s in other.sources if s not in self.sources]
        sizes = [s for s in other.cluster_sizes if s not in self.cluster_sizes]
        if sizes:
            missing.append("cluster size" + ("s " if len(sizes) > 1 else " ") + ", ".join(map(str, sizes)))
        return missing

    def mismatch(self, *, sources: Iterable[str] = (), cluster_sizes: Iterable[int] = ()) -> str | None:
        """Why data of ``sources`` / ``cluster_sizes`` is outside what this model was trained on (None: it is not).

        Rows of an unrecorded benchmark on either side are not a mismatch:
        nothing says they differ.
        """
        problems = []
        known = [s for s in self.sources if s != source_key(None, None)]
        for key in dict.fromkeys(sources):
            if key != source_key(None, None) and known and key not in known:
                problems.append(_describe_source(key))
        sizes = sorted({int(s) for s in cluster_sizes} - set(self.cluster_sizes)) if self.cluster_sizes else []
        if sizes:
            problems.append("cluster size" + ("s " if len(sizes) > 1 else " ") + ", ".join(map(str, sizes)))
        if not problems:
            return None
        return f"the model was trained on {self.describe()}, not on {' or '.join(problems)}"

    def to_tags(self) -> dict[str, str]:
        """MLflow run tags (``provenance.*``); also the benchmark and scale factors on their own."""
        return {f"{PREFIX}sources": ",".join(self.sources), f"{PREFIX}benchmark": ",".join(self.benchmarks),
                f"{PREFIX}scale_factor": ",".join(self.scale_factors),
                f"{PREFIX}cluster_sizes": ",".join(map(str, self.cluster_sizes)),
                f"{PREFIX}log_hash": self.log_hash, f"{PREFIX}run_hashes": ",".join(self.run_hashes),
                f"{PREFIX}logs": self.logs[:4000], f"{PREFIX}feature_sources": ",".join(self.feature_sources)}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Provenance | None:
        """The provenance in a run's tags, or ``None`` for a run registered before provenance was recorded."""
        if f"{PREFIX}sources" not in tags:
            return None
        return cls(sources=tuple(s for s in tags[f"{PREFIX}sources"].split(",") if s),
                   cluster_sizes=_sizes(tags.get(f"{PREFIX}cluster_sizes", "")),
                   log_hash=tags.get(f"{PREFIX}log_hash", ""),
                   run_hashes=tuple(s for s in tags.get(f"{PREFIX}run_hashes", "").split(",") if s),
                   logs=tags.get(f"{PREFIX}logs", ""),
                   feature_sources=tuple(s for s in tags.get(f"{PREFIX}feature_sources", "").split(",") if s))

    def to_dict(self) -> dict[str, Any]:
        return {"sources": list(self.sources), "cluster_sizes": list(self.cluster_sizes), "log_hash": self.log_hash,
                "run_hashes": list(self.run_hashes), "logs": self.logs, "feature_sources": list(self.feature_sources)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Provenance:
        return cls(sources=tuple(raw.get("sources", ())), cluster_sizes=tuple(int(s) for s in raw.get(
            "cluster_sizes", ())), log_hash=str(raw.get("log_hash", "")),
            run_hashes=tuple(raw.get("run_hashes", ())), logs=str(raw.get("logs", "")),
            feature_sources=tuple(raw.get("feature_sources", ())))


def _hash(frame: pd.DataFrame) -> str:
    import pandas as pd

    from sloctl.datasets.querylog import COLUMNS

    digest = pd.util.hash_pandas_object(frame[list(COLUMNS)], index=False).to_numpy().tobytes()
    return hashlib.sha256(digest).hexdigest()[:16]


def log_provenance(log: pd.DataFrame, metadata: Mapping[str, str] | None = None, *, logs: str = "",
                   rows: np.ndarray | None = None) -> Provenance:
    """The provenance of ``log`` (with its file ``metadata``), or of its ``rows`` only.

    ``log_hash`` is the data hash of the whole log (as
    :func:`~sloctl.training.pipeline.data_hash` computes it), ``run_hashes``
    one per input run of a merged log.
    """
    sources = row_sources(log, metadata)
    sizes = log["cluster_size"].to_numpy()
    features = log["f_source"].astype(str).to_numpy() if "f_source" in log.columns else np.array([], dtype=str)
    if rows is not None:
        sources, sizes = sources[rows], sizes[rows]
        features = features[rows] if len(features) else features
    run_hashes: tuple[str, ...] = ()
    if "run" in log.columns and (metadata or {}).get("merged_from"):
        run_hashes = tuple(_hash(part) for _, part in log.groupby("run", sort=True))
    return Provenance(sources=tuple(sorted(set(sources))), cluster_sizes=tuple(sorted({int(s) for s in sizes})),
                      log_hash=_hash(log) if len(log) else "", run_hashes=run_hashes, logs=logs,
                      feature_sources=tuple(sorted(set(features.tolist()))))
