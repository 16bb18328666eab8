"""``sloctl gateway backends ...`` and ``sloctl gateway history``: manage and read a gateway (docs/gateway.md).

``backends`` talks to a running gateway's admin API (``/v1/gateway/backends``)
as an admin: with authentication on, a user of its admin role
(``--password-env``); with it off, the holder of the admin token the gateway
wrote to ``LOG_DIR/admin.token`` at start (read from
``$SLOCTL_GATEWAY_ADMIN_TOKEN``, else ``--admin-token-file``, else
``--log-dir``'s file). ``history`` reads the query history, through the
gateway (``--url``) or straight from its database (``--history-url`` or
``--log-dir``, also when the gateway is down).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from sloctl._cli_common import echo

__all__ = ["add_gateway_admin"]

Url = Annotated[str, typer.Option("--url", help="The running gateway's address.")]
User = Annotated[str, typer.Option("--user", help="Who asks (a user of the gateway's admin role when "
                                   "authentication is on).")]
PasswordEnv = Annotated[str | None, typer.Option("--password-env", help="Name of the environment variable holding "
                                                 "the password (HTTP Basic; never on the command line).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]
AdminLogDir = Annotated[Path, typer.Option("--log-dir", help="The gateway's log folder: its admin.token is the "
                                           "admin token (authentication off).")]
TokenFile = Annotated[Path | None, typer.Option("--admin-token-file", help="The admin token's file (default: "
                                                "LOG_DIR/admin.token; $SLOCTL_GATEWAY_ADMIN_TOKEN wins over both).")]


def _admin_token(password_env: str | None, log_dir: Path, token_file: Path | None) -> tuple[str | None, Any]:
    """The admin token to send: none with a password (authentication on), else the variable's, else the file's.

    Returns ``(token, missing)``: ``missing`` is the one-line error (a
    ``typer.BadParameter``) to raise if the gateway asks for the token and
    the log folder's file was not found; the gateway is asked first, so an
    unreachable one is still named by ``--url``. A ``--admin-token-file``
    that cannot be read is exit 2 at once.
    """
    from sloctl.serving.gateway.auth import ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE, read_admin_token

    if password_env is not None:
        return None, None
    value = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if value:
        return value, None
    path = token_file if token_file is not None else log_dir / ADMIN_TOKEN_FILE
    try:
        return read_admin_token(path), None
    except ValueError as exc:
        if token_file is not None:  # a file named on the command line: say so now
            raise typer.BadParameter(str(exc), param_hint="--admin-token-file") from None
        return None, typer.BadParameter(str(exc), param_hint="--log-dir")


def _call(method: str, url: str, path: str, user: str, password_env: str | None, body: Any = None,
          token: tuple[str | None, Any] = (None, None)) -> Any:
    """One admin API call (``token``: what :func:`_admin_token` found); an error answer or an unreachable gateway
    is exit 2 with the gateway's words, a token asked for and not found exit 2 naming where it was looked for."""
    import httpx

    from sloctl.serving.gateway.auth import ADMIN_TOKEN_HEADER

    auth = None
    if password_env is not None:
        password = os.environ.get(password_env)
        if password is None:
            raise typer.BadParameter(f"the environment variable {password_env} is not set", param_hint="--password-env")
        auth = (user, password)
    try:
        answer = httpx.request(method, url.rstrip("/") + path, json=body, auth=auth, timeout=30.0,
                               headers={"X-Trino-User": user, **({ADMIN_TOKEN_HEADER: token[0]} if token[0] else {})})
    except httpx.HTTPError as exc:
        raise typer.BadParameter(f"cannot reach the gateway at {url} ({exc})", param_hint="--url") from None
    if answer.status_code == 401 and token[1] is not None:
        raise token[1]
    if answer.status_code >= 400:
        try:
            message = answer.json().get("error") or answer.text
        except ValueError:
            message = answer.text
        raise typer.BadParameter(f"the gateway answered {answer.status_code}: {message}", param_hint="--url")
    return answer.json()


def _show(rows: list[dict[str, Any]]) -> str:
    header = ("NAME", "KIND", "SIZE", "GROUP", "STATE", "RUNNING", "URL")
    lines = [header] + [(str(b["name"]), str(b["kind"]), str(b["size"]), str(b["group"]), str(b["state"]),
                         str(b["running"]), str(b.get("url") or "-")) for b in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def backends_list(url: Url = "http://127.0.0.1:8081", user: User = "admin", password_env: PasswordEnv = None,
                  log_dir: AdminLogDir = Path("gateway-logs"), admin_token_file: TokenFile = None,
                  as_json: AsJson = False) -> None:
    """The running gateway's backends: kind, size, group, state (active, unhealthy, draining, drained), running."""
    token = _admin_token(password_env, log_dir, admin_token_file)
    rows = _call("GET", url, "/v1/gateway/backends", user, password_env, token=token)
    typer.echo(json.dumps(rows) if as_json else _show(rows))


def backends_add(
    name: str = typer.Argument(..., help="The backend's cluster id."),
    kind: str = typer.Option(..., "--kind", help="duckdb, trino or postgresql."),
    backend_url: str | None = typer.Option(None, "--backend-url", help="The engine's address: http(s)://host:port "
                                           "(trino) or postgresql://... (postgresql)."),
    size: int = typer.Option(1, "--size", help="The size the router and the bill count it as."),
    group: str = typer.Option("default", "--group", help="Its routing group."),
    url: Url = "http://127.0.0.1:8081", user: User = "admin", password_env: PasswordEnv = None,
    log_dir: AdminLogDir = Path("gateway-logs"), admin_token_file: TokenFile = None, as_json: AsJson = False,
) -> None:
    """Add a backend to the running gateway (or re-activate a drained one); it takes queries once ready.

    Its URL must be in the gateway's allow-list (``allowed_urls:`` of its backends file).
    """
    from sloctl.serving.gateway.backends import backend_from_doc

    token = _admin_token(password_env, log_dir, admin_token_file)
    doc = {"name": name, "kind": kind, "size": size, "url": backend_url, "group": group}
    try:
        backend_from_doc(doc)  # refuse here, naming the option, before asking the gateway
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    row = _call("POST", url, "/v1/gateway/backends", user, password_env, doc, token=token)
    typer.echo(json.dumps(row) if as_json else _show([row]))


def backends_drain(name: str = typer.Argument(..., help="The backend's cluster id."),
                   url: Url = "http://127.0.0.1:8081", user: User = "admin", password_env: PasswordEnv = None,
                   log_dir: AdminLogDir = Path("gateway-logs"), admin_token_file: TokenFile = None,
                   as_json: AsJson = False) -> None:
    """Stop placing queries on a backend; it is drained once what runs there has ended."""
    token = _admin_token(password_env, log_dir, admin_token_file)
    row = _call("POST", url, f"/v1/gateway/backends/{name}/drain", user, password_env, token=token)
    typer.echo(json.dumps(row) if as_json else _show([row]))


def backends_remove(name: str = typer.Argument(..., help="The backend's cluster id."),
                    url: Url = "http://127.0.0.1:8081", user: User = "admin", password_env: PasswordEnv = None,
                    log_dir: AdminLogDir = Path("gateway-logs"), admin_token_file: TokenFile = None,
                    as_json: AsJson = False) -> None:
    """Drain a backend, then forget it."""
    token = _admin_token(password_env, log_dir, admin_token_file)
    row = _call("DELETE", url, f"/v1/gateway/backends/{name}", user, password_env, token=token)
    typer.echo(json.dumps(row) if as_json else f"{name}: {row.get('state')} (removed once nothing runs there)")


def history_cmd(
    log_dir: Path | None = typer.Option(None, "--log-dir", help="The gateway's log folder: read "
                                        "LOG_DIR/history.sqlite (the default store)."),
    history_url: str | None = typer.Option(None, "--history-url", help="The history's database "
                                           "(sqlite:///PATH or postgresql://...)."),
    url: str | None = typer.Option(None, "--url", help="Ask a running gateway instead (GET /v1/query)."),
    for_user: str | None = typer.Option(None, "--for-user", help="Only this user's queries."),
    state: str | None = typer.Option(None, "--state", help="Only queries in this state (QUEUED, RUNNING, "
                                     "FINISHED, FAILED)."),
    limit: int = typer.Option(50, "--limit", help="The most queries shown (newest first)."),
    user: User = "admin", password_env: PasswordEnv = None, as_json: AsJson = False,
) -> None:
    """The gateway's query history: each query, its state, and every attempt with its backend."""
    if sum(x is not None for x in (log_dir, history_url, url)) != 1:
        raise typer.BadParameter("give exactly one of --log-dir, --history-url or --url", param_hint="--log-dir")
    if not 1 <= limit <= 10_000:
        raise typer.BadParameter(f"must be in 1..10000; got {limit}", param_hint="--limit")
    if url is not None:
        path = f"/v1/query?limit={limit}" + (f"&state={state}" if state else "")
        rows = _call("GET", url, path, user, password_env)
        if for_user is not None:
            rows = [r for r in rows if r.get("user") == for_user]
        if as_json:
            typer.echo(json.dumps(rows))
        else:
            for r in rows:
                typer.echo(f"{r['queryId']}  {r.get('user') or '-'}  {r.get('queryClass') or '-'}  {r['state']}  "
                           f"{r.get('elapsedTimeMillis')} ms  {r.get('attempts')} attempt(s)")
            if not rows:
                typer.echo("no queries")
        return
    from sloctl.serving.gateway.history import QueryHistory, format_history

    if log_dir is not None and not (log_dir / "history.sqlite").is_file():
        raise typer.BadParameter(f"no history in {log_dir} (history.sqlite is missing)", param_hint="--log-dir")
    try:
        store = QueryHistory(history_url, path_default=None if log_dir is None else log_dir / "history.sqlite")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--history-url") from None
    try:
        rows = store.list_queries(user=for_user, state=state.upper() if state else None, limit=limit)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--state") from None
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps(rows, default=str))
    else:
        typer.echo(format_history(rows))
        echo(f"{len(rows)} quer{'y' if len(rows) == 1 else 'ies'} (newest first)")


def add_gateway_admin(gateway_app: typer.Typer) -> None:
    """``backends list|add|drain|remove`` and ``history`` under ``sloctl gateway``."""
    backends = typer.Typer(help="A running gateway's backends (its admin API).", no_args_is_help=True)
    backends.command("list")(backends_list)
    backends.command("add")(backends_add)
    backends.command("drain")(backends_drain)
    backends.command("remove")(backends_remove)
    gateway_app.add_typer(backends, name="backends")
    gateway_app.command("history")(history_cmd)
