"""One error shape for the whole command line, and help that is never cut.

Every ``sloctl`` command runs inside :class:`SloctlGroup.main`, so the same
rules hold whether it is started from a shell (``sloctl.cli:main``) or from
typer's ``CliRunner`` in a test:

* a user error (a bad option, a missing or malformed file, an unknown model,
  a port already taken, a database driver that is not installed) prints one
  line, ``error: <message>``, on stderr and exits 2;
* anything else is a bug: one line ``error: internal error ...`` and exit 1,
  still without a traceback (``SLOCTL_DEBUG=1`` shows the traceback instead);
* help is rendered at a fixed width when stdout is not a terminal (rich would
  otherwise wrap at 80 columns and cut long words with "…").
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer.core
from typer import _click as click  # the click that typer vendors: its exceptions are the ones raised

__all__ = ["HELP_WIDTH", "SloctlGroup", "UserError", "error_message", "exit_code_for"]

#: Columns help is rendered at when stdout is not a terminal (and neither COLUMNS nor TERMINAL_WIDTH is set).
HELP_WIDTH = 160

#: Database drivers an SQLAlchemy URL may need, and what installs them.
_DRIVERS = {
    "psycopg": ("postgresql://", "pip install 'sloctl[postgres]' (psycopg 3)"),
    "psycopg2": ("postgresql+psycopg2://", "pip install psycopg2-binary, or use a postgresql:// URL after "
                 "pip install 'sloctl[postgres]'"),
    "pymysql": ("mysql+pymysql://", "pip install 'sloctl[mysql]' (PyMySQL)"),
    "MySQLdb": ("mysql://", "pip install mysqlclient, or use a mysql+pymysql:// URL after pip install 'sloctl[mysql]'"),
}


class UserError(click.ClickException):
    """A refusal the command line reports as ``error: <message>`` and exit 2 (e.g. ``--out`` of another kind)."""

    exit_code = 2


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _missing_driver(exc: BaseException) -> str | None:
    for link in _chain(exc):
        name = getattr(link, "name", None) if isinstance(link, ImportError) else None
        if name and name.split(".")[0] in _DRIVERS:
            scheme, fix = _DRIVERS[name.split(".")[0]]
            return (f"the database driver {name.split('.')[0]!r} is not installed (a {scheme} storage or tracking "
                    f"URL needs it): {fix}")
    text = str(exc)
    if isinstance(exc, ImportError) and ("DB access module" in text or "storage URL" in text):
        return (f"the database driver for the storage URL is not installed ({_one_line(text)}); for postgresql:// "
                "pip install 'sloctl[postgres]', for mysql+pymysql:// pip install 'sloctl[mysql]'")
    return None


def _is_user_error(exc: BaseException) -> bool:
    """Bad input or a refusing environment, as opposed to a bug."""
    import sqlite3

    from sloctl.core.errors import SloctlError

    if isinstance(exc, SloctlError | ValueError | OSError | sqlite3.Error | ImportError):
        return True
    module = type(exc).__module__.split(".")[0]
    # MLflow (unknown model or version, bad URI), SQLAlchemy (bad URL), YAML (malformed file), Optuna (study)
    return module in ("mlflow", "sqlalchemy", "yaml", "optuna", "duckdb", "pyarrow", "pydantic")


def error_message(exc: BaseException) -> str:
    """The one line the command line prints for ``exc`` (without the ``error: `` prefix)."""
    driver = _missing_driver(exc)
    if driver:
        return driver
    if isinstance(exc, click.ClickException):
        return _one_line(exc.format_message())
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return _one_line(f"{exc.filename}: {exc.strerror}")
    text = _one_line(str(exc)) or type(exc).__name__
    if type(exc).__module__.split(".")[0] == "mlflow":
        text = _one_line(getattr(exc, "message", text))
    if not _is_user_error(exc):
        return f"internal error ({type(exc).__name__}: {text}); set SLOCTL_DEBUG=1 for the traceback"
    return text


def exit_code_for(exc: BaseException) -> int:
    """2 for user errors, 1 for bugs."""
    if isinstance(exc, click.ClickException):
        return 2
    return 2 if _is_user_error(exc) or _missing_driver(exc) else 1


def _help_width() -> None:
    """Render rich help at :data:`HELP_WIDTH` columns when stdout is not a terminal."""
    if os.environ.get("TERMINAL_WIDTH") or os.environ.get("COLUMNS"):
        return
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        import typer.rich_utils

        typer.rich_utils.MAX_WIDTH = HELP_WIDTH


class SloctlGroup(typer.core.TyperGroup):
    """The top-level ``sloctl`` group: runs a command and turns whatever it raises into one line and an exit code."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        _help_width()
        try:
            code = super().main(args=args, prog_name=prog_name or "sloctl", complete_var=complete_var,
                                standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # the help is already on stdout
            code = exc.exit_code
        except typer.Abort:
            click.echo("error: aborted", err=True)
            code = 130
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            code = 130
        except BrokenPipeError:  # `sloctl ... | head`
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - nothing more can be written
            code = 1
        except Exception as exc:
            if os.environ.get("SLOCTL_DEBUG"):
                raise
            click.echo(f"error: {error_message(exc)}", err=True)
            code = exit_code_for(exc)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)
