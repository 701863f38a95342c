"""The inference API against one real server: what the worker process and the HTTP server show.

Bodies decoded for the handler, several files under one field, the size limit while a body
streams in, cores and affinity per worker process, streamed chunks and large bodies on the wire.
Routes, inputs by name, errors, batching and health are tested in process over fake workers
(`tests/app/test_inference_app.py`).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import HANDLERS, LanternServer, build_archive, echo_archive

MAX_REQUEST = 200_000


@pytest.fixture(scope="module", params=["hypercorn", "uvicorn"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LanternServer]:
    """One server per HTTP server kind: every test using it runs on hypercorn and on uvicorn."""
    work = tmp_path_factory.mktemp(f"inference-{request.param}")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "echo")
    echo_archive(
        store,
        "batched",
        config={"batchSize": 8, "maxBatchDelay": 200, "minWorkers": 2, "maxWorkers": 2},
    )
    echo_archive(store, "pinned", config={"minWorkers": 2, "cpuAffinity": True})
    build_archive(store, "stream", HANDLERS / "stream_handler.py")
    config = work / "config.yaml"
    config.write_text(f"max_request_size: {MAX_REQUEST}\n")
    srv = LanternServer(
        work,
        store,
        ["echo=echo.mar", "batched=batched.mar", "pinned.mar", "stream.mar"],
        args=["--config", str(config)],
        http_server=request.param,
    )
    srv.start()
    yield srv
    srv.stop()


def post(server: LanternServer, path: str, body: bytes | str = b"", **kwargs) -> httpx.Response:
    headers = kwargs.pop("headers", {"content-type": "text/plain"})
    return httpx.post(
        f"{server.inference}{path}", content=body, headers=headers, timeout=30, **kwargs
    )


def assert_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"code", "type", "message"}
    assert body["code"] == status
    assert resp.headers.get("x-request-id")
    return body


def test_put_like_curl_upload_file(server: LanternServer, kitten: bytes) -> None:
    resp = httpx.put(
        f"{server.inference}/predictions/echo",
        content=kitten,
        headers={"content-type": "application/octet-stream"},
    )
    assert resp.status_code == 200
    assert resp.json()["echo"].startswith("\ufffd")  # the JPEG bytes arrived as bytes


def test_several_files_under_one_field_arrive_together(server: LanternServer) -> None:
    files = [
        ("data", ("a.txt", b"first", "text/plain")),
        ("data", ("b.txt", b"second", "text/plain")),
    ]
    resp = httpx.post(f"{server.inference}/predictions/echo", files=files)
    assert resp.status_code == 200
    assert resp.json()["echo"] == ["first", "second"]


def test_json_body_is_decoded_for_the_handler(server: LanternServer) -> None:
    resp = post(
        server,
        "/predictions/echo",
        json.dumps({"a": [1, 2]}),
        headers={"content-type": "application/json"},
    )
    assert resp.json()["echo"] == {"a": [1, 2]}


def test_body_over_max_request_size_is_413(server: LanternServer) -> None:
    body = assert_error(post(server, "/predictions/echo", b"x" * (MAX_REQUEST + 1)), 413)
    assert str(MAX_REQUEST) in body["message"]

    def chunks():  # no Content-Length: the limit holds while streaming too
        for _ in range(MAX_REQUEST // 10_000 + 2):
            yield b"y" * 10_000

    assert_error(post(server, "/predictions/echo", chunks()), 413)
    assert post(server, "/predictions/echo", "still serving").status_code == 200


def test_cores_are_divided_among_workers(server: LanternServer) -> None:
    cores = os.cpu_count() or 1
    with cf.ThreadPoolExecutor(4) as pool:
        bodies = [
            r.json()
            for r in pool.map(lambda i: post(server, "/predictions/batched", "sleep 0.2"), range(4))
        ]
    assert {b["threads"] for b in bodies} == {max(1, cores // 2)}
    with cf.ThreadPoolExecutor(4) as pool:
        pinned = [
            r.json()
            for r in pool.map(lambda i: post(server, "/predictions/pinned", "sleep 0.2"), range(4))
        ]
    by_pid = {b["pid"]: tuple(b["cpus"]) for b in pinned}
    assert len(by_pid) == 2
    if cores >= 2:  # each worker has its own share of the cores
        first, second = by_pid.values()
        assert not set(first) & set(second)


def test_intermediate_responses_stream_as_chunks(server: LanternServer) -> None:
    arrivals = []
    started = time.monotonic()
    with httpx.stream(
        "POST", f"{server.inference}/predictions/stream", content=b"go", timeout=30
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers.get("transfer-encoding") == "chunked"
        assert resp.headers["x-request-id"]
        for chunk in resp.iter_text():
            arrivals.append((time.monotonic() - started, chunk))
    assert "".join(c for _, c in arrivals) == "part0 part1 part2 done"
    # The first part left the server long before the handler finished (3 × 0.3 s of sleeps).
    assert arrivals[0][0] < arrivals[-1][0] - 0.4


def test_a_body_larger_than_the_workers_read_buffer_arrives_whole(server: LanternServer) -> None:
    # 150 KB: past the worker's 64 KB frame buffer, so it is received straight into its own
    # buffer (serve.wire.frames.FrameReader); every byte must arrive in order.
    text = "".join(chr(97 + i * 7 % 26) for i in range(150_000))
    resp = post(server, "/predictions/echo", text)
    assert resp.status_code == 200, resp.text
    assert resp.json()["echo"] == text
