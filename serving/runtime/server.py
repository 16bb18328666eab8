"""What ``sloctl serve`` runs: the runtime's app on a guarded uvicorn server.

:func:`run_runtime` loads the template table, warns when it is not the log
the models were trained on, checks that shared state is reachable, builds the
app (:func:`~sloctl.serving.runtime.app.create_app`) and serves it with the
slow-client guard of the ``serve:`` section (docs/serving.md, "The front door")
until the process is stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sloctl.serving.runtime.runtime import RuntimeConfig

__all__ = ["run_runtime", "state_location"]


def state_location(cfg: RuntimeConfig) -> str:
    """Where the runtime keeps its state, in words; a shared store is reached first (unreachable: raises)."""
    url = cfg.state.url
    if url and not url.startswith("sqlite:///"):
        from sloctl.serving.runtime.state_redis import connect_redis

        connect_redis(url).close()
        return f"{url}, keys {cfg.state.key_prefix}:*, shared with other replicas"
    return url.removeprefix("sqlite:///") if url else cfg.serve.state_db


def run_runtime(cfg: RuntimeConfig, *, token: str | None, sock: Any, host: str, port: int, templates_log: Any = None,
                say: Callable[[str], None] = print) -> None:
    """Serve the controller runtime on ``sock`` (bound to ``host:port``) until stopped.

    Args:
        cfg: the sloctl config (``serve``, ``state``, ``registry``, ``router`` sections).
        token: the bearer token of mutating endpoints (``None``: open, for local experiments).
        templates_log: the query log of the template table (``None``: ``serve.templates_log``, else the
            model bundle's table).
        say: where notes and warnings go (the CLI's stderr).
    """
    from sloctl.registry.store import log_mismatch
    from sloctl.serving.controller import load_templates_table
    from sloctl.serving.local import guarded_server
    from sloctl.serving.runtime.app import create_app

    log_path = templates_log or cfg.serve.templates_log
    templates = load_templates_table(log_path)
    if templates is None:
        say("no templates_log: the runtime routes with the template table inside the model bundle (models "
            "trained by this sloctl carry one); a model without one routes round-robin until one is configured")
    else:
        for uri in (cfg.serve.model_uri, cfg.serve.fallback_uri):  # provenance: say when the log is not the model's
            why = log_mismatch(uri, log_path, tracking_uri=cfg.registry.tracking_uri)
            if why:
                say(f"warning: {uri}: {why} (templates log {log_path})")
    where = state_location(cfg)  # unreachable shared state: an error before the app starts
    app = create_app(cfg, token=token, templates=templates)
    say(f"sloctl serve on http://{host}:{sock.getsockname()[1]} (state in {where})")
    guarded_server(app, cfg.serve, host=host, port=port).run(sockets=[sock])
