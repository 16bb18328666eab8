"""The Batch Simulator of the Policy Tuner (AutoSLO §7.3).

:func:`simulate_batch` (alias ``SimulateBatch``) runs every execution
configuration on every workload and returns the matrix ``R[i][j]``: violation
rate, cost and per-query timeline of configuration ``i`` on workload ``j``.

Design:

* A *runner* simulates one cell: ``runner(config, queries, seed) -> CellResult``.
  It must be a picklable top-level callable holding plain data
  (:class:`WarehouseRunner` holds the emulated world and, for model-based
  routers, the *folder* of a saved predictor, loaded once per process).
* Cells run on a spawn-context ``ProcessPoolExecutor`` by default. The runner
  and the workloads travel once per worker (pool initializer); a task is only
  ``(i, j, config, seed)``. With ``ray_address`` the cells run as Ray tasks,
  runner and workloads put once in the object store.
* Workload ``j`` is simulated with seed ``SeedSequence([seed, j])`` under
  every configuration (common random numbers: configurations are compared on
  the same service-time draws). The result depends on nothing else, so the
  process pool, Ray, and any worker count give identical matrices.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sloctl.control.autoscaler import QueueTrigger, SpinupTrigger, autoscaler_for
from sloctl.control.router import IconqRouter, RoundRobinRouter, StageCostRouter
from sloctl.control.scheduler import ExecutionConfig, ScheduledSpinups, Timeline
from sloctl.core.kinds import RouterKind
from sloctl.models.online import OnlinePredictor, one_inference_thread
from sloctl.registry.bundles import load_predictor
from sloctl.simulation.engine import WarehouseSimulator

if TYPE_CHECKING:
    import pandas as pd

    from sloctl.control.router import Query
    from sloctl.simulation.emulator import WarehouseEmulator
    from sloctl.simulation.engine import SimulationResult

__all__ = ["BatchResult", "CellResult", "SimulateBatch", "SimulationPool", "WarehouseRunner", "cell_seed",
           "pack_folder", "simulate_batch", "timeline_of"]

Runner = Callable[[ExecutionConfig, Sequence["Query"], int], "CellResult"]


@dataclass(eq=False)
class CellResult:
    """One simulation: configuration ``i`` on workload ``j``."""

    vr: float
    cost: float
    timeline: Timeline
    explain: dict[str, Any] | None = None  # where the cost went (explain_of); None: not recorded

    @property
    def n_queries(self) -> int:
        return len(self.timeline.arrival_s)

    def equals(self, other: CellResult) -> bool:
        return self.vr == other.vr and self.cost == other.cost and self.timeline.equals(other.timeline)


@dataclass(eq=False)
class BatchResult:
    """The result matrix ``R``: ``R[i][j]`` is configuration ``i`` on workload ``j``."""

    cells: list[list[CellResult]]
    wall_s: float = 0.0
    backend: str = "inline"
    workers: int = 1

    def __getitem__(self, i: int) -> list[CellResult]:
        return self.cells[i]

    def __len__(self) -> int:
        return len(self.cells)

    def vr(self) -> np.ndarray:
        """Violation rates, shape (configs, workloads)."""
        return np.array([[c.vr for c in row] for row in self.cells])

    def cost(self) -> np.ndarray:
        """Costs, shape (configs, workloads)."""
        return np.array([[c.cost for c in row] for row in self.cells])

    def n_queries(self) -> int:
        return sum(c.n_queries for row in self.cells for c in row)

    def equals(self, other: BatchResult) -> bool:
        return len(self) == len(other) and all(
            len(a) == len(b) and all(x.equals(y) for x, y in zip(a, b, strict=True))
            for a, b in zip(self.cells, other.cells, strict=True))


def cell_seed(seed: int, j: int) -> int:
    """The simulation seed of workload ``j`` (the same under every configuration)."""
    return int(np.random.SeedSequence([seed, j]).generate_state(1)[0])


def explain_of(result: SimulationResult) -> dict[str, Any]:
    """Where one simulation's money went: per cluster and in total.

    ``billed_s`` is the time each cluster's billing timer ran, ``busy_s``
    the part of it with a query running, ``minimum_added_s`` the rest (what
    the minimum windows added: a window opened for a short burst, or kept
    open past the last query), ``windows`` the billing windows opened (each a
    restart of the timer). ``busy_cost`` / ``cost`` is the share of the bill
    that bought work. Spin-ups and tear-downs are counted by who asked
    (``plan``: a scheduled spin-up; ``size-selector``: a trigger fired and the
    Spin-up Size Selector chose the size; ``queue@N``, ``rais-forecast``,
    ``idle``, ``resized``).
    """
    clusters = []
    for cid, u in sorted(result.usage.items()):
        price = u["cost"] / (u["size"] * u["billed_s"]) if u["billed_s"] > 0 else 0.0
        clusters.append({"cluster_id": cid, "size": int(u["size"]), "cost": u["cost"], "billed_s": u["billed_s"],
                         "busy_s": u["busy_s"], "minimum_added_s": u["minimum_added_s"],
                         "windows": int(u["windows"]), "busy_cost": price * u["size"] * u["busy_s"],
                         "torn_down": bool(u["torn_down"])})
    spin_ups: dict[str, int] = {}
    tear_downs: dict[str, int] = {}
    for e in result.events:
        if e["event"] == "spin_up":
            spin_ups[e.get("reason") or "unknown"] = spin_ups.get(e.get("reason") or "unknown", 0) + 1
        elif e["event"] == "tear_down":
            tear_downs[e.get("reason") or "unknown"] = tear_downs.get(e.get("reason") or "unknown", 0) + 1
    cost = sum(c["cost"] for c in clusters)
    busy_cost = sum(c["busy_cost"] for c in clusters)
    return {"cost": cost, "busy_cost": busy_cost, "busy_share": busy_cost / cost if cost > 0 else None,
            "billed_s": sum(c["billed_s"] for c in clusters), "busy_s": sum(c["busy_s"] for c in clusters),
            "minimum_added_s": sum(c["minimum_added_s"] for c in clusters),
            "windows": sum(c["windows"] for c in clusters), "spin_ups": spin_ups, "tear_downs": tear_downs,
            "clusters": clusters}


def timeline_of(result: SimulationResult, start_clusters: int) -> Timeline:
    """Per-query arrays (arrival order) and the provisioned-cluster count of a simulation."""
    frame = result.queries.sort_values(["arrival_s", "query_id"], kind="stable") if len(result.queries) else None
    arrival = frame["arrival_s"].to_numpy(float) if frame is not None else np.empty(0)
    end = frame["end_s"].to_numpy(float) if frame is not None else np.empty(0)
    violated = frame["violated"].to_numpy(bool) if frame is not None else np.empty(0, bool)
    times, counts, n = [0.0], [start_clusters], start_clusters
    for e in result.events:
        if e["event"] in ("spin_up", "tear_down"):
            n += 1 if e["event"] == "spin_up" else -1
            times.append(float(e["t"]))
            counts.append(n)
    return Timeline(arrival, arrival.copy(), end, violated, np.asarray(times), np.asarray(counts))


_PREDICTORS: dict[str, Any] = {}
_UNPACKED: dict[str, str] = {}


def pack_folder(folder: str | os.PathLike[str]) -> bytes:
    """A saved predictor's folder as one tar archive (for :attr:`WarehouseRunner.predictor_bundle`)."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(os.fspath(folder), arcname=".")
    return buffer.getvalue()


def _unpack(bundle: bytes) -> str:
    # once per process and archive: a folder of this host's temporary directory
    import hashlib
    import io
    import tarfile
    import tempfile

    key = hashlib.sha256(bundle).hexdigest()
    if key not in _UNPACKED:
        folder = tempfile.mkdtemp(prefix=f"sloctl-predictor-{key[:12]}-")
        with tarfile.open(fileobj=io.BytesIO(bundle), mode="r") as tar:
            # the "data" filter (Python >= 3.11.4) refuses links and paths out of the folder
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(folder, **kwargs)
        _UNPACKED[key] = folder
    return _UNPACKED[key]


def _load_predictor(folder: str) -> Any:
    # once per process: workers never receive a model, only its folder
    if folder not in _PREDICTORS:

        _PREDICTORS[folder] = load_predictor(folder)
    return _PREDICTORS[folder]


@dataclass(eq=False)
class WarehouseRunner:
    """Simulates one cell in the emulated warehouse (picklable: plain data and a model folder).

    Attributes:
        world: the emulated warehouse.
        minimum_s, price_per_unit_s: billing.
        router: ``round-robin``, ``stage`` (Stage + cost) or ``iconq`` (Iconq+).
        predictor_dir: folder written by
            :func:`~sloctl.registry.bundles.save_predictor` (model-based routers).
        table: feature table of the templates (model-based routers).
        trigger: reactive spin-up trigger, ``spinup`` (Algorithm 2) or ``queue``
            (Queue@N); used when the configuration has autoscaler parameters.
        queue_n: N of the Queue@N trigger.
        spinup_delay_s, max_clusters: used when the configuration has no
            reactive autoscaler (otherwise its own values apply).
        slo_margin, cost_tolerance: Iconq+ router settings.
        predictor_bundle: the predictor folder packed by :func:`pack_folder`,
            for workers on hosts where ``predictor_dir`` does not exist (a
            Ray cluster): unpacked there once per process.
    """

    world: WarehouseEmulator
    minimum_s: float = 60.0
    price_per_unit_s: float = 1.0
    router: str = "round-robin"
    predictor_dir: str | None = None
    table: pd.DataFrame | None = None
    trigger: str = "spinup"
    queue_n: int = 8
    spinup_delay_s: float = 300.0
    max_clusters: int = 4
    slo_margin: float = 0.3
    cost_tolerance: float = 3.0
    predictor_bundle: bytes | None = field(default=None, repr=False)

    def _predictor_folder(self) -> str | None:
        if self.predictor_bundle is not None and (self.predictor_dir is None
                                                  or not os.path.isdir(self.predictor_dir)):
            return _unpack(self.predictor_bundle)
        return self.predictor_dir

    def _router(self) -> tuple[Any, Callable[[Any], Any]]:

        if self.router == RouterKind.ROUND_ROBIN:
            return RoundRobinRouter(), lambda model: RoundRobinRouter()
        folder = self._predictor_folder()
        if self.router not in (RouterKind.STAGE, RouterKind.ICONQ) or folder is None or self.table is None:
            raise ValueError(f"The 'router' parameter of WarehouseRunner must be 'round-robin', or 'stage'/'iconq' "
                             f"with predictor_dir and table; got {self.router!r}.")
        model = OnlinePredictor(_load_predictor(folder), self.table, use_iconq=self.router == RouterKind.ICONQ)
        if self.router == RouterKind.STAGE:
            return StageCostRouter(model), StageCostRouter

        def make_router(m: Any) -> IconqRouter:
            return IconqRouter(m, slo_margin=self.slo_margin, cost_tolerance=self.cost_tolerance)

        return make_router(model), make_router

    def __call__(self, config: ExecutionConfig, queries: Sequence[Query], seed: int) -> CellResult:
        if self.router == RouterKind.ROUND_ROBIN:
            return self._run(config, queries, seed)
        with one_inference_thread():
            return self._run(config, queries, seed)

    def _run(self, config: ExecutionConfig, queries: Sequence[Query], seed: int) -> CellResult:
        router, make_router = self._router()
        inner = None
        if config.autoscaler is not None:
            if self.router == RouterKind.ROUND_ROBIN:
                raise ValueError("A reactive autoscaler needs a model-based router ('stage' or 'iconq'); "
                                 "set ExecutionConfig.autoscaler=None to run a schedule with round-robin.")
            a = config.autoscaler
            trigger = SpinupTrigger(a.theta, a.tau_trigger) if self.trigger == "spinup" else QueueTrigger(self.queue_n)
            inner = autoscaler_for(a, router, make_router, trigger=trigger, minimum_s=self.minimum_s,
                                   price_per_unit_s=self.price_per_unit_s)
        scheduled = ScheduledSpinups(config.spinups, inner, spinup_delay_s=self.spinup_delay_s,
                                     max_clusters=self.max_clusters)
        clusters = [(f"c{i}-s{s}", s) for i, s in enumerate(config.start_sizes)]
        sim = WarehouseSimulator(self.world, clusters, router, price_per_unit_s=self.price_per_unit_s,
                                 minimum_s=self.minimum_s, seed=seed, autoscaler=scheduled)
        out = sim.run(list(queries))
        return CellResult(out.violation_rate, out.cost, timeline_of(out, len(clusters)))


# -- process pool: runner and workloads shipped once per worker -------------------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(runner: Runner) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per simulation; torch reads this on import
    _WORKER["runner"] = runner


def _pool_task(i: int, j: int, config: ExecutionConfig, seed: int, queries: Sequence[Query]
               ) -> tuple[int, int, CellResult]:
    return i, j, _WORKER["runner"](config, queries, seed)


class SimulationPool:
    """SimulateBatch on a process pool kept across calls: the Policy Tuner's hundreds of batches, one start.

    :func:`simulate_batch` starts one of these per call; the tuner calls it once
    per search batch and per scheduler round, and each start (a spawned
    interpreter importing PyTorch and loading the model) costs seconds, so
    the tuner keeps one. The runner travels once per worker and each task
    carries its workload. Results equal :func:`simulate_batch`'s for the same
    runner and seed.

    Use as a context manager (the pool is shut down on exit); ``workers=1``
    runs inline, with no processes.
    """

    def __init__(self, runner: Runner, workers: int | None = None) -> None:
        self.runner = runner
        self.workers = max(int(workers or os.cpu_count() or 1), 1)
        self._pool: Any = None

    def __enter__(self) -> SimulationPool:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def simulate(self, configs: Sequence[ExecutionConfig], workloads: Sequence[Sequence[Query]], *, seed: int = 0,
                 on_progress: Callable[[int, int], None] | None = None) -> BatchResult:
        """The matrix ``R`` of ``configs`` × ``workloads`` (as :func:`simulate_batch`)."""
        import time

        started = time.perf_counter()
        total = len(configs) * len(workloads)
        cells: list[list[CellResult | None]] = [[None] * len(workloads) for _ in configs]
        tasks = [(i, j, config, cell_seed(seed, j)) for i, config in enumerate(configs)
                 for j in range(len(workloads))]
        done = 0
        if self.workers <= 1 or total <= 1:
            for i, j, config, s in tasks:
                cells[i][j] = self.runner(config, workloads[j], s)
                done += 1
                if on_progress is not None:
                    on_progress(done, total)
            return BatchResult(cells, time.perf_counter() - started, "inline", 1)  # type: ignore[arg-type]
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(self.runner,))
        from concurrent.futures import as_completed

        futures = [self._pool.submit(_pool_task, i, j, config, s, workloads[j]) for i, j, config, s in tasks]
        for future in as_completed(futures):
            i, j, cell = future.result()
            cells[i][j] = cell
            done += 1
            if on_progress is not None:
                on_progress(done, total)
        return BatchResult(cells, time.perf_counter() - started, "process", self.workers)  # type: ignore[arg-type]

    __call__ = simulate


def _ray_cell(runner: Runner, workloads: Sequence[Sequence[Query]], i: int, j: int, config: ExecutionConfig,
              seed: int) -> tuple[int, int, CellResult]:
    return i, j, runner(config, workloads[j], seed)


def simulate_batch(configs: Sequence[ExecutionConfig], workloads: Sequence[Sequence[Query]], *, runner: Runner,
                   workers: int | None = None, ray_address: str | None = None, seed: int = 0,
                   on_progress: Callable[[int, int], None] | None = None) -> BatchResult:
    """SimulateBatch (§7.3): every configuration on every workload, in parallel.

    Args:
        configs: the execution configurations ``{E_i}``.
        workloads: the workloads ``W`` (lists of :class:`~sloctl.control.router.Query`).
        runner: picklable top-level callable ``runner(config, queries, seed) -> CellResult``.
        workers: processes (default: all cores); 1 runs in this process.
            With ``ray_address="local"``: the CPUs of the local Ray cluster.
        ray_address: run on Ray instead: an address for ``ray.init``
            (``ray://head:10001``, ``auto``, ``head:6379``), or ``"local"``
            for a cluster of this machine started here (and kept for later
            calls); an already initialised Ray is reused. Every node needs
            sloctl installed (the runner is unpickled there).
        seed: base seed (see :func:`cell_seed`).
        on_progress: called as ``on_progress(done, total)`` after each cell.

    Returns:
        The matrix ``R`` (:class:`BatchResult`).
    """
    import time

    started = time.perf_counter()
    total = len(configs) * len(workloads)
    cells: list[list[CellResult | None]] = [[None] * len(workloads) for _ in configs]
    tasks = [(i, j, config, cell_seed(seed, j)) for i, config in enumerate(configs) for j in range(len(workloads))]
    done = 0

    def store(i: int, j: int, cell: CellResult) -> None:
        nonlocal done
        cells[i][j] = cell
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    if ray_address is not None:
        backend, n_workers = "ray", 0
        try:
            import ray
        except ImportError as exc:
            raise ImportError("Ray is not installed (ray_address needs it): pip install 'sloctl[ray]'") from exc

        if not ray.is_initialized():
            if ray_address == "local":  # a cluster of this machine only, started here (token auth would only bar us)
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=None if ray_address == "local" else ray_address, include_dashboard=False,
                     log_to_driver=False, num_cpus=workers if ray_address == "local" else None)
        remote = ray.remote(num_cpus=1)(_ray_cell)
        runner_ref, workloads_ref = ray.put(runner), ray.put(list(workloads))
        pending = [remote.remote(runner_ref, workloads_ref, *task) for task in tasks]
        n_workers = int(ray.cluster_resources().get("CPU", 0))
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            store(*ray.get(ready[0]))
    else:  # a pool for this call only
        with SimulationPool(runner, min(workers or os.cpu_count() or 1, max(total, 1))) as pool:
            result = pool.simulate(configs, workloads, seed=seed, on_progress=on_progress)
        return BatchResult(result.cells, time.perf_counter() - started, result.backend, result.workers)
    return BatchResult(cells, time.perf_counter() - started, backend, max(n_workers, 1))  # type: ignore[arg-type]


SimulateBatch = simulate_batch
