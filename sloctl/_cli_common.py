"""Helpers shared by the ``sloctl`` command modules."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["ConfigOption", "cli_router", "load_cli_config", "parse_sizes", "echo"]

ConfigOption = typer.Option(None, "--config", "-c", help="YAML config (default: configs/default.yaml).")


def load_cli_config(path: Path | None):
    from sloctl.config import load_config

    return load_config(path)


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated whole numbers like 1,2; got {text!r}",
                                 param_hint="--sizes") from None
    if not sizes or any(s < 1 for s in sizes):
        raise typer.BadParameter(f"cluster sizes must be >= 1; got {text!r}", param_hint="--sizes")
    return sizes


def echo(message: str) -> None:
    typer.echo(message, err=True)




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
