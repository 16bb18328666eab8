"""`sloctl train / evaluate / predict / tune` as a user runs them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sloctl.datasets.collect import collect
from sloctl.datasets.querylog import write_log
from sloctl.datasets.tpc import load_templates
from sloctl.datasets.workloads import isolated_workload
from sloctl.models.predictor import LatencyPredictor
from sloctl.models.stage import StageConfig
from sloctl.registry.bundles import save_predictor
from sloctl.training.pipeline import fit_stage


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, sim_log):
    path = tmp_path_factory.mktemp("cli")
    write_log(sim_log, path / "log.parquet")
    (path / "fast.yaml").write_text("iconq:\n  max_epochs: 8\n")
    return path


@pytest.mark.slow  # about 25 s: trains Iconq+ to convergence through the CLI
def test_train_register_evaluate_json(workdir, run_sloctl):
    out = run_sloctl("train", "iconq", "--log", "log.parquet", "--config", "fast.yaml", "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["champion"] is True and summary["version"] == "1"
    assert "epoch" in out.stderr  # progress on long work
    assert (workdir / "mlflow.db").is_file()
    out = run_sloctl("evaluate", "predictor", "--log", "log.parquet", "--model", "models:/iconq@champion", "--json",
                 cwd=workdir)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["n"] > 0 and set(result["q_error"]) == {"p50", "p90", "p95"}
    assert 1.0 <= result["q_error"]["p50"] <= result["q_error"]["p90"] <= result["q_error"]["p95"]


@pytest.fixture(scope="module")
def stage_bundle(workdir, run_sloctl):
    """A Stage bundle trained by `sloctl train stage --no-register` (once for the module)."""
    out = run_sloctl("train", "stage", "--log", "log.parquet", "--no-register", "--out", "b", cwd=workdir)
    assert out.returncode == 0, out.stderr
    return "b"


def test_stage_bundle_without_registry(workdir, stage_bundle, run_sloctl):
    assert (workdir / stage_bundle / "meta.json").is_file()
    out = run_sloctl("evaluate", "predictor", "--log", "log.parquet", "--model", stage_bundle, "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["n"] > 0


def test_evaluate_on_empty_or_invalid_log_exits_non_zero(workdir, stage_bundle, sim_log, run_sloctl):
    write_log(sim_log.iloc[:0], workdir / "empty.parquet")
    out = run_sloctl("evaluate", "predictor", "--log", "empty.parquet", "--model", "b", cwd=workdir)
    assert out.returncode == 2 and "empty" in out.stderr
    (workdir / "broken.parquet").write_bytes(b"nope")
    out = run_sloctl("evaluate", "predictor", "--log", "broken.parquet", "--model", "b", cwd=workdir)
    assert out.returncode == 2 and "not a readable Parquet file" in out.stderr
    out = run_sloctl("evaluate", "predictor", "--log", "missing.parquet", "--model", "b", cwd=workdir)
    assert out.returncode == 2 and "not found" in out.stderr


def test_train_iconq_rejects_unknown_variant(workdir, run_sloctl):
    out = run_sloctl("train", "iconq", "--log", "log.parquet", "--variant", "lstm9", cwd=workdir)
    assert out.returncode == 2 and "--variant" in out.stderr


def test_predict_one_query_against_neighbours(workdir, tpch_db, run_sloctl):
    bundle = workdir / "tpch_stage"
    # a Stage bundle trained on TPC-H plan features, from a tiny real log
    log = collect(tpch_db, isolated_workload(load_templates("tpch"), 1), [1], log=None).log
    stage = fit_stage(log, np.arange(len(log)), StageConfig(), np.zeros(len(log), int))
    save_predictor(LatencyPredictor(stage), bundle)
    out = run_sloctl("predict", "--template", "tpch-q05", "--size", "1", "-n", "tpch-q01@-0.5", "--model", str(bundle),
                 "--sf", "0.01", "--data-dir", str(tpch_db.parent), "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["latency_s"] > 0 and result["n_neighbours"] == 1
    out = run_sloctl("predict", "--template", "tpch-q05", "--size", "1", "-n", "q01", "--model", str(bundle),
                 cwd=workdir)
    assert out.returncode == 2 and "TEMPLATE@OFFSET_S" in out.stderr


def test_predict_a_file_of_queries_with_one_model_load(workdir, trained_models, sim_log, run_sloctl):
    import pandas as pd

    from sloctl.models.predictor import queries_frame

    predictor = trained_models["iconq"].predictor
    bundle = workdir / "iconq_bundle"
    save_predictor(predictor, bundle)
    rng = np.random.default_rng(3)
    n = 300
    queries = pd.DataFrame({"template": rng.choice(sorted(sim_log["template"].unique()), n),
                            "cluster_size": rng.choice([1, 2], n), "arrival_s": np.sort(rng.uniform(0, 60, n)),
                            "cluster_id": rng.choice(["a", "b", "c"], n)})
    queries.to_csv(workdir / "queries.csv", index=False)
    out = run_sloctl("predict", "--input", "queries.csv", "--out", "predicted.parquet", "--model", str(bundle),
                     "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["queries"] == n
    got = pd.read_parquet(workdir / "predicted.parquet")
    assert list(got.columns[:4]) == list(queries.columns) and len(got) == n
    # what the model predicts for the same queries in this process, each with its cluster's queries as neighbours
    expected = predictor.predict(queries_frame(queries, predictor.templates))
    np.testing.assert_allclose(got["predicted_latency_s"], expected, rtol=1e-4)
    alone = predictor.predict(queries_frame(queries.drop(columns="cluster_id"), predictor.templates))
    assert not np.allclose(alone, expected)  # neighbours count
    assert (got["isolated_latency_s"] > 0).all()


def test_predict_file_errors_name_the_column_or_template(workdir, trained_models, sim_log, run_sloctl):
    import pandas as pd

    bundle = workdir / "iconq_bundle_errors"
    save_predictor(trained_models["iconq"].predictor, bundle)
    pd.DataFrame({"template": ["x"], "cluster_size": [1]}).to_csv(workdir / "no_arrival.csv", index=False)
    out = run_sloctl("predict", "--input", "no_arrival.csv", "--out", "o.csv", "--model", str(bundle), cwd=workdir)
    assert out.returncode == 2 and "arrival_s" in out.stderr and not (workdir / "o.csv").exists()
    pd.DataFrame({"template": ["nope"], "cluster_size": [1], "arrival_s": [0.0]}).to_csv(workdir / "unknown.csv",
                                                                                         index=False)
    out = run_sloctl("predict", "--input", "unknown.csv", "--out", "o.csv", "--model", str(bundle), cwd=workdir)
    assert out.returncode == 2 and "'nope'" in out.stderr
    out = run_sloctl("predict", "--input", "unknown.csv", "--model", str(bundle), cwd=workdir)
    assert out.returncode == 2 and "--out" in out.stderr


def test_data_parallel_training_on_two_cpu_processes_registers_a_model(workdir, run_sloctl):
    """Lightning DDP (spawned, gloo) on 2 CPU processes: each trains on every other batch, one model comes back."""
    out = run_sloctl("train", "iconq", "--log", "log.parquet", "--config", "fast.yaml", "--devices", "2",
                     "--max-epochs", "2", "--name", "iconq-ddp", "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["version"] == "1" and summary["model"] == "iconq-ddp"
    assert 1.0 <= summary["test"]["p90"] < 10.0
    import mlflow

    uri = f"sqlite:///{workdir / 'mlflow.db'}"  # the CLI's registry; never another test's global one
    client = mlflow.tracking.MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(client.get_model_version("iconq-ddp", "1").run_id)
    assert run.info.run_id == summary["run_id"]
    assert run.data.params["iconq_devices"] == "2" and float(run.data.metrics["train_samples_per_s"]) > 0
    bad = run_sloctl("train", "iconq", "--log", "log.parquet", "--devices", "0", "--no-register", cwd=workdir)
    assert bad.returncode == 2 and "--devices" in bad.stderr


def test_a_model_trained_on_text_features_predicts_a_file_of_sql(tmp_path, text_log, run_sloctl):
    import pandas as pd

    from sloctl.datasets.sql_features import catalog_metadata
    from sloctl.registry.bundles import load_predictor

    log, catalog = text_log
    write_log(log, tmp_path / "text.parquet", metadata={"catalog": catalog_metadata(catalog), "dialect": "duckdb"})
    out = run_sloctl("train", "stage", "--log", "text.parquet", "--features", "text+catalog", "--no-register",
                     "--out", "bundle", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    model = load_predictor(tmp_path / "bundle")
    assert model.feature_source == "text+catalog" and model.sql.catalog.tables == catalog.tables
    queries = pd.DataFrame({"sql": ["SELECT count(*) FROM lineitem", "SELECT * FROM nation JOIN region ON "
                                    "n_regionkey = r_regionkey"], "cluster_size": [1, 2], "arrival_s": [0.0, 1.0]})
    queries.to_csv(tmp_path / "sql.csv", index=False)
    out = run_sloctl("predict", "--input", "sql.csv", "--out", "p.csv", "--model", "bundle", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = pd.read_csv(tmp_path / "p.csv")
    assert list(got["sql"]) == list(queries["sql"]) and (got["predicted_latency_s"] > 0).all()
    # only the text counts, from a log that has the catalog's too; and a group that does not exist
    out = run_sloctl("train", "stage", "--log", "text.parquet", "--features", "text", "--no-register", "--out",
                     "text_only", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert load_predictor(tmp_path / "text_only").feature_source == "text"
    out = run_sloctl("train", "stage", "--log", "text.parquet", "--features", "text+plans", "--no-register",
                     cwd=tmp_path)
    assert out.returncode == 2 and "--features" in out.stderr and "plan, text, catalog" in out.stderr
