"""Fitting a DiffTry service network from Envoy access logs alone (no tracer).

One access-log line is one call into the sidecar's service (``%UPSTREAM_CLUSTER%``)
with the class in the route's name (``class-<c>``, as sloctl names its routes),
the attempts Envoy made (``%UPSTREAM_REQUEST_ATTEMPT_COUNT%``), the final answer
(503 with ``URX``: every attempt refused) and the caller
(``%REQ(X-ENVOY-DOWNSTREAM-SERVICE-CLUSTER)%``, the header a caller's Envoy
sets). The rules follow :mod:`sloctl.training.network_fit`:

* a call is admitted when its final answer is not a refusal (503, 429); the
  refused attempts are ``attempts - 1`` of an admitted call, every attempt of
  a refused one;
* routing ``F[c][a][b]`` = calls into b whose caller is a, per admitted call
  at a; arrivals = calls whose caller is no fitted service, per second;
* the admitted attempt reaches the service at ``%START_TIME%`` plus
  ``%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)%`` (the last attempt's send) and
  its local phase ends at the first call it makes (a line with the same
  ``x-request-id`` whose caller is this service), else when its answer ends
  (``...:US_RX_END:us``); capacity is ``c N / B`` over those phases;
* the buffer is the largest number in the system when a call's last attempt
  is refused (only those refusals have a time in the log).

Without the two ``COMMON_DURATION`` fields the phases fall back to
``%DURATION%`` and ``%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%`` (milliseconds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sloctl.training.network_fit import (
    REFUSAL_STATUS,
    FitOptions,
    NetworkFit,
    NetworkFitError,
    _busy_time_ns,
    _network,
    _service_cv,
    buffer_at_refusals,
    rate_ci95,
    weight_ci95,
)

__all__ = ["fit_network_from_access_logs"]

_TX = "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)%"
_RX = "%COMMON_DURATION(DS_RX_BEG:US_RX_END:us)%"


def _num(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "", "-") else math.nan
    except ValueError:
        return math.nan


def _read(records, options: FitOptions) -> dict[str, Any]:
    services: dict[str, int] = {}
    classes: dict[str, int] = {}
    rows: list[tuple] = []
    unclassed = unrouted = 0
    for r in records:
        if not r.upstream_cluster or r.upstream_cluster == "-":
            unrouted += 1
            continue
        route = r.route_name or ""
        klass = route[len("class-"):] if route.startswith("class-") else ""
        if not klass:
            unclassed += 1
            klass = options.default_class
        svc = services.setdefault(r.upstream_cluster, len(services))
        caller = services.setdefault(r.caller, len(services)) if r.caller and r.caller != "-" else -1
        tx, rx = _num(r.fields.get(_TX)), _num(r.fields.get(_RX))
        if math.isnan(rx) and not math.isnan(r.duration_ms):  # milliseconds only
            rx = r.duration_ms * 1e3
            ust = r.upstream_service_time_ms
            tx = rx - ust * 1e3 if not math.isnan(ust) else math.nan
        rows.append((svc, classes.setdefault(klass, len(classes)), caller, r.start_ns, max(r.attempts, 1),
                     r.response_code, r.request_id, tx, rx, r.duration_ms, r.upstream_service_time_ms))
    if not rows:
        raise NetworkFitError("No access-log line named an upstream cluster: nothing to fit a network from.")
    cols = list(zip(*rows, strict=True))
    a = {k: np.asarray(v) for k, v in zip(("svc", "klass", "caller", "start", "attempts", "code", "rid", "tx_us",
                                            "rx_us", "duration_ms", "ust_ms"), cols, strict=True)}
    a["start"] = a["start"].astype(np.int64)
    return {"a": a, "services": services, "classes": classes, "unclassed": unclassed, "unrouted": unrouted}


def _local_phases(a: dict[str, np.ndarray], admitted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arrival (last attempt sent) and end of local work, in ns, of every admitted call (NaN-free rows only)."""
    arrive = a["start"] + np.nan_to_num(a["tx_us"] * 1e3, nan=0.0).astype(np.int64)
    end = a["start"] + np.nan_to_num(a["rx_us"] * 1e3, nan=-1.0).astype(np.int64)
    first_call = np.full(len(arrive), np.iinfo(np.int64).max)
    # calls made by a call's service in the same request, at or after its arrival: the earliest ends local work
    key = {}
    for i in np.flatnonzero(admitted):
        key.setdefault((a["rid"][i], int(a["svc"][i])), []).append(i)
    for j in np.flatnonzero(a["caller"] >= 0):
        for i in key.get((a["rid"][j], int(a["caller"][j])), ()):
            if arrive[i] <= a["start"][j] < first_call[i]:
                first_call[i] = a["start"][j]
    return arrive, np.maximum(np.minimum(first_call, end), arrive)


def fit_network_from_access_logs(paths: Sequence[str | Path] | str | Path, *, log_format: str | None = None,
                                 options: FitOptions | None = None) -> NetworkFit:
    """Fit a network from Envoy access logs (one file per sidecar, or any mix; see the module docstring)."""
    from sloctl.datasets.traces import SLOCTL_ACCESS_FORMAT, ParseReport, iter_access_records, trace_files

    options = options or FitOptions()
    options.validate()
    files = trace_files(paths)
    report_parse = ParseReport()
    data = _read(iter_access_records(files, log_format=log_format or SLOCTL_ACCESS_FORMAT, report=report_parse),
                 options)
    a = data["a"]
    names = {v: k for k, v in data["services"].items()}
    klass_names = [k for k, _ in sorted(data["classes"].items(), key=lambda kv: kv[1])]
    refused_final = np.isin(a["code"], REFUSAL_STATUS)
    admitted = ~refused_final & (a["code"] > 0)
    report: dict[str, Any] = {"spans": 0, "access_lines": int(len(a["svc"])), "services": {}, "unfitted": {},
                              "classes": {}, "routing": {},
                              "anomalies": {"unclassed_lines": data["unclassed"], "unrouted_lines": data["unrouted"],
                                            "unreadable_records": report_parse.unreadable}}
    window = _window(a, options)
    report["window"] = window
    capacity, buffers = _services(a, names, admitted, refused_final, options, report)
    arrivals, routing, retries = _flows(a, names, klass_names, admitted, refused_final, capacity, window, options,
                                        report)
    network = _network(capacity, buffers, arrivals, routing, retries, klass_names, options, report)
    parse = report_parse.to_json()
    report["parse"] = parse
    network["provenance"] = {
        "fitted_from": "envoy access logs", "sampling": options.sampling,
        "files": [{"path": f["path"], "format": f["format"], "sha256": f["sha256"], "records": f["records"]}
                  for f in parse["files"]],
        "window": window, "access_lines": report["access_lines"]}
    return NetworkFit(network=network, report=report)


def _window(a: dict[str, np.ndarray], options: FitOptions) -> dict[str, Any]:
    if options.window_s is not None:
        lo, hi = (int(round(t * 1e9)) for t in options.window_s)
    else:
        ext = a["start"][a["caller"] < 0]
        span = ext if len(ext) > 1 else a["start"]
        lo, hi = int(span.min()), int(span.max())
        hi += (hi - lo) // max(len(span) - 1, 1)
    return {"start_s": lo / 1e9, "end_s": hi / 1e9, "seconds": max(hi - lo, 1) / 1e9,
            "given": options.window_s is not None, "lo_ns": lo, "hi_ns": hi}


def _services(a, names, admitted, refused_final, options: FitOptions, report) -> tuple[dict, dict]:
    arrive, local_end = _local_phases(a, admitted)
    timed = ~np.isnan(a["rx_us"]) & ~np.isnan(a["tx_us"])
    capacity: dict[str, float] = {}
    buffers: dict[str, int] = {}
    for code, name in sorted(names.items(), key=lambda kv: kv[1]):
        mine = a["svc"] == code
        if not mine.any():
            continue  # a caller only
        adm = np.flatnonzero(mine & admitted & timed)
        attempts = int(a["attempts"][mine].sum())
        row: dict[str, Any] = {"calls": int(mine.sum()), "attempts": attempts, "admitted": int(len(adm)),
                               "refused": attempts - int(np.count_nonzero(mine & admitted))}
        report["services"][name] = row
        if len(adm) < options.min_spans:
            report["unfitted"][name] = f"only {len(adm)} admitted calls with times (at least {options.min_spans})"
            continue
        starts, ends = arrive[adm], local_end[adm]
        c = int(options.servers.get(name, 1))
        busy_ns, most = _busy_time_ns(starts, ends, c)
        capacity[name] = c * len(adm) / (busy_ns / 1e9)
        order = np.argsort(starts, kind="stable")
        refusal_t = np.sort(arrive[mine & refused_final & timed])
        row.update({"capacity_per_s": capacity[name], "capacity_basis": "busy time of the local phases",
                    "servers": c, "max_concurrency": most,
                    "service_cv": _service_cv(starts[order], ends[order]) if c == 1 else None,
                    "rests_on_calls": int(len(adm))})
        buffers[name] = buffer_at_refusals(name, np.sort(starts), np.sort(ends), refusal_t, most, options, row)
    return capacity, buffers


def _flows(a, names, klass_names, admitted, refused_final, capacity, window, options: FitOptions, report):
    lo, hi, seconds = window["lo_ns"], window["hi_ns"], window["seconds"]
    fitted = {code for code, name in names.items() if name in capacity}
    in_window = (a["start"] >= lo) & (a["start"] <= hi)
    external = ~np.isin(a["caller"], list(fitted))
    arrivals: dict[str, dict[str, float]] = {}
    routing: dict[str, dict[str, dict[str, float]]] = {}
    retries: dict[str, int] = {}
    for ci, klass in enumerate(klass_names):
        mine = a["klass"] == ci
        counts = {names[s]: n for s in sorted(fitted, key=names.get)
                  if (n := int(np.count_nonzero(mine & external & in_window & (a["svc"] == s))))}
        arrivals[klass] = {s: n / seconds / options.sampling for s, n in counts.items()}
        routing[klass] = {}
        detail: dict[str, dict[str, dict[str, int]]] = {}
        for caller in sorted(fitted, key=names.get):
            served = int(np.count_nonzero(mine & in_window & admitted & (a["svc"] == caller)))
            out = mine & in_window & (a["caller"] == caller)
            for callee in sorted(set(a["svc"][out].tolist()), key=names.get):
                n = int(np.count_nonzero(out & (a["svc"] == callee)))
                detail.setdefault(names[caller], {})[names[callee]] = {
                    "calls": n, "caller_calls": served, "weight_ci95": weight_ci95(n, served) if served else None}
                if served and callee in fitted:
                    routing[klass].setdefault(names[caller], {})[names[callee]] = n / served
        tries = a["attempts"][mine]
        most = int(tries.max()) - 1 if len(tries) else 0
        exhausted = bool(np.any(mine & refused_final & (a["attempts"] == most + 1)))
        retries[klass] = int(options.retries.get(klass, most))
        report["classes"][klass] = {
            "calls": int(mine.sum()), "calls_retried": int(np.count_nonzero(tries > 1)), "max_resends_seen": most,
            "retries": retries[klass], "arrivals_per_s": arrivals[klass], "routing": detail,
            "arrivals_ci95_per_s": {s: rate_ci95(n, seconds, options.sampling) for s, n in counts.items()},
            "retries_basis": "config" if klass in options.retries else
            ("largest attempt count seen, minus one; some calls were refused on every attempt" if exhausted
             else "largest attempt count seen, minus one (a lower bound)")}
    retried = admitted & (a["attempts"] > 1) & ~np.isnan(a["ust_ms"])
    waits = (a["duration_ms"][retried] - a["ust_ms"][retried]) / (a["attempts"][retried] - 1) / 1e3
    report["retry_delay_s"] = {"mean": float(waits.mean()) if len(waits) else None, "pairs": int(len(waits))}
    return arrivals, routing, retries
