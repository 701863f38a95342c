"""Sequence batching for stateful models (TorchServe 0.11+): the settings and their checks.

A model with ``sequenceBatching: true`` in its model-config.yaml serves *sequences*: requests that
carry the same sequence id (the ``ts_request_sequence_id`` header; a request without one starts a
new sequence under a fresh id) are run one at a time, in arrival order, on the one worker the
sequence was given, so a handler can keep the sequence's state in that worker's memory.

With ``continuousBatching: true`` as well (TorchServe's *sequence continuous batching*), a
sequence's next request joins its worker's next batch while earlier ones are still being answered:
a handler answers a request in steps (its ``context.stopping_criteria`` says per row whether the
answer is complete; the worker marks a partial answer ``ts_stream_next: true``), and a request
that is not complete goes back to the worker in every following batch, with its headers but no
input, until it is. That is how a later request of the sequence can cancel an earlier one (the
handler decides what cancels). A ``ts_request_sequence_end`` response header (sequence ids,
``;``-separated) closes those sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from serve.config import ModelSettings
from serve.core.batching import arm_deadline
from serve.core.dispatcher import Dispatcher, Worker, WorkerSource
from serve.core.jobs import LIVE_STATES, BatchItem, BatchOutcome, ItemResult, Job, WorkerState
from serve.wire.errors import (
    BadRequest,
    Conflict,
    ServeError,
    ShuttingDown,
    TooManyRequests,
    WorkerDied,
)

logger = logging.getLogger(__name__)

# The request headers of a sequence, as TorchServe names them (its TS_REQUEST_SEQUENCE_* env
# variables rename them; its config.properties keys ts_header_key_sequence_* are not read).
SEQUENCE_ID_HEADER = os.environ.get("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
SEQUENCE_START_HEADER = os.environ.get("TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start")
SEQUENCE_END_HEADER = os.environ.get("TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end")
# A response header the worker sets from the handler's stopping criteria: "true" while the
# request's answer goes on (TorchServe's RequestInput.TS_STREAM_NEXT).
STREAM_NEXT_HEADER = "ts_stream_next"

# Settings of TorchServe 0.12 that Lantern does not implement: refused at registration, never
# silently ignored. continuousBatching is supported only with sequenceBatching (TorchServe's
# "sequence continuous batching"); alone it is refused.
_UNSUPPORTED = {
    "useJobTicket": "job tickets",
}


def _flag(values: Mapping[str, Any], key: str) -> bool:
    value = values.get(key)
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return value is True


def _count(values: Mapping[str, Any], key: str) -> int:
    raw = values.get(key, 0)
    if raw is None:
        return 0
    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        raise BadRequest(f"{key} must be a whole number, not {raw!r}.")
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise BadRequest(f"{key} must be a whole number, not {raw!r}.") from None
    if value < 0:
        raise BadRequest(f"{key} cannot be negative.")
    return value


@dataclass(frozen=True)
class SequenceSettings:
    """A model's sequence-batching settings (all 0 for a model without sequences)."""

    enabled: bool = False
    max_num_sequence: int = 0  # open sequences at once: max(yaml, batchSize x maxWorkers)
    max_sequence_job_queue_size: int = 0  # queued requests per sequence
    sequence_max_idle_msec: int = 0  # a sequence with no request for this long is closed
    sequence_timeout_msec: int = 0  # a sequence older than this takes no more requests; 0: never
    continuous: bool = False  # continuousBatching too: TorchServe's sequence continuous batching

    @classmethod
    def from_config(
        cls, values: Mapping[str, Any], batch_size: int, max_workers: int
    ) -> SequenceSettings:
        """The settings in a model-config.yaml mapping, with TorchServe's rules applied."""
        check_supported_settings(values)
        if not _flag(values, "sequenceBatching"):
            return cls()
        return cls(
            enabled=True,
            # TorchServe: at least one sequence per batch slot of every worker.
            max_num_sequence=max(
                _count(values, "maxNumSequence"), batch_size * max(1, max_workers)
            ),
            max_sequence_job_queue_size=max(1, _count(values, "maxSequenceJobQueueSize")),
            sequence_max_idle_msec=_count(values, "sequenceMaxIdleMSec"),
            sequence_timeout_msec=_count(values, "sequenceTimeoutMSec"),
            continuous=_flag(values, "continuousBatching"),
        )


def check_supported_settings(values: Mapping[str, Any]) -> None:
    """Raise `BadRequest` for a model-config setting Lantern would otherwise have to ignore."""
    for key, what in _UNSUPPORTED.items():
        if _flag(values, key):
            raise BadRequest(
                f"{key}: true is not supported by Lantern ({what}); remove it from the model's "
                "configuration."
            )
    if _flag(values, "continuousBatching") and not _flag(values, "sequenceBatching"):
        raise BadRequest(
            "continuousBatching: true is supported by Lantern only with sequenceBatching: true "
            "(sequence continuous batching); remove it from the model's configuration."
        )
    for key in (
        "maxNumSequence",
        "maxSequenceJobQueueSize",
        "sequenceMaxIdleMSec",
        "sequenceTimeoutMSec",
    ):
        _count(values, key)
    if _flag(values, "sequenceBatching") and _count(values, "sequenceMaxIdleMSec") <= 0:
        # TorchServe sets up no sequence table then, and drops every request of the model.
        raise BadRequest(
            "sequenceBatching needs sequenceMaxIdleMSec > 0 (how long an idle sequence is kept)."
        )


# ----- which sequence runs where: a pure policy ----------------------------------------------


@dataclass(frozen=True)
class SequenceView:
    """What the policy needs of one open sequence."""

    seq_id: str
    worker: str | None  # the worker it is bound to, if any
    ready: bool  # has a queued request it may send now


def plan_sequence_batches(
    sequences: Sequence[SequenceView],
    free: Sequence[str],
    live: Sequence[str],
    batch_size: int,
    carried: Mapping[str, int] | None = None,
) -> dict[str, list[str]]:
    """Which ready sequences send their next request to which free worker now.

    ``sequences`` oldest first; ``free``: workers that can take a batch now; ``live``: workers in
    service (free or busy). A sequence bound to a live worker only ever goes to that worker. A
    sequence that is unbound, or whose worker left service, goes to the free worker with the
    fewest sequences bound to it, and is bound there. A worker gets at most ``batch_size``
    sequences, one request of each: requests of one sequence never share a batch or run at once.

    ``carried`` is given for continuous batching only (then perhaps empty): per worker, how many
    unfinished requests go back to it in its next batch anyway. A worker then takes
    ``2 x batch_size`` requests in all (as TorchServe's sequence continuous batching), so at most
    that less ``carried`` new ones, and a free worker with carried requests is in the plan
    (perhaps with no new sequence) to carry them on.
    """
    continuous = carried is not None
    carried = carried or {}
    live_set, free_set = set(live), set(free)
    load = {w: 0 for w in live}
    for seq in sequences:
        if seq.worker in load:
            load[seq.worker] += 1
    room = {w: (2 * batch_size - carried.get(w, 0)) if continuous else batch_size for w in free}
    plan: dict[str, list[str]] = {w: [] for w in free if carried.get(w, 0) > 0}
    for seq in sequences:
        if not seq.ready:
            continue
        if seq.worker in live_set:
            target = seq.worker if seq.worker in free_set else None
        else:
            open_workers = [w for w in free if len(plan.get(w, [])) < room[w]]
            target = min(open_workers, key=lambda w: load[w], default=None)
            if target is not None:
                load[target] += 1
        if target is not None and len(plan.get(target, [])) < room[target]:
            plan.setdefault(target, []).append(seq.seq_id)
    return plan


# ----- the open sequences of one model version -------------------------------------------------


@dataclass
class _Sequence:
    seq_id: str
    created: float
    jobs: deque[Job] = field(default_factory=deque)
    worker: str | None = None
    running: int = 0  # its requests on its worker now (more than 1 only with continuous batching)
    idle_timer: asyncio.TimerHandle | None = None

    def live_jobs(self) -> int:
        while self.jobs and self.jobs[0].done:  # answered while queued (deadline)
            self.jobs.popleft()
        return sum(1 for job in self.jobs if not job.done)


class SequenceTable:
    """Open sequences, each with its own bounded queue; closed after ``sequenceMaxIdleMSec``.

    It also answers what the dispatcher asks of a job queue (``capacity``, ``len``,
    ``live_count``, ``fail_all``), so describe and drain see the requests waiting in sequences.
    """

    def __init__(self, settings: SequenceSettings) -> None:
        self.settings = settings
        self.continuous = settings.continuous
        self.capacity = settings.max_num_sequence * settings.max_sequence_job_queue_size
        self._open: dict[str, _Sequence] = {}  # insertion order: oldest first

    def __len__(self) -> int:
        return sum(len(seq.jobs) for seq in self._open.values())

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._open

    def live_count(self) -> int:
        return sum(seq.live_jobs() for seq in self._open.values())

    def admit(self, seq_id: str, job: Job) -> None:
        """Queue ``job`` on its sequence, opening the sequence if needed; raises when full."""
        seq = self._open.get(seq_id)
        now = time.monotonic()
        if seq is not None and self._timed_out(seq, now):
            raise BadRequest(f"Sequence {seq_id} has run past sequenceTimeoutMSec.")
        if seq is None:
            if len(self._open) >= self.settings.max_num_sequence:
                raise TooManyRequests(
                    f"{len(self._open)} sequences are open, the most this model takes "
                    "(maxNumSequence); retry later.",
                    headers={"Retry-After": "1"},
                )
            seq = self._open[seq_id] = _Sequence(seq_id, now)
        if seq.live_jobs() >= self.settings.max_sequence_job_queue_size:
            raise TooManyRequests(
                f"Sequence {seq_id} already has {self.settings.max_sequence_job_queue_size} "
                "requests waiting (maxSequenceJobQueueSize); retry later.",
                headers={"Retry-After": "1"},
            )
        arm_deadline(job)
        seq.jobs.append(job)
        self._stop_idle_clock(seq)
        # However the job ends (answered, or expired while queued), an idle sequence starts its
        # idle clock then: a sequence whose jobs all expired must not stay open forever.
        job.future.add_done_callback(lambda _: self._maybe_idle(seq_id))

    def put(self, job: Job, *, front: bool = False) -> None:
        """Put back a job that was taken but never sent (its worker went away first)."""
        seq_id = job.item.headers[SEQUENCE_ID_HEADER]
        seq = self._open.get(seq_id)
        if seq is None:
            seq = self._open[seq_id] = _Sequence(seq_id, time.monotonic())
        arm_deadline(job)
        if front:
            seq.jobs.appendleft(job)
        else:
            seq.jobs.append(job)
        self._stop_idle_clock(seq)

    def views(self) -> list[SequenceView]:
        return [
            SequenceView(
                seq.seq_id,
                seq.worker,
                (self.continuous or not seq.running) and seq.live_jobs() > 0,
            )
            for seq in self._open.values()
        ]

    def take(self, seq_id: str, worker: str) -> Job | None:
        """The next live job of a sequence, which now runs on (and is bound to) ``worker``."""
        seq = self._open[seq_id]
        while seq.jobs:
            job = seq.jobs.popleft()
            if not job.done:
                seq.worker = worker
                seq.running += 1
                return job
        return None

    def finished(self, seq_id: str) -> None:
        """A sequence's running request was answered (or failed)."""
        seq = self._open.get(seq_id)
        if seq is not None:
            seq.running = max(0, seq.running - 1)
            self._maybe_idle(seq_id)

    def end(self, seq_id: str, error: ServeError) -> None:
        """Close a sequence now (its handler ended it); what still waits in it gets ``error``.

        Its requests already on the worker go on until the handler completes them.
        """
        seq = self._open.get(seq_id)
        if seq is None:
            return
        while seq.jobs:
            seq.jobs.popleft().fail(error)
        self._close(seq_id)

    def _maybe_idle(self, seq_id: str) -> None:
        seq = self._open.get(seq_id)
        if seq is not None and seq.running == 0 and seq.live_jobs() == 0:
            self._start_idle_clock(seq)

    def fail_all(self, error: ServeError) -> None:
        for seq in list(self._open.values()):
            while seq.jobs:
                seq.jobs.popleft().fail(error)
            self._close(seq.seq_id)

    def _timed_out(self, seq: _Sequence, now: float) -> bool:
        limit = self.settings.sequence_timeout_msec
        return bool(limit) and (now - seq.created) * 1000.0 > limit

    def _start_idle_clock(self, seq: _Sequence) -> None:
        self._stop_idle_clock(seq)
        delay = self.settings.sequence_max_idle_msec / 1000.0
        seq.idle_timer = asyncio.get_running_loop().call_later(delay, self._close_idle, seq.seq_id)

    def _stop_idle_clock(self, seq: _Sequence) -> None:
        if seq.idle_timer is not None:
            seq.idle_timer.cancel()
            seq.idle_timer = None

    def _close_idle(self, seq_id: str) -> None:
        seq = self._open.get(seq_id)
        if seq is not None and seq.running == 0 and seq.live_jobs() == 0:
            logger.debug(
                "Sequence %s closed after %d ms idle", seq_id, self.settings.sequence_max_idle_msec
            )
            self._close(seq_id)

    def _close(self, seq_id: str) -> None:
        seq = self._open.pop(seq_id, None)
        if seq is not None:
            self._stop_idle_clock(seq)


# ----- the dispatcher of a model with sequences --------------------------------------------------


class SequenceDispatcher(Dispatcher):
    """`Dispatcher` for ``sequenceBatching`` models: requests queue per sequence (the
    ``ts_request_sequence_id`` header, or a fresh ``ts-seq-<uuid>`` returned to the client in the
    same header), and `plan_sequence_batches` keeps each sequence in order on one worker.

    A request that was running on a worker that died is not retried: the sequence's state was in
    that worker. Its sequence stays bound to the worker slot, which restarts.

    With continuous batching, a request whose answer was partial (``ts_stream_next: true``) is
    *carried*: its answer so far went to the client as a chunk, and it goes back to the same
    worker in every next batch, with no input, until its answer is complete.
    """

    def __init__(
        self,
        name: str,
        version: str,
        source: WorkerSource,
        settings: Callable[[], ModelSettings],
        sequences: SequenceSettings,
        *,
        on_outcome: Callable[[list[Job], BatchOutcome], None] | None = None,
    ) -> None:
        super().__init__(name, version, source, settings, on_outcome=on_outcome)
        self.table = SequenceTable(sequences)
        # SequenceTable has the JobQueue surface the dispatcher uses; no common type yet.
        self.queue = self.table  # type: ignore[assignment]
        # Continuous batching. Per worker: its carried requests, in the order they came.
        self._carried: dict[str, list[Job]] = {}
        # Jobs (by id) the last batch answered in part, and sequences its answers ended; both
        # filled by `_resolve` and emptied by `_run` with no await in between.
        self._partial: set[int] = set()
        self._ended: list[str] = []
        self._sent: set[int] = set()  # ids of the carried jobs, wherever they are now
        self._none_carried = asyncio.Event()  # set while ``_sent`` is empty (drain waits on it)
        self._none_carried.set()
        self._cut_carried = False  # set by drain once its time is up: carry nothing more

    def submit(self, item: BatchItem, timeout: float | None = None) -> asyncio.Future[ItemResult]:
        if self.closing:
            raise ShuttingDown(f'Model "{self.name}" version {self.version} is being unloaded.')
        if not self.source.can_serve():
            raise self.no_workers()
        seq_id = _header(item.headers, SEQUENCE_ID_HEADER)
        if not seq_id:
            seq_id = f"ts-seq-{uuid.uuid4()}"
            item.headers[SEQUENCE_START_HEADER] = "true"
        item.headers[SEQUENCE_ID_HEADER] = seq_id
        now = time.monotonic()
        limit = self._settings().response_timeout
        if timeout is not None:
            limit = min(limit, timeout)
        future: asyncio.Future[ItemResult] = asyncio.get_running_loop().create_future()
        self.table.admit(seq_id, Job(item, future, now, now + limit))
        self.in_flight += 1
        self._idle.clear()
        future.add_done_callback(self._request_done)
        self.schedule()
        return future

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        if not self.source.can_serve():
            # No worker runs or will: what waits in sequences would only wait for its deadline.
            self.fail_queued(self.no_workers())
            return
        workers = self.source.workers()
        free = {w.worker_id: w for w in workers if w.state == WorkerState.READY}
        live = [w.worker_id for w in workers if w.state in LIVE_STATES]
        self._fail_carried_off(live)
        carried = (
            {w: len(jobs) for w, jobs in self._carried.items()} if self.table.continuous else None
        )
        plan = plan_sequence_batches(
            self.table.views(), list(free), live, self._settings().batch_size, carried
        )
        for worker_id, seq_ids in plan.items():
            jobs = self._carried.pop(worker_id, [])
            jobs += [job for s in seq_ids if (job := self.table.take(s, worker_id)) is not None]
            if not jobs:
                continue
            worker = free[worker_id]
            worker.state = WorkerState.BUSY
            task = asyncio.create_task(self._run(worker, jobs))
            self._batch_tasks.add(task)
            task.add_done_callback(self._batch_tasks.discard)

    async def _run(self, worker: Worker, jobs: list[Job]) -> None:
        if worker.state != WorkerState.BUSY:
            # Never sent: new jobs go back to their sequences (below); carried ones were in the
            # worker, which is gone, and so is their state.
            for job in jobs:
                if id(job) in self._sent:
                    self._end_carried(job, worker)
            jobs = [job for job in jobs if id(job) not in self._sent]
        try:
            await super()._run(worker, jobs)
        finally:
            ended, self._ended = self._ended, []
            for job in jobs:
                if id(job) not in self._partial:
                    self._finish(job)
                elif self._cut_carried:
                    self._finish(job, ShuttingDown("The model was unloaded before it completed."))
                else:
                    # Sent again with its headers only, as TorchServe re-sends a request
                    # whose answer goes on (the handler keeps its input).
                    job.item = BatchItem(job.item.request_id, job.item.headers, [])
                    job.arrived = time.monotonic()  # its queue wait for the next step starts now
                    self._carried.setdefault(worker.worker_id, []).append(job)
                    self._sent.add(id(job))
                    self._none_carried.clear()
                self._partial.discard(id(job))
            for seq_id in ended:
                self.table.end(
                    seq_id,
                    Conflict(
                        f"Sequence {seq_id} was ended by the model's handler before this "
                        "request ran; start a new sequence."
                    ),
                )
            if self._carried:
                self.schedule()

    def _resolve(self, job: Job, result: ItemResult) -> None:
        # The client learns the id of a sequence the server opened for it (TorchServe's REST
        # answer leaves that to the handler; its gRPC answer carries it).
        result.headers.setdefault(SEQUENCE_ID_HEADER, job.item.headers[SEQUENCE_ID_HEADER])
        if self.table.continuous:
            ended = _header(result.headers, SEQUENCE_END_HEADER)
            if ended:
                self._ended.extend(s.strip() for s in ended.split(";") if s.strip())
            if (_header(result.headers, STREAM_NEXT_HEADER) or "").lower() == "true":
                self._partial.add(id(job))
                job.push_chunk(result)
                return
        super()._resolve(job, result)

    def _fail_carried_off(self, live: Sequence[str]) -> None:
        """Carried requests of a worker that left service can never complete: answer them."""
        for worker_id in [w for w in self._carried if w not in live]:
            for job in self._carried.pop(worker_id):
                self._end_carried(job, None)

    def fail_queued(self, error: ServeError) -> None:
        super().fail_queued(error)
        carried, self._carried = self._carried, {}
        for jobs in carried.values():
            for job in jobs:
                self._finish(job, error)

    async def drain(self, timeout: float) -> None:
        """As `Dispatcher.drain`, and carried requests may complete within ``timeout`` too."""
        self.closing = True
        loop = asyncio.get_running_loop()
        start = loop.time()
        if self._sent:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._none_carried.wait(), timeout)
        self._cut_carried = True
        await super().drain(max(0.0, timeout - (loop.time() - start)))

    def _end_carried(self, job: Job, worker: Worker | None) -> None:
        where = f"Worker {worker.worker_id}" if worker is not None else "Its worker"
        self._finish(job, WorkerDied(f"{where} left before request {job.item.request_id} ended."))

    def _finish(self, job: Job, error: ServeError | None = None) -> None:
        """A job leaves the worker for good (answered already, or now with ``error``)."""
        if error is not None:
            job.fail(error)
        self._sent.discard(id(job))
        if not self._sent:
            self._none_carried.set()
        self.table.finished(job.item.headers[SEQUENCE_ID_HEADER])

    def _retry_or_fail(self, jobs: list[Job], dead: Worker) -> None:
        for job in jobs:
            job.fail(
                WorkerDied(
                    f"Worker died while processing request {job.item.request_id} of sequence "
                    f"{job.item.headers[SEQUENCE_ID_HEADER]}; its state was lost."
                )
            )


def make_dispatcher(
    name: str,
    version: str,
    source: WorkerSource,
    settings: Callable[[], ModelSettings],
    sequences: SequenceSettings,
    *,
    on_outcome: Callable[[list[Job], BatchOutcome], None] | None = None,
) -> Dispatcher:
    """A `SequenceDispatcher` for a model with sequence batching, else a plain `Dispatcher`."""
    if sequences.enabled:
        return SequenceDispatcher(name, version, source, settings, sequences, on_outcome=on_outcome)
    return Dispatcher(name, version, source, settings, on_outcome=on_outcome)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value.strip() if isinstance(value, str) and value.strip() else None
