"""The inference API against one real server: inputs, outputs, errors, batching, admission."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

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
    echo_archive(store, "echo_v2", version="2.0")
    echo_archive(
        store,
        "batched",
        config={"batchSize": 8, "maxBatchDelay": 200, "minWorkers": 2, "maxWorkers": 2},
    )
    echo_archive(store, "pinned", config={"minWorkers": 2, "cpuAffinity": True})
    echo_archive(store, "pinned", config={"minWorkers": 2, "cpuAffinity": True})
    echo_archive(store, "gpus", config={"minWorkers": 2, "deviceIds": [3, 5]})
    build_archive(store, "stream", HANDLERS / "stream_handler.py")
    echo_archive(store, "tiny_queue", config={"jobQueueSize": 2, "minWorkers": 1})
    echo_archive(store, "no_workers", config={"minWorkers": 0})
    config = work / "config.yaml"
    config.write_text(f"max_request_size: {MAX_REQUEST}\n")
    srv = LanternServer(
        work,
        store,
        [
            "echo=echo.mar",
            "echo_v2.mar",
            "batched=batched.mar",
            "tiny_queue=tiny_queue.mar",
            "pinned.mar",
            "stream.mar",
            "gpus.mar",
            "no_workers=no_workers.mar",
        ],
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


def test_ping_is_healthy_with_every_model_loaded(server: LanternServer) -> None:
    resp = httpx.get(f"{server.inference}/ping")
    assert resp.status_code == 200
    assert resp.json() == {"status": "Healthy"}


def test_raw_body_reaches_handler_and_response_carries_ids(server: LanternServer) -> None:
    resp = post(server, "/predictions/echo", "hello")
    assert resp.status_code == 200
    body = resp.json()
    assert body["echo"] == "hello"
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["x-request-id"] == body["request_id"]
    assert resp.headers["cache-control"].startswith("no-cache")


def test_put_like_curl_upload_file(server: LanternServer, kitten: bytes) -> None:
    resp = httpx.put(
        f"{server.inference}/predictions/echo",
        content=kitten,
        headers={"content-type": "application/octet-stream"},
    )
    assert resp.status_code == 200
    assert resp.json()["echo"].startswith("\ufffd")  # the JPEG bytes arrived as bytes


def test_client_request_id_is_kept(server: LanternServer) -> None:
    resp = post(
        server,
        "/predictions/echo",
        "x",
        headers={"x-request-id": "trace-42", "content-type": "text/plain"},
    )
    assert resp.headers["x-request-id"] == "trace-42"
    assert resp.json()["request_id"] == "trace-42"


def test_query_parameters_and_form_fields_arrive_by_name(server: LanternServer) -> None:
    resp = httpx.post(
        f"{server.inference}/predictions/echo?topk=3&mode=fast", data={"data": "field-value"}
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["echo"] == "field-value"
    assert body["query"] == {"topk": "3", "mode": "fast"}


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


def test_versions_and_extra_path_segments(server: LanternServer) -> None:
    resp = post(server, "/predictions/echo_v2/2.0/extra/segments", "v")
    assert resp.status_code == 200
    assert resp.json()["url_path"] == "extra/segments"
    assert_error(post(server, "/predictions/echo_v2/9.9", "v"), 404)


def test_explanations_tell_the_handler(server: LanternServer) -> None:
    resp = post(server, "/explanations/echo", "why")
    assert resp.status_code == 200
    assert resp.json()["explain"] == "True"


def test_handler_status_is_honoured(server: LanternServer) -> None:
    resp = post(server, "/predictions/echo", "status 201")
    assert resp.status_code == 201


def test_unknown_model_and_route_are_404_json(server: LanternServer) -> None:
    body = assert_error(post(server, "/predictions/missing", "x"), 404)
    assert body["type"] == "ModelNotFoundException"
    assert_error(httpx.get(f"{server.inference}/no/such/route"), 404)
    assert_error(httpx.get(f"{server.inference}/predictions/echo"), 405)


def test_body_over_max_request_size_is_413(server: LanternServer) -> None:
    body = assert_error(post(server, "/predictions/echo", b"x" * (MAX_REQUEST + 1)), 413)
    assert str(MAX_REQUEST) in body["message"]

    def chunks():  # no Content-Length: the limit holds while streaming too
        for _ in range(MAX_REQUEST // 10_000 + 2):
            yield b"y" * 10_000

    assert_error(post(server, "/predictions/echo", chunks()), 413)
    assert post(server, "/predictions/echo", "still serving").status_code == 200


def test_handler_bug_is_500_with_type_and_request_id_and_worker_survives(
    server: LanternServer,
) -> None:
    before = post(server, "/predictions/echo", "ok").json()["pid"]
    resp = post(server, "/predictions/echo", "boom")
    body = assert_error(resp, 500)
    assert body["type"] == "ValueError"
    assert resp.headers["x-request-id"] in body["message"]
    assert "Traceback" not in body["message"]
    after = post(server, "/predictions/echo", "ok")
    assert after.status_code == 200
    assert after.json()["pid"] == before


def test_deadline_gives_504_and_the_worker_is_not_killed(server: LanternServer) -> None:
    pid = post(server, "/predictions/echo", "ok").json()["pid"]
    resp = post(
        server,
        "/predictions/echo",
        "sleep 1.5",
        headers={"content-type": "text/plain", "x-request-timeout": "0.3"},
    )
    body = assert_error(resp, 504)
    assert resp.headers["x-request-id"] in body["message"]
    after = post(server, "/predictions/echo", "ok")
    assert after.status_code == 200 and after.json()["pid"] == pid


def test_invalid_timeout_header_is_400(server: LanternServer) -> None:
    resp = post(
        server,
        "/predictions/echo",
        "x",
        headers={"content-type": "text/plain", "x-request-timeout": "soon"},
    )
    assert_error(resp, 400)


def test_model_without_workers_is_503(server: LanternServer) -> None:
    body = assert_error(post(server, "/predictions/no_workers", "x"), 503)
    assert "no worker" in body["message"]


def test_full_queue_is_429_with_retry_after(server: LanternServer) -> None:
    def call(i: int) -> httpx.Response:
        return post(server, "/predictions/tiny_queue", "sleep 0.5" if i < 4 else "x")

    with cf.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(call, range(8)))
    codes = sorted(r.status_code for r in responses)
    assert 429 in codes, codes
    assert set(codes) <= {200, 429}
    rejected = next(r for r in responses if r.status_code == 429)
    assert_error(rejected, 429)
    assert rejected.headers["retry-after"] == "1"
    assert post(server, "/predictions/tiny_queue", "x").status_code == 200


def test_concurrent_requests_form_batches_and_answers_reach_their_callers(
    server: LanternServer,
) -> None:
    def call(i: int) -> tuple[int, httpx.Response]:
        return i, post(server, "/predictions/batched", f"sleep 0.05 #{i}".replace("#", ""))

    bodies = {}
    with cf.ThreadPoolExecutor(24) as pool:
        for i, resp in pool.map(call, range(48)):
            assert resp.status_code == 200, resp.text
            bodies[i] = resp.json()
    for i, body in bodies.items():
        assert body["echo"] == f"sleep 0.05 {i}"
    assert max(b["batch"] for b in bodies.values()) > 1
    assert len({b["pid"] for b in bodies.values()}) == 2  # both workers got work


def test_idle_workers_share_a_burst(server: LanternServer) -> None:
    """Eight requests on two idle workers with batch 8: both workers run some of them."""
    with cf.ThreadPoolExecutor(8) as pool:
        responses = list(
            pool.map(lambda i: post(server, "/predictions/batched", "sleep 0.3"), range(8))
        )
    pids = {r.json()["pid"] for r in responses}
    assert len(pids) == 2


def test_api_description(server: LanternServer) -> None:
    resp = httpx.request("OPTIONS", f"{server.inference}/")
    assert resp.status_code == 200
    spec = resp.json()
    assert spec["openapi"].startswith("3.")
    assert "/predictions/{model_name}" in spec["paths"]
    assert httpx.get(f"{server.inference}/api-description").json() == spec


def test_ping_turns_unhealthy_when_a_model_fails_to_load(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    handler = tmp_path / "broken.py"
    handler.write_text("def handle(data, context):\n    raise RuntimeError('cannot load')\n")
    from tests.support.server import build_archive

    build_archive(store, "broken", handler, config={"maxRetryTimeoutInSec": 1})
    echo_archive(store, "fine")
    srv = LanternServer(tmp_path, store, ["broken.mar", "fine.mar"])
    srv.start(healthy=False)
    try:
        deadline = time.monotonic() + 30
        while post(srv, "/predictions/fine", "x").status_code != 200:  # until "fine" is in
            assert time.monotonic() < deadline, "the good model never served"
            time.sleep(0.1)
        while "cannot load" not in srv.log_text("model_log.log"):
            assert time.monotonic() < deadline, "the load failure was not logged"
            time.sleep(0.1)
        resp = httpx.get(f"{srv.inference}/ping")
        assert resp.status_code == 500
        assert resp.json() == {"status": "Unhealthy"}
    finally:
        srv.stop()


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


def test_ping_is_unhealthy_when_a_startup_model_cannot_be_found(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    srv = LanternServer(tmp_path, store, ["ghost=not-there.mar"])
    srv.start(healthy=False)
    try:
        deadline = time.monotonic() + 20
        while "not-there.mar" not in srv.log_text("lantern.log"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert httpx.get(f"{srv.inference}/ping").json() == {"status": "Unhealthy"}
    finally:
        srv.stop()


def test_clients_cannot_pose_as_internal_protocol_requests(server: LanternServer) -> None:
    resp = post(
        server,
        "/predictions/echo",
        "plain",
        headers={"content-type": "text/plain", "x-lantern-protocol": "oip"},
    )
    assert resp.status_code == 200
    assert resp.json()["echo"] == "plain"


def test_gpu_ids_go_round_robin_over_device_ids(server: LanternServer) -> None:
    with cf.ThreadPoolExecutor(4) as pool:
        bodies = [
            r.json()
            for r in pool.map(lambda i: post(server, "/predictions/gpus", "sleep 0.2"), range(4))
        ]
    assert {b["gpu_id"] for b in bodies} == {3, 5}
    workers = server.describe("gpus")[0]["workers"]
    assert all(w["gpu"] for w in workers)
    if not Path("/dev/nvidia0").exists():  # on a CPU host a worker gets no GPU
        assert post(server, "/predictions/echo", "x").json()["gpu_id"] is None


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
