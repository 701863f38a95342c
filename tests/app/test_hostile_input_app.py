"""Bad input and handler failures (issue 12), in process: what a client may see, 4xx never 5xx.

The handlers are the real ones, run in this process (`tests.support.inline_workers`): ``echo``
(torch-free), ``faulty`` (TorchScript and path-laden failures) and ``count`` (an Open Inference
Protocol model), with ``max_request_elements`` lowered to 1,500,000.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import HANDLERS, build_archive, echo_archive

# The worker process sends warnings to the model log; here faulty_handler's would reach pytest.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")

DEEP = "[" * 100_000 + "]" * 100_000
MAX_ELEMENTS = 1_500_000


def serve(root: Path, test: Callable[[Lantern], Awaitable[None]]) -> None:
    store = root / "store"
    store.mkdir()
    echo_archive(store, "echo", config={"minWorkers": 1})
    build_archive(store, "faulty", HANDLERS / "faulty_handler.py", config={"minWorkers": 1})
    build_archive(store, "count", HANDLERS / "count_handler.py", config={"minWorkers": 1})
    build_archive(store, "broken", HANDLERS / "broken_import_handler.py")
    (store / "corrupt.mar").write_bytes(b"this is not a zip archive")

    async def body() -> None:
        config = test_config(
            root,
            store,
            enable_model_api=True,
            max_request_elements=MAX_ELEMENTS,
            load_models=["echo.mar", "faulty.mar", "count.mar"],
        )
        async with in_process(config, InlineWorkers()) as lantern:
            await test(lantern)

    run(body)


def no_internals(text: str, *forbidden: str | Path) -> None:
    assert "Traceback" not in text
    assert 'File "' not in text
    for item in forbidden:
        assert str(item) not in text, text


# ----- 5. error bodies ------------------------------------------------------------------------


def test_a_torchscript_error_answers_type_one_line_and_request_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def test(lantern: Lantern) -> None:
        caplog.clear()
        resp = await lantern.inference.post("/predictions/faulty", content=b"script")
        assert resp.status_code == 500
        body = resp.json()
        rid = resp.headers["x-request-id"]
        assert set(body) == {"code", "type", "message"}
        assert body["type"]  # the exception's type name
        assert "\n" not in body["message"]
        assert "input rejected by the scripted check" in body["message"]
        assert rid in body["message"]
        no_internals(resp.text, "/tmp", "/work", str(tmp_path))
        # The traceback is in the model log, once.
        assert caplog.text.count(f"request(s) {rid}") == 1
        assert "Traceback" in caplog.text

    serve(tmp_path, test)


def test_a_path_in_a_handler_error_does_not_reach_the_client(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        resp = await lantern.inference.post("/predictions/faulty", content=b"path")
        assert resp.status_code == 500
        body = resp.json()
        assert body["type"] == "FileNotFoundError"
        assert "weights.bin is missing" in body["message"]
        assert resp.headers["x-request-id"] in body["message"]
        no_internals(resp.text, "/srv/build", "secret-project")

    serve(tmp_path, test)


def test_management_errors_hide_store_paths_and_import_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    async def test(lantern: Lantern) -> None:
        api = lantern.management
        store = Path(lantern.server.config.model_store or "")
        resp = await api.post("/models", params={"url": "corrupt.mar"})
        assert resp.status_code == 400
        assert "corrupt.mar" in resp.json()["message"]
        no_internals(resp.text, store, store.parent)

        params = {"url": "broken.mar", "initial_workers": "1", "synchronous": "true"}
        resp = await api.post("/models", params=params)
        assert resp.status_code >= 400
        message = resp.json()["message"]
        assert "broken" in message and "broken_import_handler" in message  # archive and handler
        assert "\n" not in message
        no_internals(resp.text, "/srv/build", "secret-project", store)
        assert "secret-project/libnative.so" in caplog.text  # the details: in the log

    serve(tmp_path, test)


# ----- 6. JSON nested 100,000 deep ------------------------------------------------------------


@pytest.mark.parametrize(
    "port,path",
    [
        ("inference", "/predictions/echo"),
        ("inference", "/v2/models/count/infer"),
        ("inference", "/v1/models/echo:predict"),
        ("management", "/models"),
    ],
)
def test_json_nested_100000_deep_is_a_400(tmp_path: Path, port: str, path: str) -> None:
    async def test(lantern: Lantern) -> None:
        client = getattr(lantern, port)
        headers = {"content-type": "application/json"}
        resp = await client.post(path, content=DEEP, headers=headers)
        assert resp.status_code == 400, resp.text
        assert "deep" in resp.text
        # The worker survived: the model still answers.
        ok = await lantern.inference.post("/predictions/echo", content=b"ok")
        assert ok.status_code == 200

    serve(tmp_path, test)


# ----- 4. large JSON tensor bodies ------------------------------------------------------------


def test_too_many_elements_is_a_413_before_decoding(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        infer = lantern.inference
        shape = [MAX_ELEMENTS + 1]
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": []}]}
        resp = await infer.post("/v2/models/count/infer", json=body)
        assert resp.status_code == 413
        assert "max_request_elements" in resp.json()["error"]
        ok = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}
        resp = await infer.post("/v2/models/count/infer", json=ok)
        assert resp.status_code == 200
        assert resp.json()["outputs"][0]["data"] == [3]

    serve(tmp_path, test)


def test_too_many_kserve_v1_values_is_a_413(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        infer = lantern.inference
        body = json.dumps({"instances": [0] * (MAX_ELEMENTS + 1)})
        resp = await infer.post("/v1/models/echo:predict", content=body)
        assert resp.status_code == 413
        assert "max_request_elements" in resp.json()["error"]
        resp = await infer.post("/v1/models/echo:predict", json={"instances": [1, 2]})
        assert resp.status_code == 200

    serve(tmp_path, test)
