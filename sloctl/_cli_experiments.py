"""``sloctl experiment``: the paper's experiments, in simulation on an emulated warehouse (or live, ``--live``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sloctl._cli_common import ConfigOption, echo, load_cli_config, router_margin

if TYPE_CHECKING:
    from sloctl.config import SloctlConfig

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
    live: bool = typer.Option(False, "--live", help="Run round-robin vs Iconq+ on live DuckDB clusters instead "
                              "(two size-1 clusters, load 0.85, κ=2)."),
    db: Path | None = typer.Option(None, "--db", help="With --live: the TPC-H database the log was collected on "
                                   "(default: TPC-H SF 1 in warehouse.data_dir)."),
    live_copies: int = typer.Option(2, help="With --live: copies of every template (--copies is for simulation)."),
    config: Path | None = ConfigOption,
) -> None:
    """Round-robin vs Stage+cost vs Iconq+ routing over 8 scenarios (λ × κ × clusters).

    With --live, round-robin vs Iconq+ on real DuckDB clusters: the same
    routers, the same seeded arrivals, one fresh pool per router.
    """
    from sloctl.datasets.querylog import read_log
    from sloctl.simulation.experiments import RouterExperimentConfig, router_experiment
    from sloctl.training.registry import load_model

    if copies < 1:
        raise typer.BadParameter(f"must be >= 1; got {copies}", param_hint="--copies")
    cfg = load_cli_config(config)
    if live:
        _experiment_router_live(log, model, db, live_copies, seed, as_json, cfg)
        return
    frame = read_log(log)
    predictor = load_model(model, tracking_uri=cfg.registry.tracking_uri)

    def progress(s: dict) -> None:
        cells = "  ".join(f"{k} VR {v['vr']:.3f} cost {v['cost']:.1f}" for k, v in s["results"].items())
        echo(f"load {s['load']:.2f} (λ={s['lambda']:.2f}/s) κ={s['kappa']:g} clusters={s['clusters']}: {cells}")

    experiment = RouterExperimentConfig(copies=copies, seed=seed, slo_margin=router_margin(cfg, predictor, frame),
                                        cost_tolerance=cfg.router.cost_tolerance)
    result = router_experiment(frame, predictor, experiment, on_scenario=progress)
    if as_json:
        typer.echo(json.dumps(result))
        return
    _report_errors(result)
    for approach, delta in result["mean_delta"].items():
        typer.echo(f"mean Δ vs {result['baseline']}: {approach:<12} VR {delta['vr']:+.1%} (over {delta['n_vr']} "
                   f"scenarios with VR > 0)  cost {delta['cost']:+.1%}")


def _report_errors(result: dict) -> None:
    """How far the world is from real runs, and the policies' predictor from the world."""
    world, pred = result["world"], result["predictor_vs_world"]
    echo(f"emulated world vs held-out real runs: Q-error p50 {world['heldout_q_error']['p50']:.3f} "
         f"p90 {world['heldout_q_error']['p90']:.3f} (alpha {world['alpha']})")
    echo(f"policies' predictor (at routing time) vs the world: Q-error p50 {pred['p50']:.3f} p90 {pred['p90']:.3f}, "
         f"{pred.get('under_predicted', float('nan')):.0%} under-predicted")


def _live_db(db: Path | None, cfg: SloctlConfig) -> Path:
    from sloctl.datasets.tpc import database_path

    db = db if db is not None else database_path("tpch", 1.0, cfg.warehouse.data_dir)
    if not Path(db).is_file():
        raise typer.BadParameter(f"no DuckDB database at {db} (generate it with `sloctl warehouse generate "
                                 "--sf 1`, or name the one the log was collected on)", param_hint="--db")
    return Path(db)


def _experiment_router_live(log: Path, model: str, db: Path | None, copies: int, seed: int, as_json: bool,
                            cfg: SloctlConfig) -> None:
    """``experiment router --live``: round-robin vs Iconq+ on live DuckDB clusters."""
    from sloctl.datasets.querylog import read_log
    from sloctl.serving.live import live_router_experiment
    from sloctl.training.registry import load_model

    if copies < 1:
        raise typer.BadParameter(f"must be >= 1; got {copies}", param_hint="--live-copies")
    db = _live_db(db, cfg)
    frame = read_log(log)
    predictor = load_model(model, tracking_uri=cfg.registry.tracking_uri)

    def progress(approach: str, done: int, total: int) -> None:
        if done == total:
            echo(f"{approach}: {total} queries done live")

    result = live_router_experiment(db, frame, predictor, copies=copies, seed=seed,
                                    slo_margin=router_margin(cfg, predictor, frame),
                                    cost_tolerance=cfg.router.cost_tolerance, on_progress=progress)
    if as_json:
        typer.echo(json.dumps(result))
        return
    for approach, outcome in result["results"].items():
        typer.echo(f"live λ={result['lambda']:.2f}/s κ={result['kappa']:g} clusters={result['clusters']}: "
                   f"{approach:<12} VR {outcome['vr']:.3f} cost {outcome['cost']:.1f}")
    for approach, delta in result["mean_delta"].items():
        vr = f"VR {delta['vr']:+.1%}" if delta["n_vr"] else "VR n/a (baseline VR 0)"
        typer.echo(f"mean Δ vs {result['baseline']}: {approach:<12} {vr}  cost {delta['cost']:+.1%}")


def _scaling(kind: str, log: Path, model: str, copies: int, seed: int, as_json: bool, config: Path | None) -> None:
    from sloctl.datasets.querylog import read_log
    from sloctl.simulation.experiments import ScalingExperimentConfig, scaling_experiment
    from sloctl.training.registry import load_model

    if copies < 1:
        raise typer.BadParameter(f"must be >= 1; got {copies}", param_hint="--copies")
    cfg = load_cli_config(config)
    frame = read_log(log)
    predictor = load_model(model, tracking_uri=cfg.registry.tracking_uri)

    def progress(s: dict) -> None:
        cells = "  ".join(f"{k} VR {v['vr']:.3f} cost {v['cost']:.1f}" for k, v in s["results"].items())
        echo(f"load {s['load']:.2f} (λ={s['lambda']:.2f}/s) κ={s['kappa']:g} start={s['clusters']}: {cells}")

    experiment = ScalingExperimentConfig(copies=copies, seed=seed, slo_margin=router_margin(cfg, predictor, frame),
                                         cost_tolerance=cfg.router.cost_tolerance)
    result = scaling_experiment(kind, frame, predictor, experiment, on_scenario=progress)
    if as_json:
        typer.echo(json.dumps(result))
        return
    _report_errors(result)
    for approach, delta in result["mean_delta"].items():
        typer.echo(f"mean Δ vs {result['baseline']}: {approach:<14} VR {delta['vr']:+.1%} (over {delta['n_vr']} "
                   f"scenarios with VR > 0)  cost {delta['cost']:+.1%}")


@experiment_app.command("sizer")
def experiment_sizer_cmd(
    log: Path = typer.Option(..., "--log", "-l", help="Real query log: calibrates the emulated world, gives SLOs."),
    model: str = typer.Option("models:/iconq@champion", help="Iconq+ model the router and autoscaler use."),
    copies: int = typer.Option(10, help="Copies of every template in BaseWorkload."),
    seed: int = typer.Option(0, help="Seed of workloads and service-time noise."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    config: Path | None = ConfigOption,
) -> None:
    """Spinup Size Selector (Table 3): no-op, horizontal, vertical and add-cluster after a forced trigger."""
    _scaling("sizer", log, model, copies, seed, as_json, config)


@experiment_app.command("trigger")
def experiment_trigger_cmd(
    log: Path = typer.Option(..., "--log", "-l", help="Real query log: calibrates the emulated world, gives SLOs."),
    model: str = typer.Option("models:/iconq@champion", help="Iconq+ model the router and autoscaler use."),
    copies: int = typer.Option(10, help="Copies of every template in BaseWorkload."),
    seed: int = typer.Option(0, help="Seed of workloads and service-time noise."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    live: bool = typer.Option(False, "--live", help="Instead, one live scenario on DuckDB: a size-1 cluster under "
                              "overload, Iconq+ router alone vs with the Autoscaler (real spin-ups)."),
    db: Path | None = typer.Option(None, "--db", help="With --live: the TPC-H database (default: SF 1)."),
    warmup_s: float = typer.Option(1.0, help="With --live: warm-up added to every real spin-up."),
    config: Path | None = ConfigOption,
) -> None:
    """Spinup trigger (Table 4): no-op, Queue@N, observed-only and observed+projected (ours)."""
    if not live:
        _scaling("trigger", log, model, copies, seed, as_json, config)
        return
    from sloctl.datasets.querylog import read_log
    from sloctl.serving.live import live_autoscale_experiment
    from sloctl.training.registry import load_model

    if warmup_s < 0:
        raise typer.BadParameter(f"must be >= 0; got {warmup_s}", param_hint="--warmup-s")
    cfg = load_cli_config(config)
    frame = read_log(log)
    predictor = load_model(model, tracking_uri=cfg.registry.tracking_uri)
    result = live_autoscale_experiment(_live_db(db, cfg), frame, predictor, seed=seed,
                                       slo_margin=router_margin(cfg, predictor, frame),
                                       cost_tolerance=cfg.router.cost_tolerance, warmup_s=warmup_s)
    if as_json:
        typer.echo(json.dumps(result))
        return
    for approach, outcome in result["results"].items():
        events = ", ".join(f"{e['event']} at {e['t']:.2f} s" for e in outcome["events"]) or "no scaling"
        typer.echo(f"live λ={result['lambda']:.2f}/s κ={result['kappa']:g} start=[1]: {approach:<6} "
                   f"VR {outcome['vr']:.3f} cost {outcome['cost']:.1f} ({events})")
