"""``sloctl train | evaluate | predict | tune``: the latency-model commands."""

from __future__ import annotations

from pathlib import Path

import typer

from sloctl._cli_common import (
    SEVERAL_LOGS_HELP,
    ConfigOption,
    ForceOption,
    describe_logs,
    echo,
    load_cli_config,
    read_logs_with_metadata,
)
from sloctl.core.kinds import ModelKind

__all__ = ["evaluate_app", "predict_cmd", "train_app", "tune_app"]

train_app = typer.Typer(help="Train latency models (Stage, Iconq+) from query logs; register them in MLflow.",
                        no_args_is_help=True)
evaluate_app = typer.Typer(help="Score models on query logs.", no_args_is_help=True)
tune_app = typer.Typer(help="Optuna studies of model hyper-parameters (resumable).", no_args_is_help=True)


JsonOption = typer.Option(False, "--json", help="Print the result as JSON on stdout (the metrics table then goes to "
                          "stderr).")


def _print_metrics(title: str, metrics: dict[str, float], *, err: bool = True) -> None:
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
    Console(stderr=err).print(table)


def _finish_training(result, log, name: str, log_path: str, cfg, register: bool, out: Path | None,
                     metadata: dict[str, str] | None = None, *, as_json: bool = True) -> None:
    import json

    from sloctl.registry.provenance import log_provenance

    calibration = result.predictor.calibration
    if calibration is not None:
        echo(f"{calibration.describe()}; stored with the model")
    provenance = log_provenance(log, metadata, logs=log_path)
    echo(f"Trained on {provenance.describe()}.")
    if out is not None:
        from sloctl.registry.bundles import save_predictor

        save_predictor(result.predictor, out, provenance=provenance)
        echo(f"Saved the model bundle to {out}.")
    summary = {"model": name, "data_hash": result.data_hash,
               **{split: {stat: result.metrics[f"{split}_q_error_{stat}"] for stat in ("p50", "p90", "p95")}
                  for split in ("val", "test")},
               "slo_margin": result.predictor.slo_margin}
    if register:
        from sloctl.registry.store import register as register_model

        reg = register_model(result, log, name=name, tracking_uri=cfg.registry.tracking_uri,
                             experiment=cfg.registry.experiment, log_path=log_path, log_metadata=metadata)
        echo(f"Registered {name} v{reg.version} (run {reg.run_id}); champion: {reg.champion} — {reg.reason}.")
        summary.update({"version": reg.version, "run_id": reg.run_id, "champion": reg.champion})
    if as_json:
        typer.echo(json.dumps(summary))
        return
    test = summary["test"]
    registered = (f"; registered {name} v{summary['version']}{' (champion)' if summary['champion'] else ''}"
                  if register else "")
    typer.echo(f"{name}: test Q-error p50 {test['p50']:.3f} p90 {test['p90']:.3f} p95 {test['p95']:.3f}, "
               f"SLO margin {summary['slo_margin']:.3f}, data {summary['data_hash']}{registered}")


FeaturesOption = typer.Option(
    None, "--features", help="Learn from these feature groups only, joined by '+': plan, text, catalog (default: "
    "every group the log has). 'text+catalog' makes a model that predicts for any SQL text (/v1/predict 'sql').")
CatalogOption = typer.Option(
    None, "--catalog", help="Table statistics the model keeps to featurize new SQL text: a table,rows[,bytes] CSV "
    "or the warehouse's .duckdb file (default: the catalog the log's metadata records).")
DialectOption = typer.Option(
    None, "--dialect", help="sqlglot dialect of new SQL text (default: the log's, else duckdb).")


def _sql_setup(frame, metadata: dict, features: str | None, catalog: Path | None, dialect: str | None):
    """The log the model learns from (``--features``: other groups unknown) and how it reads new SQL text."""
    from sloctl.datasets.sql_features import _check_dialect, catalog_from_metadata, load_catalog
    from sloctl.models.predictor import FEATURE_GROUPS, SqlSpec, mask_features

    learned = frame
    if features is not None:
        groups = tuple(g.strip() for g in features.replace(",", "+").split("+") if g.strip())
        wrong = [g for g in groups if g not in FEATURE_GROUPS]
        if wrong or not groups:
            raise typer.BadParameter(f"expected feature groups joined by '+' among {', '.join(FEATURE_GROUPS)}; "
                                     f"got {features!r}", param_hint="--features")
        learned = mask_features(frame, groups)
    dialect = dialect or metadata.get("dialect") or "duckdb"
    try:
        _check_dialect(dialect)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).replace("The 'dialect' parameter", "the dialect"),
                                 param_hint="--dialect") from None
    spec = SqlSpec(dialect, load_catalog(catalog) if catalog is not None else catalog_from_metadata(metadata))
    return learned, spec


def _check_name(name: str) -> None:
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name):
        raise typer.BadParameter(f"expected a registered model name of letters, digits, '_', '.' and '-' "
                                 f"(MLflow refuses '/' and ':'); got {name!r}", param_hint="--name")


@train_app.command("stage")
def train_stage_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help=f"Query log (Parquet). {SEVERAL_LOGS_HELP}"),
    train_on: str | None = typer.Option(None, help="isolated (executions that ran alone; AutoSLO) or all (every "
                                        "ok execution, for logs with few isolated runs); config: stage.train_on."),
    config: Path | None = ConfigOption,
    register: bool = typer.Option(True, help="Log the run and register the model in MLflow."),
    out: Path | None = typer.Option(None, help="Also save the model bundle to this folder."),
    name: str = typer.Option("stage", help="Registered model name (e.g. stage-sf1 for a model of another scale "
                             "factor than the 'stage' champion's)."),
    features: str | None = FeaturesOption,
    catalog: Path | None = CatalogOption,
    dialect: str | None = DialectOption,
    force: bool = ForceOption,
    as_json: bool = JsonOption,
) -> None:
    """Train Stage (LightGBM, isolated executions) and register it as 'stage'."""
    import dataclasses

    from sloctl._cli_common import check_out
    from sloctl.training.pipeline import train_stage

    if train_on is not None and train_on not in ("isolated", "all"):
        raise typer.BadParameter(f"expected isolated or all; got {train_on!r}", param_hint="--train-on")

    if out is not None:
        check_out(out, "bundle", force)  # before the training: never over a file or folder of another kind

    _check_name(name)
    cfg = load_cli_config(config)
    if train_on is not None:
        cfg = dataclasses.replace(cfg, stage=dataclasses.replace(cfg.stage, train_on=train_on))
    frame, metadata = read_logs_with_metadata(log)
    learned, sql = _sql_setup(frame, metadata, features, catalog, dialect)
    result = train_stage(learned, cfg.stage, val_fraction=cfg.iconq.val_fraction,
                         test_fraction=cfg.iconq.test_fraction, seed=cfg.iconq.seed,
                         risk_quantile=cfg.router.risk_quantile)
    result.predictor.sql = sql
    _print_metrics(f"Stage Q-error on {describe_logs(log)}", result.metrics, err=as_json)
    _finish_training(result, frame, name, describe_logs(log), cfg, register, out, metadata, as_json=as_json)


@train_app.command("iconq")
def train_iconq_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help=f"Query log (Parquet). {SEVERAL_LOGS_HELP}"),
    variant: str | None = typer.Option(None, help="iconq, size, censored or iconq_plus (config: iconq.variant)."),
    max_epochs: int | None = typer.Option(None, help="Epoch limit (early stopping may end sooner)."),
    seed: int | None = typer.Option(None, help="Seed of the split, sampling and initialisation."),
    config: Path | None = ConfigOption,
    register: bool = typer.Option(True, help="Log the run and register the model in MLflow."),
    out: Path | None = typer.Option(None, help="Also save the model bundle to this folder."),
    progress: bool = typer.Option(True, help="Show each epoch's progress on stderr (samples/s, ETA): a bar on a "
                                  "terminal, a line every 10 s otherwise (SLOCTL_PROGRESS=bar|lines|off)."),
    max_train_s: float | None = typer.Option(None, "--max-train-s", help="Wall-clock budget in seconds: training "
                                             "ends with the best checkpoint so far (config: iconq.max_train_s)."),
    accelerator: str | None = typer.Option(None, "--accelerator", help="cpu, gpu or auto (Lightning; config: "
                                           "iconq.accelerator)."),
    devices: int | None = typer.Option(None, "--devices", help="Data-parallel training processes (Lightning DDP, "
                                       "spawned; on CPUs each takes its share of the cores; config: iconq.devices)."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Train under Ray Train instead, --devices "
                                           "workers: 'local' starts Ray on this machine; else the cluster's address "
                                           "(ray://head:10001, auto). Needs the ray extra (config: "
                                           "iconq.ray_address)."),
    name: str = typer.Option("iconq", help="Registered model name (e.g. iconq-sf1 for a model of another scale "
                             "factor than the 'iconq' champion's)."),
    features: str | None = FeaturesOption,
    catalog: Path | None = CatalogOption,
    dialect: str | None = DialectOption,
    force: bool = ForceOption,
    as_json: bool = JsonOption,
) -> None:
    """Train an Iconq variant (with its own Stage) and register it as 'iconq'."""
    import dataclasses

    from sloctl._cli_common import check_out

    if out is not None:
        check_out(out, "bundle", force)  # before the training: never over a file or folder of another kind

    _check_name(name)
    cfg = load_cli_config(config)
    if max_train_s is not None and not max_train_s > 0:
        raise typer.BadParameter(f"must be > 0 seconds; got {max_train_s}", param_hint="--max-train-s")
    if accelerator is not None and accelerator not in ("cpu", "gpu", "auto"):
        raise typer.BadParameter(f"expected cpu, gpu or auto; got {accelerator!r}", param_hint="--accelerator")
    if devices is not None and devices < 1:
        raise typer.BadParameter(f"must be >= 1; got {devices}", param_hint="--devices")
    _check_ray_address(ray_address)
    overrides = {k: v for k, v in {"variant": variant, "max_epochs": max_epochs, "seed": seed,
                                   "max_train_s": max_train_s, "accelerator": accelerator,
                                   "devices": devices, "ray_address": ray_address}.items() if v is not None}
    if "variant" in overrides and overrides["variant"] not in ("iconq", "size", "censored", "iconq_plus"):
        raise typer.BadParameter(f"expected iconq, size, censored or iconq_plus; got {variant!r}",
                                 param_hint="--variant")
    iconq_cfg = dataclasses.replace(cfg.iconq, **overrides)
    frame, metadata = read_logs_with_metadata(log)
    learned, sql = _sql_setup(frame, metadata, features, catalog, dialect)
    result = _train_iconq_with_progress(learned, cfg, iconq_cfg, progress)
    result.predictor.sql = sql
    _print_metrics(f"Iconq ({iconq_cfg.variant}) Q-error on {describe_logs(log)}", result.metrics, err=as_json)
    _finish_training(result, frame, name, describe_logs(log), cfg, register, out, metadata, as_json=as_json)


def _check_ray_address(address: str | None) -> None:
    """Refuse an empty ``--ray-address``, or any when Ray is not installed, before the log is read."""
    if address is None:
        return
    if not address.strip() or any(c.isspace() for c in address):
        raise typer.BadParameter(f"expected local, auto or a Ray cluster's address (ray://head:10001); "
                                 f"got {address!r}", param_hint="--ray-address")
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise typer.BadParameter("Ray is not installed: pip install 'sloctl[ray]'", param_hint="--ray-address")


def _train_iconq_with_progress(frame, cfg, iconq_cfg, progress: bool):
    """``train_iconq`` with each epoch's progress on stderr (a bar or lines, samples/s and ETA) and its val_loss."""
    from sloctl.core.progress import format_duration
    from sloctl.core.progress import progress as open_progress
    from sloctl.training.pipeline import learn_iconq

    mode = "off" if not progress else None
    with open_progress("train iconq", total=None, mode=mode, heartbeat=False) as bar:
        def on_batch(epoch: int, done: int, total: int, rate: float) -> None:
            if done == 0:  # a new epoch: its own bar, elapsed time and ETA
                bar.restart(total=total, description=f"train iconq: epoch {epoch + 1}/{iconq_cfg.max_epochs}")
            else:
                bar.update(done, note=f"{rate:,.0f} samples/s")

        def on_epoch(epoch: int, val_loss: float) -> None:
            bar.log(f"epoch {epoch:3d}  val_loss {val_loss:.4f}")

        def on_point(point) -> None:
            bar.log(f"learning curve: {point.rows:,} rows -> validation p90 {point.val_q_error_p90:.3f} "
                    f"({point.epochs} epochs, {format_duration(point.wall_s)}, stopped by {point.stopped_by})")

        result = learn_iconq(frame, cfg.stage, iconq_cfg, on_epoch=on_epoch, on_batch=on_batch, on_point=on_point,
                             risk_quantile=cfg.router.risk_quantile)
    if "iconq_curve_stop" in result.params:
        echo(f"learned from {result.params['iconq_learned_rows']:,} rows: {result.params['iconq_curve_stop']}")
    return result


@evaluate_app.command("predictor")
def evaluate_predictor_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l",
                                   help=f"Query log to score on (its ok rows). {SEVERAL_LOGS_HELP}"),
    model: str = typer.Option("models:/iconq@champion", help="models:/NAME@ALIAS, models:/NAME/VERSION or a bundle."),
    as_json: bool = typer.Option(False, "--json", help="Print {n, q_error: {p50, p90, p95}} as JSON."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write predicted vs actual latency (log-log, one "
                                     "point per ok query) to this PNG (e.g. reports/evaluate.png)."),
    config: Path | None = ConfigOption,
) -> None:
    """Q-error of a Stage or Iconq model on a log, each query with its logged neighbours."""
    import json

    from sloctl._cli_common import load_cli_model
    from sloctl.registry.bundles import check_log_schema
    from sloctl.registry.provenance import row_sources
    from sloctl.training.pipeline import evaluate_predictor

    cfg = load_cli_config(config)
    frame, metadata = read_logs_with_metadata(log)
    predictor = load_cli_model(model, cfg)
    check_log_schema(predictor, metadata, describe_logs(log))
    for group, rows in predictor.missing_features(frame).items():
        if len(rows) == len(frame):  # nothing of what the model learned from: refuse rather than score noise
            predictor.check_features(frame, what=describe_logs(log))
        echo(f"warning: {describe_logs(log)}: {len(rows)} of {len(frame)} row(s) have no {group} features "
             f"(the model uses {predictor.feature_source}); they are scored with those features unknown")
    mismatch = _provenance_mismatch(model, cfg, sources=row_sources(frame, metadata),
                                    cluster_sizes=frame["cluster_size"].unique())
    if mismatch:
        echo(f"warning: {describe_logs(log)}: {mismatch}; these Q-errors are outside its training data")
    result = evaluate_predictor(predictor, frame)
    if plot is not None:
        from sloctl.plots import plot_predicted_vs_actual

        ok = (frame["status"] == "ok").to_numpy()
        predicted = predictor.predict(frame, neighbours="overlap")[ok]
        written = plot_predicted_vs_actual(predicted, frame["latency_s"].to_numpy()[ok], plot,
                                           groups=frame["cluster_size"].to_numpy()[ok],
                                           title=f"{model} on {describe_logs(log)}")
        echo(f"wrote {written}")
    if as_json:
        typer.echo(json.dumps({"n": result["n"], "q_error": result["q_error"],
                               "n_concurrent": result["n_concurrent"],
                               "q_error_concurrent": result["q_error_concurrent"],
                               "provenance_mismatch": mismatch}))
    else:
        q = result["q_error"]
        typer.echo(f"{model} on {describe_logs(log)}: n={result['n']}  Q-error p50 {q['p50']:.3f}  p90 {q['p90']:.3f}  "
                   f"p95 {q['p95']:.3f}  (with neighbours: n={result['n_concurrent']}, "
                   f"p90 {result['q_error_concurrent']['p90']:.3f})")


def _provenance_mismatch(model: str, cfg, *, sources, cluster_sizes) -> str | None:
    """Why ``sources``/``cluster_sizes`` are outside what ``model`` was trained on (None: they are not, or unknown)."""
    from sloctl.registry.store import model_provenance

    provenance = model_provenance(model, tracking_uri=cfg.registry.tracking_uri)
    return None if provenance is None else provenance.mismatch(sources=sources, cluster_sizes=cluster_sizes)


def predict_cmd(
    template: str | None = typer.Option(None, help="The query's template, e.g. tpch-q05 (or --input)."),
    size: int | None = typer.Option(None, help="Cluster size it would run on (with --template)."),
    input_file: Path | None = typer.Option(None, "--input", help="A CSV or Parquet file of queries to predict with "
                                           "one model load: columns template (or sql: the query's text, for a "
                                           "model trained with --features text+catalog), cluster_size, "
                                           "arrival_s; optional catalog and schema (of unqualified tables in "
                                           "sql), cluster_id (queries sharing a cluster are neighbours), end_s, "
                                           "plan features f_* (default: the model's own per template)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="With --input: write the queries with "
                                    "predicted_latency_s and isolated_latency_s here (.csv or .parquet)."),
    neighbour: list[str] = typer.Option([], "--neighbour", "-n",
                                        help="TEMPLATE@OFFSET_S: a neighbour arriving OFFSET_S seconds after "
                                             "the query (negative: before, still running). Repeatable."),
    model: str = typer.Option("models:/iconq@champion", help="Model URI or bundle folder."),
    benchmark: str = typer.Option("tpch", help="tpch or tpcds (plan features of a template the model's own "
                                  "template table lacks)."),
    sf: float = typer.Option(0.1, "--sf", help="Scale factor of the database the plans come from."),
    data_dir: Path | None = typer.Option(None, help="Where databases live."),
    as_json: bool = typer.Option(False, "--json"),
    allow_mismatch: bool = typer.Option(False, help="Predict even when the benchmark, scale factor or size is "
                                        "not what the model was trained on."),
    config: Path | None = ConfigOption,
) -> None:
    """Predict one query's latency on a cluster size, given its neighbours; or a whole file of queries (--input)."""
    import json

    from sloctl._cli_common import load_cli_model
    from sloctl.datasets.tpc import template_frame
    from sloctl.registry.provenance import source_key

    cfg = load_cli_config(config)
    if input_file is not None:
        if template is not None or size is not None or neighbour:
            raise typer.BadParameter("give --input or --template/--size/--neighbour, not both",
                                     param_hint="--input")
        _predict_file(input_file, out, model, cfg, as_json)
        return
    if template is None or size is None:
        raise typer.BadParameter("name the query (--template and --size) or a file of queries (--input)",
                                 param_hint="--template")
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
    predictor = load_cli_model(model, cfg)  # before the plans: an unknown model fails fast
    mismatch = _provenance_mismatch(model, cfg, sources=[source_key(benchmark, sf)], cluster_sizes=[size])
    if mismatch and not allow_mismatch:
        raise typer.BadParameter(f"{mismatch}; pass --allow-mismatch to predict anyway, or use a model trained "
                                 "on this data", param_hint="--benchmark/--sf/--size")
    if mismatch:
        echo(f"warning: {mismatch}")
    arrivals = [(template, 0.0), *offsets]
    frame = _table_frame(predictor.templates, arrivals, size)
    if frame is None:  # a template the model's own table lacks: plan it on the benchmark's database
        frame = template_frame(benchmark, sf, data_dir or cfg.warehouse.data_dir, arrivals, size)
    predictor.check_features(frame, what=f"--template {template}")
    seconds = predictor.predict(frame, neighbours="all")
    isolated = predictor.stage.predict(frame)
    result = {"template": template, "cluster_size": size, "latency_s": float(seconds[0]),
              "isolated_latency_s": float(isolated[0]), "n_neighbours": len(offsets), "model": model}
    if as_json:
        typer.echo(json.dumps(result))
    else:
        typer.echo(f"{template} on size {size} with {len(offsets)} neighbour(s): {seconds[0]:.4f} s "
                   f"(isolated estimate {isolated[0]:.4f} s)")


def _predict_file(path: Path, out: Path | None, model: str, cfg, as_json: bool) -> None:
    """``sloctl predict --input``: every query of a file, one model load, one batched prediction."""
    import json
    import time

    import pandas as pd

    from sloctl._cli_common import load_cli_model
    from sloctl.core.files import atomic_write
    from sloctl.models.predictor import queries_frame

    if out is None:
        raise typer.BadParameter("name where the predictions go (--out FILE.csv or FILE.parquet)", param_hint="--out")
    for option, p in (("--input", path), ("--out", out)):
        if p.suffix.lower() not in (".csv", ".parquet"):
            raise typer.BadParameter(f"must end in .csv or .parquet; got {p}", param_hint=option)
    if not path.is_file():
        raise typer.BadParameter(f"no such file: {path}", param_hint="--input")
    if out.resolve() == path.resolve():
        raise typer.BadParameter(f"is also the --input ({path}); refusing to overwrite it", param_hint="--out")
    if out.exists() and out.is_dir():
        raise typer.BadParameter(f"is a folder; name the file to write: {out}", param_hint="--out")
    started = time.perf_counter()
    try:
        queries = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 — any reader failure is the user's file, named
        raise typer.BadParameter(f"{path}: not a readable {path.suffix[1:]} file ({exc})", param_hint="--input") \
            from None
    predictor = load_cli_model(model, cfg)
    try:
        frame = queries_frame(queries, predictor.templates, source=f"--input {path}", sql=predictor.sql_features)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).removeprefix(f"--input {path}: "), param_hint=f"--input {path}") from None
    predictor.check_features(frame, what=f"--input {path}")
    seconds, stage_s = predictor.predict_with_isolated(frame)
    result = queries.copy()
    result["predicted_latency_s"] = seconds
    result["isolated_latency_s"] = stage_s
    with atomic_write(out, "wb") as fh:  # a reader never sees half a file
        if out.suffix.lower() == ".csv":
            fh.write(result.to_csv(index=False).encode())
        else:
            result.to_parquet(fh, index=False)
    summary = {"input": str(path), "out": str(out), "queries": len(result), "model": model,
               "wall_s": round(time.perf_counter() - started, 3)}
    (echo if as_json else typer.echo)(f"Predicted {len(result):,} queries with {model} in {summary['wall_s']} s "
                                      f"-> {out}")
    if as_json:
        typer.echo(json.dumps(summary))


def _table_frame(table, arrivals: list[tuple[str, float]], size: int):
    """A what-if frame from the model's own template table, or ``None`` when it lacks one of the templates."""
    import math

    if table is None or not {name for name, _ in arrivals} <= set(table["template"]):
        return None
    by_name = table.drop_duplicates("template").set_index("template", drop=False)
    zero = min(offset for _, offset in arrivals)
    rows = [{**by_name.loc[name].to_dict(), "query_id": i, "cluster_id": "what-if", "cluster_size": size,
             "arrival_s": offset - zero, "start_s": offset - zero, "end_s": math.nan, "status": "ok",
             "slo_s": math.nan, "oversubscribed": False} for i, (name, offset) in enumerate(arrivals)]
    import pandas as pd

    return pd.DataFrame(rows)


ApplyOption = typer.Option(False, "--apply", help="Then train with the study's best parameters on the same log "
                           "and register the model (as `sloctl train` does).")
NameOption = typer.Option(None, "--name", help="Registered model name for --apply (default: stage or iconq).")


@tune_app.command("stage")
def tune_stage_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help=f"Query log (Parquet). {SEVERAL_LOGS_HELP}"),
    trials: int = typer.Option(20, help="Trials to add in this run."),
    storage: str | None = typer.Option(None, help="Optuna storage (config: registry.optuna_storage)."),
    study_name: str = typer.Option("stage", help="Study name; an existing study is resumed (on the same log only)."),
    seed: int = typer.Option(0, help="Sampler seed."),
    apply: bool = ApplyOption,
    name: str | None = NameOption,
    as_json: bool = JsonOption,
    config: Path | None = ConfigOption,
) -> None:
    """Tune Stage's LightGBM settings on validation Q-error (isolated p90); --apply trains and registers the best."""
    _tune("stage", log, trials, storage, study_name, seed, 0, config, apply, name, as_json=as_json)


@tune_app.command("iconq")
def tune_iconq_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help=f"Query log (Parquet). {SEVERAL_LOGS_HELP}"),
    trials: int = typer.Option(10, help="Trials to add in this run."),
    storage: str | None = typer.Option(None, help="Optuna storage (config: registry.optuna_storage)."),
    study_name: str = typer.Option("iconq", help="Study name; an existing study is resumed (on the same log only)."),
    seed: int = typer.Option(0, help="Sampler seed."),
    max_epochs: int = typer.Option(30, help="Epoch limit per trial (and for --apply)."),
    apply: bool = ApplyOption,
    name: str | None = NameOption,
    as_json: bool = JsonOption,
    config: Path | None = ConfigOption,
) -> None:
    """Tune Iconq+ (width, dropout, learning rate, batch) on validation Q-error p90; --apply trains the best."""
    _tune("iconq", log, trials, storage, study_name, seed, max_epochs, config, apply, name, as_json=as_json)


def _print_tune(summary: dict, as_json: bool) -> None:
    """A study's result on stdout: JSON with --json, else a line (and one more for --apply's model)."""
    import json

    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(f"study {summary['study']}: {summary['n_trials']} trials ({summary['n_new']} new); best "
               f"{summary.get('objective', 'value')} {summary['best_value']} with {json.dumps(summary['best_params'])}")
    applied = summary.get("applied")
    if applied:
        typer.echo(f"applied: registered {applied['name']} v{applied['version']}"
                   f"{' (champion)' if applied['champion'] else ''}; val p90 {applied['val']:.3f}, "
                   f"test p90 {applied['test']:.3f}")


def _tune(model: str, log: list[Path], trials: int, storage: str | None, study_name: str, seed: int,
          max_epochs: int, config: Path | None, apply: bool = False, name: str | None = None, *,
          as_json: bool = True) -> None:
    import time

    from sloctl.core.progress import format_duration
    from sloctl.training.tune import tune

    if trials < 1:
        raise typer.BadParameter(f"must be >= 1; got {trials}", param_hint="--trials")
    if name is not None:
        _check_name(name)
    cfg = load_cli_config(config)
    frame, metadata = read_logs_with_metadata(log)
    started = time.monotonic()
    say = [echo]  # the progress bar's log while it shows

    def on_trial(report) -> None:
        value = "-" if report.value is None else f"{report.value:.4f}"
        where = f" at {'round' if model == 'stage' else 'epoch'} {report.step + 1}" if report.step is not None else ""
        best = "-" if report.best_value is None else f"{report.best_value:.4f}"
        elapsed = time.monotonic() - started
        eta = format_duration(elapsed / report.done * (report.total - report.done))
        params = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in report.params.items())
        say[0](f"trial {report.done}/{report.total} (#{report.number}) {report.state.lower()}{where}: "
               f"{report.objective} {value}; best {best}; ETA {eta}; {params}")

    from sloctl.core.progress import progress as open_progress

    with open_progress(f"tune {model}", total=None, heartbeat=model == "stage") as bar:
        trial_no, say[0] = [0], bar.log

        def on_batch(epoch: int, done: int, total: int, rate: float) -> None:  # an Iconq trial's epoch: a bar
            if done == 0:
                bar.restart(total=total, description=f"tune iconq: trial {trial_no[0] + 1}/{trials}, epoch "
                                                      f"{epoch + 1}/{max_epochs}")
            else:
                bar.update(done, note=f"{rate:,.0f} samples/s")

        def on_trial_done(report) -> None:
            trial_no[0] = report.done
            on_trial(report)

        result = tune(model, frame, cfg, trials=trials, storage=storage or cfg.registry.optuna_storage,
                      study_name=study_name, seed=seed, max_epochs=max_epochs, on_trial=on_trial_done,
                      log_path=describe_logs(log), on_batch=on_batch if model == "iconq" else None)
    summary = {"study": result.study_name, "objective": result.objective, "n_trials": result.n_trials,
               "n_new": result.n_new, "best_value": result.best_value, "best_params": result.best_params,
               "data_hash": result.data_hash, "mlflow_run_id": result.mlflow_run_id}
    if not apply:
        _print_tune(summary, as_json)
        return
    summary["applied"] = _apply_best(model, result, frame, cfg, describe_logs(log), metadata, name, as_json)
    _print_tune(summary, as_json)


def _apply_best(model: str, result, frame, cfg, log_path: str, metadata: dict, name: str | None,
                as_json: bool) -> dict:
    """``--apply``: train ``model`` with the study's best parameters and register it; what the JSON says."""
    from sloctl.registry.store import register as register_model
    from sloctl.training.tune import best_config

    best = best_config(model, result.best_params, cfg, max_epochs=result.max_epochs)
    echo(f"--apply: training {model} with the best parameters of study {result.study_name!r} "
         f"({result.objective} {result.best_value:.4f})")
    if model == ModelKind.STAGE:
        from sloctl.training.pipeline import train_stage

        trained = train_stage(frame, best.stage, val_fraction=best.iconq.val_fraction,
                              test_fraction=best.iconq.test_fraction, seed=best.iconq.seed,
                              risk_quantile=best.router.risk_quantile)
    else:
        from sloctl.training.pipeline import train_iconq

        trained = train_iconq(frame, best.stage, best.iconq, on_epoch=lambda e, v: echo(f"epoch {e:3d}  "
                                                                                       f"val_loss {v:.4f}"),
                              risk_quantile=best.router.risk_quantile)
    _print_metrics(f"{model} with the best parameters of {result.study_name}", trained.metrics, err=as_json)
    reg = register_model(trained, frame, name=name or model, tracking_uri=cfg.registry.tracking_uri,
                         experiment=cfg.registry.experiment, log_path=log_path, log_metadata=metadata,
                         extra_tags={"study_name": result.study_name, "tune_run_id": result.mlflow_run_id or ""})
    echo(f"Registered {reg.name} v{reg.version} (run {reg.run_id}); champion: {reg.champion} — {reg.reason}.")
    return {"name": reg.name, "version": reg.version, "run_id": reg.run_id, "champion": reg.champion,
            "reason": reg.reason, **{split: trained.metrics[f"{split}_q_error_p90"] for split in ("val", "test")}}


@train_app.command("admission")
def train_admission_cmd(
    workload: Path | None = typer.Option(None, "--workload", "-w", help="Workload description (YAML: server, "
                                         "types, load; default: configs/admission_workload.yaml)."),
    trials: int = typer.Option(12, help="Optuna trials (each one simulated run)."),
    seed: int = typer.Option(0, help="Seed of the sampler, the arrivals and the controllers."),
    duration_s: float = typer.Option(0.08, help="Simulated seconds per trial."),
    register: bool = typer.Option(True, help="Register as 'admission-policy' (alias champion) in MLflow."),
    out: Path | None = typer.Option(None, help="Also write the policy document (JSON) here."),
    force: bool = ForceOption,
    as_json: bool = typer.Option(False, "--json", help="Print the policy document as JSON on stdout."),
    config: Path | None = ConfigOption,
) -> None:
    """Tune Svalinn's admission settings on a workload in the simulator and register them."""
    import json

    from sloctl._cli_common import check_out, keep_mode
    from sloctl._cli_errors import UserError, error_message
    from sloctl.training.admission_policy import load_workload, register_admission_policy, tune_admission

    if workload is None:
        import sloctl.configs

        workload = Path(sloctl.configs.__file__).resolve().parent / "admission_workload.yaml"
    if trials < 1:
        raise typer.BadParameter(f"must be >= 1; got {trials}", param_hint="--trials")
    if not workload.is_file():
        raise typer.BadParameter(f"{workload}: no such workload file", param_hint="--workload")
    try:
        spec = load_workload(workload)
    except Exception as exc:  # malformed YAML or a bad field: one line naming the file
        raise UserError(f"--workload {workload}: {error_message(exc)}") from exc
    cfg = load_cli_config(config) if register else None  # a bad --config fails before the tuning
    out_mode = check_out(out, "admission-policy", force) if out is not None else None
    policy = tune_admission(spec, trials=trials, seed=seed, duration_s=duration_s,
                            on_trial=lambda n, score: echo(f"trial {n}: weighted goodput {score / 1e3:.1f}k/s"))
    m, c = policy.metrics, policy.credits
    (echo if as_json else typer.echo)(f"best: credit step ε {c.epsilon:.3f}, dead-band {c.dead_band:.3f}, "
               f"experiment {c.experiment_s * 1e3:.2f} ms, m_semaphore capacity "
               f"{policy.msem.capacity}; weighted goodput {m['weighted_goodput_per_s'] / 1e3:.1f}k/s "
               f"(library defaults: {m['default_weighted_goodput_per_s'] / 1e3:.1f}k/s), drops {m['drop_rate']:.1%}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(policy.to_doc(), indent=2))
        keep_mode(out, out_mode)
        echo(f"wrote {out}")
    doc = policy.to_doc()
    if register:
        version = register_admission_policy(policy, tracking_uri=cfg.registry.tracking_uri,
                                            experiment=cfg.registry.experiment, source=str(workload))
        echo(f"registered {policy.kind} v{version} (alias champion) in {cfg.registry.tracking_uri}")
        doc["registered"] = {"name": policy.kind, "version": version, "alias": "champion"}
    if as_json:
        typer.echo(json.dumps(doc))
