"""The frontend's memory with 20 models registered: under 150 MB resident.

A memory bound, not a timing one: 20 tiny (torch-free) models, one worker each, every one of them
answered once (so each has its metric series, queues and worker handles), then the frontend's
``VmRSS`` is read from ``/proc``. The frontend never imports torch or a model's code, so what it
holds per model is its own bookkeeping; the bound is the issue's (performance, item 5).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.server import LanternServer, echo_archive

MODELS = 20
LIMIT_MB = 150


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("memory")
    store = root / "store"
    store.mkdir()
    names = [f"m{i:02d}" for i in range(MODELS)]
    for name in names:
        echo_archive(store, name, config={"minWorkers": 1, "maxWorkers": 1})
    # No warm spare: it would import torch in a process of its own, which this bound is not about.
    with LanternServer(
        root, store, ["all"], env={"LANTERN_WORKER_SPARES": "0"}, args=["--enable-model-api"]
    ) as running:
        yield running


def test_frontend_stays_under_150_mb_with_20_models(server: LanternServer) -> None:
    models = httpx.get(f"{server.management}/models", params={"limit": 100}, timeout=30).json()
    assert len(models["models"]) == MODELS
    with httpx.Client(timeout=60) as client:
        for entry in models["models"]:
            resp = client.post(f"{server.inference}/predictions/{entry['modelName']}", content=b"x")
            assert resp.status_code == 200
        assert client.get(f"{server.metrics}/metrics").status_code == 200
    rss = rss_mb(server.pid)
    print(f"frontend RSS with {MODELS} models: {rss:.1f} MB")
    assert rss < LIMIT_MB, f"frontend RSS {rss:.1f} MB with {MODELS} models"
