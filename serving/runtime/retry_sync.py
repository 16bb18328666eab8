"""Keep an Envoy sidecar's RDS file in step with the retry budgets ``sloctl serve`` is serving.

``sloctl serve`` answers ``GET /v1/retry-policy/envoy?service=S`` with the
route configuration (:func:`~sloctl.serving.runtime.envoy.envoy_route_config`) of the
retry policy its alias watcher has loaded. :func:`sync_once` fetches it and,
when it differs from what the RDS file holds, writes it with
:func:`~sloctl.serving.runtime.envoy.write_rds_file`; Envoy, started with
:func:`bootstrap_from_rds`, sees the rename and swaps its routes without a
restart. :func:`run_sync` polls. ``sloctl sidecar sync`` is the command-line
face (see docs/envoy.md).

An unchanged policy never rewrites the file (each rename makes Envoy reload),
and a failed fetch never touches it: the sidecar keeps the last good budgets.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloctl.core.errors import SyncError
from sloctl.serving.runtime.envoy import ROUTE_CONFIG_TYPE, envoy_bootstrap, route_config_name, write_rds_file

__all__ = ["SyncError", "SyncResult", "bootstrap_from_rds", "read_rds_file", "run_sync", "sync_once"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncResult:
    """What one :func:`sync_once` did.

    Attributes:
        service: the callee whose routes were fetched.
        path: the RDS file.
        changed: whether the file was (re)written; False when it already held these routes.
        source: the policy's registry source (``"models:/retry-policy@champion v2"``), None if unavailable.
        route_config: the RouteConfiguration the server returned.
    """

    service: str
    path: Path
    changed: bool
    source: str | None
    route_config: dict[str, Any]

    @property
    def num_retries(self) -> dict[str, int]:
        """``{route name: num_retries}`` (``class-high``, ..., ``default-low``) of the routes that set it."""
        out: dict[str, int] = {}
        for vh in self.route_config["virtual_hosts"]:
            for r in vh.get("routes") or [] if isinstance(vh, Mapping) else []:
                action = r.get("route") if isinstance(r, Mapping) else None
                retry = action.get("retry_policy") if isinstance(action, Mapping) else None
                if isinstance(retry, Mapping) and "num_retries" in retry:
                    out[str(r.get("name", "?"))] = retry["num_retries"]
        return out


def read_rds_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The RouteConfiguration in the RDS file at ``path`` (without ``@type``); None if absent or unreadable."""
    try:
        resources = json.loads(Path(path).read_text())["resources"]
        doc = resources[0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(doc, dict) or doc.get("@type") != ROUTE_CONFIG_TYPE:
        return None
    return {k: v for k, v in doc.items() if k != "@type"}


def _server_message(response: Any) -> str:
    """The server's own error text: ``{"error": ...}`` (sloctl), ``{"detail": ...}`` (FastAPI), else the body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        for key in ("error", "detail"):
            if key in body:
                return body[key] if isinstance(body[key], str) else json.dumps(body[key])
    text = response.text.strip()
    return text[:300] if text else "(empty body)"


def _get(client: Any, url: str, params: dict[str, str], headers: dict[str, str]) -> tuple[Any, str]:
    """``(response, url as shown in errors)``; raises :class:`SyncError` unless the server answered 200."""
    import httpx

    shown = f"{url}?{httpx.QueryParams(params)}" if params else url
    try:
        response = client.get(url, params=params, headers=headers)
    except httpx.HTTPError as exc:
        raise SyncError(f"GET {shown} failed: {type(exc).__name__}: {exc}", url=shown) from exc
    if response.status_code != 200:
        raise SyncError(f"GET {shown} answered {response.status_code}: {_server_message(response)}",
                        url=shown, status=response.status_code)
    return response, shown


def _source(client: Any, base: str, headers: dict[str, str], params: dict[str, str] | None = None) -> str | None:
    """``source`` of ``GET /v1/retry-policy`` (None if not given); raises only when the server cannot be reached."""
    try:
        body = _get(client, f"{base}/v1/retry-policy", params or {}, headers)[0].json()
    except SyncError as exc:
        if exc.status is None:
            raise
        return None  # the routes request reports what is wrong, with the server's message
    except ValueError:
        return None
    source = body.get("source") if isinstance(body, Mapping) else None
    return source if isinstance(source, str) else None


def _route_config(response: Any, url: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        raise ValueError(f"GET {url} did not answer JSON (content-type "
                         f"{response.headers.get('content-type')!r}): {response.text[:200]!r}.") from None
    if not isinstance(body, dict):
        raise ValueError(f"GET {url} must answer a RouteConfiguration object, got {type(body).__name__}.")
    missing = [k for k in ("name", "virtual_hosts") if k not in body]
    if missing:
        raise ValueError(f"GET {url} must answer a RouteConfiguration with 'name' and 'virtual_hosts'; "
                         f"missing {', '.join(repr(k) for k in missing)} (keys: {sorted(body)}).")
    if not isinstance(body["name"], str) or not body["name"]:
        raise ValueError(f"The 'name' field of the RouteConfiguration from {url} must be a non-empty string, "
                         f"got {body['name']!r}.")
    if not isinstance(body["virtual_hosts"], list) or not body["virtual_hosts"]:
        raise ValueError(f"The 'virtual_hosts' field of the RouteConfiguration from {url} must be a non-empty "
                         f"list, got {body['virtual_hosts']!r}.")
    return body


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"The '{name}' parameter must be > 0, got {value!r}.")


def sync_once(server_url: str, service: str, rds_path: str | os.PathLike[str], *, token: str | None = None,
              timeout_s: float = 5.0, client: Any = None, network: str | None = None) -> SyncResult:
    """Fetch ``service``'s routes from ``sloctl serve`` and write them to ``rds_path`` if they changed.

    The routes are compared with the file's as parsed JSON, so an unchanged
    policy leaves the file (and Envoy) alone. The policy's ``source`` comes
    from ``GET /v1/retry-policy``, asked before and after the routes; if a
    new version landed in between it is None (the next sync reports it).

    Args:
        server_url: the server's base URL (``http://127.0.0.1:8080``).
        service: the callee the sidecar fronts.
        rds_path: the RDS file (its directory must exist).
        token: bearer token, sent as ``Authorization: Bearer ...`` when given.
        timeout_s: per-request timeout.
        client: an ``httpx.Client`` to use, with its own timeout (tests pass one with a mock transport);
            a new one otherwise.
        network: the network whose policy to fetch (``retry-policy-NETWORK``; None: the server's default).

    Returns:
        A :class:`SyncResult`.

    Raises:
        SyncError: the server could not be reached or answered an error; the
            message names the URL and the server's error text.
        ValueError: a bad parameter, or the server's answer is not a RouteConfiguration.
        OSError: the file could not be written.
    """
    import httpx

    if not isinstance(service, str) or not service:
        raise ValueError(f"The 'service' parameter must be a non-empty string, got {service!r}.")
    _check_positive("timeout_s", timeout_s)
    path = Path(rds_path)
    if not path.parent.is_dir():
        raise ValueError(f"The 'rds_path' parameter must be in an existing directory, got {str(path)!r}.")
    base = server_url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    client = httpx.Client(timeout=timeout_s) if own else client
    try:
        which = {"network": network} if network else {}
        before = _source(client, base, headers, which)
        response, url = _get(client, f"{base}/v1/retry-policy/envoy", {"service": service, **which}, headers)
        route_config = _route_config(response, url)
        after = _source(client, base, headers, which)
    finally:
        if own:
            client.close()
    changed = read_rds_file(path) != route_config
    if changed:
        write_rds_file(route_config, path)
    return SyncResult(service=service, path=path, changed=changed, source=after if after == before else None,
                      route_config=route_config)


def run_sync(server_url: str, services_to_paths: Mapping[str, str | os.PathLike[str]], interval_s: float = 5.0,
             stop_event: threading.Event | None = None, on_change: Callable[[SyncResult], None] | None = None, *,
             token: str | None = None, timeout_s: float = 5.0, client: Any = None, network: str | None = None) -> None:
    """Sync every service's RDS file every ``interval_s`` seconds until ``stop_event`` is set.

    A failed sync (server down, no policy registered yet, a bad answer) is
    logged as a warning (once until the error changes or the sync recovers)
    and retried at the next poll; the file keeps its last good routes
    meanwhile. The first poll is immediate.

    Args:
        server_url: the server's base URL.
        services_to_paths: ``{service: RDS file}``.
        interval_s: seconds between polls.
        stop_event: set it to stop (None: run until interrupted).
        on_change: called with the :class:`SyncResult` of every sync that rewrote a file.
        token, timeout_s, client, network: as in :func:`sync_once`.
    """
    import httpx

    _check_positive("interval_s", interval_s)
    if not services_to_paths:
        raise ValueError("The 'services_to_paths' parameter must name at least one service.")
    stop_event = stop_event or threading.Event()
    own = client is None
    client = httpx.Client(timeout=timeout_s) if own else client
    failing: dict[str, str] = {}
    try:
        while True:
            for service, path in services_to_paths.items():
                try:
                    result = sync_once(server_url, service, path, token=token, timeout_s=timeout_s, client=client,
                                       network=network)
                except (SyncError, ValueError, OSError) as exc:
                    if failing.get(service) != str(exc):  # say it once, not at every poll, until it changes
                        log.warning("retry sync for %s failed (keeping %s as it is): %s", service, path, exc)
                    failing[service] = str(exc)
                    continue
                if failing.pop(service, None) is not None:
                    log.info("retry sync for %s recovered", service)
                if result.changed:
                    log.info("wrote %s routes to %s (%s): %s", service, path, result.source or "source unknown",
                             ", ".join(f"{name}={k}" for name, k in result.num_retries.items()))
                    if on_change is not None:
                        on_change(result)
            if stop_event.wait(interval_s):
                return
    finally:
        if own:
            client.close()


def bootstrap_from_rds(rds_path: str | os.PathLike[str], *, service: str, listen_port: int, upstream_port: int,
                       admin_port: int | None = None) -> dict[str, Any]:
    """An :func:`~sloctl.serving.runtime.envoy.envoy_bootstrap` whose routes come from an existing RDS file.

    The upstream cluster is named as the file's routes name it, and the
    file's route config must be ``service``'s (``<service>_retry``), else
    Envoy would wait for routes that never come.

    Raises:
        ValueError: the file is missing or not an RDS file for ``service``, or a port is out of range.
    """
    route_config = read_rds_file(rds_path)
    if route_config is None:
        raise ValueError(f"The 'rds_path' parameter must name an RDS file written by `sloctl sidecar sync`, "
                         f"got {str(rds_path)!r} (missing or not a discovery response).")
    expected = route_config_name(service)
    if route_config.get("name") != expected:
        raise ValueError(f"The RDS file {rds_path} holds route config {route_config.get('name')!r}; the "
                         f"'service' parameter {service!r} needs {expected!r}.")
    clusters = {r.get("route", {}).get("cluster") for vh in route_config.get("virtual_hosts", [])
                for r in vh.get("routes", [])} - {None}
    if len(clusters) > 1:
        raise ValueError(f"The RDS file {rds_path} sends to several clusters ({', '.join(sorted(clusters))}); "
                         f"a sidecar bootstrap has one upstream.")
    return envoy_bootstrap(None, service=service, listen_port=listen_port, upstream_port=upstream_port,
                           admin_port=admin_port, dynamic_routes_path=rds_path,
                           cluster=clusters.pop() if clusters else None)
