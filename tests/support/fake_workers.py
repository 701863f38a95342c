"""Workers that answer from Python, behind the registry's seam (`serve.core.model.WorkerFactory`).

`FakeWorkers` is a worker factory: a `Registry` or `Server` given one runs unchanged (pool,
dispatcher, batching, lifecycle, the HTTP apps), but every worker is a `FakeWorker` whose batches a
`Behaviour` answers in this process, the way httpx's ``MockTransport`` answers requests. The
archive's handler file picks the behaviour by its stem (``echo_handler.py``: ``"echo_handler"``), so
a test builds the same archives it would serve for real.

A behaviour's exception is answered as the worker answers a handler's (`handlers.exceptions`): a
500 named after the exception type, for every item of the batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from handlers.exceptions import report_failure
from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, WorkerState, next_state
from serve.wire.errors import ServeError, WorkerDied, error_for_status
from serve.worker.process import WorkerStartFailed

if TYPE_CHECKING:
    from serve.core.model import ModelVersion
    from serve.core.pool import WorkerSlot

logger = logging.getLogger(__name__)

Answer = Callable[["FakeWorker", list[BatchItem]], Awaitable[list[ItemResult | ServeError]]]
Load = Callable[["FakeWorker"], Awaitable[None]]


async def loads(worker: FakeWorker) -> None:
    """Loading takes no time."""


async def loads_as_this_process(worker: FakeWorker) -> None:
    """Loading takes no time, and the worker reports this test process's pid: describe, the
    metrics and admission then read a real process's memory (``/proc/PID/smaps_rollup``)."""
    worker.pid = os.getpid()


@dataclass(frozen=True)
class Behaviour:
    """How one handler's workers load and answer."""

    answer: Answer
    load: Load = loads


def body_text(item: BatchItem) -> str:
    """The request's body (or ``data`` field) as text."""
    for name, _, value in item.params:
        if name in ("body", "data"):
            return value.decode(errors="replace")
    return ""


def json_result(data: object, status: int = 200) -> ItemResult:
    return ItemResult(status, json.dumps(data).encode(), "application/json")


async def echo(worker: FakeWorker, items: list[BatchItem]) -> list[ItemResult | ServeError]:
    """``tests/support/handlers/echo_handler.py`` in Python: ``boom`` raises, ``sleep S`` sleeps,
    ``crash`` ends the worker, ``status N`` answers status N; anything else is echoed with the
    batch it ran in."""
    texts = [body_text(it) for it in items]
    if "boom" in texts:
        raise ValueError("boom requested")
    if "crash" in texts:
        worker.crash(3)
    for text in texts:
        if text.startswith("sleep "):
            await asyncio.sleep(float(text.split()[1]))
    out: list[ItemResult | ServeError] = []
    for item, text in zip(items, texts, strict=True):
        status = int(text.split()[1]) if text.startswith("status ") else 200
        query = {n: v.decode() for n, _, v in item.params if n not in ("body", "data")}
        out.append(
            json_result(
                {
                    "echo": text,
                    "batch": len(items),
                    "worker": worker.worker_id,
                    "request_id": item.request_id,
                    "url_path": item.headers.get("url_path"),
                    "explain": item.headers.get("explain"),
                    "gpu_id": worker.slot.gpu_id,
                    "query": query,
                },
                status,
            )
        )
    return out


def fails_to_load(message: str) -> Load:
    """A load that always fails, as a handler that raises in ``initialize`` does."""

    async def load(worker: FakeWorker) -> None:
        raise WorkerStartFailed(f"Worker {worker.worker_id} failed to load: {message}")

    return load


class FakeWorker:
    """One worker in this process: a `serve.core.pool.ManagedWorker` its `Behaviour` drives."""

    def __init__(self, model: ModelVersion, slot: WorkerSlot, behaviour: Behaviour) -> None:
        self.worker_id = slot.worker_id
        self.model = model
        self.slot = slot
        self.behaviour = behaviour
        self.state = WorkerState.STARTING
        self.pid: int | None = None  # no process: describe and admission see none
        self.started_at = time.time()
        self.batches: list[list[str]] = []  # the request ids of each batch it ran
        self.exit_code: int | None = None
        self._exited = asyncio.Event()

    def change_state(self, wanted: WorkerState) -> bool:
        """As `WorkerProcess.change_state`: the dispatcher and the pool move its state here."""
        self.state = next_state(self.state, wanted)
        return self.state is wanted

    async def start(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.behaviour.load(self), timeout)
        except asyncio.TimeoutError:
            self.crash(-9)
            raise WorkerStartFailed(
                f"Worker {self.worker_id} did not load in {timeout} s."
            ) from None
        except WorkerStartFailed:
            self.crash(1)
            raise
        self.state = WorkerState.READY

    async def run_batch(
        self,
        items: list[BatchItem],
        on_partial: Callable[[list[ItemResult]], None] | None = None,
    ) -> BatchOutcome:
        if self._exited.is_set():
            raise WorkerDied(f"Worker {self.worker_id} is not running.")
        self.batches.append([it.request_id for it in items])
        answer = asyncio.ensure_future(self._answer(items))
        exit_ = asyncio.ensure_future(self._exited.wait())
        await asyncio.wait({answer, exit_}, return_when=asyncio.FIRST_COMPLETED)
        exit_.cancel()
        if self._exited.is_set():  # it died with the batch in hand: the socket's EOF
            answer.cancel()
            raise WorkerDied(f"Worker {self.worker_id} died.")
        return BatchOutcome(answer.result(), {}, [])

    async def _answer(self, items: list[BatchItem]) -> list[ItemResult | ServeError]:
        try:
            return await self.behaviour.answer(self, items)
        except Exception as exc:
            code, kind, message = report_failure(exc, [it.request_id for it in items], logger)
            return [error_for_status(code, message, kind) for _ in items]

    def crash(self, code: int = 1) -> None:
        """The process is gone: every batch in hand fails, the pool restarts it."""
        self.state = WorkerState.DEAD
        if not self._exited.is_set():
            self.exit_code = code
            self._exited.set()

    def kill(self) -> None:
        self.crash(-9)

    async def wait_exit(self) -> int | None:
        await self._exited.wait()
        return self.exit_code

    async def stop(self, grace: float = 5.0) -> None:
        self.state = WorkerState.STOPPING
        self.crash(0)


class FakeWorkers:
    """A `serve.core.model.WorkerFactory` whose workers answer from Python, by handler."""

    def __init__(self, behaviours: dict[str, Behaviour] | None = None) -> None:
        self.behaviours = {"echo_handler": Behaviour(echo), **(behaviours or {})}
        self.started: list[FakeWorker] = []  # every worker built, in order

    def __call__(self, model: ModelVersion, slot: WorkerSlot) -> FakeWorker:
        handler = model.source.handler or model.source.manifest["model"]["handler"]
        stem = Path(handler.split(":", 1)[0]).stem
        if stem not in self.behaviours:
            raise KeyError(f"no fake behaviour for handler {handler!r} (model {model.name})")
        worker = FakeWorker(model, slot, self.behaviours[stem])
        self.started.append(worker)
        return worker

    def of(self, model: str, version: str | None = None) -> list[FakeWorker]:
        """The live workers built for ``model`` (and ``version``)."""
        return [
            w
            for w in self.started
            if w.model.name == model
            and (version is None or w.model.version == version)
            and w.state != WorkerState.DEAD
        ]
