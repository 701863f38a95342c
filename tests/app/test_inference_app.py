"""The inference API in process over fake workers: routes, inputs by name, errors, batching, health.

What the worker process or the HTTP server itself shows (bodies decoded for the handler, several
files under one field, streaming, the size limit while streaming, cores and affinity, large bodies
on the wire) stays in `tests/e2e/test_inference.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from serve.core.jobs import BatchItem, ItemResult
from serve.wire.errors import ServeError
from tests.support.fake_workers import Behaviour, FakeWorker, FakeWorkers, fails_to_load
from tests.support.inprocess import Lantern, in_process, run, test_config, until
from tests.support.server import build_archive, echo_archive

STARTUP_MODELS = [
    "echo=echo.mar",
    "echo_v2.mar",
    "batched=batched.mar",
    "tiny_queue=tiny_queue.mar",
    "gpus.mar",
    "no_workers=no_workers.mar",
]


def store_of(root: Path) -> Path:
    store = root / "store"
    store.mkdir()
    echo_archive(store, "echo")
    echo_archive(store, "echo_v2", version="2.0")
    echo_archive(
        store,
        "batched",
        config={"batchSize": 8, "maxBatchDelay": 200, "minWorkers": 2, "maxWorkers": 2},
    )
    echo_archive(store, "gpus", config={"minWorkers": 2, "deviceIds": [3, 5]})
    echo_archive(store, "tiny_queue", config={"jobQueueSize": 2, "minWorkers": 1})
    echo_archive(store, "no_workers", config={"minWorkers": 0})
    return store


def serve(root: Path, test: Callable[[httpx.AsyncClient, Lantern], Awaitable[None]]) -> None:
    async def body() -> None:
        config = test_config(root, store_of(root), load_models=STARTUP_MODELS)
        async with in_process(config) as lantern:
            await test(lantern.inference, lantern)

    run(body)


async def post(
    infer: httpx.AsyncClient, path: str, body: bytes | str = b"", **kwargs
) -> httpx.Response:
    headers = kwargs.pop("headers", {"content-type": "text/plain"})
    return await infer.post(path, content=body, headers=headers, **kwargs)


def assert_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"code", "type", "message"}
    assert body["code"] == status
    assert resp.headers.get("x-request-id")
    return body


def test_inputs_ids_versions_and_handler_answers(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        resp = await infer.get("/ping")
        assert resp.status_code == 200
        assert resp.json() == {"status": "Healthy"}

        # The raw body reaches the handler; the response carries the ids.
        resp = await post(infer, "/predictions/echo", "hello")
        assert resp.status_code == 200
        body = resp.json()
        assert body["echo"] == "hello"
        assert resp.headers["content-type"] == "application/json"
        assert resp.headers["x-request-id"] == body["request_id"]
        assert resp.headers["cache-control"].startswith("no-cache")

        # The client's request id is kept.
        headers = {"x-request-id": "trace-42", "content-type": "text/plain"}
        resp = await post(infer, "/predictions/echo", "x", headers=headers)
        assert resp.headers["x-request-id"] == "trace-42"
        assert resp.json()["request_id"] == "trace-42"

        # Query parameters and form fields arrive by name.
        resp = await infer.post("/predictions/echo?topk=3&mode=fast", data={"data": "field-value"})
        assert resp.status_code == 200
        assert resp.json()["echo"] == "field-value"
        assert resp.json()["query"] == {"topk": "3", "mode": "fast"}

        # Versions and extra path segments.
        resp = await post(infer, "/predictions/echo_v2/2.0/extra/segments", "v")
        assert resp.status_code == 200
        assert resp.json()["url_path"] == "extra/segments"
        assert_error(await post(infer, "/predictions/echo_v2/9.9", "v"), 404)

        # Explanations tell the handler; the handler's status is honoured.
        resp = await post(infer, "/explanations/echo", "why")
        assert resp.status_code == 200
        assert resp.json()["explain"] == "True"
        assert (await post(infer, "/predictions/echo", "status 201")).status_code == 201

        # Clients cannot pose as internal protocol requests.
        headers = {"content-type": "text/plain", "x-lantern-protocol": "oip"}
        resp = await post(infer, "/predictions/echo", "plain", headers=headers)
        assert resp.status_code == 200
        assert resp.json()["echo"] == "plain"

    serve(tmp_path, test)


def test_errors_are_json_with_their_status(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        body = assert_error(await post(infer, "/predictions/missing", "x"), 404)
        assert body["type"] == "ModelNotFoundException"
        assert_error(await infer.get("/no/such/route"), 404)
        assert_error(await infer.get("/predictions/echo"), 405)

        headers = {"content-type": "text/plain", "x-request-timeout": "soon"}
        assert_error(await post(infer, "/predictions/echo", "x", headers=headers), 400)

        body = assert_error(await post(infer, "/predictions/no_workers", "x"), 503)
        assert "no worker" in body["message"]

    serve(tmp_path, test)


def test_handler_bug_is_500_with_type_and_request_id_and_worker_survives(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        before = (await post(infer, "/predictions/echo", "ok")).json()["worker"]
        resp = await post(infer, "/predictions/echo", "boom")
        body = assert_error(resp, 500)
        assert body["type"] == "ValueError"
        assert resp.headers["x-request-id"] in body["message"]
        assert "Traceback" not in body["message"]
        after = await post(infer, "/predictions/echo", "ok")
        assert after.status_code == 200
        assert after.json()["worker"] == before

    serve(tmp_path, test)


def test_deadline_gives_504_and_the_worker_is_not_killed(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        worker = (await post(infer, "/predictions/echo", "ok")).json()["worker"]
        headers = {"content-type": "text/plain", "x-request-timeout": "0.3"}
        resp = await post(infer, "/predictions/echo", "sleep 1.5", headers=headers)
        body = assert_error(resp, 504)
        assert resp.headers["x-request-id"] in body["message"]
        after = await post(infer, "/predictions/echo", "ok")
        assert after.status_code == 200 and after.json()["worker"] == worker
        assert not any(w.exit_code is not None for w in lantern.workers.started)

    serve(tmp_path, test)


def test_full_queue_is_429_with_retry_after(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        calls = [
            post(infer, "/predictions/tiny_queue", "sleep 0.5" if i < 4 else "x") for i in range(8)
        ]
        responses = await asyncio.gather(*calls)
        codes = sorted(r.status_code for r in responses)
        assert 429 in codes, codes
        assert set(codes) <= {200, 429}
        rejected = next(r for r in responses if r.status_code == 429)
        assert_error(rejected, 429)
        assert rejected.headers["retry-after"] == "1"
        assert (await post(infer, "/predictions/tiny_queue", "x")).status_code == 200

    serve(tmp_path, test)


def test_concurrent_requests_form_batches_and_answers_reach_their_callers(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        responses = await asyncio.gather(
            *(post(infer, "/predictions/batched", f"sleep 0.05 {i}") for i in range(48))
        )
        bodies = {}
        for i, resp in enumerate(responses):
            assert resp.status_code == 200, resp.text
            bodies[i] = resp.json()
        for i, body in bodies.items():
            assert body["echo"] == f"sleep 0.05 {i}"
        assert max(b["batch"] for b in bodies.values()) > 1
        assert len({b["worker"] for b in bodies.values()}) == 2  # both workers got work

    serve(tmp_path, test)


def test_idle_workers_share_a_burst(tmp_path: Path) -> None:
    """Eight requests on two idle workers with batch 8: both workers run some of them."""

    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        responses = await asyncio.gather(
            *(post(infer, "/predictions/batched", "sleep 0.3") for _ in range(8))
        )
        assert len({r.json()["worker"] for r in responses}) == 2

    serve(tmp_path, test)


def test_gpu_ids_go_round_robin_over_device_ids(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        responses = await asyncio.gather(
            *(post(infer, "/predictions/gpus", "sleep 0.2") for _ in range(4))
        )
        assert {r.json()["gpu_id"] for r in responses} == {3, 5}
        (described,) = (await lantern.management.get("/models/gpus")).json()
        assert all(w["gpu"] for w in described["workers"])

    serve(tmp_path, test)


def test_api_description(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        resp = await infer.request("OPTIONS", "/")
        assert resp.status_code == 200
        spec = resp.json()
        assert spec["openapi"].startswith("3.")
        assert "/predictions/{model_name}" in spec["paths"]
        assert (await infer.get("/api-description")).json() == spec

    serve(tmp_path, test)


GENERATIVE_PATHS = {
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/openai/v1/models",
    "/v2/models/{model_name}/generate",
    "/v2/models/{model_name}/generate_stream",
}


@pytest.mark.parametrize("openai_api", [True, False])
def test_the_api_description_names_the_routes_served(tmp_path: Path, openai_api: bool) -> None:
    """The OpenAI and OIP generate routes when they are on (the console's API page reads this),
    the OIP health routes always; every path it names is answered (not 404 for the route)."""

    async def body() -> None:
        config = test_config(tmp_path, store_of(tmp_path), enable_openai_api=openai_api)
        async with in_process(config) as lantern:
            paths = (await lantern.inference.request("OPTIONS", "/")).json()["paths"]
            assert {"/v2/health/live", "/v2/health/ready", "/v2/models/{model_name}/ready"} <= set(
                paths
            )
            assert (GENERATIVE_PATHS <= set(paths)) is openai_api
            assert not (GENERATIVE_PATHS & set(paths)) or openai_api
            for path, operations in paths.items():
                if "generate" in path or path.startswith(("/v1/", "/openai/")):
                    url = path.replace("{model_name}", "nosuchmodel")
                    for method in operations:
                        resp = await lantern.inference.request(method.upper(), url, json={})
                        # A route that exists answers with its own error, never "no such route".
                        assert resp.status_code != 405, (method, url)
                        assert "nosuchmodel" in resp.text or resp.status_code != 404, (
                            method,
                            url,
                            resp.text,
                        )

    run(body)


async def never_loads(worker: FakeWorker, items: list[BatchItem]) -> list[ItemResult | ServeError]:
    raise AssertionError("a worker that cannot load gets no batch")


def test_ping_turns_unhealthy_when_a_model_fails_to_load(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    handler = tmp_path / "broken.py"
    handler.write_text("def handle(data, context):\n    raise RuntimeError('cannot load')\n")
    build_archive(store, "broken", handler, config={"maxRetryTimeoutInSec": 1})
    echo_archive(store, "fine")
    workers = FakeWorkers({"broken": Behaviour(never_loads, fails_to_load("cannot load"))})

    async def body() -> None:
        config = test_config(tmp_path, store, load_models=["broken.mar", "fine.mar"])
        async with in_process(config, workers) as lantern:
            infer = lantern.inference
            assert (await post(infer, "/predictions/fine", "x")).status_code == 200
            (broken,) = lantern.registry.get("broken").slots
            await until(lambda: broken.gave_up, limit=30)
            resp = await infer.get("/ping")
            assert resp.status_code == 500
            assert resp.json() == {"status": "Unhealthy"}
            # vLLM's /health says the same, its way: an empty 503 (200 when healthy).
            health = await infer.get("/health")
            assert (health.status_code, health.content) == (503, b"")

    run(body)


def test_health_and_version_as_vllm_answers_them(tmp_path: Path) -> None:
    async def test(infer: httpx.AsyncClient, lantern: Lantern) -> None:
        health = await infer.get("/health")
        assert (health.status_code, health.content) == (200, b"")
        version = await infer.get("/version")
        assert version.status_code == 200
        assert version.json() == {"version": lantern.server.state.version}

    serve(tmp_path, test)


def test_ping_is_unhealthy_when_a_startup_model_cannot_be_found(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()

    async def body() -> None:
        config = test_config(tmp_path, store, load_models=["ghost=not-there.mar"])
        async with in_process(config) as lantern:
            assert lantern.server.state.startup_failures == ["ghost=not-there.mar"]
            resp = await lantern.inference.get("/ping")
            assert resp.json() == {"status": "Unhealthy"}

    run(body)
