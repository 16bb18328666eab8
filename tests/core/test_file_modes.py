"""Atomic writes: a new file gets the mode open(path, "w") gives (0644 under umask 022); a rewrite keeps its mode."""

from __future__ import annotations

import os
import stat

import pytest

from sloctl.core.files import atomic_write, current_umask, default_file_mode


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _bits(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_umask_is_read_without_changing_it(umask_022):
    assert current_umask() == 0o022
    assert default_file_mode() == 0o644
    assert os.umask(0o022) == 0o022  # still what the fixture set


def test_an_atomic_write_is_readable_by_group_and_others(tmp_path, umask_022):
    with atomic_write(tmp_path / "out.json") as fh:
        fh.write("{}")
    assert (tmp_path / "out.json").read_text() == "{}"
    assert _bits(tmp_path / "out.json") == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary file left


def test_a_stricter_umask_is_respected(tmp_path):
    old = os.umask(0o077)
    try:
        with atomic_write(tmp_path / "private", "wb") as fh:
            fh.write(b"x")
    finally:
        os.umask(old)
    assert _bits(tmp_path / "private") == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target) as fh:
        fh.write("new")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_a_written_query_log_is_world_readable(tmp_path, umask_022, sim_log):
    from sloctl.datasets.querylog import read_log, write_log

    path = write_log(sim_log.head(20), tmp_path / "log.parquet")
    assert _bits(path) & 0o044 == 0o044
    assert _bits(path) == 0o644
    assert len(read_log(path)) == 20


def test_an_envoy_routes_file_is_world_readable(tmp_path, umask_022):
    from sloctl.serving.runtime.envoy import write_rds_file

    route_config = {"name": "svc", "virtual_hosts": [{"name": "svc", "domains": ["*"], "routes": []}]}
    path = write_rds_file(route_config, tmp_path / "routes.json")
    assert _bits(path) == 0o644


def test_mode_other_than_text_or_binary_write_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'mode' parameter of atomic_write must be 'w' or 'wb', got 'a'"), \
            atomic_write(tmp_path / "x", "a"):
        pass


def test_a_rewrite_keeps_the_mode_the_file_had(tmp_path, umask_022):
    path = tmp_path / "routes.json"
    path.write_text("old")
    os.chmod(path, 0o640)  # an operator's choice
    with atomic_write(path) as fh:
        fh.write("new")
    assert path.read_text() == "new" and _bits(path) == 0o640
