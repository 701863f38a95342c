"""The worker's side of bad input and failures, in process: the real ``run_batch`` and loader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from archiver import open_archive
from serve.wire.frames import Frame, MsgType
from serve.wire.messages import BatchResult, ErrorItem, ResultItem, WorkerSpec
from serve.worker.main import client_errors, load, load_failure, run_batch
from tests.support.server import echo_archive

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    tmp = tmp_path_factory.mktemp("worker-errors")
    store = tmp / "store"
    store.mkdir()
    archive = open_archive(echo_archive(store), tmp / "model")
    spec = WorkerSpec("echo", "1.0", str(archive.model_dir), archive.manifest, batch_size=4)
    return load(spec)


def batch(*bodies: tuple[bytes, str]) -> Frame:
    requests = [
        {"id": f"r{i}", "headers": {}, "params": [["body", ct]]} for i, (_, ct) in enumerate(bodies)
    ]
    return Frame(MsgType.PREDICT, 3, {"requests": requests}, tuple(b for b, _ in bodies))


def test_too_deep_json_fails_its_request_alone(echo: tuple[Any, Any]) -> None:
    service, context = echo
    frame = batch(
        (b'{"a": 1}', "application/json"),
        (DEEP, "application/json"),
        (b"plain", "text/plain"),
    )
    result = run_batch(service, context, frame, True)
    items = result.meta["items"]
    assert len(items) == len(result.payloads) == 3
    assert items[1]["error"]["code"] == 400
    assert "nested too deeply" in items[1]["error"]["message"]
    assert items[1]["error"]["request_id"] == "r1"
    first, third = (json.loads(result.payloads[i]) for i in (0, 2))
    assert first["echo"] == {"a": 1} and third["echo"] == "plain"
    assert first["batch"] == third["batch"] == 2  # the others ran together, without it
    assert first["request_id"] == "r0" and third["request_id"] == "r2"


def test_error_items_are_cut_to_one_line_without_paths() -> None:
    message = 'Traceback (most recent call last):\n  File "/a/b.py", line 1\nOSError: /srv/x/y.bin'
    result = BatchResult([ErrorItem(500, "OSError", message), ResultItem(200, "x", {}, b"ok")])
    items = client_errors(result).items
    assert items[0] == ErrorItem(500, "OSError", "OSError: y.bin")
    assert items[1] == ResultItem(200, "x", {}, b"ok")


def test_load_failure_names_the_handler_not_the_paths(tmp_path: Path) -> None:
    spec = WorkerSpec("m", "1.0", str(tmp_path), {"model": {"handler": "custom_handler.py"}})
    exc = ImportError("cannot load /srv/build/secret/libnative.so:\nundefined symbol")
    failure = load_failure(spec, exc)
    assert failure.type == "ImportError"
    assert "custom_handler.py" in failure.message
    assert "libnative.so" in failure.message and "/srv/build" not in failure.message
    assert "\n" not in failure.message


def test_the_handler_context_has_the_servers_version(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    archive = open_archive(echo_archive(store), tmp_path / "model")
    spec = WorkerSpec(
        "echo", "1.0", str(archive.model_dir), archive.manifest, server_version="9.8.7"
    )
    _, context = load(spec)
    assert context.system_properties["server_version"] == "9.8.7"
