"""Fitting a DiffTry network from traces and access logs (docs/retry.md, "From traces").

The traces come from :mod:`sloctl.simulation.trace_synth`, a discrete-event
simulation of a network file that writes the spans an instrumented mesh would
(OpenTelemetry conventions); the fit must find the file again. The access-log
lines written here follow Envoy's access-log format string
(https://www.envoyproxy.io/docs/envoy/latest/configuration/observability/access_log/usage).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sloctl.cli import app
from sloctl.datasets.traces import SLOCTL_ACCESS_FORMAT
from sloctl.models.retry import solve_network
from sloctl.models.retry_network import load_network, network_from_mapping
from sloctl.simulation.trace_synth import synthesize_spans, write_otlp_json
from sloctl.training.network_fit import FitOptions, NetworkFitError, SpanTable, fit_network, fit_spans
from sloctl.training.network_fit_access import fit_network_from_access_logs

TANDEM = {
    "services": {"frontend": {"capacity_per_s": 40.0, "buffer": 6}, "backend": {"capacity_per_s": 30.0, "buffer": 4}},
    "classes": {"high": {"retries": 4}, "low": {"retries": 1}},
    "arrivals": {"high": {"frontend": 8.0}, "low": {"frontend": 24.0}},
    "routing": {"high": {"frontend": {"backend": 0.8}}, "low": {"frontend": {"backend": 0.8}}},
    "retry_delay_s": 0.5,
}


@pytest.fixture(scope="module")
def tandem():
    return network_from_mapping(TANDEM)


@pytest.fixture(scope="module")
def tandem_spans(tandem):
    return list(synthesize_spans(tandem, duration_s=400, seed=3))


def _fit(spans, **options):
    return fit_spans(SpanTable().add_all(spans), FitOptions(**options))


def test_fit_recovers_the_network_the_traces_came_from(tandem, tandem_spans):
    fit = _fit(tandem_spans)
    net = fit.network
    for s in tandem.services:
        assert net["services"][s.name]["capacity_per_s"] == pytest.approx(s.capacity_per_s, rel=0.06)
        assert net["services"][s.name]["buffer"] == s.buffer
    for c in tandem.classes:
        assert net["arrivals"][c]["frontend"] == pytest.approx(tandem.arrivals[c]["frontend"], rel=0.06)
        assert net["routing"][c]["frontend"]["backend"] == pytest.approx(0.8, abs=0.03)
        assert net["classes"][c]["retries"] == max(tandem.retries[c].values())
    assert net["retry_delay_s"] == pytest.approx(0.5, rel=0.1)
    assert fit.report["unfitted"] == {"loadgen": "no SERVER spans: it only calls others (an external caller)"}
    assert fit.report["services"]["backend"]["rests_on_spans"] > 1000
    # the fitted file is a network the analysis takes as it is, and predicts what the true one does
    truth = solve_network(tandem).to_json()["classes"]
    fitted = solve_network(fit.spec()).to_json()["classes"]
    for c in tandem.classes:
        assert fitted[c]["end_to_end_rejection"] == pytest.approx(truth[c]["end_to_end_rejection"], abs=0.03)


def test_client_resends_recover_the_retry_limit(tandem):
    spans = list(synthesize_spans(tandem, duration_s=150, seed=4, resend_spans=True))
    assert any(s.resend_count > 0 for s in spans)
    fit = _fit(spans)
    assert fit.network["classes"]["high"]["retries"] == 4
    assert fit.network["classes"]["low"]["retries"] == 1
    assert "refused on every attempt" in fit.report["classes"]["low"]["retries_basis"]
    assert fit.network["arrivals"]["low"]["frontend"] == pytest.approx(24.0, rel=0.08)


def test_config_wins_over_the_traces(tandem_spans):
    fit = _fit(tandem_spans, retries={"high": 7}, buffers={"backend": 9}, weights={"high": 10.0})
    assert fit.network["classes"]["high"] == {"retries": 7, "weight": 10.0}
    assert fit.network["services"]["backend"]["buffer"] == 9
    assert fit.report["services"]["backend"]["buffer_basis"] == "config"


def test_sampled_traces_recover_arrivals_with_the_sampling_rate(tandem):
    spans = list(synthesize_spans(tandem, duration_s=400, seed=5, sampling=0.25))
    unscaled = _fit(spans)
    fit = _fit(spans, sampling=0.25)
    assert unscaled.network["arrivals"]["low"]["frontend"] == pytest.approx(6.0, rel=0.12)
    assert fit.network["arrivals"]["low"]["frontend"] == pytest.approx(24.0, rel=0.12)
    assert fit.network["arrivals"]["high"]["frontend"] == pytest.approx(8.0, rel=0.15)
    assert "sampled" in fit.report["services"]["backend"]["capacity_basis"]


def test_skew_orphans_and_duplicates_are_counted_not_fatal(tandem_spans):
    spans = tandem_spans[:6000]
    backend = [i for i, s in enumerate(spans) if s.service == "backend" and s.kind == "server"][:10]
    by_id = {s.span_id: s for s in spans}
    for i in backend:  # the callee's clock runs 1 s behind its caller's
        s = spans[i]
        spans[i] = s._replace(start_ns=by_id[s.parent_id].start_ns - 10**9, end_ns=s.end_ns - 10**9)
    skewed_parents = {spans[i].parent_id for i in backend}
    drop = sorted(s.span_id for s in spans if s.service == "frontend" and s.kind == "client"
                  and s.span_id not in skewed_parents)[:5]  # their backend attempts become orphans
    dropped = [s for s in spans if s.span_id not in drop]
    dup = dropped + dropped[:3]
    fit = _fit(dup, min_spans=5)
    anomalies = fit.report["anomalies"]
    assert anomalies["clock_skew"] >= 10
    assert anomalies["orphans"] >= 5
    assert anomalies["duplicate_span_ids"] == 3
    assert "backend" in fit.network["services"]


def test_no_server_spans_is_a_clear_error(tandem_spans):
    clients = [s for s in tandem_spans[:500] if s.kind == "client"]
    with pytest.raises(NetworkFitError, match="No service could be fitted"):
        _fit(clients)


# -- files and the command line ---------------------------------------------------------------
def _access_lines(spans) -> dict[str, list[str]]:
    """One Envoy access-log line per call (a CLIENT span), in sloctl's format, written at the callee's sidecar."""
    children: dict[str, list] = {}
    for s in spans:
        if s.kind == "server":
            children.setdefault(s.parent_id, []).append(s)
    out: dict[str, list[str]] = {}
    for c in spans:
        tries = sorted(children.get(c.span_id, []), key=lambda s: s.start_ns) if c.kind == "client" else []
        if not tries:
            continue
        last = tries[-1]
        caller = "-" if c.service == "loadgen" else c.service
        flags = "URX" if c.http_status == 503 else "-"
        tx_us, rx_us = (last.start_ns - c.start_ns) // 1000, (c.end_ns - c.start_ns) // 1000
        out.setdefault(c.peer_service, []).append(
            f'[{c.start_ns / 1e9:.6f}] "GET / HTTP/1.1" {c.http_status} {flags} 0 0 {rx_us // 1000} '
            f'{(c.end_ns - last.start_ns) // 10**6} "-" "test" "{c.trace_id}" "{c.peer_service}" "127.0.0.1:1" '
            f'class-{c.klass} {c.peer_service} {len(tries)} "{caller}" {tx_us} {rx_us}')
    return out


def test_cli_fits_otlp_files_and_the_file_feeds_retry_solve(tmp_path: Path, tandem_spans):
    write_otlp_json(tandem_spans[:40000], tmp_path / "traces", per_file=15000)
    out = tmp_path / "net.yaml"
    runner = CliRunner()
    res = runner.invoke(app, ["fit", "network", "--traces", str(tmp_path / "traces"), "--out", str(out),
                              "--weight", "high=10", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["report"]["spans"] == 40000
    spec = load_network(out)
    assert spec.provenance["files"][0]["format"] == "otlp-json"
    assert len(spec.provenance["files"][0]["sha256"]) == 64
    assert spec.weights["high"] == 10.0
    res = runner.invoke(app, ["retry", "solve", "-n", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert set(json.loads(res.stdout)["classes"]) == {"high", "low"}


def test_cli_names_the_format_a_file_really_has(tmp_path: Path, tandem_spans):
    path = write_otlp_json(tandem_spans[:100], tmp_path)[0]
    res = CliRunner().invoke(app, ["fit", "network", "--traces", str(path), "--format", "zipkin"])
    assert res.exit_code == 2
    assert "otlp-json" in res.output and "zipkin" in res.output


def test_cli_rejects_bad_pairs_with_the_option_named(tmp_path: Path, tandem_spans):
    path = write_otlp_json(tandem_spans[:100], tmp_path)[0]
    res = CliRunner().invoke(app, ["fit", "network", "--traces", str(path), "--buffer", "backend=zero"])
    assert res.exit_code == 2
    assert "--buffer" in res.output


def test_access_logs_alone_recover_the_network(tmp_path: Path, tandem, tandem_spans):
    for service, lines in _access_lines(tandem_spans).items():
        (tmp_path / f"access-{service}.log").write_text("\n".join(lines) + "\n")
    fit = fit_network_from_access_logs(tmp_path, log_format=SLOCTL_ACCESS_FORMAT)
    net = fit.network
    for s in tandem.services:
        assert net["services"][s.name]["capacity_per_s"] == pytest.approx(s.capacity_per_s, rel=0.06)
    assert net["services"]["frontend"]["buffer"] == 6
    for c in tandem.classes:
        assert net["arrivals"][c]["frontend"] == pytest.approx(tandem.arrivals[c]["frontend"], rel=0.06)
        assert net["routing"][c]["frontend"]["backend"] == pytest.approx(0.8, abs=0.03)
        assert net["classes"][c]["retries"] == max(tandem.retries[c].values())
    assert net["provenance"]["fitted_from"] == "envoy access logs"


def test_retry_optimise_fits_the_traces_first(tmp_path: Path, tandem_spans):
    write_otlp_json(tandem_spans[:40000], tmp_path / "mesh")
    fitted = tmp_path / "fitted.yaml"
    res = CliRunner().invoke(app, ["retry", "optimise", "--traces", str(tmp_path / "mesh"), "--weight", "high=10",
                                   "--fitted-out", str(fitted), "--confirm-s", "0", "--no-register", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(doc["retries"]) == {"high", "low"}
    assert doc["network"]["provenance"]["fitted_from"] == "traces"
    assert load_network(fitted).weights["high"] == 10.0
    res = CliRunner().invoke(app, ["retry", "optimise", "--traces", str(tmp_path / "mesh"), "-n", str(fitted)])
    assert res.exit_code == 2
    assert "not both" in res.output


def test_policy_from_traces_is_registered_with_their_provenance(tmp_path: Path, tandem_spans):
    from mlflow import MlflowClient

    from sloctl.training.retry_budget import BudgetSearch, optimise_budgets, register_retry_policy

    write_otlp_json(tandem_spans[:20000], tmp_path / "mesh")
    fit = fit_network(tmp_path / "mesh")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    policy = optimise_budgets(fit.spec(), BudgetSearch(max_retries=2), load=1.5)
    register_retry_policy(policy, tracking_uri=uri, experiment="t", network="mesh")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    tags = client.get_run(client.get_model_version_by_alias("retry-policy-mesh", "champion").run_id).data.tags
    assert tags["provenance.fitted_from"] == "traces"
    assert tags["provenance.trace_files"] == "spans-0000.jsonl"
    assert tags["provenance.trace_sha256"] == fit.network["provenance"]["files"][0]["sha256"][:16]


def test_live_experiment_grades_a_fit_against_the_configured_network(tandem, tandem_spans):
    from sloctl.experiments.retry_fit_live import _within_ci, compare_networks

    fit = _fit(tandem_spans)
    err = compare_networks(fit.spec(), tandem)
    assert err["max_capacity_rel_error"] < 0.06 and err["max_routing_abs_error"] < 0.03
    assert set(err["capacity_rel_error"]) == {"frontend", "backend"} and err["unfitted"] == []
    covered = _within_ci(fit.report, tandem)
    assert set(covered) == {"arrivals high:frontend", "arrivals low:frontend", "routing high:frontend->backend",
                            "routing low:frontend->backend"}
    assert sum(covered.values()) >= 3  # 95% intervals: all four, or three by chance
    worse = compare_networks(fit.spec().scale_arrivals({"high": 2.0, "low": 1.0}), tandem)
    assert worse["arrivals_rel_error"]["high:frontend"] > 0.9


def test_a_real_zipkin_trace_fits_into_a_network_the_analysis_solves():
    """openzipkin's zipkin-lens test trace (tests/data/traces/README.md): services calling themselves are named."""
    data = Path(__file__).resolve().parents[1] / "data" / "traces"
    trace = data / "zipkin-openzipkin-smartthings-oauth-authorization.json"
    fit = fit_network(trace, options=FitOptions(min_spans=1))
    assert fit.report["self_calls_left_out"]  # auth -> auth would make the open network diverge
    assert fit.report["parse"]["unreadable"] == 0 and fit.report["parse"]["files"][0]["records"] == 175
    assert fit.report["spans"] + fit.report["anomalies"]["duplicate_span_ids"] == 175
    solved = solve_network(fit.spec()).to_json()
    assert set(solved["classes"]) == {"default"} and solved["converged"]
