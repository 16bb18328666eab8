"""The ``sloctl`` command line.

Commands are grouped by job: ``warehouse`` (the embedded DuckDB warehouse),
``collect`` (run workloads, write query logs), ``import`` (bring outside logs
in), ``log`` (check and summarise logs), ``train`` / ``evaluate`` /
``predict`` / ``tune`` (latency models), ``config`` and ``demo``. Only typer
and rich load at start-up; everything heavy loads inside the command that
needs it, so ``sloctl --help`` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sloctl.errors import SloctlError

app = typer.Typer(
    name="sloctl",
    help="Learn how a service fleet behaves under load, then control it to meet latency SLOs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
warehouse_app = typer.Typer(help="The embedded DuckDB warehouse: generate TPC databases.",
                            no_args_is_help=True)
log_app = typer.Typer(help="Query logs: validate and summarise.", no_args_is_help=True)
import_app = typer.Typer(help="Import outside traces as query logs.", no_args_is_help=True)
config_app = typer.Typer(help="Configuration files.", no_args_is_help=True)
app.add_typer(warehouse_app, name="warehouse")
app.add_typer(log_app, name="log")
app.add_typer(import_app, name="import")
app.add_typer(config_app, name="config")
train_app = typer.Typer(help="Train latency models (Stage, Iconq+) from query logs; register them in MLflow.",
                        no_args_is_help=True)
evaluate_app = typer.Typer(help="Score models on query logs.", no_args_is_help=True)
tune_app = typer.Typer(help="Optuna studies of model hyper-parameters (resumable).", no_args_is_help=True)
app.add_typer(train_app, name="train")
app.add_typer(evaluate_app, name="evaluate")
app.add_typer(tune_app, name="tune")

ConfigOption = typer.Option(None, "--config", "-c", help="YAML config (default: configs/default.yaml).")


def _config(path: Path | None):
    from sloctl.config import load_config

    return load_config(path)


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated whole numbers like 1,2; got {text!r}",
                                 param_hint="--sizes") from None
    if not sizes or any(s < 1 for s in sizes):
        raise typer.BadParameter(f"cluster sizes must be >= 1; got {text!r}", param_hint="--sizes")
    return sizes


def _echo(message: str) -> None:
    typer.echo(message, err=True)


@warehouse_app.command("generate")
def warehouse_generate(
    benchmark: str = typer.Option("tpch", help="tpch or tpcds."),
    sf: float = typer.Option(0.1, "--sf", help="TPC scale factor."),
    data_dir: Path | None = typer.Option(None, help="Where databases live (config: warehouse.data_dir)."),
    config: Path | None = ConfigOption,
) -> None:
    """Generate a TPC database once (reused by later runs)."""
    from sloctl.datasets.tpc import ensure_database

    cfg = _config(config)
    path = ensure_database(benchmark, sf, data_dir or cfg.warehouse.data_dir, log=_echo)
    typer.echo(str(path))


@warehouse_app.command("templates")
def warehouse_templates(benchmark: str = typer.Option("tpch", help="tpch or tpcds.")) -> None:
    """List the benchmark's query templates."""
    from sloctl.datasets.tpc import load_templates

    for template in load_templates(benchmark):
        first = " ".join(template.sql.split())[:70]
        typer.echo(f"{template.name}\t{first}")


@app.command("collect")
def collect_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Query log to write (Parquet)."),
    benchmark: str | None = typer.Option(None, help="tpch or tpcds (config: collect.benchmark)."),
    sf: float | None = typer.Option(None, "--sf", help="Scale factor (config: collect.scale_factor)."),
    sizes: str | None = typer.Option(None, help="Cluster sizes, e.g. 1,2; each runs the workload in turn."),
    workload: str | None = typer.Option(None, help="base, phased, isolated or contour."),
    rate: float | None = typer.Option(None, help="Arrival rate λ per second (base)."),
    copies: int | None = typer.Option(None, help="Copies of every template."),
    seed: int | None = typer.Option(None, help="Seed of the workload."),
    templates: str | None = typer.Option(None, help="Only these templates, e.g. tpch-q01,tpch-q06."),
    timeout_s: float | None = typer.Option(None, help="Per-query timeout (config: warehouse.query_timeout_s)."),
    warmup_s: float | None = typer.Option(None, help="Warm-up added to each spin-up."),
    allow_oversubscribe: bool = typer.Option(False, help="Share cores when sizes exceed the machine."),
    data_dir: Path | None = typer.Option(None, help="Where databases live."),
    config: Path | None = ConfigOption,
) -> None:
    """Run a workload on DuckDB clusters of the given sizes and write the query log."""
    import dataclasses

    import numpy as np
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sloctl.datasets.collect import collect
    from sloctl.datasets.querylog import write_log
    from sloctl.datasets.tpc import ensure_database, load_templates
    from sloctl.datasets.workloads import build_workload

    cfg = _config(config)
    overrides = {k: v for k, v in {"kind": workload, "rate_per_s": rate, "copies": copies,
                                   "seed": seed}.items() if v is not None}
    wcfg = dataclasses.replace(cfg.workload, **overrides)
    if wcfg.kind not in ("base", "phased", "isolated", "contour"):
        raise typer.BadParameter(f"expected base, phased, isolated or contour; got {wcfg.kind!r}",
                                 param_hint="--workload")
    bench = benchmark or cfg.collect.benchmark
    scale = sf if sf is not None else cfg.collect.scale_factor
    size_list = _parse_sizes(sizes) if sizes else cfg.collect.sizes
    db = ensure_database(bench, scale, data_dir or cfg.warehouse.data_dir, log=_echo)
    chosen = load_templates(bench, templates.split(",") if templates else None)
    wl = build_workload(wcfg, chosen)
    _echo(f"Workload {wl.name}: {len(wl)} queries from {len(chosen)} templates "
          f"over {wl.duration_s:.1f} s, on sizes {list(size_list)}.")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=False, console=None) as progress:
        tasks = {}

        def on_progress(cluster_id: str, done: int, total: int) -> None:
            if cluster_id not in tasks:
                tasks[cluster_id] = progress.add_task(cluster_id, total=total)
            progress.update(tasks[cluster_id], completed=done)

        result = collect(
            db, wl, size_list,
            timeout_s=timeout_s if timeout_s is not None else cfg.warehouse.query_timeout_s,
            warmup_s=warmup_s if warmup_s is not None else cfg.warehouse.warmup_s,
            allow_oversubscribe=allow_oversubscribe or cfg.warehouse.allow_oversubscribe,
            on_progress=on_progress, log=progress.console.print)
    write_log(result.log, out, metadata={
        "benchmark": bench, "scale_factor": scale, "sizes": ",".join(map(str, size_list)),
        "workload": wl.name, "workload_params": wl.params,
        "time_compression": wl.time_compression})
    status = result.log["status"].value_counts().to_dict()
    lags = np.asarray(result.dispatch_lag_s) * 1000
    lag_text = (f"; dispatch lag p50 {np.percentile(lags, 50):.2f} ms, "
                f"p99 {np.percentile(lags, 99):.2f} ms") if len(lags) else ""
    _echo(f"Wrote {len(result.log)} rows to {out} (status {status}){lag_text}.")


@import_app.command("redset")
def import_redset_cmd(
    file: Path = typer.Argument(..., help="Redset Parquet or CSV file."),
    out: Path = typer.Option(..., "--out", "-o", help="Query log to write."),
    default_size: int = typer.Option(1, help="cluster_size for rows without one (serverless)."),
    instance: int | None = typer.Option(None, help="Only this instance_id."),
    limit: int | None = typer.Option(None, help="Only the first N arrivals."),
) -> None:
    """Map per-query Redset rows onto the query-log schema (see docs/querylog.md)."""
    from sloctl.datasets.querylog import write_log
    from sloctl.datasets.redset import import_redset

    log, skipped = import_redset(file, default_size=default_size, instance=instance, limit=limit)
    write_log(log, out, metadata={"source": f"redset:{file.name}"})
    _echo(f"Wrote {len(log)} rows to {out}; skipped {skipped} rows with missing times.")


@log_app.command("validate")
def log_validate(file: Path = typer.Argument(..., help="Query log (Parquet).")) -> None:
    """Check a log against the schema; exit 2 naming the first bad column/row."""
    from sloctl.datasets.querylog import read_log

    df = read_log(file)
    typer.echo(f"{file}: valid query log, {len(df)} rows.")


@log_app.command("summary")
def log_summary(file: Path = typer.Argument(..., help="Query log (Parquet).")) -> None:
    """Per-template isolated latency, latency under concurrency, and slowdown."""
    from sloctl.datasets.analysis import template_summary
    from sloctl.datasets.querylog import read_log

    _print_summary(template_summary(read_log(file)))


def _print_summary(summary) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Latency by template and cluster size (ok rows)",
                  caption="iso: median alone; n: runs with neighbours; med/p95: their latency; "
                          "slow: med/iso; nbrs: mean neighbours")
    for column in ("template", "size", "iso ms", "n", "med ms", "p95 ms", "slow", "nbrs"):
        table.add_column(column, justify="left" if column == "template" else "right")

    def ms(value: float) -> str:
        return "-" if value != value else f"{value * 1000:.1f}"

    for row in summary.itertuples():
        table.add_row(row.template, str(row.cluster_size), ms(row.isolated_s), str(row.n_concurrent),
                      ms(row.median_s), ms(row.p95_s),
                      "-" if row.slowdown != row.slowdown else f"{row.slowdown:.2f}x",
                      f"{row.mean_neighbours:.1f}")
    Console().print(table)


@config_app.command("show")
def config_show(config: Path | None = ConfigOption) -> None:
    """Print the effective configuration (defaults plus the file's changes)."""
    import dataclasses

    import yaml

    typer.echo(yaml.safe_dump(dataclasses.asdict(_config(config)), sort_keys=False))


@app.command("demo")
def demo_cmd(
    config: Path | None = ConfigOption,
    data_dir: Path | None = typer.Option(None, help="Where databases live."),
    train: bool = typer.Option(True, help="Train and register Stage and Iconq+ on the demo log."),
) -> None:
    """Collect a short TPC-H log on sizes 1 and 2, report interference, train and register the models."""
    from sloctl.demo import run_demo, train_demo_models

    cfg = _config(config)
    summary, paths = run_demo(cfg, data_dir=data_dir, log=_echo)
    _print_summary(summary)
    for size, group in summary.groupby("cluster_size"):
        slowdown = group["slowdown"].dropna()
        if len(slowdown):
            typer.echo(f"size {size}: median slowdown under concurrency {slowdown.median():.2f}x "
                       f"(max {slowdown.max():.2f}x) over {len(slowdown)} templates")
    for path in paths:
        typer.echo(f"wrote {path}")
    if train:
        rows = train_demo_models(cfg, paths[0], log=_echo)
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Latency models on held-out demo queries (Q-error)")
        for column in ("model", "version", "champion", "p50", "p90", "p95", "with neighbours p90"):
            table.add_column(column, justify="left" if column == "model" else "right")
        for row in rows:
            table.add_row(row["model"], row["version"], "yes" if row["champion"] else "no",
                          *(f"{row[f'test_{s}']:.3f}" for s in ("p50", "p90", "p95")),
                          f"{row['test_concurrent_p90']:.3f} (n={row['n_test_concurrent']:.0f})")
        Console().print(table)
        typer.echo(f"models registered in {cfg.registry.tracking_uri} "
                   "(try: sloctl evaluate predictor --log reports/demo_log.parquet --json)")


def _read_training_log(path: Path):
    from sloctl.datasets.querylog import read_log

    return read_log(path)


def _print_metrics(title: str, metrics: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("split", "n", "p50", "p90", "p95", "isolated p90", "concurrent p90"):
        table.add_column(column, justify="right")

    def fmt(key: str) -> str:
        value = metrics.get(key, float("nan"))
        return "-" if value != value else f"{value:.3f}"

    for split in ("train", "val", "test"):
        table.add_row(split, f"{metrics.get(f'{split}_n', 0):.0f}", fmt(f"{split}_q_error_p50"),
                      fmt(f"{split}_q_error_p90"), fmt(f"{split}_q_error_p95"),
                      fmt(f"{split}_isolated_q_error_p90"), fmt(f"{split}_concurrent_q_error_p90"))
    Console(stderr=True).print(table)


def _finish_training(result, log, name: str, log_path: Path, cfg, register: bool, out: Path | None) -> None:
    import json

    if out is not None:
        from sloctl.training.artifacts import save_predictor

        save_predictor(result.predictor, out)
        _echo(f"Saved the model bundle to {out}.")
    summary = {"model": name, "data_hash": result.data_hash,
               **{split: {stat: result.metrics[f"{split}_q_error_{stat}"] for stat in ("p50", "p90", "p95")}
                  for split in ("val", "test")}}
    if register:
        from sloctl.training.registry import register as register_model

        reg = register_model(result, log, name=name, tracking_uri=cfg.registry.tracking_uri,
                             experiment=cfg.registry.experiment, log_path=str(log_path))
        _echo(f"Registered {name} v{reg.version} (run {reg.run_id}); champion: {reg.champion} — {reg.reason}.")
        summary.update({"version": reg.version, "run_id": reg.run_id, "champion": reg.champion})
    typer.echo(json.dumps(summary))


@train_app.command("stage")
def train_stage_cmd(
    log: Path = typer.Option(..., "--log", "-l", help="Query log (Parquet)."),
    config: Path | None = ConfigOption,
    register: bool = typer.Option(True, help="Log the run and register the model in MLflow."),
    out: Path | None = typer.Option(None, help="Also save the model bundle to this folder."),
) -> None:
    """Train Stage (LightGBM, isolated executions) and register it as 'stage'."""
    from sloctl.training.pipeline import train_stage

    cfg = _config(config)
    frame = _read_training_log(log)
    result = train_stage(frame, cfg.stage, val_fraction=cfg.iconq.val_fraction,
                         test_fraction=cfg.iconq.test_fraction, seed=cfg.iconq.seed)
    _print_metrics(f"Stage Q-error on {log}", result.metrics)
    _finish_training(result, frame, "stage", log, cfg, register, out)


@train_app.command("iconq")
def train_iconq_cmd(
    log: Path = typer.Option(..., "--log", "-l", help="Query log (Parquet)."),
    variant: str | None = typer.Option(None, help="iconq, size, censored or iconq_plus (config: iconq.variant)."),
    max_epochs: int | None = typer.Option(None, help="Epoch limit (early stopping may end sooner)."),
    seed: int | None = typer.Option(None, help="Seed of the split, sampling and initialisation."),
    config: Path | None = ConfigOption,
    register: bool = typer.Option(True, help="Log the run and register the model in MLflow."),
    out: Path | None = typer.Option(None, help="Also save the model bundle to this folder."),
    progress: bool = typer.Option(False, help="Show Lightning's progress bar."),
) -> None:
    """Train an Iconq variant (with its own Stage) and register it as 'iconq'."""
    import dataclasses

    from sloctl.training.pipeline import train_iconq

    cfg = _config(config)
    overrides = {k: v for k, v in {"variant": variant, "max_epochs": max_epochs, "seed": seed}.items()
                 if v is not None}
    if "variant" in overrides and overrides["variant"] not in ("iconq", "size", "censored", "iconq_plus"):
        raise typer.BadParameter(f"expected iconq, size, censored or iconq_plus; got {variant!r}",
                                 param_hint="--variant")
    iconq_cfg = dataclasses.replace(cfg.iconq, **overrides)
    frame = _read_training_log(log)
    result = train_iconq(frame, cfg.stage, iconq_cfg, progress=progress,
                         on_epoch=None if progress else lambda e, v: _echo(f"epoch {e:3d}  val_loss {v:.4f}"))
    _print_metrics(f"Iconq ({iconq_cfg.variant}) Q-error on {log}", result.metrics)
    _finish_training(result, frame, "iconq", log, cfg, register, out)


@evaluate_app.command("predictor")
def evaluate_predictor_cmd(
    log: Path = typer.Option(..., "--log", "-l", help="Query log to score on (its ok rows)."),
    model: str = typer.Option("models:/iconq@champion", help="models:/NAME@ALIAS, models:/NAME/VERSION or a bundle."),
    as_json: bool = typer.Option(False, "--json", help="Print {n, q_error: {p50, p90, p95}} as JSON."),
    config: Path | None = ConfigOption,
) -> None:
    """Q-error of a Stage or Iconq model on a log, each query with its logged neighbours."""
    import json

    from sloctl.datasets.querylog import read_log, read_metadata
    from sloctl.training.artifacts import check_log_schema
    from sloctl.training.pipeline import evaluate_predictor
    from sloctl.training.registry import load_model

    cfg = _config(config)
    frame = read_log(log)
    predictor = load_model(model, tracking_uri=cfg.registry.tracking_uri)
    check_log_schema(predictor, read_metadata(log), str(log))
    result = evaluate_predictor(predictor, frame)
    if as_json:
        typer.echo(json.dumps({"n": result["n"], "q_error": result["q_error"],
                               "n_concurrent": result["n_concurrent"],
                               "q_error_concurrent": result["q_error_concurrent"]}))
    else:
        q = result["q_error"]
        typer.echo(f"{model} on {log}: n={result['n']}  Q-error p50 {q['p50']:.3f}  p90 {q['p90']:.3f}  "
                   f"p95 {q['p95']:.3f}  (with neighbours: n={result['n_concurrent']}, "
                   f"p90 {result['q_error_concurrent']['p90']:.3f})")


@app.command("predict")
def predict_cmd(
    template: str = typer.Option(..., help="The query's template, e.g. tpch-q05."),
    size: int = typer.Option(..., help="Cluster size it would run on."),
    neighbour: list[str] = typer.Option([], "--neighbour", "-n",
                                        help="TEMPLATE@OFFSET_S: a neighbour arriving OFFSET_S seconds after "
                                             "the query (negative: before, still running). Repeatable."),
    model: str = typer.Option("models:/iconq@champion", help="Model URI or bundle folder."),
    benchmark: str = typer.Option("tpch", help="tpch or tpcds (for plan features)."),
    sf: float = typer.Option(0.1, "--sf", help="Scale factor of the database the plans come from."),
    data_dir: Path | None = typer.Option(None, help="Where databases live."),
    as_json: bool = typer.Option(False, "--json"),
    config: Path | None = ConfigOption,
) -> None:
    """Predict one query's latency on a cluster size, given its neighbours."""
    import json

    from sloctl.datasets.tpc import template_frame
    from sloctl.training.registry import load_model

    cfg = _config(config)
    offsets = []
    for item in neighbour:
        name, sep, offset = item.rpartition("@")
        try:
            offsets.append((name, float(offset)))
        except ValueError:
            raise typer.BadParameter(f"expected TEMPLATE@OFFSET_S like tpch-q01@-0.5; got {item!r}",
                                     param_hint="--neighbour") from None
        if not sep or not name:
            raise typer.BadParameter(f"expected TEMPLATE@OFFSET_S; got {item!r}", param_hint="--neighbour")
    if size < 1:
        raise typer.BadParameter(f"must be >= 1; got {size}", param_hint="--size")
    frame = template_frame(benchmark, sf, data_dir or cfg.warehouse.data_dir, [(template, 0.0), *offsets], size)
    predictor = load_model(model, tracking_uri=cfg.registry.tracking_uri)
    seconds = predictor.predict(frame, neighbours="all")
    isolated = predictor.stage.predict(frame)
    result = {"template": template, "cluster_size": size, "latency_s": float(seconds[0]),
              "isolated_latency_s": float(isolated[0]), "n_neighbours": len(offsets), "model": model}
    if as_json:
        typer.echo(json.dumps(result))
    else:
        typer.echo(f"{template} on size {size} with {len(offsets)} neighbour(s): {seconds[0]:.4f} s "
                   f"(isolated estimate {isolated[0]:.4f} s)")


@tune_app.command("stage")
def tune_stage_cmd(
    log: Path = typer.Option(..., "--log", "-l", help="Query log (Parquet)."),
    trials: int = typer.Option(20, help="Trials to add in this run."),
    storage: str | None = typer.Option(None, help="Optuna storage (config: registry.optuna_storage)."),
    study_name: str = typer.Option("stage", help="Study name; an existing study is resumed."),
    seed: int = typer.Option(0, help="Sampler seed."),
    config: Path | None = ConfigOption,
) -> None:
    """Tune Stage's LightGBM settings on validation Q-error (isolated p90)."""
    _tune("stage", log, trials, storage, study_name, seed, 0, config)


@tune_app.command("iconq")
def tune_iconq_cmd(
    log: Path = typer.Option(..., "--log", "-l", help="Query log (Parquet)."),
    trials: int = typer.Option(10, help="Trials to add in this run."),
    storage: str | None = typer.Option(None, help="Optuna storage (config: registry.optuna_storage)."),
    study_name: str = typer.Option("iconq", help="Study name; an existing study is resumed."),
    seed: int = typer.Option(0, help="Sampler seed."),
    max_epochs: int = typer.Option(30, help="Epoch limit per trial."),
    config: Path | None = ConfigOption,
) -> None:
    """Tune Iconq+ (width, dropout, learning rate, batch) on validation Q-error p90."""
    _tune("iconq", log, trials, storage, study_name, seed, max_epochs, config)


def _tune(model: str, log: Path, trials: int, storage: str | None, study_name: str, seed: int,
          max_epochs: int, config: Path | None) -> None:
    import json

    from sloctl.training.tune import tune

    if trials < 1:
        raise typer.BadParameter(f"must be >= 1; got {trials}", param_hint="--trials")
    cfg = _config(config)
    frame = _read_training_log(log)

    def on_trial(number: int, value, state: str) -> None:
        shown = "-" if value is None else f"{value:.4f}"
        _echo(f"trial {number:3d}  {state:<8} {shown}")

    result = tune(model, frame, cfg, trials=trials, storage=storage or cfg.registry.optuna_storage,
                  study_name=study_name, seed=seed, max_epochs=max_epochs, on_trial=on_trial)
    typer.echo(json.dumps({"study": result.study_name, "n_trials": result.n_trials, "n_new": result.n_new,
                           "best_value": result.best_value, "best_params": result.best_params,
                           "mlflow_run_id": result.mlflow_run_id}))


def main() -> None:
    """Entry point: run the CLI; bad input exits 2 with one clear line.

    Set ``SLOCTL_DEBUG=1`` to see the full traceback instead.
    """
    import os

    try:
        app()
    except (SloctlError, ValueError) as exc:
        if os.environ.get("SLOCTL_DEBUG"):
            raise
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
