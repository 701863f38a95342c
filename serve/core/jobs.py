"""What travels between the dispatcher and a worker: items, results, jobs and worker states.

Nothing here knows about processes or sockets, so the dispatcher, the worker pool and the worker
process handle all import it (and tests build jobs without any of them).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from serve.wire.errors import ServeError
from serve.wire.messages import PredictItem

# What the worker needs of one request is what the PREDICT frame carries of it: the wire's item.
BatchItem = PredictItem


class WorkerState(enum.Enum):
    """A worker's state as the dispatcher sees it."""

    STARTING = "STARTING"
    READY = "READY"
    BUSY = "BUSY"
    STOPPING = "STOPPING"
    DEAD = "DEAD"


LIVE_STATES = (WorkerState.READY, WorkerState.BUSY)

# The moves a worker's state may make. The worker handle is its one writer: the dispatcher (BUSY,
# READY) and the pool (STOPPING) ask it through ``change_state``, which follows this table, so
# that no caller can bring a worker back from STOPPING or DEAD.
_MOVES: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.STARTING: frozenset({WorkerState.READY, WorkerState.STOPPING, WorkerState.DEAD}),
    WorkerState.READY: frozenset({WorkerState.BUSY, WorkerState.STOPPING, WorkerState.DEAD}),
    WorkerState.BUSY: frozenset({WorkerState.READY, WorkerState.STOPPING, WorkerState.DEAD}),
    WorkerState.STOPPING: frozenset({WorkerState.DEAD}),
    WorkerState.DEAD: frozenset(),
}


def next_state(current: WorkerState, wanted: WorkerState) -> WorkerState:
    """The state a worker in ``current`` is in once asked for ``wanted``: ``wanted`` if the
    table allows the move (or it is already there), else ``current``."""
    return wanted if wanted is current or wanted in _MOVES[current] else current


# A streamed answer's parts wait in the frontend for their client; one that does not read (or
# reads slower than its model writes) would have the frontend hold the whole answer. Past
# STREAM_BUFFER_MAX bytes waiting, the client has STREAM_SEND_TIMEOUT seconds to take them back
# under it, and the parts may grow to STREAM_BUFFER_CAP meanwhile; past either, the request is
# cancelled on its worker and its waiting parts dropped (docs/faults.md).
STREAM_BUFFER_MAX = 1 << 20
STREAM_BUFFER_CAP = 4 * STREAM_BUFFER_MAX
STREAM_SEND_TIMEOUT = 10.0


class PartQueue(asyncio.Queue["ItemResult | ServeError | None"]):
    """A stream's parts waiting for its client; ``waiting`` counts their bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0

    def _put(self, item: ItemResult | ServeError | None) -> None:
        if isinstance(item, ItemResult):
            self.waiting += len(item.body)
        super()._put(item)

    def _get(self) -> ItemResult | ServeError | None:
        item = super()._get()
        if isinstance(item, ItemResult):
            self.waiting -= len(item.body)
        return item

    def drop(self) -> None:
        """Forget every waiting part."""
        while not self.empty():
            self.get_nowait()


class StreamNotRead(ServeError):
    """A stream's client left its parts unread past the bound (`STREAM_BUFFER_MAX`)."""

    status_code = 408
    error_type = "StreamNotRead"


@dataclass(slots=True)
class ItemResult:
    """A request's answer as the frontend hands it on (from the worker's `ResultItem` or
    `PartialItem`); a streaming answer's ``stream`` carries what follows."""

    status: int
    body: bytes
    content_type: str | None
    headers: dict[str, str] = field(default_factory=dict)
    # For a streaming handler: the later chunks, then the final result or error, then None.
    stream: PartQueue | None = None
    # Called by the edge when its client leaves a stream before the end (`Job.abandon`).
    abandon: Callable[[], None] | None = field(default=None, repr=False, compare=False)


T = TypeVar("T")


async def answer_parts(first: ItemResult) -> AsyncGenerator[ItemResult, None]:
    """Every part of an answer, ``first`` included; an error that ended its stream is raised."""
    yield first
    if first.stream is None:
        return
    while (item := await first.stream.get()) is not None:
        if isinstance(item, ServeError):
            raise item
        yield item


async def abandoned_if_left(first: ItemResult, events: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """``events`` (what an edge sends of a streamed answer that began with ``first``); if its
    client leaves before they end, the request is abandoned, so that the worker stops generating
    for it and its slot frees (a CANCEL frame; the engine drops it at its next step)."""
    ended = False
    try:
        async for event in events:
            yield event
        ended = True
    finally:
        if not ended and first.abandon is not None:
            first.abandon()


@dataclass(slots=True)
class BatchOutcome:
    """One result or error per item, with the worker's timings and custom metrics."""

    results: list[ItemResult | ServeError]
    timings: dict[str, float]
    metrics: list[dict[str, Any]]


@dataclass(slots=True)
class Job:
    """One request on its way through the queue to a worker and back."""

    item: BatchItem
    future: asyncio.Future[ItemResult]
    arrived: float
    deadline: float
    retries: int = 0
    dispatched_at: float = 0.0
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    stream: PartQueue | None = field(default=None, repr=False)
    abandoned: bool = False  # its client left a stream before the end
    on_abandon: Callable[[], None] | None = field(default=None, repr=False)
    unread: asyncio.TimerHandle | None = field(default=None, repr=False)  # `_watch_stream`

    @property
    def done(self) -> bool:
        return self.future.done()

    @property
    def gone(self) -> bool:
        """Nobody waits for it any more: its client left, or it was answered with an error
        (its deadline passed) before the worker finished it."""
        if self.abandoned or self.future.cancelled():
            return True
        return self.future.done() and self.future.exception() is not None

    def abandon(self) -> None:
        """The client left the stream: the worker may stop generating for it, and the parts
        waiting for the client are dropped (as are any that come later)."""
        self.abandoned = True
        if self.stream is not None:
            self.stream.drop()
        if self.on_abandon is not None:
            self.on_abandon()

    def push_chunk(self, chunk: ItemResult) -> None:
        """An intermediate chunk from a streaming handler.

        The first one answers the request at once, as a result whose ``stream`` yields the later
        chunks and then the final result (or error).
        """
        if self.stream is not None:
            if not self.abandoned:  # else nobody reads it: dropped
                self.stream.put_nowait(chunk)
                self._watch_stream()
        elif not self.future.done():  # not answered yet (by a timeout, say)
            self.stream = PartQueue()
            self.future.set_result(
                ItemResult(
                    chunk.status,
                    chunk.body,
                    chunk.content_type,
                    dict(chunk.headers),
                    stream=self.stream,
                    abandon=self.abandon,
                )
            )

    def _watch_stream(self) -> None:
        """Hold the parts waiting for the client to the bounds (`STREAM_BUFFER_MAX`)."""
        assert self.stream is not None
        waiting = self.stream.waiting
        if waiting > STREAM_BUFFER_CAP:
            self._unread()
        elif waiting > STREAM_BUFFER_MAX and self.unread is None:
            loop = asyncio.get_running_loop()
            self.unread = loop.call_later(STREAM_SEND_TIMEOUT, self._still_unread)

    def _still_unread(self) -> None:
        self.unread = None
        if self.stream is not None and self.stream.waiting > STREAM_BUFFER_MAX:
            self._unread()

    def _unread(self) -> None:
        """The client has not read its stream: cancel the request, drop its parts, end it."""
        assert self.stream is not None
        if self.unread is not None:
            self.unread.cancel()
            self.unread = None
        self.abandon()
        self.stream.put_nowait(
            StreamNotRead(
                f"The client of request {self.item.request_id} did not read its stream "
                f"({STREAM_BUFFER_MAX} bytes waiting for {STREAM_SEND_TIMEOUT:g} s); cancelled."
            )
        )
        self.stream.put_nowait(None)

    def resolve(self, result: ItemResult) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.stream is not None:
            if not self.abandoned:
                self.stream.put_nowait(result)
                self.stream.put_nowait(None)
        elif not self.future.done():
            self.future.set_result(result)

    def fail(self, error: ServeError) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.stream is not None:
            if not self.abandoned:
                self.stream.put_nowait(error)
                self.stream.put_nowait(None)
        elif not self.future.done():
            self.future.set_exception(error)
