"""``serve.client`` against one real server, over HTTP and gRPC, blocking and asyncio."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import numpy as np
import pytest

from serve.client import AsyncClient, Client, ClientError
from tests.protocols import models
from tests.support.server import HANDLERS, LanternServer, build_archive, echo_archive

METADATA = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "scaled", "datatype": "FP32", "shape": [-1, 4]}],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("client")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "echo")
    build_archive(store, "stream", HANDLERS / "stream_handler.py")
    models.custom_archive(store, "custom", config={"factor": 2, "metadata": METADATA})
    srv = LanternServer(
        work,
        store,
        ["echo=echo.mar", "stream=stream.mar", "custom=custom.mar"],
        token_auth=True,
        args=["--enable-model-api"],
    )
    srv.start()
    yield srv
    srv.stop()


def _options(server: LanternServer, protocol: str) -> dict:
    keys = server.keys()
    if protocol == "http":
        addresses = {"inference": server.inference, "management": server.management}
    else:
        addresses = {"inference": server.grpc_inference, "management": server.grpc_management}
    return dict(
        protocol=protocol,
        token=keys["inference"]["key"],
        management_token=keys["management"]["key"],
        **addresses,
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_blocking_client(server: LanternServer, protocol: str) -> None:
    with Client(**_options(server, protocol)) as lantern:
        assert json.loads(lantern.predict("echo", b"hi"))["echo"] == "hi"
        assert b"".join(lantern.stream("stream", b"x")) == b"part0 part1 part2 done"
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        out = lantern.infer("custom", {"x": x}, outputs=["scaled"])
        assert list(out) == ["scaled"]
        np.testing.assert_array_equal(out["scaled"], x * 2)
        assert lantern.infer("custom", {"x": x})["batch"].dtype == np.int32
        name = f"client-{protocol}"
        message = lantern.register("echo.mar", model_name=name, initial_workers=1, synchronous=True)
        assert message == f'Model "{name}" Version: 1.0 registered with 1 initial workers'
        assert name in [m["modelName"] for m in lantern.list_models()["models"]]
        assert lantern.describe(name)[0]["minWorkers"] == 1
        assert lantern.scale(name, 2) == f"Workers scaled to 2 for model: {name}, version: 1.0"
        assert lantern.set_default(name, "1.0").startswith("Default version successfully")
        assert lantern.unregister(name) == f'Model "{name}" unregistered'
        with pytest.raises(ClientError) as info:
            lantern.predict(name, b"x")
        assert (info.value.status, info.value.code) == (
            (404, None) if protocol == "http" else (None, "NOT_FOUND")
        )
        assert "Model not found" in info.value.message


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_asyncio_client(server: LanternServer, protocol: str) -> None:
    async def main() -> None:
        async with AsyncClient(**_options(server, protocol)) as lantern:
            answers = await asyncio.gather(*(lantern.predict("echo", f"{i}") for i in range(8)))
            assert [json.loads(a)["echo"] for a in answers] == [str(i) for i in range(8)]
            chunks = [c async for c in lantern.stream("stream", b"x")]
            assert b"".join(chunks) == b"part0 part1 part2 done"
            x = np.ones((1, 4), dtype=np.float32)
            np.testing.assert_array_equal(
                (await lantern.infer("custom", {"x": x}))["scaled"], x * 2
            )
            assert (await lantern.describe("echo"))[0]["modelName"] == "echo"
            with pytest.raises(ClientError):
                await lantern.infer("nope", {"x": x})

    asyncio.run(main())


def test_a_wrong_token_is_refused(server: LanternServer) -> None:
    for protocol, expected in (("http", (401, None)), ("grpc", (None, "PERMISSION_DENIED"))):
        options = {**_options(server, protocol), "token": "wrong"}
        with Client(**options) as lantern, pytest.raises(ClientError) as info:
            lantern.predict("echo", b"x")
        assert (info.value.status, info.value.code) == expected
