"""``sloctl forecast ...``: backtest the Workload Forecaster's policies (AutoSLO §7.2)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

__all__ = ["forecast_app"]

forecast_app = typer.Typer(help="Day-ahead workload forecasts for the Policy Tuner.", no_args_is_help=True)

_POLICIES = "decay,prior_day,equal_7,seasonal_naive"


@forecast_app.callback()
def _forecast() -> None:
    """Day-ahead workload forecasts for the Policy Tuner (docs/policy_tuner.md)."""


def _parse_instances(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated instance ids like 0,19; got {text!r}",
                                 param_hint="--instances") from None
    if not ids:
        raise typer.BadParameter(f"expected at least one instance id; got {text!r}", param_hint="--instances")
    return ids


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _plot(hourly: Path, result: dict, path: Path, instance: int | None, test_days: int, decay_lambda: float,
          max_weeks: int | None) -> None:
    """Forecast vs actual for one scored instance (sloctl/plots.py)."""
    from sloctl.datasets.forecast import backtest_series
    from sloctl.plots import plot_forecast

    if instance is None:
        if not result["instances"]:
            raise typer.BadParameter("no instance was scored, so there is nothing to plot", param_hint="--plot")
        instance = result["instances"][0]
    elif instance not in result["instances"]:
        raise typer.BadParameter(f"instance {instance} was not scored (scored: "
                                 f"{', '.join(map(str, result['instances'])) or 'none'})", param_hint="--plot-instance")
    series = backtest_series(hourly, instance, tuple(result["policies"]), test_days, decay_lambda=decay_lambda,
                             max_weeks=max_weeks)
    written = plot_forecast(series["actual"], series["forecasts"], path, start=series["start"],
                            title=f"instance {instance}: day-ahead forecasts vs actual over the last {test_days} days")
    typer.echo(f"wrote {written}", err=True)


@forecast_app.command("evaluate")
def evaluate_cmd(
    hourly: Path = typer.Option(..., "--hourly", help="Hourly counts (Parquet/CSV: instance_id, timestamp, "
                                                      "query_count), e.g. the Redset serverless file."),
    instances: str | None = typer.Option(None, "--instances", help="Instance ids to score, e.g. 0,19 "
                                                                   "(default: every one with enough days)."),
    test_days: int = typer.Option(14, "--test-days", min=1, help="Days held out at the end of each instance."),
    policies: str = typer.Option(_POLICIES, "--policies", help="Comma-separated policies; decay may carry "
                                                               "its lambda (decay:0.8)."),
    decay_lambda: float = typer.Option(0.5, "--decay-lambda", help="Lambda of decay: week k weighs lambda^(k-1)."),
    max_weeks: int | None = typer.Option(None, "--max-weeks", min=1, help="Decay looks this many weeks back "
                                                                          "at most (default: all)."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write forecast vs actual, hour by hour over the "
                                     "test days, to this PNG (e.g. reports/forecast.png)."),
    plot_instance: int | None = typer.Option(None, "--plot-instance", help="The instance --plot shows "
                                             "(default: the first one scored)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Forecast each instance's last days from the days before; WAPE of the hourly counts per policy."""
    from sloctl.datasets.forecast import evaluate_forecasts

    started = time.perf_counter()
    result = evaluate_forecasts(hourly, _parse_instances(instances),
                                tuple(p.strip() for p in policies.split(",") if p.strip()), test_days,
                                decay_lambda=decay_lambda, max_weeks=max_weeks)
    result["wall_s"] = time.perf_counter() - started
    if plot is not None:
        _plot(hourly, result, plot, plot_instance, test_days, decay_lambda, max_weeks)
    if as_json:
        typer.echo(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Day-ahead forecasts: WAPE over the last {test_days} days "
                        f"({len(result['instances'])} instances, {len(result['skipped'])} skipped)",
                  caption=f"pooled: sum of errors / sum of actuals over all instances; "
                          f"{result['wall_s']:.2f} s")
    for column in ("policy", "median WAPE", "mean WAPE", "pooled WAPE"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, row in result["policies"].items():
        table.add_row(name, _fmt(row["median_wape"]), _fmt(row["mean_wape"]), _fmt(row["pooled_wape"]))
    Console().print(table)
