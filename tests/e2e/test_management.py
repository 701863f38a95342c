"""The management API against a running server: what only real worker processes show.

The routes, bodies, status codes and lifecycle logic are tested in process over fake workers
(`tests/app/test_management_app.py`); here a real server shows that its workers are processes that
scaling and unregistering start and end, and that describe reports their pids and memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import LanternServer, echo_archive, pid_alive


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    root = tmp_path_factory.mktemp("management")
    store = root / "store"
    store.mkdir()
    echo_archive(store)
    with LanternServer(root, store, args=["--enable-model-api"]) as srv:
        yield srv


def workers(api: httpx.Client, name: str) -> list[dict]:
    response = api.get(f"/models/{name}")
    assert response.status_code == 200, response.text
    return response.json()[0]["workers"]


def wait_dead(pids: list[int]) -> None:
    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids), pids


def test_scaling_and_unregistering_start_and_end_worker_processes(server: LanternServer) -> None:
    with httpx.Client(base_url=server.management, timeout=60) as api:
        params: dict[str, str | int] = {
            "url": "echo.mar",
            "model_name": "life",
            "initial_workers": 1,
        }
        assert api.post("/models", params=params).status_code == 200
        (worker,) = workers(api, "life")
        assert worker["status"] == "READY"
        assert pid_alive(worker["pid"])
        assert worker["memoryUsage"] > 0
        answer = httpx.post(f"{server.inference}/predictions/life", content=b"hi", timeout=60)
        assert answer.json()["pid"] == worker["pid"]

        scaled = api.put("/models/life", params={"min_worker": 3, "synchronous": "true"})
        assert scaled.status_code == 200
        pids = [w["pid"] for w in workers(api, "life") if w["status"] == "READY"]
        assert len(set(pids)) == 3 and all(pid_alive(p) for p in pids)

        shrunk = api.put("/models/life", params={"min_worker": 1, "synchronous": "true"})
        assert shrunk.status_code == 200
        (kept,) = [w["pid"] for w in workers(api, "life")]
        wait_dead([p for p in pids if p != kept])

        assert api.delete("/models/life").status_code == 200
        wait_dead([kept])
