"""The kinds of latency model and of router, as types rather than strings.

Both are :class:`enum.StrEnum`: a member compares equal to its value and
prints as it (``f"{ModelKind.ICONQ}"`` is ``iconq``), so configs, JSON
reports and MLflow tags keep the words users type.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ModelKind(StrEnum):
    """A latency model: Stage (isolated latency, a tree model) or Iconq+ (concurrency-aware, an LSTM)."""

    STAGE = "stage"
    ICONQ = "iconq"

    @classmethod
    def of(cls, predictor: Any) -> ModelKind:
        """The kind of a loaded model: Iconq+ when it carries a network, else Stage."""
        return cls.ICONQ if getattr(predictor, "net", None) is not None else cls.STAGE


class RouterKind(StrEnum):
    """How queries are placed: by a latency model (Iconq+, Stage + cost) or without one."""

    ICONQ = "iconq"
    STAGE = "stage"
    ROUND_ROBIN = "round-robin"
    LEAST_QUEUED = "least-queued"
    RANDOM = "random"
