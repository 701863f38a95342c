"""Regression tests for the hot-path fixes the benchmark led to (behaviour only, no timing).

* Listening sockets name IPPROTO_TCP and set TCP_NODELAY, so accepted connections never wait on
  Nagle's algorithm (it cost ~40 ms per response on the default event loop).
* Predictions bypass Starlette's router (`serve.http.inference.InferenceApp`); these pin the edge
  cases to what the router answers, and check the access log still sees model and version.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from httpx import Response

from serve.http.servers import bind_socket
from tests.support.server import LanternServer, echo_archive


def test_listening_socket_and_accepted_connections_have_tcp_nodelay() -> None:
    listener = bind_socket("127.0.0.1", 0)
    try:
        # asyncio only sets TCP_NODELAY itself on sockets whose proto is IPPROTO_TCP.
        assert listener.proto == socket.IPPROTO_TCP
        assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        with socket.create_connection(listener.getsockname()[:2], timeout=5):
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.proto == socket.IPPROTO_TCP
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        listener.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("hot_path")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "echo")
    srv = LanternServer(work, store, ["echo=echo.mar"])
    srv.start()
    yield srv
    srv.stop()


def _post(server: LanternServer, path: str, headers: dict[str, str] | None = None) -> Response:
    return httpx.post(
        f"{server.inference}{path}",
        content=b"x",
        headers={"content-type": "text/plain", **(headers or {})},
        timeout=30,
    )


def test_prediction_paths_the_router_would_not_match_answer_as_before(
    server: LanternServer,
) -> None:
    trailing = _post(server, "/predictions/echo/")  # Starlette's redirect_slashes
    assert trailing.status_code == 307
    assert trailing.headers["location"].endswith("/predictions/echo")
    empty = _post(server, "/predictions//echo")
    assert empty.status_code == 404 and empty.json()["code"] == 404
    assert httpx.get(f"{server.inference}/predictions/echo").status_code == 405


def test_version_and_rest_segments_reach_the_handler(server: LanternServer) -> None:
    assert _post(server, "/predictions/echo/1.0/").json()["url_path"] is None  # empty rest
    deep = _post(server, "/explanations/echo/1.0/a/b")
    assert deep.status_code == 200
    assert deep.json()["url_path"] == "a/b" and deep.json()["explain"] == "True"


def test_access_log_names_model_and_version_of_a_prediction(server: LanternServer) -> None:
    rid = _post(server, "/predictions/echo", headers={"x-request-id": "hot-path-1"})
    assert rid.status_code == 200
    deadline = time.monotonic() + 10
    while "request_id=hot-path-1" not in server.log_text("access_log.log"):
        assert time.monotonic() < deadline, server.log_text("access_log.log")[-2000:]
        time.sleep(0.1)
    line = next(
        ln for ln in server.log_text("access_log.log").splitlines() if "request_id=hot-path-1" in ln
    )
    assert '"POST /predictions/echo HTTP/1.1" 200' in line
    assert "model=echo version=1.0" in line


def test_client_leaving_mid_body_is_not_an_error(server: LanternServer) -> None:
    host, port = server.inference.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"POST /predictions/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 1000\r\n\r\nonly part of it"
        )
    time.sleep(0.5)
    assert _post(server, "/predictions/echo").status_code == 200
    assert "Unhandled error" not in server.log_text("lantern.log")
