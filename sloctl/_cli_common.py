"""Helpers shared by the ``sloctl`` command modules."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sloctl.core.errors import QueryLogError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SEVERAL_LOGS_HELP", "Config", "ConfigOption", "ForceOption", "Json", "Seed", "at_least", "bind_port",
           "check_out", "cli_router",
           "describe_logs", "echo", "keep_mode", "load_cli_config", "load_cli_model", "log_files", "package_version",
           "parse_sizes", "positive", "read_logs", "read_logs_with_metadata", "within"]

#: The help text every ``--log`` option ends with.
SEVERAL_LOGS_HELP = ("Repeat --log for several logs, or name a folder (its *.parquet, sorted); "
                     "several are merged as `sloctl log merge` does.")

ConfigOption = typer.Option(None, "--config", "-c", help="YAML config (default: configs/default.yaml).")
ForceOption = typer.Option(False, "--force", help="Overwrite --out even when it is not a file of the kind this "
                           "command writes.")

# Options every command spells the same way (typer's Annotated form: `seed: Seed = 0`).
Seed = Annotated[int, typer.Option(help="Seed of every random draw (same seed, same result).")]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
Config = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config (default: configs/default.yaml).")]


def positive(**options: float | None) -> None:
    """Refuse any option not > 0 (``None`` is not given); keys are option names with ``_`` for ``-``."""
    for name, value in options.items():
        if value is not None and not value > 0:
            raise typer.BadParameter(f"must be > 0; got {value}", param_hint="--" + name.replace("_", "-"))


def at_least(minimum: int, **options: int | None) -> None:
    """Refuse any option below ``minimum`` (``None`` is not given)."""
    for name, value in options.items():
        if value is not None and value < minimum:
            raise typer.BadParameter(f"must be >= {minimum}; got {value}", param_hint="--" + name.replace("_", "-"))


def within(low: float, high: float, **options: float | None) -> None:
    """Refuse any option outside ``[low, high]`` (``None`` is not given)."""
    for name, value in options.items():
        if value is not None and not low <= value <= high:
            raise typer.BadParameter(f"must be in [{low:g}, {high:g}]; got {value}",
                                     param_hint="--" + name.replace("_", "-"))


#: What each kind of ``--out`` is called in messages.
_KINDS = {"log": "a sloctl query log", "bundle": "a model bundle (a folder with meta.json)",
          "admission-policy": "an admission-policy document", "envoy-bootstrap": "an Envoy bootstrap"}


def load_cli_config(path: Path | None):
    from sloctl.config import load_config

    return load_config(path)


def parse_sizes(text: str, option: str = "--sizes") -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated whole numbers like 1,2; got {text!r}",
                                 param_hint=option) from None
    if not sizes or any(s < 1 for s in sizes):
        raise typer.BadParameter(f"cluster sizes must be >= 1; got {text!r}", param_hint=option)
    return sizes


def echo(message: str) -> None:
    """Logs and progress: stderr (results go to stdout)."""
    typer.echo(message, err=True)


def load_cli_model(uri: str, cfg, option: str = "--model"):
    """The predictor ``uri`` names (a registry URI or a bundle folder); a bad URI is one line naming ``option``.

    Raises:
        UserError: the model, version or alias does not exist, or the folder
            is not a model bundle (exit 2, ``error: --model URI: why``).
    """
    from sloctl._cli_errors import UserError, error_message
    from sloctl.registry.store import load_model

    try:
        return load_model(uri, tracking_uri=cfg.registry.tracking_uri)
    except Exception as exc:
        if not (type(exc).__module__.startswith("mlflow") or isinstance(exc, OSError | ValueError)):
            raise
        raise UserError(f"{option} {uri}: {error_message(exc)} (in {cfg.registry.tracking_uri}; a registered "
                        "model is models:/NAME@ALIAS or models:/NAME/VERSION, a bundle is a folder with "
                        "meta.json)") from exc


def bind_port(host: str, port: int):
    """A listening TCP socket on ``host:port``, or one line saying why not (exit 2).

    ``sloctl serve`` binds before it says where it serves, so a port that is
    taken (or an address that is not this machine's) is reported as such
    instead of after a "serving on" line.
    """
    import socket

    from sloctl._cli_errors import UserError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UserError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror}); is another "
                        "`sloctl serve` running? choose another --port") from None
    sock.set_inheritable(True)
    return sock


def _why_not(path: Path, kind: str) -> str | None:
    """None when the existing ``path`` is of ``kind`` (so writing over it is an update), else why not."""
    import json

    if kind == "bundle":
        if not path.is_dir():
            return "it is a file"
        if (path / "meta.json").is_file() or not any(path.iterdir()):
            return None
        return "it is a folder without meta.json"
    if path.is_dir():
        return "it is a folder"
    if kind == "log":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            metadata = pq.read_schema(path).metadata or {}
        except (OSError, pa.ArrowException):
            return "it is not a Parquet file"
        return None if b"sloctl.schema_version" in metadata else "it is a Parquet file without sloctl's log metadata"
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return "it is not a JSON file"
    if kind == "admission-policy":
        return None if isinstance(doc, dict) and doc.get("kind") == "admission-policy" else "its JSON has another kind"
    if kind == "envoy-bootstrap":
        return None if isinstance(doc, dict) and "static_resources" in doc else "it is not an Envoy bootstrap"
    raise ValueError(f"The 'kind' parameter of check_out must be one of {', '.join(_KINDS)}, got {kind!r}.")


def check_out(out: Path, kind: str, force: bool, option: str = "--out") -> int | None:
    """Refuse to write ``out`` over something that is not of ``kind``, unless ``force``; before any work.

    Args:
        out: where the command will write.
        kind: ``log``, ``bundle``, ``admission-policy`` or ``envoy-bootstrap``.
        force: ``--force``: overwrite whatever is there (a file where a
            bundle folder goes is removed).

    Returns:
        The permission bits of the file being replaced (give them to
        :func:`keep_mode` after writing), or None.

    Raises:
        UserError: one line naming ``option``, the path and what it holds (exit 2).
    """
    import os
    import stat

    from sloctl._cli_errors import UserError

    out = Path(out)
    if not out.exists():
        return None
    mode = stat.S_IMODE(out.stat().st_mode) if out.is_file() else None
    why = _why_not(out, kind)
    if why is None:
        return mode
    if kind != "bundle" and out.is_dir():
        raise UserError(f"{option} {out}: is a folder; name the file to write ({_KINDS[kind]}).")
    if not force:
        raise UserError(f"{option} {out}: exists and is not {_KINDS[kind]} ({why}); refusing to overwrite it "
                        "(pass --force to replace it, or choose another path).")
    if kind == "bundle" and out.is_file():
        os.unlink(out)
        return None
    return mode


def keep_mode(out: Path, mode: int | None) -> None:
    """Give a rewritten ``out`` back the permission bits of the file it replaced (``check_out``'s answer)."""
    import os

    if mode is not None and Path(out).is_file():
        os.chmod(out, mode)


def package_version() -> str:
    """sloctl's version from the installed package's metadata (the source's ``__version__`` when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sloctl")
    except PackageNotFoundError:
        from sloctl import __version__

        return __version__




def cli_router(cfg, predictor, log):
    """The Iconq+ router ``sloctl serve`` would build for ``predictor`` and ``cfg``, with ``log`` as templates_log.

    :func:`~sloctl.registry.routers.build_router` decides the SLO margin
    (config, else the bundle's, else calibrated on ``log`` — an older bundle —
    and said so on stderr); the experiments route with its margin and cost
    tolerance.
    """
    from sloctl.datasets.querylog import template_table
    from sloctl.registry.routers import build_router

    return build_router(predictor, cfg.router, templates=template_table(log), log=log, say=echo)


def log_files(paths: Sequence[Path], option: str = "--log") -> list[Path]:
    """The query-log files ``paths`` name: each a file, or a folder standing for its ``*.parquet`` (sorted).

    A folder holding a gateway manifest (``gateway-manifest.json``, written
    by ``sloctl gateway --log-dir``) stands for the files it lists whose
    SHA-256 still matches; one line on stderr says what was read and what was
    skipped (not listed, checksum changed, missing), so a file copied in or
    edited after the gateway wrote it is never trained on.

    Raises:
        QueryLogError: one line naming ``option`` and the path, for no path,
            a path that does not exist, a folder without logs, an unreadable
            manifest, or a manifest folder none of whose files checks out.
    """
    if not paths:
        raise QueryLogError(f"{option}: name at least one query log (or a folder of them).")
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.glob("*.parquet") if p.is_file() and not p.name.startswith("."))
            found = _vouched_files(path, found, option)
            if not found:
                raise QueryLogError(f"{option} {path}: the folder holds no *.parquet query log.")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise QueryLogError(f"{option} {path}: query log not found (neither a file nor a folder).")
    return files


def _vouched_files(folder: Path, found: list[Path], option: str) -> list[Path]:
    """``found`` as the folder's gateway manifest vouches for it (all of ``found`` without a manifest)."""
    from sloctl.serving.gateway.log import MANIFEST_NAME, file_sha256, read_manifest

    try:
        listed = read_manifest(folder)
    except QueryLogError as exc:
        raise QueryLogError(f"{option} {folder}: {' '.join(str(exc).split())} Move it aside to read every "
                            "*.parquet, or name the files.") from exc
    if listed is None:
        return found
    hashes = {p.name: file_sha256(p) for p in found if p.name in listed}
    if any(listed[name]["sha256"] != digest for name, digest in hashes.items()):
        listed = read_manifest(folder) or {}  # a live gateway replaces its file, then the manifest: look again
        hashes = {p.name: file_sha256(p) for p in found if p.name in listed}
    read, skipped = [], []
    for p in found:
        if p.name not in listed:
            skipped.append(f"{p.name} (not listed)")
        elif listed[p.name]["sha256"] != hashes[p.name]:
            skipped.append(f"{p.name} (checksum changed since the gateway wrote it)")
        else:
            read.append(p)
    names = {p.name for p in found}
    skipped += [f"{name} (listed but missing)" for name in sorted(listed) if name not in names]
    echo(f"{option} {folder}: read the {len(read)} of {len(found)} *.parquet that its {MANIFEST_NAME} lists with "
         "their checksum" + (f"; skipped {', '.join(skipped)}" if skipped else ""))
    if not read:
        raise QueryLogError(f"{option} {folder}: no *.parquet in the folder matches its {MANIFEST_NAME} "
                            f"(skipped {', '.join(skipped) or 'none'}); name the files to read them anyway.")
    return read


def read_logs_with_metadata(paths: Sequence[Path], option: str = "--log") -> tuple[pd.DataFrame, dict[str, str]]:
    """Read the logs ``paths`` name (:func:`log_files`) as one log, with its metadata.

    One file is read as it is (:func:`~sloctl.datasets.querylog.read_log`);
    several are merged in memory, runs laid end to end, exactly as ``sloctl
    log merge`` would write them (:func:`~sloctl.datasets.merge.merge_logs`),
    so training on ``--log A --log B`` equals training on their merged file.

    Raises:
        QueryLogError: one line naming ``option`` (missing, unreadable or
            invalid logs, or logs of different plan-feature versions).
    """
    from sloctl.datasets.merge import merge_logs
    from sloctl.datasets.querylog import read_log, read_metadata

    files = log_files(paths, option)
    try:
        if len(files) == 1:
            return read_log(files[0]), read_metadata(files[0])
        frame, metadata = merge_logs(files)
    except QueryLogError as exc:
        raise QueryLogError(f"{option} {' '.join(str(exc).split())}") from exc
    echo(f"{option}: merged {len(files)} logs ({len(frame)} rows), their runs laid end to end.")
    return frame, metadata


def read_logs(paths: Sequence[Path], option: str = "--log") -> pd.DataFrame:
    """The one log that ``paths`` name (see :func:`read_logs_with_metadata`)."""
    return read_logs_with_metadata(paths, option)[0]


def describe_logs(paths: Sequence[Path]) -> str:
    """How messages and MLflow tags name the logs: the one path, or the paths joined by commas."""
    return ",".join(str(path) for path in paths)
