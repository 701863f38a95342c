"""Large request bodies through the workers' shared-memory arenas on a real server: 1 MiB and
8 MiB bodies arrive intact (several in one batch), a body bigger than the arena goes inline, a
warm spare that replaces a killed worker gets an arena, and the dead worker's arena leaves no
descriptor or mapping behind in the frontend; with the arena off every body goes inline."""

from __future__ import annotations

import hashlib
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.support.arena import arena_fds, arena_mappings, fd_count
from tests.support.server import HANDLERS, LanternServer, build_archive
from tests.support.waiting import wait_for

T = TypeVar("T")
MiB = 1 << 20
ARENA_MB = 20
CONFIG = {"minWorkers": 1, "batchSize": 3}


def body(size: int, seed: int) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1))[:size]


def post(server: LanternServer, data: bytes) -> httpx.Response:
    return httpx.post(
        f"{server.inference}/predictions/digest",
        content=data,
        headers={"content-type": "application/octet-stream"},
        timeout=120,
    )


def post_batch(server: LanternServer, bodies: list[bytes], gate: Path) -> list[httpx.Response]:
    """POST ``bodies`` so that they run as one batch: queued behind a request that holds the
    (one) worker until they are all waiting. The responses, in order."""
    with ThreadPoolExecutor(len(bodies) + 1) as pool:
        holder = pool.submit(post, server, f"wait:{gate}\n".encode())
        wait_for(Path(f"{gate}.started").exists, 60, "the worker to hold")
        posted = [pool.submit(post, server, b) for b in bodies]

        def queued() -> bool:
            status = server.describe("digest")[0]["jobQueueStatus"]
            return status["pendingRequests"] == len(bodies)

        wait_for(queued, 60, f"{len(bodies)} queued requests")
        Path(f"{gate}.release").touch()
        assert holder.result(60).status_code == 200
        return [f.result(120) for f in posted]


def check_intact(responses: list[httpx.Response], bodies: list[bytes]) -> list[dict[str, Any]]:
    assert [r.status_code for r in responses] == [200] * len(bodies), [r.text for r in responses]
    got = [r.json() for r in responses]
    assert [(g["n"], g["sha256"], g["type"]) for g in got] == [
        (len(b), hashlib.sha256(b).hexdigest(), "bytearray") for b in bodies
    ]
    return got


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def torch_spares(server: LanternServer) -> list[int]:
    """Spares ready with torch imported (what replaces a torch model's worker)."""
    log = server.log_text("lantern.log")
    return [
        pid
        for pid in server.child_pids()
        if "--spare" in cmdline(pid) and f"Spare worker ready (pid {pid}, preloaded: torch)" in log
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("shm")
    store = root / "store"
    store.mkdir()
    # The handler imports torch, so that a crashed worker's replacement is a warm spare.
    config = {**CONFIG, "digest": {"torch": True}}
    build_archive(store, "digest", HANDLERS / "digest_handler.py", config=config)
    env = {"LANTERN_WORKER_SHM_ARENA_MB": str(ARENA_MB), "LANTERN_MAX_REQUEST_SIZE": str(32 * MiB)}
    running = LanternServer(root, store, ["digest=digest.mar"], env=env).start()
    yield running
    running.stop()


def test_1_and_8_mib_bodies_in_one_batch_arrive_intact_through_the_arena(
    server: LanternServer, tmp_path: Path
) -> None:
    bodies = [body(MiB, 1), body(8 * MiB, 2), body(8 * MiB, 3)]
    got = check_intact(post_batch(server, bodies, tmp_path / "gate"), bodies)
    assert [g["batch"] for g in got] == [3, 3, 3]
    # The frontend wrote the 17 MiB into the arena; the worker maps it read-only, and dropped
    # the pages from its own resident set once it had copied the bodies out.
    ((perms, resident),) = arena_mappings(server.pid)
    assert perms == "rw-s" and resident >= 17 * 1024
    assert [g["arena"] for g in got] == [{"perms": "r--s", "rss_kb": 0}] * 3


def test_a_body_bigger_than_the_arena_goes_inline(server: LanternServer, tmp_path: Path) -> None:
    bodies = [body((ARENA_MB + 4) * MiB, 4), body(MiB, 5), body(8 * MiB, 6)]
    got = check_intact(post_batch(server, bodies, tmp_path / "gate"), bodies)
    assert [g["batch"] for g in got] == [3, 3, 3]


def test_a_killed_workers_arena_is_gone_and_its_warm_replacement_gets_one(
    server: LanternServer, tmp_path: Path
) -> None:
    spare = wait_for(lambda: torch_spares(server), 180, "a spare with torch")[0]
    (old,) = server.worker_pids("digest")
    frontend = server.pid
    before = fd_count(frontend)
    # Its one arena descriptor: the frontend's mapping keeps one (Python's mmap holds a dup).
    assert arena_fds(frontend) == 1
    gate = tmp_path / "held"
    with ThreadPoolExecutor(1) as pool:  # an 8 MiB body, held in the handler
        running = pool.submit(post, server, f"wait:{gate}\n".encode() + body(8 * MiB, 7))
        wait_for(Path(f"{gate}.started").exists, 60, "the handler to hold the body")
        os.kill(old, signal.SIGKILL)
        # One worker: no other to retry on, so it fails (the next requests succeed).
        assert running.result(60).status_code >= 500
    new = wait_for(lambda: [p for p in server.worker_pids("digest") if p != old], 60, "a new one")
    assert new == [spare]
    bodies = [body(8 * MiB, 10), body(MiB, 11), body(8 * MiB, 12)]
    got = check_intact(post_batch(server, bodies, tmp_path / "gate"), bodies)
    assert [g["batch"] for g in got] == [3, 3, 3]
    assert {g["pid"] for g in got} == {spare}
    assert got[0]["arena"] == {"perms": "r--s", "rss_kb": 0}
    # The dead worker's arena is unmapped: one mapping and one descriptor, the new worker's,
    # which holds the 17 MiB just placed.
    ((_, resident),) = arena_mappings(frontend)
    assert resident >= 17 * 1024
    assert arena_fds(frontend) == 1
    # Once the pool has its next spare (in place of the one used), nothing else is left open.
    wait_for(lambda: [p for p in torch_spares(server) if p != spare], 180, "the next spare")
    wait_for(lambda: fd_count(frontend) <= before, 30, f"at most {before} descriptors")


def test_with_the_arena_off_every_body_goes_inline(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    build_archive(store, "digest", HANDLERS / "digest_handler.py", config=CONFIG)
    env = {"LANTERN_WORKER_SHM_ARENA_MB": "0", "LANTERN_MAX_REQUEST_SIZE": str(32 * MiB)}
    with LanternServer(tmp_path, store, ["digest=digest.mar"], env=env) as off:
        bodies = [body(MiB, 1), body(8 * MiB, 2), body(8 * MiB, 3)]
        got = check_intact(post_batch(off, bodies, tmp_path / "gate"), bodies)
        assert [g["arena"] for g in got] == [None] * 3
        assert arena_mappings(off.pid) == [] and arena_fds(off.pid) == 0
