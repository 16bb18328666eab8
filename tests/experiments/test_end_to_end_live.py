"""AutoSLO end to end, live (issue 17, part 4): real clusters mirror the runtime's, which enacts the plan.

The fast tests drive the real :class:`~sloctl.serving.runtime.Runtime` on a
fake clock with a fake registry (as tests/serving/test_execution_plan.py
does) and a fake cluster pool; the slow one starts ``sloctl serve`` and runs
a few SF 0.01 queries on DuckDB clusters.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from sloctl.config import load_config
from sloctl.control.autoscaler import AutoscalerConfig
from sloctl.control.policies import ExecutionPlan
from sloctl.control.router import Query
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinup
from sloctl.datasets.pool import ClusterInfo
from sloctl.experiments.end_to_end_live import (
    ClusterMirror,
    LiveEndToEndConfig,
    RuntimeLog,
    best_baseline,
    scale_plan,
    scaled_queries,
)
from sloctl.serving.controller import ModelSlot
from sloctl.serving.runtime import Runtime

EXECUTION = "models:/execution-config@champion"
T0 = dt.datetime(2024, 3, 4, 9, tzinfo=dt.UTC).timestamp()


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakePool:
    """Records starts and stops; a started cluster is ready at once."""

    def __init__(self) -> None:
        self.states: dict[str, tuple[int, str]] = {}
        self.calls: list[tuple[str, str]] = []

    def spin_up(self, size: int, *, cluster_id: str | None = None) -> str:
        self.states[cluster_id] = (size, "ready")
        self.calls.append(("start", cluster_id))
        return cluster_id

    def tear_down(self, cluster_id: str) -> None:
        self.states[cluster_id] = (self.states[cluster_id][0], "stopped")
        self.calls.append(("stop", cluster_id))

    def clusters(self) -> list[ClusterInfo]:
        return [ClusterInfo(cid, size, (), state, 0.0, None, 0, False) for cid, (size, state) in self.states.items()]


@pytest.fixture
def runtime_with_plan(tmp_path, monkeypatch):
    """A runtime whose execution-config starts one size-1 cluster and spins up a vertical size 2 at 1.5 s."""
    plan = ExecutionPlan(ExecutionConfig(spinups=(ScheduledSpinup(1.5, 2, "vertical"),), start_sizes=(1,)),
                         target_date="2024-03-04", time_scale={"hour_s": 10.0})

    def refresh(slot: ModelSlot) -> bool:
        if slot.uri != EXECUTION or slot.version == "1":
            slot.error = None if slot.uri == EXECUTION else f"no model at {slot.uri}"
            return False
        slot.value, slot.version, slot.error = plan, "1", None
        return True

    monkeypatch.setattr(ModelSlot, "refresh", refresh)
    base = load_config()
    cfg = dataclasses.replace(base, serve=dataclasses.replace(
        base.serve, state_db=str(tmp_path / "state.db"), cluster_sizes=(1,), plan_epoch="load",
        plan_clock="compressed", spinup_delay_s=0.5))
    clock = FakeClock(T0)
    rt = Runtime(cfg, None, cfg.serve.state_db, clock=clock).start()
    yield rt, clock
    rt.close()


def test_the_mirror_starts_the_runtime_scheduled_spinup_and_stops_the_cluster_it_retired(runtime_with_plan):
    rt, clock = runtime_with_plan
    pool, running = FakePool(), {}
    mirror = ClusterMirror(pool, lambda: clock.t - T0)
    log = RuntimeLog()

    def sync() -> None:
        view = rt.clusters_view()
        log.add_clusters_view(view)
        mirror.sync(view, lambda cid: running.get(cid, 0))

    sync()
    assert pool.calls == [("start", "plan-c0-s1")]  # the plan's starting cluster, not the config's c0
    clock.t = T0 + 1.0
    sync()
    assert pool.calls == [("start", "plan-c0-s1")]  # nothing due yet
    clock.t = T0 + 1.6
    assert rt.route(1, "t", 5.0)["cluster_id"] == "plan-c0-s1"  # serves until the new one is ready
    running["plan-c0-s1"] = 1
    sync()
    assert pool.calls[-1] == ("start", "plan-1-s2") and pool.states["plan-1-s2"][0] == 2
    assert mirror.log[-1]["runtime_state"] == "starting"  # started while the runtime still waits its δ
    clock.t = T0 + 2.2
    assert rt.route(2, "t", 5.0)["cluster_id"] == "plan-1-s2"
    sync()
    assert ("stop", "plan-c0-s1") not in pool.calls  # retired but still running query 1
    rt.complete(1, 0.5, "ok")
    running["plan-c0-s1"] = 0
    sync()
    assert pool.calls[-1] == ("stop", "plan-c0-s1") and set(mirror.live) == {"plan-1-s2"}
    assert [e["event"] for e in mirror.log] == ["start", "start", "stop"]
    spin_ups = [e for e in log.events if e["event"] == "spin_up"]
    assert [(e["cluster_id"], e["origin"]) for e in spin_ups] == [("plan-1-s2", "schedule")]
    log.add_execution_view(rt.execution_view())
    log.add_execution_view(rt.execution_view())  # polled twice: logged once
    assert [(e["cluster_id"], e["size"], e["mode"]) for e in log.enacted] == [("plan-1-s2", 2, "vertical")]


def test_a_busy_cluster_the_runtime_dropped_is_stopped_only_once_drained():
    pool, busy = FakePool(), {"a": 2}
    mirror = ClusterMirror(pool, lambda: 0.0)
    mirror.sync({"clusters": [{"cluster_id": "a", "size": 1}], "starting": [{"cluster_id": "b", "size": 2}]},
                lambda cid: busy.get(cid, 0))
    assert pool.calls == [("start", "a"), ("start", "b")]
    mirror.sync({"clusters": [{"cluster_id": "b", "size": 2}]}, lambda cid: busy.get(cid, 0))
    assert ("stop", "a") not in pool.calls and mirror.stopping == {"a"}
    busy["a"] = 0
    mirror.stop_drained(lambda cid: busy.get(cid, 0))
    assert pool.calls[-1] == ("stop", "a") and mirror.state("a") == "stopped" and mirror.live == {"b": 2}


def test_the_best_baseline_is_the_cheapest_meeting_tau_else_the_lowest_vr():
    results = {"autoslo": {"vr": 0.0, "cost": 1.0, "meets_tau": True},
               "fixed-peak": {"vr": 0.05, "cost": 9.0, "meets_tau": True},
               "queue@tuned": {"vr": 0.08, "cost": 4.0, "meets_tau": True},
               "rais-balanced": {"vr": 0.3, "cost": 2.0, "meets_tau": False}}
    assert best_baseline(results) == "queue@tuned"
    missing = {k: {**v, "meets_tau": False} for k, v in results.items()}
    assert best_baseline(missing) == "fixed-peak"
    with pytest.raises(ValueError, match="baseline beside autoslo"):
        best_baseline({"autoslo": results["autoslo"]})


def test_the_plan_and_the_arrivals_are_scaled_together_and_the_slos_are_not():
    plan = ExecutionConfig(spinups=(ScheduledSpinup(100.0, 2),), start_sizes=(1, 2),
                           autoscaler=AutoscalerConfig(window_s=20.0, t_idle_s=50.0, t_min_lifetime_s=200.0,
                                                       spinup_delay_s=10.0))
    live = scale_plan(plan, None, 0.5, 3.0)
    assert live.spinups[0].time_s == 50.0 and live.start_sizes == (1, 2)
    assert (live.autoscaler.window_s, live.autoscaler.t_idle_s, live.autoscaler.t_min_lifetime_s) == (10.0, 25.0,
                                                                                                    100.0)
    assert live.autoscaler.spinup_delay_s == 3.0  # the live δ, as given
    (q,) = scaled_queries([Query(0, "t", 8.0, 2.5)], 0.5)
    assert (q.arrival_s, q.slo_s) == (4.0, 2.5)
    with pytest.raises(ValueError, match="'time_scale' parameter of LiveEndToEndConfig must be > 0"):
        LiveEndToEndConfig(time_scale=0.0).validate()


@pytest.mark.slow  # 30-80 s: registers a model and a plan in MLflow, starts `sloctl serve`, runs DuckDB clusters
def test_a_tiny_live_run_through_sloctl_serve_enacts_the_scheduled_spinup(tpch_db, sim_log, tmp_path, monkeypatch):
    """The vertical spin-up 1.5 s in: enacted by the runtime, mirrored by a real cluster, the old one stopped."""
    import numpy as np

    from sloctl.datasets.querylog import validate_log
    from sloctl.experiments.end_to_end_live import run_autoslo_through_runtime
    from sloctl.registry.bundles import save_predictor
    from sloctl.training.pipeline import train_iconq

    # the runtime routes with an Iconq+ model whose table names the TPC-H templates run here
    names = {f"t{i:02d}": f"tpch-q{i + 1:02d}" for i in range(12)}
    log = sim_log.assign(template=sim_log["template"].map(names))
    cfg = load_config()
    model = train_iconq(validate_log(log, source="renamed synthetic log"), cfg.stage,
                        dataclasses.replace(cfg.iconq, max_epochs=1)).predictor
    bundle = save_predictor(model, tmp_path / "iconq")
    rng = np.random.default_rng(0)
    queries = [Query(i, ("tpch-q01", "tpch-q06")[i % 2], float(t), 5.0)
               for i, t in enumerate(np.sort(rng.uniform(0.0, 4.0, 12)))]
    plan = ExecutionConfig(spinups=(ScheduledSpinup(1.5, 1, "vertical"),), start_sizes=(1,))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where the user stands: the temporary store leaves nothing there
    out = run_autoslo_through_runtime(tpch_db, queries, plan, model_dir=bundle, day="2024-03-04",
                                      time_scale_doc={"hour_s": 1.0}, minimum_s=1.0, spinup_delay_s=0.8,
                                      router={}, pool_options=None, cfg=LiveEndToEndConfig(start_margin_s=0.3))
    assert [(e["cluster_id"], e["mode"]) for e in out["enacted"]] == [("plan-1-s1", "vertical")]
    assert any(e["event"] == "spin_up" and e["cluster_id"] == "plan-1-s1" and e["origin"] == "schedule"
               for e in out["runtime_events"])
    real = [(e["event"], e["cluster_id"]) for e in out["log"]]
    assert real[:2] == [("start", "plan-c0-s1"), ("start", "plan-1-s1")] and ("stop", "plan-c0-s1") in real
    assert len(out["queries"]) == 12 and {r["status"] for r in out["queries"]} == {"ok"}
    assert {r["cluster_id"] for r in out["queries"] if r["arrival_s"] > 3.0} == {"plan-1-s1"}
    assert 0.0 <= out["vr"] <= 1.0 and out["cost"] > 0 and out["runtime"]["completed"] == 12
    assert out["in_force"]["plan_clock"] == "compressed" and out["missed"] == []
    assert list((tmp_path / "cwd").iterdir()) == []


def test_cli_refuses_a_live_kappa_the_simulation_does_not_run_before_simulating(tmp_path, run_sloctl):
    common = ("experiment", "end-to-end", "--train-log", tmp_path / "a.parquet", "--grade-log", tmp_path / "b.parquet",
              "--live", "--plots", "")
    proc = run_sloctl(*common, "--live-kappa", "3", timeout_s=60)
    assert proc.returncode == 2 and "--live-kappa" in proc.stderr and "(2, 4)" in proc.stderr
    proc = run_sloctl(*common, "--live-time-scale", "0", timeout_s=60)
    assert proc.returncode == 2 and "--live-time-scale" in proc.stderr


class CappedPool(FakePool):
    """A FakePool whose cluster core holds ``units`` size units and refuses more, as DuckDBClusterPool does."""

    def __init__(self, units: int) -> None:
        super().__init__()
        self.units = units

    def spin_up(self, size: int, *, cluster_id: str | None = None) -> str:
        from sloctl.core.errors import ClusterPoolError

        held = sum(s for s, state in self.states.values() if state == "ready")
        if held + size > self.units:
            raise ClusterPoolError(f"a size-{size} cluster does not fit beside {held} units")
        return super().spin_up(size, cluster_id=cluster_id)


def test_a_start_waits_for_the_cores_a_draining_cluster_still_holds():
    pool, busy = CappedPool(4), {"a": 1}
    mirror = ClusterMirror(pool, lambda: 0.0)
    mirror.sync({"clusters": [{"cluster_id": "a", "size": 4}]}, lambda cid: busy.get(cid, 0))
    # the runtime let "a" go (busy: it drains) and added "b": the core is still full
    mirror.sync({"clusters": [{"cluster_id": "b", "size": 2}]}, lambda cid: busy.get(cid, 0))
    assert pool.calls == [("start", "a")] and mirror.deferred == {"b"} and mirror.state("b") is None
    assert mirror.log[-1]["event"] == "deferred" and mirror.log[-1]["draining"] == ["a"]
    busy["a"] = 0
    mirror.sync({"clusters": [{"cluster_id": "b", "size": 2}]}, lambda cid: busy.get(cid, 0))
    assert pool.calls == [("start", "a"), ("stop", "a"), ("start", "b")] and mirror.deferred == set()
    with pytest.raises(Exception, match="does not fit"):  # nothing drains: a start that cannot fit is an error
        mirror.sync({"clusters": [{"cluster_id": "b", "size": 2}, {"cluster_id": "c", "size": 4}]}, lambda cid: 0)


def test_the_cluster_cores_units(monkeypatch):
    from sloctl.experiments.end_to_end_live import cluster_core_units

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert cluster_core_units({"size_unit_cores": 0.25, "reserved_cores": 1}) == 4
    assert cluster_core_units({"size_unit_cores": 0.5, "reserved_cores": 0}) == 4
    assert cluster_core_units(None) == 2  # pinned: a size-N cluster takes N whole cores
    with pytest.raises(ValueError, match="No core is left"):
        cluster_core_units({"size_unit_cores": 0.25, "reserved_cores": 2})


def test_cli_refuses_more_units_than_the_cluster_cores_give_before_simulating(tmp_path, run_sloctl):
    proc = run_sloctl("experiment", "end-to-end", "--train-log", tmp_path / "a.parquet", "--grade-log",
                      tmp_path / "b.parquet", "--live", "--plots", "", "--max-units", "4096", timeout_s=60)
    assert proc.returncode == 2 and "--max-units" in proc.stderr and "must fit the cluster cores" in proc.stderr
