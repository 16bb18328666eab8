"""The live admission harness (issue 21): bounded load, and the app's three real bottlenecks."""

from __future__ import annotations

import asyncio
import os

import pytest

from sloctl.experiments.admission_live import ENDPOINTS, live_experiment, open_loop


def test_the_load_stops_by_itself_within_its_bound_even_when_the_server_never_answers():
    async def main():
        async def hang(reader, writer):  # accept, read, never answer
            await reader.read(65536)
            await asyncio.sleep(3600)

        server = await asyncio.start_server(hang, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await open_loop(f"http://127.0.0.1:{port}", {"/cpu": 40.0, "/lock": 40.0}, duration_s=0.3,
                                   slo_s={"/cpu": 0.05, "/lock": 0.05}, seed=1, grace_s=0.4)
        finally:
            server.close()

    result = asyncio.run(main())
    assert result["elapsed_s"] <= 0.3 + 0.4 + 0.5  # arrivals stop, stragglers are cancelled at the grace
    for counts in result["endpoints"].values():
        assert counts["sent"] > 0 and counts["ok"] == 0
        assert counts["sent"] == counts["timed_out"] + counts["client_dropped"] + counts["errors"]
        assert counts["goodput_per_s"] == 0.0


@pytest.mark.slow
def test_a_tiny_live_run_of_every_control_ends_within_its_bound_and_accounts_for_every_request():
    result = live_experiment(duration_s=0.5, seeds=(0,), mem_mb=16, copies=1, calibration_requests=2,
                             bandwidth_s=0.1, grace_s=1.0)
    assert result["elapsed_s"] <= result["bound_s"]
    if len(os.sched_getaffinity(0)) >= 2:  # the server had cores of its own, away from the load generator
        resources = result["resources"]
        assert resources["server_cores"] and resources["client_cores"]
        assert not set(resources["server_cores"]) & set(resources["client_cores"])
    assert set(result["resources"]["bandwidth_bytes_per_s"]) == {"1", "2"}
    assert all(result["resources"]["isolated_s"][p] > 0 for p in ENDPOINTS)
    assert [r["control"] for r in result["runs"]] == ["none", "single-queue", "svalinn"]
    for run in result["runs"] + result["cpu_alone"]:
        for counts in run["endpoints"].values():
            assert counts["sent"] == sum(counts[k] for k in ("ok", "refused", "client_dropped", "timed_out",
                                                             "errors"))
        # the server's own clock saw every 200 the client got (and at most those the client gave up on besides)
        for path, counts in run["endpoints"].items():
            assert counts["ok"] <= run["server"][path]["ok"] <= counts["ok"] + counts["timed_out"] + counts["errors"]
    alone = result["cpu_alone"]
    assert [r["seed"] for r in alone] == [0] and set(alone[0]["endpoints"]) == {"/cpu"}  # no flood
    assert alone[0]["server"]["/mem"]["ok"] == alone[0]["server"]["/lock"]["ok"] == 0
    assert result["cpu_goodput_ratio"][0]["cpu_alone_p99_s"] == alone[0]["endpoints"]["/cpu"]["p99_s"]


def test_the_server_clock_times_answers_by_outcome_and_answers_stats_past_every_control():
    import httpx

    from sloctl.experiments.admission_live import ServerClock

    async def app(scope, receive, send):  # /cpu answers 200, /lock 503; anything else 404
        status = {"/cpu": 200, "/lock": 503}.get(scope["path"], 404)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    clock = ServerClock(app)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=clock), base_url="http://t") as client:
            for path in ("/cpu", "/cpu", "/lock", "/healthz"):
                await client.get(path)
            return (await client.get("/stats")).json()

    stats = asyncio.run(main())
    assert stats["/cpu"]["ok"] == 2 and stats["/cpu"]["other"] == 0 and stats["/cpu"]["p99_s"] >= 0
    assert stats["/lock"] == {"ok": 0, "other": 1, "p50_s": None, "p99_s": None}
    assert stats["/mem"]["ok"] == 0 and "/healthz" not in stats


def test_the_app_config_refuses_a_server_without_cores():
    from sloctl.experiments.admission_live import AppConfig

    with pytest.raises(ValueError, match="'server_cores'.*integer >= 1"):
        AppConfig.make("svalinn", server_cores=0)
    assert AppConfig.make("svalinn", server_cores=2)["server_cores"] == 2


def test_split_cores_gives_the_server_its_own_cores_and_the_load_generator_the_rest():
    from sloctl.experiments.admission_live import split_cores

    assert split_cores([0, 1]) == ((0,), (1,))
    assert split_cores({3, 1, 2, 0}) == ((0, 1), (2, 3))
    assert split_cores([5, 6, 7]) == ((5, 6), (7,))
    assert split_cores([0]) is None  # one core: nothing to split


def test_the_load_generator_runs_on_its_own_cores_and_gets_its_affinity_back_even_on_error(monkeypatch):
    import os

    from sloctl.experiments import admission_live

    before = os.sched_getaffinity(0)
    seen = {}

    def boom(**kwargs):
        seen["inside"] = os.sched_getaffinity(0)
        seen["server_cores"] = kwargs["server_cores"]
        raise RuntimeError("server failed")

    monkeypatch.setattr(admission_live, "measure_resources", boom)
    with pytest.raises(RuntimeError, match="server failed"):
        admission_live.live_experiment(duration_s=1.0, seeds=(0,))
    assert os.sched_getaffinity(0) == before
    split = admission_live.split_cores(before)
    assert seen["server_cores"] == (split[1] if split else None)
    assert seen["inside"] == (set(split[0]) if split else before)
    with pytest.raises(RuntimeError):
        admission_live.live_experiment(duration_s=1.0, seeds=(0,), split=False)
    assert seen["server_cores"] is None and seen["inside"] == before
