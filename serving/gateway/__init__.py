"""``sloctl gateway``: the SLO gateway, one front door over :class:`~sloctl.serving.controller.Controller`.

Modules: :mod:`~sloctl.serving.gateway.gateway` (sessions, queues,
dispatch and retries), :mod:`~sloctl.serving.gateway.app` (the Trino client
REST protocol on FastAPI), :mod:`~sloctl.serving.gateway.trino` (types,
pages, errors), :mod:`~sloctl.serving.gateway.sql` (what a statement may
be), :mod:`~sloctl.serving.gateway.policy` (per-class policy),
:mod:`~sloctl.serving.gateway.auth` (passwords, JWTs, TLS),
:mod:`~sloctl.serving.gateway.log` (the query log) and
:mod:`~sloctl.serving.gateway.server` (uvicorn that drains on SIGTERM).
It never imports :mod:`sloctl.serving.runtime` (``tools/check_layers.py``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ROUTERS", "Gateway", "GatewayOptions", "GatewayQuery"]


def __getattr__(name: str) -> Any:
    """The door's names on first use: importing a sibling module does not load the whole door."""
    if name in __all__:
        import importlib

        return getattr(importlib.import_module("sloctl.serving.gateway.gateway"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
