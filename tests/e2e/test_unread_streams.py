"""Clients that never read a streamed answer do not make the frontend hold it (issue 39, item 7).

A handler streams 20 MiB answers (80 parts of 256 KiB, as fast as it can); eight clients ask for
one each and never read a byte. Before, the frontend held every answer whole: 68 -> 239 MB with
eight such clients, and it stayed there while they were connected. Now the parts waiting for a
client are bounded (`serve.core.jobs.STREAM_BUFFER_CAP`): past the bound the request is cancelled
and its parts dropped, so the frontend's RSS (read from /proc) stays within a few MiB a client of
where it was, and comes back to within 10% of it once the clients have gone. A client that reads
gets its whole answer meanwhile.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from serve.core.jobs import STREAM_BUFFER_CAP
from tests.support.server import HANDLERS, LanternServer, build_archive
from tests.support.waiting import wait_for

CLIENTS = 8
ANSWER = 80 * 256 * 1024


def rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("unread")
    store = work / "store"
    store.mkdir()
    config = {"minWorkers": 1, "batchSize": 1}
    build_archive(store, "big", HANDLERS / "big_stream_handler.py", config=config)
    srv = LanternServer(work, store, ["big.mar"], args=["--no-grpc"])
    srv.start()
    yield srv
    srv.stop()


def _read_whole(server: LanternServer) -> int:
    url = f"{server.inference}/predictions/big"
    with httpx.stream("POST", url, content=b"x", timeout=120) as r:
        assert r.status_code == 200
        return sum(len(chunk) for chunk in r.iter_bytes())


def _idle_clients(server: LanternServer, round_: int) -> int:
    """``CLIENTS`` clients that ask for an answer each and read nothing, until the worker has
    written every answer; the frontend's RSS then. They are gone when this returns."""
    host, port = server.inference.removeprefix("http://").split(":")
    idle: list[socket.socket] = []
    try:
        for k in range(CLIENTS):
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # read nothing, hold little
            rid = f"unread-{round_}-{k}"
            sock.sendall(
                b"POST /predictions/big HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"x-request-id: {rid}\r\nContent-Length: 1\r\n\r\nx".encode()
            )
            idle.append(sock)
        # Every answer has been written by the worker (the handler says so when it is done).
        wait_for(
            lambda: server.log_text("model_log.log").count(f"streamed unread-{round_}-") == CLIENTS,
            timeout=120,
            what="the worker to have streamed every answer",
        )
        assert _read_whole(server) == ANSWER  # a reading client beside them is answered
        return rss(server.pid)
    finally:
        for sock in idle:
            sock.close()


def test_clients_that_never_read_do_not_grow_the_frontend(server: LanternServer) -> None:
    assert _read_whole(server) == ANSWER
    start = rss(server.pid)
    bound = CLIENTS * STREAM_BUFFER_CAP  # 32 MiB; before, the answers whole: 160 MiB and more
    first = _idle_clients(server, 0) - start
    # The first round leaves the allocator's pools as such an attack leaves them (what the
    # frontend's malloc keeps); a second one must not add to it, and its memory must come back.
    wait_for(lambda: server.ping() == 200, what="the server")
    before = rss(server.pid)
    second = _idle_clients(server, 1) - start
    print(
        f"frontend RSS {start >> 20} MiB; {first >> 20} and {second >> 20} MiB more with "
        f"{CLIENTS} idle clients; {(before - start) >> 20} MiB more between the rounds"
    )
    assert max(first, second) < bound, f"{first >> 20}, {second >> 20} MiB held"
    assert before - start < bound
    wait_for(lambda: rss(server.pid) < before * 1.1, timeout=60, what="the memory to come back")
    assert server.ping() == 200
