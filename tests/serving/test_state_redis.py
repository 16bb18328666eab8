"""Runtime replicas on one Redis (issue 20): idempotent route/complete, one bill, one lease book, one lead.

Two :class:`Runtime` objects in one process stand for two replicas: each has
its own pool, lock and clock, and they share only the Redis server that the
``redis_server`` fixture starts on loopback. The HTTP replica test (two
``sloctl serve`` processes) is in ``test_replicas.py``.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from sloctl.config import StateSection, load_config
from sloctl.core.errors import ConfigError
from sloctl.serving.runtime import RequestRefused, Runtime


class FakeClock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    from sloctl.registry.store import connect

    uri = f"sqlite:///{tmp_path_factory.mktemp('reg') / 'mlflow.db'}"
    connect(uri)  # an empty registry: the replicas route round-robin
    return uri


@pytest.fixture
def cfg(redis_server, registry, request):
    base = load_config()
    prefix = f"t{abs(hash(request.node.name)) % 10**8}"
    redis_server.client().flushdb()
    return dataclasses.replace(
        base, registry=dataclasses.replace(base.registry, tracking_uri=registry),
        router=dataclasses.replace(base.router, minimum_s=1.0, price_per_unit_s=1.0),
        serve=dataclasses.replace(base.serve, cluster_sizes=(1, 2)),
        state=StateSection(url=redis_server.url, key_prefix=prefix))


def _pair(cfg, clock=None):
    a = Runtime(cfg, None, "unused.db", clock=clock or FakeClock()).start()
    b = Runtime(cfg, None, "unused.db", clock=clock or FakeClock()).start()
    return a, b


def test_a_route_repeated_on_another_replica_gets_the_first_answer(cfg):
    a, b = _pair(cfg)
    first = a.route(1, "t00", 5.0)
    again = b.route(1, "t00", 5.0)
    assert again["cluster_id"] == first["cluster_id"] and again["decision_ms"] == first["decision_ms"]
    with pytest.raises(RequestRefused) as other:  # the same id for another query is refused, not re-routed
        b.route(1, "t01", 5.0)
    assert other.value.status == 409
    done = b.complete(1, 0.5, "ok")
    assert a.complete(1, 0.5, "ok") == done and done["violated"] is False
    with pytest.raises(RequestRefused) as changed:
        a.complete(1, 9.0, "ok")
    assert changed.value.status == 409
    with pytest.raises(RequestRefused) as unknown:
        a.complete(2, 0.1, "ok")
    assert unknown.value.status == 404
    assert a.store.running() == [] and a.store.counters() == (1, 0)
    a.close(), b.close()


def test_each_replica_sees_the_others_running_queries(cfg):
    a, b = _pair(cfg)
    for qid in range(6):
        (a if qid % 2 else b).route(qid, "t00", 5.0)
    b.route(100, "t00", 5.0)  # b catches up before deciding
    assert {row[0] for row in a.store.running()} == {*range(6), 100}
    assert set(b.pool.running) == {*range(6), 100}
    a.complete(3, 0.1, "ok")
    a.tick(), b.tick()
    assert set(a.pool.running) == set(b.pool.running) == {0, 1, 2, 4, 5, 100}
    a.close(), b.close()


def test_racing_replicas_commit_one_route_per_query(cfg):
    a, b = _pair(cfg)
    answers: dict[str, list] = {"a": [], "b": []}

    def drive(rt, name):
        for qid in range(200):
            answers[name].append(rt.route(qid, "t00", 5.0)["cluster_id"])

    threads = [threading.Thread(target=drive, args=(rt, n)) for rt, n in ((a, "a"), (b, "b"))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert answers["a"] == answers["b"]  # every id: one decision, whoever asked
    assert len(a.store.running()) == 200
    a.tick(), b.tick()
    assert len(a.pool.running) == len(b.pool.running) == 200
    a.close(), b.close()


def test_the_bill_is_the_sum_of_the_windows_it_charged(cfg):
    clock = FakeClock()
    a, b = _pair(cfg, clock)
    a.route(1, "t00", 5.0)        # opens c? at t0
    clock.t += 0.2
    b.route(2, "t00", 5.0)        # round-robin on b: the other cluster or the same, either way one timer each
    clock.t += 0.3
    a.complete(1, 0.5, "ok")
    clock.t += 0.1
    b.complete(2, 0.4, "ok")
    clock.t += 5.0                # past minimum_s (1 s): every window closed
    total = a.total_cost(a.now_s())
    windows = {cid: a.store.billed_windows(cid) for cid in a.pool.clusters}
    charged = sum((end - start) * size for ws in windows.values() for start, end, size in ws)
    assert sum(len(ws) for ws in windows.values()) >= 1
    assert total == pytest.approx(charged, rel=1e-9) and total == pytest.approx(b.total_cost(b.now_s()))
    for ws in windows.values():  # windows of one cluster never overlap, and last at least minimum_s
        assert all(e1 <= s2 for (_, e1, _), (s2, _, _) in zip(ws, ws[1:], strict=False))
        assert all(end - start >= 1.0 - 1e-9 for start, end, _ in ws)
    a.close(), b.close()


def test_a_lease_released_on_another_replica_returns_to_the_granting_pool(cfg):
    clock = FakeClock()
    a, b = _pair(cfg, clock)
    lease = a.leases.acquire("high", "client-1", a.now_s())
    assert lease is not None and a.admission.in_flight == 1
    from sloctl.control.credits import LeaseError

    with pytest.raises(LeaseError):
        b.leases.release(lease.lease_id, b.now_s(), holder="someone-else")
    b.leases.release(lease.lease_id, b.now_s(), holder="client-1")
    assert b.admission.in_flight == 0 and a.admission.in_flight == 1  # b's pool never held it
    a.reclaim_leases()
    assert a.admission.in_flight == 0 and a.leases.outstanding == 0
    with pytest.raises(LeaseError):  # released once, by exactly one replica
        a.leases.release(lease.lease_id, a.now_s())
    short = a.leases.acquire("low", "leaky", a.now_s(), ttl_s=0.5)
    assert short is not None and a.admission.in_flight == 1
    clock.t += 1.0
    assert [x.lease_id for x in b.leases.reclaim(b.now_s())] == [short.lease_id]  # b reclaims a's expired lease
    a.reclaim_leases()
    assert a.admission.in_flight == 0
    a.close(), b.close()


def test_one_replica_holds_the_scaling_lead_and_hands_it_over_at_shutdown(cfg):
    a, b = _pair(cfg)
    assert [a.leads(), b.leads()].count(True) == 1
    leader, other = (a, b) if a.leads() else (b, a)
    leader.close()
    other._lead = (0.0, False)  # its next look (each second at most) finds the lead free
    assert other.leads()
    other.close()


def test_state_url_is_checked():
    with pytest.raises(ConfigError, match="state.url"):
        StateSection(url="http://localhost:6379")
    with pytest.raises(ConfigError, match="key_prefix"):
        StateSection(key_prefix="a b")


def test_an_unreachable_redis_is_a_clear_error(registry):
    base = load_config()
    cfg = dataclasses.replace(base, registry=dataclasses.replace(base.registry, tracking_uri=registry),
                              state=StateSection(url="redis://127.0.0.1:1/0"))
    with pytest.raises(ValueError, match="state.url"):
        Runtime(cfg, None, "unused.db").start()


def test_sqlite_route_and_complete_are_idempotent_too(tmp_path, registry):
    base = load_config()
    cfg = dataclasses.replace(base, registry=dataclasses.replace(base.registry, tracking_uri=registry))
    rt = Runtime(cfg, None, str(tmp_path / "state.db")).start()
    first = rt.route(7, "t00", 5.0)
    assert rt.route(7, "t00", 5.0) == first
    done = rt.complete(7, 0.2, "ok")
    assert rt.complete(7, 0.2, "ok") == done and rt.route(7, "t00", 5.0) == first
    with pytest.raises(RequestRefused) as other:
        rt.route(7, "t01", 5.0)
    assert other.value.status == 409
    rt.close()
    again = Runtime(cfg, None, str(tmp_path / "state.db")).start()  # answers survive a restart
    assert again.complete(7, 0.2, "ok") == done
    again.close()


def test_a_replica_that_fell_behind_the_trimmed_log_rebuilds_its_view(cfg):
    a, b = _pair(cfg)
    for rt in (a, b):
        rt.store.log_maxlen = 5  # a short log: b's last event is trimmed while it is idle
    b.tick()
    for qid in range(20):
        a.route(qid, "t00", 5.0)
    for qid in range(10):
        a.complete(qid, 0.1, "ok")
    b.tick()
    assert b.reconciled.get("resyncs") == 1
    assert set(b.pool.running) == set(a.pool.running) == set(range(10, 20))
    b.route(100, "t00", 5.0)  # and it follows the log again from there
    a.complete(10, 0.1, "ok")
    b.tick()
    assert set(b.pool.running) == {*range(11, 20), 100} and b.reconciled.get("resyncs") == 1
    a.close(), b.close()
