from __future__ import annotations

import math

import duckdb

from sloctl.datasets.plan_features import ENGINE_PLAN_FEATURES, PLAN_FEATURES, PlanFeaturizer, features_from_plan


def test_every_template_gives_the_same_fixed_length_vector(tpch_db, tpch_templates):
    con = duckdb.connect(str(tpch_db), read_only=True)
    featurize = PlanFeaturizer(con)
    vectors = {t.name: featurize(t.sql) for t in tpch_templates}
    assert all(list(v) == list(PLAN_FEATURES) for v in vectors.values())
    assert all(math.isfinite(x) for v in vectors.values() for x in v.values())
    # Q1 scans one table with no join; Q5 joins six tables
    assert vectors["tpch-q01"]["f_joins"] == 0 and vectors["tpch-q01"]["f_tables"] == 1
    assert vectors["tpch-q05"]["f_joins"] >= 5 and vectors["tpch-q05"]["f_tables"] == 6
    assert vectors["tpch-q01"]["f_aggregates"] >= 1


def test_features_are_cached_per_query_text(tpch_db):
    con = duckdb.connect(str(tpch_db), read_only=True)
    featurize = PlanFeaturizer(con)
    first = featurize("SELECT sum(l_quantity) FROM lineitem")
    featurize("SELECT sum(l_quantity) FROM lineitem")
    featurize("  SELECT sum(l_quantity) FROM lineitem  ")
    assert featurize.cache_size == 1
    assert first["f_scans"] == 1


def test_unplannable_query_gets_unknown_plan_features(tpch_db):
    features = PlanFeaturizer(duckdb.connect(str(tpch_db), read_only=True))("SELECT * FROM nope")
    assert all(math.isnan(features[name]) for name in ENGINE_PLAN_FEATURES)
    assert features["f_t_tables"] == 1 and math.isnan(features["f_c_log_rows_sum"])  # text known; table unknown


def test_plan_tree_counts():
    plan = [{"name": "HASH_JOIN", "extra_info": {"Estimated Cardinality": "10"}, "children": [
        {"name": "SEQ_SCAN", "extra_info": {"Table": "a", "Projections": ["x", "y"],
                                            "Estimated Cardinality": "1000"}, "children": []},
        {"name": "FILTER", "children": [
            {"name": "SEQ_SCAN", "extra_info": {"Table": "b", "Filters": "z>1",
                                                "Estimated Cardinality": "100"}, "children": []},
        ]},
    ]}]
    f = features_from_plan(plan)
    assert (f["f_nodes"], f["f_depth"], f["f_scans"], f["f_tables"]) == (4, 3, 2, 2)
    assert (f["f_joins"], f["f_filters"], f["f_op_hash_join"]) == (1, 2, 1)
    assert math.isclose(f["f_log_scan_card"], math.log1p(1100))
    assert math.isclose(f["f_scan_mbytes"], (1000 * 2 + 100 * 1) * 8 / 1e6)
