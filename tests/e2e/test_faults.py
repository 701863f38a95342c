"""Every request gets an answer when workers crash or hang, and `serve stop` drains cleanly."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import LanternServer, echo_archive, pid_alive
from tests.support.waiting import wait_for_workers


def post(base: str, path: str, body: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"{base}{path}", content=body, headers={"content-type": "text/plain"}, timeout=timeout
    )


def is_json_error(resp: httpx.Response) -> bool:
    body = resp.json()
    return set(body) == {"code", "type", "message"} and body["code"] == resp.status_code


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("faults")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "pair", config={"minWorkers": 2, "batchSize": 4, "maxBatchDelay": 20})
    echo_archive(store, "hang", config={"minWorkers": 1, "responseTimeout": 1, "hardTimeout": 2})
    srv = LanternServer(work, store, ["pair.mar", "hang.mar"])
    srv.start()
    yield srv
    srv.stop()


def test_sigkill_of_a_worker_under_load_loses_no_request(server: LanternServer) -> None:
    victim, survivor = wait_for_workers(server, "pair", 2)
    results: list[httpx.Response] = []

    def call(i: int) -> httpx.Response:
        return post(server.inference, "/predictions/pair", f"sleep 0.02 {i}")

    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(call, i) for i in range(160)]
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        for future in futures:
            results.append(future.result(timeout=60))  # no hang, no connection error
    assert len(results) == 160
    for resp in results:
        assert resp.status_code == 200 or is_json_error(resp), resp.text
    assert sum(r.status_code == 200 for r in results) >= 150
    new_pids = wait_for_workers(server, "pair", 2)
    assert victim not in new_pids and survivor in new_pids
    answered_by = {
        post(server.inference, "/predictions/pair", "sleep 0.2").json()["pid"] for _ in range(1)
    }
    assert answered_by <= set(new_pids)


def test_a_request_that_kills_its_worker_gets_a_json_500(server: LanternServer) -> None:
    wait_for_workers(server, "pair", 2)
    resp = post(server.inference, "/predictions/pair", "crash")
    assert resp.status_code == 500
    assert is_json_error(resp)
    assert resp.json()["type"] == "WorkerDied"
    wait_for_workers(server, "pair", 2)
    assert post(server.inference, "/predictions/pair", "fine").status_code == 200


def test_a_hung_worker_is_killed_past_the_hard_limit_and_restarted(
    server: LanternServer,
) -> None:
    (pid,) = wait_for_workers(server, "hang", 1)
    resp = post(server.inference, "/predictions/hang", "sleep 30")
    assert resp.status_code == 504 and is_json_error(resp)
    deadline = time.monotonic() + 20
    while pid_alive(pid):
        assert time.monotonic() < deadline, "the hung worker was not killed"
        time.sleep(0.1)
    (new_pid,) = wait_for_workers(server, "hang", 1)
    assert new_pid != pid
    assert post(server.inference, "/predictions/hang", "back").json()["echo"] == "back"


def test_serve_stop_finishes_in_flight_requests_then_leaves_no_process(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store, "slow", config={"minWorkers": 2})
    state = tmp_path / "state.json"
    srv = LanternServer(tmp_path, store, ["slow.mar"], args=[])
    srv.state_file = state
    srv.start()
    workers = srv.worker_pids("slow")
    assert len(workers) == 2
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def call() -> None:
        resp = post(srv.inference, "/predictions/slow", "sleep 1.0")
        with lock:
            results.append(resp)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.4)  # the requests are on the workers (and one batch queued)
    stop = subprocess.run(
        [sys.executable, "-m", "serve.cli", "stop", "--pid-file", str(state)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert stop.returncode == 0, stop.stderr
    for t in threads:
        t.join(30)
    assert [r.status_code for r in results] == [200] * 4
    assert not pid_alive(srv.pid)
    for pid in workers:
        assert not pid_alive(pid)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.inference}/ping", timeout=2)
    srv.stop()


def test_workers_do_not_outlive_a_killed_frontend(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store, "orphan", config={"minWorkers": 2})
    srv = LanternServer(tmp_path, store, ["orphan.mar"])
    srv.start()
    workers = srv.worker_pids("orphan")
    assert len(workers) == 2

    def busy() -> None:  # one worker is mid-batch when its frontend dies
        try:
            post(srv.inference, "/predictions/orphan", "sleep 30", timeout=15)
        except httpx.HTTPError:
            pass

    caller = threading.Thread(target=busy)
    caller.start()
    time.sleep(0.5)
    os.kill(srv.pid, signal.SIGKILL)
    caller.join(20)
    assert srv.proc is not None
    srv.proc.wait(10)
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "workers outlived their frontend"
        time.sleep(0.1)
    srv.stop()
