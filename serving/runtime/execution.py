"""The runtime enacts the Policy Tuner's execution-config (AutoSLO §6, §7.3-§7.4).

An :class:`~sloctl.control.policies.ExecutionPlan` holds what SimulateBatch
ran for a target day: the clusters at the start of the day, spin-ups
scheduled at times of the day, and the reactive autoscaler's knobs. The
runtime (:class:`~sloctl.serving.runtime.Runtime`) enacts it on its
:class:`~sloctl.control.managed.ManagedPool` with the control objects the
simulator runs (:class:`~sloctl.control.scheduler.ScheduledSpinups` for the
schedule, :class:`~sloctl.control.autoscaler.Autoscaler` for the knobs);
this module adds what only a live driver needs:

* **Time.** A spin-up's ``time_s`` counts seconds of the Policy Tuner's
  compressed day (an hour lasts ``time_scale.hour_s``).
  :func:`plan_day_start` says when the plan's day starts on the wall clock
  (``serve.plan_epoch``) and :func:`spinup_offset_s` how far into it a
  spin-up falls (``serve.plan_clock``).
* **Clusters.** :class:`LogicalBackend` spins up logical clusters: the
  runtime only advises, and a cluster joins the routed pool once ready,
  one spin-up delay ``δ`` after it was requested.
* **The plan in force.** :class:`PlanEnactor` holds the schedule on the
  runtime clock, applies what is due whenever the runtime looks (each
  route call, each background refresh), keeps the log of scaling events and
  what it enacted, and says what is in force (``GET /v1/execution-config``).

The rules (which clusters start, what a new plan replaces, when clusters go)
are in ``docs/serving.md``, "Enacting the execution-config".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sloctl.control.autoscaler import AutoscalerConfig
from sloctl.control.managed import ManagedPool, ScalingAction
from sloctl.control.policies import ExecutionPlan
from sloctl.control.scheduler import ScheduledSpinup, ScheduledSpinups

__all__ = ["LogicalBackend", "PlanEnactor", "PlanInForce", "check_plan_settings", "iso_time", "plan_day_start",
           "spinup_offset_s"]

#: Events the Prometheus counter ``sloctl_scaling_events`` counts.
COUNTED = ("start", "spin_up", "ready", "tear_down", "retire_others", "refused", "skipped")


def iso_time(wall_s: float) -> str:
    """``wall_s`` (seconds since the Unix epoch) as an ISO-8601 UTC time, to the millisecond."""
    return dt.datetime.fromtimestamp(wall_s, tz=dt.UTC).isoformat(timespec="milliseconds")


def check_plan_settings(serve: Any) -> None:
    """Refuse ``serve.plan_epoch``, ``serve.plan_clock`` or ``serve.spinup_delay_s`` values the runtime cannot use."""
    if serve.plan_epoch not in (None, "load"):
        _parse_epoch(serve.plan_epoch)
    if serve.plan_clock not in ("real", "compressed"):
        raise ValueError(f"The 'serve.plan_clock' setting must be 'real' or 'compressed', got {serve.plan_clock!r}.")
    if not serve.spinup_delay_s > 0:
        raise ValueError(f"The 'serve.spinup_delay_s' setting must be > 0, got {serve.spinup_delay_s!r}.")


def _parse_epoch(value: str) -> float:
    try:
        when = dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"The 'serve.plan_epoch' setting must be null, 'load' or an ISO-8601 date-time, "
                         f"got {value!r}.") from None
    return (when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)).timestamp()


def plan_day_start(plan: ExecutionPlan, *, epoch: str | None, in_force_wall_s: float) -> float:
    """When the plan's day starts, in seconds since the Unix epoch.

    Args:
        plan: the execution-config.
        epoch: ``serve.plan_epoch``: ``None``, midnight UTC of the plan's
            ``target_date`` (of the day ``in_force_wall_s`` falls in when it
            has none); ``"load"``, ``in_force_wall_s``; else an ISO-8601
            date-time (UTC unless it names a zone).
        in_force_wall_s: when the plan came into force.
    """
    if epoch == "load":
        return in_force_wall_s
    if epoch is not None:
        return _parse_epoch(epoch)
    day = (dt.date.fromisoformat(plan.target_date) if plan.target_date
           else dt.datetime.fromtimestamp(in_force_wall_s, tz=dt.UTC).date())
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def spinup_offset_s(plan: ExecutionPlan, time_s: float, *, clock: str) -> float:
    """Seconds from the start of the plan's day to a spin-up at the Policy Tuner's ``time_s``.

    The Policy Tuner simulates a compressed day in which an hour lasts
    ``time_scale.hour_s`` seconds (``sloctl tune policy``: arrivals at real
    second ``t`` of the day are placed at ``t / 3600 × hour_s``). With
    ``clock="real"`` the offset is the real second of the day,
    ``time_s × 3600 / hour_s`` (the document's ``real_time``); with
    ``"compressed"`` it is ``time_s`` itself, for a replay of the compressed
    day. A plan without ``hour_s`` is taken as uncompressed.
    """
    hour_s = plan.time_scale.get("hour_s")
    if clock == "real" and hour_s:
        return time_s * 3600.0 / hour_s
    return time_s


class LogicalBackend:
    """The pool's spin-ups and tear-downs as logical clusters (the runtime only advises).

    A spin-up is named by who asked for it — ``plan-<n>-s<size>`` for a
    scheduled one, ``auto-<n>-s<size>`` for the reactive autoscaler's, ``n``
    counting from 1 — and is ready ``delay_s`` after it was requested. A
    tear-down only takes the cluster out of the pool.

    Args:
        delay_s: ``δ``, request to ready.
        taken: whether an id is in use (a fresh one is picked then).
    """

    def __init__(self, delay_s: float, taken: Callable[[str], bool]) -> None:
        self.delay_s = delay_s
        self.taken = taken
        self.origin = "autoscaler"  # who the next spin-ups are for; the enactor sets it around the schedule's
        self.started: Counter[str] = Counter()

    def spin_up(self, size: int, now_s: float) -> tuple[str, float]:
        prefix = "plan" if self.origin == "schedule" else "auto"
        while True:
            self.started[prefix] += 1
            cluster_id = f"{prefix}-{self.started[prefix]}-s{size}"
            if not self.taken(cluster_id):
                return cluster_id, now_s + self.delay_s

    def tear_down(self, cluster_id: str, now_s: float) -> None:
        return None


@dataclass
class PlanInForce:
    """One execution-config as the runtime enacts it.

    Attributes:
        plan: the document.
        source: ``URI vVERSION``.
        since_wall_s: when it came into force (Unix seconds).
        day_start_wall_s: when its day starts (:func:`plan_day_start`).
        schedule: its spin-ups still to come, on the runtime clock.
        missed: ``(wall time, spin-up)`` of those already past when it came
            into force: never enacted late.
        start_applied: whether its ``start_sizes`` became the pool.
        start_note: why they did not.
        reactive: what the reactive autoscaler does with the knobs (``None``: no knobs).
    """

    plan: ExecutionPlan
    source: str
    since_wall_s: float
    day_start_wall_s: float
    schedule: ScheduledSpinups
    missed: list[tuple[float, ScheduledSpinup]]
    start_applied: bool = False
    start_note: str | None = None
    reactive: str | None = None


class PlanEnactor:
    """Enacts the execution-config in force on the runtime's pool (see the module docstring).

    Every method is called under the runtime's lock, with ``now_s`` on the
    runtime clock (seconds since ``wall0_s``).

    Args:
        serve: the ``serve:`` section (``plan_epoch``, ``plan_clock``, ``spinup_delay_s``).
        pool: the runtime's pool; its backend becomes a :class:`LogicalBackend`.
        wall0_s: the wall time of the runtime clock's zero.
        remove: takes a cluster out of the pool for good (its cost stays in
            the total); called for each tear-down.
        origin: who brought each cluster (``config``, ``operator``, ``plan``,
            ``schedule``, ``autoscaler``), shared with the runtime.
    """

    def __init__(self, serve: Any, pool: ManagedPool, wall0_s: float, *, remove: Callable[[str], None],
                 origin: dict[str, str]) -> None:
        check_plan_settings(serve)
        self.serve = serve
        self.pool = pool
        self.wall0_s = wall0_s
        self.remove = remove
        self.origin = origin
        self.backend = LogicalBackend(serve.spinup_delay_s, lambda cid: cid in pool.clusters)
        pool.backend = self.backend
        self.current: PlanInForce | None = None
        self.enacted: deque[dict[str, Any]] = deque(maxlen=500)
        self.events: deque[dict[str, Any]] = deque(maxlen=200)
        self.counts: Counter[tuple[str, str]] = Counter()
        self._starting: set[str] = set()

    # -- a plan comes into force --------------------------------------------------------
    def take(self, plan: ExecutionPlan, source: str, now_s: float, *, reshape: bool,
             not_reshaped: str | None = None) -> PlanInForce:
        """Put ``plan`` in force now: its schedule replaces the spin-ups still to come.

        Args:
            plan: the new execution-config.
            source: where it came from (``URI vVERSION``).
            now_s: the runtime clock.
            reshape: make its ``start_sizes`` the routed pool.
            not_reshaped: why not, when ``reshape`` is False.
        """
        since = self.wall0_s + now_s
        day_start = plan_day_start(plan, epoch=self.serve.plan_epoch, in_force_wall_s=since)
        knobs = plan.config.autoscaler
        delay_s = knobs.spinup_delay_s if knobs is not None else self.serve.spinup_delay_s
        max_clusters = knobs.max_clusters if knobs is not None else AutoscalerConfig().max_clusters
        max_units = knobs.max_units if knobs is not None else None
        upcoming, missed = [], []
        for spinup in plan.config.spinups:
            at = day_start + spinup_offset_s(plan, spinup.time_s, clock=self.serve.plan_clock)
            if at < since:
                missed.append((at, spinup))
            else:
                upcoming.append(dataclasses.replace(spinup, time_s=at - self.wall0_s))
        schedule = ScheduledSpinups(upcoming, None, spinup_delay_s=delay_s, max_clusters=max_clusters,
                                    max_units=max_units)
        state = PlanInForce(plan, source, since, day_start, schedule, missed, start_applied=reshape,
                            start_note=None if reshape else not_reshaped)
        self.backend.delay_s = delay_s
        self.current = state
        self._log(now_s, "plan", origin="plan", source=source, upcoming=len(upcoming), missed=len(missed))
        if reshape:
            self._reshape(plan.config.start_sizes, now_s)
        return state

    def _reshape(self, sizes: tuple[int, ...], now_s: float) -> None:
        """The plan's starting clusters become the routed pool; the others go (busy ones once they drain)."""
        new = []
        for i, size in enumerate(sizes):
            cid = f"plan-c{i}-s{size}"
            if cid not in self.pool.clusters:
                self.pool.add_cluster(cid, size, spun_up_s=now_s)  # provisioned at the start of the day: ready
                self.origin[cid] = "plan"
                self._log(now_s, "start", origin="plan", cluster_id=cid, size=size)
            new.append(cid)
        for cid in [c for c in self.pool.clusters if c not in new and c not in self.pool.keep]:
            self.pool.clusters[cid].retired = True  # drains, then the sweep in tick() takes it out
        self._sweep(now_s)

    # -- whenever the runtime looks -----------------------------------------------------
    def tick(self, now_s: float) -> None:
        """Apply the scheduled spin-ups now due, note clusters that became ready, take out drained retired ones."""
        for cid in sorted(self._starting):
            cluster = self.pool.clusters.get(cid)
            if cluster is None or cluster.torn_down:
                self._starting.discard(cid)
            elif cluster.is_ready(now_s):
                self._starting.discard(cid)
                self._log(cluster.ready_s, "ready", origin=self.origin.get(cid, "autoscaler"), cluster_id=cid,
                          size=cluster.size)
        if self.current is not None:
            self._due(now_s)
        self._sweep(now_s)

    def _due(self, now_s: float) -> None:
        schedule = self.current.schedule
        requested, skipped = len(schedule.requested), len(schedule.skipped)
        actions = schedule.due(now_s, self.pool.views(now_s))
        for spinup, why in zip(schedule.skipped[skipped:], schedule.skipped_why[skipped:], strict=True):
            limit = (f"the pool holds max_clusters={schedule.config.max_clusters} clusters" if why == "max_clusters"
                     else f"a size-{spinup.size} cluster would take the pool past max_units="
                          f"{schedule.config.max_units} size units")
            self._log(now_s, "skipped", origin="schedule", size=spinup.size, mode=spinup.mode,
                      scheduled_at=iso_time(self.wall0_s + spinup.time_s), why=limit)
        groups: list[list[ScalingAction]] = []
        for action in actions:  # one spin_up (and a vertical one's retire_others) per scheduled spin-up
            if action.kind == "spin_up":
                groups.append([])
            groups[-1].append(action)
        for spinup, group in zip(schedule.requested[requested:], groups, strict=True):
            self.backend.origin = "schedule"
            try:
                self.pool.apply(group, now_s)
            finally:
                self.backend.origin = "autoscaler"
            for event in self.drain(now_s, "schedule"):
                if event["event"] == "spin_up":
                    self.enacted.append({"at": event["at"], "cluster_id": event["cluster_id"], "size": spinup.size,
                                         "mode": spinup.mode, "scheduled_at": iso_time(self.wall0_s + spinup.time_s),
                                         "ready_at": event.get("ready_at"), "source": self.current.source})

    def _sweep(self, now_s: float) -> None:
        """Take out retired clusters once idle, when a cluster that is not retired is ready to take over."""
        if not any(c.is_ready(now_s) and not c.retired and not c.torn_down for c in self.pool.clusters.values()):
            return
        idle = [cid for cid, c in self.pool.clusters.items()
                if c.retired and not c.running and not c.torn_down and cid not in self.pool.keep]
        if idle:
            self.pool.apply([ScalingAction("tear_down", cluster_id=cid) for cid in idle], now_s)
            self.drain(now_s, "plan")

    def drain(self, now_s: float, origin: str) -> list[dict[str, Any]]:
        """Move the pool's new events into the log; a torn-down cluster leaves the pool.

        Args:
            now_s: the runtime clock.
            origin: who decided them (``schedule``, ``autoscaler``, ``plan``).

        Returns:
            The logged events.
        """
        events = list(self.pool.events)
        self.pool.events.clear()  # the runtime's log is bounded; the pool's would grow for as long as it serves
        out = []
        for event in events:
            fields = {k: v for k, v in event.items() if k not in ("t", "event", "ready_s")}
            if "ready_s" in event:
                fields["ready_at"] = iso_time(self.wall0_s + event["ready_s"])
            if event["event"] == "spin_up":
                self.origin[event["cluster_id"]] = origin
                self._starting.add(event["cluster_id"])
            who = self.origin.get(event.get("cluster_id"), origin) if event["event"] == "tear_down" else origin
            out.append(self._log(event.get("t", now_s), event["event"], origin=origin, **fields,
                                 **({"cluster_origin": who} if event["event"] == "tear_down" else {})))
            if event["event"] == "tear_down":
                self.remove(event["cluster_id"])
        return out

    def _log(self, t_s: float, event: str, *, origin: str, **fields: Any) -> dict[str, Any]:
        entry = {"at": iso_time(self.wall0_s + t_s), "t": t_s, "event": event, "origin": origin, **fields}
        self.events.append(entry)
        if event in COUNTED:
            self.counts[(event, origin)] += 1
        return entry

    # -- what is in force ---------------------------------------------------------------
    def starting(self, now_s: float) -> list[dict[str, Any]]:
        """Clusters requested and not ready yet (they are not routed to)."""
        return [{"cluster_id": cid, "size": c.size, "origin": self.origin.get(cid),
                 "ready_at": None if c.ready_s is None else iso_time(self.wall0_s + c.ready_s)}
                for cid, c in self.pool.clusters.items() if not c.torn_down and not c.is_ready(now_s)]

    def view(self) -> dict[str, Any] | None:
        """``source``, ``in_force``, ``next_spinup``, ``enacted``, ``missed`` (``None``: no plan in force)."""
        state = self.current
        if state is None:
            return None
        knobs = state.plan.config.autoscaler
        upcoming = state.schedule.upcoming
        nxt = upcoming[0] if upcoming else None
        return {
            "source": state.source,
            "in_force": {"since": iso_time(state.since_wall_s), "start_sizes": list(state.plan.config.start_sizes),
                         "start_sizes_applied": state.start_applied, "start_sizes_note": state.start_note,
                         "autoscaler": dataclasses.asdict(knobs) if knobs is not None else None,
                         "reactive": state.reactive, "day_start": iso_time(state.day_start_wall_s),
                         "plan_clock": self.serve.plan_clock, "spinup_delay_s": self.backend.delay_s,
                         "max_clusters": state.schedule.config.max_clusters,
                         "max_units": state.schedule.config.max_units, "upcoming": len(upcoming)},
            "next_spinup": None if nxt is None else {"at": iso_time(self.wall0_s + nxt.time_s), "size": nxt.size,
                                                     "mode": nxt.mode},
            "enacted": list(self.enacted),
            "missed": [{"at": iso_time(at), "size": s.size, "mode": s.mode} for at, s in state.missed],
        }
