"""Concurrent management calls on a real server with its default event loop (uvloop).

Clients register, unregister, scale and set the default version of one shared model name and of
names of their own, all at once, as operators' scripts do. Afterwards the frontend must be alive
and its registry consistent: every worker ``describe`` lists is a live child of the server, every
other child is the warm spare, the descriptor count is back where it started (within
`FD_TOLERANCE`), and once everything is unregistered no worker is left. On uvloop's
``connect_read_pipe`` (each child pipe's number closed twice) these calls crashed the frontend
(exit 134/139), failed worker starts with EEXIST and leaked descriptors (docs/faults.md).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import LanternServer, echo_archive, pid_alive
from tests.support.waiting import wait_for

# 12 clients x 10 calls, about 20 s on a loaded 2-core machine. Before the fix each run failed
# (a worker start refused with EEXIST, a registry that never settled, 52 descriptors leaked);
# 16 x 12 also aborted the frontend (SIGABRT).
CLIENTS = 12
OPS_PER_CLIENT = 10
SHARED = "shared"
CALL_TIMEOUT = 60  # a synchronous register or scale waits for worker starts on a loaded machine
ARCHIVES = {"1.0": "echo.mar", "2.0": "echo-v2.mar"}
# Descriptors the frontend may hold after the run beyond its count before: connections of the
# checking client and log files opened late. The double close leaked ~3 per worker start.
FD_TOLERANCE = 4
# What a management call may answer while others change the same model: done, accepted, still
# scaling (206), absent (404: unregistered meanwhile), or a conflict (409: registered already,
# being changed); an unregister also 403 (the default version while others remain), a
# set-default also 503 (that version has no ready worker). Anything else, a 500 from a failed
# worker start in particular, is a failure.
EXPECTED = {200, 202, 206, 404, 409}


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    params: dict[str, Any]
    also: tuple[int, ...] = ()  # answers this kind of call may give besides `EXPECTED`

    def expects(self, status: int) -> bool:
        return status in EXPECTED or status in self.also


def plan(client: int, rng: random.Random) -> list[Call]:
    """The calls of one client: on the shared name and on its own, in a seeded random order."""
    calls = []
    params: dict[str, Any]
    for _ in range(OPS_PER_CLIENT):
        name = SHARED if rng.random() < 0.5 else f"own{client}"
        version = rng.choice(list(ARCHIVES))
        sync = rng.choice(["true", "false"])
        kind = rng.choice(["register", "register", "unregister", "scale", "scale", "default"])
        if kind == "register":
            params = {"url": ARCHIVES[version], "model_name": name, "synchronous": sync}
            calls.append(Call("POST", "/models", params | {"initial_workers": 1}))
        elif kind == "unregister":
            calls.append(Call("DELETE", f"/models/{name}/{version}", {}, (403,)))
        elif kind == "scale":
            workers = rng.choice([0, 1, 2])
            params = {"min_worker": workers, "max_worker": 2, "synchronous": sync}
            calls.append(Call("PUT", f"/models/{name}/{version}", params))
        else:
            calls.append(Call("PUT", f"/models/{name}/{version}/set-default", {}, (503,)))
    return calls


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def settled_fd_count(pid: int, bound: int, timeout: float = 30.0) -> int:
    """The process's descriptor count once it is at most ``bound`` (closes of connections and
    pipes lag a little), or what it is after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (count := open_fds(pid)) > bound and time.monotonic() < deadline:
        time.sleep(0.1)
    return count


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LanternServer]:
    monkeypatch.delenv("LANTERN_EVENT_LOOP", raising=False)  # the default: uvloop
    store = tmp_path / "store"
    store.mkdir()
    build = tmp_path / "build"
    build.mkdir()
    echo_archive(store)
    echo_archive(build, version="2.0").rename(store / ARCHIVES["2.0"])
    srv = LanternServer(tmp_path, store, args=["--enable-model-api"])
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


class Registry:
    """What the server's management API says about its models and their workers."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.seen: set[int] = set()  # every worker pid ever described

    def versions(self) -> list[dict[str, Any]]:
        found = []
        for entry in self.client.get("/models", params={"limit": 100}).json()["models"]:
            reply = self.client.get(f"/models/{entry['modelName']}/all")
            if reply.status_code == 200:
                found += reply.json()
        for version in found:
            self.seen.update(w["pid"] for w in version["workers"])
        return found

    def settled(self) -> list[dict[str, Any]] | None:
        """Every version's workers, once each has its minimum and all are READY."""
        versions = self.versions()
        for version in versions:
            workers = version["workers"]
            if len(workers) != version["minWorkers"]:
                return None
            if any(w["status"] != "READY" for w in workers):
                return None
        return versions


def spares_only(server: LanternServer, described: set[int]) -> set[int] | None:
    """The server's children that are not described workers, if they are at most its one warm
    spare (``worker_spares`` defaults to 1): else None."""
    others = set(server.child_pids()) - described
    if len(others) > 1 or any("--spare" not in cmdline(pid) for pid in others):
        return None
    return others


def wait_for_spares_only(server: LanternServer, described: set[int], what: str) -> None:
    try:
        wait_for(lambda: spares_only(server, described) is not None, 60, what)
    except AssertionError:
        others = set(server.child_pids()) - described
        found = {pid: cmdline(pid) or "(a zombie)" for pid in others}
        raise AssertionError(f"{what}: children besides the described workers {found}") from None


def call(client: httpx.Client, op: Call) -> tuple[int, str]:
    reply = client.request(op.method, op.path, params=op.params)
    return reply.status_code, reply.text[:300]


def test_concurrent_register_unregister_scale_and_set_default_leave_a_consistent_server(
    server: LanternServer,
) -> None:
    with httpx.Client(base_url=server.management, timeout=CALL_TIMEOUT) as api:
        registry = Registry(api)
        # A first model's start and removal open what the server opens once (logs, spare).
        assert api.post("/models", params={"url": "echo.mar", "initial_workers": 1}).is_success
        assert api.delete("/models/echo").status_code == 200
        wait_for(lambda: spares_only(server, set()) is not None, 60, "the warm spare alone")
        fds_before = open_fds(server.pid)

        rng = random.Random(27)
        plans = [plan(client, rng) for client in range(CLIENTS)]
        start = threading.Barrier(CLIENTS)

        def run(calls: list[Call]) -> list[tuple[Call, tuple[int, str]]]:
            with httpx.Client(base_url=server.management, timeout=CALL_TIMEOUT) as client:
                start.wait(30)
                return [(op, call(client, op)) for op in calls]

        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = [a for answered in pool.map(run, plans) for a in answered]

        assert server.proc is not None and server.proc.poll() is None, server.console_text()
        unexpected = [(op, answer) for op, answer in answers if not op.expects(answer[0])]
        assert unexpected == []

        # (settled() is [] once every model is gone: wait on its being a list.)
        wait_for(lambda: registry.settled() is not None, 60, "every model at its minimum, READY")
        versions = registry.settled()
        assert versions is not None
        described = {w["pid"] for v in versions for w in v["workers"]}
        assert all(pid_alive(pid) for pid in described)
        assert described <= set(server.child_pids())
        wait_for_spares_only(server, described, "no orphan worker")

        def unregister_all() -> bool:
            """One pass (a default version goes once the others have: 403 until then)."""
            for version in registry.versions():
                name, number = version["modelName"], version["modelVersion"]
                assert api.delete(f"/models/{name}/{number}").status_code in (200, 403, 404)
            return not registry.versions()

        wait_for(unregister_all, 60, "every model unregistered")
        wait_for_spares_only(server, set(), "no worker left")
        fds_after = settled_fd_count(server.pid, fds_before + FD_TOLERANCE)
        assert fds_after <= fds_before + FD_TOLERANCE, f"{fds_after} open, {fds_before} before"
        assert server.ping() == 200
        seen = set(registry.seen)

    assert server.stop() == 0  # SIGTERM: a clean exit, no abort
    assert not [pid for pid in seen if pid_alive(pid)]
