"""Token authorisation and the model-API switch, in process, with TorchServe 0.12 defaults.

Token auth is on and the model API is off (no ``--enable-model-api``). Unlike TorchServe, a missing
or wrong token is a 401, and health, readiness and the API description never need one. That the
key file comes and goes with a real server is `tests/e2e/test_auth.py`.
"""

from __future__ import annotations

import datetime as dt
import json
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import echo_archive

FAILED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"


def serve(
    root: Path, monkeypatch: pytest.MonkeyPatch, test: Callable[[Lantern], Awaitable[None]]
) -> None:
    """Run ``test`` against a server with token auth on, in ``root`` as its working directory."""
    monkeypatch.chdir(root)  # the key file goes to the working directory, as in TorchServe
    store = root / "store"
    store.mkdir()
    echo_archive(store)

    async def body() -> None:
        config = test_config(
            root, store, disable_token_authorization=False, load_models=["echo.mar"]
        )
        async with in_process(config) as lantern:
            await test(lantern)

    run(body)


def key_file(lantern: Lantern) -> Path:
    assert lantern.server.state.auth is not None
    return lantern.server.state.auth.key_file


def keys(lantern: Lantern) -> dict[str, Any]:
    return json.loads(key_file(lantern).read_text())


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_unauthorized(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.json() == {"code": 401, "type": "InvalidKeyException", "message": FAILED}
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_key_file_has_torchserve_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(lantern: Lantern) -> None:
        path = key_file(lantern)
        assert path.name == "key_file.json"
        assert path.parent == tmp_path.resolve()  # the working directory, as in TorchServe
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        data = json.loads(path.read_text())
        assert set(data) == {"management", "inference", "API"}
        assert set(data["API"]) == {"key"}
        now = dt.datetime.now(dt.timezone.utc)
        for kind in ("management", "inference"):
            assert set(data[kind]) == {"key", "expiration time"}
            stamp = data[kind]["expiration time"].replace("Z", "+00:00")
            expires = dt.datetime.fromisoformat(stamp)
            # token_expiration_min defaults to 60 minutes
            assert dt.timedelta(minutes=55) < expires - now <= dt.timedelta(minutes=60)
        found = [data[k]["key"] for k in data]
        assert len(set(found)) == 3
        assert all(len(k) == 8 for k in found)  # 6 random bytes, base64url

    serve(tmp_path, monkeypatch, test)


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
def test_missing_or_wrong_token_is_401(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]
) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        assert_unauthorized(await api.get("/models", headers=headers))
        assert_unauthorized(await api.get("/models/echo", headers=headers))
        assert_unauthorized(await api.put("/models/echo", headers=headers))
        assert_unauthorized(await infer.post("/predictions/echo", content=b"hi", headers=headers))
        assert_unauthorized(await api.get("/token?type=management", headers=headers))

    serve(tmp_path, monkeypatch, test)


def test_each_port_takes_only_its_own_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        found = keys(lantern)
        management, inference, api_key = (
            found[k]["key"] for k in ("management", "inference", "API")
        )
        assert_unauthorized(await api.get("/models", headers=bearer(inference)))
        assert_unauthorized(await api.get("/models", headers=bearer(api_key)))
        predict = "/predictions/echo"
        assert_unauthorized(await infer.post(predict, content=b"x", headers=bearer(management)))
        assert_unauthorized(await infer.post(predict, content=b"x", headers=bearer(api_key)))

        listed = await api.get("/models", headers=bearer(management))
        assert listed.status_code == 200
        assert [m["modelName"] for m in listed.json()["models"]] == ["echo"]
        response = await infer.post(predict, content=b"hi", headers=bearer(inference))
        assert response.status_code == 200
        assert response.json()["echo"] == "hi"

    serve(tmp_path, monkeypatch, test)


def test_health_readiness_and_descriptions_need_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        assert (await infer.get("/ping")).json() == {"status": "Healthy"}
        for client in (infer, api):
            assert (await client.request("OPTIONS", "/")).json()["openapi"] == "3.0.1"
            assert (await client.get("/api-description")).json()["openapi"] == "3.0.1"
        ready = await api.get("/v1/models/echo")
        assert ready.json() == {"name": "echo", "ready": True}
        # Only the readiness GET is open: nothing else under /v1 on the management port.
        assert_unauthorized(await api.post("/v1/models/echo"))
        assert (await lantern.metrics.get("/metrics")).status_code == 200

    serve(tmp_path, monkeypatch, test)


def test_model_api_is_off_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(lantern: Lantern) -> None:
        api = lantern.management
        headers = bearer(keys(lantern)["management"]["key"])
        for response in (
            await api.post("/models", params={"url": "echo.mar"}, headers=headers),
            await api.post("/models", json={"url": "echo.mar"}, headers=headers),
            await api.delete("/models/echo", headers=headers),
            await api.delete("/models/echo/1.0", headers=headers),
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
        params: dict[str, Any] = {"min_worker": 1, "synchronous": "true"}
        scaled = await api.put("/models/echo", params=params, headers=headers)
        assert scaled.status_code == 200

    serve(tmp_path, monkeypatch, test)


@pytest.mark.parametrize("kind", ["management", "inference"])
def test_token_rotation_invalidates_the_old_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        before = keys(lantern)
        old = before[kind]["key"]
        response = await api.get(
            "/token", params={"type": kind}, headers=bearer(before["API"]["key"])
        )
        assert response.status_code == 200
        new = response.json()[kind]["key"]
        assert new != old
        after = keys(lantern)
        assert after[kind]["key"] == new
        assert after["API"] == before["API"]  # the API key never rotates or expires
        other = "inference" if kind == "management" else "management"
        assert after[other] == before[other]

        async def call(token: str) -> httpx.Response:
            if kind == "management":
                return await api.get("/models", headers=bearer(token))
            return await infer.post("/predictions/echo", content=b"x", headers=bearer(token))

        assert_unauthorized(await call(old))
        assert (await call(new)).status_code == 200

    serve(tmp_path, monkeypatch, test)


def test_token_api_needs_the_api_key_and_a_known_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test(lantern: Lantern) -> None:
        api = lantern.management
        found = keys(lantern)

        async def rotate(kind: str, key: str) -> httpx.Response:
            return await api.get("/token", params={"type": kind}, headers=bearer(key))

        assert_unauthorized(await rotate("management", found["management"]["key"]))
        assert keys(lantern) == found
        response = await rotate("API", found["API"]["key"])
        assert response.status_code == 400
        assert response.json()["code"] == 400
        assert (await rotate("", found["API"]["key"])).status_code == 400
        posted = await api.post("/token?type=inference", headers=bearer(found["API"]["key"]))
        assert posted.status_code == 405
        assert keys(lantern) == found

    serve(tmp_path, monkeypatch, test)
