from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sloctl.core.errors import WorkloadError
from sloctl.datasets.reservoir import Reservoir

REDSET_HOURLY = Path(__file__).resolve().parents[3] / "shared" / "data" / "redset_serverless_hourly.parquet"
DAY = pd.Timestamp("2024-03-04")


def arrivals_frame(n: int, *, start=DAY, span_s: float = 7200.0, templates=("a", "b", "c"), seed: int = 0):
    rng = np.random.default_rng(seed)
    offsets = np.sort(rng.uniform(0.0, span_s, size=n))
    return pd.DataFrame({"timestamp": start + pd.to_timedelta(offsets, unit="s"),
                         "template": rng.choice(list(templates), size=n)})


def exact_counts(frame: pd.DataFrame) -> dict:
    ts = pd.to_datetime(frame["timestamp"])
    keys = zip(ts.dt.strftime("%Y-%m-%d"), ts.dt.hour, frame["template"], strict=True)
    return pd.Series(list(keys)).value_counts().to_dict()


def stored_counts(reservoir: Reservoir) -> dict:
    return {(d, h, t): c for d, h, t, c, _ in reservoir.counts().itertuples(index=False)}


def test_counts_stay_exact_while_arrivals_per_bin_never_exceed_the_cap(tmp_path):
    reservoir = Reservoir(tmp_path / "r.db", max_arrivals_per_bin=20, seed=3)
    batches = [arrivals_frame(500, seed=s) for s in range(3)]
    for batch in batches:
        reservoir.add_queries(batch)
    assert stored_counts(reservoir) == exact_counts(pd.concat(batches))
    per_bin = reservoir.arrivals().groupby(["date", "hour", "template"]).size()
    assert per_bin.max() == 20 and len(per_bin) == len(stored_counts(reservoir))
    offsets = reservoir.arrivals()["offset_s"]
    assert ((offsets >= 0) & (offsets < 3600)).all()


def test_uncapped_reservoir_keeps_every_offset(tmp_path):
    reservoir = Reservoir(tmp_path / "r.db", max_arrivals_per_bin=None)
    batch = arrivals_frame(300, span_s=3600.0)
    reservoir.add_queries(batch)
    kept = np.sort(reservoir.arrivals()["offset_s"].to_numpy())
    expected = np.sort((pd.to_datetime(batch["timestamp"]) - DAY).dt.total_seconds().to_numpy())
    np.testing.assert_allclose(kept, expected)


def test_kept_offsets_are_a_uniform_sample_of_the_whole_stream_across_writes(tmp_path):
    # Arrivals come in time order over ten writes; a biased sampler would keep the early ones.
    reservoir = Reservoir(tmp_path / "r.db", max_arrivals_per_bin=300, seed=1)
    offsets = np.linspace(0.0, 3599.0, 6000)
    for chunk in np.array_split(offsets, 10):
        reservoir.add_queries([(DAY + pd.Timedelta(seconds=o), "q") for o in chunk])
    kept = reservoir.arrivals()["offset_s"].to_numpy()
    assert len(kept) == 300 and reservoir.counts()["count"].item() == 6000
    assert abs(kept.mean() - 1800.0) < 150.0
    assert np.histogram(kept, bins=4, range=(0, 3600))[0].min() > 45


def test_same_seed_keeps_the_same_offsets_and_another_seed_differs(tmp_path):
    def kept(seed, name):
        reservoir = Reservoir(tmp_path / name, max_arrivals_per_bin=10, seed=seed)
        reservoir.add_queries(arrivals_frame(400))
        reservoir.add_queries(arrivals_frame(400, seed=1))
        return reservoir.arrivals()["offset_s"].round(9).tolist()

    assert kept(7, "a.db") == kept(7, "b.db")
    assert kept(7, "a.db") != kept(8, "c.db")


def test_a_batch_with_a_bad_row_midway_writes_nothing(tmp_path):
    reservoir = Reservoir(tmp_path / "r.db", max_arrivals_per_bin=5)
    reservoir.add_queries(arrivals_frame(50))
    before = (reservoir.counts(), reservoir.arrivals())
    rows = [(DAY, "a"), (DAY, "b"), ("not a time", "a"), (DAY, "c")]
    with pytest.raises(WorkloadError, match="'timestamp' field .* row 2"):
        reservoir.add_queries(rows)
    pd.testing.assert_frame_equal(reservoir.counts(), before[0])
    pd.testing.assert_frame_equal(reservoir.arrivals(), before[1])


def test_a_write_interrupted_inside_the_transaction_leaves_the_previous_state(tmp_path, monkeypatch):
    reservoir = Reservoir(tmp_path / "r.db", max_arrivals_per_bin=5)
    reservoir.add_queries(arrivals_frame(50))
    before = (reservoir.counts(), reservoir.arrivals())

    def crash(*args, **kwargs):  # the counts of this batch are already written when it fires
        raise RuntimeError("power cut")

    monkeypatch.setattr(Reservoir, "_write_arrivals", crash)
    with pytest.raises(RuntimeError, match="power cut"):
        reservoir.add_queries(arrivals_frame(80, seed=5))
    monkeypatch.undo()
    pd.testing.assert_frame_equal(reservoir.counts(), before[0])
    pd.testing.assert_frame_equal(reservoir.arrivals(), before[1])
    # and the seeded stream continues as if the failed write never happened
    reservoir.add_queries(arrivals_frame(80, seed=5))
    other = Reservoir(tmp_path / "other.db", max_arrivals_per_bin=5)
    other.add_queries(arrivals_frame(50))
    other.add_queries(arrivals_frame(80, seed=5))
    pd.testing.assert_frame_equal(reservoir.arrivals(), other.arrivals())


def test_an_iterable_that_raises_midway_writes_nothing(tmp_path):
    reservoir = Reservoir(tmp_path / "r.db")

    def rows():
        yield DAY, "a"
        raise OSError("stream broke")

    with pytest.raises(OSError):
        reservoir.add_queries(rows())
    assert reservoir.counts().empty and reservoir.dates() == []


def test_add_log_bins_relative_arrivals_from_the_start_date(tmp_path):
    reservoir = Reservoir(tmp_path / "r.db")
    log = pd.DataFrame({"template": ["x", "y", "x"], "arrival_s": [10.0, 3605.0, 86400.0 + 7.5]})
    assert reservoir.add_log(log, start_date="2024-03-04") == 3
    counts = reservoir.counts()
    assert counts[["date", "hour", "template", "count"]].values.tolist() == [
        ["2024-03-04", 0, "x", 1], ["2024-03-04", 1, "y", 1], ["2024-03-05", 0, "x", 1]]
    assert reservoir.arrivals()["offset_s"].tolist() == [10.0, 5.0, 7.5]
    assert reservoir.dates() == ["2024-03-04", "2024-03-05"]


def test_hourly_counts_add_exact_counts_without_arrivals(tmp_path):
    reservoir = Reservoir(tmp_path / "r.db")
    frame = pd.DataFrame({"instance_id": [1, 1, 2], "timestamp": ["2024-03-04 05:00:00", "2024-03-05 23:00:00",
                                                                  "2024-03-04 05:00:00"],
                          "query_count": [12, 3, 99]})
    with pytest.raises(WorkloadError, match="'instance' parameter is required"):
        reservoir.add_hourly_counts(frame)
    assert reservoir.add_hourly_counts(frame, instance=1) == 15
    reservoir.add_hourly_counts(frame, instance=1)  # counts add up
    counts = reservoir.counts()
    assert counts[["date", "hour", "template", "count", "arrivals_seen"]].values.tolist() == [
        ["2024-03-04", 5, "all", 24, 0], ["2024-03-05", 23, "all", 6, 0]]
    assert reservoir.arrivals().empty
    assert reservoir.counts(start="2024-03-05")["count"].tolist() == [6]
    assert reservoir.counts(dates=["2024-03-04"], template="all")["count"].tolist() == [24]


@pytest.mark.parametrize(("call", "field"), [
    (lambda r: r.add_queries(pd.DataFrame({"timestamp": [DAY]})), "'template' column"),
    (lambda r: r.add_queries([(DAY, "")]), "'template' field"),
    (lambda r: r.add_queries([(DAY,)]), "'queries' parameter"),
    (lambda r: r.add_log(pd.DataFrame({"template": ["a"], "arrival_s": [-1.0]}), "2024-03-04"), "'arrival_s'"),
    (lambda r: r.add_log(pd.DataFrame({"template": ["a"], "arrival_s": [1.0]}), "someday"), "'start_date'"),
    (lambda r: r.add_hourly_counts(pd.DataFrame({"timestamp": ["2024-03-04 05:30:00"], "query_count": [1]})),
     "on the hour"),
    (lambda r: r.add_hourly_counts(pd.DataFrame({"timestamp": ["2024-03-04 05:00:00"], "query_count": [1.5]})),
     "'query_count'"),
    (lambda r: r.counts(start="March"), "'start'"),
])
def test_bad_input_is_refused_naming_the_field(tmp_path, call, field):
    reservoir = Reservoir(tmp_path / "r.db")
    with pytest.raises(WorkloadError, match=field):
        call(reservoir)
    assert reservoir.counts().empty


@pytest.mark.parametrize(("kwargs", "field"), [({"max_arrivals_per_bin": -1}, "max_arrivals_per_bin"),
                                               ({"max_arrivals_per_bin": 2.5}, "max_arrivals_per_bin"),
                                               ({"seed": -3}, "seed")])
def test_bad_parameters_are_refused_on_first_use(tmp_path, kwargs, field):
    reservoir = Reservoir(tmp_path / "r.db", **kwargs)
    assert reservoir.seed == kwargs.get("seed", 0)  # the constructor only stores
    with pytest.raises(WorkloadError, match=field):
        reservoir.dates()


def test_reopening_a_file_with_another_cap_is_refused(tmp_path):
    Reservoir(tmp_path / "r.db", max_arrivals_per_bin=5).add_queries([(DAY, "a")])
    assert Reservoir(tmp_path / "r.db", max_arrivals_per_bin=5).counts()["count"].tolist() == [1]
    with pytest.raises(WorkloadError, match="max_arrivals_per_bin"):
        Reservoir(tmp_path / "r.db", max_arrivals_per_bin=50).counts()


@pytest.mark.skipif(not REDSET_HOURLY.is_file(),
                    reason=f"the Redset hourly file is not here ({REDSET_HOURLY}); shared data is optional")
def test_redset_hourly_counts_load_exactly(tmp_path):
    frame = pd.read_parquet(REDSET_HOURLY)
    reservoir = Reservoir(tmp_path / "r.db")
    added = reservoir.add_hourly_counts(frame, instance=0)
    assert added == int(frame.loc[frame["instance_id"] == 0, "query_count"].sum())
    assert reservoir.counts()["count"].sum() == added and len(reservoir.dates()) > 80
