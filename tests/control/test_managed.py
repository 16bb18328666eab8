"""The managed pool (control/managed.py) and the simulator built on it.

``test_seeded_simulations_are_unchanged`` pins the simulator's seeded output
bit for bit against ``data/managed_golden.json``, written from the simulator
as it was before the route → bill → complete → autoscale step moved into
:class:`~sloctl.control.managed.ManagedPool`.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from sloctl.control.autoscaler import Autoscaler, AutoscalerConfig, QueueTrigger, SpinupTrigger
from sloctl.control.managed import ManagedPool, ScalingAction
from sloctl.control.router import Query, RoundRobinRouter, RouteDecision, StageCostRouter
from sloctl.core.errors import ClusterPoolError
from sloctl.simulation.emulator import WarehouseEmulator
from sloctl.simulation.engine import WarehouseSimulator

GOLDEN = Path(__file__).parent / "data" / "managed_golden.json"


class _Running:
    def __init__(self, query_id, template, cluster_id, size, arrival_s, slo_s, predicted_s):
        self.query_id, self.template, self.cluster_id, self.size = query_id, template, cluster_id, size
        self.arrival_s, self.slo_s, self.predicted_s = arrival_s, slo_s, predicted_s


class TableModel:
    """A tiny deterministic online model: isolated latency × (1 + ½ per query already on the cluster)."""

    def __init__(self, isolated_s: dict[tuple[str, int], float]) -> None:
        self.isolated = isolated_s
        self.running: dict[int, _Running] = {}

    def fork(self) -> TableModel:
        twin = TableModel(self.isolated)
        twin.running = {k: copy.copy(v) for k, v in self.running.items()}
        return twin

    def isolated_s(self, template: str, size: int) -> float:
        return self.isolated[(template, size)]

    def running_on(self, cluster_id: str) -> list[_Running]:
        return [r for r in self.running.values() if r.cluster_id == cluster_id]

    def commit(self, query_id, template, arrival_s, slo_s, cluster_id, size, now_s) -> float:
        predicted = self.isolated[(template, size)] * (1.0 + 0.5 * len(self.running_on(cluster_id)))
        self.running[query_id] = _Running(query_id, template, cluster_id, size, arrival_s, slo_s, predicted)
        return predicted

    def complete(self, query_id: int) -> None:
        self.running.pop(query_id, None)


ISOLATED = {("a", 1): 1.0, ("b", 1): 3.0, ("a", 2): 0.6, ("b", 2): 1.7, ("a", 3): 0.45, ("b", 3): 1.2}


def _world() -> WarehouseEmulator:
    return WarehouseEmulator(isolated_s=dict(ISOLATED), alpha={1: 1.0, 2: 0.8, 3: 0.7}, noise_sigma=0.25)


def _queries(n: int = 160, seed: int = 0, slo_s: float = 5.0) -> list[Query]:
    """A burst (about 2 queries/s) then a lull (one every 8 s): spin-ups, then teardowns."""
    rng = np.random.default_rng(seed)
    gaps = np.concatenate([rng.exponential(0.5, n * 3 // 4), rng.exponential(8.0, n - n * 3 // 4)])
    return [Query(i, "a" if i % 3 else "b", float(t), slo_s) for i, t in enumerate(np.cumsum(gaps))]


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else repr(value)
    return value


def _result(result, autoscaler=None) -> dict:
    out = {"queries": result.queries.to_dict("records"), "cost": result.cost,
           "cost_by_cluster": result.cost_by_cluster, "events": result.events, "cost_marks": result.cost_marks}
    if autoscaler is not None:
        out["decisions"] = [(t, None if o is None else {"size": o.size, "outcomes": o.outcomes},
                             None if a is None else [a.kind, a.size, a.cluster_id])
                            for t, o, a in autoscaler.decisions]
    return _jsonable(out)


def _scaled(mode: str, trigger, *, force_at: int | None = None, teardown: bool = True) -> dict:
    router = StageCostRouter(TableModel(ISOLATED))
    config = AutoscalerConfig(window_s=20.0, t_idle_s=15.0, t_min_lifetime_s=30.0, theta=6, tau_trigger=0.1,
                              mu=8, tau_target=0.05, candidate_sizes=(1, 2, 3), spinup_delay_s=6.0,
                              max_clusters=4)
    autoscaler = Autoscaler(config, trigger, router, StageCostRouter, mode=mode, minimum_s=5.0,
                            price_per_unit_s=0.5, teardown=teardown)
    sim = WarehouseSimulator(_world(), [("c0", 1)], router, price_per_unit_s=0.5, minimum_s=5.0, seed=11,
                             autoscaler=autoscaler, force_scaling_at=force_at, mark_at=(20, 60, 150))
    return _result(sim.run(_queries(slo_s=2.5)), autoscaler)


def scenarios() -> dict[str, dict]:
    """Every pinned scenario's JSON-able result."""
    rr = WarehouseSimulator(_world(), [("c1", 1), ("c2", 2)], RoundRobinRouter(), minimum_s=5.0, seed=7,
                            mark_at=(0, 10, 100)).run(_queries())
    stage = WarehouseSimulator(_world(), [("c1", 1), ("c2", 2), ("c3", 1)], StageCostRouter(TableModel(ISOLATED)),
                               price_per_unit_s=2.0, minimum_s=3.0, seed=3).run(_queries(seed=1))
    return {
        "round_robin": _result(rr),
        "stage_cost": _result(stage),
        "add": _scaled("add", SpinupTrigger(6, 0.1)),
        "add_forced": _scaled("add", None, force_at=30),
        "vertical": _scaled("vertical", None, force_at=40),
        "horizontal": _scaled("horizontal", QueueTrigger(4)),
    }


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True)


def test_seeded_simulations_are_unchanged():
    expected = json.loads(GOLDEN.read_text())
    got = json.loads(_canonical(scenarios()))  # the same JSON round trip the golden file went through
    assert set(got) == set(expected)
    for name in expected:
        assert _canonical(got[name]) == _canonical(expected[name]), f"scenario {name!r} changed"


# -- the pool itself ---------------------------------------------------------------------------------------

class Recording(RoundRobinRouter):
    """Round-robin that remembers which clusters it was offered and which queries completed."""

    def __init__(self, choose: str | None = None) -> None:
        super().__init__()
        self.choose = choose
        self.offered: list[list[str]] = []
        self.completed: list[tuple[int, float]] = []

    def route(self, query, clusters, now_s):
        self.offered.append([c.cluster_id for c in clusters])
        if self.choose is not None:
            return RouteDecision(self.choose, 1.5)
        return super().route(query, clusters, now_s)

    def on_complete(self, query_id, now_s):
        self.completed.append((query_id, now_s))


class Backend:
    def __init__(self, delay_s: float = 2.0, refuse: bool = False) -> None:
        self.delay_s, self.refuse = delay_s, refuse
        self.torn: list[str] = []
        self.n = 0

    def spin_up(self, size, now_s):
        if self.refuse:
            raise ClusterPoolError("no free cores")
        self.n += 1
        return f"new{self.n}", now_s + self.delay_s

    def tear_down(self, cluster_id, now_s):
        self.torn.append(cluster_id)


def pool(router=None, **kwargs) -> ManagedPool:
    managed = ManagedPool(router or Recording(), price_per_unit_s=2.0, minimum_s=10.0, **kwargs)
    managed.add_cluster("a", 1)
    managed.add_cluster("b", 3)
    return managed


def test_billing_starts_on_route_and_stops_on_completion():
    managed = pool(Recording(choose="b"))
    managed.route(Query(1, "t", 0.0, 5.0), 0.0)
    timer = managed.clusters["b"].state.timer
    assert timer.is_running and timer.running_queries == 1 and not managed.clusters["a"].state.timer.is_running
    assert managed.running[1].cluster_id == "b" and managed.running[1].predicted_s == 1.5
    assert managed.views(0.0)[1].running == 1 and managed.clusters["b"].last_routed_s == 0.0
    record = managed.complete(1, 25.0)
    assert record.query.query_id == 1 and managed.running == {} and timer.running_queries == 0
    assert managed.router.completed == [(1, 25.0)]
    # price 2 × size 3 × 25 s (the query outlived the 10 s minimum)
    assert managed.cost_by_cluster(1e6) == {"a": 0.0, "b": 150.0}
    assert managed.total_cost(1e6) == 150.0


def test_a_short_query_is_billed_the_minimum_window():
    managed = pool(Recording(choose="a"))
    managed.route(Query(1, "t", 0.0, 5.0), 0.0)
    managed.complete(1, 1.0)
    assert managed.cost("a", 100.0) == 2.0 * 1 * 10.0


def test_routes_only_onto_ready_clusters_that_are_not_retired_or_torn_down():
    router = Recording()
    managed = pool(router, backend=Backend(delay_s=2.0))
    managed.apply([ScalingAction("spin_up", size=2)], 1.0)
    assert managed.clusters["new1"].ready_s == 3.0
    managed.route(Query(1, "t", 1.0, 5.0), 1.0)
    assert router.offered[-1] == ["a", "b"]  # new1 is still starting
    managed.route(Query(2, "t", 3.0, 5.0), 3.0)
    assert router.offered[-1] == ["a", "b", "new1"]
    managed.apply([ScalingAction("tear_down", cluster_id="a")], 3.0)  # a runs query 1: ignored
    assert not managed.clusters["a"].torn_down
    managed.complete(1, 3.5)
    managed.apply([ScalingAction("tear_down", cluster_id="a")], 4.0)
    assert managed.clusters["a"].torn_down and managed.backend.torn == ["a"]
    managed.route(Query(3, "t", 4.0, 5.0), 4.0)
    assert router.offered[-1] == ["b", "new1"]
    assert [v.cluster_id for v in managed.views(4.0)] == ["b", "new1"]
    assert "a" in managed.cost_by_cluster(1e6)  # a torn-down cluster's bill stays
    assert [e["event"] for e in managed.events] == ["spin_up", "tear_down"]
    assert managed.events[0] == {"t": 1.0, "event": "spin_up", "cluster_id": "new1", "size": 2, "ready_s": 3.0,
                                 "reason": ""}


def test_retired_clusters_serve_only_until_their_replacement_is_ready():
    router = Recording()
    managed = pool(router, backend=Backend(delay_s=2.0))
    managed.apply([ScalingAction("spin_up", size=4), ScalingAction("retire_others")], 0.0)
    assert all(managed.clusters[c].retired for c in ("a", "b")) and not managed.clusters["new1"].retired
    managed.route(Query(1, "t", 1.0, 5.0), 1.0)
    assert router.offered[-1] == ["a", "b"]  # nothing else is ready yet
    managed.route(Query(2, "t", 2.0, 5.0), 2.0)
    assert router.offered[-1] == ["new1"]
    assert [v.ready for v in managed.views(2.0)] == [False, False, True]


def test_a_refused_spin_up_is_recorded_and_retires_nothing():
    managed = pool(backend=Backend(refuse=True))
    managed.apply([ScalingAction("spin_up", size=8), ScalingAction("retire_others")], 5.0)
    assert set(managed.clusters) == {"a", "b"} and not any(c.retired for c in managed.clusters.values())
    assert managed.events == [{"t": 5.0, "event": "refused", "size": 8, "why": "no free cores"}]


def test_clusters_without_a_known_ready_time_wait_for_mark_ready():
    managed = pool(backend=type("B", (Backend,), {"spin_up": lambda self, size, now_s: ("late", None)})())
    managed.apply([ScalingAction("spin_up", size=1)], 0.0)
    assert managed.starting() == ["late"] and "late" not in [c.cluster_id for c in managed.routable(1e9)]
    managed.mark_ready("late", 4.0)
    assert managed.starting() == [] and "late" in [c.cluster_id for c in managed.routable(4.0)]
    assert managed.events[-1] == {"t": 4.0, "event": "ready", "cluster_id": "late"}


def test_scale_runs_the_autoscaler_and_completion_reaches_its_window():
    class Scaler:
        config = AutoscalerConfig(spinup_delay_s=1.0)

        def __init__(self):
            self.seen, self.done = [], []

        def on_arrival(self, query, clusters, now_s=None):
            self.seen.append([c.cluster_id for c in clusters])
            return [ScalingAction("spin_up", size=1)]

        def force(self, now_s, clusters):
            return [ScalingAction("spin_up", size=2)]

        def on_completion(self, query, end_s):
            self.done.append((query.query_id, end_s))

    scaler = Scaler()
    managed = pool(Recording(choose="a"), autoscaler=scaler, backend=Backend())
    actions = managed.scale(Query(1, "t", 0.0, 5.0), 0.0, force=True)
    assert [a.size for a in actions] == [1, 2] and scaler.seen == [["a", "b"]]
    assert [c.size for c in managed.clusters.values()] == [1, 3, 1, 2]
    managed.route(Query(1, "t", 0.0, 5.0), 0.0)
    managed.complete(1, 2.0)
    assert scaler.done == [(1, 2.0)]


def test_late_completions_are_clamped_for_billing_only_when_asked():
    late = pool(Recording(choose="a"), clamp_late_events=True)
    late.route(Query(1, "t", 0.0, 5.0), 0.0)
    late.route(Query(2, "t", 5.0, 5.0), 5.0)
    late.complete(1, 4.0)  # observed after the arrival at 5.0: billed as ending at 5.0
    late.complete(2, 30.0)
    assert late.router.completed == [(1, 4.0), (2, 30.0)]  # the router keeps the measured end
    assert late.latest_s == 30.0 and late.cost("a", 1e6) == 2.0 * 30.0
    strict = pool(Recording(choose="a"))
    strict.route(Query(1, "t", 0.0, 5.0), 0.0)
    strict.route(Query(2, "t", 5.0, 5.0), 5.0)
    with pytest.raises(ValueError, match="backwards"):
        strict.complete(1, 4.0)


def test_restored_queries_complete_through_the_same_step():
    managed = pool(Recording())
    managed.restore(Query(7, "t", -3.0, 5.0), "b", float("nan"), timer_s=0.0)
    assert managed.clusters["b"].state.timer.running_queries == 1
    managed.restore(Query(8, "t", -1.0, 5.0), "a", 2.0)  # its timer already counts it: untouched
    assert managed.clusters["a"].state.timer.running_queries == 0
    managed.complete(7, 12.0)
    assert managed.cost("b", 100.0) == 2.0 * 3 * 12.0 and set(managed.running) == {8}


def test_bad_requests_name_what_is_wrong():
    managed = pool(Recording(choose="zz"))
    with pytest.raises(ValueError, match="unknown cluster 'zz'"):
        managed.route(Query(1, "t", 0.0, 5.0), 0.0)
    managed.router.choose = "a"
    managed.route(Query(1, "t", 0.0, 5.0), 0.0)
    with pytest.raises(ValueError, match="already"):
        managed.route(Query(1, "t", 1.0, 5.0), 1.0)
    with pytest.raises(ValueError, match="idle to be removed"):
        managed.remove_cluster("a")
    with pytest.raises(ValueError, match="must be running"):
        managed.complete(99, 1.0)
    with pytest.raises(ValueError, match="'backend'"):
        ManagedPool(Recording()).apply([ScalingAction("spin_up", size=1)], 0.0)
    managed.complete(1, 1.0)
    managed.remove_cluster("a")
    assert list(managed.clusters) == ["b"]


if __name__ == "__main__":  # regenerate (only from a simulator known to be right)
    GOLDEN.write_text(json.dumps(scenarios(), sort_keys=True, indent=1) + "\n")


class TableOnlineModel(TableModel):
    """:class:`TableModel` with the counterfactuals the Iconq+ router asks for (neighbours unaffected)."""

    def counterfactuals(self, template, arrival_s, clusters, now_s):
        from sloctl.models.online import Counterfactual

        out = {}
        for cid, size in clusters.items():
            mine = self.running_on(cid)
            before = np.array([r.predicted_s for r in mine])
            out[cid] = Counterfactual(self.isolated[(template, size)] * (1.0 + 0.5 * len(mine)),
                                      [r.query_id for r in mine], before, before.copy())
        return out


@pytest.mark.parametrize("tolerance", [0.0, 3.0])
def test_packing_while_slos_hold_lets_the_idle_cluster_be_torn_down(tolerance):
    """Overlapping queries that meet their SLO on one cluster: the router packs them there, whatever the
    cost tolerance, so the other cluster idles and the teardown trigger (§6.2.1) fires."""
    from sloctl.control.router import IconqRouter

    world = WarehouseEmulator(isolated_s={("b", 1): 3.0}, alpha={1: 1.0}, noise_sigma=0.0)
    router = IconqRouter(TableOnlineModel({("b", 1): 3.0}), cost_tolerance=tolerance)
    config = AutoscalerConfig(window_s=20.0, t_idle_s=10.0, t_min_lifetime_s=10.0, theta=6, tau_trigger=0.1,
                              mu=8, tau_target=0.05, candidate_sizes=(1,), spinup_delay_s=6.0, max_clusters=2)
    autoscaler = Autoscaler(config, None, router, StageCostRouter, mode="add", minimum_s=5.0, teardown=True)
    # pairs 0.5 s apart every 8 s, 3 s each alone: the second arrives while the first runs, and one cluster
    # serves both within the SLO (they share it for about 6 s)
    queries = [Query(i, "b", 8.0 * (i // 2) + 0.5 * (i % 2), 10.0) for i in range(40)]
    out = WarehouseSimulator(world, [("c0", 1), ("c1", 1)], router, minimum_s=5.0, seed=0,
                             autoscaler=autoscaler).run(queries)
    assert out.violation_rate == 0.0
    on = out.queries.groupby("cluster_id").size().to_dict()
    assert max(on.values()) >= len(queries) - 1, on  # packed onto one cluster
    torn = [e for e in out.events if e["event"] == "tear_down"]
    assert len(torn) == 1 and torn[0]["reason"] == "idle"
    assert out.usage[torn[0]["cluster_id"]]["billed_s"] <= 5.0  # at most the one window it was woken for
