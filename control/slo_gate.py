"""The SLO gate: admit a query now, defer it, or shed it, from a predicted miss of its SLO.

The gateway's admission rule, as a policy a simulator can drive (no
threads, no HTTP, no clock of its own):

* a query is **admitted** when some ready cluster is predicted to finish it
  within what is left of its SLO (:func:`predicted_to_meet`), or when there
  is nothing to predict from (no latency model, no SLO, a template the model
  does not know);
* otherwise its class decides: a class that does not defer **forces** it
  through; one that does **defers** it in the class's queue, or **sheds** it
  when that queue is full (``queue_limit``);
* a deferred query is shed once it has waited ``max_defer_s``; the others
  are released, one at a time, as soon as one is predicted to meet its SLO:
  classes by priority, then by fewest releases per unit of share, within a
  class in arrival order (:meth:`SloGate.release`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sloctl.core.kinds import RouterKind

__all__ = ["GateClass", "SloGate", "Waiting", "predicted_to_meet"]

Verdict = Literal["admit", "force", "defer", "shed"]


@dataclass(frozen=True)
class GateClass:
    """What the gate needs to know of a priority class.

    Attributes:
        defer: whether a query predicted to miss waits (else it is forced through).
        queue_limit: deferred queries the class holds at most.
        max_defer_s: seconds a deferred query waits at most before it is shed.
        priority: higher classes are released first.
        share: the class's share of releases among classes of one priority.
    """

    defer: bool = True
    queue_limit: int = 100
    max_defer_s: float = 30.0
    priority: int = 0
    share: float = 1.0


class Waiting(Protocol):
    """A query the gate holds: when it was submitted."""

    submitted_s: float


def predicted_to_meet(predictor: Any, kind: str, template: str, left_s: float, clusters: Mapping[str, int],
                      now_s: float, slo_margin: float = 0.0) -> bool:
    """Whether some cluster of ``clusters`` is predicted to finish ``template`` within ``left_s`` seconds.

    Args:
        predictor: an online predictor (:class:`~sloctl.models.online.OnlinePredictor`).
        kind: ``iconq`` (concurrency-aware counterfactuals with the running
            queries, within ``(1 - slo_margin) * left_s``) or ``stage``
            (isolated latency per size, within ``left_s``).
        template: the query's template.
        left_s: what is left of its SLO.
        clusters: ready cluster id -> size; none ready: ``False``.
        now_s: the predictor's clock.
        slo_margin: the router's calibrated SLO margin.
    """
    if not clusters:
        return False
    if kind == RouterKind.ICONQ:
        options = predictor.counterfactuals(template, now_s, dict(clusters), now_s)
        return min(float(cf.query_s) for cf in options.values()) <= (1.0 - slo_margin) * left_s
    return min(float(predictor.isolated_s(template, size)) for size in clusters.values()) <= left_s


class SloGate:
    """Per-class queues of deferred queries, and the rule that admits, defers, sheds and releases them.

    Args:
        names: the classes.
        class_of: ``class_of(name)``: the class's settings now (a
            :class:`GateClass`, or any object with its attributes, such as the
            gateway policy's class; looked up at every decision, so a policy
            swap takes effect at once).
    """

    def __init__(self, names: Iterable[str], class_of: Callable[[str], GateClass]) -> None:
        self.class_of = class_of
        self.deferred: dict[str, deque[Any]] = {name: deque() for name in names}
        self.released: dict[str, int] = dict.fromkeys(self.deferred, 0)

    def on_arrival(self, item: Waiting, klass: str, meets: bool) -> Verdict:
        """The verdict for a new query of ``klass``; ``defer`` puts it in the class's queue.

        Args:
            item: the query (kept in the queue when deferred).
            klass: its class.
            meets: whether it is predicted to meet its SLO now (``True`` when
                there is nothing to predict from).
        """
        if meets:
            return "admit"
        cls = self.class_of(klass)
        if not cls.defer:
            return "force"
        if len(self.deferred[klass]) >= cls.queue_limit:
            return "shed"
        self.deferred[klass].append(item)
        return "defer"

    def expire(self, now_s: float) -> list[tuple[str, Any]]:
        """Remove and return ``(class, query)`` of every deferred query that has waited past ``max_defer_s``."""
        out = []
        for klass, waiting in self.deferred.items():
            limit = self.class_of(klass).max_defer_s
            while waiting and now_s - waiting[0].submitted_s > limit:
                out.append((klass, waiting.popleft()))
        return out

    def release(self, meets: Callable[[Any], bool], place: Callable[[str, Any], None]) -> int:
        """Release deferred queries one at a time while the next in line is predicted to meet its SLO.

        After each release the order is worked out again (placing a query
        changes what the others are predicted to do). Returns how many were
        released.

        Args:
            meets: whether a deferred query is predicted to meet its SLO now.
            place: called with ``(class, query)`` for each one released, before the next is looked at.
        """
        count = 0
        placed = True
        while placed:
            placed = False
            order = sorted((k for k, w in self.deferred.items() if w),
                           key=lambda k: (-self.class_of(k).priority, self.released[k] / self.class_of(k).share))
            for klass in order:
                item = self.deferred[klass][0]
                if meets(item):
                    self.deferred[klass].popleft()
                    self.released[klass] += 1
                    place(klass, item)
                    count += 1
                    placed = True
                    break
        return count

    def remove(self, item: Any) -> bool:
        """Take ``item`` out of its queue (a cancelled query); whether it was there."""
        for waiting in self.deferred.values():
            if item in waiting:
                waiting.remove(item)
                return True
        return False

    def drain(self) -> Iterable[tuple[str, Any]]:
        """Remove and yield every deferred query (shutting down)."""
        for klass, waiting in self.deferred.items():
            while waiting:
                yield klass, waiting.popleft()

    def waiting(self) -> dict[str, int]:
        """Deferred queries per class."""
        return {k: len(v) for k, v in self.deferred.items()}

    def has_waiting(self) -> bool:
        """Whether any query is deferred."""
        return any(self.deferred.values())

