"""Admission middleware and the asyncio m_semaphore, in process and live on a loopback port."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sloctl.control.aqm import DelayBudget
from sloctl.control.credits import ClassShare, CreditController
from sloctl.serving.runtime.admission import AdmissionMiddleware, AsyncMSemaphore, MSemaphoreDropped


def _app(gate: asyncio.Event | None = None):
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/work")
    async def work():
        if gate is not None:
            await gate.wait()
        return {"ok": True}

    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    return app


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def test_bad_headers_get_422_problem_naming_the_header():
    async def run():
        async with _client(AdmissionMiddleware(_app())) as client:
            bad_class = await client.get("/work", headers={"x-priority": "urgent"})
            bad_budgets = [await client.get("/work", headers={"x-slo-budget-ms": raw})
                           for raw in ("-3", "inf", "1e400", "5e-324", "nan", "-Infinity", "abc")]
            fine = await client.get("/work", headers={"x-priority": "low", "x-slo-budget-ms": "200"})
        return bad_class, bad_budgets, fine

    bad_class, bad_budgets, fine = asyncio.run(run())
    assert bad_class.status_code == 422 and bad_class.json()["field"] == "x-priority"
    assert bad_class.headers["content-type"] == "application/problem+json"
    for bad in bad_budgets:
        assert bad.status_code == 422 and bad.json()["field"] == "x-slo-budget-ms", bad.text
        assert bad.json()["status"] == 422 and bad.json()["type"].startswith("urn:sloctl:problem:")
    assert fine.status_code == 200


def test_drop_is_a_503_with_retry_after_and_counted():
    async def run():
        gate = asyncio.Event()
        controller = CreditController(initial_credits=2, min_credits=2, max_credits=2,
                                      classes=[ClassShare("high", 2), ClassShare("low", 1)])
        middleware = AdmissionMiddleware(_app(gate), controller)
        async with _client(middleware) as client:
            held = [asyncio.create_task(client.get("/work", headers={"x-priority": "high"})) for _ in range(2)]
            await asyncio.sleep(0.05)
            refused = await client.get("/work", headers={"x-priority": "high"})
            health = await client.get("/healthz")
            gate.set()
            done = await asyncio.gather(*held)
        return middleware, refused, health, done

    middleware, refused, health, done = asyncio.run(run())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["reason"] == "no_credit"
    assert health.status_code == 200  # exempt paths are never controlled
    assert all(r.status_code == 200 for r in done)
    text = middleware.metrics_text().decode()
    assert 'sloctl_admission_decisions_total{decision="no_credit",klass="high"} 1.0' in text
    assert middleware.controller.in_flight == 0


def test_msemaphore_try_never_queues_and_hands_off_fifo():
    async def run():
        sem = AsyncMSemaphore(1)
        assert sem.try_acquire()
        assert not sem.try_acquire() and sem.queued == 0
        order = []

        async def waiter(name):
            await sem.acquire(DelayBudget(10.0))
            order.append(name)
            await asyncio.sleep(0)
            sem.release()

        tasks = [asyncio.create_task(waiter(n)) for n in "abc"]
        await asyncio.sleep(0.01)
        assert sem.queued == 3
        sem.release()
        await asyncio.gather(*tasks)
        assert sem.in_use == 0
        with pytest.raises(MSemaphoreDropped, match="exceeds the remaining budget"):
            sem.try_acquire()
            await sem.acquire(0.0)
        return order

    assert asyncio.run(run()) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="'capacity' parameter of AsyncMSemaphore"):
        AsyncMSemaphore(0)
