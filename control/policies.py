"""Policies as frozen, typed documents: what crosses a process boundary (registry, HTTP, sidecar).

Three kinds of policy leave the process that chose them: per-class retry
budgets (:class:`RetryPolicy`, DiffTry), Svalinn's admission settings
(:class:`AdmissionPolicy`) and the Policy Tuner's execution configuration
(:class:`ExecutionPlan`, AutoSLO §7). Each is a frozen dataclass with

* ``kind`` — the registered model name (``retry-policy``, ...). These names
  are defined here and nowhere else;
* ``version`` — the schema version it writes. A document without one was
  written before versions existed and reads as version 1; a newer version
  than this code knows is refused rather than half-read;
* ``provenance`` — strings that say where it came from: ``data_hash`` (of what
  it was chosen on), ``source`` (the input file), ``seed``;
* :meth:`to_doc` — a JSON-ready dict (the shape the runtime serves and the
  registry stores) and ``from_doc`` — the one place a document is validated.
  Errors name the field, the rule and the value. ``from_doc(p.to_doc()) == p``.

:func:`policy_from_doc` reads any of them by its ``kind``. Free-form parts
(search settings, metrics, the workload or network it was tuned on) are kept
as plain JSON values; numbers are Python floats, so a NaN metric is written
as JSON's ``NaN`` as :mod:`json` does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from sloctl.control.autoscaler import AutoscalerConfig
from sloctl.control.credits import ClassShare, CreditController
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup

__all__ = [
    "POLICY_TYPES",
    "AdmissionPolicy",
    "CreditSettings",
    "ExecutionPlan",
    "MSemaphoreSettings",
    "PolicyDocument",
    "RetryPolicy",
    "policy_from_doc",
]

_MISSING: Any = object()


class PolicyDocument(Protocol):
    """What every policy document offers (see the module docstring)."""

    kind: ClassVar[str]
    version: ClassVar[int]
    provenance: Mapping[str, str]

    def to_doc(self) -> dict[str, Any]: ...


# -- reading fields with named errors ---------------------------------------------------
class _Fields:
    """The fields of one (part of a) document; every error names the field, the rule and the value."""

    def __init__(self, kind: str, doc: Any, prefix: str = "") -> None:
        if not isinstance(doc, Mapping):
            where = f"The '{prefix[:-1]}' field of the {kind} document" if prefix else f"A {kind} document"
            raise ValueError(f"{where} must be a mapping, got {type(doc).__name__}: {doc!r:.200}.")
        self.kind, self.doc, self.prefix = kind, doc, prefix

    def error(self, name: str, rule: str, value: Any) -> ValueError:
        return ValueError(f"The '{self.prefix}{name}' field of the {self.kind} document must {rule}, "
                          f"got {value!r:.200}.")

    def only(self, known: Iterable[str]) -> None:
        known = set(known)
        for key in self.doc:
            if key not in known:
                raise ValueError(f"The {self.kind} document has an unknown field '{self.prefix}{key}' "
                                 f"(known: {', '.join(sorted(known))}).")

    def get(self, name: str, default: Any = _MISSING) -> Any:
        if name in self.doc:
            return self.doc[name]
        if default is _MISSING:
            raise ValueError(f"The '{self.prefix}{name}' field of the {self.kind} document is required "
                             f"(fields given: {', '.join(map(str, self.doc)) or 'none'}).")
        return default

    def sub(self, name: str, default: Any = _MISSING) -> _Fields:
        return _Fields(self.kind, self.get(name, default), f"{self.prefix}{name}.")

    def number(self, name: str, default: Any = _MISSING, *, lo: float | None = None, lo_open: bool = False,
               hi: float | None = None, hi_open: bool = False, optional: bool = False) -> float | None:
        value = self.get(name, default)
        if value is None and optional:
            return None
        if lo is not None and hi is not None:
            rule = f"be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        elif lo is not None:
            rule = f"be a number {'>' if lo_open else '>='} {lo:g}"
        else:
            rule = "be a number"
        rule += " or null" if optional else ""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise self.error(name, rule, value)
        value = float(value)
        if (lo is not None and not (value > lo if lo_open else value >= lo)) or \
                (hi is not None and not (value < hi if hi_open else value <= hi)):
            raise self.error(name, rule, value)
        return value

    def integer(self, name: str, default: Any = _MISSING, *, lo: int | None = None,
                optional: bool = False) -> int | None:
        value = self.get(name, default)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (lo is not None and value < lo):
            rule = "be a whole number" + (f" >= {lo}" if lo is not None else "") + (" or null" if optional else "")
            raise self.error(name, rule, value)
        return int(value)

    def string(self, name: str, default: Any = _MISSING, *, optional: bool = False) -> str | None:
        value = self.get(name, default)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise self.error(name, "be a non-empty string" + (" or null" if optional else ""), value)
        return value

    def boolean(self, name: str, default: Any = _MISSING) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool | np.bool_):
            raise self.error(name, "be true or false", value)
        return bool(value)

    def json(self, name: str, default: Any = _MISSING, *, mapping: bool = True, optional: bool = False) -> Any:
        """A free-form part: checked to be plain JSON (a mapping unless ``mapping`` is False) and copied."""
        value = self.get(name, default)
        if value is None and optional:
            return None
        if mapping and not isinstance(value, Mapping):
            raise self.error(name, "be a mapping" + (" or null" if optional else ""), value)
        return _json(value, name, self)

    def strings(self, name: str, default: Any = _MISSING) -> dict[str, str]:
        """A mapping of strings to strings (``provenance``)."""
        value = self.get(name, default)
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            raise self.error(name, "map strings to strings", value)
        return dict(value)


def _json(value: Any, path: str, fields: _Fields | None = None) -> Any:
    """``value`` as plain JSON types (dict, list, str, int, float, bool, None), copied.

    ``path`` names the field in errors; ``fields`` gives them the document's kind.
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _json_error(fields, path, "have string keys", k)
            out[k] = _json(v, f"{path}.{k}", fields)
        return out
    if isinstance(value, list | tuple):
        return [_json(v, f"{path}[{i}]", fields) for i, v in enumerate(value)]
    raise _json_error(fields, path, "hold JSON values (mapping, list, string, number, bool, null)", value)


def _json_error(fields: _Fields | None, path: str, rule: str, value: Any) -> ValueError:
    if fields is not None:
        return fields.error(path, rule, value)
    return ValueError(f"The '{path}' field of a policy must {rule}, got {value!r:.200}.")


def _open(cls: type, doc: Any, known: Iterable[str]) -> _Fields:
    """The checks every kind shares: a mapping, its kind, its schema version, no unknown field."""
    fields = _Fields(cls.kind, doc)
    kind = doc.get("kind")
    if kind != cls.kind:
        raise fields.error("kind", f"be {cls.kind!r}", kind)
    version = doc.get("version", 1)  # documents registered before versions existed are version 1
    if isinstance(version, bool) or not isinstance(version, numbers.Integral) or not 1 <= version <= cls.version:
        raise fields.error("version", f"be a schema version this sloctl reads (1 to {cls.version})", version)
    fields.only({"kind", "version", "provenance", *known})
    return fields


def _head(policy: PolicyDocument) -> dict[str, Any]:
    return {"kind": policy.kind, "version": policy.version}


def _real_time(time_s: float, hour_s: float) -> str:
    """``HH:MM`` of the real target day for ``time_s`` compressed seconds (an hour lasts ``hour_s``)."""
    real = time_s * (3600.0 / hour_s)
    return f"{int(real // 3600):02d}:{int(real % 3600 // 60):02d}"


# -- retry-policy -----------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Per-class retry budgets k and the figures behind them (DiffTry §IV).

    DiffTry ("Prioritizing Microservice Requests via Retries") lets a class
    retry more to prioritise it. Chosen by
    :func:`sloctl.training.retry_budget.optimise_budgets`; served to Envoy
    sidecars by the runtime (:mod:`sloctl.serving.runtime.envoy`).

    Attributes:
        retries: ``{class: {service: k}}``, the budgets the sidecars enforce.
        feasible: whether they meet the search's targets and amplification cap.
        score: class-weighted goodput (calls per second) under the analysis.
        amplification: attempts (originals and retries) per original call.
        predicted: ``{class: {"end_to_end_rejection", "success_per_s"}}`` from the analysis.
        search: the search settings (objective, targets, caps, model).
        network: the network the budgets were chosen for (its mapping form).
        evaluated: budget vectors the search evaluated.
        simulated: the same table from the discrete-event simulator, with CIs (None: not confirmed).
        provenance: ``data_hash`` (network and budgets), ``source``, ``seed`` of the confirmation.
        explanation: ``{class: why}`` for each class the search gave no retries (k = 0 at every
            hop): at that load a retry adds no goodput, costs the other classes more than it gains,
            or would break the amplification cap or a target.
    """

    kind: ClassVar[str] = "retry-policy"
    version: ClassVar[int] = 1

    retries: Mapping[str, Mapping[str, int]]
    feasible: bool
    score: float
    amplification: float
    predicted: Mapping[str, Mapping[str, float]]
    search: Mapping[str, Any]
    network: Mapping[str, Any]
    evaluated: int
    simulated: Mapping[str, Mapping[str, Any]] | None = None
    provenance: Mapping[str, str] = field(default_factory=dict)
    explanation: Mapping[str, str] = field(default_factory=dict)

    def budget(self, klass: str, service: str) -> int:
        """k of ``klass`` for calls into ``service`` (the registry pyfunc's old per-row lookup)."""
        if klass not in self.retries:
            raise ValueError(f"The 'klass' parameter names unknown class {klass!r} "
                             f"(classes: {', '.join(self.retries)}).")
        row = self.retries[klass]
        if service not in row:
            raise ValueError(f"The 'service' parameter names unknown service {service!r} "
                             f"(services of class {klass!r}: {', '.join(row)}).")
        return row[service]

    def budgets(self, classes: Iterable[str], services: Iterable[str]) -> list[int]:
        """k for each (class, service) pair, e.g. the ``class`` and ``service`` columns of a frame."""
        classes, services = list(classes), list(services)
        if len(classes) != len(services):
            raise ValueError(f"The 'classes' and 'services' parameters must have the same length, "
                             f"got {len(classes)} and {len(services)}.")
        return [self.budget(c, s) for c, s in zip(classes, services, strict=True)]

    def to_doc(self) -> dict[str, Any]:
        return {**_head(self), "retries": _json(self.retries, "retries"), "feasible": bool(self.feasible),
                "score": float(self.score), "amplification": float(self.amplification),
                "predicted": _json(self.predicted, "predicted"), "simulated": _json(self.simulated, "simulated"),
                "search": _json(self.search, "search"), "evaluated": int(self.evaluated),
                "network": _json(self.network, "network"), "provenance": _json(self.provenance, "provenance"),
                # only when some class got k = 0: documents of older code round-trip unchanged
                **({"explanation": _json(self.explanation, "explanation")} if self.explanation else {})}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> RetryPolicy:
        f = _open(cls, doc, ("retries", "feasible", "score", "amplification", "predicted", "simulated", "search",
                             "evaluated", "network", "explanation"))
        retries_f = f.sub("retries")
        if not retries_f.doc:
            raise f.error("retries", "map each class to {service: k} (at least one class)", retries_f.doc)
        retries = {}
        for klass in retries_f.doc:
            row = retries_f.sub(klass)
            retries[klass] = {service: row.integer(service, lo=0) for service in row.doc}
        predicted_f = f.sub("predicted")
        predicted = {}
        for klass in predicted_f.doc:
            row = predicted_f.sub(klass)
            predicted[klass] = {name: row.number(name, optional=True) for name in row.doc}
        simulated = f.json("simulated", None, optional=True)
        if simulated is not None and not all(isinstance(v, Mapping) for v in simulated.values()):
            raise f.error("simulated", "map each class to a mapping of figures", simulated)
        return cls(retries=retries, feasible=f.boolean("feasible"), score=f.number("score"),
                   amplification=f.number("amplification"), predicted=predicted, search=f.json("search"),
                   network=f.json("network"), evaluated=f.integer("evaluated", lo=0), simulated=simulated,
                   provenance=f.strings("provenance", {}), explanation=f.strings("explanation", {}))


# -- admission-policy -------------------------------------------------------------------
@dataclass(frozen=True)
class CreditSettings:
    """The credit controller's tuned settings (Svalinn §4.1; see :class:`~sloctl.control.credits.CreditController`)."""

    epsilon: float
    dead_band: float
    experiment_s: float
    initial_credits: int


@dataclass(frozen=True)
class MSemaphoreSettings:
    """The m_semaphore's capacity and its bandit's warm start (Svalinn §4.3).

    ``arm_values`` maps a capacity to the bandit's value of it when the policy
    was chosen; ``alpha``, ``omega``, ``epsilon`` are the bandit's settings.
    """

    capacity: int
    arm_values: Mapping[int, float] = field(default_factory=dict)
    alpha: float = 0.7
    omega: float = 0.8
    epsilon: float = 0.3


@dataclass(frozen=True)
class AdmissionPolicy:
    """Svalinn's admission settings, tuned in the server simulator.

    Written by :func:`sloctl.training.admission_policy.tune_admission`; the
    live middleware and m_semaphore (:mod:`sloctl.serving.runtime.admission`) and the
    runtime read it.

    Attributes:
        credits: the credit controller's step, dead-band, micro-experiment length, starting pool.
        msem: the m_semaphore's capacity and bandit warm start.
        classes: the priority classes and their credit shares (may be empty: one class).
        metrics: figures of the winner in the simulator (weighted goodput, drops, per-type p99).
        search: the study's settings (trials, seed, simulated seconds per trial).
        workload: the workload description it was tuned on.
        provenance: ``data_hash`` (of the workload), ``seed``, ``source`` (the workload file).
    """

    kind: ClassVar[str] = "admission-policy"
    version: ClassVar[int] = 1

    credits: CreditSettings
    msem: MSemaphoreSettings
    classes: tuple[ClassShare, ...] = ()
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    search: Mapping[str, Any] = field(default_factory=dict)
    workload: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, str] = field(default_factory=dict)

    def controller(self, *, seed: int = 0) -> CreditController:
        """A :class:`~sloctl.control.credits.CreditController` with these settings (a fresh pool).

        One class or none runs without shedding order: a single class's share
        would reserve nothing.
        """
        c = self.credits
        return CreditController(initial_credits=c.initial_credits, epsilon=c.epsilon, dead_band=c.dead_band,
                                experiment_s=c.experiment_s, classes=self.classes if len(self.classes) > 1 else (),
                                seed=seed)

    def class_names(self) -> tuple[str, ...]:
        """The class names, most important first (ties keep the document's order)."""
        return tuple(c.name for c in sorted(self.classes, key=lambda c: -c.priority))

    def to_doc(self) -> dict[str, Any]:
        c, m = self.credits, self.msem
        return {**_head(self),
                "credits": {"epsilon": float(c.epsilon), "dead_band": float(c.dead_band),
                            "experiment_s": float(c.experiment_s), "initial_credits": int(c.initial_credits)},
                "classes": [{"name": s.name, "priority": int(s.priority), "share": float(s.share)}
                            for s in self.classes],
                "msem": {"capacity": int(m.capacity), "arm_values": {str(k): float(v) for k, v in m.arm_values.items()},
                         "alpha": float(m.alpha), "omega": float(m.omega), "epsilon": float(m.epsilon)},
                "metrics": _json(self.metrics, "metrics"), "search": _json(self.search, "search"),
                "workload": _json(self.workload, "workload"), "provenance": _json(self.provenance, "provenance")}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> AdmissionPolicy:
        f = _open(cls, doc, ("credits", "classes", "msem", "metrics", "search", "workload"))
        cf = f.sub("credits")
        cf.only(("epsilon", "dead_band", "experiment_s", "initial_credits"))
        credits = CreditSettings(epsilon=cf.number("epsilon", lo=0.0, lo_open=True, hi=1.0),
                                 dead_band=cf.number("dead_band", lo=0.0, hi=1.0, hi_open=True),
                                 experiment_s=cf.number("experiment_s", lo=0.0, lo_open=True),
                                 initial_credits=cf.integer("initial_credits", lo=1))
        mf = f.sub("msem")
        mf.only(("capacity", "arm_values", "alpha", "omega", "epsilon"))
        af = mf.sub("arm_values", {})
        arm_values = {}
        for key in af.doc:
            if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
                raise mf.error("arm_values", "map capacities (whole numbers >= 1, as strings) to values", key)
            arm_values[int(key)] = af.number(key)
        msem = MSemaphoreSettings(capacity=mf.integer("capacity", lo=1), arm_values=arm_values,
                                  alpha=mf.number("alpha", 0.7, lo=0.0, hi=1.0),
                                  omega=mf.number("omega", 0.8, lo=0.0, lo_open=True, hi=1.0),
                                  epsilon=mf.number("epsilon", 0.3, lo=0.0, hi=1.0))
        raw = f.get("classes", [])
        if not isinstance(raw, list | tuple):
            raise f.error("classes", "be a list of {name, priority, share}", raw)
        classes = []
        for i, item in enumerate(raw):
            sf = _Fields(cls.kind, item, f"classes[{i}].")
            sf.only(("name", "priority", "share"))
            classes.append(ClassShare(sf.string("name"), sf.integer("priority"),
                                      sf.number("share", 1.0, lo=0.0, lo_open=True)))
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise f.error("classes", "name each class once", names)
        mt = f.sub("metrics", {})
        metrics = {name: mt.number(name, optional=True) for name in mt.doc}
        return cls(credits=credits, msem=msem, classes=tuple(classes), metrics=metrics, search=f.json("search", {}),
                   workload=f.json("workload", {}), provenance=f.strings("provenance", {}))


# -- execution-config -------------------------------------------------------------------
_AUTOSCALER_FIELDS = {f.name: f.default for f in dataclasses.fields(AutoscalerConfig)}


@dataclass(frozen=True)
class ExecutionPlan:
    """The Policy Tuner's execution configuration for a target day, registered as ``execution-config``.

    It wraps the :class:`~sloctl.control.scheduler.ExecutionConfig` that
    SimulateBatch ran (starting clusters, scheduled spin-ups, autoscaler
    knobs; AutoSLO §7.3) with how it was found. Times are the compressed
    simulation's; with ``time_scale["hour_s"]`` each spin-up is also written
    with its ``real_time`` (``HH:MM`` of the real day).

    Attributes:
        config: what to run.
        target_date: the planned day (ISO date).
        knobs: the tuned knob values.
        predicted: validation violation rate and cost of the plan and of the knobs alone.
        time_scale: ``hour_s``, ``mean_isolated_s``, ``hour_units``, ``kept_fraction``.
        router, strategy, budget, order: how the tuner ran.
        forecasts: training/validation forecast counts, the forecast policy, queries per forecast.
        history: the history window it forecast from (file, instance, dates).
        evaluated, simulations: configurations tried and simulations run.
        trials: every knob configuration with its training (and validation) outcome.
        provenance: ``data_hash`` (of history and forecasts), ``seed``, ``source``, ``log``.
    """

    kind: ClassVar[str] = "execution-config"
    version: ClassVar[int] = 1

    config: ExecutionConfig = field(default_factory=ExecutionConfig)
    target_date: str | None = None
    knobs: Mapping[str, Any] = field(default_factory=dict)
    predicted: Mapping[str, float | None] = field(default_factory=dict)
    time_scale: Mapping[str, float] = field(default_factory=dict)
    router: str | None = None
    strategy: str | None = None
    budget: int | None = None
    order: str | None = None
    forecasts: Mapping[str, Any] = field(default_factory=dict)
    history: Mapping[str, Any] = field(default_factory=dict)
    evaluated: int | None = None
    simulations: int | None = None
    trials: tuple[Mapping[str, Any], ...] = ()
    provenance: Mapping[str, str] = field(default_factory=dict)

    def real_time(self, time_s: float) -> str | None:
        """``HH:MM`` of the real target day at compressed ``time_s`` (None without ``time_scale``)."""
        hour_s = self.time_scale.get("hour_s")
        return _real_time(time_s, hour_s) if hour_s else None

    def to_doc(self) -> dict[str, Any]:
        spinups = []
        for s in self.config.spinups:
            real = self.real_time(s.time_s)
            spinups.append({"time_s": float(s.time_s), **({"real_time": real} if real is not None else {}),
                            "size": int(s.size), "mode": s.mode})
        autoscaler = self.config.autoscaler
        return {**_head(self), "target_date": self.target_date,
                "start_sizes": [int(s) for s in self.config.start_sizes], "spinups": spinups,
                "autoscaler": _json(dataclasses.asdict(autoscaler), "autoscaler") if autoscaler is not None else None,
                "knobs": _json(self.knobs, "knobs"), "predicted": _json(self.predicted, "predicted"),
                "time_scale": _json(self.time_scale, "time_scale"), "router": self.router, "strategy": self.strategy,
                "budget": self.budget, "order": self.order, "forecasts": _json(self.forecasts, "forecasts"),
                "history": _json(self.history, "history"), "evaluated": self.evaluated,
                "simulations": self.simulations, "trials": _json(self.trials, "trials"),
                "provenance": _json(self.provenance, "provenance")}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ExecutionPlan:
        f = _open(cls, doc, ("target_date", "start_sizes", "spinups", "autoscaler", "knobs", "predicted",
                             "time_scale", "router", "strategy", "budget", "order", "forecasts", "history",
                             "evaluated", "simulations", "trials"))
        target = f.string("target_date", None, optional=True)
        if target is not None:
            try:
                dt.date.fromisoformat(target)
            except ValueError:
                raise f.error("target_date", "be an ISO date (YYYY-MM-DD)", target) from None
        sizes = f.get("start_sizes", [1])
        if not isinstance(sizes, list | tuple) or not sizes or \
                not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in sizes):
            raise f.error("start_sizes", "be a non-empty list of cluster sizes (whole numbers >= 1)", sizes)
        raw = f.get("spinups", [])
        if not isinstance(raw, list | tuple):
            raise f.error("spinups", "be a list of {time_s, size, mode}", raw)
        spinups = []
        for i, item in enumerate(raw):
            sf = _Fields(cls.kind, item, f"spinups[{i}].")
            sf.only(("time_s", "real_time", "size", "mode"))  # real_time is derived, see to_doc
            mode = sf.string("mode", "add")
            if mode not in ("add", "vertical"):
                raise sf.error("mode", "be 'add' or 'vertical'", mode)
            spinups.append(ScheduledSpinup(sf.number("time_s", lo=0.0), sf.integer("size", lo=1), mode))
        autoscaler = None
        if f.get("autoscaler", None) is not None:
            af = f.sub("autoscaler")
            af.only(_AUTOSCALER_FIELDS)
            values: dict[str, Any] = {}
            for name, default in _AUTOSCALER_FIELDS.items():
                if name not in af.doc:
                    continue
                if isinstance(default, tuple):
                    sizes_ = af.get(name)
                    if not isinstance(sizes_, list | tuple) or not all(
                            isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in sizes_):
                        raise af.error(name, "be a list of cluster sizes", sizes_)
                    values[name] = tuple(int(s) for s in sizes_)
                elif isinstance(default, int):
                    values[name] = af.integer(name)
                elif default is None:  # max_units: a whole number, or null for no limit
                    values[name] = af.integer(name, None, lo=1, optional=True)
                else:
                    values[name] = af.number(name)
            autoscaler = AutoscalerConfig(**values)
            try:
                autoscaler.validate()
            except ValueError as exc:
                raise ValueError(f"The 'autoscaler' field of the {cls.kind} document is invalid: {exc}") from None
            if autoscaler.max_units is not None:  # a plan that does not fit its cluster core is refused, not run
                cap = autoscaler.max_units
                if sum(int(s) for s in sizes) > cap:
                    raise f.error("start_sizes", f"add up to at most autoscaler.max_units = {cap} size units (the "
                                  "cluster core's); start fewer or smaller clusters", sizes)
                for i, sp in enumerate(spinups):
                    if sp.size > cap:
                        raise f.error(f"spinups[{i}].size", f"be at most autoscaler.max_units = {cap}", sp.size)
        config = ExecutionConfig(spinups=tuple(spinups), autoscaler=autoscaler,
                                 start_sizes=tuple(int(s) for s in sizes))
        pf = f.sub("predicted", {})
        ts = f.sub("time_scale", {})
        trials = f.json("trials", [], mapping=False)
        if not isinstance(trials, list) or not all(isinstance(t, Mapping) for t in trials):
            raise f.error("trials", "be a list of mappings", trials)
        return cls(config=config, target_date=target, knobs=f.json("knobs", {}),
                   predicted={name: pf.number(name, optional=True) for name in pf.doc},
                   time_scale={name: ts.number(name, lo=0.0, lo_open=True) for name in ts.doc},
                   router=f.string("router", None, optional=True), strategy=f.string("strategy", None, optional=True),
                   budget=f.integer("budget", None, lo=1, optional=True), order=f.string("order", None, optional=True),
                   forecasts=f.json("forecasts", {}), history=f.json("history", {}),
                   evaluated=f.integer("evaluated", None, lo=0, optional=True),
                   simulations=f.integer("simulations", None, lo=0, optional=True), trials=tuple(trials),
                   provenance=f.strings("provenance", {}))


# -- any kind ---------------------------------------------------------------------------
POLICY_TYPES: dict[str, type] = {cls.kind: cls for cls in (RetryPolicy, AdmissionPolicy, ExecutionPlan)}


def policy_from_doc(doc: Mapping[str, Any]) -> RetryPolicy | AdmissionPolicy | ExecutionPlan:
    """The typed policy of ``doc``, chosen by its ``kind`` field (validated by that kind's ``from_doc``)."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"A policy document must be a mapping, got {type(doc).__name__}: {doc!r:.200}.")
    kind = doc.get("kind")
    if kind not in POLICY_TYPES:
        raise ValueError(f"The 'kind' field of a policy document must be one of "
                         f"{', '.join(map(repr, POLICY_TYPES))}, got {kind!r}.")
    return POLICY_TYPES[kind].from_doc(doc)

