"""A latency predictor: Stage alone, or Stage feeding an Iconq network.

:class:`LatencyPredictor` bundles what a prediction needs — the Stage model,
the plan-feature scaler, and (for concurrency-aware variants) the trained
:class:`~sloctl.models.iconq.IconqNet` — and predicts every query of a
log-shaped frame given its neighbours in that frame. Pure computation, no I/O
(saving and loading live in :mod:`sloctl.registry.bundles`).

A trained predictor also carries what the Query Router needs beside the model
(AutoSLO §5): the SLO margin calibrated on its training log and the plan
features of every template it was trained on, so that every driver builds the
same router from it (:func:`sloctl.registry.routers.build_router`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sloctl.core.errors import FeatureError
from sloctl.core.kinds import ModelKind
from sloctl.datasets.interactions import (
    FeatureScaler,
    NeighbourIndex,
    chronological_rank,
    full_samples,
    neighbour_index,
    self_vectors,
)
from sloctl.datasets.plan_features import PLAN_FEATURE_VERSION, PLAN_FEATURES
from sloctl.models.stage import StageModel

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.models.calibration import MarginCalibration

__all__ = ["FEATURE_GROUPS", "QUERY_COLUMNS", "LatencyPredictor", "SqlSpec", "VARIANTS", "Variant",
           "feature_group", "mask_features", "queries_frame", "used_features"]

#: What each group of feature columns needs to be built, for messages.
FEATURE_GROUPS: dict[str, str] = {
    "plan": "the engine's plan (EXPLAIN on a database with the queries' tables)",
    "text": "the SQL text, parsed by sqlglot",
    "catalog": "table statistics (a catalog: --catalog FILE, or a database to read them from)",
}


def feature_group(column: str) -> str:
    """The group of a feature column: ``text`` (``f_t_*``), ``catalog`` (``f_c_*``) or ``plan`` (the rest)."""
    if column.startswith("f_t_"):
        return "text"
    if column.startswith("f_c_"):
        return "catalog"
    return "plan"


def used_features(log: pd.DataFrame) -> tuple[str, ...]:
    """The feature columns with at least one known (finite) value in ``log``: what a model trained on it uses."""
    out = []
    for column in PLAN_FEATURES:
        if column in log.columns and np.isfinite(log[column].to_numpy(dtype=float)).any():
            out.append(column)
    return tuple(out)


def mask_features(log: pd.DataFrame, groups: tuple[str, ...]) -> pd.DataFrame:
    """``log`` with the feature columns outside ``groups`` (``plan``, ``text``, ``catalog``) set unknown (NaN):
    what a model trained on it learns from and, at prediction, needs (``sloctl train --features``)."""
    unknown = [g for g in groups if g not in FEATURE_GROUPS]
    if unknown or not groups:
        raise ValueError(f"The 'groups' parameter must name feature groups among {', '.join(FEATURE_GROUPS)}, "
                         f"got {'+'.join(groups) or 'none'!r}.")
    hidden = [c for c in PLAN_FEATURES if feature_group(c) not in groups and c in log.columns]
    return log.assign(**dict.fromkeys(hidden, np.nan)) if hidden else log


#: The most query texts' features a predictor keeps (least recently used leave first).
SQL_CACHE_TEXTS = 10_000


@dataclass
class SqlSpec:
    """How a model's training log got its features from SQL text: the dialect its texts were parsed in and
    the catalog's table statistics (``None``: the log had none). A predictor that carries one, and learned
    from text and catalog features only, predicts for SQL text it never saw."""

    dialect: str = "duckdb"
    catalog: Any = None  # a sloctl.datasets.sql_features.Catalog

    def __post_init__(self) -> None:
        self._featurizer: Any = None

    def featurizer(self) -> Any:
        """The (bounded, thread-safe) text featurizer, made on first use."""
        if self._featurizer is None:
            from sloctl.datasets.sql_features import TextFeaturizer

            self._featurizer = TextFeaturizer(self.dialect, self.catalog, max_cache=SQL_CACHE_TEXTS)
        return self._featurizer


@dataclass(frozen=True)
class Variant:
    """An ablation variant of AutoSLO §8.3.1, as configuration of one model."""

    name: str
    after_order: str          # "reverse": Iconq's after-pass; "chronological": Iconq+
    size_features: bool       # the cluster-size features (i)-(v) of §4.2
    censored: bool            # partial neighbour sets and timeouts as lower bounds


VARIANTS: dict[str, Variant] = {
    "iconq": Variant("iconq", "reverse", False, False),
    "size": Variant("size", "reverse", True, False),
    "censored": Variant("censored", "reverse", True, True),
    "iconq_plus": Variant("iconq_plus", "chronological", True, True),
}


class LatencyPredictor:
    """Predicts latencies (seconds) for the queries of a log-shaped frame.

    Args:
        stage: the fitted Stage model.
        scaler: plan-feature standardisation fitted on the training split.
        net: the Iconq network; ``None`` for a Stage-only predictor.
        variant: the variant ``net`` was trained as (ignored without ``net``).
        plan_feature_version: the plan-feature schema it was trained on.
        calibration: the router's SLO margin calibrated on the training log
            (:func:`~sloctl.models.calibration.calibrate_slo_margin`); ``None``
            for a model saved by older code.
        templates: one row per template seen in training (``template``,
            ``sql_hash`` and the plan features), what a router looks
            templates up in; ``None`` for a model saved by older code.
        feature_columns: the feature columns known in its training rows
            (:func:`used_features`); the others are hidden from the model
            (set to NaN) when it predicts, so that a model trained on SQL
            text alone never sees plan estimates it did not learn from.
            ``None``: every column (a model saved by older code).
        sql: how the training log's texts became features (dialect and
            catalog), so that :meth:`sql_features` builds them the same way
            for new texts; ``None``: the model cannot read SQL text.
    """

    def __init__(self, stage: StageModel, scaler: FeatureScaler | None = None, net: Any = None,
                 variant: Variant | None = None, plan_feature_version: str = PLAN_FEATURE_VERSION,
                 calibration: MarginCalibration | None = None, templates: pd.DataFrame | None = None,
                 feature_columns: tuple[str, ...] | None = None, sql: SqlSpec | None = None) -> None:
        self.stage = stage
        self.scaler = scaler
        self.net = net
        self.variant = variant
        self.plan_feature_version = plan_feature_version
        self.calibration = calibration
        self.templates = templates
        self.feature_columns = None if feature_columns is None else tuple(feature_columns)
        self.sql = sql

    def sql_refusal(self) -> str | None:
        """Why this model cannot predict from SQL text, naming what to train; ``None`` when it can."""
        sources = self.feature_sources
        if "plan" in sources:
            return (f"the model was trained on {self.feature_source} features and SQL text gives only text and "
                    "catalog features; train one on those: `sloctl train iconq --features text+catalog` (or "
                    "`train stage`), or give the plan features (f_* columns, or a template it knows)")
        if "text" not in sources:
            return (f"the model was trained without SQL text features ({self.feature_source}); train it on a log "
                    "whose rows have them (`sloctl import` of a query history, or a collected log) with "
                    "`--features text+catalog`")
        if self.sql is None:
            return ("the model does not record how its log's SQL was parsed (trained before sloctl stored it with "
                    "the model); train it again with `--features text+catalog`")
        if "catalog" in sources and self.sql.catalog is None:
            return ("the model learned catalog features but carries no catalog; train it again with "
                    "`--catalog FILE` (a table,rows,bytes CSV or the warehouse's .duckdb file)")
        return None

    def sql_features(self, texts: Any, qualify: Any = None) -> np.ndarray:
        """The feature matrix (:data:`PLAN_FEATURES` columns; plan columns NaN) of SQL ``texts``, built as
        training built its log's: parsed in the log's dialect, table sizes from its catalog.

        Args:
            texts: one SQL statement per row.
            qualify: per row, the session's ``(catalog, schema)`` that completes unqualified table names
                (``None``: none).

        Raises:
            FeatureError: the model cannot read SQL (:meth:`sql_refusal`).
        """
        why = self.sql_refusal()
        if why is not None:
            raise FeatureError(f"cannot predict from SQL text: {why}.")
        featurizer = self.sql.featurizer()
        index = {name: j for j, name in enumerate(PLAN_FEATURES)}
        out = np.full((len(texts), len(PLAN_FEATURES)), np.nan)
        for i, text in enumerate(texts):
            where = ("", "") if qualify is None or qualify[i] is None else qualify[i]
            for name, value in featurizer(str(text), where).items():
                out[i, index[name]] = value
        return out

    @property
    def feature_sources(self) -> tuple[str, ...]:
        """The feature groups the model needs (``plan``, ``text``, ``catalog``), in that order."""
        columns = PLAN_FEATURES if self.feature_columns is None else self.feature_columns
        groups = {feature_group(c) for c in columns}
        return tuple(g for g in FEATURE_GROUPS if g in groups)

    @property
    def feature_source(self) -> str:
        """:attr:`feature_sources` as one string, ``text+catalog``; ``none`` when it uses no feature."""
        return "+".join(self.feature_sources) or "none"

    def missing_features(self, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        """Per needed group, the rows of ``frame`` where every column of that group is unknown (NaN)."""
        columns = PLAN_FEATURES if self.feature_columns is None else self.feature_columns
        out: dict[str, np.ndarray] = {}
        for group in self.feature_sources:
            names = [c for c in columns if feature_group(c) == group]
            present = [c for c in names if c in frame.columns]
            if not present:
                out[group] = np.arange(len(frame))
                continue
            known = np.isfinite(frame[present].to_numpy(dtype=float)).any(axis=1)
            if not known.all():
                out[group] = np.flatnonzero(~known)
        return out

    def check_features(self, frame: pd.DataFrame, what: str = "the request") -> None:
        """Refuse ``frame`` when a row lacks a whole feature group the model was trained on.

        Raises:
            FeatureError: naming the group, what builds it, and the first row's template.
        """
        for group, rows in self.missing_features(frame).items():
            if len(rows):
                row = int(rows[0])
                template = frame["template"].iloc[row] if "template" in frame.columns else f"row {row}"
                raise FeatureError(
                    f"{what}: the model was trained on {self.feature_source} features, but {template!r} has no "
                    f"{group} features ({len(rows)} of {len(frame)} row(s)); they come from {FEATURE_GROUPS[group]}.")

    def _masked(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` with the feature columns the model did not learn from set to NaN."""
        if self.feature_columns is None:
            return frame
        hidden = [c for c in PLAN_FEATURES if c not in self.feature_columns and c in frame.columns]
        if not hidden or not np.isfinite(frame[hidden].to_numpy(dtype=float)).any():
            return frame
        return frame.assign(**dict.fromkeys(hidden, np.nan))

    @property
    def kind(self) -> ModelKind:
        return ModelKind.of(self)

    @property
    def slo_margin(self) -> float | None:
        """The SLO margin calibrated on the training log, or ``None`` when the model carries none."""
        return None if self.calibration is None else self.calibration.slo_margin

    def predict(self, frame: pd.DataFrame, *, neighbours: str = "auto") -> np.ndarray:
        """Latency in seconds of every row of ``frame``.

        Args:
            frame: log-shaped rows (plan features, ``cluster_size``,
                ``cluster_id``, ``arrival_s``; ``start_s``/``end_s`` if known).
            neighbours: ``"overlap"`` — neighbours are rows whose executions
                overlap (needs start/end); ``"arrival"`` — only the overlapping
                rows that arrived earlier, i.e. what a router sees when the
                query arrives; ``"all"`` — every other row on the same
                cluster; ``"auto"`` — overlap when end times are known.
        """
        return self.predict_with_isolated(frame, neighbours=neighbours)[0]

    def predict_with_isolated(self, frame: pd.DataFrame, *, neighbours: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict` and Stage's isolated latency of every row, from one Stage pass."""
        frame = self._masked(frame)
        stage_s = self.stage.predict(frame)
        if self.net is None:
            return stage_s, stage_s
        return np.exp(self.predict_log_with(frame, stage_s, neighbours=neighbours)), stage_s

    def predict_log_with(self, frame: pd.DataFrame, stage_s: np.ndarray, *, neighbours: str = "auto") -> np.ndarray:
        """Iconq log-latency predictions given precomputed Stage predictions."""
        from sloctl.models.batches import IconqInputs, IconqSamples, predict_samples

        if neighbours == "auto":
            known = "end_s" in frame.columns and np.isfinite(frame["end_s"].to_numpy(dtype=float)).all()
            neighbours = "overlap" if known else "all"
        index = self._neighbours(frame, neighbours)
        plan = self.scaler.transform(self._masked(frame)).astype(np.float32)
        size = frame["cluster_size"].to_numpy(dtype=float)
        sf = self.variant.size_features
        inputs = IconqInputs(self_vectors(plan, stage_s, size, sf), plan, np.asarray(stage_s, float),
                             frame["arrival_s"].to_numpy(dtype=float), size, sf, index)
        return predict_samples(self.net, IconqSamples(inputs, full_samples(index)))

    @staticmethod
    def _neighbours(frame: pd.DataFrame, mode: str) -> NeighbourIndex:
        if mode == "overlap":
            return neighbour_index(frame)
        if mode == "arrival":
            index = neighbour_index(frame)
            return NeighbourIndex(index.before_ptr, index.before, np.zeros(len(frame) + 1, np.int64),
                                  np.empty(0, np.int64))
        if mode != "all":
            raise ValueError(f"The 'neighbours' parameter must be 'overlap', 'arrival', 'all' or 'auto', got {mode!r}.")
        # every query of the cluster: those that arrived earlier before, the later ones after
        rank = chronological_rank(frame)
        owners, mates = [], []
        for _, index in frame.groupby("cluster_id", sort=False).indices.items():
            i, j = np.meshgrid(index, index, indexing="ij")
            off = i != j
            owners.append(i[off]), mates.append(j[off])
        owner = np.concatenate(owners) if owners else np.empty(0, np.int64)
        mate = np.concatenate(mates) if mates else np.empty(0, np.int64)
        earlier = rank[mate] < rank[owner]
        return NeighbourIndex.from_pairs(len(frame), owner[earlier], mate[earlier], owner[~earlier], mate[~earlier],
                                         rank)


#: What a file of queries to predict must hold (``sloctl predict --input``); ``sql`` may stand for ``template``.
QUERY_COLUMNS = ("template", "cluster_size", "arrival_s")


def queries_frame(queries: pd.DataFrame, templates: pd.DataFrame | None, source: str = "input",
                  sql: Any = None) -> pd.DataFrame:
    """A log-shaped frame a :class:`LatencyPredictor` reads, from a table of queries to predict.

    ``queries`` needs ``cluster_size``, ``arrival_s`` and, per row, a
    ``template`` the model knows or its ``sql`` text (optionally with the
    session's ``catalog`` and ``schema`` that complete unqualified table
    names); ``cluster_id`` groups the queries that run together (default:
    each query alone), ``end_s`` (when every row has one) makes overlapping
    executions the neighbours, else every query of the cluster is one.
    Features missing from ``queries`` come from ``templates`` (the model's
    template table) by template, or from the text by ``sql``.

    Args:
        sql: ``predictor.sql_features`` (texts, qualify -> feature matrix);
            ``None``: rows with SQL text are refused.

    Raises:
        ValueError: a missing column, a bad value or an unknown template, naming it.
        FeatureError: SQL text for a model that cannot read it (from ``sql``).
    """
    import pandas as pd

    from sloctl.datasets.plan_features import PLAN_FEATURES

    has_sql = "sql" in queries.columns
    texts = queries["sql"].to_numpy(dtype=object) if has_sql else np.full(len(queries), None, dtype=object)
    by_text = np.array([isinstance(t, str) and bool(t.strip()) for t in texts], dtype=bool)
    needed = [c for c in QUERY_COLUMNS if not (c == "template" and has_sql)]
    missing = [c for c in needed if c not in queries.columns]
    if missing:
        raise ValueError(f"{source}: missing column '{missing[0]}' (needed: template or sql, cluster_size, arrival_s; "
                         "optional: catalog, schema, cluster_id, end_s, query_id, plan features f_*).")
    out = pd.DataFrame(index=pd.RangeIndex(len(queries)))
    out["query_id"] = (queries["query_id"].to_numpy() if "query_id" in queries.columns
                       else np.arange(len(queries), dtype=np.int64))
    names = (queries["template"].to_numpy(dtype=object) if "template" in queries.columns
             else np.full(len(queries), None, dtype=object))
    named = np.array([isinstance(t, str) and bool(t) for t in names], dtype=bool)
    neither = ~(named | by_text)
    if neither.any():
        row = int(np.argmax(neither))
        raise ValueError(f"{source}: row {row} has neither a template nor SQL text ('template' or 'sql').")
    if by_text.any():
        from sloctl.datasets.sql_features import fingerprint

        names = np.where(by_text & ~named, [f"sql:{fingerprint(t)}" if b else "" for t, b in zip(texts, by_text,
                                                                                                    strict=True)],
                         names)
    out["template"] = names.astype(str)
    size = pd.to_numeric(queries["cluster_size"], errors="coerce").to_numpy(dtype=float)
    bad = ~(np.isfinite(size) & (size >= 1) & (size == np.round(size)))
    if bad.any():
        raise ValueError(f"{source}: column 'cluster_size' must be whole numbers >= 1; row {int(np.argmax(bad))} "
                         f"has {queries['cluster_size'].iloc[int(np.argmax(bad))]!r}.")
    out["cluster_size"] = size.astype(np.int64)
    arrival = pd.to_numeric(queries["arrival_s"], errors="coerce").to_numpy(dtype=float)
    if not np.isfinite(arrival).all():
        row = int(np.argmax(~np.isfinite(arrival)))
        raise ValueError(f"{source}: column 'arrival_s' must be seconds (numbers); row {row} has "
                         f"{queries['arrival_s'].iloc[row]!r}.")
    out["arrival_s"] = out["start_s"] = arrival
    out["end_s"] = (pd.to_numeric(queries["end_s"], errors="coerce").to_numpy(dtype=float)
                    if "end_s" in queries.columns else np.nan)
    out["cluster_id"] = (queries["cluster_id"].astype(str).to_numpy() if "cluster_id" in queries.columns
                         else [f"alone-{i}" for i in range(len(queries))])
    out["status"], out["slo_s"], out["oversubscribed"] = "ok", np.nan, False
    given = [c for c in PLAN_FEATURES if c in queries.columns]
    if len(given) == len(PLAN_FEATURES) and not by_text.any():
        for c in PLAN_FEATURES:
            out[c] = pd.to_numeric(queries[c], errors="coerce").to_numpy(dtype=float)
        out["sql_hash"] = queries["sql_hash"].astype(str).to_numpy() if "sql_hash" in queries.columns else ""
        return out
    features = np.full((len(queries), len(PLAN_FEATURES)), np.nan)
    hashes = np.full(len(queries), "", dtype=object)
    by_name = ~by_text
    if by_name.any():
        if templates is None:
            raise ValueError(f"{source}: has no plan features (f_* columns) and the model has no template table to "
                             "take them from; add the features, give SQL text, or use a model trained with "
                             "sloctl >= 0.1.")
        table = templates.drop_duplicates("template").set_index("template")
        unknown = sorted(set(out["template"][by_name]) - set(table.index))
        if unknown:
            raise ValueError(f"{source}: template {unknown[0]!r} is not in the model's template table "
                             f"({len(table)} templates, e.g. {', '.join(list(table.index[:3]))}); give its SQL "
                             "text ('sql'), its plan features (f_* columns), or train on a log that ran it.")
        picked = table.loc[out["template"][by_name]]
        for j, c in enumerate(PLAN_FEATURES):
            if c in picked.columns:
                features[by_name, j] = picked[c].to_numpy(dtype=float)
        if "sql_hash" in picked.columns:
            hashes[by_name] = picked["sql_hash"].astype(str).to_numpy()
    if by_text.any():
        if sql is None:
            raise ValueError(f"{source}: has SQL text ('sql') but nothing here reads it with this model.")
        rows = np.flatnonzero(by_text)
        catalogs = queries["catalog"].to_numpy(dtype=object) if "catalog" in queries.columns else None
        schemas = queries["schema"].to_numpy(dtype=object) if "schema" in queries.columns else None

        def part(values: Any, i: int) -> str:
            value = None if values is None else values[i]
            return value.lower() if isinstance(value, str) else ""

        qualify = [(part(catalogs, i), part(schemas, i)) for i in rows]
        features[rows] = sql(texts[rows], qualify)
        from sloctl.datasets.plan_features import sql_hash

        hashes[rows] = [sql_hash(str(t)) for t in texts[rows]]
    for j, c in enumerate(PLAN_FEATURES):
        out[c] = features[:, j]
    for c in given:  # features the caller gave win where they are known
        value = pd.to_numeric(queries[c], errors="coerce").to_numpy(dtype=float)
        out[c] = np.where(np.isfinite(value), value, out[c].to_numpy())
    out["sql_hash"] = hashes.astype(str)
    return out
