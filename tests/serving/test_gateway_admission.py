"""The gateway's admission by class and its class-aware retries (issue 22, parts 2 and 3).

Admission asks a real latency model (Stage, trained on the tests' synthetic
log; the session property ``template`` names one of its templates) whether
a cluster meets the query's SLO.
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("trino")

#: about a second on one core: a query that outlives a short attempt timeout
SLOW_SQL = "SELECT count(*) FROM range(300000000) t(i) WHERE i % 7 = 3"
#: long enough (>= 0.1 s on a fast core) that a stop sent as it starts lands while it runs
STOP_SQL = "SELECT count(*) FROM range(100000000) t(i) WHERE i % 7 = 3"
STOP_COUNT = len(range(3, 100000000, 7))


@pytest.fixture(scope="module")
def stage(sim_log):
    from sloctl.config import load_config
    from sloctl.training.pipeline import train_stage

    return train_stage(sim_log, load_config().stage, risk_quantile=None).predictor


def _policy(**low):
    from sloctl.serving.gateway.policy import GatewayPolicy

    return GatewayPolicy.from_doc({"classes": {
        "high": {"priority": 2, "share": 2, "defer": False, "queue_limit": 0, "retries": 2},
        "low": {"priority": 1, "share": 1, "defer": True, "queue_limit": 4, "max_defer_s": 0.3, "retries": 1,
                **low},
        "tiny": {"priority": 0, "defer": True, "queue_limit": 0}}, "default_class": "low"})


def _served(tpch_db, stage, sim_log, **options):
    from sloctl.datasets.querylog import template_table
    from sloctl.serving.gateway import Gateway, GatewayOptions

    options.setdefault("policy", _policy())
    return Gateway(tpch_db, GatewayOptions(cluster_sizes=(1, 1), **options), predictor=stage,
                   templates=template_table(sim_log))


@pytest.fixture(scope="module")
def served(tpch_db, stage, sim_log):
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    gateway = _served(tpch_db, stage, sim_log).start()
    try:
        with LocalServer(create_gateway_app(gateway)) as client:
            yield gateway, client
    finally:
        gateway.close()


def _run(client, klass, slo_s, sql="SELECT 42", template="t00"):
    import trino

    conn = trino.dbapi.connect(host="127.0.0.1", port=int(client.base_url.port), user="u", client_tags=[klass],
                               session_properties={"slo_s": str(slo_s), "template": template})
    cur = conn.cursor()
    cur.execute(sql)
    return cur.fetchall(), cur.query_id


def test_the_router_admits_a_query_some_cluster_is_predicted_to_meet(served):
    gateway, client = served
    assert gateway.router_kind() == "stage"
    rows, qid = _run(client, "low", 100.0)
    q = gateway.get(qid)
    assert rows == [[42]] and q.outcome == "admitted" and not q.forced and q.klass == "low"


def test_low_priority_predicted_to_miss_waits_then_is_shed_with_a_clear_error(served):
    import trino

    gateway, client = served
    with pytest.raises(trino.exceptions.TrinoQueryError) as caught:
        _run(client, "low", 1e-3)
    err = caught.value
    assert err.error_name == "EXCEEDED_TIME_LIMIT" and err.error_type == "INSUFFICIENT_RESOURCES"
    assert "shed" in err.message and "'low'" in err.message and "SLO" in err.message
    q = gateway.get(err.query_id)
    assert q.outcome == "shed" and q.attempts == [] and q.deferred_s >= 0.3


def test_a_full_queue_sheds_at_once(served):
    import trino

    gateway, client = served
    with pytest.raises(trino.exceptions.TrinoQueryError) as caught:
        _run(client, "tiny", 1e-3)
    assert caught.value.error_name == "QUERY_QUEUE_FULL" and "queue of class 'tiny' is full" in caught.value.message


def test_high_priority_predicted_to_miss_is_placed_anyway(served):
    gateway, client = served
    forced = gateway.counts["forced"]
    rows, qid = _run(client, "high", 1e-3)
    q = gateway.get(qid)
    assert rows == [[42]] and q.outcome == "admitted" and q.forced and gateway.counts["forced"] == forced + 1
    assert q.violated  # placed, and it missed the SLO it could not meet


def test_a_deferred_query_is_placed_once_a_cluster_is_predicted_to_meet_it(served, monkeypatch):
    gateway, client = served
    real, misses = gateway._meets, {"left": 3}

    def meets(q, now):  # the first three looks predict a miss (clusters busy), then the model decides
        if q.klass == "low" and misses["left"] > 0:
            misses["left"] -= 1
            return False
        return real(q, now)

    monkeypatch.setattr(gateway, "_meets", meets)
    monkeypatch.setattr(gateway, "policy", _policy(max_defer_s=30.0))  # time for the three looks, on a busy machine
    rows, qid = _run(client, "low", 100.0)
    q = gateway.get(qid)
    assert rows == [[42]] and q.outcome == "deferred" and q.deferred_s > 0 and misses["left"] == 0
    counts = gateway.counts
    assert counts["admitted"] + counts["deferred"] + counts["shed"] == counts["submitted"]


def test_a_query_on_a_cluster_stopped_mid_run_is_retried_elsewhere_and_the_client_gets_its_rows(
        tpch_db, stage, sim_log):
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    with _served(tpch_db, stage, sim_log, router="least-queued") as gateway, \
            LocalServer(create_gateway_app(gateway)) as client:
        out = {}

        def client_query() -> None:
            out["rows"], out["qid"] = _run(client, "high", 60.0, STOP_SQL)

        thread = threading.Thread(target=client_query)
        thread.start()
        deadline = time.monotonic() + 30
        while not (running := [q for q in gateway.queries.values() if q.state == "RUNNING"]):
            assert time.monotonic() < deadline, "the query never ran"
            time.sleep(0.002)
        q = running[0]
        first = q.attempts[0]["cluster_id"]
        gateway.pool.tear_down(first)  # stopped on purpose while the query runs there
        thread.join(timeout=60)
        assert out["rows"] == [[STOP_COUNT]]
        attempts = gateway.get(out["qid"]).attempts
        assert [a["status"] for a in attempts] == ["error", "ok"], attempts
        assert attempts[1]["cluster_id"] != first and gateway.counts["retries"] == 1
        log = gateway.query_log()
        mine = log[log["gateway_query"] == out["qid"]]
        assert list(mine["attempt"]) == [1, 2] and list(mine["status"]) == ["error", "ok"]
        assert gateway.status()["clusters"][0]["torn_down"] == (first == "c0")


def test_timeouts_are_retried_on_another_cluster_up_to_the_class_limit(tpch_db, stage, sim_log):
    import trino

    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    policy = _policy(attempt_timeout_s=0.1, retries=1)
    with _served(tpch_db, stage, sim_log, router="least-queued", policy=policy) as gateway, \
            LocalServer(create_gateway_app(gateway)) as client:
        with pytest.raises(trino.exceptions.TrinoQueryError) as caught:
            _run(client, "low", 60.0, SLOW_SQL)
        assert caught.value.error_name == "EXCEEDED_TIME_LIMIT" and "2 attempt(s)" in caught.value.message
        attempts = gateway.get(caught.value.query_id).attempts
        assert [a["status"] for a in attempts] == ["timeout", "timeout"]
        assert attempts[0]["cluster_id"] != attempts[1]["cluster_id"]  # never the cluster that just failed it
        log = gateway.query_log()
        censored = log[log["gateway_query"] == caught.value.query_id]
        assert list(censored["status"]) == ["timeout", "timeout"] and (censored["latency_s"] >= 0.1).all()
        # retries off: one attempt only
    with _served(tpch_db, stage, sim_log, router="least-queued", policy=policy, retries=False) as gateway, \
            LocalServer(create_gateway_app(gateway)) as client:
        with pytest.raises(trino.exceptions.TrinoQueryError) as caught:
            _run(client, "low", 60.0, SLOW_SQL)
        assert len(gateway.get(caught.value.query_id).attempts) == 1


def test_policy_documents_are_checked_and_registered_policies_override_them(tmp_path):
    from sloctl.control.credits import ClassShare
    from sloctl.serving.gateway.policy import GatewayPolicy, load_gateway_policy

    with pytest.raises(ValueError, match="'classes.low.queue_limit'"):
        GatewayPolicy.from_doc({"classes": {"low": {"queue_limit": -1}}})
    with pytest.raises(ValueError, match="unknown field 'colour'"):
        GatewayPolicy.from_doc({"classes": {"low": {"colour": 1}}})
    with pytest.raises(ValueError, match="'default_class'"):
        GatewayPolicy.from_doc({"classes": {"low": {}}, "default_class": "high"})
    path = tmp_path / "policy.yaml"
    path.write_text("classes:\n  gold: {priority: 3, defer: false, retries: 3}\n  bronze: {max_defer_s: 2}\n")
    policy = load_gateway_policy(path)
    assert policy.default_class == "bronze" and policy.klass("nope").name == "bronze"

    class Retry:
        retries = {"gold": {"warehouse": 1, "other": 5}, "bronze": {"other": 4}}

    class Admission:
        classes = (ClassShare("gold", 1, 0.5), ClassShare("bronze", 7, 3.0))

    merged = policy.with_retries(Retry(), "r").with_admission(Admission(), "a")
    assert merged.klass("gold").retries == 1 and merged.klass("bronze").retries == 4
    assert merged.klass("bronze").priority == 7 and merged.klass("gold").share == 0.5
    assert merged.provenance == {"source": str(path), "retries": "r", "admission": "a"}


class _RecordingAutoscaler:
    """Sees every placement; asks for one size-1 spin-up at the second one (the gateway's side of scaling)."""

    def __init__(self):
        self.arrivals = []

    def on_arrival(self, query, clusters, now_s=None):
        from sloctl.control.managed import ScalingAction

        self.arrivals.append((query.template, query.slo_s))
        return [ScalingAction("spin_up", size=1)] if len(self.arrivals) == 2 else []

    def force(self, now_s, clusters):
        return []

    def on_completion(self, query, end_s):
        return None


def test_forced_placements_reach_the_autoscaler_and_its_spin_ups_start_real_clusters(tpch_db, stage, sim_log,
                                                                                       wait_until):
    from sloctl.datasets.querylog import template_table
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    scaler = _RecordingAutoscaler()
    options = GatewayOptions(cluster_sizes=(1,), policy=_policy())
    with Gateway(tpch_db, options, predictor=stage, templates=template_table(sim_log), autoscaler=scaler) as gateway, \
            LocalServer(create_gateway_app(gateway)) as client:
        for _ in range(2):  # high, predicted to miss: placed anyway, and the autoscaler sees each
            assert _run(client, "high", 1e-3)[0] == [[42]]
        assert [t for t, _ in scaler.arrivals] == ["t00", "t00"] and gateway.counts["forced"] == 2
        assert [e["event"] for e in gateway.managed.events] == ["spin_up"]
        new = gateway.managed.events[0]["cluster_id"]
        assert wait_until(lambda: any(c["cluster_id"] == new and c["ready"] for c in gateway.status()["clusters"]),
                          "the spun-up cluster to be ready", timeout_s=60)
        assert {info.cluster_id: info.state for info in gateway.pool.clusters()}[new] == "ready"
        assert _run(client, "low", 100.0)[0] == [[42]]  # still serving, now on two clusters


@pytest.mark.slow
def test_with_iconq_the_router_and_admission_use_its_concurrency_aware_predictions(tpch_db, trained_models, sim_log):
    import trino

    from sloctl.datasets.querylog import template_table
    from sloctl.serving.gateway import Gateway, GatewayOptions
    from sloctl.serving.gateway.app import create_gateway_app
    from sloctl.serving.local import LocalServer

    iconq = trained_models["iconq"].predictor
    options = GatewayOptions(cluster_sizes=(1, 1), policy=_policy())
    with Gateway(tpch_db, options, predictor=iconq, templates=template_table(sim_log)) as gateway, \
            LocalServer(create_gateway_app(gateway)) as client:
        assert gateway.router_kind() == "iconq" and gateway.built.slo_margin is not None
        rows, qid = _run(client, "low", 100.0, template="t03")
        attempt = gateway.get(qid).attempts[0]
        assert rows == [[42]] and attempt["predicted_s"] > 0 and gateway.get(qid).outcome == "admitted"
        with pytest.raises(trino.exceptions.TrinoQueryError) as caught:
            _run(client, "low", 1e-3, template="t03")
        assert caught.value.error_name == "EXCEEDED_TIME_LIMIT"
        rows, qid = _run(client, "high", 1e-3, template="t03")
        assert rows == [[42]] and gateway.get(qid).forced
        # a model swap re-commits what runs: the gateway keeps serving
        gateway.predictor = trained_models["stage"].predictor
        gateway.refresh(force=True)
        assert gateway.router_kind() == "stage"
        assert _run(client, "low", 100.0, template="t03")[0] == [[42]]


def test_the_retry_limits_come_from_sloctl_retry_optimise_on_the_gateway_network():
    from pathlib import Path

    from sloctl.models.retry_network import load_network
    from sloctl.serving.gateway.policy import GatewayPolicy
    from sloctl.training.retry_budget import BudgetSearch, optimise_budgets

    network = load_network(Path(__file__).resolve().parents[2] / "configs" / "networks" / "gateway.yaml")
    policy = optimise_budgets(network.scale_arrivals({"high": 2.0, "low": 2.0}), BudgetSearch(max_retries=3))
    merged = GatewayPolicy().with_retries(policy, "models:/retry-policy@champion v1")
    assert {c: merged.klass(c).retries for c in ("high", "low")} == {
        c: policy.budget(c, "warehouse") for c in ("high", "low")}
    assert merged.provenance["retries"] == "models:/retry-policy@champion v1"
