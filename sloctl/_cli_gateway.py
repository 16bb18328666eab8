"""``sloctl gateway``: the SLO gateway, a Trino-protocol endpoint in front of the DuckDB clusters (docs/gateway.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from sloctl._cli_common import Config, bind_port, echo, load_cli_config, parse_sizes, positive, read_logs

__all__ = ["autoscaler_knobs", "gateway_cmd", "gateway_passwd_cmd", "slo_table"]


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


Db = Annotated[Path | None, typer.Option(help="DuckDB database the clusters serve (default: TPC-H SF 1 in "
                                         "warehouse.data_dir).")]
Sizes = Annotated[str, typer.Option(help="Cluster sizes, comma-separated (clusters c0, c1, ...).")]
Router = Annotated[str, typer.Option(help="Placement: sloctl (the registered model's router), least-queued or "
                                     "random.")]
Admission = Annotated[bool, typer.Option(help="Defer and shed by predicted SLO misses (needs a latency model).")]
Retries = Annotated[bool, typer.Option(help="Retry failed and timed-out attempts on another cluster.")]
Policy = Annotated[Path | None, typer.Option(help="Gateway policy (YAML): classes, queue bounds, deferral "
                                             "deadlines, retry limits (default: high and low, docs/gateway.md).")]
SloLog = Annotated[list[Path] | None, typer.Option("--slo-log", help="Query log whose isolated size-1 runs set each "
                                                   "template's SLO (x --kappa).")]
Kappa = Annotated[float, typer.Option(help="SLO = kappa x the template's largest isolated latency in --slo-log.")]
LogDir = Annotated[Path, typer.Option(help="Folder the query log of every attempt is written to (train on it: "
                                      "sloctl train iconq --log FOLDER).")]
TemplatesLog = Annotated[Path | None, typer.Option(help="Query log giving each template's plan features (default: "
                                                   "serve.templates_log, else the model bundle's).")]
Budgets = Annotated[bool, typer.Option("--budgets", help="Cluster sizes as CPU budgets (warehouse.* in the config) "
                                       "instead of pinned cores.")]
Knobs = Annotated[Path | None, typer.Option("--autoscaler", help="YAML of the AutoSLO autoscaler's knobs (window_s, "
                                            "theta, tau_trigger, spinup_delay_s, max_clusters, ...): spin real "
                                            "clusters up and down (needs a latency model).")]
RetryUri = Annotated[str, typer.Option(help="Registered retry-policy giving each class's k (what `sloctl retry "
                                       "optimise -n configs/networks/gateway.yaml` registers); followed and "
                                       "hot-swapped.")]
Host = Annotated[str, typer.Option(help="Address. Any address but loopback needs authentication (--password-file "
                                   "or --jwt-key) and TLS (--tls-cert, --tls-key).")]
Port = Annotated[int, typer.Option(help="Port.")]
PasswordFileOpt = Annotated[Path | None, typer.Option("--password-file", help="Users and bcrypt hashes, one "
                                                      "'user:hash' a line (Trino's password file; `sloctl gateway "
                                                      "passwd` writes it): HTTP Basic authentication.")]
JwtKey = Annotated[Path | None, typer.Option(help="JWT authentication: an HS256 secret file or an RS256/ES256 "
                                             "public key (PEM); the user is the token's 'sub'.")]
JwtIssuer = Annotated[str | None, typer.Option(help="The 'iss' a JWT must carry.")]
JwtAudience = Annotated[str | None, typer.Option(help="The 'aud' a JWT must carry.")]
AdminUser = Annotated[list[str] | None, typer.Option("--admin-user", help="A user with the admin role (reads every "
                                                     "query, /v1/gateway, /metrics; may impersonate). Repeatable.")]
TlsCert = Annotated[Path | None, typer.Option(help="TLS certificate (PEM): serve https://.")]
TlsKey = Annotated[Path | None, typer.Option(help="TLS private key (PEM) of --tls-cert.")]
InsecureAuth = Annotated[bool, typer.Option("--insecure-auth", help="Accept credentials over plain HTTP (only "
                                            "behind a TLS terminator on this host).")]
MemoryLimit = Annotated[str, typer.Option(help="Each cluster worker's DuckDB memory_limit: a query needing more "
                                          "fails with EXCEEDED_LOCAL_MEMORY_LIMIT, the cluster goes on.")]
DrainGrace = Annotated[float, typer.Option(help="On SIGTERM: how long running queries may take to finish.")]
StateJson = Annotated[bool, typer.Option("--json", help="Print the gateway's state at start as one JSON line.")]
CatalogName = Annotated[str | None, typer.Option("--catalog", help="The Trino catalog name clients use for the "
                                                 "database (default: its file name's stem, e.g. tpch_sf1).")]
MemoryCatalog = Annotated[str, typer.Option("--memory-catalog", help="Size of the writable `memory` catalog (one "
                                            "in-memory scratch database per gateway, cleared at restart; the "
                                            "warehouse stays read-only), a DuckDB size, or 'off'.")]


BackendsFile = Annotated[Path | None, typer.Option("--backends", help="YAML file whose 'backends:' list names the "
                                                "clusters: duckdb workers, trino coordinators (url) and postgresql "
                                                "servers (url), each with a size and a routing group "
                                                "(docs/gateway.md); replaces --sizes.")]
HistoryUrl = Annotated[str | None, typer.Option("--history-url", help="The query history's database: "
                                                "sqlite:///PATH or postgresql://... (default: "
                                                "LOG_DIR/history.sqlite).")]
HistoryHours = Annotated[float, typer.Option("--history-retention-hours", help="How long the history keeps "
                                             "a query.")]
HealthInterval = Annotated[float, typer.Option("--health-interval", help="Seconds between health checks of each "
                                               "trino and postgresql backend.")]


def backends_file(path: Path | None):
    """The backends of a YAML file: ``(specs, allowed_urls)`` (``None``: ``((), None)``).

    ``specs`` is its ``backends:`` list of
    :class:`~sloctl.serving.gateway.backends.BackendSpec`; ``allowed_urls``
    its optional ``allowed_urls:`` list, the addresses a backend added at run
    time may have (``None``: the URLs of ``backends:``).
    """
    if path is None:
        return (), None
    import yaml

    from sloctl.serving.gateway.backends import backends_from_doc

    if not path.is_file():
        raise typer.BadParameter(f"no such file: {path}", param_hint="--backends")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise typer.BadParameter(f"{path} is not YAML ({' '.join(str(exc).split())})",
                                 param_hint="--backends") from exc
    if not isinstance(doc, dict) or "backends" not in doc:
        raise typer.BadParameter(f"{path} must hold a mapping with a 'backends:' list", param_hint="--backends")
    from sloctl.serving.gateway.auth import allowed_origins

    try:
        specs = backends_from_doc(doc["backends"])
        allowed = doc.get("allowed_urls")
        if allowed is not None:
            allowed_origins(allowed)
            allowed = tuple(allowed)
    except ValueError as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--backends") from None
    return specs, allowed


def gateway_cmd(
    ctx: typer.Context,
    db: Db = None, sizes: Sizes = "1,1", router: Router = "sloctl", admission: Admission = True,
    retries: Retries = True, policy: Policy = None, slo_log: SloLog = None, kappa: Kappa = 2.0,
    log_dir: LogDir = Path("gateway-logs"), templates_log: TemplatesLog = None, budgets: Budgets = False,
    autoscaler: Knobs = None, retry_uri: RetryUri = "models:/retry-policy-gateway@champion",
    host: Host = "127.0.0.1", port: Port = 8081, password_file: PasswordFileOpt = None, jwt_key: JwtKey = None,
    jwt_issuer: JwtIssuer = None, jwt_audience: JwtAudience = None, admin_user: AdminUser = None,
    tls_cert: TlsCert = None, tls_key: TlsKey = None, insecure_auth: InsecureAuth = False,
    memory_limit: MemoryLimit = "2GB", drain_grace_s: DrainGrace = 30.0, as_json: StateJson = False,
    catalog: CatalogName = None, memory_catalog: MemoryCatalog = "256MB", config: Config = None,
    backends: BackendsFile = None, history_url: HistoryUrl = None, history_retention_hours: HistoryHours = 24.0,
    health_interval: HealthInterval = 2.0,
) -> None:
    """The SLO gateway: Trino clients connect; sloctl admits, routes, retries and logs every query.

    With no command it serves; `sloctl gateway backends ...` and `sloctl gateway history` talk to one that runs.
    """
    if ctx.invoked_subcommand is not None:
        return
    from sloctl._cli_experiments import _live_db
    from sloctl.serving.controller import load_templates_table
    from sloctl.serving.gateway import ROUTERS, GatewayOptions
    from sloctl.serving.gateway.policy import load_gateway_policy
    from sloctl.serving.gateway.server import run_gateway

    cfg = load_cli_config(config)
    if router not in ROUTERS:
        raise typer.BadParameter(f"expected one of {', '.join(ROUTERS)}; got {router!r}", param_hint="--router")
    positive(kappa=kappa)
    if not 0 < port < 65536:
        raise typer.BadParameter(f"must be in 1..65535; got {port}", param_hint="--port")
    cluster_sizes, database = parse_sizes(sizes, "--sizes"), _live_db(db, cfg)
    gateway_policy, table = load_gateway_policy(policy), slo_table(slo_log, kappa)
    templates = load_templates_table(templates_log or cfg.serve.templates_log)
    knobs = autoscaler_knobs(autoscaler)
    specs, allowed_urls = backends_file(backends)
    auth = gateway_auth(password_file, jwt_key, jwt_issuer, jwt_audience, admin_user or [], insecure_auth)
    tls = tls_options(tls_cert, tls_key)
    _check_exposure(host, auth.enabled, bool(tls), insecure_auth, drain_grace_s)
    sock = bind_port(host, port)  # a taken port is exit 2, one line, before clusters start
    serve = cfg.serve
    options = GatewayOptions(
        cluster_sizes=cluster_sizes, router=router, admission=admission, retries=retries, router_cfg=cfg.router,
        policy=gateway_policy, slo_table=table, log_dir=log_dir, tracking_uri=cfg.registry.tracking_uri,
        model_uri=serve.model_uri, fallback_uri=serve.fallback_uri, admission_uri=serve.admission_uri,
        retry_uri=retry_uri, watch_interval_s=serve.watch_interval_s,
        pool_options=cfg.warehouse.pool_options() if budgets else None, autoscaler=knobs,
        worker_memory_limit=memory_limit, drain_grace_s=drain_grace_s, catalog=catalog,
        scratch_memory_limit=None if memory_catalog == "off" else memory_catalog,
        backends=specs, allowed_urls=allowed_urls, history_url=history_url,
        history_retention_hours=history_retention_hours, health_interval_s=health_interval)
    try:
        options.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    address = f"{'https' if tls else 'http'}://{host}:{sock.getsockname()[1]}"

    def announce(state: dict) -> None:
        _announce(state, address, str(database), log_dir, auth, bool(tls), as_json)

    run_gateway(database, options, templates=templates, auth=auth, sock=sock, host=host, port=port,
                server_options={**tls, **guard_options(cfg.serve)}, announce=announce)


def _check_exposure(host: str, authenticated: bool, tls: bool, insecure_auth: bool, drain_grace_s: float) -> None:
    if not _loopback(host) and not (authenticated and (tls or insecure_auth)):
        raise typer.BadParameter(f"{host} is not a loopback address: serving strangers needs authentication "
                                 "(--password-file or --jwt-key) and TLS (--tls-cert and --tls-key)",
                                 param_hint="--host")
    if not drain_grace_s >= 0:
        raise typer.BadParameter(f"must be >= 0; got {drain_grace_s}", param_hint="--drain-grace-s")


def _announce(state: dict, address: str, database: str, log_dir: Path, auth, tls: bool, as_json: bool) -> None:
    """The gateway's address and state, and how to connect (stderr: authentication and the connect line)."""
    if as_json:
        typer.echo(json.dumps({"url": address, "database": database, **state}))
    else:
        sizes = [c["size"] for c in state["clusters"]]
        typer.echo(f"sloctl gateway (Trino protocol) on {address}: {len(sizes)} clusters {sizes} on {database}, "
                   f"router {state['router']}, admission {'on' if state['admission'] else 'off'}, retries "
                   f"{'on' if state['retries'] else 'off'}; query log in {log_dir}/")
    if auth.enabled:
        kinds = [n for n, on in (("password file", auth.password_file), ("JWT", auth.jwt)) if on]
        echo(f"authentication: {' and '.join(kinds)}{', TLS' if tls else ', over plain HTTP (--insecure-auth)'}; "
             f"admin users: {', '.join(sorted(auth.admin_users)) or 'none'}")
    else:
        echo("authentication: OFF (loopback only): any local process may act as any user; "
             "see docs/gateway.md to turn it on")
        echo(f"admin API: needs the token in {state.get('admin_token_file')} (mode 0600; header "
             "X-Sloctl-Admin-Token; `sloctl gateway backends` reads it from --log-dir)")
    host, port = address.rsplit("://", 1)[1].rsplit(":", 1)
    echo(f"connect: trino.dbapi.connect(host={host!r}, port={port}, user='me', catalog={state.get('catalog')!r}, "
         "schema='main', client_tags=['high'])")


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
    """The gateway's :class:`~sloctl.serving.gateway.auth.GatewayAuth` from its options (exit 2 on bad files)."""
    from sloctl.serving.gateway.auth import GatewayAuth, JwtVerifier, PasswordFile

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

    from sloctl.serving.gateway.auth import set_password

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
