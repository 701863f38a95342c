"""The thread budget on a real server: intra-op threads are shared by every worker of the server.

Each model's handler answers with ``torch.get_num_threads()`` in its worker at that moment. As
models come and go the running workers' shares move, and the sum over all workers stays within the
cores the server may use, unless a model's ``numThreads`` overrides its share.
"""

from __future__ import annotations

import os

import httpx
import pytest

from tests.support.server import HANDLERS, LanternServer, build_archive

CORES = len(os.sched_getaffinity(0))  # the server inherits the test's affinity


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("threads")
    store = root / "store"
    store.mkdir()
    handler = HANDLERS / "threads_handler.py"
    for name in ("a", "b"):
        build_archive(store, name, handler, config={"minWorkers": 1, "maxWorkers": 1})
    build_archive(
        store, "fixed", handler, config={"minWorkers": 1, "maxWorkers": 1, "numThreads": 1}
    )
    with LanternServer(root, store, ["a=a.mar"], args=["--enable-model-api"]) as running:
        yield running


def threads(server: LanternServer, model: str) -> int:
    resp = httpx.post(f"{server.inference}/predictions/{model}", content=b"x", timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()["threads"]


def register(server: LanternServer, name: str) -> None:
    resp = httpx.post(
        f"{server.management}/models",
        params={"url": f"{name}.mar", "initial_workers": 1, "synchronous": "true"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text


def unregister(server: LanternServer, name: str) -> None:
    resp = httpx.delete(f"{server.management}/models/{name}", timeout=120)
    assert resp.status_code == 200, resp.text


def test_shares_move_as_models_come_and_go(server: LanternServer) -> None:
    assert threads(server, "a") == CORES  # alone: every core

    register(server, "b")
    half = max(1, CORES // 2)
    shares = {m: threads(server, m) for m in ("a", "b")}
    assert shares == {"a": half, "b": half}  # "a" was told its new share while running
    assert sum(shares.values()) <= max(CORES, 2)

    register(server, "fixed")  # numThreads: 1 is taken off the top
    rest = max(1, (CORES - 1) // 2)
    assert {m: threads(server, m) for m in ("a", "b", "fixed")} == {
        "a": rest,
        "b": rest,
        "fixed": 1,
    }

    unregister(server, "fixed")
    unregister(server, "b")
    assert threads(server, "a") == CORES  # and back when the others leave
