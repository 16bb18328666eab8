"""Cluster sizes as CPU budgets: cgroups made, enforced, recorded and removed; refusals; the pinning fallback."""

from __future__ import annotations

import math
import os

import pytest

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets import duckdb_pool
from sloctl.datasets.cpu_budget import CgroupRoot, CpuBudgets, find_cgroup_root
from sloctl.datasets.duckdb_pool import DuckDBClusterPool
from sloctl.datasets.pool import QueryRequest

ROOT = find_cgroup_root()
needs_cgroups = pytest.mark.skipif(ROOT is None, reason="no writable cgroup hierarchy with the cpu controller")
needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the controller")


@pytest.mark.parametrize("version", [1, 2])
def test_a_group_holds_the_budget_as_quota_over_a_short_period(tmp_path, version):
    if version == 2:
        (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    budgets = CpuBudgets(CgroupRoot(tmp_path, version), period_s=0.01)
    budget = budgets.create("c1-s2", 0.5)
    if version == 1:
        assert (budget.path / "cpu.cfs_period_us").read_text() == "10000"
        assert (budget.path / "cpu.cfs_quota_us").read_text() == "5000"
    else:
        assert (budget.path / "cpu.max").read_text() == "5000 10000"
        assert (tmp_path / "sloctl" / "cgroup.subtree_control").read_text() == "+cpu"
    assert budgets.read(budget, version) == (5000, 10000)
    assert budget.cores == 0.5 and budget.path.parent == tmp_path / "sloctl"
    with pytest.raises(ClusterPoolError, match="'cores' parameter"):
        budgets.create("c2", 0.0)
    with pytest.raises(ClusterPoolError, match="cannot name a cgroup"):
        budgets.create("bad/name", 1.0)


def test_groups_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    budgets = CpuBudgets(CgroupRoot(tmp_path, 1))
    (tmp_path / "sloctl" / "p999999999-c1-s1").mkdir(parents=True)  # no such process
    mine = tmp_path / "sloctl" / f"p{os.getpid()}-c1-s1"
    mine.mkdir()
    assert budgets.remove_stale() == ["p999999999-c1-s1"]
    assert mine.is_dir()


@needs_cgroups
@needs_two_cores
def test_budgets_are_written_enforced_recorded_and_removed(tpch_db):
    with DuckDBClusterPool(tpch_db, size_unit_cores=0.25, reserved_cores=1) as pool:
        assert pool.budget_mode == "cgroup"
        big, small = pool.spin_up(2), pool.spin_up(1)
        infos = {c: pool.wait_ready(c, timeout_s=60) for c in (big, small)}
        assert infos[big].cpu_budget == 0.5 and infos[small].cpu_budget == 0.25
        assert pool.reserved[0] not in infos[big].cores  # the controller's core stays free
        groups = {c: pool._clusters[c].cgroup.path for c in (big, small)}
        assert CpuBudgets.read(pool._clusters[big].cgroup, ROOT.version) == (5000, 10000)
        worker = str(pool._clusters[big].process.pid)
        assert worker in (groups[big] / "cgroup.procs").read_text().split()
        # a busy query is held to its budget: the kernel throttles its group
        pool.submit(small, QueryRequest(1, "SELECT sum(l_extendedprice * l_discount) FROM lineitem, "
                                           "range(40) t(i)", None))
        (done,) = pool.completions(timeout_s=120)
        assert done.status == "ok" and done.cpu_budget == 0.25
        stat = dict(line.split() for line in (groups[small] / "cpu.stat").read_text().splitlines())
        assert int(stat["nr_throttled"]) > 0
        pool.tear_down(big)
        assert not groups[big].exists()
    assert not any(path.exists() for path in groups.values())


@needs_cgroups
@needs_two_cores
def test_a_pool_whose_budgets_exceed_the_cluster_cores_is_refused(tpch_db):
    cluster_cores = len(os.sched_getaffinity(0)) - 1
    units = math.floor(cluster_cores / 0.25)
    with DuckDBClusterPool(tpch_db, size_unit_cores=0.25, reserved_cores=1) as pool:
        first = pool.spin_up(units - 1)
        with pytest.raises(ClusterPoolError, match=r"needs a CPU budget of 0.5 cores .*reserved for the controller"):
            pool.spin_up(2)
        pool.spin_up(1)  # exactly fills the cluster cores
        pool.tear_down(first)
        pool.spin_up(2)  # room again once a cluster is gone


def test_without_writable_cgroups_the_pool_pins_the_rounded_budget_and_says_so_once(tpch_db, monkeypatch):
    monkeypatch.setattr(duckdb_pool, "find_cgroup_root", lambda: None)
    said: list[str] = []
    with DuckDBClusterPool(tpch_db, size_unit_cores=0.25, reserved_cores=0, log=said.append) as pool:
        assert pool.budget_mode == "pinning" and "not enforced" in pool.budget_note
        cluster = pool.spin_up(3)  # 0.75 cores, pinned to one whole core
        info = pool.wait_ready(cluster, timeout_s=60)
        assert len(info.cores) == 1 and info.cpu_budget == 1.0
        pool.submit(cluster, QueryRequest(1, "SELECT 42", None))
        (done,) = pool.completions(timeout_s=60)
        assert done.cpu_budget == 1.0
        too_big = 4 * len(os.sched_getaffinity(0)) + 1  # more whole cores than the machine has
        with pytest.raises(ClusterPoolError, match=rf"A cluster of size {too_big} needs {math.ceil(too_big / 4)} free"):
            pool.spin_up(too_big)  # the refusal names the size asked for
    assert len(said) == 1 and said[0].startswith("warning:")
    with pytest.raises(ClusterPoolError, match="budget_mode 'cgroup'"):
        DuckDBClusterPool(tpch_db, size_unit_cores=0.25, budget_mode="cgroup")


def test_bad_budget_settings_name_the_parameter(tpch_db):
    with pytest.raises(ClusterPoolError, match="'size_unit_cores'"):
        DuckDBClusterPool(tpch_db, size_unit_cores=0.0)
    with pytest.raises(ClusterPoolError, match="'budget_mode'"):
        DuckDBClusterPool(tpch_db, size_unit_cores=0.25, budget_mode="fast")
    with pytest.raises(ClusterPoolError, match="'reserved_cores'.*leaves no core"):
        DuckDBClusterPool(tpch_db, size_unit_cores=0.25, reserved_cores=len(os.sched_getaffinity(0)))
    with pytest.raises(ClusterPoolError, match="'period_s'"):
        DuckDBClusterPool(tpch_db, size_unit_cores=0.25, period_s=5.0)
