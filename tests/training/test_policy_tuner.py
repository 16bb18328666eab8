"""The Configuration Tuner (AutoSLO §7.5) on synthetic objectives, and `tune policy` end to end on tiny data."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from sloctl.core.errors import ConfigError
from sloctl.training.policy_tuner import STRATEGIES, SearchSpace, tune_knobs

# optimum: theta 20, tau_trigger 0.1, window_s 100 — all on the 5-point grid
SPACE = SearchSpace({"theta": (10, 30, "int"), "tau_trigger": (0.0, 0.4, "float"),
                     "window_s": (10.0, 1000.0, "log")})
OPTIMUM = {"theta": 20, "tau_trigger": 0.1, "window_s": 100.0}


def distance(config) -> float:
    """Squared distance to the optimum in unit coordinates (0 at the optimum)."""
    a = config.autoscaler
    return sum((SPACE.to_unit(n, getattr(a, n)) - SPACE.to_unit(n, OPTIMUM[n])) ** 2 for n in OPTIMUM)


class Bowl:
    """VR = distance to the optimum (+ a per-workload offset); cost 1. Counts what it runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def __call__(self, configs, workloads):
        self.calls.append((len(configs), workloads[0]))
        vr = np.array([[distance(c) + 0.01 * j for j in range(len(workloads))] for c in configs])
        return vr, np.ones_like(vr)


def run(strategy: str, budget: int = 60, seed: int = 0, evaluate=None, **kw):
    return tune_knobs(SPACE, evaluate=evaluate or Bowl(), train=["train", "train"], validation=["val"],
                      strategy=strategy, budget=budget, top_k=3, tau_target=0.0, seed=seed, **kw)


@pytest.mark.parametrize(("strategy", "budget", "tolerance"), [
    ("grid", 125, 0.0), ("coordinate", 40, 0.0), ("random", 60, 0.07), ("adaptive", 60, 0.03),
    ("optuna", 60, 0.03)])
def test_each_strategy_finds_the_optimum_within_budget(strategy, budget, tolerance):
    result = run(strategy, budget)
    assert result.evaluated <= budget
    assert distance(result.best) <= tolerance
    assert result.best_validation[0] == pytest.approx(distance(result.best))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_budget_counts_training_runs_and_topk_adds_one_validation_batch(strategy):
    bowl = Bowl()
    result = run(strategy, budget=7, evaluate=bowl)
    trained = sum(n for n, tag in bowl.calls if tag == "train")
    assert trained == result.evaluated <= 7
    assert [n for n, tag in bowl.calls if tag == "val"] == [len(result.top)] == [3]
    assert len({tuple(sorted(t.params.items())) for t in result.trials}) == len(result.trials)


def test_validation_changes_the_winner_when_it_disagrees():
    space = SearchSpace({"theta": [10, 15, 20, 25]})

    def evaluate(configs, workloads):
        theta = np.array([c.autoscaler.theta for c in configs], float)
        vr = (theta - 10) / 100 if workloads[0] == "train" else np.abs(theta - 15) / 100  # train: 10, val: 15
        vr = np.repeat(vr[:, None], len(workloads), axis=1)
        return vr, np.ones_like(vr)

    kwargs = dict(evaluate=evaluate, train=["train"], validation=["val"], strategy="grid", budget=10,
                  tau_target=0.0)
    assert tune_knobs(space, top_k=1, **kwargs).best_params == {"theta": 10}
    result = tune_knobs(space, top_k=3, **kwargs)
    assert result.best_params == {"theta": 15}
    assert [t.params["theta"] for t in result.top] == [10, 15, 20]


@pytest.mark.parametrize("strategy", ["random", "adaptive", "optuna"])
def test_same_seed_same_search_other_seed_other_search(strategy):
    def history(seed):
        return [t.params for t in run(strategy, budget=12, seed=seed).trials]

    assert history(3) == history(3)
    assert history(3) != history(4)


def test_best_with_target_prefers_cheaper_configuration_under_target():
    space = SearchSpace({"start_clusters": (1, 4, "int")})

    def evaluate(configs, workloads):
        n = np.array([len(c.start_sizes) for c in configs], float)
        vr = np.repeat((0.4 / n)[:, None], len(workloads), axis=1)  # 0.4, 0.2, 0.13, 0.1
        return vr, np.repeat(n[:, None], len(workloads), axis=1)

    result = tune_knobs(space, evaluate=evaluate, train=[0], validation=[0], strategy="grid", budget=4,
                        tau_target=0.15)
    assert result.best.start_sizes == (1, 1, 1)


def test_margin_from_the_validation_spread_keeps_the_plan_below_tau():
    """Validation days scatter a plan's VR; the spread margin picks the cheapest whose mean stays that far below τ."""
    space = SearchSpace({"start_clusters": (1, 4, "int")})

    def evaluate(configs, workloads):
        n = np.array([len(c.start_sizes) for c in configs], float)
        mean = 0.12 / n                                         # 0.12, 0.06, 0.04, 0.03
        offsets = np.array([-0.02, 0.0, 0.02])[: len(workloads)]  # each plan's days scatter by 0.02
        vr = mean[:, None] + offsets[None, :]
        return vr, np.repeat(n[:, None], len(workloads), axis=1)

    kwargs = dict(evaluate=evaluate, train=[0, 1, 2], validation=[0, 1, 2], strategy="grid", budget=4, top_k=4,
                  tau_target=0.07)
    assert tune_knobs(space, **kwargs).best.start_sizes == (1, 1)          # 0.06 <= 0.07
    spread = tune_knobs(space, margin="spread", **kwargs)
    assert spread.margin == pytest.approx(0.02)                              # the std of (-0.02, 0, 0.02)
    assert spread.target == pytest.approx(0.05)
    assert spread.best.start_sizes == (1, 1, 1)                              # 0.04 <= 0.05; 0.06 is not
    assert tune_knobs(space, margin=0.035, **kwargs).best.start_sizes == (1, 1, 1, 1)


@pytest.mark.parametrize("margin", [-0.01, "wide", math.nan, True])
def test_bad_margin_raises_config_error(margin):
    with pytest.raises(ConfigError, match="'margin'"):
        tune_knobs(SearchSpace({"theta": [10, 20]}), evaluate=Bowl(), train=["train"], validation=["val"],
                   strategy="grid", budget=2, margin=margin)


@pytest.mark.parametrize("knobs", [
    {}, {"no_such_knob": (1, 2, "int")}, {"theta": (5, 5, "int")}, {"window_s": (0.0, 10.0, "log")},
    {"tau_trigger": (0.1, 0.2, "cubic")}, {"theta": (5.0, 9.0, "float")}, {"mu": []}, {"mu": "abc"},
    {"tau_trigger": (0.1, math.inf, "float")}])
def test_bad_search_space_raises_config_error(knobs):
    with pytest.raises(ConfigError, match="SearchSpace"):
        tune_knobs(SearchSpace(knobs), evaluate=Bowl(), train=[0], validation=[0])


def test_bad_strategy_and_budget_raise_config_error():
    with pytest.raises(ConfigError, match="'strategy'"):
        run("annealing")
    with pytest.raises(ConfigError, match="'budget'"):
        run("grid", budget=0)


def test_tune_policy_registers_an_execution_config_that_loads_back(tmp_path, sim_log):
    from sloctl.control.policies import ExecutionPlan
    from sloctl.registry.store import load_policy
    from sloctl.training.day_plan import tune_execution_plan

    hours = pd.date_range("2024-03-01", periods=3 * 24, freq="h")
    shape = 5 + 25 * np.exp(-0.5 * ((hours.hour.to_numpy() - 14) / 3.0) ** 2)  # an afternoon peak
    pd.DataFrame({"instance_id": 0, "timestamp": hours.strftime("%Y-%m-%d %H:%M:%S"),
                  "query_count": shape.round().astype(int)}).to_parquet(tmp_path / "hourly.parquet")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = tune_execution_plan(tmp_path / "hourly.parquet", sim_log, days=2, strategy="grid", budget=3, top_k=2,
                                  n_train=2, n_validation=1, hour_units=8.0, eta=1, phi=1, workers=1,
                                  tracking_uri=uri, experiment="t", log_path=str(tmp_path / "tpch.parquet"),
                                  log_metadata={"benchmark": "tpch", "scale_factor": "0.1"})
    assert summary["target_date"] == "2024-03-04" and summary["history"]["days"] == 2
    assert summary["evaluated"] <= 3 and summary["version"] == "1"
    plan = load_policy(f"models:/{ExecutionPlan.kind}@champion", tracking_uri=uri)
    assert isinstance(plan, ExecutionPlan) and plan.provenance["seed"] == "0"
    doc = plan.to_doc()
    assert doc["start_sizes"] == summary["start_sizes"] and doc["spinups"] == summary["spinups"]
    assert 0.0 <= doc["predicted"]["validation_vr"] <= 1.0 and doc["predicted"]["validation_cost"] > 0
    assert len(doc["trials"]) == summary["evaluated"]
    # issue 18: what it was optimised on, as the latency models record it, on the registered version's run
    from mlflow import MlflowClient

    from sloctl.training.pipeline import data_hash

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(client.get_model_version_by_alias(ExecutionPlan.kind, "champion").run_id)
    tags = run.data.tags
    assert tags["provenance.benchmark"] == "tpch" and tags["provenance.scale_factor"] == "0.1"
    assert tags["provenance.cluster_sizes"] == ",".join(map(str, sorted(set(sim_log["cluster_size"]))))
    assert tags["provenance.log_hash"] == data_hash(sim_log)
    assert tags["provenance.logs"] == str(tmp_path / "tpch.parquet")
    assert tags["provenance.history"] == str(tmp_path / "hourly.parquet") and tags["provenance.days"] == "2"
    assert tags["provenance.first_date"] == "2024-03-02" and tags["provenance.target_date"] == "2024-03-04"
    assert tags["provenance.instance"] == "0"
    assert len(tags["provenance.history_hash"]) == 16 and plan.provenance["history_hash"] == tags[
        "provenance.history_hash"]
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"history-hourly", "log-tpch"}
    assert int(json.loads(inputs["history-hourly"].dataset.profile)["num_rows"]) == 2 * 24  # the window only
