"""``sloctl experiment``: the paper's experiments, in simulation on an emulated warehouse."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sloctl._cli_common import ConfigOption, echo, load_cli_config

__all__ = ["experiment_app"]

experiment_app = typer.Typer(help="AutoSLO experiments in simulation (emulated warehouse calibrated on a real log).",
                             no_args_is_help=True)


@experiment_app.command("router")
def experiment_router_cmd(
    log: Path = typer.Option(..., "--log", "-l", help="Real query log: calibrates the emulated world, gives SLOs."),
    model: str = typer.Option("models:/iconq@champion", help="Iconq+ model the routers use (its Stage too)."),
    copies: int = typer.Option(10, help="Copies of every template in BaseWorkload."),
    seed: int = typer.Option(0, help="Seed of workloads and service-time noise."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    config: Path | None = ConfigOption,
) -> None:
    """Round-robin vs Stage+cost vs Iconq+ routing over 8 scenarios (λ × κ × clusters)."""
    from sloctl.datasets.querylog import read_log
    from sloctl.simulation.experiments import RouterExperimentConfig, router_experiment
    from sloctl.training.registry import load_model

    if copies < 1:
        raise typer.BadParameter(f"must be >= 1; got {copies}", param_hint="--copies")
    cfg = load_cli_config(config)
    frame = read_log(log)
    predictor = load_model(model, tracking_uri=cfg.registry.tracking_uri)

    def progress(s: dict) -> None:
        cells = "  ".join(f"{k} VR {v['vr']:.3f} cost {v['cost']:.1f}" for k, v in s["results"].items())
        echo(f"load {s['load']:.2f} (λ={s['lambda']:.2f}/s) κ={s['kappa']:g} clusters={s['clusters']}: {cells}")

    experiment = RouterExperimentConfig(copies=copies, seed=seed, slo_margin=cfg.router.slo_margin,
                                        cost_tolerance=cfg.router.cost_tolerance)
    result = router_experiment(frame, predictor, experiment, on_scenario=progress)
    if as_json:
        typer.echo(json.dumps(result))
        return
    world = result["world"]
    echo(f"emulated world: alpha {world['alpha']}, its held-out Q-error p50 {world['heldout_q_error']['p50']:.3f} "
         f"p90 {world['heldout_q_error']['p90']:.3f}")
    for approach, delta in result["mean_delta"].items():
        typer.echo(f"mean Δ vs {result['baseline']}: {approach:<12} VR {delta['vr']:+.1%} (over {delta['n_vr']} "
                   f"scenarios with VR > 0)  cost {delta['cost']:+.1%}")
