"""``sloctl serve``: the controller runtime, one front door over :class:`~sloctl.serving.controller.Controller`.

Modules: :mod:`~sloctl.serving.runtime.runtime` (the state behind the HTTP
resources: routed pool, durable state, replicas, leases),
:mod:`~sloctl.serving.runtime.app` (the FastAPI app, one router per resource),
:mod:`~sloctl.serving.runtime.state` and
:mod:`~sloctl.serving.runtime.state_redis` (durable state),
:mod:`~sloctl.serving.runtime.execution` (the Policy Tuner's plan enacted),
:mod:`~sloctl.serving.runtime.admission` (Svalinn in front of an ASGI app),
:mod:`~sloctl.serving.runtime.envoy` and
:mod:`~sloctl.serving.runtime.retry_sync` (retry budgets for Envoy sidecars).
It never imports :mod:`sloctl.serving.gateway` (``tools/check_layers.py``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Runtime", "RequestRefused"]


def __getattr__(name: str) -> Any:
    """The door's names on first use: importing a sibling module does not load the whole door."""
    if name in __all__:
        import importlib

        return getattr(importlib.import_module("sloctl.serving.runtime.runtime"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
