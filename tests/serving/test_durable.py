"""Durable state: a kill -9 mid-load cannot rewind reported cost nor the cluster set (issue 19, item 6).

The runtime runs in a subprocess (uvicorn, loopback), takes load and
operator changes to the pool, and is killed with SIGKILL right after it
reported its cost; a new process on the same state file must report at
least that cost and the cluster set in force before the crash.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

TOKEN = "durable-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

SERVER = textwrap.dedent("""
    import dataclasses, sys
    import uvicorn
    from sloctl.config import load_config
    from sloctl.serving.runtime.app import create_app
    from sloctl.serving.local import server_options

    registry, state, port, token = sys.argv[1:5]
    base = load_config()
    cfg = dataclasses.replace(base, registry=dataclasses.replace(base.registry, tracking_uri=registry),
                              router=dataclasses.replace(base.router, minimum_s=1.0),
                              serve=dataclasses.replace(base.serve, state_db=state, watch_interval_s=0.5))
    uvicorn.run(create_app(cfg, token=token), host="127.0.0.1", port=int(port), log_level="warning",
                **server_options(cfg.serve))
""")


def _start(tmp_path, port: int) -> subprocess.Popen:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(script), f"sqlite:///{tmp_path / 'mlflow.db'}",
                             str(tmp_path / "state.db"), str(port), TOKEN])
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the runtime did not start"
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_kill_9_mid_load_never_rewinds_cost_nor_the_cluster_set(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(tmp_path, port)
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.put("/v1/clusters/extra", json={"size": 3}, headers=AUTH).status_code == 200
            assert client.delete("/v1/clusters/c0", headers=AUTH).status_code == 200
            reported = []
            for qid in range(60):
                assert client.post("/v1/route", json={"query_id": qid, "template": "t", "slo_s": 5.0},
                                   headers=AUTH).status_code == 200
                if qid % 3:  # a third stays running through the crash
                    client.post("/v1/complete", json={"query_id": qid, "latency_s": 0.01}, headers=AUTH)
                if qid % 10 == 0:
                    reported.append(client.get("/v1/clusters").json()["total_cost"])
                time.sleep(0.02)
            view = client.get("/v1/clusters").json()
            reported.append(view["total_cost"])
            before = {(c["cluster_id"], c["size"]) for c in view["clusters"]}
            os.kill(proc.pid, signal.SIGKILL)  # right after the report: nothing gets a chance to flush
            proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert before == {("c1", 2), ("extra", 3)}
    assert reported == sorted(reported) and reported[-1] > 0
    proc = _start(tmp_path, port)
    try:
        view = httpx.get(f"{url}/v1/clusters", timeout=10).json()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    print(f"reported before the crash {reported[-1]:.3f}, after the restart {view['total_cost']:.3f}")
    assert view["total_cost"] >= reported[-1]
    assert {(c["cluster_id"], c["size"]) for c in view["clusters"]} == before
    assert view["reconciled"]["clusters"] == "state" and view["reconciled"]["restored"] == 20
