"""One Svalinn object for every driver: the interface's defaults, and the same decisions through each adapter."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import pytest

from sloctl.control.admission import (
    AdmissionController,
    AdmitAll,
    InFlightRequest,
    MemoryGate,
    RequestProfile,
    Svalinn,
)
from sloctl.control.admission_baselines import ProtegoAdmission, SedaAdmission, SingleQueueAdmission
from sloctl.control.aqm import BottleneckAQM, DelayBudget
from sloctl.control.credits import ClassShare, CreditController
from sloctl.control.msemaphore import EpsilonGreedyTuner
from sloctl.serving.runtime.admission import AdmissionMiddleware, AsyncMSemaphore, MSemaphoreDropped
from sloctl.simulation.server_sim import (
    Request,
    RequestType,
    ServerConfig,
    capacity_per_s,
    isolated_service_s,
    simulate,
)

CONFIG = ServerConfig()
CPU = RequestType("cpu", "high", cpu_s=5e-6, slo_s=15e-6, share=0.5)
MEM = RequestType("mem", "low", cpu_s=2e-6, mem_bytes=600e3, slo_s=186e-6, share=0.5)
REQUEST_FIELDS = ("rtype", "arrival_s", "ctx", "core_s", "mem_s", "ok")
KIND_FIELDS = ("name", "klass", "slo_s", "cpu_s", "lock_s")


def _svalinn_for_the_simulator() -> Svalinn:
    expected = {t.name: isolated_service_s(t, CONFIG) for t in (CPU, MEM)}
    return Svalinn.for_server(CONFIG.cores, CONFIG.bandwidth_bytes_per_s, expected,
                              priorities={"high": 1, "low": 0}, seed=3)


# -- the interface -------------------------------------------------------------------


def test_admit_all_admits_everything_and_never_gates_memory():
    policy, req = AdmitAll(), InFlightRequest(RequestProfile("r", "high", 1.0), 0.0)
    assert policy.on_arrival(req, 0.0) and policy.on_enqueue(req, "cpu", 10**6, 0.0)
    assert policy.mem_gate(req, 0.0) == "acquired"
    assert policy.mem_release(req, 0.0) == [] and policy.mem_release(None, 0.0) == []
    assert policy.mem_expired(0.0) == [] and policy.gauges() == {}
    for callback in (policy.on_dequeue(req, "cpu", 0.0, 0.0), policy.on_complete(req, 0.0),
                     policy.on_drop(req, 0.0, True), policy.tick(0.0), policy.observe_bandwidth(1.0, 0.0)):
        assert callback is None


@pytest.mark.parametrize("controller", [
    AdmitAll(), MemoryGate(2), _svalinn_for_the_simulator(), SingleQueueAdmission(1e-5), SedaAdmission(1000.0),
    ProtegoAdmission()], ids=lambda c: type(c).__name__)
def test_every_controller_implements_the_interface(controller):
    assert isinstance(controller, AdmissionController)
    assert all(isinstance(v, int | float) for v in controller.gauges().values())


def test_simulator_and_live_requests_carry_what_a_controller_reads():
    sim = Request(0, MEM, 0.5)
    live = InFlightRequest(RequestProfile("mem", "low", 0.1), 0.5)
    for req in (sim, live):
        assert all(hasattr(req, f) for f in REQUEST_FIELDS) and all(hasattr(req.rtype, f) for f in KIND_FIELDS)
        assert req.ok and req == req and req != dataclasses.replace(req)  # identity: each is its own token
    assert math.isnan(live.mem_s) and live.ctx == {}


@pytest.mark.parametrize(("build", "field"), [
    (lambda: MemoryGate(), "capacity"),
    (lambda: MemoryGate(1, initial_hold_s=-1.0), "initial_hold_s"),
    (lambda: RequestProfile("r", "high", 0.0), "slo_s"),
    (lambda: RequestProfile("r", "high", 1.0, cpu_s=math.inf), "cpu_s"),
    (lambda: AdmissionMiddleware(None, CreditController(), svalinn=_svalinn_for_the_simulator()), "controller"),
    (lambda: AsyncMSemaphore(1, interval_s=0.0), "interval_s"),
])
def test_bad_parameters_are_named(build, field):
    with pytest.raises(ValueError, match=f"'{field}'"):
        build()


# -- the simulator drives the control object ----------------------------------------------------


class _Recorder:
    """Passes every call on to a controller and logs the call, what the driver had set, and the decision."""

    def __init__(self, inner: AdmissionController) -> None:
        self.inner, self.log = inner, []

    def on_arrival(self, req, now_s):
        return self._log("on_arrival", req, now_s, self.inner.on_arrival(req, now_s), kind=req.rtype)

    def on_enqueue(self, req, bottleneck, queue_len, now_s):
        return self._log("on_enqueue", req, now_s, self.inner.on_enqueue(req, bottleneck, queue_len, now_s),
                         bottleneck=bottleneck, queue_len=queue_len)

    def on_dequeue(self, req, bottleneck, wait_s, now_s):
        self._log("on_dequeue", req, now_s, self.inner.on_dequeue(req, bottleneck, wait_s, now_s),
                  bottleneck=bottleneck, wait_s=wait_s)

    def mem_gate(self, req, now_s):
        return self._log("mem_gate", req, now_s, self.inner.mem_gate(req, now_s))

    def mem_release(self, req, now_s):
        extra = {} if req is None else {"mem_s": req.mem_s}
        return self._log("mem_release", req, now_s, self.inner.mem_release(req, now_s), **extra)

    def mem_expired(self, now_s):
        return self._log("mem_expired", None, now_s, self.inner.mem_expired(now_s))

    def on_complete(self, req, now_s):
        self._log("on_complete", req, now_s, self.inner.on_complete(req, now_s), core_s=req.core_s, ok=req.ok)

    def on_drop(self, req, now_s, partial):
        self._log("on_drop", req, now_s, self.inner.on_drop(req, now_s, partial), partial=partial)

    def tick(self, now_s):
        self._log("tick", None, now_s, self.inner.tick(now_s))

    def observe_bandwidth(self, bytes_per_s, now_s):
        self._log("observe_bandwidth", None, now_s, self.inner.observe_bandwidth(bytes_per_s, now_s),
                  bytes_per_s=bytes_per_s)

    def gauges(self):
        return self.inner.gauges()

    def _log(self, name, req, now_s, result, **args):
        ids = [r.id for r in result] if isinstance(result, list) else result
        self.log.append((name, None if req is None else req.id, now_s, args, ids))
        return result


def _arguments(name: str, req, now_s: float, args: dict) -> tuple:
    if name in ("tick", "mem_expired"):
        return (now_s,)
    if name == "observe_bandwidth":
        return (args["bytes_per_s"], now_s)
    if name == "on_enqueue":
        return (req, args["bottleneck"], args["queue_len"], now_s)
    if name == "on_dequeue":
        return (req, args["bottleneck"], args["wait_s"], now_s)
    if name == "on_drop":
        return (req, now_s, args["partial"])
    return (req, now_s)


def _replay(log: list, controller: AdmissionController) -> list:
    """Feed the recorded events to ``controller`` with live requests; returns its decisions as the log has them."""
    live: dict[int, InFlightRequest] = {}
    ids: dict[InFlightRequest, int] = {}
    out = []
    for name, rid, now_s, args, _ in log:
        if name == "on_arrival":
            live[rid] = InFlightRequest(args["kind"], now_s)
            ids[live[rid]] = rid
        req = live.get(rid)
        if name == "on_complete":
            req.core_s, req.ok = args["core_s"], args["ok"]
        elif name == "mem_release" and req is not None:
            req.mem_s = args["mem_s"]
        result = getattr(controller, name)(*_arguments(name, req, now_s, args))
        out.append((name, rid, now_s, args, [ids[r] for r in result] if isinstance(result, list) else result))
    return out


def test_the_simulator_and_a_plain_driver_get_the_same_decisions_from_svalinn():
    capacity, _ = capacity_per_s([CPU, MEM], CONFIG)
    recorder = _Recorder(_svalinn_for_the_simulator())
    result = simulate([CPU, MEM], recorder, rate_per_s=2 * capacity, duration_s=0.01, seed=5)
    decisions = [entry[4] for entry in recorder.log if not isinstance(entry[4], list)]
    assert result.drop_rate > 0.1  # overloaded: every kind of decision is exercised
    assert {"queued", "dropped", "acquired"} <= set(decisions) and False in decisions
    assert any(entry[0] == "mem_release" and entry[4] for entry in recorder.log)
    assert _replay(recorder.log, _svalinn_for_the_simulator()) == recorder.log
    assert "msem_capacity" in result.series and "credits" in result.series


# -- the middleware drives the control object ------------------------------------------------------


# (time_s, event, request, class or status, budget_ms); the app holds each admitted request until its "done"
SCRIPT = [
    (0.000, "arrive", "a", "high", 400.0), (0.001, "arrive", "b", "low", 400.0),
    (0.002, "arrive", "c", "high", 400.0), (0.003, "arrive", "d", "low", 400.0),  # low over its share: no credit
    (0.010, "done", "a", 200, None), (0.011, "arrive", "e", "high", 5.0),  # 2 waiting × 10 ms / 2 > 5 ms
    (0.012, "arrive", "f", "high", 1000.0), (0.030, "done", "b", 503, None),
    (0.040, "done", "c", 200, None), (0.050, "done", "f", 200, None),
    (0.060, "arrive", "h", "high", 500.0), (0.070, "done", "h", 500, None),
    (0.080, "arrive", "i", "low", 500.0), (0.090, "done", "i", 200, None),
]


def _fresh_svalinn() -> Svalinn:
    credits = CreditController(initial_credits=4, min_credits=2, max_credits=8, experiment_s=0.01, warmup_s=0.005,
                               classes=[ClassShare("high", 2), ClassShare("low", 1)], seed=1)
    return Svalinn(credits, BottleneckAQM("server", servers=2), MemoryGate(2))


def _direct(svalinn: Svalinn) -> dict[str, str]:
    """The script, fed straight to the control object the way the middleware translates it."""
    outcome, live = {}, {}
    for t, event, name, arg, budget_ms in SCRIPT:
        if event == "arrive":
            svalinn.tick(t)
            req = InFlightRequest(RequestProfile(arg, arg, budget_ms / 1000.0), t)
            if not svalinn.on_arrival(req, t):
                svalinn.on_drop(req, t, partial=False)
                outcome[name] = "no_credit"
            elif not svalinn.on_enqueue(req, "cpu", svalinn.cpu_aqm_.queue_len, t):
                svalinn.on_drop(req, t, partial=False)
                outcome[name] = "queue_budget"
            else:
                live[name], outcome[name] = req, "admitted"
        elif name in live:
            req = live.pop(name)
            req.core_s, req.ok = t - req.arrival_s, arg < 500
            svalinn.on_dequeue(req, "cpu", 0.0, t)
            svalinn.on_complete(req, t)
    return outcome


def _through_the_middleware(svalinn: Svalinn) -> dict[str, str]:
    """The same script as HTTP requests through :class:`AdmissionMiddleware` on a scripted clock."""
    now = [0.0]
    gates: dict[str, asyncio.Event] = {}
    statuses: dict[str, int] = {}

    async def app(scope, receive, send):
        name = scope["path"].strip("/")
        await gates[name].wait()
        await send({"type": "http.response.start", "status": statuses[name], "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = AdmissionMiddleware(app, clock=lambda: now[0], svalinn=svalinn)

    async def run() -> dict[str, str]:
        answers: dict[str, list] = {}
        tasks = {}

        async def call(name, klass, budget_ms):
            async def send(message):
                answers[name].append(message)

            scope = {"type": "http", "path": f"/{name}", "headers": [
                (b"x-priority", klass.encode()), (b"x-slo-budget-ms", str(budget_ms).encode())]}
            await middleware(scope, None, send)

        for t, event, name, arg, budget_ms in SCRIPT:
            now[0] = t
            if event == "arrive":
                answers[name], gates[name] = [], asyncio.Event()
                tasks[name] = asyncio.create_task(call(name, arg, budget_ms))
            else:
                statuses[name] = arg
                gates[name].set()
                await tasks[name]
            for _ in range(5):  # let the request reach the app (or be answered)
                await asyncio.sleep(0)
        # The app answers with an empty body; the middleware's own 503s name their reason.
        return {name: json.loads(body)["reason"] if (body := messages[1]["body"]) else "admitted"
                for name, messages in answers.items()}

    return asyncio.run(run())


def test_the_middleware_is_an_adapter_the_same_events_get_the_same_decisions():
    direct, adapted = _fresh_svalinn(), _fresh_svalinn()
    expected = _direct(direct)
    assert set(expected.values()) == {"admitted", "no_credit", "queue_budget"}  # the script exercises all three
    assert _through_the_middleware(adapted) == expected
    for svalinn in (direct, adapted):
        assert svalinn.credits_.in_flight == 0 and svalinn.cpu_aqm_.queue_len == 0
    assert adapted.credits_.history == direct.credits_.history
    assert adapted.credits_.windows_ == direct.credits_.windows_
    assert (adapted.cpu_aqm_.mean_hold_s, adapted.cpu_aqm_.drops) == (direct.cpu_aqm_.mean_hold_s,
                                                                     direct.cpu_aqm_.drops)


def test_a_non_finite_budget_header_is_a_422_and_takes_no_credit():
    async def app(scope, receive, send):  # pragma: no cover - never reached
        raise AssertionError

    middleware = AdmissionMiddleware(app)
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/x", "headers": [(b"x-slo-budget-ms", b"inf")]}
    asyncio.run(middleware(scope, None, send))
    assert sent[0]["status"] == 422 and middleware.controller.in_flight == 0


# -- the asyncio m_semaphore drives the control gate ------------------------------------------------


def test_async_msemaphore_shares_the_middlewares_svalinn_and_its_decisions():
    svalinn = _fresh_svalinn()
    sem = AsyncMSemaphore.around(svalinn.memory_)
    AdmissionMiddleware(None, svalinn=svalinn)

    async def run():
        assert sem.try_acquire() and sem.try_acquire() and not sem.try_acquire()
        assert svalinn.msem_.in_use == 2 and svalinn.msem_.drops == 1  # the gate decided and counted
        sem.release(0.2)
        assert svalinn.mem_hold_s_ == 0.2  # the first reported hold replaces the empty estimate
        assert sem.try_acquire()
        waiter = asyncio.create_task(sem.acquire(DelayBudget(10.0)))
        await asyncio.sleep(0)
        assert svalinn.msem_.queued == 1
        with pytest.raises(MSemaphoreDropped, match="exceeds the remaining budget"):
            await sem.acquire(0.05)  # (1 + 1) × 0.2 s / 2 slots > 50 ms
        waiter.cancel()  # a parked caller that gives up leaves the gate's queue
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert svalinn.msem_.queued == 0 and svalinn.msem_.in_use == 2

    asyncio.run(run())


def test_async_msemaphore_tunes_exactly_as_the_gate_driven_directly():
    now = [0.0]  # steps and bandwidths are exact binary fractions, so both sides see the same numbers
    tuned = AsyncMSemaphore(3, tuner=EpsilonGreedyTuner(6, 100.0, seed=2, initial_capacity=3), interval_s=0.125,
                            clock=lambda: now[0])
    direct = MemoryGate(3, EpsilonGreedyTuner(6, 100.0, seed=2, initial_capacity=3))
    for step in range(1, 30):
        now[0] = 0.25 * step
        tuned.record_bytes(40.0 * min(tuned.capacity, 4) * 0.25)  # bandwidth grows with capacity up to 4
        assert tuned.try_acquire()
        tuned.release()
        direct.observe_bandwidth(40.0 * min(direct.msem_.capacity, 4), now[0])
        direct.tick(now[0])
        assert tuned.capacity == direct.msem_.capacity
    assert tuned.gate.capacity_log_ == direct.capacity_log_
    assert len(direct.capacity_log_) == 30 and {c for _, c, _ in direct.capacity_log_} != {3}


def test_dropping_a_parked_request_frees_its_place_in_the_queue():
    gate = MemoryGate(1, initial_hold_s=0.001)
    svalinn = Svalinn(CreditController(), BottleneckAQM("cpu", servers=1), gate)
    first, second = (InFlightRequest(RequestProfile("m", "all", 1.0), 0.0) for _ in range(2))
    for req in (first, second):
        assert svalinn.on_arrival(req, 0.0)
    assert svalinn.mem_gate(first, 0.0) == "acquired" and svalinn.mem_gate(second, 0.0) == "queued"
    svalinn.on_drop(second, 0.001, partial=True)
    assert gate.msem_.queued == 0 and second.ctx["budget"].dropped and svalinn.credits_.in_flight == 1
    first.mem_s = 0.002
    assert svalinn.mem_release(first, 0.002) == [] and gate.msem_.in_use == 0


def test_run_queue_wait_counts_each_queued_request_at_its_types_core_time():
    """One mean hold per request misjudges a queue of long requests; per-type core time does not."""
    credits = CreditController(initial_credits=1000, min_credits=1000, max_credits=1000, seed=0)
    svalinn = Svalinn(credits, BottleneckAQM("cpu", servers=2), MemoryGate(2))

    def request(kind, slo_s, t):
        req = InFlightRequest(RequestProfile(kind, "all", slo_s), t)
        assert svalinn.on_arrival(req, t)
        return req

    # Learn core times: 19 short requests of 1 ms and one long of 40 ms (all-types EWMA ends near 8 ms).
    for i, (kind, core_s) in enumerate([("short", 0.001)] * 19 + [("long", 0.040)]):
        req = request(kind, 1.0, i * 0.1)
        assert svalinn.on_enqueue(req, "cpu", 0, req.arrival_s)
        req.core_s, req.ok = core_s, True
        svalinn.on_dequeue(req, "cpu", 0.0, req.arrival_s + core_s)
        svalinn.on_complete(req, req.arrival_s + core_s)
    queued = [request("long", 1.0, 10.0) for _ in range(2)]
    assert all(svalinn.on_enqueue(r, "cpu", 0, 10.0) for r in queued)
    # 2 long requests queued on 2 cores: a 40 ms wait. One mean hold (< 20 ms) would admit a 30 ms budget.
    assert 2 * svalinn.cpu_aqm_.mean_hold_s / 2 < 0.030
    late = request("short", 0.030, 10.0)
    assert not svalinn.on_enqueue(late, "cpu", 2, 10.0)
    assert svalinn.on_enqueue(request("short", 0.050, 10.0), "cpu", 2, 10.0)
    for r in queued:  # leaving the queue takes its work off the prediction
        svalinn.on_dequeue(r, "cpu", 0.0, 10.04)
    assert svalinn.on_enqueue(request("short", 0.030, 10.04), "cpu", 1, 10.04)


def test_run_queue_holds_loose_requests_to_the_tightest_active_budget():
    """On one FIFO, a loose-budget request admitted into a long queue makes every tight one behind it late."""
    def fill(aqm, n):
        for _ in range(n):
            aqm.joined("loose")

    for protect, admitted in ((False, True), (True, False)):
        aqm = BottleneckAQM("cpu", servers=1, protect_tightest=protect, activity=0.1, min_share=0.05)
        aqm.observe_hold(0.010, "loose")
        for _ in range(5):  # both kinds arrive: tight ones with 25 ms of budget, loose ones with 100 ms
            assert not aqm.should_drop(DelayBudget(0.030, 0.005), "tight")
            assert not aqm.should_drop(DelayBudget(0.110, 0.010), "loose")
        assert aqm.target_s() == (pytest.approx(0.025) if protect else float("inf"))
        fill(aqm, 3)  # 30 ms of work queued: past the tight kind's 25 ms, well within the loose kind's 100 ms
        assert aqm.should_drop(DelayBudget(0.030, 0.005), "tight")
        assert aqm.should_drop(DelayBudget(0.110, 0.010), "loose") is not admitted


def test_a_tightest_scale_gives_loose_requests_part_of_the_queue_and_never_loosens_the_tight_ones():
    aqm = BottleneckAQM("cpu", servers=1, protect_tightest=True, activity=0.1, min_share=0.05, tightest_scale=1.4)
    aqm.observe_hold(0.010, "loose")
    for _ in range(5):
        aqm.should_drop(DelayBudget(0.030, 0.005), "tight")
        aqm.should_drop(DelayBudget(0.110, 0.010), "loose")
    assert aqm.target_s() == pytest.approx(1.4 * 0.025)
    for _ in range(3):  # 30 ms queued: within 1.4 x 25 ms for the loose kind, still past the tight kind's own 25 ms
        aqm.joined("loose")
    assert not aqm.should_drop(DelayBudget(0.110, 0.010), "loose")
    assert aqm.should_drop(DelayBudget(0.030, 0.005), "tight")
    aqm.joined("loose")  # 40 ms: past 35 ms
    assert aqm.should_drop(DelayBudget(0.110, 0.010), "loose")
    for bad in (0.9, math.inf, math.nan):
        with pytest.raises(ValueError, match="tightest_scale"):
            BottleneckAQM("cpu", protect_tightest=True, tightest_scale=bad)
    svalinn = Svalinn.for_server(CONFIG.cores, CONFIG.bandwidth_bytes_per_s, {"cpu": 5e-6},
                                 run_queue_target_scale=1.3)
    assert svalinn.cpu_aqm_.tightest_scale == 1.3 and svalinn.cpu_aqm_.protect_tightest


def test_a_kind_that_stopped_arriving_no_longer_sets_the_run_queues_target():
    aqm = BottleneckAQM("cpu", servers=1, protect_tightest=True, activity=0.1, min_share=0.05)
    aqm.observe_hold(0.010, "loose")
    aqm.should_drop(DelayBudget(0.030, 0.005), "tight")
    assert aqm.target_s() == pytest.approx(0.025)
    for _ in range(40):  # 40 loose arrivals: the tight kind's share decays below 5 %
        aqm.should_drop(DelayBudget(0.110, 0.010), "loose")
    assert aqm.target_s() == pytest.approx(0.100)
    for bad in ({"activity": 0.0}, {"min_share": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            BottleneckAQM("cpu", **bad)


def _lock_svalinn(**kwargs):
    credits = CreditController(initial_credits=1000, min_credits=1000, max_credits=1000, seed=0)
    return Svalinn(credits, BottleneckAQM("cpu", servers=1), MemoryGate(2), {"lk": 12e-6}, **kwargs)


def _lock_request(svalinn, t, slo_s=36e-6):
    req = InFlightRequest(RequestType("lk", "be", cpu_s=2e-6, lock="hot", lock_s=10e-6, slo_s=slo_s), t)
    assert svalinn.on_arrival(req, t)
    return req


def test_a_request_that_will_take_a_lock_keeps_one_section_of_budget_for_it_at_the_run_queue():
    for holds, admitted in ((0.0, True), (1.0, False)):
        svalinn = _lock_svalinn(lock_reserve_holds=holds, lock_spin_gaps=None)
        svalinn._aqm("hot").observe_hold(10e-6)  # the lock's sections: 10 us
        svalinn.cpu_aqm_.observe_hold(20e-6, "x")
        svalinn.cpu_aqm_.joined("x")  # 20 us of work queued ahead on the one core
        # 24 us of budget: the 20 us run-queue wait fits it, not with 10 us kept back for the lock
        assert svalinn.on_enqueue(_lock_request(svalinn, 0.0), "cpu", 1, 0.0) is admitted
    with pytest.raises(ValueError, match="'reserve_s'"):
        BottleneckAQM("cpu").should_drop(DelayBudget(1.0), reserve_s=-1.0)
    for bad in ({"lock_reserve_holds": -1.0}, {"lock_spin_gaps": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            _lock_svalinn(**bad)


def test_a_lock_refuses_a_long_spin_only_while_requests_wait_for_a_core():
    def busy_lock(queued_for_core: bool):
        svalinn = _lock_svalinn(lock_reserve_holds=0.0)
        hot = svalinn._aqm("hot")
        hot.observe_hold(10e-6)
        if queued_for_core:
            svalinn.cpu_aqm_.joined("x")
        t = 0.0
        for _ in range(30):  # arrivals at the lock every 2 us; each takes the free lock and lets it go
            req = _lock_request(svalinn, t)
            assert svalinn.on_enqueue(req, "hot", 0, t)
            svalinn.on_dequeue(req, "hot", 0.0, t)
            svalinn.on_release(req, "hot", t)
            t += 2e-6
        holder = _lock_request(svalinn, t)
        assert svalinn.on_enqueue(holder, "hot", 0, t)
        svalinn.on_dequeue(holder, "hot", 0.0, t)  # holds the lock for 10 us from t
        return svalinn, t

    # 9 us left of the holder's section: 4.5 mean gaps of 2 us, more than the 2 allowed
    svalinn, t = busy_lock(queued_for_core=True)
    late = _lock_request(svalinn, t + 1e-6)
    assert not svalinn.on_enqueue(late, "hot", 0, t + 1e-6) and late.ctx["budget"].dropped
    # 3 us left (1.5 gaps): this waiter is worth its spin
    svalinn, t = busy_lock(queued_for_core=True)
    assert svalinn.on_enqueue(_lock_request(svalinn, t + 7e-6), "hot", 0, t + 7e-6)
    # idle cores: spinning costs no one, the budget alone decides
    svalinn, t = busy_lock(queued_for_core=False)
    assert svalinn.on_enqueue(_lock_request(svalinn, t + 1e-6), "hot", 0, t + 1e-6)
