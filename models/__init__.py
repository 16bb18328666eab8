"""Learned models: the Iconq+ latency predictor (AutoSLO, section 4).

torch loads on first use of the names below, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["IconqConfig", "IconqNet", "IncrementalIconq", "qerror_loss"]

_WHERE = {
    "IconqConfig": "iconq",
    "IconqNet": "iconq",
    "IncrementalIconq": "iconq",
    "qerror_loss": "iconq",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"sloctl.models.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'sloctl.models' has no attribute {name!r}")
