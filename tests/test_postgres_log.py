"""A real engine to develop against (issue 34, item 4): TPC-H on the embedded PostgreSQL, its csvlog imported."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from sloctl.cli import app

TEMPLATES = ["tpch-q01", "tpch-q03", "tpch-q06", "tpch-q14"]


@pytest.fixture(scope="module")
def postgres_bin():
    from sloctl.datasets.postgres_engine import PostgresUnavailable, postgres_bindir

    try:
        return postgres_bindir()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))


def _tiny_plan():
    from sloctl.experiments.postgres_log import WorkloadPlan

    return WorkloadPlan(isolated_copies=1, base_rate_per_s=20.0, base_copies=2, phased_copies=2, low_rate_per_s=5.0,
                        high_rate_per_s=40.0, low_count=3, high_count=3)


def test_engine_writes_one_csvlog_row_per_statement_with_start_end_and_timeout(postgres_bin, wait_until):
    import psycopg

    from sloctl.datasets.postgres_engine import PostgresEngine

    with PostgresEngine() as engine:
        with psycopg.connect(engine.url, autocommit=True, options="-c statement_timeout=50") as conn:
            conn.execute("SELECT 1").fetchall()
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(1)")
        assert engine.url.startswith("postgresql://postgres@127.0.0.1:")

        def logged() -> str | None:
            text = engine.csvlog_path.read_text()
            return text if ",57014," in text else None

        text = wait_until(logged, "the timeout's row in the csvlog")
        root = engine.root_
    assert '"statement: SELECT 1"' in text and "duration: " in text
    assert ",ERROR,57014," in text and "canceling statement due to statement timeout" in text
    assert "SHOW server_version" not in text  # the engine's own sessions stay out of the log
    assert not root.exists()  # a temporary root goes with stop()


def test_a_run_leaves_a_csvlog_that_imports_every_row_with_timeouts_censored(postgres_bin, tpch_db, tmp_path):
    """The whole chain but the training, on SF 0.01: a 1 ms statement_timeout makes censored rows."""
    from sloctl._cli_common import load_cli_config
    from sloctl.datasets.executions import import_executions
    from sloctl.experiments.postgres_log import postgres_log_experiment

    cfg = load_cli_config(None)
    kept = tmp_path / "postgres.csv"
    result = postgres_log_experiment(cfg.stage, cfg.iconq, scale_factor=0.01, clients=3, seed=1,
                                     statement_timeout_s=0.001, plan=_tiny_plan(), templates=TEMPLATES,
                                     data_dir=tpch_db.parent, keep_log=kept, grade=False)
    report = result.import_report
    sent = sum(run["queries"] for run in result.clients)
    assert sent == 4 * (1 + 2 + 2)
    assert report["read"] == report["imported"] + report["censored"] + report["refused"] == sent
    assert report["censored"] > 0 and report["refused"] == 0
    assert report["censored"] == sum(run["statuses"]["timeout"] for run in result.clients)
    again = import_executions([kept], format="postgres-csvlog", size=1)  # the kept log is a user's csvlog
    assert again.report.read == again.report.imported + again.report.censored + again.report.refused == sent
    log = again.log
    assert log["sql_hash"].nunique() == len(TEMPLATES)
    assert set(log["status"]) <= {"ok", "timeout", "error"} and (log["status"] == "timeout").any()
    timed_out = log[log["status"] == "timeout"]
    # none ends before it starts: it starts at its statement line, or at its duration line's start when
    # PostgreSQL logged the duration and then the timeout (csvlog times are whole milliseconds, so the two
    # can be equal)
    assert ((timed_out["end_s"] - timed_out["start_s"]) >= 0.0).all() and timed_out["start_s"].notna().all()
    assert json.loads(result.to_json())["kind"] == "postgres-log"


def test_the_command_refuses_bad_options_in_one_line(tmp_path):
    runner = CliRunner()
    for args, needle in ((["--sf", "0"], "--sf"), (["--clients", "0"], "--clients"),
                         (["--statement-timeout-s", "0"], "--statement-timeout-s")):
        result = runner.invoke(app, ["experiment", "postgres-log", *args])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and needle in lines[0], result.stderr
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    result = runner.invoke(app, ["experiment", "postgres-log", "--out-dir", str(a_file)])
    assert result.exit_code == 2 and "--out-dir" in result.stderr
    for args, needle in ((["--catalog", str(a_file)], "--catalog"), (["--from-log", str(tmp_path)], "--from-log")):
        result = runner.invoke(app, ["experiment", "postgres-log", *args])
        assert result.exit_code == 2 and needle in result.stderr, result.stderr


def _csvlog_line(when: float, session: int, message: str, query_id: int) -> str:
    """One row of PostgreSQL's csvlog, 26 columns (PostgreSQL manual, "Using CSV-Format Log Output")."""
    import datetime as dt

    stamp = (dt.datetime(2026, 1, 5, tzinfo=dt.UTC) + dt.timedelta(seconds=when)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    message = message.replace('"', '""')
    return (f'{stamp} UTC,"app","tpch",{1000 + session},"127.0.0.1:5000",6b00.{session:x},1,"SELECT",'
            f'2026-01-05 00:00:00 UTC,3/1,0,LOG,00000,"{message}",,,,,,,,,"app","client backend",,{query_id}\n')


def test_a_kept_csvlog_is_graded_from_the_cli_without_a_server(tmp_path):
    """--from-log: a csvlog in the documented layout (complete duration lines) graded like a run's own."""
    import numpy as np

    rng = np.random.default_rng(5)
    texts = ["SELECT count(*) FROM lineitem WHERE l_quantity > 10", "SELECT count(*) FROM orders",
             "SELECT o_orderpriority, count(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey GROUP BY 1"]
    cost = [0.3, 0.1, 1.0]
    lines, now, last_end = [], 0.0, 0.0
    for i in range(90):
        k = int(rng.integers(len(texts)))
        alone = i % 3 == 0                      # every third starts after all others ended, and runs alone
        took = cost[k] * (1 if alone else 2) * rng.uniform(0.9, 1.1)
        if alone:
            now = last_end + 0.05
        lines.append((now + took, i % 4, f"duration: {took * 1000:.3f} ms  statement: {texts[k]}", 100 + k))
        last_end = max(last_end, now + took)
        now = now + took + 0.05 if alone else now + 0.1
    lines.sort()
    csvlog = tmp_path / "postgresql.csv"
    csvlog.write_text("".join(_csvlog_line(*line) for line in lines))
    catalog = tmp_path / "catalog.csv"
    catalog.write_text("table,rows,bytes\nlineitem,60175,8000000\norders,15000,1700000\n")
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["experiment", "postgres-log", "--from-log", str(csvlog), "--catalog",
                                      str(catalog), "--out-dir", str(out), "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["import_report"]["read"] == doc["import_report"]["imported"] == 90
    assert doc["feature_source"] == "text+catalog" and doc["settings"]["csvlog"] == str(csvlog)
    assert doc["split"]["held_out_ok"] == 36 and set(doc["targets"]) == {"iconq_plus", "stage"}
    assert str(csvlog) in (out / "result.md").read_text()


def test_split_in_time_keeps_the_last_arrivals_out():
    import pandas as pd

    from sloctl.experiments.postgres_log import split_in_time

    log = pd.DataFrame({"query_id": range(10), "arrival_s": [9, 8, 7, 6, 5, 4, 3, 2, 1, 0.0]})
    train, held = split_in_time(log, 0.6)
    assert sorted(log["arrival_s"].iloc[train]) == [0, 1, 2, 3, 4, 5]
    assert log["arrival_s"].iloc[held].min() > log["arrival_s"].iloc[train].max()


@pytest.mark.slow
def test_postgres_log_experiment_grades_stage_and_iconq_plus_on_the_held_out_part(postgres_bin, tmp_path):
    """The whole experiment at its defaults (about 12 minutes on 2 cores): every model graded, figures finite."""
    from sloctl._cli_common import load_cli_config
    from sloctl.experiments.postgres_log import MODELS, postgres_log_experiment, write_report

    cfg = load_cli_config(None)
    result = postgres_log_experiment(cfg.stage, cfg.iconq, data_dir=cfg.warehouse.data_dir)
    assert set(result.table) == set(MODELS)
    for row in result.table.values():
        assert all(math.isfinite(row[k]) and row[k] >= 1 for k in ("p50", "p90", "p95"))
        assert row["n"] == result.split["held_out_ok"] > 100
    report = result.import_report
    assert report["read"] == report["imported"] + report["censored"] + report["refused"]
    assert result.feature_source == "text+catalog"
    assert "held-out" in result.graded_by
    json_path, md_path = write_report(result, tmp_path)
    assert json.loads(json_path.read_text())["table"]["iconq_plus"]["p90"] == result.table["iconq_plus"]["p90"]
    assert "| Iconq+ |" in md_path.read_text()


def test_grade_log_trains_stage_both_ways_and_grades_only_the_held_out_part(tmp_path):
    """grade_log on an imported canonical log (no server): Stage on every execution and on isolated runs."""
    import dataclasses

    import numpy as np
    import pandas as pd

    from sloctl._cli_common import load_cli_config
    from sloctl.datasets.executions import import_executions
    from sloctl.experiments.postgres_log import MODELS, grade_log

    rng = np.random.default_rng(3)
    texts = [f"SELECT count(*) FROM lineitem WHERE l_quantity > {k}" for k in range(3)]
    texts += ["SELECT o_orderpriority, count(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey GROUP BY 1"]
    base = np.array([0.2, 0.2, 0.2, 1.0])
    rows, now = [], 0.0
    for i in range(90):
        k = int(rng.integers(len(texts)))
        alone = i % 3 == 0                                     # every third query runs alone: Stage's rows
        latency = base[k] * (1.0 if alone else 2.0) * rng.uniform(0.9, 1.1)
        now += latency + 0.05 if alone else 0.1
        rows.append({"sql": texts[k], "start_s": now, "end_s": now + latency, "status": "ok"})
        if alone:
            now += latency + 0.05
    path = tmp_path / "log.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    log = import_executions(path, size=1).log
    cfg = load_cli_config(None)
    graded = grade_log(log, dataclasses.replace(cfg.stage, n_estimators=20),
                       dataclasses.replace(cfg.iconq, max_epochs=2), train_fraction=0.6)
    assert tuple(graded["table"]) == MODELS
    held = graded["split"]["held_out_ok"]
    assert held == len(log) - graded["split"]["train_rows"] == 36
    assert all(graded["table"][name]["n"] == held for name in MODELS)
    assert graded["split"]["train_isolated_ok"] < graded["split"]["train_ok"]
    # trained on every execution, Stage learns the slowdown the isolated-only one cannot see
    assert graded["table"]["stage"]["p50"] < graded["table"]["stage_isolated"]["p50"]
