"""Property-based API testing: schemathesis fuzzes every operation of the runtime's own OpenAPI spec.

A real server on a loopback port (empty temporary registry, so it routes
round-robin; the synthetic log's templates; a bearer token) gets a bounded,
derandomised set of valid and invalid requests per operation; none may answer
5xx.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections import Counter

import httpx
import pytest

from sloctl.config import load_config

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_EXAMPLES = 25


@pytest.fixture(scope="module")
def base_url(tmp_path_factory, sim_log):
    """The runtime under uvicorn in a thread; stopped after the module."""
    import uvicorn

    from sloctl.serving.runtime.app import create_app

    folder = tmp_path_factory.mktemp("schemathesis")
    base = load_config()
    cfg = dataclasses.replace(
        base, registry=dataclasses.replace(base.registry, tracking_uri=f"sqlite:///{folder / 'mlflow.db'}"),
        serve=dataclasses.replace(base.serve, state_db=str(folder / "state.db")))
    templates = sim_log.drop_duplicates("template").reset_index(drop=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(cfg, token=TOKEN, templates=templates), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.slow  # tens of seconds: make test-slow
def test_no_generated_request_gets_a_server_error(base_url):
    import requests
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", timeout=10)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/route", "POST /v1/admit", "GET /v1/clusters"}
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    with requests.Session() as session:
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck))
                @given(case=operation.as_strategy(generation_mode=mode))
                def fuzz(case) -> None:
                    response = case.call_and_validate(session=session, headers=AUTH, checks=[not_a_server_error],
                                                      timeout=10)
                    statuses[response.status_code] += 1

                try:
                    fuzz()
                except Unsatisfiable:  # no parameters and no body: nothing to make invalid
                    assert mode is GenerationMode.NEGATIVE, operation.label
                except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup is a BaseExceptionGroup
                    # one report per operation and mode, with the curl command that reproduces it
                    failures.append(f"{operation.label} ({mode.value}): {type(exc).__name__}: {exc}")
    assert not failures, "\n\n".join(failures)
    assert statuses[200] > 0 and statuses[422] > 0, statuses  # both valid and refused requests got through
