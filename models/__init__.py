"""Latency models: Stage (isolated latency), Iconq+ (AutoSLO §4), and Q-error.

torch and lightgbm load on first use of the names below, so importing this
package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "IconqConfig",
    "IconqNet",
    "IncrementalIconq",
    "LatencyPredictor",
    "StageConfig",
    "StageModel",
    "VARIANTS",
    "q_error",
    "q_error_summary",
    "qerror_loss",
]

_WHERE = {
    "IconqConfig": "iconq",
    "IconqNet": "iconq",
    "IncrementalIconq": "iconq",
    "qerror_loss": "iconq",
    "LatencyPredictor": "predictor",
    "VARIANTS": "predictor",
    "StageConfig": "stage",
    "StageModel": "stage",
    "q_error": "metrics",
    "q_error_summary": "metrics",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"sloctl.models.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'sloctl.models' has no attribute {name!r}")
