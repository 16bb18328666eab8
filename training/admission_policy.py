"""Tuning Svalinn's admission settings on a workload description, in the simulator, and registering them.

``tune_admission`` runs an Optuna study (seeded TPE) over the credit
controller's step (ε) and dead-band, its micro-experiment length, and the
high class's share of credits. Each trial runs the multi-resource server
simulator at the workload's offered load; the objective is class-weighted
goodput, with requests beyond their SLO earning nothing (so p99 is held by
construction). The winner is re-run to record the m_semaphore bandit's arm
values, which the live middleware uses as a warm start. The result is a plain
JSON policy document, registered in MLflow as ``admission-policy``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["POLICY_NAME", "controller_from_policy", "load_workload", "register_admission_policy", "tune_admission"]

POLICY_NAME = "admission-policy"
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
    from sloctl.simulation.server_sim import RequestType, ServerConfig, capacity_per_s, isolated_service_s

    config = ServerConfig(**workload["server"])
    types = [RequestType(**t) for t in workload["types"]]
    capacity, _ = capacity_per_s(types, config)
    expected = {t.name: isolated_service_s(t, config) for t in types}
    return config, types, capacity, expected


def _run(workload: Mapping[str, Any], params: Mapping[str, Any], *, seed: int, duration_s: float):
    from sloctl.simulation.admission_policies import SvalinnPolicy
    from sloctl.simulation.server_sim import simulate

    config, types, capacity, expected = _build(workload)
    priorities = workload["priorities"] or None
    shares = None
    if priorities and len(priorities) > 1:
        top = max(priorities, key=priorities.get)
        shares = {c: (params["top_share"] if c == top else (1 - params["top_share"]) / (len(priorities) - 1))
                  for c in priorities}
    policy = SvalinnPolicy(config.cores, config.bandwidth_bytes_per_s, expected, priorities=priorities,
                           shares=shares, seed=seed,
                           credit_kwargs={"epsilon": params["epsilon"], "dead_band": params["dead_band"],
                                          "experiment_s": params["experiment_s"]})
    result = simulate(types, policy, rate_per_s=workload["load_factor"] * capacity, duration_s=duration_s,
                      config=config, warmup_s=duration_s / 4, seed=seed)
    weights = workload["weights"]
    score = sum(weights.get(t.klass, 1.0) * result.goodput_per_s(t.name) for t in types)
    return score, result, policy, shares


def tune_admission(workload: Mapping[str, Any], *, trials: int = 12, seed: int = 0, duration_s: float = 0.08,
                   on_trial: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Search the controller's settings for ``workload`` in the simulator.

    Returns:
        The policy document: ``{"kind": "admission-policy", "credits": {...}, "classes": [...],
        "msem": {"capacity", "arm_values", ...}, "metrics": {...}, "workload": ...}``.
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
    doc = {
        "kind": POLICY_NAME,
        "credits": {"epsilon": best["epsilon"], "dead_band": best["dead_band"], "experiment_s": best["experiment_s"],
                    "initial_credits": int(policy.credits_.credits)},
        "classes": [{"name": c, "priority": p, "share": (shares or {}).get(c, 1.0)}
                    for c, p in (workload["priorities"] or {}).items()],
        "msem": {"capacity": int(policy.tuner_.best),
                 "arm_values": {str(k): v for k, v in policy.tuner_.values.items()},
                 "alpha": 0.7, "omega": 0.8, "epsilon": 0.3},
        "metrics": {"weighted_goodput_per_s": score, "default_weighted_goodput_per_s": baseline,
                    "drop_rate": result.drop_rate,
                    **{f"goodput_per_s_{n}": result.goodput_per_s(n) for n in result.types},
                    **{f"p99_s_{n}": result.p_latency_s(n, 0.99) for n in result.types}},
        "search": {"trials": trials, "seed": seed, "duration_s": duration_s},
        "workload": dict(workload),
    }
    return doc


def register_admission_policy(doc: Mapping[str, Any], *, tracking_uri: str, experiment: str, source: str = "") -> str:
    """Register ``doc`` as ``admission-policy`` (alias champion); returns the version."""
    from sloctl.registry.store import register_policy

    data_hash = hashlib.sha256(json.dumps(doc["workload"], sort_keys=True).encode()).hexdigest()[:16]
    params = {**{f"credits_{k}": v for k, v in doc["credits"].items()}, "msem_capacity": doc["msem"]["capacity"],
              **{f"share_{c['name']}": c["share"] for c in doc["classes"]}}
    return register_policy(dict(doc), name=POLICY_NAME, tracking_uri=tracking_uri, experiment=experiment,
                           data_hash=data_hash, params=params, metrics=dict(doc["metrics"]),
                           tags={"workload_source": source})


def controller_from_policy(doc: Mapping[str, Any], *, seed: int = 0):
    """A :class:`~sloctl.control.credits.CreditController` configured from an admission policy."""
    from sloctl.control.credits import ClassShare, CreditController

    credits = doc["credits"]
    classes = [ClassShare(c["name"], c["priority"], c["share"]) for c in doc.get("classes", [])]
    return CreditController(initial_credits=credits["initial_credits"], epsilon=credits["epsilon"],
                            dead_band=credits["dead_band"], experiment_s=credits["experiment_s"],
                            classes=classes if len(classes) > 1 else (), seed=seed)
