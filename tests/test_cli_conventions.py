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
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
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
    assert no_file_no_number <= {("warehouse", "templates")}, no_file_no_number
    assert_one_line_error(invoke("warehouse", "templates", "--benchmark", "tpcx"), 2, "tpcx")


@pytest.mark.parametrize("suffix,content", [(".csv", b"\x00\x01garbage,\n\xff"), (".sqlite", b"not a database"),
                                            (".parquet", b"PAR1 nope")])
def test_tune_policy_with_an_unreadable_history_names_it(suffix, content, tmp_path, tiny_log):
    """Before: a pandas/sqlite3 traceback (issue 19, item 11)."""
    history = tmp_path / f"history{suffix}"
    history.write_bytes(content)
    result = invoke("tune", "policy", "--history", history, "--log", tiny_log, "--no-register")
    assert_one_line_error(result, 2, "--history", str(history))
