"""Running the controller runtime in process: a loopback server and a log replay through it.

``LocalServer`` starts uvicorn on a free 127.0.0.1 port in a thread and stops
it on exit (tests, benchmarks and ``make demo`` use it). ``replay_log`` sends a
query log's arrivals through ``/v1/route`` and reports each query finished
with its logged latency through ``/v1/complete``, compressed in time.
"""

from __future__ import annotations

import heapq
import socket
import threading
import time
from typing import Any

__all__ = ["LocalServer", "free_port", "guarded_server", "replay_log", "server_options", "stop_process"]


def free_port() -> int:
    """A free TCP port on loopback (bound once and released: the caller binds it next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: Any, timeout_s: float = 10.0) -> None:
    """SIGTERM a child process, SIGKILL it if it has not exited within ``timeout_s``, and reap it."""
    import subprocess

    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def server_options(serve: Any) -> dict[str, Any]:
    """uvicorn's connection limits from the ``serve:`` section (both servers and :class:`LocalServer` use them).

    The guarded h11 protocol of :mod:`sloctl.serving._http_guard` closes a
    connection whose request head is not in within ``serve.header_timeout_s``
    or whose body is not in within ``serve.body_timeout_s`` of its head, and
    one beyond ``serve.max_connections_per_client`` per peer address (except
    ``serve.trusted_clients``) or ``serve.max_connections`` in all;
    ``timeout_keep_alive`` closes idle keep-alive connections and
    ``h11_max_incomplete_event_size`` caps a request head. No
    ``limit_concurrency``: requests in progress are bounded by
    :class:`~sloctl.serving.front.FrontDoor`, which also enforces
    ``serve.max_body_bytes``. ``options["http"].guard`` counts what was closed.
    """
    from sloctl.serving._http_guard import guard_options

    return guard_options(header_timeout_s=serve.header_timeout_s, body_timeout_s=serve.body_timeout_s,
                         max_connections_per_client=serve.max_connections_per_client,
                         max_connections=serve.max_connections, trusted_clients=serve.trusted_clients,
                         keep_alive_s=serve.keep_alive_s, max_header_bytes=serve.max_header_bytes)


def guarded_server(app: Any, serve: Any, *, host: str, port: int, log_level: str = "warning") -> Any:
    """A ``uvicorn.Server`` for ``app`` with the ``serve:`` section's connection limits (:func:`server_options`).

    Raises the open-file limit first (1,000+ sockets exceed the common 1,024).
    ``server.config.http.guard`` is its :class:`~sloctl.serving._http_guard.HttpGuard`.
    """
    import uvicorn

    from sloctl.serving._http_guard import raise_nofile_limit

    raise_nofile_limit()
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, **server_options(serve)))


class LocalServer:
    """uvicorn serving ``app`` on a free loopback port; ``with LocalServer(app) as client`` yields an httpx client.

    ``options`` are passed to ``uvicorn.Config`` (e.g. :func:`server_options`); with the guarded
    protocol among them, ``guard`` is its :class:`~sloctl.serving._http_guard.HttpGuard` (else None).
    """

    def __init__(self, app: Any, *, start_timeout_s: float = 30.0, options: dict[str, Any] | None = None) -> None:
        import uvicorn

        self.guard = getattr((options or {}).get("http"), "guard", None)
        if self.guard is not None:
            from sloctl.serving._http_guard import raise_nofile_limit

            raise_nofile_limit()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    **(options or {})))
        self.thread = threading.Thread(target=self.server.run, name="sloctl-local-server", daemon=True)

    def __enter__(self):
        import httpx

        self.thread.start()
        self.client = httpx.Client(base_url=self.url, timeout=30)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                if self.client.get("/readyz").status_code == 200:
                    return self.client
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.__exit__()
                raise RuntimeError(f"the runtime did not become ready on {self.url}")
            time.sleep(0.05)

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.client.close()


def replay_log(client: Any, log: Any, *, token: str, duration_s: float = 3.0, default_slo_s: float | None = None,
               first_query_id: int = 0) -> dict[str, Any]:
    """Route every ``ok`` query of ``log`` through the service, completing each after its logged latency.

    Arrivals and latencies are compressed by one factor so the replay lasts
    about ``duration_s``. SLOs default to 2× each template's median isolated
    latency in the log (queries with no neighbours), else 2× its median.

    ``first_query_id`` numbers the replayed queries from there on.

    Returns:
        Counts per cluster, decision time p50/p99 (server side), the model that routed, VR and cost as the
        service reports them.
    """
    import numpy as np

    auth = {"Authorization": f"Bearer {token}"}
    done = log[log["status"] == "ok"].sort_values("arrival_s").reset_index(drop=True)
    if done.empty:
        raise ValueError("The log has no finished ('ok') queries to replay.")
    span = float(done["arrival_s"].max() - done["arrival_s"].min()) or 1.0
    scale = duration_s / span
    slo = {t: default_slo_s or 2.0 * float(g["latency_s"].median()) for t, g in done.groupby("template")}
    start = time.monotonic()
    t0 = float(done["arrival_s"].min())
    pending: list[tuple[float, int, float]] = []
    per_cluster: dict[str, int] = {}
    decision_ms, models = [], set()

    def finish_due(now: float) -> None:
        while pending and pending[0][0] <= now:
            _, qid, latency = heapq.heappop(pending)
            client.post("/v1/complete", json={"query_id": qid, "latency_s": latency}, headers=auth).raise_for_status()

    for qid, row in enumerate(done.itertuples(index=False), start=first_query_id):
        at = (row.arrival_s - t0) * scale
        while True:
            now = time.monotonic() - start
            finish_due(now)
            if now >= at:
                break
            time.sleep(min(at - now, pending[0][0] - now if pending else at - now, 0.05))
        response = client.post("/v1/route", json={"query_id": qid, "template": row.template,
                                                  "slo_s": slo[row.template]}, headers=auth)
        response.raise_for_status()
        body = response.json()
        per_cluster[body["cluster_id"]] = per_cluster.get(body["cluster_id"], 0) + 1
        decision_ms.append(body["decision_ms"])
        models.add(body["model"])
        heapq.heappush(pending, ((time.monotonic() - start) + row.latency_s * scale, qid, float(row.latency_s)))
    while pending:
        time.sleep(max(0.0, pending[0][0] - (time.monotonic() - start)))
        finish_due(time.monotonic() - start)
    view = client.get("/v1/clusters").json()
    return {"queries": len(done), "per_cluster": per_cluster, "models": sorted(models),
            "decision_ms_p50": float(np.percentile(decision_ms, 50)),
            "decision_ms_p99": float(np.percentile(decision_ms, 99)),
            "violation_rate": view["violation_rate"], "total_cost": view["total_cost"]}
