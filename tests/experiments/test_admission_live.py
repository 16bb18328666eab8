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
    for run in result["runs"]:
        for counts in run["endpoints"].values():
            assert counts["sent"] == sum(counts[k] for k in ("ok", "refused", "client_dropped", "timed_out",
                                                             "errors"))


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
