"""The latency-model ablation: every model, every seed, the same held-out queries within a seed."""

from __future__ import annotations

import dataclasses

import pytest

from sloctl.config import load_config
from sloctl.experiments.ablation import ablation


@pytest.mark.slow
def test_ablation_scores_each_model_per_seed_and_summarises_the_spread(sim_log):
    cfg = load_config()
    iconq = dataclasses.replace(cfg.iconq, max_epochs=1)
    seen = []
    result = ablation(sim_log, cfg.stage, iconq, [0, 1], models=("Stage", "Iconq+"), on_result=seen.append)
    assert [(r["model"], r["seed"]) for r in result["runs"]] == [("Stage", 0), ("Iconq+", 0), ("Stage", 1),
                                                                  ("Iconq+", 1)]
    assert seen == result["runs"]
    by = {(r["model"], r["seed"]): r for r in result["runs"]}
    for seed in (0, 1):  # same held-out queries for both models within a seed
        assert by[("Stage", seed)]["n"] == by[("Iconq+", seed)]["n"]
    p90 = result["summary"]["Iconq+"]["concurrent"]["p90"]
    assert p90["min"] <= p90["mean"] <= p90["max"] and len(p90["per_seed"]) == 2
    ratio = result["iconq_plus_over_stage_p90"]["per_seed"]
    assert ratio == pytest.approx([by[("Iconq+", s)]["concurrent"]["p90"] / by[("Stage", s)]["concurrent"]["p90"]
                                   for s in (0, 1)])
    assert result["log"]["queries"] == len(sim_log) and result["seeds"] == [0, 1]


def test_ablation_refuses_unknown_models_and_no_seed(sim_log):
    cfg = load_config()
    with pytest.raises(ValueError, match="Unknown model"):
        ablation(sim_log, cfg.stage, cfg.iconq, [0], models=("Stage", "Iconq++"))
    with pytest.raises(ValueError, match="seed"):
        ablation(sim_log, cfg.stage, cfg.iconq, [])


def test_ablation_cli_names_the_bad_option(run_sloctl, tmp_path, sim_log):
    from sloctl.datasets.querylog import write_log

    log = write_log(sim_log, tmp_path / "log.parquet")
    bad = run_sloctl("experiment", "ablation", "--log", str(log), "--seeds", "a,b")
    assert bad.returncode == 2 and "--seeds" in bad.stderr
    bad = run_sloctl("experiment", "ablation", "--log", str(log), "--models", "Stage,Nope")
    assert bad.returncode == 2 and "--models" in bad.stderr
