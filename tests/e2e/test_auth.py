"""Token authorisation and the model-API switch, against a server with TorchServe 0.12 defaults.

Token auth is on and the model API is off (no ``--enable-model-api``). Unlike TorchServe, a missing
or wrong token is a 401, and health, readiness and the API description never need one.
"""

from __future__ import annotations

import datetime as dt
import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import LanternServer, echo_archive

FAILED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    root = tmp_path_factory.mktemp("auth")
    store = root / "store"
    store.mkdir()
    echo_archive(store)
    srv = LanternServer(root, store, models=["echo.mar"], token_auth=True).start()
    key_file = Path(srv.state["key_file"])
    headers = {"Authorization": f"Bearer {srv.keys()['management']['key']}"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # startup models load in the background
        described = httpx.get(f"{srv.management}/models/echo", headers=headers, timeout=10)
        if (
            described.status_code == 200
            and described.json()[0]["workers"][:1]
            and all(w["status"] == "READY" for w in described.json()[0]["workers"])
        ):
            break
        time.sleep(0.05)
    yield srv
    srv.stop()
    assert not key_file.exists()  # the key file goes with the server, as in TorchServe


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def key(server: LanternServer, kind: str) -> str:
    return server.keys()[kind]["key"]


def assert_unauthorized(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.json() == {"code": 401, "type": "InvalidKeyException", "message": FAILED}
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_key_file_has_torchserve_shape(server: LanternServer) -> None:
    path = Path(server.state["key_file"])
    assert path.name == "key_file.json"
    assert path.parent == server.workdir.resolve()  # the working directory, as in TorchServe
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert set(data) == {"management", "inference", "API"}
    assert set(data["API"]) == {"key"}
    now = dt.datetime.now(dt.timezone.utc)
    for kind in ("management", "inference"):
        assert set(data[kind]) == {"key", "expiration time"}
        expires = dt.datetime.fromisoformat(data[kind]["expiration time"].replace("Z", "+00:00"))
        # token_expiration_min defaults to 60 minutes
        assert dt.timedelta(minutes=55) < expires - now <= dt.timedelta(minutes=60)
    keys = [data[k]["key"] for k in data]
    assert len(set(keys)) == 3
    assert all(len(k) == 8 for k in keys)  # 6 random bytes, base64url


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrongkey"},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
    ],
    ids=["none", "wrong", "empty", "basic"],
)
def test_missing_or_wrong_token_is_401(server: LanternServer, headers: dict[str, str]) -> None:
    assert_unauthorized(httpx.get(f"{server.management}/models", headers=headers))
    assert_unauthorized(httpx.get(f"{server.management}/models/echo", headers=headers))
    assert_unauthorized(httpx.put(f"{server.management}/models/echo", headers=headers))
    assert_unauthorized(
        httpx.post(f"{server.inference}/predictions/echo", content=b"hi", headers=headers)
    )
    assert_unauthorized(httpx.get(f"{server.management}/token?type=management", headers=headers))


def test_each_port_takes_only_its_own_key(server: LanternServer) -> None:
    management, inference, api = (key(server, k) for k in ("management", "inference", "API"))
    assert_unauthorized(httpx.get(f"{server.management}/models", headers=bearer(inference)))
    assert_unauthorized(httpx.get(f"{server.management}/models", headers=bearer(api)))
    predict = f"{server.inference}/predictions/echo"
    assert_unauthorized(httpx.post(predict, content=b"x", headers=bearer(management)))
    assert_unauthorized(httpx.post(predict, content=b"x", headers=bearer(api)))

    listed = httpx.get(f"{server.management}/models", headers=bearer(management))
    assert listed.status_code == 200
    assert [m["modelName"] for m in listed.json()["models"]] == ["echo"]
    response = httpx.post(predict, content=b"hi", headers=bearer(inference), timeout=30)
    assert response.status_code == 200
    assert response.json()["echo"] == "hi"


def test_health_readiness_and_descriptions_need_no_token(server: LanternServer) -> None:
    assert httpx.get(f"{server.inference}/ping").json() == {"status": "Healthy"}
    for base in (server.inference, server.management):
        assert httpx.request("OPTIONS", f"{base}/").json()["openapi"] == "3.0.1"
        assert httpx.get(f"{base}/api-description").json()["openapi"] == "3.0.1"
    ready = httpx.get(f"{server.management}/v1/models/echo")
    assert ready.json() == {"name": "echo", "ready": True}
    # Only the readiness GET is open: nothing else under /v1 on the management port.
    assert_unauthorized(httpx.post(f"{server.management}/v1/models/echo"))
    assert httpx.get(f"{server.metrics}/metrics").status_code == 200


def test_model_api_is_off_by_default(server: LanternServer) -> None:
    headers = bearer(key(server, "management"))
    for response in (
        httpx.post(f"{server.management}/models", params={"url": "echo.mar"}, headers=headers),
        httpx.post(f"{server.management}/models", json={"url": "echo.mar"}, headers=headers),
        httpx.delete(f"{server.management}/models/echo", headers=headers),
        httpx.delete(f"{server.management}/models/echo/1.0", headers=headers),
    ):
        assert response.status_code == 405
        assert response.json() == {
            "code": 405,
            "type": "MethodNotAllowedException",
            "message": "Requested method is not allowed, please refer to API document. "
            "Registering and unregistering models is off: start the server with "
            "--enable-model-api.",
        }
    # Scaling and describing are not part of the model API: they stay available.
    scaled = httpx.put(
        f"{server.management}/models/echo",
        params={"min_worker": 1, "synchronous": "true"},
        headers=headers,
        timeout=60,
    )
    assert scaled.status_code == 200


def rotate(server: LanternServer, kind: str, api_key: str) -> httpx.Response:
    return httpx.get(f"{server.management}/token", params={"type": kind}, headers=bearer(api_key))


@pytest.mark.parametrize("kind", ["management", "inference"])
def test_token_rotation_invalidates_the_old_key(server: LanternServer, kind: str) -> None:
    before: dict[str, Any] = server.keys()
    old = before[kind]["key"]
    response = rotate(server, kind, before["API"]["key"])
    assert response.status_code == 200
    new = response.json()[kind]["key"]
    assert new != old
    after = server.keys()
    assert after[kind]["key"] == new
    assert after["API"] == before["API"]  # the API key never rotates or expires
    other = "inference" if kind == "management" else "management"
    assert after[other] == before[other]

    def call(token: str) -> httpx.Response:
        if kind == "management":
            return httpx.get(f"{server.management}/models", headers=bearer(token))
        return httpx.post(
            f"{server.inference}/predictions/echo", content=b"x", headers=bearer(token), timeout=30
        )

    assert_unauthorized(call(old))
    assert call(new).status_code == 200


def test_token_api_needs_the_api_key_and_a_known_type(server: LanternServer) -> None:
    keys = server.keys()
    assert_unauthorized(rotate(server, "management", keys["management"]["key"]))
    assert server.keys() == keys
    response = rotate(server, "API", keys["API"]["key"])
    assert response.status_code == 400
    assert response.json()["code"] == 400
    assert rotate(server, "", keys["API"]["key"]).status_code == 400
    posted = httpx.post(
        f"{server.management}/token?type=inference", headers=bearer(keys["API"]["key"])
    )
    assert posted.status_code == 405
    assert server.keys() == keys
