"""Warm spare workers on a real server: a crashed worker is replaced by a spare interpreter that
already imported torch, the replacement gets its thread share, and spares end with the server."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from tests.support.server import HANDLERS, LanternServer, build_archive, echo_archive, pid_alive
from tests.support.waiting import wait_for

T = TypeVar("T")
CORES = len(os.sched_getaffinity(0))


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def spares_of(server: LanternServer) -> list[int]:
    return [pid for pid in server.child_pids() if "--spare" in cmdline(pid)]


def ready_spares(server: LanternServer) -> list[int]:
    """Spares that imported torch (the pool logs each when ready) and still wait for a spec.

    The first spare starts before any worker has loaded, with nothing preloaded; once the
    worker reports that it imported torch, the pool replaces it with one that has."""
    log = server.log_text("lantern.log")
    return [
        pid
        for pid in spares_of(server)
        if f"Spare worker ready (pid {pid}, preloaded: torch)" in log
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("spares")
    store = root / "store"
    store.mkdir()
    build_archive(store, "t", HANDLERS / "threads_handler.py", config={"minWorkers": 1})
    build_archive(store, "u", HANDLERS / "threads_handler.py", config={"minWorkers": 1})
    running = LanternServer(root, store, ["t=t.mar"], args=["--enable-model-api"]).start()
    yield running
    running.stop()


def test_a_crashed_worker_is_replaced_by_the_warm_spare(server: LanternServer) -> None:
    spare = wait_for(lambda: ready_spares(server), 120, "a spare to be ready")[0]
    (old,) = server.worker_pids("t")
    assert "--spare" not in cmdline(old)  # the first worker started before any spare was ready
    os.kill(old, signal.SIGKILL)
    new = wait_for(lambda: [p for p in server.worker_pids("t") if p != old], 60, "a replacement")
    assert new == [spare]  # the spare became the worker
    resp = httpx.post(f"{server.inference}/predictions/t", content=b"x", timeout=60)
    assert resp.status_code == 200
    # Started with OMP_NUM_THREADS=1 like every spare, it runs on its share of the budget.
    assert resp.json() == {"threads": CORES, "pid": spare}
    assert "started from a warm spare" in server.log_text("lantern.log")
    # ... and the pool starts the next spare.
    wait_for(lambda: [p for p in ready_spares(server) if p != spare], 120, "the next spare")


def test_a_freshly_registered_models_first_crash_is_replaced_by_a_warm_spare(
    server: LanternServer,
) -> None:
    """Its archive says it imports torch: its first worker takes the ready spare, and the first
    crash, right after, takes the next one (waited for while it starts, not a cold start)."""
    wait_for(lambda: ready_spares(server), 120, "a spare to be ready")
    api = server.management
    resp = httpx.post(f"{api}/models?url=u.mar&initial_workers=1&synchronous=true", timeout=180)
    assert resp.status_code == 200, resp.text
    try:
        (first,) = server.worker_pids("u")
        assert "--spare" in cmdline(first)  # registered onto a warm interpreter
        os.kill(first, signal.SIGKILL)
        (new,) = wait_for(lambda: [p for p in server.worker_pids("u") if p != first], 60, "a u")
        assert "--spare" in cmdline(new)
        resp = httpx.post(f"{server.inference}/predictions/u", content=b"x", timeout=60)
        assert resp.status_code == 200 and resp.json()["pid"] == new
    finally:
        httpx.delete(f"{api}/models/u", timeout=60)


def thread_nice_values(pid: int) -> dict[int, int]:
    """Each thread's nice value (field 19 of /proc/PID/task/TID/stat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        out[int(tid)] = int(stat.rsplit(")", 1)[1].split()[16])
    return out


def test_new_workers_import_at_low_priority_and_serve_at_normal_priority(
    server: LanternServer,
) -> None:
    # By now a worker of "t" has reported torch: a cold start preloads it first, at
    # worker_start_nice while requests are in flight, and here, on an idle server, at normal
    # priority (tests/serve/test_start_nice.py has the busy case).
    api = server.management
    resp = httpx.put(f"{api}/models/t?min_worker=3&synchronous=true", timeout=180)
    assert resp.status_code == 200, resp.text
    try:
        pids = server.worker_pids("t")
        assert len(pids) == 3
        for _ in range(6):
            assert httpx.post(f"{server.inference}/predictions/t", content=b"x").status_code == 200
        for pid in pids:
            # Every thread, the main one and any torch started, runs at normal priority: only
            # the import thread (gone now) was lowered.
            assert set(thread_nice_values(pid).values()) == {0}, pid
        log = server.log_text("model_log.log")
        assert "Imported torch at nice 0 in" in log  # a cold start (the spare went to one)
    finally:
        httpx.put(f"{api}/models/t?min_worker=1&synchronous=true", timeout=120)


def test_spares_end_with_the_server(server: LanternServer) -> None:
    spares = wait_for(lambda: spares_of(server), 120, "a spare")
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(60)
    # The server stops its spares on the way out; a spare that outlived it would be a leak.
    wait_for(lambda: not any(pid_alive(p) for p in spares), 10, "the spares to exit")


def torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_a_torch_free_models_replacement_never_takes_a_torch_spare(
    tmp_path: Path,
) -> None:
    """Beside a torch model, the spares import torch; a torch-free model's crashed worker is
    replaced cold, so it stays free of torch (and of torch's ~700 MB for its RSS cap)."""
    store = tmp_path / "store"
    store.mkdir()
    build_archive(store, "t", HANDLERS / "threads_handler.py", config={"minWorkers": 1})
    echo_archive(store, "e", config={"minWorkers": 1})
    with LanternServer(tmp_path, store, ["t=t.mar", "e=e.mar"]) as srv:
        wait_for(lambda: ready_spares(srv), 120, "a spare with torch")
        (old,) = srv.worker_pids("e")
        assert not torch_loaded(old)
        os.kill(old, signal.SIGKILL)
        (new,) = wait_for(lambda: [p for p in srv.worker_pids("e") if p != old], 60, "a new e")
        assert "--spare" not in cmdline(new)
        assert not torch_loaded(new)
        assert ready_spares(srv)  # the spare is still there for a torch model
