from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sloctl.config import WorkloadConfig
from sloctl.core.errors import WorkloadError
from sloctl.datasets.tpc import Template
from sloctl.datasets.workloads import (
    base_workload,
    build_workload,
    contour_workload,
    hourly_counts,
    isolated_workload,
    phased_workload,
)

TEMPLATES = [Template(f"t{i:02d}", f"SELECT {i}") for i in range(10)]
REDSET_HOURLY = Path(__file__).resolve().parents[3] / "shared" / "data" / "redset_serverless_hourly.parquet"


def signature(workload):
    return [(q.template, round(q.arrival_s, 9)) for q in workload.queries]


@pytest.mark.parametrize("make", [
    lambda seed: base_workload(TEMPLATES, 2.0, 3, seed=seed),
    lambda seed: phased_workload(TEMPLATES, 3, low_rate_per_s=0.5, high_rate_per_s=5.0,
                                 low_count=4, high_count=3, seed=seed),
    lambda seed: isolated_workload(TEMPLATES, 2, seed=seed),
    lambda seed: contour_workload(TEMPLATES, np.array([5.0, 20.0, 1.0]), seed=seed),
])
def test_same_seed_same_workload_other_seed_differs(make):
    assert signature(make(7)) == signature(make(7))
    assert signature(make(7)) != signature(make(8))


def test_base_workload_has_copies_of_every_template_shuffled_with_poisson_arrivals():
    wl = base_workload(TEMPLATES, rate_per_s=4.0, copies=30, seed=1)
    names = [q.template for q in wl.queries]
    assert sorted(names) == sorted([t.name for t in TEMPLATES] * 30)
    assert names != sorted(names)
    gaps = np.diff([q.arrival_s for q in wl.queries])
    assert (gaps >= 0).all() and wl.queries[0].arrival_s == 0.0
    assert abs(gaps.mean() - 0.25) < 0.03  # mean gap 1/λ (300 samples)


def test_phased_workload_alternates_rates():
    wl = phased_workload(TEMPLATES, 40, low_rate_per_s=0.5, high_rate_per_s=20.0,
                         low_count=10, high_count=10, seed=3)
    gaps = np.diff([q.arrival_s for q in wl.queries])
    index = np.arange(1, len(wl))
    low = gaps[(index % 20) < 10]
    high = gaps[(index % 20) >= 10]
    assert low.mean() > 10 * high.mean()


def test_isolated_workload_runs_one_at_a_time():
    wl = isolated_workload(TEMPLATES, 2, seed=0)
    assert wl.concurrency_limit == 1 and len(wl) == 20


def test_contour_follows_hourly_counts_and_compression():
    wl = contour_workload(TEMPLATES, np.array([0.0, 400.0, 0.0]), time_compression=3600.0,
                          count_scale=0.5, seed=2)
    arrivals = np.array([q.arrival_s for q in wl.queries])
    assert ((arrivals >= 1.0) & (arrivals < 2.0)).all()  # hour 1 lasts [1 s, 2 s)
    assert 150 < len(wl) < 250
    assert wl.time_compression == 3600.0


@pytest.mark.skipif(not REDSET_HOURLY.is_file(), reason="shared Redset hourly data absent")
def test_contour_from_redset_hourly_file():
    counts = hourly_counts(REDSET_HOURLY, instance=-1, hours=12)
    assert counts.shape == (12,) and counts.sum() > 0
    cfg = WorkloadConfig(kind="contour", contour_file=str(REDSET_HOURLY), contour_hours=12,
                         count_scale=0.01, seed=4)
    assert len(build_workload(cfg, TEMPLATES)) > 0


def test_synthetic_contour_when_no_file():
    counts = hourly_counts(None, hours=24, seed=1)
    assert counts.shape == (24,) and counts.max() > 2 * counts.min()


@pytest.mark.parametrize("call, name", [
    (lambda: base_workload(TEMPLATES, 0.0), "rate_per_s"),
    (lambda: base_workload(TEMPLATES, 1.0, copies=0), "copies"),
    (lambda: base_workload([], 1.0), "templates"),
    (lambda: contour_workload(TEMPLATES, np.array([1.0]), time_compression=-1), "time_compression"),
])
def test_bad_parameters_are_named(call, name):
    with pytest.raises(WorkloadError, match=f"'{name}'"):
        call()
