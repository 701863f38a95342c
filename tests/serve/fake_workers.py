"""In-process fake workers and pool: `serve.core.dispatcher.Dispatcher` without processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from serve.core.dispatcher import Worker
from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, WorkerState, next_state
from serve.wire.errors import WorkerDied


class FakeWorker:
    """Holds each batch until the test says `finish` or `die`; records every misuse."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.state = WorkerState.READY
        self.sent: list[list[str]] = []  # request ids of each batch received
        self.completed: list[str] = []  # request ids answered by this worker
        self.violations: list[str] = []
        self.killed = False
        self._current: asyncio.Future[BatchOutcome] | None = None
        self._items: list[BatchItem] = []

    def change_state(self, wanted: WorkerState) -> bool:
        self.state = next_state(self.state, wanted)
        return self.state is wanted

    @property
    def holding(self) -> bool:
        return self._current is not None and not self._current.done()

    async def run_batch(
        self,
        items: list[BatchItem],
        on_partial: Callable[[list[ItemResult]], None] | None = None,
    ) -> BatchOutcome:
        if self.state != WorkerState.BUSY:
            self.violations.append(f"batch sent to {self.worker_id} in state {self.state.name}")
        if self.holding:
            self.violations.append(f"second batch sent to busy {self.worker_id}")
        if self.state == WorkerState.DEAD:
            raise WorkerDied(f"Worker {self.worker_id} is not running.")
        self.sent.append([it.request_id for it in items])
        self._items = items
        self._current = asyncio.get_running_loop().create_future()
        return await self._current

    def finish(self) -> None:
        """Answer the batch in hand, one echo per item."""
        if not self.holding:
            return
        assert self._current is not None
        ids = [it.request_id for it in self._items]
        self.completed.extend(ids)
        results: list[ItemResult | object] = [
            ItemResult(200, rid.encode(), "text/plain") for rid in ids
        ]
        self._current.set_result(BatchOutcome(results, {}, []))  # type: ignore[arg-type]

    def die(self) -> None:
        """The process is gone: the socket closed, the batch in hand fails."""
        self.state = WorkerState.DEAD
        if self.holding:
            assert self._current is not None
            self._current.set_exception(WorkerDied(f"Worker {self.worker_id} died."))

    def kill(self) -> None:
        self.killed = True
        self.die()


class FakePool:
    """A `WorkerSource` over a list of fake workers; the test replaces dead ones at will."""

    def __init__(self, count: int) -> None:
        self.workers_: list[FakeWorker] = [FakeWorker(f"w{i}") for i in range(count)]
        self.retired: list[FakeWorker] = []
        self.finished: list[str] = []
        self.serving = True

    def workers(self) -> list[Worker]:
        return list(self.workers_)

    def can_serve(self) -> bool:
        return self.serving and bool(self.workers_)

    def batch_finished(self, worker: Worker) -> None:
        self.finished.append(worker.worker_id)

    def replace(self, index: int) -> FakeWorker:
        """A fresh worker in place of a dead one (the pool's restart)."""
        old = self.workers_[index]
        self.retired.append(old)
        new = FakeWorker(f"{old.worker_id}'")
        self.workers_[index] = new
        return new

    def everyone(self) -> list[FakeWorker]:
        return self.retired + self.workers_
