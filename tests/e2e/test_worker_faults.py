"""Worker faults against a real server: long model names, a worker SIGKILLed under load, and a
worker recycled for passing its memory cap. Each of these failed on the main before issue 12."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import HANDLERS, LanternServer, build_archive, echo_archive
from tests.support.waiting import wait_for_workers

LEAK_CAP_MB = 100


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("worker-faults")
    store = work / "store"
    store.mkdir()
    build_archive(
        store,
        "leaky",
        HANDLERS / "leak_handler.py",
        config={"minWorkers": 1, "workerMaxRssMb": LEAK_CAP_MB},
    )
    srv = LanternServer(work, store, ["leaky.mar"], args=["--enable-model-api"])
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module", params=["auto", "asyncio"])
def duo_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LanternServer]:
    """Two workers; on uvloop (the default when installed) and on asyncio's own loop, whose
    child watcher reports a worker's exit later (a wider window for the old bug)."""
    work = tmp_path_factory.mktemp(f"duo-{request.param}")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "duo", config={"minWorkers": 2, "batchSize": 4, "maxBatchDelay": 20})
    srv = LanternServer(work, store, ["duo.mar"], env={"LANTERN_EVENT_LOOP": request.param})
    srv.start()
    yield srv
    srv.stop()


def metric(server: LanternServer, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.metrics}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


# ----- defect 1: a long model name -------------------------------------------------------------


@pytest.mark.parametrize("length", [66, 80, 120, 200])
def test_a_long_model_name_loads_serves_and_keeps_the_server_healthy(
    server: LanternServer, tmp_path: Path, length: int
) -> None:
    name = ("m" * length)[:length]
    echo_archive(server.model_store, name)
    try:
        resp = httpx.post(
            f"{server.management}/models",
            params={"url": f"{name}.mar", "initial_workers": 1, "synchronous": "true"},
            timeout=120,
        )
        assert resp.status_code == 200, resp.text
        (described,) = server.describe(name)
        (worker,) = described["workers"]
        assert worker["status"] == "READY" and worker["pid"] > 0
        assert server.ping() == 200
        answer = httpx.post(f"{server.inference}/predictions/{name}", content=b"hi", timeout=30)
        assert answer.status_code == 200 and answer.json()["echo"] == "hi"
    finally:
        httpx.delete(f"{server.management}/models/{name}", timeout=60)
        (server.model_store / f"{name}.mar").unlink(missing_ok=True)
    assert server.ping() == 200


# ----- defect 2: a worker SIGKILLed under load -------------------------------------------------


@pytest.mark.parametrize("round_", [1, 2])
def test_sigkill_of_one_of_two_workers_under_load_fails_no_request(
    duo_server: LanternServer, round_: int
) -> None:
    server = duo_server
    victim, survivor = wait_for_workers(server, "duo", 2)
    done = threading.Semaphore(0)
    statuses: list[int] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        resp = httpx.post(
            f"{server.inference}/predictions/duo",
            content=f"sleep 0.01 {i}",
            headers={"content-type": "text/plain"},
            timeout=60,
        )
        with lock:
            statuses.append(resp.status_code)
        done.release()

    total = 120
    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(call, i) for i in range(total)]
        for _ in range(40):  # constant load is running on both workers: now kill one
            assert done.acquire(timeout=60)
        os.kill(victim, signal.SIGKILL)
        for future in futures:
            future.result(timeout=120)
    assert len(statuses) == total
    failed = [s for s in statuses if s != 200]
    assert failed == [], f"{len(failed)} of {total} requests failed: {sorted(set(failed))}"
    new = wait_for_workers(server, "duo", 2)
    assert victim not in new and survivor in new


# ----- per-worker memory cap -------------------------------------------------------------------


def test_a_worker_over_its_memory_cap_is_recycled_between_batches(server: LanternServer) -> None:
    (first,) = wait_for_workers(server, "leaky", 1)
    before = metric(server, "serve_worker_recycles_total", model="leaky", reason="memory")
    answers = []
    for _ in range(10):  # 40 MiB a request: past the 100 MiB cap by the third
        resp = httpx.post(f"{server.inference}/predictions/leaky", content=b"leak 40", timeout=60)
        assert resp.status_code == 200, resp.text  # the batch that passes the cap is answered
        answers.append(resp.json())
        if answers[-1]["uss_mib"] > LEAK_CAP_MB:  # the cap is on USS
            break
    assert answers[-1]["pid"] == first and answers[-1]["uss_mib"] > LEAK_CAP_MB
    deadline = time.monotonic() + 60
    while True:
        pids = server.worker_pids("leaky")
        if pids and pids != [first]:
            break
        assert time.monotonic() < deadline, "the worker over its cap was not replaced"
        time.sleep(0.1)
    after = httpx.post(f"{server.inference}/predictions/leaky", content=b"small", timeout=60)
    assert after.status_code == 200
    assert after.json()["pid"] != first and after.json()["uss_mib"] < LEAK_CAP_MB
    assert (
        metric(server, "serve_worker_recycles_total", model="leaky", reason="memory") == before + 1
    )
    assert metric(server, "serve_worker_restarts_total", model="leaky") == 0  # not a crash
    assert "over its cap of 100 MiB" in server.log_text("lantern.log")


# ----- a worker that cannot start shows as failed ----------------------------------------------


def test_a_worker_that_cannot_start_shows_in_describe_ping_and_the_log(tmp_path: Path) -> None:
    """A work_dir too long for a Unix socket: the worker fails with a clear reason (never a
    supervisor that dies unseen), describe shows it DEAD and /ping answers 500."""
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store, "nosock", config={"minWorkers": 1, "maxRetryTimeoutInSec": 0})
    work_dir = tmp_path / ("w" * max(1, 110 - len(str(tmp_path))))
    srv = LanternServer(tmp_path, store, ["nosock.mar"], env={"LANTERN_WORK_DIR": str(work_dir)})
    srv.start(healthy=False)
    try:
        deadline = time.monotonic() + 60
        while True:  # the record is written before startup models register: 404 until then
            described = srv.describe("nosock")
            if isinstance(described, list):
                (worker,) = described[0]["workers"]
                if worker["status"] == "DEAD":
                    break
            assert time.monotonic() < deadline, described
            time.sleep(0.1)
        assert worker["pid"] == -1
        assert srv.ping() == 500
        log = srv.log_text("lantern.log")
        assert "set a shorter work_dir" in log and "Giving up on worker nosock_1.0-w0" in log
    finally:
        srv.stop()
