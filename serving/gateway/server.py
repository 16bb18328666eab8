"""``sloctl gateway``'s HTTP server: uvicorn that drains the gateway on SIGTERM before it stops.

uvicorn stops accepting and exits on the first SIGTERM or SIGINT, then
raises the signal again, so the process dies before the caller's ``finally``
runs: no final log flush, running queries cut. :class:`DrainingServer`
instead, on the first signal, lets the gateway drain
(:meth:`~sloctl.serving.gateway.Gateway.drain`: new statements refused with
``SERVER_SHUTTING_DOWN``, running ones finished within the grace period,
the rest cancelled) while it keeps serving result pages, then stops, and
returns normally, so the caller closes the gateway and flushes its log. A
second signal stops at once.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import uvicorn

__all__ = ["DrainingServer", "run_gateway"]


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit signal drains ``gateway`` first.

    Args:
        config: the ``uvicorn.Config``.
        gateway: a started :class:`~sloctl.serving.gateway.Gateway`.
        grace_s: how long running queries may take to finish (``None``: the gateway's ``drain_grace_s``).
        log: where the drain is reported (default: stderr).
    """

    def __init__(self, config: uvicorn.Config, gateway: Any, grace_s: float | None = None, log: Any = None) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.grace_s = grace_s
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.drained: dict[str, int] | None = None
        self._draining = False

    def handle_exit(self, sig: int, frame: Any) -> None:  # uvicorn's signal handler
        if self._draining:  # a second signal: stop now
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        threading.Thread(target=self._drain, name="sloctl-gateway-drain", daemon=True).start()

    def _drain(self) -> None:
        grace = self.gateway.options.drain_grace_s if self.grace_s is None else self.grace_s
        self.log(f"sloctl gateway: draining (new statements refused; running queries get {grace:g} s)")
        try:
            self.drained = self.gateway.drain(grace)
            self.log(f"sloctl gateway: drained ({self.drained['finished']} finished, "
                     f"{self.drained['cancelled']} cancelled)")
        finally:
            self.should_exit = True


def run_gateway(database: Any, options: Any, *, templates: Any, auth: Any, sock: Any, host: str, port: int,
                server_options: dict[str, Any], announce: Any = None) -> None:
    """What ``sloctl gateway`` runs: start the clusters, serve the Trino protocol on ``sock``, drain, close.

    Args:
        database: the DuckDB file the clusters serve.
        options: :class:`~sloctl.serving.gateway.GatewayOptions`.
        templates: the template table (``None``: the model bundle's).
        auth: :class:`~sloctl.serving.gateway.auth.GatewayAuth`.
        sock: a bound listening socket.
        server_options: uvicorn options (TLS files, the slow-client guard).
        announce: ``announce(status)`` once the gateway is up, before it serves.
    Returns when a signal has drained the gateway; its log is flushed and its clusters stopped.

    With authentication off, a new admin token is written to
    ``LOG_DIR/admin.token`` (mode 0600) before the gateway serves; the state
    ``announce`` gets names the file (``admin_token_file``).
    """
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.gateway.auth import admin_token
    from sloctl.serving.gateway.gateway import Gateway

    gateway = Gateway(database, options, templates=templates).start()
    try:
        token_file = None if auth.enabled else str(admin_token(options.log_dir, renew=True).path)
        if announce is not None:
            announce({**gateway.status(), **({"admin_token_file": token_file} if token_file else {})})
        config = uvicorn.Config(create_gateway_app(gateway, auth), host=host, port=port, log_level="warning",
                                **server_options)
        DrainingServer(config, gateway).run(sockets=[sock])
    finally:
        gateway.close()
