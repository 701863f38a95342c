"""Request heads over ``max_header_size`` (issue 27, item 5): 431 on every HTTP port of both
servers, soon and without reading the rest; gRPC metadata over it is RESOURCE_EXHAUSTED.

A head that arrives whole and one that keeps arriving (a client streaming an endless header) are
both refused; a neighbour's request on the same port is answered meanwhile.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.server import LanternServer, echo_archive

LIMIT = 4096


@pytest.fixture(scope="module", params=["uvicorn", "hypercorn"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp(f"heads-{request.param}")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "echo")
    srv = LanternServer(
        work,
        store,
        ["echo=echo.mar"],
        http_server=request.param,
        env={"LANTERN_MAX_HEADER_SIZE": str(LIMIT)},
    )
    with srv:
        yield srv


def _urls(server: LanternServer) -> dict[str, str]:
    return {
        "inference": f"{server.inference}/ping",
        "management": f"{server.management}/models",
        "metrics": f"{server.metrics}/metrics",
    }


@pytest.mark.parametrize("port", ["inference", "management", "metrics"])
def test_a_head_just_over_the_limit_is_431_and_one_under_is_served(
    server: LanternServer, port: str
) -> None:
    url = _urls(server)[port]
    under = httpx.get(url, headers={"x-pad": "a" * (LIMIT - 400)}, timeout=30)
    assert under.status_code == 200
    over = httpx.get(url, headers={"x-pad": "a" * (LIMIT + 100)}, timeout=30)
    assert over.status_code == 431


def _read_answer(sock: socket.socket) -> bytes:
    answer = b""
    try:
        while more := sock.recv(65536):
            answer += more
    except ConnectionResetError:  # closed with our bytes unread: what came first still counts
        pass
    return answer


@pytest.mark.parametrize("port", ["inference", "management"])
def test_a_head_still_arriving_is_cut_off_and_the_neighbour_answered(
    server: LanternServer, port: str
) -> None:
    url = urlsplit(_urls(server)[port])
    assert url.port is not None
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nhost: 127.0.0.1\r\nx-endless: ")
        for _ in range(LIMIT // 1024 + 1):  # just past the limit, and the head never ends
            sock.sendall(b"b" * 1024)
            # A neighbour on its own connection is answered meanwhile, at once.
            started = time.monotonic()
            assert httpx.get(_urls(server)[port], timeout=30).status_code == 200
            assert time.monotonic() - started < 5
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


def test_grpc_metadata_over_the_limit_is_resource_exhausted(server: LanternServer) -> None:
    with grpc.insecure_channel(server.grpc_inference) as channel:
        # grpc-stubs do not declare the stub attributes its __init__ sets.
        check = health_pb2_grpc.HealthStub(channel).Check  # type: ignore[attr-defined]
        ok = check(health_pb2.HealthCheckRequest(), metadata=(("x-pad", "a" * (LIMIT // 2)),))
        assert ok.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            check(health_pb2.HealthCheckRequest(), metadata=(("x-pad", "a" * (LIMIT + 100)),))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
