"""The management API against a running server: TorchServe's routes, bodies and status codes.

One server (``--enable-model-api``, default security settings) serves the whole module. Every test
registers its own model names (the same archives under ``model_name=``) and removes them again.
"""

from __future__ import annotations

import json
import threading
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.support.server import LanternServer, build_archive, echo_archive, pid_alive

MISSING_WORKERS = "Workers scaling in progress..."

# Answers describe requests (TorchServe sends them with a `describe: True` header).
META_HANDLER = """
import json, os

def handle(data, context):
    if data is None:
        return None
    if context.get_request_header(0, "describe") == "True":
        return [json.dumps({"handler": "meta", "pid": os.getpid()})]
    return ["meta" for _ in data]
"""
# Only the first worker of a version can load: the second one finds the claim taken.
HALF_HANDLER = """
import os

def handle(data, context):
    if data is None:
        claim = os.path.join(context.system_properties["model_dir"], "claimed")
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return None
    return ["half" for _ in data]
"""
BROKEN_HANDLER = """
def handle(data, context):
    raise RuntimeError("this model never loads")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    root = tmp_path_factory.mktemp("management")
    store = root / "store"
    store.mkdir()
    build_dir = root / "build"
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
    for name, source in (
        ("meta", META_HANDLER),
        ("half", HALF_HANDLER),
        ("broken", BROKEN_HANDLER),
    ):
        handler = build_dir / f"{name}_handler.py"
        handler.write_text(source)
        build_archive(store, name, handler)
    work = root / "work"
    srv = LanternServer(
        root, store, args=["--enable-model-api"], env={"LANTERN_WORK_DIR": str(work)}
    )
    srv.work = work  # type: ignore[attr-defined]
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api(server: LanternServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.management, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def infer(server: LanternServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.inference, timeout=60) as client:
        yield client


def register(api: httpx.Client, url: str, **params: Any) -> httpx.Response:
    return api.post("/models", params={"url": url, **params})


def describe(api: httpx.Client, name: str, version: str | None = None) -> dict[str, Any]:
    path = f"/models/{name}" + (f"/{version}" if version else "")
    response = api.get(path)
    assert response.status_code == 200, response.text
    (data,) = response.json()
    return data


def ready_pids(api: httpx.Client, name: str, version: str | None = None) -> list[int]:
    workers = describe(api, name, version)["workers"]
    return [w["pid"] for w in workers if w["status"] == "READY"]


def wait_ready(api: httpx.Client, name: str, version: str, count: int) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        data = describe(api, name, version)
        pids = [w["pid"] for w in data["workers"] if w["status"] == "READY"]
        if len(pids) == count and len(data["workers"]) == count:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"{name} {version} did not reach {count} ready workers: {data}")


def assert_error(response: httpx.Response, code: int, error_type: str | None = None) -> dict:
    assert response.status_code == code, response.text
    body = response.json()
    assert set(body) == {"code", "type", "message"}
    assert body["code"] == code
    if error_type is not None:
        assert body["type"] == error_type
    return body


def extracted_dirs(server: LanternServer) -> set[str]:
    folder = server.work / "models"  # type: ignore[attr-defined]
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def wait_dead(pids: list[int]) -> None:
    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids), pids


# ----- the whole lifecycle --------------------------------------------------------------------


def test_lifecycle_register_describe_scale_version_default_unregister(
    server: LanternServer, api: httpx.Client, infer: httpx.Client
) -> None:
    before = extracted_dirs(server)
    response = register(api, "echo.mar", model_name="life", initial_workers=1)
    assert response.status_code == 200
    assert response.json() == {
        "status": 'Model "life" Version: 1.0 registered with 1 initial workers'
    }

    data = describe(api, "life")
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
    assert pid_alive(worker["pid"])
    assert worker["memoryUsage"] > 0
    assert worker["gpu"] is False
    assert isinstance(worker["id"], str) and isinstance(worker["startTime"], str)

    assert_error(register(api, "echo.mar", model_name="life"), 409, "ConflictStatusException")

    # A second version, registered asynchronously.
    response = register(
        api, "echo-v2.mar", model_name="life", initial_workers=1, synchronous="false"
    )
    assert response.status_code == 202
    assert response.json() == {"status": "Processing worker updates..."}
    v2_pids = wait_ready(api, "life", "2.0", 1)
    assert describe(api, "life")["modelVersion"] == "1.0"  # the first version stays default
    everything = api.get("/models/life/all").json()
    assert sorted(d["modelVersion"] for d in everything) == ["1.0", "2.0"]

    # Scale up, synchronously: the answer comes when the workers are ready.
    response = api.put("/models/life", params={"min_worker": 3, "synchronous": "true"})
    assert response.status_code == 200
    assert response.json() == {"status": "Workers scaled to 3 for model: life, version: 1.0"}
    data = describe(api, "life", "1.0")
    assert (data["minWorkers"], data["maxWorkers"]) == (3, 3)
    v1_pids = [w["pid"] for w in data["workers"] if w["status"] == "READY"]
    assert len(set(v1_pids)) == 3

    # Scale down: the retired workers are gone when the answer comes.
    response = api.put(
        "/models/life/1.0", params={"min_worker": 1, "max_worker": 2, "synchronous": "true"}
    )
    assert response.status_code == 200
    data = describe(api, "life", "1.0")
    assert (data["minWorkers"], data["maxWorkers"]) == (1, 2)
    assert len(data["workers"]) == 1
    (kept,) = [w["pid"] for w in data["workers"]]
    wait_dead([p for p in v1_pids if p != kept])
    v1_pids = [kept]

    # Asynchronous scale (TorchServe's default for PUT).
    response = api.put("/models/life/2.0", params={"min_worker": 2})
    assert response.status_code == 202
    assert response.json() == {"status": "Processing worker updates..."}
    v2_pids = wait_ready(api, "life", "2.0", 2)

    # Predictions on both versions and on the default one.
    for path, pids in (("/predictions/life/1.0", v1_pids), ("/predictions/life/2.0", v2_pids)):
        response = infer.post(path, content=b"hello")
        assert response.status_code == 200, response.text
        assert response.json()["echo"] == "hello"
        assert response.json()["pid"] in pids
    assert infer.post("/predictions/life", content=b"x").json()["pid"] in v1_pids

    response = api.put("/models/life/2.0/set-default")
    assert response.status_code == 200
    assert response.json() == {
        "status": 'Default version successfully updated for model "life" to "2.0"'
    }
    assert describe(api, "life")["modelVersion"] == "2.0"
    assert infer.post("/predictions/life", content=b"x").json()["pid"] in v2_pids
    listed = {m["modelName"]: m["modelUrl"] for m in api.get("/models").json()["models"]}
    assert listed["life"] == "echo-v2.mar"

    # The default version cannot go while another version exists.
    assert_error(api.delete("/models/life/2.0"), 403, "InvalidModelVersionException")
    assert_error(api.delete("/models/life"), 403, "InvalidModelVersionException")

    response = api.delete("/models/life/1.0")
    assert response.status_code == 200
    assert response.json() == {"status": 'Model "life" unregistered'}
    wait_dead(v1_pids)
    assert_error(infer.post("/predictions/life/1.0", content=b"x"), 404)
    assert_error(api.get("/models/life/1.0"), 404, "ModelVersionNotFoundException")
    assert infer.post("/predictions/life", content=b"x").status_code == 200

    response = api.delete("/models/life")
    assert response.status_code == 200
    wait_dead(v2_pids)
    assert_error(api.get("/models/life"), 404, "ModelNotFoundException")
    assert_error(infer.post("/predictions/life", content=b"x"), 404, "ModelNotFoundException")
    # Both versions' extracted archives are removed with them.
    assert extracted_dirs(server) == before


def test_register_json_body_and_model_config_precedence(api: httpx.Client) -> None:
    # The archive's model-config.yaml applies under the call's parameters.
    response = api.post("/models", json={"url": "cfg.mar", "batch_size": 5, "response_timeout": 30})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "status": 'Model "cfg" Version: 1.0 registered with 1 initial workers'
    }
    data = describe(api, "cfg")
    assert data["batchSize"] == 5  # call over yaml 3
    assert data["maxBatchDelay"] == 7  # yaml over the default 100
    assert data["responseTimeout"] == 30  # call over yaml 11
    assert data["startupTimeout"] == 120  # default
    assert (data["minWorkers"], data["maxWorkers"]) == (1, 2)  # yaml minWorkers/maxWorkers
    assert len(data["workers"]) == 1

    response = api.post(
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
    data = describe(api, "cfg0")
    assert (data["minWorkers"], data["workers"]) == (0, [])
    assert (data["maxBatchDelay"], data["startupTimeout"]) == (25, 9)

    # TorchServe's default for initial_workers is default_workers_per_model: 0 unless configured.
    response = register(api, "echo.mar", model_name="noworkers")
    assert response.status_code == 200
    assert "registered with 0 initial workers" in response.json()["status"]

    bad = api.post("/models", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_error(bad, 400, "BadRequestException")
    assert_error(api.post("/models", json=["cfg.mar"]), 400)
    assert_error(api.post("/models", json={"url": "cfg.mar", "batch_size": 0}), 400)
    assert_error(api.post("/models", json={"url": "cfg.mar", "batch_size": "many"}), 400)
    assert_error(api.post("/models", json={"model_name": "x"}), 400)
    for name in ("cfg", "cfg0", "noworkers"):
        assert api.delete(f"/models/{name}").status_code == 200


def test_list_models_paging(api: httpx.Client) -> None:
    names = [f"page{i}" for i in range(5)]
    for name in names:
        assert register(api, "echo.mar", model_name=name, initial_workers=0).status_code == 200
    everything = api.get("/models").json()
    assert "nextPageToken" not in everything
    all_names = [m["modelName"] for m in everything["models"]]
    assert all_names == sorted(all_names)
    assert set(names) <= set(all_names)

    seen: list[str] = []
    token: str | None = "0"
    pages = 0
    while token is not None:
        body = api.get("/models", params={"limit": 2, "next_page_token": token}).json()
        assert len(body["models"]) <= 2
        seen += [m["modelName"] for m in body["models"]]
        token = body.get("nextPageToken")
        pages += 1
        if token is not None:
            assert token == str(2 * pages)
    assert seen == all_names
    assert pages == (len(all_names) + 1) // 2

    # Out-of-range values fall back as in TorchServe; a non-number is a 400.
    assert api.get("/models", params={"limit": 1000}).json() == everything
    assert api.get("/models", params={"limit": -1}).json() == everything
    assert api.get("/models", params={"next_page_token": -3}).json() == everything
    assert api.get("/models", params={"next_page_token": 1000}).json() == {"models": []}
    assert_error(api.get("/models", params={"limit": "ten"}), 400)
    for name in names:
        assert api.delete(f"/models/{name}").status_code == 200


def test_error_status_codes(api: httpx.Client, infer: httpx.Client) -> None:
    assert_error(api.get("/models/nope"), 404, "ModelNotFoundException")
    assert_error(api.get("/models/nope/all"), 404, "ModelNotFoundException")
    assert_error(api.put("/models/nope", params={"min_worker": 1}), 404)
    assert_error(api.put("/models/nope/1.0/set-default"), 404)
    assert_error(api.delete("/models/nope"), 404, "ModelNotFoundException")
    assert_error(api.get("/v1/models/nope"), 404)
    assert_error(api.get("/no/such/route"), 404, "ResourceNotFoundException")
    assert_error(api.patch("/models"), 405, "MethodNotAllowedException")
    assert_error(api.get("/models/x/1.0/set-default"), 405)

    body = assert_error(api.post("/models"), 400, "BadRequestException")
    assert body["message"] == "Parameter url is required."
    assert_error(register(api, "missing.mar"), 404, "ModelNotFoundException")
    assert_error(register(api, "echo.mar", runtime="LSP"), 400)
    assert_error(register(api, "echo.mar", model_name="../escape"), 400)

    assert register(api, "echo.mar", model_name="codes", initial_workers=1).status_code == 200
    assert_error(api.put("/models/codes", params={"min_worker": 3, "max_worker": 1}), 400)
    assert_error(api.put("/models/codes", params={"min_worker": -1}), 400)
    assert_error(api.put("/models/codes", params={"min_worker": "two"}), 400)
    assert_error(api.put("/models/codes/9.9", params={"min_worker": 1}), 404)
    assert_error(api.put("/models/codes/9.9/set-default"), 404, "ModelVersionNotFoundException")
    assert_error(api.delete("/models/codes/9.9"), 404, "ModelVersionNotFoundException")
    # Invalid async scaling is refused before the 202, not lost in the background.
    assert_error(api.put("/models/codes", params={"min_worker": 2, "max_worker": 1}), 400)
    assert api.delete("/models/codes").status_code == 200

    # No worker can start: 500, and the version is not left registered.
    body = assert_error(register(api, "broken.mar", initial_workers=1), 500)
    assert "this model never loads" in body["message"]
    assert_error(api.get("/models/broken"), 404)

    # Some workers start, some cannot: 206, as TorchServe answers.
    response = register(api, "half.mar", initial_workers=2)
    assert response.status_code == 206
    assert response.json() == {"status": MISSING_WORKERS}
    assert len(ready_pids(api, "half")) == 1
    response = api.put("/models/half", params={"min_worker": 3, "synchronous": "true"})
    assert response.status_code == 206
    assert response.json() == {"status": MISSING_WORKERS}
    assert infer.post("/predictions/half", content=b"x").text == "half"
    assert api.delete("/models/half").status_code == 200


def test_customized_describe_and_readiness(api: httpx.Client, infer: httpx.Client) -> None:
    assert register(api, "meta.mar", initial_workers=1).status_code == 200
    response = api.get("/models/meta", params={"customized": "true"})
    assert response.status_code == 200
    (data,) = response.json()
    metadata = data["customizedMetadata"]
    assert isinstance(metadata, str)  # TorchServe sends the handler's output as a string
    assert json.loads(metadata)["handler"] == "meta"
    assert json.loads(metadata)["pid"] in ready_pids(api, "meta")
    assert "customizedMetadata" not in describe(api, "meta")
    assert "customizedMetadata" not in api.get("/models/meta/all?customized=true").json()[0]
    assert api.get("/v1/models/meta").json() == {"name": "meta", "ready": True}

    response = api.put("/models/meta", params={"min_worker": 0, "synchronous": "true"})
    assert response.json() == {"status": "Workers scaled to 0 for model: meta, version: 1.0"}
    assert api.get("/v1/models/meta").json() == {"name": "meta", "ready": False}
    assert_error(api.get("/models/meta", params={"customized": "true"}), 503)
    assert_error(infer.post("/predictions/meta", content=b"x"), 503)
    assert api.delete("/models/meta").status_code == 200


def test_model_config_yaml_is_read_safely(server: LanternServer, api: httpx.Client) -> None:
    # A python-object tag in model-config.yaml ran code in TorchServe < 0.8.2 (CVE-2022-1471).
    marker = server.workdir / "pwned"
    archive = server.model_store / "evil.mar"
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
            "model-config.yaml", f"batchSize: !!python/object/apply:os.system ['touch {marker}']\n"
        )
    message = assert_error(register(api, "evil.mar", initial_workers=1), 400)["message"]
    assert "model-config.yaml" in message and "python/object" in message
    assert not marker.exists()
    assert_error(api.get("/models/evil"), 404)


def test_api_description(api: httpx.Client) -> None:
    for response in (api.request("OPTIONS", "/"), api.get("/api-description")):
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
    assert_error(api.request("OPTIONS", "/models/nope"), 404)


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


def test_urls_outside_the_store_are_refused_before_any_fetch(
    server: LanternServer, api: httpx.Client
) -> None:
    listener = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=listener.serve_forever, daemon=True)
    thread.start()
    port = listener.server_address[1]
    store = server.model_store
    try:
        for url in (
            f"http://127.0.0.1:{port}/echo.mar",
            f"https://127.0.0.1:{port}/echo.mar",
            f"HTTP://127.0.0.1:{port}/echo.mar",
        ):
            body = assert_error(register(api, url), 400, "InvalidModelUrl")
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
            assert_error(register(api, url), 400, "InvalidModelUrl")
        assert _Recorder.requests == []  # the listener was never contacted
        assert "echo" not in {m["modelName"] for m in api.get("/models").json()["models"]}
    finally:
        listener.shutdown()
        listener.server_close()


# ----- changes under traffic -------------------------------------------------------------------


def test_unregister_drains_in_flight_and_queued_requests(
    server: LanternServer, api: httpx.Client
) -> None:
    before = extracted_dirs(server)
    assert register(api, "echo.mar", model_name="slow", initial_workers=1).status_code == 200
    (pid,) = ready_pids(api, "slow")

    def call() -> httpx.Response:
        return httpx.post(f"{server.inference}/predictions/slow", content=b"sleep 0.8", timeout=60)

    with ThreadPoolExecutor(3) as pool:
        sent = time.monotonic()
        futures = [pool.submit(call) for _ in range(3)]
        # One request runs on the worker, two wait in the queue.
        deadline = time.monotonic() + 30
        while describe(api, "slow")["jobQueueStatus"]["pendingRequests"] < 2:
            assert time.monotonic() < deadline, "requests never queued"
            time.sleep(0.02)
        response = api.delete("/models/slow")
        assert response.status_code == 200
        assert response.json() == {"status": 'Model "slow" unregistered'}
        # DELETE answered only after every request was served: three 0.8 s batches, one worker.
        assert time.monotonic() - sent >= 3 * 0.8
        results = [f.result(timeout=30) for f in futures]
    assert [r.status_code for r in results] == [200, 200, 200]
    assert all(r.json()["echo"] == "sleep 0.8" for r in results)
    wait_dead([pid])
    assert extracted_dirs(server) == before


def test_scale_down_lets_the_busy_worker_finish_its_batch(
    server: LanternServer, api: httpx.Client
) -> None:
    assert register(api, "echo.mar", model_name="shrink", initial_workers=1).status_code == 200
    (pid,) = ready_pids(api, "shrink")

    def call() -> httpx.Response:
        url = f"{server.inference}/predictions/shrink"
        return httpx.post(url, content=b"sleep 1.0", timeout=60)

    with ThreadPoolExecutor(2) as pool:
        sent = time.monotonic()
        running = pool.submit(call)
        time.sleep(0.3)  # on the worker by now
        queued = pool.submit(call)
        deadline = time.monotonic() + 30
        while describe(api, "shrink")["jobQueueStatus"]["pendingRequests"] < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.02)
        response = api.put("/models/shrink", params={"min_worker": 0, "synchronous": "true"})
        assert response.status_code == 200
        assert response.json() == {"status": "Workers scaled to 0 for model: shrink, version: 1.0"}
        # The synchronous answer came after the busy worker finished its 1 s batch and left.
        assert time.monotonic() - sent >= 1.0
        assert running.result(timeout=30).status_code == 200
        assert running.result().json()["echo"] == "sleep 1.0"
        # What was still queued has no worker left to run on: answered at once, not at timeout.
        assert_error(queued.result(timeout=10), 503)
    wait_dead([pid])
    assert describe(api, "shrink")["workers"] == []
    assert api.delete("/models/shrink").status_code == 200


def test_lifecycle_changes_under_concurrent_inference(
    server: LanternServer, api: httpx.Client
) -> None:
    assert register(api, "echo.mar", model_name="busy", initial_workers=1).status_code == 200
    stop = threading.Event()
    answered = [0]
    paths = ["/predictions/busy", "/predictions/busy/1.0", "/predictions/busy/2.0"]

    def load(index: int) -> list[tuple[str, int, Any, float, float]]:
        outcomes = []
        with httpx.Client(base_url=server.inference, timeout=60) as client:
            # Bounded (at most 4 x 400 requests), paced so that the load spans every change.
            for n in range(400):
                if stop.is_set():
                    break
                path = paths[(index + n) % len(paths)]
                began = time.monotonic()
                try:
                    response = client.post(path, content=f"{index}-{n}".encode())
                except httpx.HTTPError as exc:  # a connection error or a hang is a failure
                    outcomes.append((path, -1, repr(exc), began, time.monotonic()))
                    continue
                try:
                    body = response.json()
                except ValueError:
                    body = response.text
                outcomes.append((path, response.status_code, body, began, time.monotonic()))
                answered[0] += 1
                time.sleep(0.01)
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
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(load, i) for i in range(4)]
        deadline = time.monotonic() + 30
        while answered[0] < 20:  # traffic flows before the first change
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for method, path, params in steps:
            times.setdefault(f"{method} started", time.monotonic())
            response = api.request(method, path, params=params)
            assert response.status_code in (200, 202), (method, path, response.text)
            times[f"{method} done"] = time.monotonic()
            time.sleep(0.25)
        stop.set()
        outcomes = [o for f in futures for o in f.result(timeout=120)]

    assert [o for o in outcomes if o[1] == -1] == []  # no connection error, no hang
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
    # The load spanned the changes: version 2.0 was asked for before it was registered, while it
    # served and after it was removed.
    v2 = [o for o in outcomes if o[0] == "/predictions/busy/2.0"]
    before = [o[1] for o in v2 if o[4] < times["POST started"]]
    after = [o[1] for o in v2 if o[3] > times["DELETE done"]]
    assert before and set(before) == {404}
    assert after and set(after) == {404}
    assert 200 in [o[1] for o in v2]
    assert len(ready_pids(api, "busy")) == 2
    assert api.delete("/models/busy").status_code == 200
