"""The management API in process: TorchServe's routes, bodies and status codes, over fake workers.

Each test builds the store's archives, runs a `serve.server.Server` whose workers answer from Python
(`tests.support.fake_workers`) and calls its apps through httpx's ASGI transport. What only real
worker processes show (their pids come and go, their memory) is `tests/e2e/test_management.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import zipfile
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from serve.core.jobs import BatchItem, ItemResult
from serve.wire.errors import ServeError
from serve.worker.process import WorkerStartFailed
from tests.support.fake_workers import Behaviour, FakeWorker, FakeWorkers, fails_to_load
from tests.support.inprocess import Lantern, in_process, run, test_config, until
from tests.support.server import build_archive, echo_archive

MISSING_WORKERS = "Workers scaling in progress..."


async def meta(worker: FakeWorker, items: list[BatchItem]) -> list[ItemResult | ServeError]:
    """Answers describe requests (TorchServe sends them with a ``describe: True`` header)."""
    if items[0].headers.get("describe") == "True":
        body = json.dumps({"handler": "meta", "worker": worker.worker_id})
        return [ItemResult(200, body.encode(), "text/plain")]
    return [ItemResult(200, b"meta", "text/plain") for _ in items]


async def claim(worker: FakeWorker) -> None:
    """Only the first worker of a version can load: the second one finds the claim taken."""
    path = Path(worker.model.source.model_dir) / "claimed"
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        raise WorkerStartFailed(f"Worker {worker.worker_id} failed to load: claimed") from None


async def half(worker: FakeWorker, items: list[BatchItem]) -> list[ItemResult | ServeError]:
    return [ItemResult(200, b"half", "text/plain") for _ in items]


BEHAVIOURS = {
    "meta_handler": Behaviour(meta),
    "half_handler": Behaviour(half, claim),
    "broken_handler": Behaviour(half, fails_to_load("this model never loads")),
}


def store_of(root: Path) -> Path:
    """The module's archives: echo 1.0 and 2.0, one with a model-config.yaml, and the fakes'."""
    store = root / "store"
    build_dir = root / "build"
    store.mkdir()
    build_dir.mkdir()
    echo_archive(store)
    echo_archive(build_dir, version="2.0").rename(store / "echo-v2.mar")
    echo_archive(
        store,
        name="cfg",
        config={
            "batchSize": 3,
            "maxBatchDelay": 7,
            "minWorkers": 1,
            "maxWorkers": 2,
            "responseTimeout": 11,
        },
    )
    for name in ("meta", "half", "broken"):
        handler = build_dir / f"{name}_handler.py"
        handler.write_text("def handle(data, context):\n    return data\n")
        build_archive(store, name, handler)
    return store


def serve(root: Path, test: Callable[[Lantern], Awaitable[None]]) -> None:
    """Run ``test`` against an in-process server over the module's store (model API on)."""

    async def body() -> None:
        config = test_config(root, store_of(root), enable_model_api=True)
        async with in_process(config, FakeWorkers(BEHAVIOURS)) as lantern:
            await test(lantern)

    run(body)


async def register(api: httpx.AsyncClient, url: str, **params: Any) -> httpx.Response:
    return await api.post("/models", params={"url": url, **params})


async def describe(api: httpx.AsyncClient, name: str, version: str | None = None) -> dict[str, Any]:
    path = f"/models/{name}" + (f"/{version}" if version else "")
    response = await api.get(path)
    assert response.status_code == 200, response.text
    (data,) = response.json()
    return data


async def ready_ids(api: httpx.AsyncClient, name: str, version: str | None = None) -> list[str]:
    workers = (await describe(api, name, version))["workers"]
    return [w["id"] for w in workers if w["status"] == "READY"]


async def wait_ready(api: httpx.AsyncClient, name: str, version: str, count: int) -> list[str]:
    async def ready() -> list[str]:
        while True:
            data = await describe(api, name, version)
            ids = [w["id"] for w in data["workers"] if w["status"] == "READY"]
            if len(ids) == count and len(data["workers"]) == count:
                return ids
            await asyncio.sleep(0.005)

    return await asyncio.wait_for(ready(), 30)


async def pending_at_least(api: httpx.AsyncClient, name: str, count: int) -> None:
    """Wait (30 s at most) until ``count`` requests of ``name`` wait in its queue."""

    async def queued() -> None:
        while (await describe(api, name))["jobQueueStatus"]["pendingRequests"] < count:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(queued(), 30)


def assert_error(response: httpx.Response, code: int, error_type: str | None = None) -> dict:
    assert response.status_code == code, response.text
    body = response.json()
    assert set(body) == {"code", "type", "message"}
    assert body["code"] == code
    if error_type is not None:
        assert body["type"] == error_type
    return body


def extracted_dirs(lantern: Lantern) -> set[str]:
    folder = lantern.registry.extract_dir
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


async def wait_gone(lantern: Lantern, ids: list[str]) -> None:
    """The workers ``ids`` have stopped (the fake's exit)."""
    workers = [w for w in lantern.workers.started if w.worker_id in ids]
    assert len(workers) == len(ids), ids
    await until(lambda: all(w.exit_code is not None for w in workers))


# ----- the whole lifecycle --------------------------------------------------------------------


def test_lifecycle_register_describe_scale_version_default_unregister(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        before = extracted_dirs(lantern)
        response = await register(api, "echo.mar", model_name="life", initial_workers=1)
        assert response.status_code == 200
        assert response.json() == {
            "status": 'Model "life" Version: 1.0 registered with 1 initial workers'
        }

        data = await describe(api, "life")
        assert data["modelName"] == "life"
        assert data["modelVersion"] == "1.0"
        assert data["modelUrl"] == "echo.mar"
        assert data["runtime"] == "python"
        assert (data["minWorkers"], data["maxWorkers"]) == (1, 1)
        assert (data["batchSize"], data["maxBatchDelay"]) == (1, 100)
        assert (data["responseTimeout"], data["startupTimeout"]) == (120, 120)
        assert data["loadedAtStartup"] is False
        assert data["jobQueueStatus"] == {"remainingCapacity": 100, "pendingRequests": 0}
        (worker,) = data["workers"]
        assert worker["status"] == "READY"
        assert worker["gpu"] is False
        assert isinstance(worker["id"], str) and isinstance(worker["startTime"], str)

        conflict = await register(api, "echo.mar", model_name="life")
        assert_error(conflict, 409, "ConflictStatusException")

        # A second version, registered asynchronously.
        response = await register(
            api, "echo-v2.mar", model_name="life", initial_workers=1, synchronous="false"
        )
        assert response.status_code == 202
        assert response.json() == {"status": "Processing worker updates..."}
        v2_ids = await wait_ready(api, "life", "2.0", 1)
        assert (await describe(api, "life"))["modelVersion"] == "1.0"  # 1.0 stays default
        everything = (await api.get("/models/life/all")).json()
        assert sorted(d["modelVersion"] for d in everything) == ["1.0", "2.0"]

        # Scale up, synchronously: the answer comes when the workers are ready.
        response = await api.put("/models/life", params={"min_worker": 3, "synchronous": "true"})
        assert response.status_code == 200
        assert response.json() == {"status": "Workers scaled to 3 for model: life, version: 1.0"}
        data = await describe(api, "life", "1.0")
        assert (data["minWorkers"], data["maxWorkers"]) == (3, 3)
        v1_ids = [w["id"] for w in data["workers"] if w["status"] == "READY"]
        assert len(set(v1_ids)) == 3

        # Scale down: the retired workers are gone when the answer comes.
        response = await api.put(
            "/models/life/1.0", params={"min_worker": 1, "max_worker": 2, "synchronous": "true"}
        )
        assert response.status_code == 200
        data = await describe(api, "life", "1.0")
        assert (data["minWorkers"], data["maxWorkers"]) == (1, 2)
        assert len(data["workers"]) == 1
        (kept,) = [w["id"] for w in data["workers"]]
        await wait_gone(lantern, [i for i in v1_ids if i != kept])
        v1_ids = [kept]

        # Asynchronous scale (TorchServe's default for PUT).
        response = await api.put("/models/life/2.0", params={"min_worker": 2})
        assert response.status_code == 202
        assert response.json() == {"status": "Processing worker updates..."}
        v2_ids = await wait_ready(api, "life", "2.0", 2)

        # Predictions on both versions and on the default one.
        for path, ids in (("/predictions/life/1.0", v1_ids), ("/predictions/life/2.0", v2_ids)):
            response = await infer.post(path, content=b"hello")
            assert response.status_code == 200, response.text
            assert response.json()["echo"] == "hello"
            assert response.json()["worker"] in ids
        default = await infer.post("/predictions/life", content=b"x")
        assert default.json()["worker"] in v1_ids

        response = await api.put("/models/life/2.0/set-default")
        assert response.status_code == 200
        assert response.json() == {
            "status": 'Default version successfully updated for model "life" to "2.0"'
        }
        assert (await describe(api, "life"))["modelVersion"] == "2.0"
        default = await infer.post("/predictions/life", content=b"x")
        assert default.json()["worker"] in v2_ids
        models = (await api.get("/models")).json()["models"]
        assert {m["modelName"]: m["modelUrl"] for m in models}["life"] == "echo-v2.mar"

        # The default version cannot go while another version exists.
        assert_error(await api.delete("/models/life/2.0"), 403, "InvalidModelVersionException")
        assert_error(await api.delete("/models/life"), 403, "InvalidModelVersionException")

        response = await api.delete("/models/life/1.0")
        assert response.status_code == 200
        assert response.json() == {"status": 'Model "life" unregistered'}
        await wait_gone(lantern, v1_ids)
        assert_error(await infer.post("/predictions/life/1.0", content=b"x"), 404)
        gone = await api.get("/models/life/1.0")
        assert_error(gone, 404, "ModelVersionNotFoundException")
        assert (await infer.post("/predictions/life", content=b"x")).status_code == 200

        response = await api.delete("/models/life")
        assert response.status_code == 200
        await wait_gone(lantern, v2_ids)
        assert_error(await api.get("/models/life"), 404, "ModelNotFoundException")
        missing = await infer.post("/predictions/life", content=b"x")
        assert_error(missing, 404, "ModelNotFoundException")
        # Both versions' extracted archives are removed with them.
        assert extracted_dirs(lantern) == before

    serve(tmp_path, test)


def test_register_json_body_and_model_config_precedence(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api = lantern.management
        # The archive's model-config.yaml applies under the call's parameters.
        response = await api.post(
            "/models", json={"url": "cfg.mar", "batch_size": 5, "response_timeout": 30}
        )
        assert response.status_code == 200, response.text
        assert response.json() == {
            "status": 'Model "cfg" Version: 1.0 registered with 1 initial workers'
        }
        data = await describe(api, "cfg")
        assert data["batchSize"] == 5  # call over yaml 3
        assert data["maxBatchDelay"] == 7  # yaml over the default 100
        assert data["responseTimeout"] == 30  # call over yaml 11
        assert data["startupTimeout"] == 120  # default
        assert (data["minWorkers"], data["maxWorkers"]) == (1, 2)  # yaml minWorkers/maxWorkers
        assert len(data["workers"]) == 1

        response = await api.post(
            "/models",
            json={
                "url": "cfg.mar",
                "model_name": "cfg0",
                "initial_workers": 0,
                "max_batch_delay": 25,
                "startup_timeout": 9,
                "synchronous": True,
            },
        )
        assert response.status_code == 200
        assert response.json() == {
            "status": 'Model "cfg0" Version: 1.0 registered with 0 initial workers. '
            "Use scale workers API to add workers for the model."
        }
        data = await describe(api, "cfg0")
        assert (data["minWorkers"], data["workers"]) == (0, [])
        assert (data["maxBatchDelay"], data["startupTimeout"]) == (25, 9)

        # TorchServe's default for initial_workers is default_workers_per_model: 0 unless set.
        response = await register(api, "echo.mar", model_name="noworkers")
        assert response.status_code == 200
        assert "registered with 0 initial workers" in response.json()["status"]

        bad = await api.post(
            "/models", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert_error(bad, 400, "BadRequestException")
        assert_error(await api.post("/models", json=["cfg.mar"]), 400)
        assert_error(await api.post("/models", json={"url": "cfg.mar", "batch_size": 0}), 400)
        many = await api.post("/models", json={"url": "cfg.mar", "batch_size": "many"})
        assert_error(many, 400)
        assert_error(await api.post("/models", json={"model_name": "x"}), 400)
        for name in ("cfg", "cfg0", "noworkers"):
            assert (await api.delete(f"/models/{name}")).status_code == 200

    serve(tmp_path, test)


def test_list_models_paging(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api = lantern.management
        names = [f"page{i}" for i in range(5)]
        for name in names:
            response = await register(api, "echo.mar", model_name=name, initial_workers=0)
            assert response.status_code == 200
        everything = (await api.get("/models")).json()
        assert "nextPageToken" not in everything
        all_names = [m["modelName"] for m in everything["models"]]
        assert all_names == sorted(all_names)
        assert set(names) <= set(all_names)

        seen: list[str] = []
        token: str | None = "0"
        pages = 0
        while token is not None:
            params: dict[str, Any] = {"limit": 2, "next_page_token": token}
            body = (await api.get("/models", params=params)).json()
            assert len(body["models"]) <= 2
            seen += [m["modelName"] for m in body["models"]]
            token = body.get("nextPageToken")
            pages += 1
            if token is not None:
                assert token == str(2 * pages)
        assert seen == all_names
        assert pages == (len(all_names) + 1) // 2

        # Out-of-range values fall back as in TorchServe; a non-number is a 400.
        assert (await api.get("/models", params={"limit": 1000})).json() == everything
        assert (await api.get("/models", params={"limit": -1})).json() == everything
        assert (await api.get("/models", params={"next_page_token": -3})).json() == everything
        far = await api.get("/models", params={"next_page_token": 1000})
        assert far.json() == {"models": []}
        assert_error(await api.get("/models", params={"limit": "ten"}), 400)
        for name in names:
            assert (await api.delete(f"/models/{name}")).status_code == 200

    serve(tmp_path, test)


def test_error_status_codes(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        assert_error(await api.get("/models/nope"), 404, "ModelNotFoundException")
        assert_error(await api.get("/models/nope/all"), 404, "ModelNotFoundException")
        assert_error(await api.put("/models/nope", params={"min_worker": 1}), 404)
        assert_error(await api.put("/models/nope/1.0/set-default"), 404)
        assert_error(await api.delete("/models/nope"), 404, "ModelNotFoundException")
        assert_error(await api.get("/v1/models/nope"), 404)
        assert_error(await api.get("/no/such/route"), 404, "ResourceNotFoundException")
        assert_error(await api.patch("/models"), 405, "MethodNotAllowedException")
        assert_error(await api.get("/models/x/1.0/set-default"), 405)

        body = assert_error(await api.post("/models"), 400, "BadRequestException")
        assert body["message"] == "Parameter url is required."
        assert_error(await register(api, "missing.mar"), 404, "ModelNotFoundException")
        assert_error(await register(api, "echo.mar", runtime="LSP"), 400)
        assert_error(await register(api, "echo.mar", model_name="../escape"), 400)

        response = await register(api, "echo.mar", model_name="codes", initial_workers=1)
        assert response.status_code == 200
        invalid: list[dict[str, Any]] = [
            {"min_worker": 3, "max_worker": 1},
            {"min_worker": -1},
            {"min_worker": "two"},
        ]
        for query in invalid:
            assert_error(await api.put("/models/codes", params=query), 400)
        assert_error(await api.put("/models/codes/9.9", params={"min_worker": 1}), 404)
        unknown = await api.put("/models/codes/9.9/set-default")
        assert_error(unknown, 404, "ModelVersionNotFoundException")
        unknown = await api.delete("/models/codes/9.9")
        assert_error(unknown, 404, "ModelVersionNotFoundException")
        # Invalid async scaling is refused before the 202, not lost in the background.
        refused = await api.put("/models/codes", params={"min_worker": 2, "max_worker": 1})
        assert_error(refused, 400)
        assert (await api.delete("/models/codes")).status_code == 200

        # No worker can start: 500, and the version is not left registered.
        body = assert_error(await register(api, "broken.mar", initial_workers=1), 500)
        assert "this model never loads" in body["message"]
        assert_error(await api.get("/models/broken"), 404)

        # Some workers start, some cannot: 206, as TorchServe answers.
        response = await register(api, "half.mar", initial_workers=2)
        assert response.status_code == 206
        assert response.json() == {"status": MISSING_WORKERS}
        assert len(await ready_ids(api, "half")) == 1
        params: dict[str, Any] = {"min_worker": 3, "synchronous": "true"}
        response = await api.put("/models/half", params=params)
        assert response.status_code == 206
        assert response.json() == {"status": MISSING_WORKERS}
        assert (await infer.post("/predictions/half", content=b"x")).text == "half"
        assert (await api.delete("/models/half")).status_code == 200

    serve(tmp_path, test)


def test_customized_describe_and_readiness(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        assert (await register(api, "meta.mar", initial_workers=1)).status_code == 200
        response = await api.get("/models/meta", params={"customized": "true"})
        assert response.status_code == 200
        (data,) = response.json()
        metadata = data["customizedMetadata"]
        assert isinstance(metadata, str)  # TorchServe sends the handler's output as a string
        assert json.loads(metadata)["handler"] == "meta"
        assert json.loads(metadata)["worker"] in await ready_ids(api, "meta")
        assert "customizedMetadata" not in await describe(api, "meta")
        every = (await api.get("/models/meta/all?customized=true")).json()
        assert "customizedMetadata" not in every[0]
        assert (await api.get("/v1/models/meta")).json() == {"name": "meta", "ready": True}

        response = await api.put("/models/meta", params={"min_worker": 0, "synchronous": "true"})
        assert response.json() == {"status": "Workers scaled to 0 for model: meta, version: 1.0"}
        assert (await api.get("/v1/models/meta")).json() == {"name": "meta", "ready": False}
        assert_error(await api.get("/models/meta", params={"customized": "true"}), 503)
        assert_error(await infer.post("/predictions/meta", content=b"x"), 503)
        assert (await api.delete("/models/meta")).status_code == 200

    serve(tmp_path, test)


def test_model_config_yaml_is_read_safely(tmp_path: Path) -> None:
    # A python-object tag in model-config.yaml ran code in TorchServe < 0.8.2 (CVE-2022-1471).
    marker = tmp_path / "pwned"

    async def test(lantern: Lantern) -> None:
        api = lantern.management
        archive = Path(lantern.server.config.model_store or "") / "evil.mar"
        manifest = {
            "runtime": "python",
            "model": {
                "modelName": "evil",
                "modelVersion": "1.0",
                "handler": "echo_handler.py",
                "configFile": "model-config.yaml",
            },
            "archiverVersion": "0.12.0",
        }
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
            zf.writestr("echo_handler.py", "def handle(data, context):\n    return data\n")
            zf.writestr(
                "model-config.yaml",
                f"batchSize: !!python/object/apply:os.system ['touch {marker}']\n",
            )
        refused = await register(api, "evil.mar", initial_workers=1)
        message = assert_error(refused, 400)["message"]
        assert "model-config.yaml" in message and "python/object" in message
        assert not marker.exists()
        assert_error(await api.get("/models/evil"), 404)

    serve(tmp_path, test)


def test_api_description(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api = lantern.management
        for response in (await api.request("OPTIONS", "/"), await api.get("/api-description")):
            assert response.status_code == 200
            spec = response.json()
            assert spec["openapi"] == "3.0.1"
            paths = spec["paths"]
            assert {"get", "post"} <= set(paths["/models"])
            assert {"get", "put", "delete"} <= set(paths["/models/{model_name}/{model_version}"])
            assert "put" in paths["/models/{model_name}/{model_version}/set-default"]
            assert "get" in paths["/v1/models/{model_name}"]
            register_op = paths["/models"]["post"]
            assert {p["name"] for p in register_op["parameters"]} >= {
                "url",
                "model_name",
                "initial_workers",
                "synchronous",
            }
            assert "application/json" in register_op["requestBody"]["content"]
        assert_error(await api.request("OPTIONS", "/models/nope"), 404)

    serve(tmp_path, test)


# ----- safe defaults for model URLs ------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self) -> None:
        self.requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_urls_outside_the_store_are_refused_before_any_fetch(tmp_path: Path) -> None:
    listener = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=listener.serve_forever, daemon=True)
    thread.start()
    port = listener.server_address[1]

    async def test(lantern: Lantern) -> None:
        api = lantern.management
        store = Path(lantern.server.config.model_store or "")
        for url in (
            f"http://127.0.0.1:{port}/echo.mar",
            f"https://127.0.0.1:{port}/echo.mar",
            f"HTTP://127.0.0.1:{port}/echo.mar",
        ):
            body = assert_error(await register(api, url), 400, "InvalidModelUrl")
            assert "allowed_urls" in body["message"]
        for url in (
            "../store/echo.mar",
            "sub/../echo.mar",
            "%2e%2e/store/echo.mar",
            "..%2fstore%2fecho.mar",
            f"http://127.0.0.1:{port}/a/../echo.mar",
            str(store / "echo.mar"),  # absolute, even inside the store
            (store / "echo.mar").as_uri(),
            "ftp://127.0.0.1/echo.mar",
        ):
            assert_error(await register(api, url), 400, "InvalidModelUrl")
        assert _Recorder.requests == []  # the listener was never contacted
        models = (await api.get("/models")).json()["models"]
        assert "echo" not in {m["modelName"] for m in models}

    try:
        serve(tmp_path, test)
    finally:
        listener.shutdown()
        listener.server_close()


# ----- changes under traffic -------------------------------------------------------------------


def test_unregister_drains_in_flight_and_queued_requests(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        before = extracted_dirs(lantern)
        response = await register(api, "echo.mar", model_name="slow", initial_workers=1)
        assert response.status_code == 200
        ids = await ready_ids(api, "slow")
        sent = time.monotonic()
        calls = [
            asyncio.create_task(infer.post("/predictions/slow", content=b"sleep 0.3"))
            for _ in range(3)
        ]
        # One request runs on the worker, two wait in the queue.
        await pending_at_least(api, "slow", 2)
        response = await api.delete("/models/slow")
        assert response.status_code == 200
        assert response.json() == {"status": 'Model "slow" unregistered'}
        # DELETE answered only after every request was served: three 0.3 s batches, one worker.
        assert time.monotonic() - sent >= 3 * 0.3
        results = await asyncio.gather(*calls)
        assert [r.status_code for r in results] == [200, 200, 200]
        assert all(r.json()["echo"] == "sleep 0.3" for r in results)
        await wait_gone(lantern, ids)
        assert extracted_dirs(lantern) == before

    serve(tmp_path, test)


def test_scale_down_lets_the_busy_worker_finish_its_batch(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        response = await register(api, "echo.mar", model_name="shrink", initial_workers=1)
        assert response.status_code == 200
        ids = await ready_ids(api, "shrink")
        (worker,) = lantern.workers.of("shrink")
        sent = time.monotonic()
        running = asyncio.create_task(infer.post("/predictions/shrink", content=b"sleep 0.5"))
        await until(lambda: len(worker.batches) == 1)  # on the worker by now
        queued = asyncio.create_task(infer.post("/predictions/shrink", content=b"sleep 0.5"))
        await pending_at_least(api, "shrink", 1)
        params: dict[str, Any] = {"min_worker": 0, "synchronous": "true"}
        response = await api.put("/models/shrink", params=params)
        assert response.status_code == 200
        assert response.json() == {"status": "Workers scaled to 0 for model: shrink, version: 1.0"}
        # The synchronous answer came after the busy worker finished its batch and left.
        assert time.monotonic() - sent >= 0.5
        assert (await running).status_code == 200
        assert (await running).json()["echo"] == "sleep 0.5"
        # What was still queued has no worker left to run on: answered at once, not at timeout.
        assert_error(await queued, 503)
        await wait_gone(lantern, ids)
        assert (await describe(api, "shrink"))["workers"] == []
        assert (await api.delete("/models/shrink")).status_code == 200

    serve(tmp_path, test)


def test_lifecycle_changes_under_concurrent_inference(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        api, infer = lantern.management, lantern.inference
        response = await register(api, "echo.mar", model_name="busy", initial_workers=1)
        assert response.status_code == 200
        stop = asyncio.Event()
        answered = [0]
        paths = ["/predictions/busy", "/predictions/busy/1.0", "/predictions/busy/2.0"]

        async def load(index: int) -> list[tuple[str, int, Any, float, float]]:
            outcomes = []
            # Bounded (at most 4 x 400 requests), paced so that the load spans every change.
            for n in range(400):
                if stop.is_set():
                    break
                path = paths[(index + n) % len(paths)]
                began = time.monotonic()
                try:
                    response = await infer.post(path, content=f"{index}-{n}".encode())
                except httpx.HTTPError as exc:  # an error or a hang is a failure
                    outcomes.append((path, -1, repr(exc), began, time.monotonic()))
                    continue
                try:
                    body = response.json()
                except ValueError:
                    body = response.text
                outcomes.append((path, response.status_code, body, began, time.monotonic()))
                answered[0] += 1
                await asyncio.sleep(0.01)
            return outcomes

        steps: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", "/models", {"url": "echo-v2.mar", "model_name": "busy", "initial_workers": 1}),
            ("PUT", "/models/busy/1.0", {"min_worker": 2, "synchronous": "true"}),
            ("PUT", "/models/busy/2.0/set-default", {}),
            ("PUT", "/models/busy/1.0", {"min_worker": 1, "synchronous": "true"}),
            ("PUT", "/models/busy/2.0", {"min_worker": 2}),
            ("PUT", "/models/busy/1.0/set-default", {}),
            ("DELETE", "/models/busy/2.0", {}),
            ("PUT", "/models/busy/1.0", {"min_worker": 2, "synchronous": "true"}),
        ]
        times: dict[str, float] = {}
        loads = [asyncio.create_task(load(i)) for i in range(4)]
        await until(lambda: answered[0] >= 20)  # traffic flows before the first change
        for method, path, params in steps:
            times.setdefault(f"{method} started", time.monotonic())
            response = await api.request(method, path, params=params)
            assert response.status_code in (200, 202), (method, path, response.text)
            times[f"{method} done"] = time.monotonic()
            await asyncio.sleep(0.1)
        stop.set()
        outcomes = [o for found in await asyncio.gather(*loads) for o in found]

        assert [o for o in outcomes if o[1] == -1] == []  # no transport error, no hang
        for path, status, body, _, _ in outcomes:
            if status == 200:
                assert body["echo"].count("-") == 1
                continue
            # Anything else is a JSON error, and only for the version that came and went.
            assert path == "/predictions/busy/2.0", (path, status, body)
            assert status in (404, 503), (path, status, body)
            assert body["code"] == status and body["type"] and body["message"]
        by_path = {p: [o[1] for o in outcomes if o[0] == p] for p in paths}
        assert set(by_path["/predictions/busy"]) == {200}
        assert set(by_path["/predictions/busy/1.0"]) == {200}
        # The load spanned the changes: version 2.0 was asked for before it was registered,
        # while it served and after it was removed.
        v2 = [o for o in outcomes if o[0] == "/predictions/busy/2.0"]
        before = [o[1] for o in v2 if o[4] < times["POST started"]]
        after = [o[1] for o in v2 if o[3] > times["DELETE done"]]
        assert before and set(before) == {404}
        assert after and set(after) == {404}
        assert 200 in [o[1] for o in v2]
        assert len(await ready_ids(api, "busy")) == 2
        assert (await api.delete("/models/busy")).status_code == 200

    serve(tmp_path, test)
