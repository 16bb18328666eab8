"""``sloctl gateway``: the SLO gateway, a Trino-protocol endpoint in front of the DuckDB clusters (docs/gateway.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sloctl._cli_common import ConfigOption, bind_port, echo, load_cli_config, parse_sizes, read_logs

__all__ = ["autoscaler_knobs", "experiment_gateway_cmd", "gateway_cmd", "gateway_passwd_cmd", "slo_table"]


def slo_table(log_paths: list[Path] | None, kappa: float) -> dict[str, float]:
    """SLO per template: ``kappa`` × its largest isolated latency on size 1 in the logs (none: empty)."""
    if not log_paths:
        return {}
    from sloctl.datasets.slo import slo_baselines

    table = {t: kappa * s for t, s in slo_baselines(read_logs(log_paths, "--slo-log"), 1).items()}
    if not table:
        raise typer.BadParameter("the log has no template run alone on size 1 to set SLOs from "
                                 "(collect an isolated workload on size 1)", param_hint="--slo-log")
    return table


def autoscaler_knobs(path: Path | None):
    """The :class:`~sloctl.control.autoscaler.AutoscalerConfig` in a YAML file (``None``: no autoscaler)."""
    if path is None:
        return None
    import yaml

    from sloctl.control.autoscaler import AutoscalerConfig
    from sloctl.core.config import from_mapping

    if not path.is_file():
        raise typer.BadParameter(f"no such file: {path}", param_hint="--autoscaler")
    try:
        knobs = from_mapping(AutoscalerConfig, yaml.safe_load(path.read_text()) or {}, source=str(path))
        knobs.validate()
    except yaml.YAMLError as exc:
        raise typer.BadParameter(f"{path} is not YAML ({' '.join(str(exc).split())})",
                                 param_hint="--autoscaler") from exc
    return knobs


def gateway_cmd(
    db: Path | None = typer.Option(None, help="DuckDB database the clusters serve (default: TPC-H SF 1 in "
                                   "warehouse.data_dir)."),
    sizes: str = typer.Option("1,1", help="Cluster sizes, comma-separated (clusters c0, c1, ...)."),
    router: str = typer.Option("sloctl", help="Placement: sloctl (the registered model's router), least-queued "
                               "or random."),
    admission: bool = typer.Option(True, help="Defer and shed by predicted SLO misses (needs a latency model)."),
    retries: bool = typer.Option(True, help="Retry failed and timed-out attempts on another cluster."),
    policy: Path | None = typer.Option(None, help="Gateway policy (YAML): classes, queue bounds, deferral "
                                       "deadlines, retry limits (default: high and low, docs/gateway.md)."),
    slo_log: list[Path] = typer.Option(None, "--slo-log", help="Query log whose isolated size-1 runs set each "
                                       "template's SLO (x --kappa)."),
    kappa: float = typer.Option(2.0, help="SLO = kappa x the template's largest isolated latency in --slo-log."),
    log_dir: Path = typer.Option(Path("gateway-logs"), help="Folder the query log of every attempt is written to "
                                 "(train on it: sloctl train iconq --log FOLDER)."),
    templates_log: Path | None = typer.Option(None, help="Query log giving each template's plan features "
                                              "(default: serve.templates_log, else the model bundle's)."),
    budgets: bool = typer.Option(False, "--budgets", help="Cluster sizes as CPU budgets (warehouse.* in the "
                                 "config) instead of pinned cores."),
    autoscaler: Path | None = typer.Option(None, help="YAML of the AutoSLO autoscaler's knobs (window_s, theta, "
                                           "tau_trigger, spinup_delay_s, max_clusters, ...): spin real clusters "
                                           "up and down (needs a latency model)."),
    retry_uri: str = typer.Option("models:/retry-policy-gateway@champion", help="Registered retry-policy giving "
                                  "each class's k (what `sloctl retry optimise -n configs/networks/gateway.yaml` "
                                  "registers); followed and hot-swapped."),
    host: str = typer.Option("127.0.0.1", help="Address. Any address but loopback needs authentication "
                             "(--password-file or --jwt-key) and TLS (--tls-cert, --tls-key)."),
    port: int = typer.Option(8081, help="Port."),
    password_file: Path | None = typer.Option(None, help="Users and bcrypt hashes, one 'user:hash' a line "
                                              "(Trino's password file; `sloctl gateway passwd` writes it): HTTP "
                                              "Basic authentication."),
    jwt_key: Path | None = typer.Option(None, help="JWT authentication: an HS256 secret file or an RS256/ES256 "
                                        "public key (PEM); the user is the token's 'sub'."),
    jwt_issuer: str | None = typer.Option(None, help="The 'iss' a JWT must carry."),
    jwt_audience: str | None = typer.Option(None, help="The 'aud' a JWT must carry."),
    admin_user: list[str] = typer.Option(None, "--admin-user", help="A user with the admin role (reads every "
                                         "query, /v1/gateway, /metrics; may impersonate). Repeatable."),
    tls_cert: Path | None = typer.Option(None, help="TLS certificate (PEM): serve https://."),
    tls_key: Path | None = typer.Option(None, help="TLS private key (PEM) of --tls-cert."),
    insecure_auth: bool = typer.Option(False, "--insecure-auth", help="Accept credentials over plain HTTP "
                                       "(only behind a TLS terminator on this host)."),
    memory_limit: str = typer.Option("2GB", help="Each cluster worker's DuckDB memory_limit: a query needing "
                                     "more fails with EXCEEDED_LOCAL_MEMORY_LIMIT, the cluster goes on."),
    drain_grace_s: float = typer.Option(30.0, help="On SIGTERM: how long running queries may take to finish."),
    as_json: bool = typer.Option(False, "--json", help="Print the gateway's state at start as one JSON line."),
    config: Path | None = ConfigOption,
) -> None:
    """The SLO gateway: Trino clients connect; sloctl admits, routes, retries and logs every query."""
    import uvicorn

    from sloctl._cli_experiments import _live_db
    from sloctl.serving._gateway_app import create_gateway_app
    from sloctl.serving._gateway_policy import load_gateway_policy
    from sloctl.serving._gateway_server import DrainingServer
    from sloctl.serving.gateway import ROUTERS, Gateway, GatewayOptions
    from sloctl.serving.runtime import load_templates_table

    cfg = load_cli_config(config)
    if router not in ROUTERS:
        raise typer.BadParameter(f"expected one of {', '.join(ROUTERS)}; got {router!r}", param_hint="--router")
    if not kappa > 0:
        raise typer.BadParameter(f"must be > 0; got {kappa}", param_hint="--kappa")
    if not 0 < port < 65536:
        raise typer.BadParameter(f"must be in 1..65535; got {port}", param_hint="--port")
    cluster_sizes = parse_sizes(sizes, "--sizes")
    database = _live_db(db, cfg)
    gateway_policy = load_gateway_policy(policy)
    table = slo_table(slo_log, kappa)
    templates = load_templates_table(templates_log or cfg.serve.templates_log)
    knobs = autoscaler_knobs(autoscaler)
    auth = gateway_auth(password_file, jwt_key, jwt_issuer, jwt_audience, admin_user or [], insecure_auth)
    tls = tls_options(tls_cert, tls_key)
    if not _loopback(host) and not (auth.enabled and (tls or insecure_auth)):
        raise typer.BadParameter(f"{host} is not a loopback address: serving strangers needs authentication "
                                 "(--password-file or --jwt-key) and TLS (--tls-cert and --tls-key)",
                                 param_hint="--host")
    if not drain_grace_s >= 0:
        raise typer.BadParameter(f"must be >= 0; got {drain_grace_s}", param_hint="--drain-grace-s")
    sock = bind_port(host, port)  # a taken port is exit 2, one line, before clusters start
    serve = cfg.serve
    options = GatewayOptions(
        cluster_sizes=cluster_sizes, router=router, admission=admission, retries=retries, router_cfg=cfg.router,
        policy=gateway_policy, slo_table=table, log_dir=log_dir, tracking_uri=cfg.registry.tracking_uri,
        model_uri=serve.model_uri, fallback_uri=serve.fallback_uri, admission_uri=serve.admission_uri,
        retry_uri=retry_uri, watch_interval_s=serve.watch_interval_s,
        pool_options=cfg.warehouse.pool_options() if budgets else None, autoscaler=knobs,
        worker_memory_limit=memory_limit, drain_grace_s=drain_grace_s)
    try:
        options.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    gateway = Gateway(database, options, templates=templates).start()
    try:
        state = gateway.status()
        address = f"{'https' if tls else 'http'}://{host}:{sock.getsockname()[1]}"
        if as_json:
            typer.echo(json.dumps({"url": address, "database": str(database), **state}))
        else:
            typer.echo(f"sloctl gateway (Trino protocol) on {address}: {len(cluster_sizes)} clusters "
                       f"{list(cluster_sizes)} on {database}, router {state['router']}, admission "
                       f"{'on' if admission else 'off'}, retries {'on' if retries else 'off'}; query log in {log_dir}/")
        if auth.enabled:
            kinds = [n for n, on in (("password file", auth.password_file), ("JWT", auth.jwt)) if on]
            echo(f"authentication: {' and '.join(kinds)}"
                 f"{', TLS' if tls else ', over plain HTTP (--insecure-auth)'}; admin users: "
                 f"{', '.join(sorted(auth.admin_users)) or 'none'}")
        else:
            echo("authentication: OFF (loopback only): any local process may act as any user; "
                 "see docs/gateway.md to turn it on")
        echo(f"connect: trino.dbapi.connect(host={host!r}, port={sock.getsockname()[1]}, user='me', "
             "client_tags=['high'])")
        server = DrainingServer(uvicorn.Config(create_gateway_app(gateway, auth), host=host, port=port,
                                               log_level="warning", **tls, **guard_options(cfg.serve)), gateway)
        server.run(sockets=[sock])
    finally:
        gateway.close()


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gateway_auth(password_file: Path | None, jwt_key: Path | None, issuer: str | None, audience: str | None,
                 admins: list[str], insecure: bool):
    """The gateway's :class:`~sloctl.serving._gateway_auth.GatewayAuth` from its options (exit 2 on bad files)."""
    from sloctl.serving._gateway_auth import GatewayAuth, JwtVerifier, PasswordFile

    try:
        passwords = PasswordFile.load(password_file) if password_file is not None else None
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--password-file") from None
    try:
        jwt = JwtVerifier(jwt_key, issuer=issuer, audience=audience) if jwt_key is not None else None
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--jwt-key") from None
    if (admins or insecure) and passwords is None and jwt is None:
        raise typer.BadParameter("needs authentication on (--password-file or --jwt-key)",
                                 param_hint="--admin-user" if admins else "--insecure-auth")
    return GatewayAuth(password_file=passwords, jwt=jwt, admin_users=frozenset(admins), allow_insecure=insecure)


def tls_options(cert: Path | None, key: Path | None) -> dict:
    """uvicorn's TLS options (``{}``: plain HTTP); both files or neither."""
    if (cert is None) != (key is None):
        raise typer.BadParameter("give both --tls-cert and --tls-key, or neither",
                                 param_hint="--tls-cert" if cert is None else "--tls-key")
    if cert is None:
        return {}
    for path, hint in ((cert, "--tls-cert"), (key, "--tls-key")):
        if not path.is_file():
            raise typer.BadParameter(f"no such file: {path}", param_hint=hint)
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        raise typer.BadParameter(f"{cert} and {key} are not a PEM certificate and its key ({exc})",
                                 param_hint="--tls-cert") from None
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}


def guard_options(serve) -> dict:
    """The slow-client guard of the ``serve:`` section as uvicorn options (docs/serving.md, "The front door").

    The same guard as ``sloctl serve``: a request-header and body timeout and
    a per-client connection cap; the open-file limit is raised first, so a
    thousand idle connections cannot exhaust descriptors.
    """
    from sloctl.serving._http_guard import raise_nofile_limit
    from sloctl.serving.local import server_options

    raise_nofile_limit()
    return server_options(serve)


def gateway_passwd_cmd(
    out: Path = typer.Argument(..., metavar="FILE", help="The password file (created if missing, mode 0600)."),
    user: str = typer.Argument(..., help="The user to add or whose password to change."),
    rounds: int = typer.Option(10, help="bcrypt cost (log2 of the rounds; Trino needs >= 8)."),
    as_json: bool = typer.Option(False, "--json", help="Print {file, user} as one JSON line."),
) -> None:
    """Add a user to a gateway password file, or change its password (read from stdin, or asked for)."""
    import sys

    from sloctl.serving._gateway_auth import set_password

    if sys.stdin.isatty():
        password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\n")
    try:
        set_password(out, user, password, rounds=rounds)
    except ValueError as exc:
        hint = "--rounds" if "rounds" in str(exc) else "FILE" if str(out) in str(exc) else "password"
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    if as_json:
        typer.echo(json.dumps({"file": str(out), "user": user}))
    else:
        echo(f"{out}: password of {user!r} set (bcrypt, cost {rounds})")


def experiment_gateway_cmd(
    log: list[Path] = typer.Option(..., "--log", "-l", help="Query log with isolated size-1 runs: SLO references, "
                                   "plan features, the time unit."),
    model: str = typer.Option("models:/iconq@champion", help="Model the sloctl arms route with (registry URI or "
                              "bundle folder)."),
    db: Path | None = typer.Option(None, help="TPC-H database the log was collected on (default: SF 1)."),
    sizes: str = typer.Option("1,1", help="Clusters of every arm, comma-separated."),
    queries: int = typer.Option(120, help="Arrivals per round."),
    load: float = typer.Option(0.8, help="Base rate, x the clusters' capacity (sum of sizes / mean isolated "
                               "latency)."),
    burst: float = typer.Option(2.0, help="The middle third of the arrivals comes at this x the base rate."),
    high_share: float = typer.Option(0.2, help="Fraction of high-priority queries."),
    kappa: float = typer.Option(2.0, help="SLO = kappa x the template's largest isolated latency on size 1."),
    seed: int = typer.Option(0),
    rounds: int = typer.Option(1, help="Rounds (seeds seed, seed+1, ...; arm order rotates)."),
    templates: str | None = typer.Option(None, help="Only these templates, comma-separated (e.g. "
                                         "tpch-q01,tpch-q06)."),
    arms: str | None = typer.Option(None, help="Only these arms, comma-separated (default: random, least-queued, "
                                    "sloctl, sloctl+admission+retries)."),
    policy: Path | None = typer.Option(None, help="Gateway policy (YAML) instead of the experiment's defaults."),
    budgets: bool = typer.Option(False, "--budgets", help="Cluster sizes as CPU budgets (warehouse.* in the "
                                 "config)."),
    as_json: bool = typer.Option(False, "--json"),
    config: Path | None = ConfigOption,
) -> None:
    """Random vs least-queued vs sloctl routing vs sloctl + admission + class retries, through real Trino clients."""
    from sloctl._cli_common import load_cli_model
    from sloctl._cli_experiments import _live_db
    from sloctl.experiments.gateway import ARMS, run_gateway_experiment
    from sloctl.serving._gateway_policy import load_gateway_policy

    cfg = load_cli_config(config)
    for name, value in (("--queries", queries), ("--rounds", rounds)):
        if value < 1:
            raise typer.BadParameter(f"must be >= 1; got {value}", param_hint=name)
    for name, value in (("--load", load), ("--burst", burst), ("--kappa", kappa)):
        if not value > 0:
            raise typer.BadParameter(f"must be > 0; got {value}", param_hint=name)
    if not 0 <= high_share <= 1:
        raise typer.BadParameter(f"must be in [0, 1]; got {high_share}", param_hint="--high-share")
    chosen = tuple(a.strip() for a in arms.split(",") if a.strip()) if arms else tuple(ARMS)
    bad = [a for a in chosen if a not in ARMS]
    if bad or not chosen:
        raise typer.BadParameter(f"expected arms among {', '.join(ARMS)}; got {arms!r}", param_hint="--arms")
    database = _live_db(db, cfg)
    frame = read_logs(log)
    predictor = load_cli_model(model, cfg)
    gateway_policy = load_gateway_policy(policy) if policy is not None else None
    only = [t.strip() for t in templates.split(",") if t.strip()] if templates else None
    result = run_gateway_experiment(
        database, frame, predictor, sizes=parse_sizes(sizes, "--sizes"), n_queries=queries, load=load, burst=burst,
        high_share=high_share, kappa=kappa, seed=seed, rounds=rounds, policy=gateway_policy, router_cfg=cfg.router,
        pool_options=cfg.warehouse.pool_options() if budgets else None, only_templates=only, arms=chosen,
        on_progress=echo)
    if as_json:
        typer.echo(json.dumps(result.to_json()))
        return
    s = result.settings
    typer.echo(f"experiment gateway: {s['n_queries']} queries x {s['rounds']} round(s), clusters {s['sizes']}, "
               f"load {s['load']:g} with a {s['burst']:g}x burst, high {s['high_share']:.0%}, kappa {s['kappa']:g} "
               f"(mean SLO {s['mean_slo_s']:.3f} s); graded by {result.world}")
    typer.echo(f"{'arm':26} {'class':6} {'sub':>4} {'adm':>4} {'def':>4} {'shed':>4} {'fail':>4} {'VR':>6} "
               f"{'VR(run)':>7} {'goodput/s':>9} {'p50 s':>7} {'cost':>8}")

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    for arm in result.arms:
        for klass, row in [*arm.per_class.items(), ("all", arm.overall)]:
            typer.echo(f"{arm.arm:26} {klass:6} {row['submitted']:4d} {row['admitted']:4d} {row['deferred']:4d} "
                       f"{row['shed']:4d} {row['failed']:4d} {fmt(row['vr'], '6.3f')} {fmt(row['vr_served'], '7.3f')} "
                       f"{fmt(row['goodput_per_s'], '9.3f')} {fmt(row['latency_p50_s'], '7.3f')} "
                       f"{arm.cost if klass == 'all' else float('nan'):8.1f}")
        typer.echo(f"{'':26} retries {arm.retries}, placed despite a predicted miss {arm.forced}, "
                   f"admitted + deferred + shed = submitted: {'yes' if arm.accounted else 'NO'}")
    r = result.ratios
    typer.echo("high-priority VR, full gateway / least-queued: " + fmt(r.get("high_vr_full_vs_least_queued"), ".3f")
               + "; goodput, full gateway / least-queued: " + fmt(r.get("goodput_full_vs_least_queued"), ".3f"))
