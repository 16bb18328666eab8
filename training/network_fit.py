"""Fitting a DiffTry service network (docs/retry.md) from service traces.

The people who run a service mesh have traces, not a network file. Every field
of the file can be read off spans (docs/retry.md, "From traces"):

* an *attempt* at service b is a SERVER span of b (or, where b recorded
  nothing, a CLIENT span aimed at b with no SERVER child); it was *refused*
  when it answered 503 or 429;
* a *call* is what one caller asked for: the SERVER attempts under one CLIENT
  span (retries made below the application, by a sidecar), or the CLIENT spans
  of one original and its resends (``http.request.resend_count``, retries made
  by the HTTP client); a call whose caller is not a traced service (no parent,
  or a client-only caller such as a load generator) is an *external* arrival;
* routing ``F[c][a][b]`` = calls from admitted SERVER spans of a to b, per
  admitted SERVER span of a; arrivals ``gamma[c][b]`` = external calls per
  second of the window, divided by the sampling rate;
* a SERVER span's *local phase* runs from its start to its first outgoing
  call (or its end): queueing and service when the span starts at arrival,
  service alone when it starts with the handler. With c servers the busy
  server-time is ``B = integral of min(n(t), c) dt`` over the local phases, so
  ``capacity = c N / B`` whichever convention the spans follow; with sampled
  traces (not every attempt is seen) ``capacity = c / mean(local phase)``,
  which needs spans that start with the handler;
* the buffer is the largest number of admitted attempts in their local phase
  at any refusal (the number in the system when refusals begin); with no
  refusal seen, the largest number seen at all, a lower bound;
* a class's retry limit is the largest number of resends seen in one call, a
  lower bound unless some call was refused on every attempt; the mean retry
  delay is the mean gap between an attempt's end and the next attempt's start.

Bad traces are data: orphans, duplicate span ids, children that start before
their parent (clock skew between hosts), spans still open at the window's end,
unsampled spans and traces without a root are counted in the report, never
fatal. Parsing streams one file at a time (:mod:`sloctl.datasets.traces`);
what is kept is a few numbers per span.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sloctl.core.errors import SloctlError

__all__ = ["FitOptions", "NetworkFit", "NetworkFitError", "SpanTable", "fit_network", "fit_spans", "parse_window",
           "rate_ci95", "weight_ci95"]

REFUSAL_STATUS = (429, 503)
_KINDS = {"": 0, "server": 1, "client": 2, "internal": 3, "producer": 4, "consumer": 5}
SERVER, CLIENT, INTERNAL = 1, 2, 3


class NetworkFitError(SloctlError, ValueError):
    """Traces from which no network can be fitted, or fitting options out of range."""


@dataclass(frozen=True)
class FitOptions:
    """What the traces cannot say, and how to read them.

    Args:
        sampling: the fraction of traces kept (head sampling); arrivals are divided by it.
        buffers, retries, servers: per-service buffer, per-class retry limit and
            per-service number of servers given from config (they win over the traces).
        weights: per-class value of a success (the optimiser's weights); 1 if not given.
        window_s: (start, end) epoch seconds; spans starting outside are left out.
        default_class: the class of spans with no class attribute anywhere in their trace.
        min_spans: the fewest admitted attempts a capacity may rest on.
    """

    sampling: float = 1.0
    buffers: Mapping[str, int] = field(default_factory=dict)
    retries: Mapping[str, int] = field(default_factory=dict)
    servers: Mapping[str, int] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)
    window_s: tuple[float, float] | None = None
    default_class: str = "default"
    min_spans: int = 20

    def validate(self) -> None:
        if not 0 < self.sampling <= 1:
            raise NetworkFitError(f"The 'sampling' option must be in (0, 1], got {self.sampling!r}.")
        for name, table, low in (("buffer", self.buffers, 1), ("retries", self.retries, 0),
                                 ("servers", self.servers, 1)):
            for key, value in table.items():
                if isinstance(value, bool) or not isinstance(value, int) or value < low:
                    raise NetworkFitError(f"The '{name}' option for {key!r} must be a whole number >= {low}, "
                                          f"got {value!r}.")
        if self.window_s is not None and not self.window_s[0] < self.window_s[1]:
            raise NetworkFitError(f"The 'window' option must have START < END, got {self.window_s!r}.")


@dataclass(frozen=True)
class NetworkFit:
    """A fitted network (the file form of docs/retry.md, provenance included) and the fit report."""

    network: dict[str, Any]
    report: dict[str, Any]

    def spec(self):
        from sloctl.models.retry_network import network_from_mapping

        return network_from_mapping(self.network, source="<fitted network>")

    def to_yaml(self) -> str:
        import yaml

        head = ("# Fitted by `sloctl fit network` from the traces named under provenance; the fit report\n"
                "# (`--json`) says how many spans each estimate rests on.\n")
        return head + yaml.safe_dump(self.network, sort_keys=False)


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` in epoch seconds or ISO 8601 times (``2026-12-04T10:00:00Z``) -> epoch seconds."""
    from datetime import datetime

    def one(part: str) -> float:
        part = part.strip()
        try:
            return float(part)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(part.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise NetworkFitError(f"The 'window' option must be START:END in epoch seconds or ISO 8601 times, "
                                  f"got {text!r}.") from None

    # ISO times hold ':' themselves: split at the ':' that leaves two readable halves
    for i, ch in enumerate(text):
        if ch == ":":
            try:
                start, end = one(text[:i]), one(text[i + 1:])
            except NetworkFitError:
                continue
            if not start < end:
                raise NetworkFitError(f"The 'window' option must have START < END, got {text!r}.")
            return start, end
    raise NetworkFitError(f"The 'window' option must be START:END in epoch seconds or ISO 8601 times, got {text!r}.")


# -- the span table -----------------------------------------------------------------------
class SpanTable:
    """The few numbers per span the fit needs, gathered while the files stream past."""

    def __init__(self) -> None:
        self.services: dict[str, int] = {}
        self.classes: dict[str, int] = {}
        self._ids: dict[str, int] = {}
        self._parents: list[str] = []
        self._forced_parent: dict[int, int] = {}
        self.cols: dict[str, list[int]] = {k: [] for k in ("trace", "svc", "kind", "start", "end", "http", "resend",
                                                              "klass", "peer", "err", "sampled")}
        self.traces_with_root: set[int] = set()
        self.traces: dict[str, int] = {}
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._parents)

    def _code(self, table: dict[str, int], name: str) -> int:
        if not name:
            return -1
        code = table.get(name)
        if code is None:
            code = table[name] = len(table)
        return code

    def add_all(self, spans: Iterable[Any]) -> SpanTable:
        for span in spans:
            self.add(span)
        return self

    def add(self, span: Any) -> None:
        """Add one :class:`~sloctl.datasets.traces.Span`; a second span with the same id is a duplicate."""
        kind = _KINDS.get(span.kind, 0)
        idx = len(self._parents)
        known = self._ids.get(span.span_id)
        if known is not None:
            other = self.cols["kind"][known]
            if {kind, other} == {SERVER, CLIENT}:  # Zipkin's shared span: client and server under one id
                server, client = (idx, known) if kind == SERVER else (known, idx)
                self._forced_parent[server] = client
                self._ids[span.span_id] = server  # calls made by the server name this id as their parent
            else:
                self.duplicates += 1
                return
        else:
            self._ids[span.span_id] = idx
        trace = self.traces.setdefault(span.trace_id, len(self.traces))
        if not span.parent_id:
            self.traces_with_root.add(trace)
        self._parents.append(span.parent_id)
        c = self.cols
        c["trace"].append(trace)
        c["svc"].append(self._code(self.services, span.service))
        c["kind"].append(kind)
        c["start"].append(span.start_ns)
        c["end"].append(span.end_ns)
        c["http"].append(span.http_status)
        c["resend"].append(span.resend_count)
        c["klass"].append(self._code(self.classes, span.klass))
        c["peer"].append(self._code(self.services, span.peer_service))
        c["err"].append(1 if span.error else 0)
        c["sampled"].append(1 if span.sampled else 0)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {k: np.asarray(v, dtype=np.int64) for k, v in self.cols.items()}
        ids = self._ids
        parent = np.fromiter((ids.get(p, -2) if p else -1 for p in self._parents), dtype=np.int64,
                             count=len(self._parents))
        for server, client in self._forced_parent.items():
            parent[server] = client
        parent[parent == np.arange(len(parent))] = -2  # a span naming itself as parent is an orphan
        out["parent"] = parent
        return out


# -- the fit --------------------------------------------------------------------------------
def fit_network(paths: Sequence[str | Path] | str | Path, *, fmt: str | None = None,
                class_attribute: str = "sloctl.class", options: FitOptions | None = None,
                progress: Any = None) -> NetworkFit:
    """Fit a network from trace files (``otlp-json``, ``zipkin``, ``jaeger``; detected by content).

    Args:
        paths: a file, a directory (walked) or a list of them.
        fmt: the format of every file (None: detected per file).
        class_attribute: the span or resource attribute naming the request's class.
        options: see :class:`FitOptions`.
        progress: called with the number of spans read so far, every 100,000 spans.

    Returns:
        The fitted network with provenance, and the report.
    """
    from sloctl.datasets.traces import ParseReport, iter_spans, trace_files

    options = options or FitOptions()
    options.validate()
    files = trace_files(paths)
    report = ParseReport()
    table = SpanTable()
    for n, span in enumerate(iter_spans(files, fmt=fmt, class_attribute=class_attribute, report=report), 1):
        table.add(span)
        if progress is not None and n % 100_000 == 0:
            progress(n)
    parse = report.to_json()
    fitted = fit_spans(table, options)
    fitted.report["parse"] = parse
    fitted.report["anomalies"]["unreadable_records"] = parse["unreadable"]
    fitted.report["anomalies"]["ids_base64"] = parse["ids_base64"]
    fitted.network["provenance"] = {
        "fitted_from": "traces", "class_attribute": class_attribute, "sampling": options.sampling,
        "files": [{"path": f["path"], "format": f["format"], "sha256": f["sha256"], "records": f["records"]}
                  for f in parse["files"]],
        "window": fitted.report["window"], "spans": fitted.report["spans"],
    }
    return fitted


def fit_spans(table: SpanTable, options: FitOptions | None = None) -> NetworkFit:
    """Fit the network from a filled :class:`SpanTable` (see the module docstring for the rules)."""
    options = options or FitOptions()
    options.validate()
    if len(table) == 0:
        raise NetworkFitError("No spans were read: nothing to fit a network from.")
    a = table.arrays()
    names = {v: k for k, v in table.services.items()}
    classes = {v: k for k, v in table.classes.items()}
    anomalies = _prepare(a, table)
    klass_names = _propagate_classes(a, classes, options.default_class, anomalies)
    window = _window(a, options)
    calls = _calls(a)
    fitted = np.unique(a["svc"][(a["kind"] == SERVER) & (a["svc"] >= 0)])
    report: dict[str, Any] = {"spans": int(len(table)), "anomalies": anomalies, "window": window,
                              "services": {}, "unfitted": {}, "classes": {}, "routing": {}}
    capacity, buffers = _service_estimates(a, calls, names, fitted, options, report)
    for code in sorted(set(table.services.values()) - set(fitted.tolist())):
        report["unfitted"][names[code]] = "no SERVER spans: it only calls others (an external caller)"
    arrivals, routing, retries = _flows(a, calls, names, klass_names, capacity, window, options, report)
    network = _network(capacity, buffers, arrivals, routing, retries, klass_names, options, report)
    return NetworkFit(network=network, report=report)


def _prepare(a: dict[str, np.ndarray], table: SpanTable) -> dict[str, Any]:
    """Infer missing kinds and count what is odd about the spans."""
    parent, kind, svc = a["parent"], a["kind"], a["svc"]
    has_parent = parent >= 0
    psvc = np.where(has_parent, svc[np.maximum(parent, 0)], -1)
    unknown = kind == 0
    # no kind (Jaeger without span.kind): a root or a span under another service's span serves a call
    kind[unknown & ((parent == -1) | (has_parent & (psvc != svc)))] = SERVER
    kind[unknown & (kind == 0)] = INTERNAL
    pstart = np.where(has_parent, a["start"][np.maximum(parent, 0)], 0)
    skew = has_parent & (psvc != svc) & (a["start"] < pstart)
    return {
        "orphans": int(np.count_nonzero(parent == -2)),
        "duplicate_span_ids": int(table.duplicates),
        "clock_skew": int(np.count_nonzero(skew)),
        "kind_inferred": int(np.count_nonzero(unknown)),
        "unsampled": int(np.count_nonzero(a["sampled"] == 0)),
        "traces": len(table.traces),
        "traces_without_root": len(table.traces) - len(table.traces_with_root),
        "open_spans": int(np.count_nonzero(a["end"] <= 0)),
    }


def _propagate_classes(a: dict[str, np.ndarray], classes: dict[int, str], default: str,
                       anomalies: dict[str, Any]) -> list[str]:
    """A span without the class attribute takes its parent's (then its children's, for a root); else the default."""
    k, parent = a["klass"], a["parent"]
    for _ in range(256):
        todo = (k < 0) & (parent >= 0)
        fill = np.where(todo, k[np.maximum(parent, 0)], -1)
        moved = todo & (fill >= 0)
        if not moved.any():
            break
        k[moved] = fill[moved]
    for _ in range(256):  # a root without the attribute (a load generator's span) takes its children's
        orphan_roots = (k < 0)
        child = (parent >= 0) & (k >= 0)
        if not orphan_roots.any() or not child.any():
            break
        up = np.full(len(k), -1)
        up[parent[child]] = k[child]
        moved = orphan_roots & (up >= 0)
        if not moved.any():
            break
        k[moved] = up[moved]
    names = [classes[i] for i in range(len(classes))]
    missing = k < 0
    anomalies["unclassed_spans"] = int(np.count_nonzero(missing))
    if missing.any():
        if default not in names:
            names.append(default)
        k[missing] = names.index(default)
    return names


def _window(a: dict[str, np.ndarray], options: FitOptions) -> dict[str, Any]:
    start = a["start"]
    if options.window_s is not None:
        lo, hi = (int(round(t * 1e9)) for t in options.window_s)
    else:  # the external calls' span: the roots' starts, stretched by one mean gap (n - 1 gaps between n)
        roots = start[a["parent"] == -1]
        span = roots if len(roots) > 1 else start
        lo, hi = int(span.min()), int(span.max())
        hi += (hi - lo) // max(len(span) - 1, 1)
    ends = a["end"]
    in_window = (start >= lo) & (start <= hi)
    open_at_end = in_window & ((ends <= 0) | (ends > hi))
    return {"start_s": lo / 1e9, "end_s": hi / 1e9, "seconds": max(hi - lo, 1) / 1e9,
            "given": options.window_s is not None, "lo_ns": lo, "hi_ns": hi,
            "open_at_window_end": int(np.count_nonzero(open_at_end))}


def _server_ancestor(a: dict[str, np.ndarray]) -> np.ndarray:
    """For every span, the nearest SERVER span at or above it within its own service (-1: none)."""
    parent, svc = a["parent"], a["svc"]
    anc = np.where(a["kind"] == SERVER, np.arange(len(parent)), -1)
    p = np.maximum(parent, 0)
    same = (parent >= 0) & (svc[p] == svc)
    for _ in range(256):
        todo = (anc < 0) & same & (anc[p] >= 0)
        if not todo.any():
            break
        anc[todo] = anc[p[todo]]
    return anc


def _client_groups(a: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each CLIENT span's call (the index of the call's first span) and target service.

    Resends (``http.request.resend_count`` > 0) join the latest earlier CLIENT
    span of the same parent aimed at the same service.
    """
    n = len(a["kind"])
    kind, parent, svc = a["kind"], a["parent"], a["svc"]
    target = a["peer"].copy()
    server_child = (kind == SERVER) & (parent >= 0)
    by_child = np.full(n, -1)
    by_child[parent[server_child]] = svc[server_child]
    target = np.where(target >= 0, target, by_child)
    group = np.full(n, -1)
    client = np.flatnonzero(kind == CLIENT)
    if len(client):
        trace = a["trace"]
        order = client[np.lexsort((a["start"][client], target[client], parent[client], trace[client]))]
        same_call = np.zeros(len(order), dtype=bool)
        same_call[1:] = ((parent[order][1:] == parent[order][:-1]) & (target[order][1:] == target[order][:-1])
                         & (trace[order][1:] == trace[order][:-1]) & (a["resend"][order][1:] > 0))
        group[order] = order[np.maximum.accumulate(np.where(~same_call, np.arange(len(order)), 0))]
    return group, target


def _calls(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Attempts (with their call, caller and outcome) and calls, as parallel arrays."""
    n = len(a["kind"])
    kind, parent, svc = a["kind"], a["parent"], a["svc"]
    anc = _server_ancestor(a)
    cgroup, ctarget = _client_groups(a)
    refused = np.isin(a["http"], REFUSAL_STATUS)
    has_server_child = np.zeros(n, dtype=bool)
    sc = (kind == SERVER) & (parent >= 0)
    has_server_child[parent[sc]] = True
    server = np.flatnonzero((kind == SERVER) & (svc >= 0))
    lone_client = np.flatnonzero((kind == CLIENT) & ~has_server_child & (ctarget >= 0))

    p = parent[server]
    pc = np.maximum(p, 0)
    via_client = (p >= 0) & (kind[pc] == CLIENT)
    s_group = np.where(via_client, cgroup[pc], server)
    s_caller = np.where(p >= 0, svc[pc], -1)
    s_caller = np.where(p == -2, -2, s_caller)
    s_anc = np.where(p >= 0, anc[pc], -1)

    att = np.concatenate([server, lone_client])
    out = {
        "span": att,
        "target": np.concatenate([svc[server], ctarget[lone_client]]),
        "group": np.concatenate([s_group, cgroup[lone_client]]),
        "caller": np.concatenate([s_caller, svc[lone_client]]),
        "caller_span": np.concatenate([s_anc, anc[lone_client]]),
        "refused": refused[att],
        "start": a["start"][att],
        "end": a["end"][att],
        "klass": a["klass"][att],
    }
    out["anc"] = anc
    return out


def _local_end(a: dict[str, np.ndarray], anc: np.ndarray) -> np.ndarray:
    """Each SERVER span's end of local work: its first outgoing call's start, else its own end."""
    n = len(anc)
    first_call = np.full(n, np.iinfo(np.int64).max)
    client = (a["kind"] == CLIENT) & (anc >= 0)
    np.minimum.at(first_call, anc[client], a["start"][client])
    parent = a["parent"]
    other = (parent >= 0) & (a["svc"] != a["svc"][np.maximum(parent, 0)])  # calls with no CLIENT span recorded
    np.minimum.at(first_call, parent[other], a["start"][other])
    return np.maximum(np.minimum(first_call, a["end"]), a["start"])


def _busy_time_ns(starts: np.ndarray, ends: np.ndarray, servers: int) -> tuple[float, int]:
    """Integral of min(n(t), servers) over the intervals, and the largest n(t)."""
    t = np.concatenate([starts, ends])
    d = np.concatenate([np.ones(len(starts), dtype=np.int64), -np.ones(len(ends), dtype=np.int64)])
    order = np.lexsort((d, t))  # an end before a start at the same instant
    t, n = t[order], np.cumsum(d[order])
    busy = float(np.sum(np.minimum(n[:-1], servers) * np.diff(t)))
    return busy, int(n.max()) if len(n) else 0


def _service_estimates(a, calls, names, fitted, options: FitOptions, report) -> tuple[dict, dict]:
    """Capacity (and servers, cv) and buffer per service; unfittable services named with the reason."""
    local_end = _local_end(a, calls["anc"])
    capacity: dict[str, float] = {}
    buffers: dict[str, int] = {}
    for code in fitted.tolist():
        name = names[code]
        mine = calls["target"] == code
        adm = calls["span"][mine & ~calls["refused"] & (calls["end"] > 0)]
        adm = adm[a["kind"][adm] == SERVER]
        refusal_t = np.sort(calls["start"][mine & calls["refused"]])
        row: dict[str, Any] = {"attempts": int(np.count_nonzero(mine)), "admitted": int(len(adm)),
                               "refused": int(len(refusal_t))}
        report["services"][name] = row
        if len(adm) < options.min_spans:
            report["unfitted"][name] = (f"only {len(adm)} admitted SERVER spans (a capacity needs at least "
                                        f"{options.min_spans})")
            continue
        starts, ends = a["start"][adm], local_end[adm]
        c = int(options.servers.get(name, 1))
        busy_ns, most = _busy_time_ns(starts, ends, c)
        exclusive = c / (float(np.mean(ends - starts)) / 1e9) if np.any(ends > starts) else math.inf
        by_busy = options.sampling >= 1 and busy_ns > 0
        capacity[name] = c * len(adm) / (busy_ns / 1e9) if by_busy else exclusive
        order = np.argsort(starts, kind="stable")
        s_sorted, e_sorted = starts[order], np.sort(ends)
        row.update({"capacity_per_s": capacity[name],
                    "capacity_basis": "busy time of the local phases (every attempt seen)" if by_busy
                    else "mean local phase (sampled: spans must start with the handler)",
                    "capacity_exclusive_per_s": exclusive, "servers": c,
                    "servers_basis": "config" if name in options.servers else "one FIFO queue (assumed)",
                    "max_concurrency": most, "service_cv": _service_cv(starts[order], ends[order]) if c == 1
                    else None, "rests_on_spans": int(len(adm))})
        buffers[name] = buffer_at_refusals(name, s_sorted, e_sorted, refusal_t, most, options, row)
    return capacity, buffers


def buffer_at_refusals(name: str, starts_sorted: np.ndarray, ends_sorted: np.ndarray, refusal_t: np.ndarray,
                       most: int, options: FitOptions, row: dict[str, Any]) -> int:
    """The buffer: config, else the most admitted attempts in their local phase at a refusal, else the most seen.

    ``row`` (the service's report) gets the basis and what the refusals saw.
    """
    seen = np.searchsorted(starts_sorted, refusal_t, "right") - np.searchsorted(ends_sorted, refusal_t, "right")
    if name in options.buffers:
        buffer, basis = int(options.buffers[name]), "config"
    elif len(seen):
        buffer, basis = max(1, int(seen.max())), "largest number in the system at a refusal"
    else:
        buffer, basis = max(1, most), "no refusal seen: the largest number in the system (lower bound)"
    row.update({"buffer": buffer, "buffer_basis": basis, "refusals_seen": int(len(seen)),
                "in_system_at_refusal": None if not len(seen) else
                {"median": float(np.median(seen)), "max": int(seen.max())}})
    return buffer


def _service_cv(starts: np.ndarray, ends: np.ndarray) -> float | None:
    """Coefficient of variation of service times under one FIFO server (start = max(arrival, last departure))."""
    if len(starts) < 2:
        return None
    begin = np.maximum(starts[1:], ends[:-1])
    service = np.clip(ends[1:] - begin, 0, None).astype(float)
    mean = float(service.mean())
    return float(service.std() / mean) if mean > 0 else None


def _group_table(calls: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One row per call: its first attempt's fields, its attempt count and whether one was admitted."""
    order = np.lexsort((calls["start"], calls["group"]))
    g = calls["group"][order]
    heads = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    counts = np.diff(np.r_[heads, len(g)])
    admitted = np.logical_or.reduceat(~calls["refused"][order], heads) if len(heads) else np.zeros(0, bool)
    first = order[heads]
    out = {k: calls[k][first] for k in ("target", "caller", "caller_span", "start", "klass")}
    out.update({"attempts": counts, "admitted": admitted})
    # the gaps between a refused attempt's end and the next attempt's start: the retry delays
    same = np.r_[False, g[1:] == g[:-1]]
    prev_end = np.r_[0, calls["end"][order][:-1]]
    gaps = (calls["start"][order] - prev_end)[same & (prev_end > 0)]
    out["retry_gaps_ns"] = gaps[gaps >= 0]
    return out


def _flows(a, calls, names, klass_names, capacity, window, options: FitOptions, report):
    """Arrivals, routing weights and retry limits per class."""
    groups = _group_table(calls)
    lo, hi, seconds = window["lo_ns"], window["hi_ns"], window["seconds"]
    fitted = {code for code, name in names.items() if name in capacity}
    in_window = (groups["start"] >= lo) & (groups["start"] <= hi)
    external = ~np.isin(groups["caller"], list(fitted)) & (groups["caller"] != -2)
    arrivals: dict[str, dict[str, float]] = {}
    routing: dict[str, dict[str, dict[str, float]]] = {}
    retries: dict[str, int] = {}
    adm_server = (a["kind"] == SERVER) & ~np.isin(a["http"], REFUSAL_STATUS) & (a["start"] >= lo) & (a["start"] <= hi)
    for ci, klass in enumerate(klass_names):
        mine = groups["klass"] == ci
        row: dict[str, Any] = {"external_calls": int(np.count_nonzero(mine & external & in_window))}
        arrivals[klass] = {}
        row["arrivals_ci95_per_s"] = {}
        for code in sorted(fitted, key=names.get):
            n = int(np.count_nonzero(mine & external & in_window & (groups["target"] == code)))
            if n:
                arrivals[klass][names[code]] = n / seconds / options.sampling
                row["arrivals_ci95_per_s"][names[code]] = rate_ci95(n, seconds, options.sampling)
        routing[klass], row["routing"] = _routing(a, groups, mine, fitted, names, adm_server, ci)
        tries = groups["attempts"][mine]
        most = int(tries.max()) - 1 if len(tries) else 0
        exhausted = bool(np.any(mine & ~groups["admitted"] & (groups["attempts"] == most + 1)))
        retries[klass] = int(options.retries.get(klass, most))
        row.update({"calls": int(np.count_nonzero(mine)), "calls_retried": int(np.count_nonzero(tries > 1)),
                    "max_resends_seen": most, "retries": retries[klass],
                    "retries_basis": "config" if klass in options.retries else
                    ("largest resend count seen; some calls were refused on every attempt" if exhausted
                     else "largest resend count seen (a lower bound: no call was refused on every attempt)"),
                    "arrivals_per_s": arrivals[klass]})
        report["classes"][klass] = row
    gaps = groups["retry_gaps_ns"]
    report["retry_delay_s"] = {"mean": float(gaps.mean()) / 1e9 if len(gaps) else None, "pairs": int(len(gaps))}
    report["anomalies"]["orphan_calls"] = int(np.count_nonzero(groups["caller"] == -2))
    return arrivals, routing, retries


def _routing(a, groups, mine, fitted, names, adm_server, ci) -> tuple[dict, dict]:
    """F[a][b]: calls to b made by admitted SERVER spans of a, per admitted SERVER span of a (class ci)."""
    weights: dict[str, dict[str, float]] = {}
    detail: dict[str, dict[str, dict[str, int]]] = {}
    caller_span = groups["caller_span"]
    ok = mine & (caller_span >= 0)
    ok[ok] = adm_server[caller_span[ok]]
    for caller in sorted(fitted, key=names.get):
        spans = int(np.count_nonzero(adm_server & (a["svc"] == caller) & (a["klass"] == ci)))
        if not spans:
            continue
        out = ok & (groups["caller"] == caller)
        for callee in sorted(set(groups["target"][out].tolist()), key=lambda c: names.get(c, "")):
            n = int(np.count_nonzero(out & (groups["target"] == callee)))
            if callee in fitted:
                weights.setdefault(names[caller], {})[names[callee]] = n / spans
            detail.setdefault(names[caller], {})[names.get(callee, "?")] = {
                "calls": n, "caller_spans": spans, "weight_ci95": weight_ci95(n, spans)}
    return weights, detail


def rate_ci95(n: int, seconds: float, sampling: float = 1.0) -> list[float]:
    """95% interval of a Poisson rate from ``n`` events in ``seconds`` (normal approximation)."""
    half = 1.96 * math.sqrt(n)
    return [max(n - half, 0.0) / seconds / sampling, (n + half) / seconds / sampling]


def weight_ci95(calls: int, spans: int) -> list[float]:
    """95% interval of a routing weight ``calls / spans`` (each span calls at most about once: binomial)."""
    w = calls / spans
    p = min(max(w - math.floor(w), 0.0), 1.0) if w > 1 else w
    half = 1.96 * math.sqrt(max(p * (1 - p), 1.0 / spans) / spans)
    return [max(w - half, 0.0), w + half]


def _network(capacity, buffers, arrivals, routing, retries, klass_names, options: FitOptions, report) -> dict:
    if not capacity:
        reasons = "; ".join(f"{s}: {r}" for s, r in report["unfitted"].items()) or "no SERVER spans"
        raise NetworkFitError(f"No service could be fitted from these traces ({reasons}).")
    services = {}
    for name in sorted(capacity):
        row: dict[str, Any] = {"capacity_per_s": _round(capacity[name]), "buffer": int(buffers[name])}
        cv = report["services"][name].get("service_cv")
        if cv is not None and options.sampling >= 1:
            row["service_cv"] = round(cv, 3)
        services[name] = row
    classes = {c: {"retries": retries[c], **({"weight": float(options.weights[c])} if c in options.weights else {})}
               for c in klass_names}
    network: dict[str, Any] = {
        "services": services, "classes": classes,
        "arrivals": {c: {s: _round(r) for s, r in v.items() if s in capacity} for c, v in arrivals.items()},
        "routing": {c: {s: {t: round(w, 4) for t, w in row.items()} for s, row in v.items() if s in capacity}
                    for c, v in routing.items()},
    }
    delay = report["retry_delay_s"]
    if delay["mean"] is not None and delay["pairs"] >= 10:
        network["retry_delay_s"] = _round(delay["mean"])
    return _convergent(network, report)


def _convergent(network: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The network, valid for the analysis: where a class's routing diverges, calls of a service to itself
    (a proxy or a framework's local hop traced as a call) are left out and named in the report."""
    from sloctl.models.retry_network import NetworkError, network_from_mapping

    try:
        network_from_mapping(network, source="<fitted network>")
        return network
    except NetworkError:
        pass
    dropped = report.setdefault("self_calls_left_out", {})
    for klass, rows in network["routing"].items():
        for service, row in rows.items():
            if service in row:
                dropped[f"{klass}:{service}"] = row.pop(service)
    try:
        network_from_mapping(network, source="<fitted network>")
    except NetworkError as exc:
        raise NetworkFitError(f"The fitted routing is not an open network the analysis can solve: {exc}") from None
    return network


def _round(x: float) -> float:
    return float(f"{x:.5g}")
