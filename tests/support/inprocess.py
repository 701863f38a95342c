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
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from serve.config import Config
from serve.core.model import WorkerFactory
from serve.server import Server
from tests.support.fake_workers import FakeWorkers


def test_config(
    root: Path, store: Path | None, *, ts_config: Path | None = None, **overrides: Any
) -> Config:
    """What ``serve start --disable-token-auth --ncs --no-grpc`` gives, in folders under ``root``,
    the environment left out; ``ts_config`` is a TorchServe config.properties (``--ts-config``)."""
    values: dict[str, Any] = {
        "model_store": str(store) if store else None,
        "log_dir": str(root / "logs"),
        "work_dir": str(root / "work"),
        "disable_token_authorization": True,
        "snapshot": False,
        "enable_grpc": False,
        # The clients below name the apps in Host (http://inference ...): the Host check's names.
        "allowed_hosts": ["inference", "management", "metrics"],
        **overrides,
    }
    return Config.load(ts_config_file=ts_config, env={}, overrides=values)


test_config.__test__ = False  # type: ignore[attr-defined]  # a helper, not a pytest test


@dataclass
class Lantern:
    """The server and one client per app (``inference``, ``management``, ``metrics``)."""

    server: Server
    workers: Any  # the worker factory: FakeWorkers, InlineWorkers
    inference: httpx.AsyncClient
    management: httpx.AsyncClient
    metrics: httpx.AsyncClient
    server_apps: dict[str, Any]  # the ASGI apps themselves, by name

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
            server, fakes, clients["inference"], clients["management"], clients["metrics"], apps
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
        await asyncio.wait_for(test(), limit)

    asyncio.run(bounded())


async def until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Let the loop run until ``condition`` holds (fails past ``limit`` seconds)."""

    async def holds() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(holds(), limit)


async def _cancel_the_rest() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _SyncASGITransport(httpx.BaseTransport):
    """A synchronous httpx transport onto an ASGI app that runs on another thread's loop."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = httpx.ASGITransport(app=app)
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def call() -> httpx.Response:
            response = await self._transport.handle_async_request(request)
            body = await response.aread()
            return httpx.Response(response.status_code, headers=response.headers, content=body)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()


class _Records(logging.Handler):
    """Every log record while the server runs, as text, for what a test reads in "the log"."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class ThreadedLantern:
    """`in_process` on an event loop of its own thread, for synchronous tests that share one
    server (a module fixture): ``client(app)`` gives an `httpx.Client` onto one of its apps."""

    def __init__(
        self, config: Config, workers: WorkerFactory | None = None, *, grpc: bool = False
    ) -> None:
        self._context = in_process(config, workers)
        self._grpc = grpc
        self._grpc_servers: Any = None  # serve.grpc.server.GrpcServers once started
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._records = _Records()
        self._clients: list[httpx.Client] = []
        self.lantern: Lantern | None = None

    def call(self, work: Awaitable[Any], timeout: float = 120.0) -> Any:
        """Run ``work`` on the server's loop; its result."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)  # type: ignore[arg-type]

    def __enter__(self) -> ThreadedLantern:
        self._thread.start()
        root = logging.getLogger()
        root.addHandler(self._records)
        self._level = root.level
        root.setLevel(min(root.level or logging.INFO, logging.INFO))
        self.lantern = self.call(self._context.__aenter__())
        if self._grpc:
            self._grpc_servers = self.call(self._start_grpc())
        return self

    async def _start_grpc(self) -> Any:
        """TorchServe's gRPC listeners on this loop, as `Server.serve` starts them (the ports
        are the config's: 0 picks free ones)."""
        from serve.grpc.server import GrpcServers

        assert self.lantern is not None
        server = self.lantern.server
        servers = GrpcServers(server.state, server.stop_event)
        await servers.start()
        return servers

    @property
    def grpc_inference(self) -> str:
        return str(self._grpc_servers.addresses["grpc_inference"])

    @property
    def grpc_management(self) -> str:
        return str(self._grpc_servers.addresses["grpc_management"])

    def __exit__(self, *exc: object) -> None:
        for client in self._clients:
            client.close()
        try:
            if self._grpc_servers is not None:
                assert self.lantern is not None
                self._loop.call_soon_threadsafe(self.lantern.server.stop_event.set)
                self.call(self._grpc_servers.wait_stopped())
            self.call(self._context.__aexit__(None, None, None))
            self.call(_cancel_the_rest())  # as asyncio.run does: batches still on a thread
        finally:
            logging.getLogger().removeHandler(self._records)
            logging.getLogger().setLevel(self._level)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()

    def client(self, app: str, timeout: float = 60.0) -> httpx.Client:
        assert self.lantern is not None
        app_object = self.lantern.server_apps[app]
        client = httpx.Client(
            transport=_SyncASGITransport(app_object, self._loop),
            base_url=f"http://{app}",
            timeout=timeout,
        )
        self._clients.append(client)
        return client

    def log_text(self) -> str:
        return "\n".join(self._records.lines)
