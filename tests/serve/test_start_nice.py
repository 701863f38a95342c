"""A cold worker imports its frameworks at `worker_start_nice` only while the server serves
requests; on an idle server at normal priority (nothing would gain from the wait)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from serve.config import Config, ModelSettings
from serve.core.model import ModelSource, ModelVersion
from serve.core.pool import WorkerSlot


def test_the_start_nice_follows_whether_the_server_is_busy(tmp_path: Path) -> None:
    source = ModelSource("m.mar", tmp_path, {"model": {}}, {"minWorkers": 1}, None)
    config = Config(worker_start_nice=7)
    model = ModelVersion("m", "1.0", source, ModelSettings(), config, tmp_path)
    slot = WorkerSlot(0, "m_1.0-w0", None)
    assert model.worker_spec(slot).start_nice == 7  # on its own: as configured
    busy = [False]
    model.server_busy = lambda: busy[0]
    assert model.worker_spec(slot).start_nice == 0
    busy[0] = True
    assert model.worker_spec(slot).start_nice == 7


def test_the_registry_is_busy_while_a_request_is_in_flight(tmp_path: Path) -> None:
    from serve.core.jobs import BatchItem
    from serve.core.registry import Registry
    from tests.support.fake_workers import Behaviour, FakeWorkers, json_result

    release = asyncio.Event()

    async def held(worker: object, items: list[BatchItem]) -> list:
        await release.wait()
        return [json_result("ok") for _ in items]

    workers = FakeWorkers({"held_handler": Behaviour(held)})
    registry = Registry(Config(memory_admission=False), tmp_path, worker_factory=workers)
    manifest = {"model": {"modelName": "m", "handler": "held_handler.py"}}

    async def scenario() -> None:
        try:
            source = ModelSource("m.mar", tmp_path, manifest, {}, None)
            await registry.add_source("m", "1", source, initial_workers=1)
            version = registry.get("m")
            assert not registry.busy() and version.start_nice() == 0
            answer = version.dispatcher.submit(BatchItem("r1", {}, [("body", None, b"x")]))
            assert registry.busy() and version.start_nice() == Config().worker_start_nice
            release.set()
            await asyncio.wait_for(answer, 10)
            assert not registry.busy()
        finally:
            await registry.stop()

    asyncio.run(scenario())
