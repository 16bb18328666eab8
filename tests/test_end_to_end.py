"""The user's path through every layer: a query log → ``sloctl train iconq`` → registry → ``sloctl serve`` → route."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import httpx
import pytest

pytestmark = pytest.mark.slow  # about 30 s: trains through the CLI, then starts `sloctl serve`

TOKEN = "end-to-end-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_log_trained_from_the_cli_is_served_and_routes_with_its_own_margin_and_templates(
        tmp_path, sim_log, run_sloctl, wait_until):
    sim_log.to_parquet(tmp_path / "log.parquet")
    port = _free_port()
    (tmp_path / "e2e.yaml").write_text(
        "iconq:\n  max_epochs: 2\n"
        f"serve:\n  port: {port}\n  watch_interval_s: 0.5\n  state_db: state.db\n")
    trained = run_sloctl("train", "iconq", "--log", "log.parquet", "--config", "e2e.yaml", "--json", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    assert summary["champion"] is True and 0 <= summary["slo_margin"] < 1

    # No --templates-log: the bundle carries the template table and the calibrated margin.
    server = subprocess.Popen([sys.executable, "-m", "sloctl.cli", "serve", "--config", "e2e.yaml"], cwd=tmp_path,
                              env={**os.environ, "SLOCTL_TOKEN": TOKEN}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def routes_with_iconq() -> bool:
            try:
                return httpx.get(f"{url}/readyz", timeout=2).json()["router"] == "iconq"
            except httpx.HTTPError:
                assert server.poll() is None, server.stderr.read()
                return False

        wait_until(routes_with_iconq, "the runtime to load the champion Iconq+", timeout_s=60)
        template = str(sim_log["template"].iloc[0])
        answer = httpx.post(f"{url}/v1/route", json={"query_id": 1, "template": template, "slo_s": 5.0},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["model"] == "iconq" and body["fallback"] is False
        assert body["predicted_latency_s"] > 0 and set(body["explanation"]) == {"c0", "c1"}
        unknown = httpx.post(f"{url}/v1/route", json={"query_id": 2, "template": "no-such", "slo_s": 5.0},
                             headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert unknown.status_code == 422 and "template" in unknown.text
    finally:
        server.terminate()
        server.wait(timeout=20)
