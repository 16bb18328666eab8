"""The gateway over workers bounded by bytes: a query that builds gigabytes fails alone, once, and the next one runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("trino")

from sloctl.datasets.memory_bound import find_memory_root, size_bytes  # noqa: E402

LIMIT = "256MB"


@pytest.fixture(scope="module")
def bounded(tpch_db, tmp_path_factory):
    """A gateway on two size-1 clusters whose workers hold 256 MB each, served on loopback."""
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    options = GatewayOptions(cluster_sizes=(1, 1), router="least-queued", log_dir=tmp_path_factory.mktemp("logs"),
                             worker_memory_limit=LIMIT)
    gateway = Gateway(tpch_db, options).start()
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, client
    finally:
        gateway.close()


def _cursor(client, user):
    import trino

    return trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), user=user).cursor()


def _peaks(gateway) -> dict[int, int]:
    """Each live worker's peak resident memory (VmHWM), bytes, by process id."""
    out = {}
    for info in gateway.pool.clusters():
        try:
            text = Path(f"/proc/{info.pid}/status").read_text()
        except (OSError, TypeError):
            continue
        peak = next((int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("VmHWM:")), None)
        if peak is not None:  # (an exited worker not yet reaped has none)
            out[info.pid] = peak
    return out


def _fails_with_memory_limit(gateway, client, sql):
    import trino

    peaks: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for pid, peak in _peaks(gateway).items():
                peaks[pid] = max(peaks.get(pid, 0), peak)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cur = _cursor(client, "mallory")
    try:
        with pytest.raises(trino.exceptions.TrinoQueryError) as caught:
            cur.execute(sql)
            cur.fetchall()
    finally:
        stop.set()
        sampler.join(5)
    err = caught.value
    assert err.error_name == "EXCEEDED_LOCAL_MEMORY_LIMIT", err.message
    assert len(gateway.get(err.query_id).attempts) == 1  # the query's own failure: never tried on the other cluster
    return err, peaks


def _next_query_runs(client):
    cur = _cursor(client, "alice")
    cur.execute("SELECT count(*) FROM nation")
    assert cur.fetchall() == [[25]]


@pytest.mark.parametrize("sql", ["SELECT len(range(1000000000))", "SELECT len(repeat('x', 2000000000))"],
                         ids=["list", "string"])
def test_a_gigabyte_expression_fails_alone_within_the_workers_bound(bounded, sql):
    gateway, client = bounded
    _, peaks = _fails_with_memory_limit(gateway, client, sql)
    assert peaks and max(peaks.values()) < size_bytes(LIMIT) * 1.25, peaks
    _next_query_runs(client)


@pytest.mark.skipif(find_memory_root() is None, reason="no writable cgroup hierarchy with the memory controller")
def test_a_worker_killed_at_its_bound_fails_the_query_once_and_is_replaced(bounded, wait_until):
    gateway, client = bounded
    err, _ = _fails_with_memory_limit(gateway, client, "SELECT len(range(60000000))")
    assert "exceeded its memory bound" in err.message
    wait_until(lambda: gateway.status()["restarts"] and "memory bound" in gateway.status()["restarts"][-1]["why"],
               "the worker to be replaced")
    wait_until(lambda: sum(c["ready"] for c in gateway.status()["clusters"]) == 2, "the replacement", timeout_s=30)
    _next_query_runs(client)
