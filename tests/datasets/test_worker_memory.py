"""Worker memory bounded by the operating system: bounds, groups, memory failures reported as such, peaks held."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from sloctl.core.errors import ClusterPoolError
from sloctl.datasets._cluster_worker import error_text
from sloctl.datasets.duckdb_pool import DuckDBClusterPool
from sloctl.datasets.memory_bound import MemoryBounds, MemoryRoot, bound_bytes, find_memory_root, size_bytes
from sloctl.datasets.pool import QueryRequest

MEMORY_ROOT = find_memory_root()
LIMIT = "256MB"
#: Expressions DuckDB builds outside its buffer manager (8 GB of list, 2 GB of text): memory_limit alone misses them.
HUNGRY = {"list": "SELECT len(range(1000000000))", "string": "SELECT len(repeat('x', 2000000000))"}
MODES = ["rlimit", pytest.param("cgroup", marks=pytest.mark.skipif(
    MEMORY_ROOT is None, reason="no writable cgroup hierarchy with the memory controller"))]


def test_the_bound_is_the_limit_plus_a_quarter_with_a_floor():
    assert size_bytes("256MB") == 256_000_000 and size_bytes("512MiB") == 512 * 1024**2
    assert bound_bytes("256MB") == 320_000_000
    assert bound_bytes("2GiB") == 2 * 1024**3 + 2 * 1024**3 // 4
    assert bound_bytes("100MB") == 164_000_000  # the margin never drops under 64 MB
    with pytest.raises(ClusterPoolError, match="'memory_limit'.*'12 parsecs'"):
        size_bytes("12 parsecs")


@pytest.mark.parametrize("version", [1, 2])
def test_a_group_holds_the_bound_and_says_when_the_kernel_killed_in_it(tmp_path, version):
    if version == 2:
        (tmp_path / "cgroup.subtree_control").write_text("cpu memory\n")
    bounds = MemoryBounds(MemoryRoot(tmp_path, version))
    bound = bounds.create("c1-s1", 320_000_000)
    assert bound.path == tmp_path / "sloctl" / f"p{os.getpid()}-c1-s1"
    assert MemoryBounds.read(bound) == 320_000_000
    assert not MemoryBounds.oom_killed(bound)
    if version == 1:
        (bound.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    else:
        assert (tmp_path / "sloctl" / "cgroup.subtree_control").read_text() == "+memory"
        (bound.path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert MemoryBounds.oom_killed(bound)
    with pytest.raises(ClusterPoolError, match="'bound' parameter.*-1"):
        bounds.create("c2", -1)
    with pytest.raises(ClusterPoolError, match="cannot name a cgroup"):
        bounds.create("bad/name", 1)


def test_every_allocation_failure_is_reported_as_out_of_memory():
    assert error_text(MemoryError()).startswith("OutOfMemoryException: ")
    assert error_text(RuntimeError("std::bad_alloc")) == "OutOfMemoryException: std::bad_alloc"
    assert error_text(ValueError("no such column")) == "ValueError: no such column"


def test_an_unknown_memory_mode_is_refused(tpch_db):
    with pytest.raises(ClusterPoolError, match="'memory_mode'.*'swap'"):
        DuckDBClusterPool(tpch_db, memory_mode="swap")


class PeakSampler:
    """Reads a process's peak resident memory (``VmHWM``) every few milliseconds until it exits or is stopped."""

    def __init__(self, pid: int) -> None:
        self.status = Path(f"/proc/{pid}/status")
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text = self.status.read_text()
            except OSError:  # exited
                return
            for line in text.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_bytes = max(self.peak_bytes, int(line.split()[1]) * 1024)
            time.sleep(0.002)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak_bytes


def _run(pool, cluster_id, query_id, sql, timeout_s=60.0):
    pool.submit(cluster_id, QueryRequest(query_id, sql, timeout_s=timeout_s, fetch=True))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for done in pool.completions(timeout_s=0.5):
            if done.query_id == query_id:
                return done
    raise AssertionError(f"query {query_id} did not complete")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", sorted(HUNGRY))
def test_a_hungry_expression_fails_as_out_of_memory_within_the_bound(tpch_db, mode, shape):
    with DuckDBClusterPool(tpch_db, memory_limit=LIMIT, memory_mode=mode, log=lambda m: None) as pool:
        assert pool.memory_mode == mode
        cid = pool.spin_up(1)
        info = pool.wait_ready(cid, timeout_s=60)
        assert info.memory_bound == 320_000_000
        sampler = PeakSampler(info.pid)
        done = _run(pool, cid, 1, HUNGRY[shape])
        peak = sampler.stop()
        assert done.status == "error" and done.error.startswith("OutOfMemoryException: "), done.error
        assert peak < size_bytes(LIMIT) * 1.25, f"peak RSS {peak} bytes"
        after = {c.cluster_id: c for c in pool.clusters()}[cid]
        if after.state == "failed":  # killed at its bound (cgroup): the completion said so first
            assert "exceeded its memory bound of 320000000 bytes" in done.error
            assert "memory bound" in after.failure
            cid = pool.spin_up(1)
            pool.wait_ready(cid, timeout_s=60)
        nxt = _run(pool, cid, 2, "SELECT count(*) FROM nation")
        assert nxt.status == "ok" and nxt.data == [[25]]


@pytest.mark.skipif(MEMORY_ROOT is None, reason="no writable cgroup hierarchy with the memory controller")
def test_a_worker_killed_at_its_bound_ends_its_queries_as_out_of_memory_before_it_shows_failed(tpch_db):
    # 480 MB of list in one piece: under RLIMIT_DATA, so it is touched page by page until the kernel kills the worker
    with DuckDBClusterPool(tpch_db, memory_limit=LIMIT, memory_mode="cgroup") as pool:
        cid = pool.spin_up(1)
        info = pool.wait_ready(cid, timeout_s=60)
        group = pool._clusters[cid].memory_group
        pool.submit(cid, QueryRequest(1, "SELECT len(range(60000000))", timeout_s=60))
        pool.submit(cid, QueryRequest(2, "SELECT count(*) FROM range(20000000000) t(i) WHERE i % 7 = 3", timeout_s=60))
        status = Path(f"/proc/{info.pid}/status")
        deadline = time.monotonic() + 30
        while status.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        # its queries' completions are not taken yet: the cluster does not show failed before they are
        assert {c.cluster_id: c for c in pool.clusters()}[cid].state == "ready"
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < 2 and time.monotonic() < deadline:
            got.extend(pool.completions(timeout_s=0.5))
        assert {d.query_id for d in got} == {1, 2}
        for done in got:  # the other query shared the worker's memory: it cannot be told apart, and ends the same way
            assert done.error.startswith("OutOfMemoryException: the cluster worker of "), done.error
            assert "exceeded its memory bound of 320000000 bytes (memory_limit 256MB + margin 64000000 bytes)" in (
                done.error)
        if (group.path / "memory.max_usage_in_bytes").is_file():
            assert int((group.path / "memory.max_usage_in_bytes").read_text()) <= info.memory_bound
        deadline = time.monotonic() + 5
        while {c.cluster_id: c for c in pool.clusters()}[cid].state != "failed" and time.monotonic() < deadline:
            time.sleep(0.02)
        failed = {c.cluster_id: c for c in pool.clusters()}[cid]
        assert failed.state == "failed" and "memory bound" in failed.failure
        with pytest.raises(ClusterPoolError, match="failed"):
            pool.submit(cid, QueryRequest(3, "SELECT 1"))


@pytest.mark.parametrize("mode", MODES)
def test_tpch_queries_run_under_the_bound(tpch_db, tpch_templates, mode):
    with DuckDBClusterPool(tpch_db, memory_limit=LIMIT, memory_mode=mode, log=lambda m: None) as pool:
        cid = pool.spin_up(1)
        pool.wait_ready(cid, timeout_s=60)
        for i, template in enumerate(tpch_templates):  # all at once: they overlap on the worker
            pool.submit(cid, QueryRequest(i, template.sql, timeout_s=60, fetch=True))
        got = []
        deadline = time.monotonic() + 120
        while len(got) < len(tpch_templates) and time.monotonic() < deadline:
            got.extend(pool.completions(timeout_s=0.5))
        assert len(got) == len(tpch_templates) == 22
        assert [d.error for d in got if d.status != "ok"] == []


@pytest.mark.skipif(MEMORY_ROOT is None, reason="no writable cgroup hierarchy with the memory controller")
def test_scratch_and_cluster_workers_get_groups_that_go_with_them(tpch_db):
    with DuckDBClusterPool(tpch_db, memory_limit="512MB", memory_mode="cgroup") as pool:
        cid = pool.spin_up(1)
        scratch = pool.spin_up(1, cluster_id="scratch", scratch_catalog="tpch", memory_limit=LIMIT)
        infos = {c: pool.wait_ready(c, timeout_s=60) for c in (cid, scratch)}
        assert infos[cid].memory_bound == 640_000_000 and infos[scratch].memory_bound == 320_000_000
        groups = {c: pool._clusters[c].memory_group for c in (cid, scratch)}
        for c, group in groups.items():
            assert MemoryBounds.read(group) == infos[c].memory_bound
            assert str(infos[c].pid) in group.procs_file.read_text().split()
        pool.tear_down(cid)
        assert not groups[cid].path.exists()
    assert not groups[scratch].path.exists()
