"""The gateway learns from what it serves: its log trains a model it then routes with, no restart (issue 22, part 4).

Also ``sloctl gateway`` itself: bad input is one line and exit 2; a real start serves the Trino client.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("trino")


def _run_all(port, templates, tags=("low",)):
    import trino

    cur = trino.dbapi.connect(host="127.0.0.1", port=port, user="u", client_tags=list(tags)).cursor()
    ids = []
    for t in templates:
        cur.execute(t.sql)
        cur.fetchall()
        ids.append(cur.query_id)
    return ids


@pytest.mark.slow
def test_a_model_trained_on_the_gateway_log_is_registered_and_hot_swapped_in(tpch_db, tpch_templates, tmp_path):
    from mlflow import MlflowClient

    from sloctl._cli_common import read_logs_with_metadata
    from sloctl.config import load_config
    from sloctl.datasets.querylog import read_metadata
    from sloctl.registry.store import register
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer
    from sloctl.training.pipeline import train_stage

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log_dir = tmp_path / "gateway-logs"
    options = GatewayOptions(cluster_sizes=(1, 1), log_dir=log_dir, tracking_uri=uri,
                             model_uri="models:/iconq@champion", fallback_uri="models:/stage@champion")
    cfg = load_config()
    with Gateway(tpch_db, options) as gateway, LocalServer(create_gateway_app(gateway)) as client:
        assert gateway.router_kind() == "round-robin" and gateway.model_source is None  # nothing registered yet
        _run_all(client.base_url.port, tpch_templates)
        path = gateway.flush_log()
        assert read_metadata(path)["benchmark"] == "tpch" and read_metadata(path)["scale_factor"] == "0.01"
        # what `sloctl train stage --log gateway-logs/` reads: the folder's logs
        log, metadata = read_logs_with_metadata([log_dir])
        assert len(log) == 22 and (log["status"] == "ok").all()
        first = register(train_stage(log, cfg.stage), log, name="stage", tracking_uri=uri, experiment="gw",
                         log_path=str(log_dir), log_metadata=metadata)
        assert first.champion  # the gate: no champion yet
        gateway.refresh()  # what the watcher does every watch_interval_s
        assert gateway.router_kind() == "stage"
        assert gateway.model_source == f"stage:models:/stage@champion v{first.version}"
        (qid,) = _run_all(client.base_url.port, tpch_templates[:1])
        attempt = gateway.get(qid).attempts[0]
        assert attempt["predicted_s"] is not None and attempt["predicted_s"] > 0  # placed by the new model
        # a second version moved under the alias is picked up too, by the same gateway and clusters
        second = register(train_stage(log, cfg.stage, seed=1), log, name="stage", tracking_uri=uri, experiment="gw",
                          log_path=str(log_dir), log_metadata=metadata)
        MlflowClient(tracking_uri=uri, registry_uri=uri).set_registered_model_alias("stage", "champion",
                                                                                    second.version)
        swaps = gateway.swaps
        gateway.refresh()
        assert gateway.model_source == f"stage:models:/stage@champion v{second.version}" and gateway.swaps == swaps + 1
        _run_all(client.base_url.port, tpch_templates[:1])
        assert gateway.counts["failed"] == 0


def test_sloctl_gateway_refuses_bad_input_with_one_line_and_exit_2(tpch_db, tmp_path):
    from typer.testing import CliRunner

    from sloctl.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["gateway", "--db", str(tpch_db), "--sizes", "1,x"])
    assert bad.exit_code == 2 and "--sizes" in bad.output and bad.output.strip().count("\n") == 0
    (tmp_path / "p.yaml").write_text("classes: {low: {queue_limit: -3}}\n")
    bad = runner.invoke(app, ["gateway", "--db", str(tpch_db), "--policy", str(tmp_path / "p.yaml")])
    assert bad.exit_code == 2 and "classes.low.queue_limit" in bad.output
    missing = runner.invoke(app, ["gateway", "--db", str(tmp_path / "none.duckdb")])
    assert missing.exit_code == 2 and "--db" in missing.output
    router = runner.invoke(app, ["gateway", "--db", str(tpch_db), "--router", "nearest"])
    assert router.exit_code == 2 and "least-queued" in router.output
    (tmp_path / "a.yaml").write_text("theta: 2\nwindow_seconds: 5\n")
    knobs = runner.invoke(app, ["gateway", "--db", str(tpch_db), "--autoscaler", str(tmp_path / "a.yaml")])
    assert knobs.exit_code == 2 and "window_seconds" in knobs.output


@pytest.mark.slow
def test_sloctl_gateway_serves_trino_clients_and_writes_its_log(tpch_db, tmp_path):
    import socket

    import trino

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "sloctl.cli", "gateway", "--db", str(tpch_db), "--port", str(port),
                             "--log-dir", str(tmp_path / "logs"), "--json"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        state = json.loads(proc.stdout.readline())
        assert state["url"] == f"http://127.0.0.1:{port}" and len(state["clusters"]) == 2
        deadline = time.monotonic() + 30
        while True:
            try:
                cur = trino.dbapi.connect(host="127.0.0.1", port=port, user="u").cursor()
                cur.execute("SELECT count(*) FROM nation")
                assert cur.fetchall() == [[25]]
                break
            except trino.exceptions.TrinoConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert list((tmp_path / "logs").glob("gateway-*.parquet"))  # the log was written on the way out
