"""Tuning Svalinn's admission settings on a workload description, in the simulator, and registering them.

``tune_admission`` runs an Optuna study (seeded TPE) over the credit
controller's step (ε) and dead-band, its micro-experiment length, and the
high class's share of credits. Each trial runs the multi-resource server
simulator at the workload's offered load; the objective is class-weighted
goodput, with requests beyond their SLO earning nothing (so p99 is held by
construction). The winner is re-run to record the m_semaphore bandit's arm
values, which the live middleware uses as a warm start. The result is an
:class:`~sloctl.control.policies.AdmissionPolicy`, registered in MLflow under
its kind (``admission-policy``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sloctl.control.admission import Svalinn
from sloctl.control.credits import ClassShare
from sloctl.control.policies import AdmissionPolicy, CreditSettings, MSemaphoreSettings
from sloctl.registry.store import register_policy
from sloctl.simulation.server_sim import RequestType, ServerConfig, capacity_per_s, isolated_service_s, simulate

__all__ = ["load_workload", "register_admission_policy", "tune_admission"]

_KEYS = {"server", "load_factor", "priorities", "weights", "types"}
_TYPE_KEYS = {"name", "klass", "cpu_s", "mem_bytes", "lock", "lock_s", "slo_s", "share", "thread_bytes_per_s"}


def load_workload(path: str | Path) -> dict[str, Any]:
    """Read and check a workload description (see ``configs/admission_workload.yaml``)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: workload description not found.")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: must be a mapping with keys {sorted(_KEYS)}.")
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key {sorted(unknown)[0]!r} (known keys: {', '.join(sorted(_KEYS))}).")
    types = raw.get("types")
    if not isinstance(types, list) or not types:
        raise ValueError(f"{path}: 'types' must be a non-empty list of request types.")
    for i, t in enumerate(types):
        bad = set(t) - _TYPE_KEYS if isinstance(t, Mapping) else {"<not a mapping>"}
        if bad:
            raise ValueError(f"{path}: types[{i}]: unknown key {sorted(bad)[0]!r} "
                             f"(known: {', '.join(sorted(_TYPE_KEYS))}).")
        for key in ("cpu_s", "slo_s"):
            if not isinstance(t.get(key), int | float) or t[key] <= 0:
                raise ValueError(f"{path}: types[{i}].{key} must be a positive number of seconds, got {t.get(key)!r}.")
    load = raw.get("load_factor", 2.0)
    if not isinstance(load, int | float) or load <= 0:
        raise ValueError(f"{path}: 'load_factor' must be a positive number (x capacity), got {load!r}.")
    return {"server": dict(raw.get("server") or {}), "load_factor": float(load),
            "priorities": dict(raw.get("priorities") or {}), "weights": dict(raw.get("weights") or {}),
            "types": [dict(t) for t in types]}


def _build(workload: Mapping[str, Any]):

    config = ServerConfig(**workload["server"])
    types = [RequestType(**t) for t in workload["types"]]
    capacity, _ = capacity_per_s(types, config)
    expected = {t.name: isolated_service_s(t, config) for t in types}
    return config, types, capacity, expected


def _run(workload: Mapping[str, Any], params: Mapping[str, Any], *, seed: int, duration_s: float):

    config, types, capacity, expected = _build(workload)
    priorities = workload["priorities"] or None
    shares = None
    if priorities and len(priorities) > 1:
        top = max(priorities, key=priorities.get)
        shares = {c: (params["top_share"] if c == top else (1 - params["top_share"]) / (len(priorities) - 1))
                  for c in priorities}
    policy = Svalinn.for_server(config.cores, config.bandwidth_bytes_per_s, expected, priorities=priorities,
                                shares=shares, seed=seed,
                                credit_kwargs={"epsilon": params["epsilon"], "dead_band": params["dead_band"],
                                               "experiment_s": params["experiment_s"]})
    result = simulate(types, policy, rate_per_s=workload["load_factor"] * capacity, duration_s=duration_s,
                      config=config, warmup_s=duration_s / 4, seed=seed)
    weights = workload["weights"]
    score = sum(weights.get(t.klass, 1.0) * result.goodput_per_s(t.name) for t in types)
    return score, result, policy, shares


def tune_admission(workload: Mapping[str, Any], *, trials: int = 12, seed: int = 0, duration_s: float = 0.08,
                   on_trial: Callable[[int, float], None] | None = None) -> AdmissionPolicy:
    """Search the controller's settings for ``workload`` in the simulator.

    Returns:
        The :class:`~sloctl.control.policies.AdmissionPolicy`: credit settings,
        classes and shares, the m_semaphore's capacity and arm values, the
        winner's metrics, the search settings and the workload; provenance
        ``data_hash`` (of the workload) and ``seed``.
    """
    import optuna

    if trials < 1:
        raise ValueError(f"The 'trials' parameter must be >= 1, got {trials!r}.")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    default = {"epsilon": 0.1, "dead_band": 0.02, "experiment_s": 0.002, "top_share": 0.5}
    study.enqueue_trial(default)  # the library defaults are always a candidate

    def objective(trial: optuna.Trial) -> float:
        params = {"epsilon": trial.suggest_float("epsilon", 0.02, 0.3, log=True),
                  "dead_band": trial.suggest_float("dead_band", 0.0, 0.1),
                  "experiment_s": trial.suggest_float("experiment_s", 5e-4, 5e-3, log=True),
                  "top_share": trial.suggest_float("top_share", 0.2, 0.9)}
        score = _run(workload, params, seed=seed, duration_s=duration_s)[0]
        if on_trial is not None:
            on_trial(trial.number, score)
        return score

    study.optimize(objective, n_trials=trials)
    best = dict(study.best_params)
    score, result, policy, shares = _run(workload, best, seed=seed, duration_s=duration_s)
    baseline = study.trials[0].value
    return AdmissionPolicy(
        credits=CreditSettings(epsilon=best["epsilon"], dead_band=best["dead_band"],
                               experiment_s=best["experiment_s"], initial_credits=int(policy.credits_.credits)),
        classes=tuple(ClassShare(c, p, (shares or {}).get(c, 1.0)) for c, p in (workload["priorities"] or {}).items()),
        msem=MSemaphoreSettings(capacity=int(policy.tuner_.best),
                                arm_values={int(k): float(v) for k, v in policy.tuner_.values.items()},
                                alpha=0.7, omega=0.8, epsilon=0.3),
        metrics={"weighted_goodput_per_s": score, "default_weighted_goodput_per_s": baseline,
                 "drop_rate": result.drop_rate,
                 **{f"goodput_per_s_{n}": result.goodput_per_s(n) for n in result.types},
                 **{f"p99_s_{n}": result.p_latency_s(n, 0.99) for n in result.types}},
        search={"trials": trials, "seed": seed, "duration_s": duration_s},
        workload=dict(workload),
        provenance={"data_hash": _workload_hash(workload), "seed": str(seed)},
    )


def _workload_hash(workload: Mapping[str, Any]) -> str:
    """A short content hash of a workload description (an admission policy's data hash)."""
    return hashlib.sha256(json.dumps(workload, sort_keys=True).encode()).hexdigest()[:16]


def register_admission_policy(policy: AdmissionPolicy, *, tracking_uri: str, experiment: str,
                              source: str = "") -> str:
    """Register ``policy`` under its kind (``admission-policy``, alias champion); returns the version.

    ``source`` (the workload file) joins its provenance.
    """
    from dataclasses import replace


    policy = replace(policy, provenance={"data_hash": _workload_hash(policy.workload), **policy.provenance,
                                         **({"source": source} if source else {})})
    c = policy.credits
    params = {"credits_epsilon": c.epsilon, "credits_dead_band": c.dead_band, "credits_experiment_s": c.experiment_s,
              "credits_initial_credits": c.initial_credits, "msem_capacity": policy.msem.capacity,
              **{f"share_{s.name}": s.share for s in policy.classes}}
    # provenance: what the settings were tuned on (the workload, its load), as tags and a dataset input
    workload = dict(policy.workload or {})
    tags = {"workload_source": source, "provenance.workload_hash": policy.provenance["data_hash"],
            "provenance.load_factor": str(workload.get("load_factor", "")),
            **({"provenance.workload": Path(source).stem} if source else {})}
    inputs = []
    if isinstance(workload.get("types"), list) and workload["types"]:
        import pandas as pd

        inputs.append((pd.DataFrame([dict(t) for t in workload["types"]]),
                       f"workload-{Path(source).stem if source else 'admission'}", "optimisation"))
    return register_policy(policy, tracking_uri=tracking_uri, experiment=experiment, params=params,
                           metrics=dict(policy.metrics), tags=tags, inputs=inputs)
