from __future__ import annotations

import pytest

from sloctl.config import SloctlConfig, load_config
from sloctl.core.errors import ConfigError


def write(tmp_path, text):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    return path


def test_default_file_parses_into_frozen_dataclasses():
    cfg = load_config()
    assert isinstance(cfg, SloctlConfig)
    assert cfg.collect.sizes == (1, 2)
    with pytest.raises(AttributeError):
        cfg.workload.seed = 3  # frozen


def test_user_file_overrides_only_what_it_names(tmp_path):
    cfg = load_config(write(tmp_path, "workload:\n  rate_per_s: 2\n  kind: phased\n"))
    assert cfg.workload.rate_per_s == 2.0 and isinstance(cfg.workload.rate_per_s, float)
    assert cfg.workload.kind == "phased"
    assert cfg.workload.copies == 3  # default kept


def test_unknown_key_names_key_and_file(tmp_path):
    path = write(tmp_path, "workload:\n  rat: 2\n")
    with pytest.raises(ConfigError, match=r"my\.yaml.*unknown key 'workload\.rat'"):
        load_config(path)


def test_unknown_section_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'wokload'"):
        load_config(write(tmp_path, "wokload: {}\n"))


@pytest.mark.parametrize("text, key", [
    ("workload:\n  copies: three\n", "workload.copies"),
    ("workload:\n  copies: 2.5\n", "workload.copies"),
    ("warehouse:\n  allow_oversubscribe: 1\n", "warehouse.allow_oversubscribe"),
    ("collect:\n  sizes: [1, x]\n", r"collect.sizes\[1\]"),
    ("collect:\n  benchmark: tpcx\n", "collect.benchmark"),
    ("collect: 3\n", "collect"),
    ("router:\n  guard_placement: nearest\n", "router.guard_placement"),
])
def test_mistyped_key_names_key_and_file(tmp_path, text, key):
    with pytest.raises(ConfigError, match=rf"my\.yaml: .*'{key}'"):
        load_config(write(tmp_path, text))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
