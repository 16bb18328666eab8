"""The retry timing a sidecar must use for the analysis to hold: back-off and per-try timeout.

The analysis (:mod:`sloctl.models.retry`) and the simulator assume two things
about the time between the attempts of one call:

* **A retry waits a random delay of mean** ``retry_delay_s`` (the network
  file's, else 200 mean service times of the slowest service), long enough
  that it meets a fresh state of the callee's buffer rather than the busy
  period that rejected it.
* **Attempts are lost only by rejection at entry**, never by a timeout.

Envoy's back-off is fully jittered: retry N waits a uniform time in
``[0, min((2^N - 1) base, max))``. With ``base == max == 2 · retry_delay_s``
every retry waits ``U[0, 2 d)``, of mean ``d`` — the analysis's delay for the
first retry *and* every later one (the default growth would make later
retries wait longer than the analysis assumes, 25 ms / 250 ms far shorter).

The per-try timeout of class p into service i is the time within which an
admitted attempt is done with its own service and, through its callees'
sidecars, their whole budgets, even when every buffer on the way is full:
``T_p(i) = (m_i + 4 c_i √m_i) / μ_i + max_j [(k_pj + 1) T_p(j) + k_pj · max]``
over the callees j of i (``c_i = max(1, service_cv_i)``: m service times of
mean 1/μ have standard deviation at most ``c √m / μ``, so 4 of them leave an
attempt that waits behind a full buffer a chance below 1e-4 of timing out).
On a cyclic routing graph a call path is cut the second time it reaches a
service.

Pure Python over the network's mapping form, so that the sidecar side
(:mod:`sloctl.serving.runtime.envoy`, which a numpy-free sync agent imports) and the
optimiser compute the same numbers from the same policy document.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_DELAY_SERVICE_TIMES", "default_retry_delay_s", "sidecar_timing"]

#: The default retry delay in mean service times of the slowest service.
DEFAULT_DELAY_SERVICE_TIMES = 200.0


def default_retry_delay_s(capacities_per_s: Mapping[str, float] | list[float]) -> float:
    """200 mean service times of the slowest service (the analysis's and simulator's default delay)."""
    values = list(capacities_per_s.values()) if isinstance(capacities_per_s, Mapping) else list(capacities_per_s)
    if not values or min(values) <= 0:
        raise ValueError(f"The 'capacities_per_s' parameter must hold positive rates, got {values!r}.")
    return DEFAULT_DELAY_SERVICE_TIMES / float(min(values))


def sidecar_timing(network: Mapping[str, Any], retries: Mapping[str, Mapping[str, int]] | None = None
                   ) -> dict[str, Any]:
    """Envoy back-off and per-try timeouts from a network mapping (``NetworkSpec.to_mapping()`` form).

    Args:
        network: ``services`` (``capacity_per_s``, ``buffer``, ``service_cv``),
            ``routing`` and optionally ``retry_delay_s``.
        retries: ``{class: {service: k}}`` (default: the network's classes' retries).

    Returns:
        ``{"retry_delay_s", "retry_delay_source", "back_off_base_s", "back_off_max_s",
        "per_try_timeout_s": {class: {service: seconds}}}``.
    """
    services = network.get("services")
    if not isinstance(services, Mapping) or not services:
        raise ValueError(f"The 'network.services' field must map service -> {{capacity_per_s, buffer}}, "
                         f"got {services!r}.")
    mu = {s: float(row["capacity_per_s"]) for s, row in services.items()}
    delay = network.get("retry_delay_s")
    source = "network file"
    if delay is None:
        delay, source = default_retry_delay_s(mu), f"{DEFAULT_DELAY_SERVICE_TIMES:g} service times of the slowest"
    if not (isinstance(delay, int | float) and delay > 0):
        raise ValueError(f"The 'network.retry_delay_s' field must be a positive number of seconds, got {delay!r}.")
    if retries is None:
        retries = {c: _class_retries(row.get("retries", 0), services) for c, row in network.get("classes", {}).items()}
    back_off = 2.0 * float(delay)
    own = {s: (float(row["buffer"]) + 4.0 * max(1.0, float(row.get("service_cv", 1.0)))
               * math.sqrt(float(row["buffer"]))) / mu[s] for s, row in services.items()}
    routing = network.get("routing", {})
    per_try: dict[str, dict[str, float]] = {}
    for klass, ks in retries.items():
        edges = routing.get(klass, {})
        memo: dict[str, float] = {}

        def timeout(service: str, path: frozenset[str], ks=ks, edges=edges, memo=memo) -> tuple[float, bool]:
            """(T of ``service``, whether a cycle was cut below it: then T depends on the path, not memoised)."""
            if service in memo:
                return memo[service], False
            worst, cut = 0.0, False
            for callee, w in edges.get(service, {}).items():
                if w <= 0:
                    continue
                if callee in path:
                    cut = True
                    continue
                k = int(ks.get(callee, 0))
                t, below = timeout(callee, path | {callee})
                cut = cut or below
                worst = max(worst, (k + 1) * t + k * back_off)
            value = own[service] + worst
            if not cut:
                memo[service] = value
            return value, cut

        # Whole milliseconds, rounded up: what Envoy shows is what the document says.
        per_try[klass] = {s: math.ceil(1000.0 * timeout(s, frozenset({s}))[0]) / 1000.0 for s in services}
    return {"retry_delay_s": float(delay), "retry_delay_source": source,
            "back_off_base_s": back_off, "back_off_max_s": back_off, "per_try_timeout_s": per_try}


def _class_retries(value: Any, services: Mapping[str, Any]) -> dict[str, int]:
    if isinstance(value, Mapping):
        return {s: int(value.get(s, 0)) for s in services}
    return dict.fromkeys(services, int(value))
