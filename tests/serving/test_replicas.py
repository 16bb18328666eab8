"""Two ``sloctl serve`` replicas on one Redis under a bounded loopback load (issue 20, Build 5).

Each route/complete and admit/release pair sends its two calls to different
replicas. Afterwards: no 5xx, every acknowledged query completed once and
nothing left running, no lease outstanding and each replica's pool back to
no credit in flight, and the bill equal to the windows it charged (every
route inside one). The slow variant runs 10k + 10k pairs, then kills one
replica with SIGKILL mid-load and checks the same on the survivor.
"""

from __future__ import annotations

import time

import httpx
import pytest

from sloctl.experiments.replicas import audit, drive, start_replicas, write_config

TOKEN = "replica-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def fleet(redis_server, tmp_path, request):
    from sloctl.registry.store import connect

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    connect(uri)  # the registry's tables exist before two processes open it
    prefix = f"fleet{abs(hash(request.node.name)) % 10**6}"
    config = write_config(tmp_path / "fleet.yaml", state_url=redis_server.url, prefix=prefix, tracking_uri=uri,
                          cluster_sizes=(1, 2, 1), minimum_s=0.05, lease_ttl_s=2.0)
    replicas = start_replicas(2, config, TOKEN, tmp_path)
    yield replicas, redis_server.url, prefix
    for r in replicas:
        r.stop()


def _settle_and_audit(replica, redis_url: str, prefix: str) -> dict:
    time.sleep(2.5)  # past minimum_s and the lease lifetime; the watchers reclaim and take back credits
    view = httpx.get(f"http://127.0.0.1:{replica.port}/v1/clusters", timeout=10).json()
    assert all(not c["running"] for c in view["clusters"])  # the replica's own view: nothing running
    return audit(redis_url, prefix, price_per_unit_s=1.0, reported_cost=view["total_cost"])


def _in_flight(replica) -> int:
    """The replica's credits in flight, read by taking one lease and releasing it."""
    out = httpx.post(f"http://127.0.0.1:{replica.port}/v1/admit", json={"class": "high", "holder": "probe"},
                     headers=AUTH, timeout=10).json()
    httpx.post(f"http://127.0.0.1:{replica.port}/v1/release", json={"lease_id": out["lease_id"], "holder": "probe"},
               headers=AUTH, timeout=10).raise_for_status()
    return out["in_flight"] - 1


def _check(load, report, *, route_pairs: int) -> None:
    assert load.server_errors == 0 and load.mismatched == 0, load.statuses
    assert len(load.completed) == route_pairs  # every query acknowledged as completed
    assert report["running"] == 0 and report["leases"] == 0
    assert report["completed"] == len(load.completed)  # each completion counted once, whichever replica
    assert report["billed_cost"] == pytest.approx(report["reported_cost"], rel=1e-9, abs=1e-9)
    assert report["routes_outside_windows"] == 0 and report["overlapping_windows"] == 0


@pytest.mark.slow
def test_two_replicas_share_one_state(fleet):
    replicas, url, prefix = fleet
    load = drive(replicas, TOKEN, route_pairs=400, admit_pairs=400, workers=8, seed=1)
    assert load.leases_granted == load.leases_released > 0
    report = _settle_and_audit(replicas[1], url, prefix)
    _check(load, report, route_pairs=400)
    assert [_in_flight(r) for r in replicas] == [0, 0]  # credits released elsewhere went home
    # a client retrying a route on the other replica gets the first answer
    first = httpx.post(f"http://127.0.0.1:{replicas[0].port}/v1/route",
                       json={"query_id": 10**6, "template": "t00", "slo_s": 5.0}, headers=AUTH, timeout=10).json()
    again = httpx.post(f"http://127.0.0.1:{replicas[1].port}/v1/route",
                       json={"query_id": 10**6, "template": "t00", "slo_s": 5.0}, headers=AUTH, timeout=10).json()
    assert again == first
    states = [httpx.get(f"http://127.0.0.1:{r.port}/v1/clusters", timeout=10).json()["state"] for r in replicas]
    assert {s["store"] for s in states} == {"redis"} and len({s["replica"] for s in states}) == 2
    assert sum(s["leads_scaling"] for s in states) == 1  # one replica enacts scaling


@pytest.mark.slow
def test_ten_thousand_pairs_then_a_replica_killed_mid_load(fleet):
    replicas, url, prefix = fleet
    load = drive(replicas, TOKEN, route_pairs=10_000, admit_pairs=10_000, workers=16, seed=2)
    report = _settle_and_audit(replicas[0], url, prefix)
    _check(load, report, route_pairs=10_000)
    assert [_in_flight(r) for r in replicas] == [0, 0]
    # kill -9 replica 0 a third of the way through; every call it dropped is sent to the survivor
    load = drive(replicas, TOKEN, route_pairs=3_000, admit_pairs=3_000, workers=16, seed=3, first_id=10**5,
                 kill_after=2_000)
    assert not replicas[0].alive and load.resent > 0
    report = _settle_and_audit(replicas[1], url, prefix)
    assert load.server_errors == 0 and load.mismatched == 0, load.statuses
    assert len(load.completed) == 3_000  # nothing the survivor (or the dead one) acknowledged is lost
    assert report["running"] == 0 and report["leases"] == 0 and report["completed"] == 13_000
    assert report["billed_cost"] == pytest.approx(report["reported_cost"], rel=1e-9, abs=1e-9)
    assert report["routes_outside_windows"] == 0 and report["overlapping_windows"] == 0
    assert _in_flight(replicas[1]) == 0
    deadline = time.monotonic() + 15  # the lead is a Redis key with a 5 s TTL: the survivor takes it
    while not httpx.get(f"http://127.0.0.1:{replicas[1].port}/v1/clusters", timeout=10).json()["state"][
            "leads_scaling"]:
        assert time.monotonic() < deadline, "the survivor never took the scaling lead"
        time.sleep(0.5)
