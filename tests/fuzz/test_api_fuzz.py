"""Schemathesis against our own OpenAPI descriptions, on real servers: no 5xx, never a hang.

Both apps (inference and management), with token auth off and on (the right key sent, so that
requests get past the guard). Every operation the description lists is fuzzed; the examples per
operation come from `tests.fuzz.settings` (bounded in CI, ``LANTERN_FUZZ=long`` for more).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from tests.fuzz.settings import examples
from tests.support.server import HANDLERS, LanternServer, build_archive

TIMEOUT = 20.0  # seconds for one request: a hang fails the test, it never stalls CI


@pytest.fixture(scope="module", params=["auth-off", "auth-on"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    store = work / "store"
    store.mkdir()
    build_archive(store, "robust", HANDLERS / "robust_handler.py", config={"minWorkers": 1})
    srv = LanternServer(
        work,
        store,
        ["robust.mar"],
        args=["--enable-model-api"],
        token_auth=request.param == "auth-on",
    )
    srv.start()
    yield srv
    srv.stop()


def auth_headers(srv: LanternServer, app: str) -> dict[str, str]:
    if not srv.token_auth:
        return {}
    keys = srv.keys()
    return {"Authorization": f"Bearer {keys[app]['key']}"}


def fuzz_operation(
    operation: Any,
    base: str,
    headers: dict[str, str],
    statuses: list[int],
    real_model: str | None,
) -> str | None:
    """Fuzz one operation; the first failure, as text, or None."""

    @settings(
        max_examples=examples(),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(), registered=st.booleans())
    def run(case: Any, registered: bool) -> None:
        if registered and real_model and "model_name" in (case.path_parameters or {}):
            # Half the time a model that exists, so that bodies reach decoding and the worker.
            case.path_parameters = {**case.path_parameters, "model_name": real_model}
            case.path_parameters.pop("model_version", None)
            if "{model_version}" in operation.path:
                case.path_parameters["model_version"] = "1.0"
        response = case.call(base_url=base, headers=headers, timeout=TIMEOUT)
        statuses.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    try:
        run()
    except Exception as exc:  # keep fuzzing the other operations; report all at the end
        return f"{operation.label}: {exc}"[:3000]
    return None


@pytest.mark.parametrize("app", ["inference", "management"])
def test_no_server_error_from_any_generated_request(server: LanternServer, app: str) -> None:
    base = getattr(server, app)
    headers = auth_headers(server, app)
    description = httpx.request("OPTIONS", f"{base}/", headers=headers, timeout=TIMEOUT).json()
    schema = schemathesis.openapi.from_dict(description)
    failures: list[str] = []
    statuses: list[int] = []
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"an operation's schema is invalid: {result.err()}"
        operations.append(result.ok())
    assert len(operations) >= 8

    for operation in operations:
        # Inference only: management calls on a real model could scale it to a million workers.
        real = "robust" if app == "inference" else None
        failure = fuzz_operation(operation, base, headers, statuses, real)
        if failure:
            failures.append(failure)
    assert not failures, "\n\n".join(failures)
    assert len(statuses) >= len(operations)  # every operation was called


def test_the_descriptions_name_every_route_family(server: LanternServer) -> None:
    headers = auth_headers(server, "inference")
    url = f"{server.inference}/"
    paths = httpx.request("OPTIONS", url, headers=headers, timeout=TIMEOUT).json()["paths"]
    assert {"/ping", "/predictions/{model_name}", "/v2/models/{model_name}/infer"} <= set(paths)
    assert {"/v1/chat/completions", "/v2/models/{model_name}/generate", "/v2/health/ready"} <= set(
        paths
    )
