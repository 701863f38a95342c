"""Large JSON bodies against a real server: decoding them never stalls the other models.

One server: ``echo`` (torch-free) and ``count`` (an Open Inference Protocol model). Error bodies,
deep JSON and element limits (issue 12) are tested in process with the real handlers
(`tests/app/test_hostile_input_app.py`).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time

import httpx
import numpy as np
import pytest

from tests.support.server import HANDLERS, LanternServer, build_archive, echo_archive


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> LanternServer:
    work = tmp_path_factory.mktemp("hostile")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "echo", config={"minWorkers": 1})
    build_archive(store, "count", HANDLERS / "count_handler.py", config={"minWorkers": 1})
    srv = LanternServer(work, store, ["echo.mar", "count.mar"])
    srv.start()
    yield srv
    srv.stop()


def oip_bytes_body(count: int) -> bytes:
    data = ["abcd"] * count
    return json.dumps(
        {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [count], "data": data}]}
    ).encode()


def test_big_json_bodies_do_not_stall_other_models(server: LanternServer) -> None:
    # Two clients post 700,000-element BYTES bodies (5.6 MB each, under the default 6.5 MB
    # limit). Meanwhile another model is asked in a loop; with decoding on the event loop, it
    # went unanswered for seconds.
    body = oip_bytes_body(700_000)
    stop = threading.Event()
    answered: list[float] = []

    def other_model() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                resp = client.post(f"{server.inference}/predictions/echo", content=b"hi")
                assert resp.status_code == 200
                answered.append(time.monotonic())

    def big() -> int:
        with httpx.Client(timeout=120) as client:
            url = f"{server.inference}/v2/models/count/infer"
            return client.post(url, content=body).status_code

    prober = threading.Thread(target=other_model)
    prober.start()
    try:
        while len(answered) < 5:  # the prober runs
            time.sleep(0.01)
        started = time.monotonic()
        with cf.ThreadPoolExecutor(2) as pool:
            statuses = list(pool.map(lambda _: big(), range(2)))
        finished = time.monotonic()
    finally:
        stop.set()
        prober.join(30)
    assert statuses == [200, 200]
    during = [t for t in answered if started <= t <= finished]
    stamps = [started, *during, finished]
    gaps = np.diff(stamps)
    # Generous: decoding now runs on a thread; only json.loads itself (one C call, ~0.1-0.3 s for
    # this body on a loaded machine) still holds the GIL. The old code went silent for seconds.
    assert gaps.max() < 1.0, f"longest silence {gaps.max():.2f} s over {len(during)} answers"
