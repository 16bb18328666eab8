"""Choosing per-class retry budgets k_p with the DiffTry analysis (and confirming them by simulation).

The analysis (:func:`sloctl.models.retry.solve_network`) takes milliseconds,
so the search evaluates it exhaustively over per-class budgets (one k for every
hop of a class) and, with ``per_hop``, refines each (class, hop) by coordinate
descent. Two objectives:

* ``goodput`` — maximise Σ_p w_p · success_per_s_p (class weights from the
  network file, default 1);
* ``targets`` — meet per-class end-to-end rejection targets; among the budgets
  that do, the highest weighted goodput wins; when none does, the one with the
  smallest worst shortfall is returned and marked infeasible.

Both respect a cap on retry amplification: attempts (originals and retries,
every hop) per original call. The winner is then run in the discrete-event
simulator — an independent check of the approximation it was chosen with — and
the policy (budgets plus the predicted and simulated rejection tables) can be
registered in MLflow as ``retry-policy-<network>`` (one registered model per
network, so that optimising one network never replaces another's budgets) for
the runtime and the Envoy sidecars. The registration records what the budgets
were optimised on (network name and content hash, offered load, arrivals) as
``provenance.*`` tags and the network as an MLflow dataset input, and says why
when every class got k = 0 (:func:`zero_budget_note`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sloctl.control.policies import RetryPolicy
from sloctl.models.retry import offered_rho, scale_to_load, solve_network
from sloctl.models.retry_network import NetworkSpec, network_from_mapping
from sloctl.registry.store import load_policy, register_policy
from sloctl.simulation.retry_sim import simulate_network

__all__ = ["BudgetSearch", "explain_no_retries", "load_retry_policy", "network_name", "optimise_budgets",
           "register_retry_policy", "retry_policy_name", "zero_budget_note"]

Objective = Literal["goodput", "targets"]


@dataclass(frozen=True)
class BudgetSearch:
    """What to optimise and within which bounds."""

    objective: Objective = "goodput"
    targets: Mapping[str, float] = field(default_factory=dict)
    max_amplification: float = math.inf
    max_retries: int = 6
    per_hop: bool = False
    model: str = "mm1m"

    def validate(self, spec: NetworkSpec) -> None:
        if self.objective not in ("goodput", "targets"):
            raise ValueError(f"The 'objective' parameter must be 'goodput' or 'targets', got {self.objective!r}.")
        if self.objective == "targets" and not self.targets:
            raise ValueError("The 'targets' parameter must name at least one class when objective is 'targets'.")
        for klass, target in self.targets.items():
            if klass not in spec.classes:
                raise ValueError(f"The 'targets' parameter names unknown class {klass!r} "
                                 f"(classes: {', '.join(spec.classes)}).")
            if not 0.0 <= target <= 1.0:
                raise ValueError(f"The target of class {klass!r} must be a rejection in [0, 1], got {target!r}.")
        if not self.max_amplification >= 1.0:
            raise ValueError(f"The 'max_amplification' parameter must be >= 1 (attempts per call), "
                             f"got {self.max_amplification!r}.")
        if not 0 <= self.max_retries <= 20:
            raise ValueError(f"The 'max_retries' parameter must be in [0, 20], got {self.max_retries!r}.")


def _evaluate(spec: NetworkSpec, search: BudgetSearch) -> tuple[float, float, float, dict[str, dict[str, float]]]:
    """(goodput, amplification, worst target shortfall, per-class table) of ``spec`` under the analysis."""

    out = solve_network(spec, model=search.model).to_json()
    table = {c: {"end_to_end_rejection": float(v["end_to_end_rejection"]), "success_per_s": float(v["success_per_s"])}
             for c, v in out["classes"].items()}
    goodput = sum(spec.class_weight(c) * table[c]["success_per_s"] for c in spec.classes)
    offered = sum(v["offered_per_s"] for row in out["services"].values() for v in row.values())
    attempts = sum(v["attempts_per_s"] for row in out["services"].values() for v in row.values())
    amplification = attempts / offered if offered > 0 else 1.0
    shortfall = max((table[c]["end_to_end_rejection"] - t for c, t in search.targets.items()), default=0.0)
    return goodput, amplification, shortfall, table


def _rank(search: BudgetSearch, goodput: float, amplification: float, shortfall: float, total_k: int) -> tuple:
    """Sort key, smaller is better: feasibility first, then the objective, then fewer retries."""
    over_cap = max(0.0, amplification - search.max_amplification)
    if search.objective == "targets":
        return (over_cap > 0, max(shortfall, 0.0) > 1e-12, over_cap, max(shortfall, 0.0), -goodput, total_k)
    return (over_cap > 0, over_cap, -goodput, amplification, total_k)


def optimise_budgets(spec: NetworkSpec, search: BudgetSearch | None = None, *, load: float | None = None,
                     on_progress: Callable[[int, int], None] | None = None) -> RetryPolicy:
    """Search retry budgets for ``spec`` with the analysis.

    Budgets are chosen for one load: at a light load no retry is ever needed
    and the search returns k = 0, which would leave the classes unprotected
    when overload comes. ``load`` scales every class's external arrivals by
    one factor until the bottleneck's offered load is that ρ
    (:func:`~sloctl.models.retry.scale_to_load`); the policy's network holds
    the scaled arrivals and ``search`` records ``offered_rho`` and ``load_scale``.

    Args:
        spec: the network (its retry limits are the starting point only).
        search: objective and bounds (default: maximise weighted goodput).
        load: the bottleneck offered load to optimise at (None: the network's own arrivals).
        on_progress: called with (evaluated, total) during the uniform grid.

    Returns:
        The best :class:`RetryPolicy` found (``feasible`` False when no budget
        met the targets and the amplification cap); its ``explanation`` says
        why each class left without retries got none (:func:`explain_no_retries`).
    """
    search = search or BudgetSearch()
    search.validate(spec)
    rho_file = offered_rho(spec)
    if load is not None:
        spec = scale_to_load(spec, load)
    classes = spec.classes
    grid = list(itertools.product(range(search.max_retries + 1), repeat=len(classes)))
    best_key, best_spec, best_eval = None, spec, None
    for n, ks in enumerate(grid, 1):
        candidate = spec.with_retries(dict(zip(classes, ks, strict=True)))
        ev = _evaluate(candidate, search)
        key = _rank(search, ev[0], ev[1], ev[2], sum(ks))
        if best_key is None or key < best_key:
            best_key, best_spec, best_eval = key, candidate, ev
        if on_progress is not None and (n % 25 == 0 or n == len(grid)):
            on_progress(n, len(grid))
    evaluated = len(grid)
    if search.per_hop:
        improved = True
        while improved:
            improved = False
            for klass in classes:
                for service in spec.service_names:
                    for k in range(search.max_retries + 1):
                        row = dict(best_spec.retries[klass])
                        if row[service] == k:
                            continue
                        row[service] = k
                        candidate = best_spec.with_retries({klass: row})
                        ev = _evaluate(candidate, search)
                        evaluated += 1
                        total = sum(sum(r.values()) for r in candidate.retries.values())
                        key = _rank(search, ev[0], ev[1], ev[2], total)
                        if key < best_key:
                            best_key, best_spec, best_eval, improved = key, candidate, ev, True
    goodput, amplification, shortfall, table = best_eval
    feasible = amplification <= search.max_amplification + 1e-12 and (
        search.objective != "targets" or shortfall <= 1e-12)
    retries = {c: dict(best_spec.retries[c]) for c in classes}
    network = best_spec.to_mapping()
    rho = offered_rho(best_spec)
    return RetryPolicy(retries=retries, feasible=feasible, score=goodput,
                       amplification=amplification, predicted=table,
                       search={"objective": search.objective, "targets": dict(search.targets),
                               "max_amplification": None if math.isinf(search.max_amplification)
                               else search.max_amplification,
                               "max_retries": search.max_retries, "per_hop": search.per_hop, "model": search.model,
                               "offered_rho": rho, "load_scale": rho / rho_file if rho_file > 0 else 1.0},
                       network=network, evaluated=evaluated,
                       provenance={"data_hash": policy_hash({"network": network, "retries": retries})},
                       explanation=explain_no_retries(best_spec, search, best_eval))


def explain_no_retries(spec: NetworkSpec, search: BudgetSearch,
                       chosen: tuple[float, float, float, dict[str, dict[str, float]]] | None = None
                       ) -> dict[str, str]:
    """Why each class of ``spec`` with k = 0 at every hop got no retries: ``{class: reason}``.

    The reason compares the chosen budgets with the same budgets plus one
    retry per hop for that class alone, under the analysis: the retry breaks
    the amplification cap, or pushes a class past its target, or costs the
    other classes more weighted goodput than it wins (at overload a retry adds
    attempts at a full service, and those crowd out the other classes), or wins
    nothing because at this load the class is (almost) never rejected — then
    ties go to fewer retries, and budgets for overload need ``load``.
    """
    chosen = chosen or _evaluate(spec, search)
    goodput, _, shortfall, table = chosen
    rho = offered_rho(spec)
    out: dict[str, str] = {}
    for klass in spec.classes:
        if any(spec.retries[klass].values()):
            continue
        g1, amp1, short1, table1 = _evaluate(spec.with_retries({klass: 1}), search)
        own0, own1 = table[klass]["end_to_end_rejection"], table1[klass]["end_to_end_rejection"]
        tol = 1e-9 * max(1.0, abs(goodput))
        if amp1 > search.max_amplification + 1e-12:
            out[klass] = (f"at load ρ = {rho:.2f}, one retry per hop would raise amplification to {amp1:.2f} "
                          f"attempts per call, above the cap {search.max_amplification:g}")
        elif search.objective == "targets" and short1 > max(shortfall, 0.0) + 1e-12:
            worst = max(search.targets, key=lambda c: table1[c]["end_to_end_rejection"] - search.targets[c])
            out[klass] = (f"at load ρ = {rho:.2f}, one retry per hop would push class {worst!r} to rejection "
                          f"{table1[worst]['end_to_end_rejection']:.3f}, above its target {search.targets[worst]:g}")
        elif g1 < goodput - tol:
            lost = sum(spec.class_weight(c) * (table[c]["success_per_s"] - table1[c]["success_per_s"])
                       for c in spec.classes if c != klass)
            won = spec.class_weight(klass) * (table1[klass]["success_per_s"] - table[klass]["success_per_s"])
            out[klass] = (f"at load ρ = {rho:.2f}, one retry per hop would lower the rejection of {klass!r} from "
                          f"{own0:.3f} to {own1:.3f} (+{won:.2f} weighted successes/s) but adds attempts at full "
                          f"services that reject the other classes' calls (−{lost:.2f}/s): weighted goodput "
                          f"{goodput:.2f} → {g1:.2f}/s")
        else:
            out[klass] = (f"at load ρ = {rho:.2f}, class {klass!r} is rejected {own0:.1e} of the time without "
                          f"retries: a retry wins nothing (weighted goodput {g1 - goodput:+.2g}/s) and ties go "
                          f"to fewer retries; optimise at the load the budgets must hold (--rho)")
    return out


def confirm_by_simulation(policy: RetryPolicy, *, seed: int = 0, duration_s: float = 600.0) -> RetryPolicy:
    """``policy`` with its budgets also run in the discrete-event simulator (per-class rejection with CIs)."""
    from dataclasses import replace

    spec = network_from_mapping(policy.network, source="<policy>")
    sim = simulate_network(spec, seed=seed, duration_s=duration_s).to_json()
    simulated = {c: {"end_to_end_rejection": v["end_to_end_rejection"],
                     "end_to_end_rejection_ci": v["end_to_end_rejection_ci"],
                     "success_per_s": v["success_per_s"], "calls_per_success": v["calls_per_success"]}
                 for c, v in sim["classes"].items()}
    return replace(policy, simulated=simulated, provenance={**policy.provenance, "seed": str(seed)})


def policy_hash(policy: Mapping[str, Any]) -> str:
    """A short content hash of a policy's network and budgets (its data hash)."""
    blob = json.dumps({"network": policy["network"], "retries": policy["retries"]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def network_name(source: str) -> str:
    """The network's name from its file (``configs/networks/hotel.yaml`` is ``hotel``), as a registry name allows.

    Raises:
        ValueError: nothing usable is left (names are letters, digits, ``_``, ``.`` and ``-``).
    """
    import re
    from pathlib import Path

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(source)).stem).strip("-.")
    if not stem:
        raise ValueError(f"The 'network' of a retry policy must be a name of letters, digits, '_', '.' or '-', "
                         f"got {source!r}.")
    return stem


def retry_policy_name(network: str) -> str:
    """The registered model of ``network``'s retry budgets: ``retry-policy-<network>``.

    MLflow refuses ``/`` in registered-model names, hence ``-``. ``sloctl serve``
    serves each network's policy by this name (``?network=`` on
    ``/v1/retry-policy``).
    """
    return f"{RetryPolicy.kind}-{network_name(network)}"


def _network_frame(policy: RetryPolicy) -> Any:
    """The network a policy was optimised on, one row per (class, service): arrivals, capacity, buffer, k."""
    import pandas as pd

    net = policy.network
    rows = []
    for klass, row in policy.retries.items():
        for service, k in row.items():
            body = net["services"][service]
            rows.append({"class": klass, "service": service,
                         "arrival_per_s": float(net.get("arrivals", {}).get(klass, {}).get(service, 0.0)),
                         "capacity_per_s": float(body["capacity_per_s"]), "buffer": int(body["buffer"]),
                         "k": int(k)})
    return pd.DataFrame(rows)


def zero_budget_note(policy: RetryPolicy) -> str | None:
    """Why every class got k = 0, in one line (``None`` when some class may retry).

    The optimiser's own reasons (``policy.explanation``, per class, see
    :func:`explain_no_retries`); a policy without them (registered by an
    older sloctl) says only that it was not explained.
    """
    if any(k for row in policy.retries.values() for k in row.values()):
        return None
    reasons = "; ".join(f"{klass}: {why}" for klass, why in (policy.explanation or {}).items())
    return "every class gets k = 0 (no retries) — " + (reasons or "the optimiser gave no reason")


def register_retry_policy(policy: RetryPolicy, *, tracking_uri: str, experiment: str, source: str = "",
                          network: str | None = None, name: str | None = None, alias: str = "champion") -> str:
    """Log ``policy`` to MLflow and register it as ``retry-policy-<network>``; ``alias`` moves to it.

    ``source`` (the network file) and, if the policy lacks one, its data hash
    (network and budgets) join its provenance, with what the budgets were
    optimised on: ``network`` (default: the file's stem), the network's own
    hash, its offered load ``ρ`` and arrivals per second, recorded as
    ``provenance.*`` tags, and the network table as a dataset input. Each
    class the optimiser gave no retries has its reason as tag
    ``why_k0.<class>``; when every class got k = 0, :func:`zero_budget_note` is recorded
    (``registration_note`` tag) for the caller to print. A policy whose
    network neither ``network`` nor ``source`` names is registered as plain
    ``retry-policy`` (what ``sloctl serve`` serves without ``?network=``).

    Returns:
        The registered version.
    """
    from dataclasses import replace


    net_name = network_name(network or source) if (network or source) else "unnamed"
    spec = network_from_mapping(policy.network, source="<policy>")
    arrivals = sum(float(v) for row in policy.network.get("arrivals", {}).values() for v in row.values())
    load = {"network": net_name, "network_hash": policy_hash({"network": policy.network, "retries": {}}),
            "offered_rho": f"{offered_rho(spec):.6g}", "arrivals_per_s": f"{arrivals:.6g}",
            "load_scale": f"{float(policy.search.get('load_scale', 1.0)):.6g}"}
    fitted = policy.network.get("provenance") or {}
    if fitted:  # a network fitted from traces: which files (and their hashes) over which window
        files = fitted.get("files", [])
        window = fitted.get("window") or {}
        load.update({"fitted_from": str(fitted.get("fitted_from", "")),
                     "trace_files": ",".join(str(f["path"]).rsplit("/", 1)[-1] for f in files)[:5000],
                     "trace_sha256": ",".join(f["sha256"][:16] for f in files)[:5000],
                     "trace_window_s": f"{window.get('start_s', '')}:{window.get('end_s', '')}"})
    provenance = {"data_hash": policy_hash({"network": policy.network, "retries": policy.retries}),
                  **policy.provenance, **({"source": source} if source else {}), **load}
    policy = replace(policy, provenance=provenance)
    metrics = {"amplification": policy.amplification, "weighted_goodput_per_s": policy.score}
    for c, row in policy.predicted.items():
        metrics[f"predicted_rejection_{c}"] = row["end_to_end_rejection"]
    for c, row in (policy.simulated or {}).items():
        metrics[f"simulated_rejection_{c}"] = row["end_to_end_rejection"]
    params = {"objective": policy.search["objective"], "model": policy.search["model"],
              "max_retries": policy.search["max_retries"], "per_hop": policy.search["per_hop"],
              "max_amplification": policy.search["max_amplification"],
              **{f"k_{c}": json.dumps(v, sort_keys=True) for c, v in policy.retries.items()}}
    note = zero_budget_note(policy)
    tags = {"network_source": source, "feasible": str(policy.feasible),
            **{f"provenance.{k}": v for k, v in load.items()}, **({"registration_note": note} if note else {}),
            **{f"why_k0.{klass}": why[:5000] for klass, why in policy.explanation.items()}}  # MLflow caps values
    default = retry_policy_name(net_name) if (network or source) else RetryPolicy.kind
    return register_policy(policy, name=name or default, tracking_uri=tracking_uri,
                           experiment=experiment, params=params, metrics=metrics, tags=tags, alias=alias,
                           inputs=[(_network_frame(policy), f"network-{net_name}", "optimisation")])


def load_retry_policy(uri: str = f"models:/{RetryPolicy.kind}@champion", *, tracking_uri: str) -> RetryPolicy:
    """The :class:`RetryPolicy` registered under ``uri``."""

    return load_policy(uri, tracking_uri=tracking_uri, kind=RetryPolicy.kind)
