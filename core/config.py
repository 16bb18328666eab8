"""Configuration sections as frozen dataclasses, and the mapping helper that fills them from YAML.

Every key a file leaves out takes the dataclass default, so a user file names
only what it changes. Unknown keys and values of the wrong type are errors
that name the key path and the file, e.g.::

    ConfigError: configs/my.yaml: unknown key 'workload.rat' (known keys: ...)

The whole file (:class:`sloctl.config.SloctlConfig`) is assembled at the top,
beside the CLI; the sections the library needs live here so that any layer
may take them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from sloctl.core.errors import ConfigError

__all__ = [
    "CollectConfig",
    "DemoConfig",
    "IconqSection",
    "RegistrySection",
    "RouterSection",
    "ServeSection",
    "StateSection",
    "WarehouseConfig",
    "WorkloadConfig",
    "from_mapping",
]


Benchmark = Literal["tpch", "tpcds"]
WorkloadKind = Literal["base", "phased", "isolated", "contour"]


@dataclass(frozen=True)
class WarehouseConfig:
    """Where the embedded DuckDB warehouse keeps its data and how clusters start.

    Attributes:
        data_dir: folder for generated TPC databases (created on demand).
        warmup_s: extra delay after a cluster's process has started, before it
            accepts queries (the spin-up delay is process start + this).
        query_timeout_s: per-query timeout; a query still running then is
            interrupted and logged as ``status=timeout`` (a censored row).
        allow_oversubscribe: run a pool whose CPU budgets exceed the cores it
            may use (budgets then overlap); every row is then marked.
        size_unit_cores: the CPU budget of one size unit, in cores: a cluster
            of size N may use N × this much CPU time (cgroup CFS bandwidth,
            see ``sloctl.datasets.cpu_budget``). ``null`` pins N whole cores
            per cluster instead (no budgets).
        reserved_cores: cores kept for the controller (the router, the
            autoscaler, the load generator); clusters never run on them.
        cpu_period_s: CFS period of the budgets; short, so that throttling
            adds millisecond stalls, not 100 ms ones.
        budget_mode: ``auto`` (cgroups where writable, else pinning the
            budget rounded up to whole cores, said once and recorded in the
            log's metadata), ``cgroup`` (refuse to run without them) or
            ``pinning``.
    """

    data_dir: str = "data"
    warmup_s: float = 0.0
    query_timeout_s: float = 60.0
    allow_oversubscribe: bool = False
    size_unit_cores: float | None = 0.25
    reserved_cores: int = 1
    cpu_period_s: float = 0.01
    budget_mode: Literal["auto", "cgroup", "pinning"] = "auto"

    def pool_options(self) -> dict[str, Any]:
        """The CPU-budget keyword arguments of ``DuckDBClusterPool`` this section asks for."""
        return {"size_unit_cores": self.size_unit_cores, "reserved_cores": self.reserved_cores,
                "period_s": self.cpu_period_s, "budget_mode": self.budget_mode}


@dataclass(frozen=True)
class WorkloadConfig:
    """A seeded workload: which queries arrive, and when.

    Attributes:
        kind: ``base`` (BaseWorkload(λ): ``copies`` of every template, shuffled,
            Poisson arrivals at ``rate_per_s``), ``phased`` (alternating
            ``low_count`` queries at ``low_rate_per_s`` and ``high_count`` at
            ``high_rate_per_s``), ``isolated`` (one query at a time) or
            ``contour`` (arrival rate follows hourly counts).
        contour_file: Parquet with hourly ``query_count`` per ``instance_id``
            (the Redset hourly layout); empty means a synthetic daily contour.
        contour_instance: which ``instance_id`` to follow (-1: the busiest).
        contour_hours: how many hours of the contour to replay.
        time_compression: one workload second stands for this many real
            seconds of the contour (3600 replays an hour in a second).
        count_scale: multiplies the hourly counts before compression.
    """

    kind: WorkloadKind = "base"
    rate_per_s: float = 1.0
    copies: int = 3
    seed: int = 0
    low_rate_per_s: float = 0.5
    high_rate_per_s: float = 4.0
    low_count: int = 15
    high_count: int = 10
    contour_file: str = ""
    contour_instance: int = -1
    contour_hours: int = 24
    time_compression: float = 3600.0
    count_scale: float = 0.05


@dataclass(frozen=True)
class CollectConfig:
    """What ``sloctl collect`` runs: a benchmark at a scale on cluster sizes."""

    benchmark: Benchmark = "tpch"
    scale_factor: float = 0.1
    sizes: tuple[int, ...] = (1, 2)


@dataclass(frozen=True)
class DemoConfig:
    """The short run behind ``make demo``."""

    benchmark: Benchmark = "tpch"
    scale_factor: float = 1.0
    sizes: tuple[int, ...] = (1, 2)
    isolated_copies: int = 1
    concurrent_copies: int = 3
    concurrent_rate_per_s: float = 8.0
    seed: int = 7
    reports_dir: str = "reports"


IconqVariant = Literal["iconq", "size", "censored", "iconq_plus"]


@dataclass(frozen=True)
class IconqSection:
    """How Iconq+ (and its ablation variants) train (AutoSLO §8.3.2 defaults).

    Attributes:
        variant: ``iconq`` (reverse after-pass, no size features, no
            censoring), ``size`` (+size features), ``censored`` (+censored
            samples) or ``iconq_plus`` (+chronological after-pass).
        partial_per_query: sampled partial neighbour sets per query (§4.3).
        val_fraction, test_fraction: split by query, seeded.
        batch_size: the batch ``lr`` is set for, and the smallest used.
        max_batch_size: batches grow with the data (at least 200 steps an
            epoch) up to this many samples; batches of similar neighbour
            counts keep the padding small.
        lr_scaling: ``sqrt``: a batch ``k`` times ``batch_size`` trains at
            ``lr * sqrt(k)``; ``none``: at ``lr``.
        max_train_s: wall-clock budget of one training (seconds); when it is
            spent, training ends with the best checkpoint so far. ``null``: none.
        loader_workers: processes building batches beside training (0: in
            the training process; on 2 cores, workers take a core from it).
        split: ``random`` (by query, seeded) or ``time`` (the latest rows
            validate and test: a later time slice).
        learn_rows: ``curve``: train on growing prefixes of the training rows
            (10k, 30k, 100k, ... rows, then all) and stop adding data when
            validation p90 improves by less than ``curve_tolerance``;
            ``all``: every training row at once.
        curve_tolerance: the relative improvement a larger prefix must bring.
        check_every_samples: validate (and count early stopping's patience)
            every this many training samples when an epoch holds more;
            otherwise once an epoch.
        max_val_rows: validation during training (early stopping, the best
            checkpoint, the learning curve) watches at most this many rows of
            the validation split, a seeded sample; the reported metrics use
            all of it. ``null``: all of it.
        accelerator: Lightning's ``cpu``, ``gpu`` or ``auto``.
        devices: data-parallel processes (Lightning DDP, spawned); each
            trains on every ``devices``-th batch and validates on all.
        precision: Lightning's training precision: ``32-true``,
            ``bf16-mixed`` (autocast to bfloat16 where it is safe, weights
            and the saved model in float32; fast on CPUs with AVX-512 BF16
            or AMX and on GPUs), or ``auto``: bf16-mixed for batches of 512
            and more where the hardware computes bfloat16 natively, else 32-true.
        shared_passes: a query's full sample and its censored prefixes share
            one neighbour pass in a batch (the same math, fewer LSTM steps):
            ``on``, ``off``, or ``auto``: on for batches of 512 and more,
            where grouping a query's samples costs a batch little variety.
        ray_address: train under Ray Train instead, ``devices`` workers of
            the Ray cluster at this address (``ray://head:10001``, ``auto``,
            ``head:6379``), or ``local``: a Ray instance started on this
            machine. ``null``: Lightning alone.
    """

    variant: IconqVariant = "iconq_plus"
    embed_dim: int = 64
    hidden_dim: int = 64
    head_dim: int = 64
    dropout: float = 0.2
    lr: float = 5e-3
    weight_decay: float = 2e-5
    lr_gamma: float = 0.9
    batch_size: int = 32
    max_batch_size: int = 1024
    lr_scaling: Literal["sqrt", "none"] = "sqrt"
    max_train_s: float | None = None
    loader_workers: int = 0
    split: Literal["random", "time"] = "random"
    learn_rows: Literal["curve", "all"] = "curve"
    curve_tolerance: float = 0.02
    check_every_samples: int = 250_000
    max_val_rows: int | None = 20_000
    accelerator: Literal["cpu", "gpu", "auto"] = "cpu"
    precision: Literal["auto", "32-true", "bf16-mixed"] = "auto"
    shared_passes: Literal["auto", "on", "off"] = "auto"
    devices: int = 1
    ray_address: str | None = None
    max_epochs: int = 100
    patience: int = 5
    grad_clip: float = 2.0
    partial_per_query: int = 2
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        _in_range(self, "iconq", batch_size=(1, 1 << 20), max_batch_size=(1, 1 << 20), loader_workers=(0, 64))
        _in_range(self, "iconq", curve_tolerance=(0.0, 1.0), check_every_samples=(1, 1 << 40), devices=(1, 1024))
        if self.max_val_rows is not None and self.max_val_rows < 1:
            raise ConfigError(f"key 'iconq.max_val_rows' must be a whole number >= 1 or null (all of them), "
                              f"got {self.max_val_rows!r}.")
        if self.max_batch_size < self.batch_size:
            raise ConfigError(f"key 'iconq.max_batch_size' must be >= iconq.batch_size ({self.batch_size}), "
                              f"got {self.max_batch_size!r}.")
        if self.max_train_s is not None and not (0 < self.max_train_s <= 30 * 86_400):
            raise ConfigError(f"key 'iconq.max_train_s' must be seconds in (0, 2592000] or null (no budget), "
                              f"got {self.max_train_s!r}.")
        if self.ray_address is not None and (not self.ray_address or any(c.isspace() for c in self.ray_address)):
            raise ConfigError(f"key 'iconq.ray_address' must be a Ray address (local, auto, ray://HOST:PORT) or "
                              f"null (no Ray), got {self.ray_address!r}.")


@dataclass(frozen=True)
class RegistrySection:
    """Where runs and models are recorded (MLflow)."""

    tracking_uri: str = "sqlite:///mlflow.db"
    experiment: str = "sloctl"
    optuna_storage: str = "sqlite:///optuna.db"


@dataclass(frozen=True)
class RouterSection:
    """Query Router settings (AutoSLO §5) and the billing model it optimises.

    Attributes:
        slo_margin: a query counts as violating once its predicted latency
            exceeds ``(1 - slo_margin) × SLO`` (0 is the paper's rule; a
            margin hedges against neighbours that arrive later). ``None``
            (the default) takes the margin calibrated on the model's
            training log and stored in its bundle, see ``risk_quantile``,
            :mod:`sloctl.models.calibration` and
            :func:`sloctl.registry.routers.build_router`.
        risk_quantile: the margin covers this quantile of actual / predicted
            latency when the training log is replayed with only the
            neighbours seen on arrival (used when a model is trained, and
            by experiments on a bundle saved without a margin).
        cost_tolerance: marginal costs closer than this fraction of a
            minimum billing window count as equal; ties then go to the
            placement that adds the least predicted latency.
        price_per_unit_s: price of one size unit per second.
        minimum_s: billing minimum window ``m`` (60 s on cloud warehouses).
        guard: place queries by load while the model is not to be trusted
            (``sloctl.control.router.RouterGuard``): its recent error is
            high, or its pick runs more queries than its training log showed.
        guard_max_ratio: the error check fires while the median of actual /
            predicted latency over the last ``guard_window`` finished queries
            exceeds this.
        guard_window: finished queries in the error window.
        guard_min_samples: finished queries needed before the error check fires.
        guard_support: also check the model's concurrency support (recorded
            in the model bundle at training; older bundles have none).
        guard_placement: where the guard places a query: ``"protect"`` by
            load among the clusters with no query past its SLO, else on the
            cluster with the largest share of late queries (an overloaded
            pool keeps its other clusters recoverable); ``"load"`` by load
            alone (the rule before 2026-12-03). See docs/control.md.
        soft_violations: count violations softly, with the spread of the
            model's routing-time error calibrated on its training log
            (``MarginCalibration.spread``): a query counts
            ``Φ((log predicted − log threshold) / σ)`` instead of 0 or 1.
            ``false`` (or a model without a calibration) counts 0 or 1, the
            paper's rule.
        tie_break: placements whose marginal violations and costs tie go to
            the cluster with the fewest running queries per size unit
            (``"load"``, then the least added latency) or to the least added
            latency the model predicts (``"latency"``, the rule before
            2026-12-02). See docs/control.md.
        drift_window_s: calibrate every prediction against the latencies
            observed over this sliding window of completions, per cluster size
            (:mod:`sloctl.models.drift`): the router's margin, the trigger's
            projections and the size selector's what-if runs then follow a
            machine that runs slower (or faster) than the model's training
            log. ``None`` (the default) trusts the model as trained.
        drift_min_observations: completions a cluster size needs before its
            own factor is used (before that, every size's; before that, 1).
    """

    slo_margin: float | None = None
    risk_quantile: float = 0.75
    cost_tolerance: float = 3.0
    price_per_unit_s: float = 1.0
    minimum_s: float = 60.0
    guard: bool = True
    guard_max_ratio: float = 2.0
    guard_window: int = 32
    guard_min_samples: int = 8
    guard_support: bool = True
    guard_placement: str = "protect"
    soft_violations: bool = True
    tie_break: str = "load"
    drift_window_s: float | None = None
    drift_min_observations: int = 20

    def __post_init__(self) -> None:
        _in_range(self, "router", price_per_unit_s=(0.0, 1e9), minimum_s=(0.0, 86_400.0))
        if self.drift_window_s is not None and not (isinstance(self.drift_window_s, int | float)
                                                    and 0 < self.drift_window_s <= 30 * 86_400):
            raise ConfigError(f"key 'router.drift_window_s' must be seconds in (0, 2592000] or null (off), "
                              f"got {self.drift_window_s!r}.")
        if isinstance(self.drift_min_observations, bool) or not isinstance(self.drift_min_observations, int) \
                or self.drift_min_observations < 1:
            raise ConfigError(f"key 'router.drift_min_observations' must be a whole number >= 1, "
                              f"got {self.drift_min_observations!r}.")
        if self.tie_break not in ("load", "latency"):
            raise ConfigError(f"key 'router.tie_break' must be 'load' or 'latency', got {self.tie_break!r}.")
        if self.guard_placement not in ("protect", "load"):
            raise ConfigError(f"key 'router.guard_placement' must be 'protect' or 'load', "
                              f"got {self.guard_placement!r}.")


@dataclass(frozen=True)
class ServeSection:
    """The controller runtime (``sloctl serve``).

    Attributes:
        host, port: where it listens (loopback by default).
        token: bearer token for mutating endpoints; the ``SLOCTL_TOKEN``
            environment variable overrides it; ``None`` and no variable means
            the runtime refuses to start unless ``--insecure`` is given.
        cluster_sizes: the routed pool, one size per cluster (ids c0, c1, ...).
        templates_log: a query log whose rows give each known template's plan
            features (needed by Iconq+ and Stage); ``None`` uses the table in
            the model bundle, and a bundle without one routes round-robin.
        model_uri, fallback_uri: latency models by alias (Iconq+, then Stage).
        admission_uri, retry_uri, execution_uri: policies by alias (the last
            is the Policy Tuner's scheduled spin-ups and autoscaler knobs).
        watch_interval_s: how often the aliases are polled for a new version.
        state_db: SQLite file for accrued cost and running queries.
        max_in_flight: the runtime's own admission credits (self-protection).
        plan_epoch: when the day of the execution-config in force starts
            (its scheduled spin-ups' ``time_s`` count from there): ``None``,
            midnight UTC of the plan's ``target_date`` (of the day it came
            into force when it has none); ``"load"``, the instant it came
            into force; or an ISO-8601 date-time (UTC unless it says).
        plan_clock: how a spin-up's ``time_s`` (seconds of the Policy Tuner's
            compressed day) maps onto the day: ``"real"`` stretches it by
            ``3600 / time_scale.hour_s`` (the document's ``real_time``);
            ``"compressed"`` takes it as seconds (a replay of the compressed
            day). Plans without ``time_scale.hour_s`` read the same either way.
        spinup_delay_s: how long a scheduled spin-up takes to become ready when
            the execution-config carries no autoscaler knobs (which carry ``δ``).
        max_body_bytes: largest request body (413 beyond, before it is read).
        body_timeout_s: time a request body has to arrive in full, counted
            from its head (408 and the connection closed beyond).
        header_timeout_s: time a request head has to arrive in full, counted
            from the connection's accept (from its first byte on a kept-alive
            connection); 408 (or nothing, when nothing came) and closed beyond.
        max_connections: connections open at once in all; a new one beyond is
            closed at accept (keep it below the open-file limit). Requests in
            progress are bounded by the front door, not here.
        max_connections_per_client: connections one peer address may hold at
            once; a new one beyond is closed at accept.
        trusted_clients: addresses or networks (CIDR) exempt from
            ``max_connections_per_client`` (a reverse proxy, local drivers).
        keep_alive_s: idle keep-alive connections are closed after this (uvicorn).
        max_header_bytes: largest request head (uvicorn's h11 incomplete-event limit).
        public_max_in_flight: unauthenticated requests in progress at once
            (``/v1/predict`` and the ``GET`` views without a token; 503 beyond).
        predict_max_neighbours: most neighbours one ``/v1/predict`` may name
            (bounds the CPU of one request); in a batch, the most queries
            that share one cluster, less one.
        predict_max_batch: most queries one ``/v1/predict`` batch (``queries``) may hold.
        predict_max_body_bytes: largest ``/v1/predict`` body from an
            authenticated caller (a batch of SQL texts); strangers stay at
            ``max_body_bytes``.
        lease_ttl_s, lease_max_ttl_s: an admission lease's default and largest
            lifetime; an expired lease's credit is reclaimed.
        history_limit: control-loop decisions the runtime's credit controllers keep.
        retry_networks: networks whose retry policy (``retry-policy-NAME``)
            ``/v1/retry-policy?network=NAME`` serves besides those registered;
            any other name answers 404 and the runtime keeps nothing for it.
        Every value is range-checked (``ConfigError`` names the key).
    """

    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    cluster_sizes: tuple[int, ...] = (1, 2)
    templates_log: str | None = None
    model_uri: str = "models:/iconq@champion"
    fallback_uri: str = "models:/stage@champion"
    admission_uri: str = "models:/admission-policy@champion"
    retry_uri: str = "models:/retry-policy@champion"
    execution_uri: str = "models:/execution-config@champion"
    watch_interval_s: float = 10.0
    state_db: str = "sloctl_state.db"
    max_in_flight: int = 256
    plan_epoch: str | None = None
    plan_clock: Literal["real", "compressed"] = "real"
    spinup_delay_s: float = 300.0
    max_body_bytes: int = 65536
    body_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    max_connections: int = 4096
    max_connections_per_client: int = 64
    trusted_clients: tuple[str, ...] = ("127.0.0.1", "::1")
    keep_alive_s: int = 5
    max_header_bytes: int = 16384
    public_max_in_flight: int = 8
    predict_max_neighbours: int = 64
    predict_max_batch: int = 1000
    predict_max_body_bytes: int = 4 * 2**20
    lease_ttl_s: float = 30.0
    lease_max_ttl_s: float = 600.0
    history_limit: int = 1000
    retry_networks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in self.retry_networks:
            if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name)):
                raise ConfigError(f"key 'serve.retry_networks' must list network names (a letter or digit, then "
                                  f"letters, digits or '_.-', at most 100), got {name!r}.")
        _in_range(self, "serve", port=(1, 65535), max_in_flight=(1, 100_000), watch_interval_s=(0.05, 86_400.0),
                  spinup_delay_s=(0.0, 86_400.0), max_body_bytes=(1024, 64 * 2**20), body_timeout_s=(0.05, 600.0),
                  header_timeout_s=(0.05, 600.0), max_connections=(16, 1_000_000),
                  max_connections_per_client=(1, 1_000_000), keep_alive_s=(1, 300), max_header_bytes=(1024, 2**20),
                  public_max_in_flight=(1, 1024), predict_max_neighbours=(0, 256), predict_max_batch=(1, 10_000),
                  predict_max_body_bytes=(1024, 64 * 2**20), lease_ttl_s=(0.01, 86_400.0),
                  lease_max_ttl_s=(0.01, 86_400.0), history_limit=(10, 1_000_000))
        if not self.cluster_sizes or len(self.cluster_sizes) > 256 or not all(
                1 <= s <= 1024 for s in self.cluster_sizes):
            raise ConfigError(f"key 'serve.cluster_sizes' must list 1 to 256 sizes, each in [1, 1024], "
                              f"got {list(self.cluster_sizes)!r}.")
        if self.lease_ttl_s > self.lease_max_ttl_s:
            raise ConfigError(f"key 'serve.lease_ttl_s' must be <= serve.lease_max_ttl_s ({self.lease_max_ttl_s}), "
                              f"got {self.lease_ttl_s!r}.")
        for address in self.trusted_clients:
            try:
                ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ConfigError(f"key 'serve.trusted_clients' must list IP addresses or networks (CIDR), "
                                  f"got {address!r}.") from None


@dataclass(frozen=True)
class StateSection:
    """Where the controller runtime keeps its state (running queries, the bill, leases, the route log).

    Attributes:
        url: ``null`` (the SQLite file ``serve.state_db``, one runtime);
            ``sqlite:///PATH`` (the same, another file); ``redis://HOST:PORT/DB``
            (also ``rediss://``, ``unix://``): state shared by runtime
            replicas behind one load balancer (docs/scale-out.md).
        key_prefix: the prefix of every Redis key (fleets sharing one Redis
            use different prefixes).
    """

    url: str | None = None
    key_prefix: str = "sloctl"

    def __post_init__(self) -> None:
        if self.url is not None and self.url.split("://", 1)[0] not in ("redis", "rediss", "unix", "sqlite"):
            raise ConfigError(f"key 'state.url' must start with redis://, rediss://, unix:// or sqlite:///, "
                              f"got {self.url!r}.")
        if not self.key_prefix or any(c in self.key_prefix for c in " {}"):
            raise ConfigError(f"key 'state.key_prefix' must be a non-empty name without spaces or braces, "
                              f"got {self.key_prefix!r}.")


def _in_range(section: Any, name: str, **bounds: tuple[float, float]) -> None:
    """Refuse a field outside ``[lo, hi]`` (NaN included) with a message naming the key."""
    for key, (lo, hi) in bounds.items():
        value = getattr(section, key)
        if not lo <= value <= hi:
            raise ConfigError(f"key '{name}.{key}' must be in [{lo}, {hi}], got {value!r}.")


def from_mapping(cls: type, raw: Any, *, source: str = "<config>", prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking every key and type."""
    where = prefix.rstrip(".") or "top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: '{where}' must be a mapping, got {type(raw).__name__}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(
                f"{source}: unknown key '{prefix}{key}' (known keys: {', '.join(names)})."
            )
        values[key] = _coerce(hints[key], value, source=source, key=f"{prefix}{key}")
    try:
        return cls(**values)
    except ConfigError as exc:  # a range check in the section's __post_init__: say which file
        raise ConfigError(f"{source}: {exc}") from None


def _coerce(tp: Any, value: Any, *, source: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, source=source, prefix=f"{key}.")
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{source}: key '{key}' must be one of {allowed}, got {value!r}.")
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None) and value is None:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, source=source, key=key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{source}: key '{key}' has a bad value.")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: key '{key}' must be a list, got {value!r}.")
        return tuple(_coerce(args[0], v, source=source, key=f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: key '{key}' must be true or false, got {value!r}.")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: key '{key}' must be an integer, got {value!r}.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: key '{key}' must be a number, got {value!r}.")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: key '{key}' must be a string, got {value!r}.")
        return value
    raise ConfigError(f"{source}: key '{key}' has an unsupported type {tp!r}.")  # pragma: no cover
