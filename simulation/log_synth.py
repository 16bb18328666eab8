"""Query logs of any size from a world calibrated on a real log (``sloctl simulate log``).

A collected log is a few hundred or thousand executions; a warehouse's year
is millions. :func:`simulate_log` writes a log of ``rows`` executions in the
schema of a collected one (docs/querylog.md), drawn from the
:class:`~sloctl.simulation.emulator.WarehouseEmulator` calibrated on a real
log (collected or imported):

* **runs**: the real log's cluster runs are the profiles. Each simulated run
  copies one of them, drawn at random: its workload, cluster size, CPU
  budget, template mix and arrival pattern — one query after the other for
  an isolated run (the real run's median gap between an end and the next
  arrival), a Poisson process at the real run's rate for a concurrent one;
* **service demand**: each execution's isolated latency is drawn from the
  world (``empirical``: one of the real log's isolated executions of the
  template on that size; ``median``: the median with log-normal noise);
* **concurrency**: the run's executions share the cluster by processor
  sharing with the world's interference exponent ``alpha[size]``, exactly
  (an event simulation, so every logged overlap is a real one); where the
  real run queued arrivals (``start_s`` after ``arrival_s``), at most as many
  run at once as it ever ran, the rest wait first in first out;
* **censoring**: with a ``timeout_s``, an execution still running at its
  timeout is stopped there (``status = "timeout"``), and leaves the cluster.

Runs follow each other on one time axis (run ``k + 1`` starts after run
``k``'s last arrival), so a later time slice of the log is later runs: the
split a learning curve needs. Plan features, ``sql_hash`` and ``f_source``
of an execution are those of a real execution of its template.

A model is never graded in the world it was trained in: grade what is
trained on a simulated log on a real one, or on a log simulated from a
different real log.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sloctl.datasets.analysis import overlap_counts
from sloctl.datasets.querylog import COLUMNS

__all__ = ["RunProfile", "run_profiles", "share_cluster", "simulate_log"]

_DEFAULT_GAP_S = 1e-3


@dataclass(frozen=True)
class RunProfile:
    """One cluster run of the real log: what a simulated run copies.

    Attributes:
        workload: the run's workload label (``isolated``, ``base``, ...).
        size: its cluster size.
        cpu_budget: its CPU budget (NaN when the log has none).
        templates: its executions' templates (drawn from, with replacement).
        rows: how many executions it had.
        rate_per_s: arrivals per second of a concurrent run; ``None`` for an
            isolated run (one query after the other).
        gap_s: an isolated run's median gap between an end and the next arrival.
        max_running: the most executions the run had running at once (the
            client's or the engine's admission limit: later arrivals waited
            in a queue, first in first out); ``None``: no limit.
    """

    workload: str
    size: int
    cpu_budget: float
    templates: tuple[str, ...]
    rows: int
    rate_per_s: float | None
    gap_s: float = _DEFAULT_GAP_S
    max_running: int | None = None


def _most_running(start: np.ndarray, end: np.ndarray) -> int:
    """The most executions running at once (``[start, end)`` intervals)."""
    events = np.concatenate([np.stack([start, np.ones(len(start))], 1), np.stack([end, -np.ones(len(end))], 1)])
    events = events[np.lexsort((events[:, 1], events[:, 0]))]  # at a tie, an end frees its slot first
    return int(np.cumsum(events[:, 1]).max()) if len(events) else 0


def run_profiles(log: pd.DataFrame) -> list[RunProfile]:
    """The cluster runs of ``log`` as :class:`RunProfile`\\ s (runs with fewer than 2 executions are left out)."""
    frame = log.assign(_nb=overlap_counts(log).to_numpy())
    has_workload = "workload" in frame.columns
    has_budget = "cpu_budget" in frame.columns
    out = []
    for _, run in frame.groupby("cluster_id", sort=True):
        if len(run) < 2:
            continue
        run = run.sort_values(["arrival_s", "query_id"])
        arrival = run["arrival_s"].to_numpy(float)
        isolated = bool((run["_nb"] == 0).all())
        span = float(arrival[-1] - arrival[0])
        gaps = arrival[1:] - run["end_s"].to_numpy(float)[:-1]
        gap = float(np.median(gaps[gaps >= 0])) if (gaps >= 0).any() else _DEFAULT_GAP_S
        rate = None if isolated or span <= 0 else (len(run) - 1) / span
        queued = bool((run["start_s"].to_numpy(float) - arrival > 1e-3).any())
        most = _most_running(run["start_s"].to_numpy(float), run["end_s"].to_numpy(float))
        out.append(RunProfile(
            workload=str(run["workload"].iloc[0]) if has_workload else ("isolated" if isolated else "concurrent"),
            size=int(run["cluster_size"].iloc[0]),
            cpu_budget=float(run["cpu_budget"].iloc[0]) if has_budget else math.nan,
            templates=tuple(str(t) for t in run["template"]), rows=len(run), rate_per_s=rate,
            gap_s=max(gap, 0.0), max_running=max(most, 1) if queued else None))
    return out


def share_cluster(arrival_s: np.ndarray, service_s: np.ndarray, alpha: float, timeout_s: float | None = None,
                  max_running: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Processor sharing on one cluster: start and end times, and which executions hit ``timeout_s``.

    With ``k`` executions running each advances at ``k ** -alpha``. At most
    ``max_running`` run at once; later arrivals wait, first in first out, and
    start when one leaves. An execution not finished ``timeout_s`` after its
    arrival (waiting included, as its latency is) is stopped then and leaves.
    ``arrival_s`` must be sorted.
    """
    n = len(arrival_s)
    cap = n if max_running is None else int(max_running)
    start = np.empty(n)
    end = np.empty(n)
    timed_out = np.zeros(n, dtype=bool)
    remaining = np.asarray(service_s, float).copy()
    deadline = np.full(n, math.inf) if timeout_s is None else np.asarray(arrival_s, float) + timeout_s
    running: list[int] = []
    waiting: list[int] = []  # arrived, not started (FIFO); a waiting one may time out too
    t, nxt = 0.0, 0
    while nxt < n or running or waiting:
        if running:
            idx = np.fromiter(running, dtype=np.int64, count=len(running))
            rate = len(running) ** -alpha
            rem = remaining[idx]
            i_done = int(np.argmin(rem))
            t_done = t + rem[i_done] / rate
            dl = deadline[idx]
            i_dl = int(np.argmin(dl))
            t_dl = dl[i_dl]
        else:
            t_done = t_dl = math.inf
        t_wait = deadline[waiting[0]] if waiting else math.inf  # FIFO: the head's deadline comes first
        t_arr = arrival_s[nxt] if nxt < n else math.inf
        t_next = min(t_done, t_dl, t_arr, t_wait)
        if running:
            remaining[idx] = rem - (t_next - t) * rate
        t = t_next
        if t_arr <= t_done and t_arr <= t_dl and t_arr <= t_wait:
            if len(running) < cap:
                start[nxt] = t
                running.append(nxt)
            else:
                waiting.append(nxt)
            nxt += 1
            continue
        if t_wait < t_dl and t_wait <= t_done:
            row = waiting.pop(0)
            start[row] = end[row] = t
            timed_out[row] = True
            continue
        row = int(idx[i_dl]) if t_dl <= t_done else int(idx[i_done])
        end[row] = t
        timed_out[row] = t_dl <= t_done
        running.remove(row)
        while waiting and len(running) < cap:
            nxt_row = waiting.pop(0)
            start[nxt_row] = t
            running.append(nxt_row)
    return start, end, timed_out


def simulate_log(log: pd.DataFrame, rows: int, *, seed: int = 0, timeout_s: float | None = None,
                 demand: str = "empirical", world=None,
                 progress: Callable[[int, int, float], None] | None = None) -> pd.DataFrame:
    """A query log of ``rows`` executions drawn from the world of ``log`` (see the module docstring).

    Args:
        log: the real log the world is calibrated on (validated).
        rows: executions to write (>= 1).
        seed: every draw (runs, templates, arrivals, service times) follows it.
        timeout_s: stop executions still running this long after arrival
            (``status = "timeout"``); ``None``: no timeout.
        demand: the world's service demand, ``empirical`` or ``median``
            (:func:`~sloctl.simulation.emulator.calibrate`).
        world: a calibrated :class:`~sloctl.simulation.emulator.WarehouseEmulator`
            to use instead of calibrating one on ``log``.
        progress: called with ``(rows done, rows, elapsed seconds)`` after each run.

    Raises:
        ValueError: ``rows`` < 1, a bad ``timeout_s``, or a log with no run
            the world can simulate.
    """
    from sloctl.simulation.emulator import calibrate

    if isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows < 1:
        raise ValueError(f"The 'rows' parameter of simulate_log must be a whole number >= 1, got {rows!r}.")
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"The 'timeout_s' parameter of simulate_log must be > 0 seconds, got {timeout_s!r}.")
    if world is None:
        world, _ = calibrate(log, seed=seed, demand=demand)
    profiles = []
    for p in run_profiles(log):  # only the templates the world measured on the run's size
        known = tuple(t for t in p.templates if (t, p.size) in world.isolated_s)
        if known and p.size in world.alpha:
            profiles.append(dataclasses.replace(p, templates=known))
    if not profiles:
        raise ValueError("The log has no cluster run of >= 2 executions whose templates the world measured "
                         "isolated on the run's size; collect or import a log with isolated and concurrent runs.")
    feature_cols = [c for c in COLUMNS if c.startswith("f_")]
    ok = log[log["status"] == "ok"]
    by_template = {t: g[["sql_hash", *feature_cols]].reset_index(drop=True) for t, g in log.groupby("template")}
    by_template.update({t: g[["sql_hash", *feature_cols]].reset_index(drop=True) for t, g in ok.groupby("template")})
    rng = np.random.default_rng(seed)
    parts: list[dict[str, np.ndarray]] = []
    done, run, clock = 0, 0, 0.0
    started = time.perf_counter()
    while done < rows:
        p = profiles[int(rng.integers(len(profiles)))]
        n = min(p.rows, rows - done)
        templates = np.asarray(p.templates, dtype=object)[rng.integers(len(p.templates), size=n)]
        service = np.array([world.service_s(t, p.size, rng) for t in templates])
        if p.rate_per_s is None:  # isolated: the next query arrives after the previous one ended
            gaps = np.concatenate([[0.0], np.full(n - 1, p.gap_s)])
            arrival = clock + np.cumsum(gaps + np.concatenate([[0.0], service[:-1]]))
            if timeout_s is not None:
                arrival = clock + np.cumsum(gaps + np.concatenate([[0.0], np.minimum(service[:-1], timeout_s)]))
        else:
            arrival = clock + np.cumsum(np.concatenate([[0.0], rng.exponential(1.0 / p.rate_per_s, size=n - 1)]))
        start, end, timed_out = share_cluster(arrival, service, world.alpha[p.size], timeout_s, p.max_running)
        parts.append({"template": templates, "arrival_s": arrival, "start_s": start, "end_s": end,
                      "timed_out": timed_out,
                      "size": np.full(n, p.size), "cluster": np.full(n, f"sim{run:06d}/size{p.size}", dtype=object),
                      "run": np.full(n, run), "workload": np.full(n, p.workload, dtype=object),
                      "cpu_budget": np.full(n, p.cpu_budget)})
        done += n
        run += 1
        clock = float(arrival[-1]) + 1.0
        if progress is not None:
            progress(done, rows, time.perf_counter() - started)
    cat = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    latency = cat["end_s"] - cat["arrival_s"]
    out = pd.DataFrame({
        "query_id": np.arange(rows, dtype=np.int64), "template": cat["template"].astype(str),
        "sql_hash": "", "cluster_id": cat["cluster"].astype(str), "cluster_size": cat["size"].astype(np.int64),
        "arrival_s": cat["arrival_s"], "start_s": cat["start_s"], "end_s": cat["end_s"], "latency_s": latency,
        "status": np.where(cat["timed_out"], "timeout", "ok"), "slo_s": np.nan, "oversubscribed": False})
    # features of a real execution of the template, drawn per row
    feats = pd.DataFrame(index=out.index, columns=["sql_hash", *feature_cols])
    for t, idx in out.groupby("template").indices.items():
        source = by_template[t]
        pick = rng.integers(len(source), size=len(idx))
        feats.iloc[idx] = source.iloc[pick].to_numpy()
    out["sql_hash"] = feats["sql_hash"].astype(str)
    for c in feature_cols:
        out[c] = feats[c].astype(str) if c == "f_source" else feats[c].astype(float)
    out["cpu_budget"] = cat["cpu_budget"]
    out["error"] = np.where(cat["timed_out"], f"simulated timeout after {timeout_s} s", "")
    out["workload"] = cat["workload"].astype(str)
    out["run"] = cat["run"].astype(np.int64)
    return out
