"""``sloctl retry ...``: DiffTry retry budgets — analysis, simulation, sweeps and optimisation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from sloctl._cli_common import ConfigOption, echo, load_cli_config

__all__ = ["retry_app"]

retry_app = typer.Typer(help="Per-class retry budgets (DiffTry): solve, simulate, sweep, optimise.",
                        no_args_is_help=True)

NetworkOption = typer.Option(..., "--network", "-n",
                             help="Network file (YAML, see docs/retry.md); a bare name (tandem, hotel) or "
                                  "configs/networks/NAME.yaml not found here reads the example shipped with sloctl.")
ModelOption = typer.Option("mm1m", "--model", "-m", help="Rejection function: fluid, mm1m or mixed.")


def _load(path: Path):
    from sloctl.config import resolve_network_path
    from sloctl.models.retry_network import load_network

    resolved, packaged = resolve_network_path(path)
    if packaged:
        echo(f"{path} not found here; using the network shipped with sloctl: {resolved}")
    return load_network(resolved)


def _parse_budget(text: str, classes: tuple[str, ...], hint: str) -> dict[str, int]:
    """``high=5,low=1`` -> {"high": 5, "low": 1}, every class named."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in classes or not value.strip().isdigit():
            raise typer.BadParameter(f"expected CLASS=K for classes {', '.join(classes)} (K a whole number), "
                                     f"got {part!r}", param_hint=hint)
        out[name] = int(value)
    missing = [c for c in classes if c not in out]
    if missing:
        raise typer.BadParameter(f"no budget for class {missing[0]!r} in {text!r}", param_hint=hint)
    return out


def _print_table(result: dict, title: str) -> None:
    typer.echo(title)
    for klass, row in result["classes"].items():
        ci = row.get("end_to_end_rejection_ci")
        extra = f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci and ci[0] is not None else ""
        typer.echo(f"  class {klass:<10} end-to-end rejection {row['end_to_end_rejection']:.4f}{extra}  "
                   f"completion {row['completion_probability']:.4f}  success {row['success_per_s']:.2f}/s")
    for service, by_class in result["services"].items():
        cells = "  ".join(f"{c}: s̄ {v['attempt_rejection']:.3f} final {v['final_rejection']:.3f}"
                          for c, v in by_class.items())
        typer.echo(f"  {service:<16} ρ {result['utilisation'][service]:.3f}  {cells}")


@retry_app.command("solve")
def solve_cmd(
    network: Path = NetworkOption,
    model: str = ModelOption,
    residual: bool = typer.Option(False, help="Apply the residual-time correction (§IV.D) to retries."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Per-class, per-service rejection from the DiffTry network analysis (milliseconds)."""
    from sloctl.models.retry import solve_network

    result = solve_network(_load(network), model=model, residual=residual).to_json()
    if as_json:
        typer.echo(json.dumps(result))
        return
    _print_table(result, f"analysis ({model}): converged={result['converged']} in {result['iterations']} "
                         f"iteration(s); uniqueness guaranteed: {result['uniqueness']['guaranteed']}")


@retry_app.command("simulate")
def simulate_cmd(
    network: Path = NetworkOption,
    seed: int = typer.Option(0, help="Seed of arrivals, service times and retry delays."),
    duration_s: float = typer.Option(600.0, help="Simulated seconds, warm-up included (the first max(10%, "
                                                   "5 mean retry delays) are discarded)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run the network in the discrete-event simulator (rejections with 95% confidence intervals)."""
    from sloctl.simulation.retry_sim import simulate_network

    if not duration_s > 0:
        raise typer.BadParameter(f"must be > 0; got {duration_s}", param_hint="--duration-s")

    from sloctl.core.progress import progress as progress_bar

    spec = _load(network)
    with progress_bar("retry simulate: simulated seconds", total=duration_s) as bar:
        def progress(now_s: float, total_s: float, events: int) -> None:
            bar.update(min(now_s, total_s), note=f"{events} events")

        result = simulate_network(spec, seed=seed, duration_s=duration_s, progress=progress).to_json()
    if as_json:
        typer.echo(json.dumps(result))
        return
    _print_table(result, f"simulation: seed {seed}, {duration_s:g} s, {result['events']} events")


@retry_app.command("sweep")
def sweep_cmd(
    network: Path = NetworkOption,
    model: str = ModelOption,
    rhos: str = typer.Option("0.5,1,1.5,2,2.5,3", "--rho", help="Bottleneck offered loads to visit."),
    budgets: list[str] = typer.Option(["high=5,low=1", "high=5,low=5"], "--k", help="Retry budgets, repeatable."),
    fixed: str = typer.Option("", help="Classes whose load stays fixed (default: the first class)."),
    seed: int = typer.Option(0),
    duration_s: float = typer.Option(600.0, help="Simulated seconds per point."),
    no_simulate: bool = typer.Option(False, "--no-simulate", help="Analysis only."),
    plot: Path | None = typer.Option(None, help="Write the Fig. 5-style PNG here."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Analysis vs simulation over a load sweep for several budgets (DiffTry Fig. 5)."""
    from sloctl.core.progress import progress as progress_bar
    from sloctl.simulation.retry_sweep import plot_retry_sweep, retry_sweep

    spec = _load(network)
    loads = _parse_loads(rhos)
    ks = [_parse_budget(b, spec.classes, "--k") for b in budgets]
    fixed_classes = tuple(c.strip() for c in fixed.split(",") if c.strip())
    for c in fixed_classes:
        if c not in spec.classes:
            raise typer.BadParameter(f"unknown class {c!r} (classes: {', '.join(spec.classes)})",
                                     param_hint="--fixed")
    with progress_bar("retry sweep: points", total=len(loads) * len(ks)) as bar:
        def show(p: dict) -> None:
            bar.log(_sweep_line(p))
            bar.advance()

        result = retry_sweep(spec, loads, ks, fixed=fixed_classes, model=model, seed=seed, duration_s=duration_s,
                             simulate=not no_simulate, on_point=show)
    if plot is not None:
        plot_retry_sweep(result, plot, title=f"{network.stem}: end-to-end rejection ({model} vs simulation)")
        echo(f"wrote {plot}")
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(f"{network.stem}: end-to-end rejection by bottleneck load ({model}"
               f"{'' if no_simulate else ' vs simulation'})")
    for p in result["points"]:  # the result on stdout; the same lines went to stderr as progress
        typer.echo("  " + _sweep_line(p))
    if not no_simulate:
        worst = max(p["max_abs_error"] for p in result["points"])
        typer.echo(f"largest |analysis − simulation| over all points and classes: {worst:.4f}")


def _parse_loads(rhos: str) -> list[float]:
    try:
        loads = [float(x) for x in rhos.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated loads like 0.5,1,2; got {rhos!r}",
                                 param_hint="--rho") from None
    if not loads or any(not (0 < x <= 10) for x in loads):
        raise typer.BadParameter(f"loads must be in (0, 10]; got {rhos!r}", param_hint="--rho")
    return loads


def _sweep_line(p: dict) -> str:
    """One point of a sweep: load, budgets, each class's analysed (and simulated) rejection."""
    k = ",".join(f"{c}={v}" for c, v in p["k"].items())
    cells = "  ".join(
        f"{c}: analysis {p['analysis'][c]:.3f}" + (f" sim {p['simulated'][c]:.3f}" if "simulated" in p else "")
        for c in p["analysis"])
    return f"ρ {p['offered_rho']:.2f}  k=({k})  {cells}"


@retry_app.command("optimise")
def optimise_cmd(
    network: Path | None = typer.Option(None, "--network", "-n", help=NetworkOption.help + " Or --traces."),
    traces: list[Path] = typer.Option([], "--traces", "-t", help="Fit the network from these traces or Envoy "
                                      "access logs first (files or folders; as `sloctl fit network`)."),
    name: str | None = typer.Option(None, "--name", help="The network's name in the registry (default: the file's "
                                    "stem; with --traces, the first trace folder's name)."),
    fitted_out: Path | None = typer.Option(None, "--fitted-out", help="With --traces: also write the fitted "
                                           "network file here."),
    sampling: float = typer.Option(1.0, help="With --traces: the fraction of traces kept (see fit network)."),
    weight: list[str] = typer.Option([], "--weight", help="With --traces: CLASS=W, the value of a success."),
    buffer: list[str] = typer.Option([], "--buffer", help="With --traces: SERVICE=N from config."),
    retries_cfg: list[str] = typer.Option([], "--retries", help="With --traces: CLASS=K seen limits from config."),
    model: str = ModelOption,
    objective: str = typer.Option("goodput", help="goodput (weighted by class weight) or targets."),
    target: list[str] = typer.Option([], help="Per-class end-to-end rejection target, CLASS=X (repeatable)."),
    max_amplification: float = typer.Option(math.inf, help="Cap on attempts per original call, network-wide."),
    max_retries: int = typer.Option(6, help="Largest k considered."),
    rho: float | None = typer.Option(None, "--rho", "--load",
                                     help="Optimise at this bottleneck offered load (1 = saturated): every class's "
                                          "external arrivals are scaled by one factor to reach it (default: the "
                                          "file's arrivals). Budgets chosen at a light load are k = 0."),
    per_hop: bool = typer.Option(False, help="Refine the budgets hop by hop (coordinate descent)."),
    confirm_s: float = typer.Option(300.0, help="Simulated seconds to confirm the winner (0: skip)."),
    seed: int = typer.Option(0),
    register: bool = typer.Option(True, help="Register the policy in MLflow as 'retry-policy-NETWORK' (alias "
                                  "champion; NETWORK: the file's name, e.g. hotel)."),
    as_json: bool = typer.Option(False, "--json", help="Print the policy as JSON."),
    config: Path | None = ConfigOption,
) -> None:
    """Choose per-class retry budgets with the analysis, confirm them in the simulator, register them.

    With --traces the network is first fitted from traces or access logs (as
    `sloctl fit network`) and registered with their provenance (files, hashes,
    window).
    """
    from sloctl.core.progress import progress
    from sloctl.training.retry_budget import BudgetSearch, confirm_by_simulation, optimise_budgets

    spec, network = _network_or_traces(network, traces, name, fitted_out, sampling, weight, buffer, retries_cfg)
    targets = _parse_targets(target)
    search = BudgetSearch(objective=objective, targets=targets, max_amplification=max_amplification,
                          max_retries=max_retries, per_hop=per_hop, model=model)
    if rho is not None and not 0 < rho <= 100:
        raise typer.BadParameter(f"must be a load in (0, 100] (1 = the bottleneck saturated); got {rho}",
                                 param_hint="--rho")
    with progress("retry optimise: budget vectors", total=None) as bar:
        policy = optimise_budgets(spec, search, load=rho, on_progress=bar.callback())
    if rho is not None:
        echo(f"optimising at offered load ρ = {policy.search['offered_rho']:.2f} "
             f"(arrivals × {policy.search['load_scale']:.3g})")
    if confirm_s > 0:
        echo(f"confirming in the simulator ({confirm_s:g} s, seed {seed}) ...")
        policy = confirm_by_simulation(policy, seed=seed, duration_s=confirm_s)
    doc = policy.to_doc()
    if register:
        doc["registered"] = _register_retry(policy, network, config)
    if as_json:
        typer.echo(json.dumps(doc))
    else:
        _print_budgets(policy)


def _network_or_traces(network: Path | None, traces: list[Path], name: str | None, fitted_out: Path | None,
                       sampling: float, weight: list[str], buffer: list[str], retries: list[str]):
    """The network to optimise (a file, or fitted from traces) and the name it is registered under."""
    if (network is None) == (not traces):
        raise typer.BadParameter("give a network file (--network) or traces to fit one from (--traces), not both",
                                 param_hint="--network / --traces")
    if network is not None:
        return _load(network), Path(name) if name else network
    from sloctl._cli_fit import fit_from_cli

    fitted = fit_from_cli(traces, fmt=None, class_attribute="sloctl.class", sampling=sampling, buffers=buffer,
                          retries=retries, servers=[], weights=weight, window=None, log_format=None)
    for service, reason in fitted.report["unfitted"].items():
        echo(f"not fitted: {service}: {reason}")
    if fitted_out is not None:
        from sloctl.core.files import atomic_write

        with atomic_write(fitted_out, "w") as f:
            f.write(fitted.to_yaml())
        echo(f"wrote {fitted_out}")
    first = traces[0] if traces[0].is_dir() else traces[0].parent
    return fitted.spec(), Path(name or first.resolve().name)


def _parse_targets(target: list[str]) -> dict[str, float]:
    targets: dict[str, float] = {}
    for item in target:
        name, _, value = item.partition("=")
        try:
            targets[name] = float(value)
        except ValueError:
            raise typer.BadParameter(f"expected CLASS=REJECTION like high=0.05, got {item!r}",
                                     param_hint="--target") from None
    return targets


def _register_retry(policy, network: Path, config: Path | None) -> dict:
    """Register ``policy`` as ``retry-policy-NETWORK`` (alias champion); what the JSON's ``registered`` says."""
    from sloctl.training.retry_budget import network_name, register_retry_policy, retry_policy_name, zero_budget_note

    cfg = load_cli_config(config)
    net = network_name(network)
    name = retry_policy_name(net)
    version = register_retry_policy(policy, tracking_uri=cfg.registry.tracking_uri,
                                    experiment=cfg.registry.experiment, source=str(network), network=net)
    echo(f"registered {name} v{version} (alias champion) in {cfg.registry.tracking_uri}; "
         f"sloctl serve serves it at /v1/retry-policy?network={net}")
    note = zero_budget_note(policy)
    if note:
        echo(note)
    return {"name": name, "version": version, "alias": "champion", "network": net}


def _print_budgets(policy) -> None:
    from sloctl.models.retry_timing import sidecar_timing

    verdict = "meets the constraints" if policy.feasible else "INFEASIBLE: best effort shown"
    typer.echo(f"best budgets at offered load ρ = {policy.search['offered_rho']:.2f} ({verdict}); amplification "
               f"{policy.amplification:.2f} attempts per call, weighted goodput {policy.score:.2f}/s, "
               f"{policy.evaluated} candidates")
    for klass, row in policy.retries.items():
        ks = sorted(set(row.values()))
        k_text = str(ks[0]) if len(ks) == 1 else json.dumps(row)
        sim = (policy.simulated or {}).get(klass)
        sim_text = f"  simulated {sim['end_to_end_rejection']:.4f}" if sim else ""
        predicted = policy.predicted[klass]["end_to_end_rejection"]
        typer.echo(f"  {klass:<10} k={k_text}  predicted rejection {predicted:.4f}{sim_text}")
        if klass in policy.explanation:
            typer.echo(f"  {'':<10} why k=0: {policy.explanation[klass]}")
    timing = sidecar_timing(policy.network, policy.retries)
    typer.echo(f"sidecars: every retry waits U[0, {timing['back_off_base_s']:g} s) (Envoy back-off base = max), "
               f"mean {timing['retry_delay_s']:g} s = the analysis's retry delay ({timing['retry_delay_source']})")
