"""TokenGuard in process: which requests need a key, and the 401 each route family answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.http.auth import TokenAuth
from serve.http.token_guard import TokenGuard, is_open

FAILED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
TORCHSERVE = {"code": 401, "type": "InvalidKeyException", "message": FAILED}
PROTOCOLS = {"error": FAILED}


async def _inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"inner"})


def _request(
    auth: TokenAuth, kind: str, method: str, path: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=TokenGuard(_inner, auth, kind))
        async with httpx.AsyncClient(transport=transport, base_url="http://lantern") as client:
            return await client.request(method, path, headers=headers)

    return asyncio.run(go())


@pytest.fixture
def auth(tmp_path: Path) -> TokenAuth:
    return TokenAuth(tmp_path / "key_file.json", ttl_minutes=60)


@pytest.mark.parametrize(
    ("kind", "method", "path", "body"),
    [
        ("inference", "POST", "/predictions/m", TORCHSERVE),
        ("inference", "POST", "/explanations/m/1.0", TORCHSERVE),
        ("inference", "POST", "/v1/models/m:predict", PROTOCOLS),
        ("inference", "POST", "/v1/models/m/versions/1:predict", PROTOCOLS),
        ("inference", "GET", "/v1/models", PROTOCOLS),
        ("inference", "POST", "/v2/models/m/infer", PROTOCOLS),
        ("inference", "GET", "/v2/models/m", PROTOCOLS),
        ("management", "GET", "/models", TORCHSERVE),
        ("management", "PUT", "/models/m", TORCHSERVE),
        # The management port's /v1/models/{m} is TorchServe's readiness route, not KServe's.
        ("management", "POST", "/v1/models/m", TORCHSERVE),
        ("management", "GET", "/token?type=inference", TORCHSERVE),
    ],
)
def test_a_refusal_has_its_route_familys_shape_and_a_request_id(
    auth: TokenAuth, kind: str, method: str, path: str, body: dict[str, Any]
) -> None:
    refused = _request(auth, kind, method, path)
    assert refused.status_code == 401
    assert refused.json() == body
    assert refused.headers["content-type"] == "application/json"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert refused.headers["cache-control"].startswith("no-cache")
    assert len(refused.headers["x-request-id"]) >= 32  # a new UUID
    assert "connection" not in refused.headers  # keep-alive stays the server's choice
    given = _request(auth, kind, method, path, {"x-request-id": "client-id-1"})
    assert given.headers["x-request-id"] == "client-id-1"
    assert given.json() == body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/ping"),
        ("GET", "/health"),
        ("GET", "/version"),
        ("GET", "/api-description"),
        ("OPTIONS", "/"),
        ("GET", "/v2"),
        ("GET", "/v2/"),
        ("GET", "/v2/health/live"),
        ("GET", "/v2/health/ready"),
        ("GET", "/v2/models/m/ready"),
        ("GET", "/v2/models/m/versions/1/ready"),
        ("GET", "/v1/models/m"),
        ("HEAD", "/v1/models/m:ready"),
    ],
)
def test_health_readiness_and_descriptions_are_open(
    auth: TokenAuth, method: str, path: str
) -> None:
    assert is_open(method, path)
    for kind in ("inference", "management"):
        assert _request(auth, kind, method, path).status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/models/m"),
        ("POST", "/v1/models/m:predict"),
        ("GET", "/v1/models/m/versions/1"),
        ("GET", "/v2/models/m"),
        ("POST", "/ping/x"),
        ("GET", "/health/x"),
        ("GET", "/"),
    ],
)
def test_nothing_else_is_open(method: str, path: str) -> None:
    assert not is_open(method, path)


def test_each_port_takes_its_own_key(auth: TokenAuth) -> None:
    keys = {kind: f"Bearer {auth.keys[kind].key}" for kind in ("inference", "management", "API")}
    for kind, path in (("inference", "/predictions/m"), ("management", "/models")):
        for given, bearer in keys.items():
            answer = _request(auth, kind, "POST", path, {"Authorization": bearer})
            assert answer.status_code == (200 if given == kind else 401)
    infer = _request(
        auth, "inference", "POST", "/v2/models/m/infer", {"Authorization": keys["inference"]}
    )
    assert infer.text == "inner"


def test_token_rotation_takes_the_api_key_and_a_get(auth: TokenAuth) -> None:
    api = {"Authorization": f"Bearer {auth.keys['API'].key}"}
    old = auth.keys["inference"].key
    rotated = _request(auth, "management", "GET", "/token?type=inference", api)
    assert rotated.status_code == 200
    assert rotated.json()["inference"]["key"] == auth.keys["inference"].key != old
    posted = _request(auth, "management", "POST", "/token?type=inference", api)
    assert posted.status_code == 405
    assert posted.json()["type"] == "MethodNotAllowedException"
    assert "x-request-id" in posted.headers
    unknown = _request(auth, "management", "GET", "/token?type=API", api)
    assert (unknown.status_code, unknown.json()["code"]) == (400, 400)
    # /token is the management port's: on the inference port it is one more guarded path.
    assert _request(auth, "inference", "GET", "/token?type=inference", api).status_code == 401


def test_lifespan_passes_through(auth: TokenAuth) -> None:
    async def go() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "lifespan.startup"}

        async def send(message: dict[str, Any]) -> None:
            raise AssertionError(json.dumps(message))

        await TokenGuard(_inner, auth, "inference")({"type": "lifespan"}, receive, send)

    asyncio.run(go())


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/v2/repository/models/m/load", "management"),
        ("/v2/repository/models/m/unload", "management"),
        ("/v2/repository/index", "inference"),
        ("/v2/models/m/config", "inference"),
        ("/v2/models/stats", "inference"),
    ],
)
def test_tritons_load_and_unload_take_the_management_key(
    auth: TokenAuth, path: str, key: str
) -> None:
    """They change the models, as the management API's register and unregister do."""
    keys = {kind: f"Bearer {auth.keys[kind].key}" for kind in ("inference", "management")}
    for given, bearer in keys.items():
        answer = _request(auth, "inference", "POST", path, {"Authorization": bearer})
        assert answer.status_code == (200 if given == key else 401), given
