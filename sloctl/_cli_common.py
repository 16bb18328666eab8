"""Helpers shared by the ``sloctl`` command modules."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["ConfigOption", "load_cli_config", "parse_sizes", "echo", "router_margin"]

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




def router_margin(cfg, predictor, log) -> float:
    """The router's SLO margin: the configured one, else calibrated on ``log`` (and said so)."""
    if cfg.router.slo_margin is not None:
        return cfg.router.slo_margin
    from sloctl.training.calibration import calibrate_slo_margin

    calibration = calibrate_slo_margin(predictor, log, cfg.router.risk_quantile)
    echo(calibration.describe())
    return calibration.slo_margin
