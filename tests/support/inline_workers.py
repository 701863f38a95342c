"""Workers that run the archive's real handler in this process, behind the registry's worker seam.

`InlineWorkers` is a `serve.core.model.WorkerFactory` whose workers do what ``python -m
serve.worker`` does, minus the process: load the handler with ``serve.worker.main.load``, warm it
up, and run each batch through ``serve.worker.main.run_items`` as the same typed messages a worker
process gets over its socket (the Ray replicas in ``serve/rayserve/app.py`` do the same).
The handler runs on a thread, so the event loop stays free while it works.

For torch-free test handlers. A handler that ends its process (``os._exit``) would end the test
run: crashes are `tests.support.fake_workers`' job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, WorkerState, next_state
from serve.wire.errors import WorkerDied
from serve.wire.frames import Frame
from serve.wire.messages import WorkerSpec, decode_partial
from serve.worker.main import _chunk_sender, client_errors, load, load_failure, run_batch, run_items
from serve.worker.process import WorkerStartFailed, batch_outcome, partial_results
from serve.worker.warmup import WarmupFailed, run_warmup

if TYPE_CHECKING:
    from serve.core.model import ModelVersion
    from serve.core.pool import WorkerSlot
    from serve.worker.main import Connection

logger = logging.getLogger(__name__)


class InlineWorker:
    """One worker of a model version, its handler loaded in this process."""

    def __init__(self, spec: WorkerSpec, worker_id: str) -> None:
        self.worker_id = worker_id
        self.spec = spec
        self.state = WorkerState.STARTING
        self.pid: int | None = None  # no process of its own
        self.started_at = time.time()
        self.warmup: dict[str, Any] = {}
        self.exit_code: int | None = None
        self._service: Any = None
        self._context: Any = None
        self._seq = 0
        self._exited = asyncio.Event()

    def change_state(self, wanted: WorkerState) -> bool:
        """As `WorkerProcess.change_state`: the dispatcher and the pool move its state here."""
        self.state = next_state(self.state, wanted)
        return self.state is wanted

    async def start(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.to_thread(self._load), timeout)
        except WorkerStartFailed:
            self._exit(1)
            raise
        except asyncio.TimeoutError:
            self._exit(1)
            message = f"worker {self.worker_id} did not load within {timeout:g} s"
            raise WorkerStartFailed(message) from None
        self.state = WorkerState.READY

    def _load(self) -> None:
        try:
            self._service, self._context = load(self.spec)
        except Exception as exc:
            logger.error("Failed to load the model", exc_info=True)  # as the worker logs it
            raise WorkerStartFailed(str(load_failure(self.spec, exc))) from exc
        try:
            self.warmup = run_warmup(self._service, self._context, self.spec, run_batch)
        except WarmupFailed as exc:
            raise WorkerStartFailed(f"WarmupFailed: {exc}") from exc

    async def run_batch(
        self,
        items: list[BatchItem],
        on_partial: Callable[[list[ItemResult]], None] | None = None,
    ) -> BatchOutcome:
        if self._exited.is_set():
            raise WorkerDied(f"Worker {self.worker_id} is not running.")
        self._seq += 1
        loop = asyncio.get_running_loop()

        partials = cast("Connection", _Partials(loop, on_partial))  # the sender only calls send
        self._context.intermediate_sink = _chunk_sender(partials, self._seq)
        decode = self.spec.decode_input_request
        result = await asyncio.to_thread(run_items, self._service, self._context, items, decode)
        if self._exited.is_set():
            raise WorkerDied(f"Worker {self.worker_id} died.")
        return batch_outcome(client_errors(result))

    def _exit(self, code: int) -> None:
        self.state = WorkerState.DEAD
        if not self._exited.is_set():
            self.exit_code = code
            self._exited.set()

    def kill(self) -> None:
        self._exit(-9)

    async def wait_exit(self) -> int | None:
        await self._exited.wait()
        return self.exit_code

    async def stop(self, grace: float = 5.0) -> None:
        self.state = WorkerState.STOPPING
        self._exit(0)


class _Partials:
    """Where the worker's chunk sender puts PARTIAL frames: back onto the loop, as results."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_partial: Callable[[list[ItemResult]], None] | None,
    ) -> None:
        self.loop = loop
        self.on_partial = on_partial

    def send(self, frame: Frame) -> None:
        if self.on_partial is not None:
            self.loop.call_soon_threadsafe(self.on_partial, partial_results(decode_partial(frame)))


class InlineWorkers:
    """A `serve.core.model.WorkerFactory` of `InlineWorker`s, with the spec a process would get."""

    def __init__(self) -> None:
        self.started: list[InlineWorker] = []

    def __call__(self, model: ModelVersion, slot: WorkerSlot) -> InlineWorker:
        worker = InlineWorker(model.worker_spec(slot), slot.worker_id)
        self.started.append(worker)
        return worker
