"""Service networks with per-class retry limits: the network file and its checks.

A network file (YAML, documented in ``docs/retry.md``) names the services with
their capacity and buffer, the priority classes with their retry limits, the
external arrivals of each class and the routing weights between services::

    services:            # name: capacity_per_s (mu), buffer (m, incl. the one in service)
      frontend: {capacity_per_s: 100, buffer: 50}
      search:   {capacity_per_s: 120, buffer: 50}
    classes:             # retries: k_p at every hop, or a map service -> k
      high: {retries: 5}
      low:  {retries: 1}
    arrivals:            # external original rate per class per service
      high: {frontend: 50}
      low:  {frontend: 100}
    routing:             # expected calls to `to` per success at `from`
      high: {frontend: {search: 0.6}}
      low:  {frontend: {search: 0.6}}

Both the analysis (:mod:`sloctl.models.retry`) and the discrete-event
simulator (:mod:`sloctl.simulation.retry_sim`) read the same
:class:`NetworkSpec`, so they cannot disagree about what the file means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sloctl.core.errors import SloctlError

__all__ = [
    "NetworkError",
    "NetworkSpec",
    "RequestType",
    "Service",
    "load_network",
    "network_from_mapping",
]

RoutingMode = Literal["independent", "exclusive"]
_TOP_KEYS = {"services", "classes", "arrivals", "routing", "routing_mode", "retry_delay_s", "requests", "provenance"}
_SERVICE_KEYS = {"capacity_per_s", "buffer", "service_cv"}
_CLASS_KEYS = {"retries", "weight"}


class NetworkError(SloctlError, ValueError):
    """A network file or mapping does not describe a valid service network."""


@dataclass(frozen=True)
class Service:
    """One service: a single server with rate ``capacity_per_s`` and room for ``buffer`` attempts.

    ``buffer`` counts the attempt in service (M/M/1/m with m = buffer); an attempt
    that arrives when ``buffer`` attempts are present is rejected at entry.
    ``service_cv`` is the coefficient of variation of the service time: 1 is
    exponential, 0 deterministic, above 1 a balanced two-phase hyperexponential.
    """

    name: str
    capacity_per_s: float
    buffer: int
    service_cv: float = 1.0

    @property
    def mean_service_s(self) -> float:
        return 1.0 / self.capacity_per_s


@dataclass(frozen=True)
class RequestType:
    """A request with a known call path: ``path`` is the sequence of services it visits."""

    name: str
    klass: str
    path: tuple[str, ...]


@dataclass(frozen=True)
class NetworkSpec:
    """A validated service network (see the module docstring for the file form).

    ``retries[c][s]`` is k for class ``c`` at hop ``s`` (attempts to enter ``s``:
    one original plus up to k retries). ``routing[c][a][b]`` is the expected
    number of calls to ``b`` per success at ``a`` for class ``c``.
    ``routing_mode`` says how those calls are drawn: ``independent`` (each edge
    draws ``floor(w)`` calls plus one more with probability ``frac(w)``,
    independently, so a success may fan out to several services) or
    ``exclusive`` (a success moves on to at most one service, picked with
    probability ``w``; rows must sum to at most 1, as in the open-network model).
    """

    services: tuple[Service, ...]
    classes: tuple[str, ...]
    retries: Mapping[str, Mapping[str, int]]
    arrivals: Mapping[str, Mapping[str, float]]
    routing: Mapping[str, Mapping[str, Mapping[str, float]]]
    routing_mode: RoutingMode = "independent"
    retry_delay_s: float | None = None
    weights: Mapping[str, float] = field(default_factory=dict)
    requests: tuple[RequestType, ...] = ()
    provenance: Mapping[str, Any] = field(default_factory=dict)

    # -- indexing -----------------------------------------------------------------
    @property
    def service_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.services)

    def index(self, service: str) -> int:
        return self.service_names.index(service)

    @property
    def capacity(self) -> np.ndarray:
        """Service rates mu, shape (N,)."""
        return np.array([s.capacity_per_s for s in self.services], dtype=float)

    @property
    def buffer(self) -> np.ndarray:
        """Buffers m, shape (N,)."""
        return np.array([s.buffer for s in self.services], dtype=float)

    def external(self, klass: str) -> np.ndarray:
        """External original arrival rates gamma of ``klass``, shape (N,)."""
        row = self.arrivals.get(klass, {})
        return np.array([float(row.get(name, 0.0)) for name in self.service_names])

    def routing_matrix(self, klass: str) -> np.ndarray:
        """Routing weights F of ``klass``: ``F[a, b]`` calls to b per success at a, shape (N, N)."""
        names = self.service_names
        out = np.zeros((len(names), len(names)))
        for src, row in self.routing.get(klass, {}).items():
            for dst, w in row.items():
                out[names.index(src), names.index(dst)] = w
        return out

    def retry_vector(self, klass: str) -> np.ndarray:
        """Retry limits k of ``klass`` at each hop, shape (N,), integers."""
        row = self.retries[klass]
        return np.array([int(row[name]) for name in self.service_names], dtype=int)

    def class_weight(self, klass: str) -> float:
        return float(self.weights.get(klass, 1.0))

    @property
    def effective_retry_delay_s(self) -> float:
        """The retry delay the simulator uses: the configured one, else 200 mean service times of the slowest service.

        The analysis treats the attempts of one call as independent; near
        saturation a full buffer stays full for many service times, so the
        default delay is long enough for a retry to meet a fresh buffer state.
        """
        from sloctl.models.retry_timing import default_retry_delay_s

        if self.retry_delay_s is not None:
            return self.retry_delay_s
        return default_retry_delay_s([s.capacity_per_s for s in self.services])

    # -- derived networks ---------------------------------------------------------
    def with_retries(self, retries: Mapping[str, int | Mapping[str, int]]) -> NetworkSpec:
        """A copy with new retry limits: ``{class: k}`` for every hop or ``{class: {service: k}}``."""
        new = {c: dict(v) for c, v in self.retries.items()}
        for klass, value in retries.items():
            if klass not in new:
                raise NetworkError(f"retries: unknown class {klass!r} (classes: {', '.join(self.classes)}).")
            new[klass] = _retry_row(value, self.service_names, f"retries.{klass}")
        return replace(self, retries=new)

    def with_arrivals(self, arrivals: Mapping[str, Mapping[str, float]]) -> NetworkSpec:
        """A copy with other external arrival rates (validated like the file's ``arrivals``)."""
        raw = self.to_mapping()
        raw["arrivals"] = {c: dict(v) for c, v in arrivals.items()}
        return network_from_mapping(raw, source="<with_arrivals>")

    def scale_arrivals(self, factors: Mapping[str, float]) -> NetworkSpec:
        """A copy with each class's external arrivals multiplied by ``factors[class]`` (default 1)."""
        return self.with_arrivals({c: {s: r * factors.get(c, 1.0) for s, r in self.arrivals.get(c, {}).items()}
                                   for c in self.classes})

    def is_dag(self) -> bool:
        """Whether the union of every class's routing graph has no cycle."""
        return self.topological_order() is not None

    def topological_order(self, key=None) -> list[int] | None:
        """Service indices in a topological order of the union routing graph, or None if it has a cycle.

        ``key`` orders the ready services at each step (default: file order), so
        callers can check that results do not depend on the order chosen.
        """
        n = len(self.services)
        adj = np.zeros((n, n), dtype=bool)
        for klass in self.classes:
            adj |= self.routing_matrix(klass) > 0
        indeg = adj.sum(axis=0).astype(int)
        ready = [i for i in range(n) if indeg[i] == 0]
        order: list[int] = []
        while ready:
            ready.sort(key=key)
            i = ready.pop(0)
            order.append(i)
            for j in np.flatnonzero(adj[i]):
                indeg[j] -= 1
                if indeg[j] == 0:
                    ready.append(int(j))
        return order if len(order) == n else None

    def to_mapping(self) -> dict[str, Any]:
        """The network as a plain mapping in the file form (round-trips through :func:`network_from_mapping`)."""
        out: dict[str, Any] = {
            "services": {s.name: {"capacity_per_s": s.capacity_per_s, "buffer": s.buffer, "service_cv": s.service_cv}
                         for s in self.services},
            "classes": {c: {"retries": dict(self.retries[c]), **({"weight": self.weights[c]} if c in self.weights
                                                                    else {})}
                        for c in self.classes},
            "arrivals": {c: dict(v) for c, v in self.arrivals.items()},
            "routing": {c: {a: dict(r) for a, r in v.items()} for c, v in self.routing.items()},
            "routing_mode": self.routing_mode,
        }
        if self.retry_delay_s is not None:
            out["retry_delay_s"] = self.retry_delay_s
        if self.requests:
            out["requests"] = {r.name: {"class": r.klass, "path": list(r.path)} for r in self.requests}
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        return out


# -- parsing ------------------------------------------------------------------------
def load_network(path: str | Path) -> NetworkSpec:
    """Read and validate a network file.

    Raises:
        NetworkError: the file is missing, is not YAML, or breaks a rule; the
            message names the file, the key path and what was expected.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise NetworkError(f"{path}: network file not found.")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise NetworkError(f"{path}: not valid YAML ({exc}).") from exc
    return network_from_mapping(raw, source=str(path))


def network_from_mapping(raw: Any, *, source: str = "<network>") -> NetworkSpec:
    """Validate a mapping in the network-file form and build a :class:`NetworkSpec`."""

    def fail(msg: str) -> NetworkError:
        return NetworkError(f"{source}: {msg}")

    if not isinstance(raw, Mapping):
        raise fail(f"the network must be a mapping with keys {sorted(_TOP_KEYS)}, got {type(raw).__name__}.")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise fail(f"unknown key {sorted(unknown)[0]!r} (known keys: {', '.join(sorted(_TOP_KEYS))}).")
    for key in ("services", "classes", "arrivals"):
        if key not in raw:
            raise fail(f"missing key {key!r}.")

    services = _parse_services(raw["services"], fail)
    names = tuple(s.name for s in services)
    classes, retries, weights = _parse_classes(raw["classes"], names, fail)
    arrivals = _parse_arrivals(raw["arrivals"], classes, names, fail)
    mode = raw.get("routing_mode", "independent")
    if mode not in ("independent", "exclusive"):
        raise fail(f"routing_mode must be 'independent' or 'exclusive', got {mode!r}.")
    routing = _parse_routing(raw.get("routing") or {}, classes, names, mode, fail)
    delay = raw.get("retry_delay_s")
    if delay is not None and not (_is_number(delay) and delay > 0):
        raise fail(f"retry_delay_s must be a positive number of seconds, got {delay!r}.")
    requests = _parse_requests(raw.get("requests") or {}, classes, names, fail)
    provenance = raw.get("provenance") or {}
    if not isinstance(provenance, Mapping):
        raise fail(f"provenance must be a mapping (what the network was fitted from), "
                   f"got {type(provenance).__name__}.")
    spec = NetworkSpec(services=services, classes=classes, retries=retries, arrivals=arrivals, routing=routing,
                       routing_mode=mode, retry_delay_s=None if delay is None else float(delay),
                       weights=weights, requests=requests, provenance=dict(provenance))
    for klass in classes:
        radius = float(np.max(np.abs(np.linalg.eigvals(spec.routing_matrix(klass))))) if names else 0.0
        if radius >= 1.0:
            raise fail(f"routing.{klass}: the routing weights give a divergent flow (spectral radius "
                       f"{radius:.3g} >= 1: each call makes on average at least one more); lower the weights "
                       "on the cycle.")
    return spec


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _parse_services(raw: Any, fail) -> tuple[Service, ...]:
    if not isinstance(raw, Mapping) or not raw:
        raise fail("services must be a non-empty mapping name -> {capacity_per_s, buffer}.")
    out = []
    for name, body in raw.items():
        where = f"services.{name}"
        if not isinstance(body, Mapping):
            raise fail(f"{where} must be a mapping like {{capacity_per_s: 100, buffer: 50}}.")
        unknown = set(body) - _SERVICE_KEYS
        if unknown:
            raise fail(f"{where}: unknown key {sorted(unknown)[0]!r} (known keys: {', '.join(sorted(_SERVICE_KEYS))}).")
        cap = body.get("capacity_per_s")
        if not (_is_number(cap) and cap > 0):
            raise fail(f"{where}.capacity_per_s must be a positive number (requests per second), got {cap!r}.")
        buf = body.get("buffer")
        if not (isinstance(buf, int) and not isinstance(buf, bool) and buf >= 1):
            raise fail(f"{where}.buffer must be a whole number >= 1 (room incl. the one in service), got {buf!r}.")
        cv = body.get("service_cv", 1.0)
        if not (_is_number(cv) and cv >= 0):
            raise fail(f"{where}.service_cv must be a number >= 0 (1 = exponential), got {cv!r}.")
        out.append(Service(str(name), float(cap), int(buf), float(cv)))
    return tuple(out)


def _retry_row(value: Any, names: tuple[str, ...], where: str) -> dict[str, int]:
    def ok(k: Any) -> bool:
        return isinstance(k, int) and not isinstance(k, bool) and k >= 0

    if ok(value):
        return {name: int(value) for name in names}
    if isinstance(value, Mapping):
        for svc, k in value.items():
            if svc not in names:
                raise NetworkError(f"{where}: unknown service {svc!r} (services: {', '.join(names)}).")
            if not ok(k):
                raise NetworkError(f"{where}.{svc} must be a whole number of retries >= 0, got {k!r}.")
        missing = [n for n in names if n not in value]
        if missing:
            raise NetworkError(f"{where}: no retry limit for service {missing[0]!r}; give every service or one "
                               "number for all hops.")
        return {name: int(value[name]) for name in names}
    raise NetworkError(f"{where} must be a whole number >= 0 or a map service -> retries, got {value!r}.")


def _parse_classes(raw: Any, names: tuple[str, ...], fail):
    if not isinstance(raw, Mapping) or not raw:
        raise fail("classes must be a non-empty mapping name -> {retries: k}.")
    retries: dict[str, dict[str, int]] = {}
    weights: dict[str, float] = {}
    for klass, body in raw.items():
        where = f"classes.{klass}"
        if not isinstance(body, Mapping) or "retries" not in body:
            raise fail(f"{where} must be a mapping with a 'retries' key, like {{retries: 5}}.")
        unknown = set(body) - _CLASS_KEYS
        if unknown:
            raise fail(f"{where}: unknown key {sorted(unknown)[0]!r} (known keys: {', '.join(sorted(_CLASS_KEYS))}).")
        try:
            retries[str(klass)] = _retry_row(body["retries"], names, f"{where}.retries")
        except NetworkError as exc:
            raise fail(str(exc)) from None
        if "weight" in body:
            w = body["weight"]
            if not (_is_number(w) and w >= 0):
                raise fail(f"{where}.weight must be a number >= 0 (value of one success), got {w!r}.")
            weights[str(klass)] = float(w)
    return tuple(retries), retries, weights


def _parse_arrivals(raw: Any, classes: tuple[str, ...], names: tuple[str, ...], fail):
    if not isinstance(raw, Mapping):
        raise fail("arrivals must be a mapping class -> {service: rate_per_s}.")
    out: dict[str, dict[str, float]] = {}
    for klass, row in raw.items():
        if klass not in classes:
            raise fail(f"arrivals: unknown class {klass!r} (classes: {', '.join(classes)}).")
        if not isinstance(row, Mapping):
            raise fail(f"arrivals.{klass} must be a mapping service -> rate_per_s.")
        for svc, rate in row.items():
            if svc not in names:
                raise fail(f"arrivals.{klass}: unknown service {svc!r} (services: {', '.join(names)}).")
            if not (_is_number(rate) and rate >= 0):
                raise fail(f"arrivals.{klass}.{svc} must be a rate >= 0 per second, got {rate!r}.")
        out[str(klass)] = {str(s): float(r) for s, r in row.items()}
    return out


def _parse_routing(raw: Any, classes, names, mode, fail):
    if not isinstance(raw, Mapping):
        raise fail("routing must be a mapping class -> {from: {to: weight}}.")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for klass, rows in raw.items():
        if klass not in classes:
            raise fail(f"routing: unknown class {klass!r} (classes: {', '.join(classes)}).")
        if not isinstance(rows, Mapping):
            raise fail(f"routing.{klass} must be a mapping from -> {{to: weight}}.")
        out[str(klass)] = {}
        for src, row in rows.items():
            if src not in names:
                raise fail(f"routing.{klass}: unknown service {src!r} (services: {', '.join(names)}).")
            if not isinstance(row, Mapping):
                raise fail(f"routing.{klass}.{src} must be a mapping to -> weight.")
            for dst, w in row.items():
                if dst not in names:
                    raise fail(f"routing.{klass}.{src}: unknown service {dst!r} (services: {', '.join(names)}).")
                if not (_is_number(w) and w >= 0):
                    raise fail(f"routing.{klass}.{src}.{dst} must be a weight >= 0 (expected calls per success), "
                               f"got {w!r}.")
            if mode == "exclusive" and sum(row.values()) > 1 + 1e-12:
                raise fail(f"routing.{klass}.{src}: weights sum to {sum(row.values()):.3g} > 1, which "
                           "routing_mode 'exclusive' does not allow (use 'independent' for fan-out).")
            out[str(klass)][str(src)] = {str(d): float(w) for d, w in row.items() if w > 0}
    return out


def _parse_requests(raw: Any, classes, names, fail) -> tuple[RequestType, ...]:
    if not isinstance(raw, Mapping):
        raise fail("requests must be a mapping name -> {class, path: [service, ...]}.")
    out = []
    for name, body in raw.items():
        where = f"requests.{name}"
        if not isinstance(body, Mapping) or set(body) - {"class", "path"} or "path" not in body:
            raise fail(f"{where} must be a mapping with keys 'path' (list of services) and optional 'class'.")
        klass = body.get("class", classes[0])
        if klass not in classes:
            raise fail(f"{where}.class: unknown class {klass!r} (classes: {', '.join(classes)}).")
        path = body["path"]
        if not isinstance(path, list) or not path:
            raise fail(f"{where}.path must be a non-empty list of services.")
        for svc in path:
            if svc not in names:
                raise fail(f"{where}.path: unknown service {svc!r} (services: {', '.join(names)}).")
        out.append(RequestType(str(name), str(klass), tuple(path)))
    return tuple(out)
