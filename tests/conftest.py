"""Shared fixtures: one tiny TPC-H database (SF 0.01) per test session."""

from __future__ import annotations

import time

import pytest


@pytest.fixture(scope="session")
def tpch_db(tmp_path_factory):
    from sloctl.datasets.tpc import ensure_database

    return ensure_database("tpch", 0.01, tmp_path_factory.mktemp("warehouse"), log=None)


@pytest.fixture(scope="session")
def iso_log(tpch_db, tpch_templates):
    """Every template once, alone, on size 1: SLO references and Stage's training data."""
    from sloctl.datasets.collect import collect
    from sloctl.datasets.workloads import isolated_workload

    return collect(tpch_db, isolated_workload(tpch_templates, 1), [1], log=None).log


@pytest.fixture(scope="session")
def tpch_templates():
    from sloctl.datasets.tpc import load_templates

    return load_templates("tpch")


def synthetic_log(n_per_cluster: int = 100, rates=(0.5, 2.0), sizes=(1, 2), seed: int = 0,
                  timeout_s: float | None = None):
    """A query log from a processor-sharing simulation (fast, deterministic).

    Twelve templates with random plan features and work; each cluster of size
    s runs its queries at rate min(1, s / running) each, so latency grows with
    concurrency and shrinks with size — the signal Iconq must learn. Every
    size also gets one isolated pass over all templates (Stage's training data).
    """
    import math

    import numpy as np
    import pandas as pd

    from sloctl.datasets.plan_features import PLAN_FEATURES

    rng = np.random.default_rng(seed)
    n_templates = 12
    feats = rng.uniform(0, 3, size=(n_templates, len(PLAN_FEATURES)))
    work = np.exp(feats[:, :4].mean(axis=1) - 2.5) * rng.uniform(0.5, 2.0, n_templates)
    rows = []

    def simulate(cluster_id, size, arrivals, templates):
        iso = work[templates] / size ** 0.8
        remaining = iso.copy()
        start = arrivals.copy()
        end = np.full(len(arrivals), np.nan)
        running: list[int] = []
        t, nxt = 0.0, 0
        while nxt < len(arrivals) or running:
            rate = min(1.0, size / max(len(running), 1))
            t_done = t + min((remaining[i] for i in running), default=math.inf) / rate
            t_arr = arrivals[nxt] if nxt < len(arrivals) else math.inf
            t_next = min(t_done, t_arr)
            for i in running:
                remaining[i] -= (t_next - t) * rate
            t = t_next
            for i in list(running):
                if remaining[i] <= 1e-12:
                    end[i] = t
                    running.remove(i)
            if t_arr <= t_done and nxt < len(arrivals):
                running.append(nxt)
                nxt += 1
        for i in range(len(arrivals)):
            status, stop = "ok", end[i]
            if timeout_s is not None and end[i] - arrivals[i] > timeout_s:
                status, stop = "timeout", arrivals[i] + timeout_s
            rows.append({"template": f"t{templates[i]:02d}", "sql_hash": f"h{templates[i]:02d}",
                         "cluster_id": cluster_id, "cluster_size": size, "arrival_s": arrivals[i],
                         "start_s": start[i], "end_s": stop, "latency_s": stop - arrivals[i], "status": status,
                         "slo_s": math.nan, "oversubscribed": False,
                         **dict(zip(PLAN_FEATURES, feats[templates[i]], strict=True))})

    offset = 0.0
    for size in sizes:
        templates = np.arange(n_templates)
        gaps = np.concatenate([[0.0], np.cumsum(work[templates][:-1] / size ** 0.8 + 0.01)])
        simulate(f"iso-{size}", size, offset + gaps, templates)
        offset += gaps[-1] + 10
        for rate in rates:
            templates = rng.integers(0, n_templates, n_per_cluster)
            arrivals = offset + np.cumsum(rng.exponential(1 / rate, n_per_cluster))
            simulate(f"busy-{size}-{rate:g}", size, arrivals, templates)
            offset = arrivals[-1] + 30
    df = pd.DataFrame(rows)
    df.insert(0, "query_id", np.arange(len(df)))
    return df


@pytest.fixture(scope="session")
def sim_log():
    from sloctl.datasets.querylog import validate_log

    return validate_log(synthetic_log(), source="synthetic log")


@pytest.fixture(scope="session")
def trained_models(sim_log):
    """Stage and Iconq+ trained once on the synthetic log, for every test that needs a trained model.

    Returns ``{"config": SloctlConfig used, "stage": TrainResult, "iconq": TrainResult}``;
    ``result.predictor`` is the :class:`~sloctl.models.predictor.LatencyPredictor`.
    """
    import dataclasses

    from sloctl.config import load_config
    from sloctl.training.pipeline import train_iconq, train_stage

    base = load_config()
    cfg = dataclasses.replace(base, iconq=dataclasses.replace(base.iconq, max_epochs=25))
    quantile = cfg.router.risk_quantile
    return {"config": cfg, "stage": train_stage(sim_log, cfg.stage, risk_quantile=quantile),
            "iconq": train_iconq(sim_log, cfg.stage, cfg.iconq, risk_quantile=quantile)}


@pytest.fixture(scope="session")
def run_sloctl():
    """``run_sloctl(*args, cwd=None, env=None, timeout_s=900)``: the CLI in a subprocess, as a user runs it.

    Returns the :class:`subprocess.CompletedProcess` (text ``stdout``/``stderr``).
    """
    import os
    import subprocess
    import sys

    def run(*args: str, cwd=None, env: dict | None = None, timeout_s: float = 900.0) -> subprocess.CompletedProcess:
        full_env = None if env is None else {**os.environ, **env}
        return subprocess.run([sys.executable, "-m", "sloctl.cli", *map(str, args)], capture_output=True, text=True,
                              cwd=cwd, env=full_env, timeout=timeout_s)

    return run


@pytest.fixture
def wait_until():
    """``wait_until(check, what, timeout_s)``: poll ``check()`` until truthy and return its value.

    Connection errors and half-written answers (``OSError``, ``ValueError``,
    ``KeyError``, ``IndexError``) count as "not yet"; the test fails naming
    ``what`` after ``timeout_s``.
    """
    def wait(check, what: str = "the expected state", timeout_s: float = 10.0):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = check()
                if value:
                    return value
            except (OSError, ValueError, KeyError, IndexError):
                pass
            assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
            time.sleep(0.05)

    return wait


def _servers():
    """tests/servers.py, loaded by path (tests are not a package; --import-mode=importlib)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "sloctl_tests_servers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("servers.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server on 127.0.0.1 (initdb into a temporary folder, a free port), stopped at session end.

    ``postgres_server.url`` is its ``postgres`` database; ``create_database(name)``
    gives a test a database of its own and returns its URL (tests/servers.py).
    """
    server = _servers().start_postgres()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server():
    """A Redis server on 127.0.0.1 at a free port, persistence off, stopped at session end (tests/servers.py).

    ``redis_server.url`` is ``redis://127.0.0.1:PORT/0``; ``redis_server.client()`` a ``redis.Redis``.
    """
    server = _servers().start_redis()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ray_local():
    """Ray in local mode (2 CPUs, no dashboard, token auth off), initialised once, shut down at session end."""
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def text_log(sim_log, tpch_db, tpch_templates):
    """``(log, catalog)``: ``sim_log`` with text and catalog features only, and the catalog they came from.

    Each of its twelve templates stands for one TPC-H query (sloctl's own
    TPC-H texts), featurized as an import featurizes a history: sqlglot on
    the text, table sizes from the catalog of the SF 0.01 database.
    """
    import numpy as np
    import pandas as pd

    from sloctl.datasets.plan_features import PLAN_FEATURES
    from sloctl.datasets.sql_features import TextFeaturizer, load_catalog

    catalog = load_catalog(tpch_db)
    featurize = TextFeaturizer("duckdb", catalog)
    sql = {f"t{i:02d}": tpch_templates[i].sql for i in range(12)}
    features = pd.DataFrame([featurize(sql[t]) for t in sim_log["template"]], index=sim_log.index)
    log = sim_log.assign(**dict.fromkeys(PLAN_FEATURES, np.nan))
    for column in features.columns:
        log[column] = features[column].to_numpy()
    return log, catalog


@pytest.fixture(scope="session")
def sql_models(text_log):
    """Stage and Iconq+ trained on ``text_log``, each carrying the log's dialect and catalog (``SqlSpec``)."""
    import dataclasses

    from sloctl.config import load_config
    from sloctl.models.predictor import SqlSpec
    from sloctl.training.pipeline import train_iconq, train_stage

    log, catalog = text_log
    base = load_config()
    cfg = dataclasses.replace(base, iconq=dataclasses.replace(base.iconq, max_epochs=4))
    stage = train_stage(log, cfg.stage, risk_quantile=cfg.router.risk_quantile)
    iconq = train_iconq(log, cfg.stage, cfg.iconq, risk_quantile=cfg.router.risk_quantile)
    for result in (stage, iconq):
        result.predictor.sql = SqlSpec("duckdb", catalog)
    return {"stage": stage, "iconq": iconq, "log": log}
