"""Clients looping big JSON bodies at the generative routes do not stall the neighbours
(issue 39, items 3 and 6).

Two clients loop ~6 MB bodies: a completion with 3.1 M ``stop_token_ids`` (refused from its
commas, 400), a chat whose one message is 6 MB (parsed whole, then 404: no such model) and an
embeddings request of 1,500 inputs whose answer passes ``max_response_size`` (500). Meanwhile
``/ping`` and an unrelated model are asked at a fixed rate; their p99 must stay within 250 ms of
what it was with nobody attacking. Before, the bodies were parsed on the event loop: ``/ping`` p99
went from 6 ms to 1,967 ms and the neighbour model's to 12.8 s.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import HANDLERS, LanternServer, build_archive, echo_archive

RATE = 40.0  # neighbour requests a second, on schedule (open loop)
COUNT = 200
MARGIN = 0.25  # seconds over the quiet p99 (the bar)
RESPONSE_LIMIT = 10_000  # the fake model's 1,500 vectors take ~20 KB


def _bodies() -> dict[str, tuple[str, bytes]]:
    ids = ",".join(["1"] * 3_100_000)
    stops = '{"model": "nope", "prompt": "hello", "stop_token_ids": [' + ids + "]}"
    message = [{"role": "user", "content": "word " * 1_200_000}]
    chat = json.dumps({"model": "nope", "messages": message})
    inputs = json.dumps({"model": "llm", "input": ["x" * 1000] * 1500, "encoding_format": "float"})
    return {
        "stops": ("/v1/completions", stops.encode()),
        "chat": ("/v1/chat/completions", chat.encode()),
        "embeddings": ("/v1/embeddings", inputs.encode()),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("bigjson_gen")
    store = work / "store"
    store.mkdir()
    echo_archive(store, "small", config={"minWorkers": 1})
    llm = HANDLERS / "fake_llm_handler.py"
    build_archive(store, "llm", llm, config={"minWorkers": 1, "embeddings": True})
    env = {"LANTERN_MAX_RESPONSE_SIZE": str(RESPONSE_LIMIT)}
    srv = LanternServer(work, store, ["small.mar", "llm.mar"], args=["--no-grpc"], env=env)
    srv.start()
    yield srv
    srv.stop()


def _neighbour_latencies(server: LanternServer) -> tuple[list[float], Counter[int]]:
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def ask(client: httpx.Client, k: int) -> None:
        started = time.perf_counter()
        if k % 2:
            resp = client.get(f"{server.inference}/ping")
        else:
            resp = client.post(f"{server.inference}/predictions/small", content=b"hi")
        with lock:
            latencies.append(time.perf_counter() - started)
            statuses[resp.status_code] += 1

    with httpx.Client(timeout=60) as client, cf.ThreadPoolExecutor(32) as pool:
        start = time.perf_counter()
        for k in range(COUNT):
            delay = start + k / RATE - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(ask, client, k)
    return latencies, statuses


def _p99(latencies: list[float]) -> float:
    return sorted(latencies)[int(0.99 * len(latencies))]


def test_neighbours_stay_fast_while_clients_loop_big_json(server: LanternServer) -> None:
    quiet, statuses = _neighbour_latencies(server)
    assert statuses == {200: COUNT}
    bodies = _bodies()
    stop = threading.Event()
    seen: Counter[str] = Counter()

    def attacker() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                for kind, (path, body) in bodies.items():
                    resp = client.post(f"{server.inference}{path}", content=body)
                    seen[f"{kind} {resp.status_code}"] += 1

    looping = [threading.Thread(target=attacker) for _ in range(2)]
    for thread in looping:
        thread.start()
    try:
        while not seen:  # the attack is under way
            time.sleep(0.01)
        loud, statuses = _neighbour_latencies(server)
    finally:
        stop.set()
        for thread in looping:
            thread.join(120)
    assert statuses == {200: COUNT}
    assert set(seen) == {"stops 400", "chat 404", "embeddings 500"}, seen
    bound = _p99(quiet) + MARGIN
    print(f"neighbour p99 quiet {_p99(quiet) * 1000:.0f} ms, attacked {_p99(loud) * 1000:.0f} ms")
    assert _p99(loud) < bound, f"p99 {_p99(loud):.3f} s, quiet {_p99(quiet):.3f} s; {seen}"
