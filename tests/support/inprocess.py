"""A whole Lantern frontend in the test's own event loop: `serve.server.Server` with fake workers.

The apps are the ones the listeners serve (edge middleware included), called through httpx's ASGI
transport; the registry builds its workers through `tests.support.fake_workers.FakeWorkers` (or
`tests.support.inline_workers.InlineWorkers`: the real handler, in this process). No
socket, no process: what this shows is the logic above the worker seam. `tests/support/server.py`
starts the real thing for what only it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from serve.config import Config
from serve.core.model import WorkerFactory
from serve.server import Server
from tests.support.fake_workers import FakeWorkers


def test_config(root: Path, store: Path | None, **overrides: Any) -> Config:
    """What ``serve start --disable-token-auth --ncs --no-grpc`` gives, in folders under ``root``,
    the environment left out."""
    values: dict[str, Any] = {
        "model_store": str(store) if store else None,
        "log_dir": str(root / "logs"),
        "work_dir": str(root / "work"),
        "disable_token_authorization": True,
        "snapshot": False,
        "enable_grpc": False,
        **overrides,
    }
    return Config.load(env={}, overrides=values)


test_config.__test__ = False  # type: ignore[attr-defined]  # a helper, not a pytest test


@dataclass
class Lantern:
    """The server and one client per app (``inference``, ``management``, ``metrics``)."""

    server: Server
    workers: Any  # the worker factory: FakeWorkers, InlineWorkers
    inference: httpx.AsyncClient
    management: httpx.AsyncClient
    metrics: httpx.AsyncClient

    @property
    def registry(self) -> Any:
        return self.server.registry


@contextlib.asynccontextmanager
async def in_process(
    config: Config, workers: WorkerFactory | None = None
) -> AsyncIterator[Lantern]:
    """Build the server, load its startup models, yield it; stop every worker afterwards."""
    fakes = workers or FakeWorkers()
    server = Server(config, worker_factory=fakes)
    apps = server.apps()
    clients = {
        name: httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=f"http://{name}", timeout=30
        )
        for name, app in apps.items()
    }
    try:
        await server.load_startup_models()
        yield Lantern(
            server, fakes, clients["inference"], clients["management"], clients["metrics"]
        )
    finally:
        for client in clients.values():
            await client.aclose()
        await server.registry.stop()
        if server.state.workflows is not None:
            server.state.workflows.close()
        if server.state.auth is not None:
            server.state.auth.remove_key_file()


def run(test: Callable[[], Awaitable[None]], limit: float = 60.0) -> None:
    """Run one async test body, bounded so that a hang fails instead of stalling the suite."""

    async def bounded() -> None:
        async with asyncio.timeout(limit):
            await test()

    asyncio.run(bounded())


async def until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Let the loop run until ``condition`` holds (fails past ``limit`` seconds)."""
    async with asyncio.timeout(limit):
        while not condition():
            await asyncio.sleep(0.001)
