"""Admission by lease: only the lease releases itself, expired leases are reclaimed, history stays bounded.

In process (a fake clock) and live: two bursts of mixed requests over
loopback leave no leaked lease, no leaked running query, and the pool at
its floor or above (the 2 x 20k variant is slow; the normal suite runs 2 x 200).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random

import httpx
import pytest

from sloctl.config import load_config
from sloctl.control.credits import ClassShare, CreditController, LeasedCredits, LeaseError
from sloctl.serving.local import LocalServer, server_options

TOKEN = "lease-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _book(**kwargs) -> LeasedCredits:
    ctl = CreditController(initial_credits=8, min_credits=4, max_credits=16,
                           classes=[ClassShare("high", 2), ClassShare("low", 1)])
    return LeasedCredits(ctl, default_ttl_s=1.0, max_ttl_s=10.0, **kwargs)


def test_only_the_lease_releases_its_credit_and_only_once():
    book = _book()
    mine = book.acquire("high", "me", 0.0)
    theirs = book.acquire("high", "them", 0.0)
    assert mine and theirs and mine.lease_id != theirs.lease_id and book.controller.in_flight == 2
    with pytest.raises(LeaseError) as other:
        book.release(theirs.lease_id, 0.1, holder="me")
    assert other.value.reason == "holder" and book.controller.in_flight == 2
    book.release(mine.lease_id, 0.1, holder="me")
    with pytest.raises(LeaseError) as twice:  # a second release cannot take another request's credit
        book.release(mine.lease_id, 0.2)
    assert twice.value.reason == "unknown" and book.controller.in_flight == 1 and book.outstanding == 1


def test_expired_leases_are_reclaimed_and_count_as_drops():
    book = _book()
    for _ in range(5):
        assert book.acquire("high", "leaky", 0.0, ttl_s=0.5)
    assert book.controller.in_flight == 5
    assert len(book.reclaim(0.6)) == 5
    assert book.controller.in_flight == 0 and book.outstanding == 0 and book.counts["expired"] == 5
    with pytest.raises(ValueError, match="ttl_s"):
        book.acquire("high", "x", 1.0, ttl_s=11.0)


def test_a_new_pool_leaves_old_leases_releasable_without_touching_it():
    book = _book()
    old = book.acquire("high", "a", 0.0)
    book.swap(CreditController(initial_credits=4, min_credits=4, max_credits=4))
    book.release(old.lease_id, 0.1)
    assert book.controller.in_flight == 0


def test_history_is_bounded():
    ctl = CreditController(initial_credits=8, history_limit=50)
    for i in range(20_000):
        ctl.tick(i * 0.001)
    assert len(ctl.history) == 50 and len(ctl.windows_) == 50
    assert ctl.history[-1][0] > 19.0  # the newest kept


def test_two_bursts_with_leaks_leave_the_pool_at_its_floor_or_above():
    """In process: 2 x 20k admits, a third never released; once their leases expire every credit is back."""
    rng = random.Random(0)
    book = _book()
    now = 0.0
    held = []
    for _ in range(2):
        for _ in range(20_000):
            now += 0.0005
            lease = book.acquire(rng.choice(["high", "low"]), "c", now, ttl_s=0.5)
            if lease is not None and rng.random() > 1 / 3:
                held.append(lease)
            while held and rng.random() < 0.7:
                book.release(held.pop(rng.randrange(len(held))).lease_id, now)
        for lease in held:
            book.release(lease.lease_id, now)
        held.clear()
        now += 1.0
        book.reclaim(now)
        assert book.outstanding == 0 and book.controller.in_flight == 0
        assert book.controller.credits >= book.controller.min_credits
    assert book.acquire("high", "after", now) is not None  # admits at once, no lock-out
    assert book.counts["expired"] > 100  # the leaked third came back by expiry


def _cfg(tmp_path, registry_uri: str):
    base = load_config()
    return dataclasses.replace(
        base, registry=dataclasses.replace(base.registry, tracking_uri=registry_uri),
        serve=dataclasses.replace(base.serve, state_db=str(tmp_path / "state.db"), watch_interval_s=0.2,
                                  lease_ttl_s=2.0, max_in_flight=64))


async def _burst(url: str, template: str, n: int, first_qid: int, seed: int, workers: int = 16) -> dict[str, int]:
    """About ``n`` requests, mixed: admit then release (a third of the leases leaked), route then complete."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    plan = [rng.random() for _ in range(round(n / 1.5))]  # a job is 1 or 2 requests, 1.5 on average
    qids = iter(range(first_qid, first_qid + n))

    def count(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    async def worker(client: httpx.AsyncClient, jobs: list[float]) -> None:
        post = client.post

        async def retried(path: str, **kwargs):  # a keep-alive connection closed under us: a new one, once
            try:
                return await post(path, **kwargs)
            except httpx.TransportError as exc:
                count(f"{path} {type(exc).__name__}")
                return await post(path, **kwargs)

        client = type("C", (), {"post": staticmethod(retried)})
        for u in jobs:
            if u < 0.5:
                r = await client.post("/v1/admit", json={"class": "high" if u < 0.3 else "low", "holder": "burst"},
                                      headers=AUTH)
                count(f"admit {r.status_code}")
                body = r.json() if r.status_code == 200 else {}
                if body.get("admitted") and u > 0.5 / 3:
                    r = await client.post("/v1/release", json={"lease_id": body["lease_id"], "holder": "burst"},
                                          headers=AUTH)
                    count(f"release {r.status_code}")
                else:
                    count("release skipped")
            else:
                qid = next(qids)
                r = await client.post("/v1/route", json={"query_id": qid, "template": template, "slo_s": 2.0},
                                      headers=AUTH)
                count(f"route {r.status_code}")
                if r.status_code == 200:
                    r = await client.post("/v1/complete", json={"query_id": qid, "latency_s": 0.01}, headers=AUTH)
                    count(f"complete {r.status_code}")

    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        await asyncio.gather(*(worker(client, plan[i::workers]) for i in range(workers)))
    return counts


def _two_bursts(tmp_path, sim_log, registry_uri: str, n: int) -> None:
    from sloctl.serving.runtime.app import create_app

    cfg = _cfg(tmp_path, registry_uri)
    templates = sim_log.drop_duplicates("template").reset_index(drop=True)
    template = str(templates["template"].iloc[0])
    with LocalServer(create_app(cfg, token=TOKEN, templates=templates), options=server_options(cfg.serve)) as client:
        url = str(client.base_url).rstrip("/")
        for burst in range(2):
            counts = asyncio.run(_burst(url, template, n, first_qid=burst * n, seed=burst))
            requests = sum(v for k, v in counts.items() if not k.endswith("skipped"))
            print(f"burst {burst + 1}: {requests} requests, {dict(sorted(counts.items()))}")
            # work that frees resources is never shed: a release is 200, or 404 when its lease expired first
            assert not any(k.startswith(("complete", "release")) and not k.endswith(("200", "skipped", "404"))
                           for k in counts), counts
        import time

        time.sleep(cfg.serve.lease_ttl_s + 0.5)  # the leaked leases expire; the watcher reclaims them
        ready = client.get("/readyz").json()["leases"]
        view = client.get("/v1/clusters").json()
        assert ready["outstanding"] == 0 and ready["in_flight"] == 0, ready
        assert ready["credits"] >= ready["floor"], ready
        assert ready["expired"] > 0  # the leaked ones came back by expiry
        assert all(not c["running"] for c in view["clusters"]), view["clusters"]
        after = client.post("/v1/admit", json={"class": "low"}, headers=AUTH).json()
        assert after["admitted"] is True


@pytest.mark.slow  # tens of seconds: make test-slow
def test_two_bursts_of_mixed_requests_leak_nothing(tmp_path, sim_log, empty_registry_uri):
    _two_bursts(tmp_path, sim_log, empty_registry_uri, 200)


@pytest.mark.slow
def test_two_bursts_of_20k_mixed_requests_leak_nothing(tmp_path, sim_log, empty_registry_uri):
    _two_bursts(tmp_path, sim_log, empty_registry_uri, 20_000)
