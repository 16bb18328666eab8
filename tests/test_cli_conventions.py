"""Command-line conventions (issue 18): results on stdout, logs on stderr, ``--json``, ``--version``, whole help,
and one error shape — ``error: <message>`` on one line of stderr, exit 2 for user errors, never a traceback."""

from __future__ import annotations

import json
import socket
from importlib.metadata import version
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sloctl.cli import app


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def assert_one_line_error(result, code: int = 2, *needles: str) -> str:
    """The failure shape every command shares; returns the message."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert "\n" not in lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _commands(command, prefix=()):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*prefix, name))
    else:
        yield prefix, command


ALL_COMMANDS = [path for path, _ in _commands(typer.main.get_command(app))]


@pytest.fixture
def tiny_log(tmp_path, sim_log):
    from sloctl.datasets.querylog import write_log

    return write_log(sim_log, tmp_path / "tiny.parquet")


@pytest.fixture
def registry_config(tmp_path):
    """A config whose MLflow registry is an empty SQLite file in tmp_path."""
    path = tmp_path / "c.yaml"
    path.write_text(f"registry:\n  tracking_uri: sqlite:///{tmp_path / 'mlflow.db'}\n")
    return path


# --- --version and help ------------------------------------------------------------------------------------------

def test_version_is_the_installed_package_version():
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"sloctl {version('sloctl')}"


def test_help_is_whole_when_stdout_is_not_a_terminal(monkeypatch):
    """Before: rich wrapped help at 80 columns when piped and cut long words ("collect.scale_fact…")."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    result = invoke("collect", "--help")
    assert result.exit_code == 0
    assert "(config: collect.scale_factor)" in result.stdout
    assert "(warehouse.size_unit_cores, default 0.25 core)" in result.stdout
    for path in ALL_COMMANDS:
        result = invoke(*path, "--help")
        assert result.exit_code == 0, (path, result.output)
        assert "…" not in result.stdout, f"sloctl {' '.join(path)} --help cuts a word"


# --- one error shape ---------------------------------------------------------------------------------------------

def test_a_usage_error_is_one_line_on_stderr_and_exit_2(tmp_path):
    result = invoke("collect", "--sizes", "1,x", "--out", tmp_path / "q.parquet")
    assert_one_line_error(result, 2, "--sizes", "'1,x'")
    assert result.stdout == ""
    assert_one_line_error(invoke("no-such-command"), 2, "No such command")
    assert_one_line_error(invoke("collect"), 2, "--out")


def test_an_unknown_model_uri_is_one_line_and_exit_2(registry_config, tiny_log):
    """Before: an MlflowException traceback, exit 1 (predict first generated a TPC-H database)."""
    result = invoke("predict", "--template", "tpch-q01", "--size", "1", "--model", "models:/nope@champion",
                    "--config", registry_config)
    assert_one_line_error(result, 2, "--model models:/nope@champion", "not found")
    result = invoke("evaluate", "predictor", "--log", tiny_log, "--model", "models:/nope@champion",
                    "--config", registry_config)
    assert_one_line_error(result, 2, "--model models:/nope@champion")


def test_experiment_history_without_its_default_log_names_the_option(tmp_path, monkeypatch):
    """Before: FileNotFoundError traceback from run_table5 when reports/bench_latency_log.parquet is absent."""
    import sloctl.experiments.history as history

    monkeypatch.setattr(history, "DEFAULT_LOG", tmp_path / "reports" / "bench_latency_log.parquet")
    hourly = tmp_path / "hourly.parquet"
    hourly.write_bytes(b"")
    result = invoke("experiment", "history", "--hourly", hourly)
    assert_one_line_error(result, 2, "--log", "bench_latency_log.parquet")


def test_a_missing_database_driver_names_the_extra_to_install(tiny_log):
    """Before: optuna's ImportError traceback ("Failed to import DB access module")."""
    pytest.importorskip("sqlalchemy")
    try:
        import psycopg  # noqa: F401
        pytest.skip("psycopg is installed here")
    except ImportError:
        pass
    result = invoke("tune", "stage", "--log", tiny_log, "--trials", "1", "--storage", "postgresql://u@localhost/db")
    assert_one_line_error(result, 2, "psycopg", "sloctl[postgres]")


def test_serve_on_a_taken_port_exits_2_before_announcing(tmp_path, monkeypatch):
    """Before: "sloctl serve on http://..." was printed, then uvicorn failed to bind (exit 1)."""
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("serve", "--insecure", "--host", "127.0.0.1", "--port", port)
    assert_one_line_error(result, 2, f"--port {port}", "in use")
    assert "serve on" not in result.stderr
    assert not (tmp_path / "sloctl_state.db").exists()


def test_a_bug_is_one_line_exit_1_and_debug_shows_the_traceback():
    from sloctl._cli_errors import SloctlGroup

    toy = typer.Typer(cls=SloctlGroup)

    @toy.command()
    def boom() -> None:
        raise KeyError("oops")

    @toy.command()
    def other() -> None:
        pass

    result = CliRunner().invoke(toy, ["boom"])
    message = assert_one_line_error(result, 1, "internal error", "KeyError", "SLOCTL_DEBUG")
    assert "oops" in message
    result = CliRunner().invoke(toy, ["boom"], env={"SLOCTL_DEBUG": "1"})
    assert isinstance(result.exception, KeyError)


def test_bad_input_through_the_entry_point_has_no_traceback(run_sloctl, tmp_path):
    """The shell path (``sloctl.cli:main``) is the same as the in-process one."""
    out = run_sloctl("log", "summary", tmp_path / "missing.parquet")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: {tmp_path / 'missing.parquet'}: query log not found."]
    assert "Traceback" not in out.stderr and out.stdout == ""


def _json_stdout(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --- every command, with a missing or malformed input (issue 19) --------------------------------------------------

#: Path options a command writes to (never reads).
OUTPUT_PARAMS = {"out", "plot", "plots", "data_dir"}
#: Values for required options that are not files (valid enough to reach the file checks).
REQUIRED_VALUES = {"template": "tpch-q01", "size": "1", "service": "svc", "server": "http://127.0.0.1:9",
                   "listen_port": "10000", "upstream_port": "10001"}


def _base_type(annotation):
    import types
    import typing

    while True:
        origin = typing.get_origin(annotation)
        if origin in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        elif origin is list:
            annotation = typing.get_args(annotation)[0]
        else:
            return annotation


def _is_input_path(path: tuple, param) -> bool:
    if _base_type(param.type_descriptor.annotation) is not Path or param.name in OUTPUT_PARAMS:
        return False
    return not (path == ("sidecar", "sync") and param.name == "rds_file")  # sync writes its RDS file


def _args(path: tuple, command, files: dict, outdir: Path, skip: str = "") -> list[str]:
    """Arguments for ``command``: every input file from ``files`` (by parameter), required others filled in."""
    args: list[str] = []
    for param in command.params:
        if param.name == skip:
            continue
        if _is_input_path(path, param):
            value = files[param.name]
        elif not param.required:
            continue
        elif _base_type(param.type_descriptor.annotation) is Path:
            value = outdir / f"out-{param.name}"  # a required output
        else:
            value = REQUIRED_VALUES.get(param.name, "1")
        args += [str(value)] if param.param_type_name == "argument" else [param.opts[0], str(value)]
    return args


def _malformed(tmp_path: Path) -> dict:
    yaml_file = tmp_path / "malformed.yaml"
    yaml_file.write_text("services: [unclosed\n  - {a: \n")
    parquet = tmp_path / "malformed.parquet"
    parquet.write_bytes(b"PAR1 this is not parquet at all")
    json_file = tmp_path / "malformed.json"
    json_file.write_text("{not json")
    by_name = {"config": yaml_file, "network": yaml_file, "workload": yaml_file, "rds_file": json_file}
    return {name: by_name.get(name, parquet) for name in _ALL_PARAM_NAMES}


_ALL_PARAM_NAMES = {p.name for _, c in _commands(typer.main.get_command(app)) for p in c.params}


@pytest.mark.parametrize("kind", ["missing", "malformed"])
def test_every_command_with_a_missing_or_malformed_file_says_which_in_one_line(kind, tmp_path, monkeypatch):
    """Every input file of every command, missing or malformed: exit 2, no traceback, one line naming it."""
    monkeypatch.chdir(tmp_path)  # no mlflow.db, reports/ or state file lands in the checkout
    files = ({name: tmp_path / f"missing-{name}.parquet" for name in _ALL_PARAM_NAMES} if kind == "missing"
             else _malformed(tmp_path))
    walked = 0
    for path, command in _commands(typer.main.get_command(app)):
        inputs = [p for p in command.params if _is_input_path(path, p)]
        if not inputs:
            continue  # no file to get wrong: the bad-number walk covers it
        args = _args(path, command, files, tmp_path)
        result = invoke(*path, *args)
        names = [files[p.name].name for p in inputs] + [o for p in inputs for o in p.opts]
        line = assert_one_line_error(result, 2)
        assert any(name in line for name in names), f"sloctl {' '.join(path)} {' '.join(args)}: {line}"
        walked += 1
    assert walked >= 25


def test_every_number_option_refuses_a_word(tmp_path, monkeypatch):
    """``--rate abc`` and the like, on every command with a number: click's check, in the one error shape."""
    monkeypatch.chdir(tmp_path)
    files = {name: tmp_path / f"missing-{name}" for name in _ALL_PARAM_NAMES}
    commands_seen = set()
    for path, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            if _base_type(param.type_descriptor.annotation) not in (int, float) or param.param_type_name != "option":
                continue
            result = invoke(*path, param.opts[0], "abc", *_args(path, command, files, tmp_path, skip=param.name))
            assert_one_line_error(result, 2, param.opts[0])
            commands_seen.add(path)
            break  # one number per command: they all go through the same click check
    no_file_no_number = {path for path, command in _commands(typer.main.get_command(app))
                         if not any(_is_input_path(path, p) for p in command.params)} - commands_seen
    # commands whose only input is a name or a running gateway's address: their bad input is checked here
    talks_to_a_gateway = {("gateway", "backends", verb) for verb in ("list", "drain", "remove")}
    assert no_file_no_number <= {("warehouse", "templates"), *talks_to_a_gateway}, no_file_no_number
    assert_one_line_error(invoke("warehouse", "templates", "--benchmark", "tpcx"), 2, "tpcx")
    for path in sorted(talks_to_a_gateway):  # nothing listens there: one line naming --url
        args = [] if path[-1] == "list" else ["c1"]
        assert_one_line_error(invoke(*path, *args, "--url", "http://127.0.0.1:9"), 2, "--url")


@pytest.mark.parametrize("suffix,content", [(".csv", b"\x00\x01garbage,\n\xff"), (".sqlite", b"not a database"),
                                            (".parquet", b"PAR1 nope")])
def test_tune_policy_with_an_unreadable_history_names_it(suffix, content, tmp_path, tiny_log):
    """Before: a pandas/sqlite3 traceback (issue 19, item 11)."""
    history = tmp_path / f"history{suffix}"
    history.write_bytes(content)
    result = invoke("tune", "policy", "--history", history, "--log", tiny_log, "--no-register")
    assert_one_line_error(result, 2, "--history", str(history))


# --- results on stdout, --json ------------------------------------------------------------------------------------

#: Commands without --json: serve prints no result (it serves).
NO_JSON = {("serve",)}


def test_every_command_that_prints_a_result_takes_json():
    lacking = [path for path, command in _commands(typer.main.get_command(app))
               if path not in NO_JSON and not any("--json" in p.opts for p in command.params)]
    assert lacking == []


def test_json_goes_to_stdout_alone(tiny_log):
    config = json.loads(_stdout_of("config", "show", "--json"))
    assert config["registry"]["tracking_uri"] and "warehouse" in config
    rows = json.loads(_stdout_of("log", "summary", tiny_log, "--json"))
    assert rows and {"template", "cluster_size", "isolated_s", "slowdown"} <= set(rows[0])
    validated = json.loads(_stdout_of("log", "validate", tiny_log, "--json"))
    assert validated == {"file": str(tiny_log), "valid": True, "rows": rows_of(tiny_log)}
    names = [t["name"] for t in json.loads(_stdout_of("warehouse", "templates", "--json"))]
    assert len(names) == 22 and names[0] == "tpch-q01"


def rows_of(path) -> int:
    from sloctl.datasets.querylog import read_log

    return len(read_log(path))


def _stdout_of(*args) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_collect_prints_its_result_on_stdout_and_progress_on_stderr(tpch_db, tmp_path):
    """Before: the result line went to stderr and rich's progress bars to stdout; no --json."""
    out = tmp_path / "q.parquet"
    args = ["collect", "--sf", "0.01", "--sizes", "1", "--workload", "isolated", "--copies", "1",
            "--templates", "tpch-q06", "--data-dir", tpch_db.parent, "--out", out]
    result = invoke(*args, "--json")
    doc = _json_stdout(result)
    assert doc["out"] == str(out) and doc["rows"] == 1 and doc["status"] == {"ok": 1}
    assert "size1" in result.stderr or "1" in result.stderr  # the progress bar's label
    result = invoke(*args)
    assert result.exit_code == 0
    assert result.stdout.startswith(f"Wrote 1 rows to {out}")


def test_retry_sweep_prints_its_result_on_stdout():
    """Before: the sweep's points went only to stderr; without --json stdout was empty."""
    result = invoke("retry", "sweep", "-n", "tandem", "--rho", "0.5,1", "--no-simulate")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tandem: end-to-end rejection")
    assert sum("ρ 0.50" in line for line in lines) == 2 and sum("ρ 1.00" in line for line in lines) == 2
    doc = _json_stdout(invoke("retry", "sweep", "-n", "tandem", "--rho", "0.5", "--no-simulate", "--json"))
    assert len(doc["points"]) == 2


# --- --out: never over a file of another kind, modes kept --------------------------------------------------------

def test_out_refuses_a_file_of_another_kind_unless_force(tiny_log, tmp_path):
    """Before: `log merge --out notes.txt` silently replaced notes.txt with a Parquet log."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    result = invoke("log", "merge", tiny_log, tiny_log, "--out", notes)
    assert_one_line_error(result, 2, f"--out {notes}", "not a sloctl query log", "--force")
    assert notes.read_text() == "my notes\n"
    assert invoke("log", "merge", tiny_log, tiny_log, "--out", notes, "--force").exit_code == 0
    assert rows_of(notes) == 2 * rows_of(tiny_log)
    plain = tmp_path / "plain.parquet"  # Parquet, but not a query log
    import pandas as pd

    pd.DataFrame({"a": [1]}).to_parquet(plain)
    assert_one_line_error(invoke("import", "redset", tiny_log, "--out", plain), 2, "without sloctl's log metadata")


def test_rewriting_a_log_keeps_the_mode_of_the_file_it_replaces(tiny_log, tmp_path):
    merged = tmp_path / "merged.parquet"
    assert invoke("log", "merge", tiny_log, tiny_log, "--out", merged).exit_code == 0
    merged.chmod(0o640)
    assert invoke("log", "merge", tiny_log, tiny_log, "--out", merged).exit_code == 0  # its own kind: an update
    assert merged.stat().st_mode & 0o777 == 0o640


def test_out_at_a_folder_is_one_line(tiny_log, tmp_path):
    """Before: `--out DIR` ended in IsADirectoryError tracebacks (issue 19, item 11)."""
    folder = tmp_path / "folder"
    folder.mkdir()
    assert_one_line_error(invoke("log", "merge", tiny_log, tiny_log, "--out", folder), 2, "--out", "folder")
    assert_one_line_error(invoke("collect", "--out", folder, "--sizes", "1"), 2, "--out", "is a folder")
    rds = tmp_path / "routes.json"
    rds.write_text("{}")
    result = invoke("sidecar", "bootstrap", "--service", "s", "--listen-port", "10000", "--upstream-port", "10001",
                    "--rds-file", rds, "--out", folder)
    assert_one_line_error(result, 2, "--out", "is a folder")


def test_train_prints_its_table_on_stdout_and_json_only_with_json(tiny_log, tmp_path):
    """Before: `train` always printed JSON on stdout, the metrics table beside it; now one or the other."""
    result = invoke("train", "stage", "--log", tiny_log, "--no-register")
    assert result.exit_code == 0, result.output
    assert "Stage Q-error" in result.stdout and "stage: test Q-error p50" in result.stdout
    result = invoke("train", "stage", "--log", tiny_log, "--no-register", "--json")
    summary = _json_stdout(result)
    assert summary["model"] == "stage" and set(summary["test"]) == {"p50", "p90", "p95"}
    assert "Stage Q-error" in result.stderr


def test_train_out_refuses_a_file_before_training(tiny_log, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    result = invoke("train", "stage", "--log", tiny_log, "--no-register", "--out", notes)
    assert_one_line_error(result, 2, f"--out {notes}", "model bundle", "--force")
    assert notes.read_text() == "keep me" and "Q-error" not in result.output


@pytest.mark.slow  # a short collect on TPC-H SF 0.01 (about 5 s)
def test_demo_json_is_one_object_on_stdout(tpch_db, tmp_path, monkeypatch):
    """The narrated tour, machine-readable: tables and narration on stderr, one JSON object on stdout."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "demo.yaml"
    config.write_text("demo:\n  scale_factor: 0.01\n  sizes: [1]\n  concurrent_copies: 1\n"
                      "  concurrent_rate_per_s: 40.0\n")
    result = invoke("demo", "--config", config, "--data-dir", tpch_db.parent, "--no-train", "--json")
    doc = _json_stdout(result)
    assert {row["template"] for row in doc["summary"]} >= {"tpch-q01", "tpch-q06"}
    assert all(Path(path).is_file() for path in doc["files"])
    assert "Latency by template" in result.stderr
