"""Sequence batching for stateful models (TorchServe 0.11+): the settings and their checks.

A model with ``sequenceBatching: true`` in its model-config.yaml serves *sequences*: requests that
carry the same sequence id (the ``ts_request_sequence_id`` header; a request without one starts a
new sequence under a fresh id) are run one at a time, in arrival order, on the one worker the
sequence was given, so a handler can keep the sequence's state in that worker's memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from serve.batching import _expire
from serve.config import ModelSettings
from serve.dispatcher import Dispatcher, Worker, WorkerSource
from serve.errors import BadRequest, ServeError, ShuttingDown, TooManyRequests, WorkerDied
from serve.jobs import LIVE_STATES, BatchItem, BatchOutcome, ItemResult, Job, WorkerState

logger = logging.getLogger(__name__)

# The request headers of a sequence, as TorchServe names them (its TS_REQUEST_SEQUENCE_* env
# variables rename them; its config.properties keys ts_header_key_sequence_* are not read).
SEQUENCE_ID_HEADER = os.environ.get("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
SEQUENCE_START_HEADER = os.environ.get("TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start")

# Settings of TorchServe 0.12 that Lantern does not implement: refused at registration, never
# silently ignored. (sequenceBatching + continuousBatching is TorchServe's "sequence continuous
# batching", whose handler keeps requests open across batches with stopping criteria.)
_UNSUPPORTED = {
    "continuousBatching": "continuous batching (and sequence continuous batching)",
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
        )


def check_supported_settings(values: Mapping[str, Any]) -> None:
    """Raise `BadRequest` for a model-config setting Lantern would otherwise have to ignore."""
    for key, what in _UNSUPPORTED.items():
        if _flag(values, key):
            raise BadRequest(
                f"{key}: true is not supported by Lantern ({what}); remove it from the model's "
                "configuration (sequenceBatching alone is supported)."
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
    ready: bool  # has a queued request and none running


def plan_sequence_batches(
    sequences: Sequence[SequenceView],
    free: Sequence[str],
    live: Sequence[str],
    batch_size: int,
) -> dict[str, list[str]]:
    """Which ready sequences send their next request to which free worker now.

    ``sequences`` oldest first; ``free``: workers that can take a batch now; ``live``: workers in
    service (free or busy). A sequence bound to a live worker only ever goes to that worker. A
    sequence that is unbound, or whose worker left service, goes to the free worker with the
    fewest sequences bound to it, and is bound there. A worker gets at most ``batch_size``
    sequences, one request of each: requests of one sequence never share a batch or run at once.
    """
    live_set, free_set = set(live), set(free)
    load = {w: 0 for w in live}
    for seq in sequences:
        if seq.worker in load:
            load[seq.worker] += 1
    plan: dict[str, list[str]] = {}
    for seq in sequences:
        if not seq.ready:
            continue
        if seq.worker in live_set:
            target = seq.worker if seq.worker in free_set else None
        else:
            open_workers = [w for w in free if len(plan.get(w, [])) < batch_size]
            target = min(open_workers, key=lambda w: load[w], default=None)
            if target is not None:
                load[target] += 1
        if target is not None and len(plan.get(target, [])) < batch_size:
            plan.setdefault(target, []).append(seq.seq_id)
    return plan


# ----- the open sequences of one model version -------------------------------------------------


@dataclass
class _Sequence:
    seq_id: str
    created: float
    jobs: deque[Job] = field(default_factory=deque)
    worker: str | None = None
    running: bool = False
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
        _arm_deadline(job)
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
        _arm_deadline(job)
        if front:
            seq.jobs.appendleft(job)
        else:
            seq.jobs.append(job)
        self._stop_idle_clock(seq)

    def views(self) -> list[SequenceView]:
        return [
            SequenceView(seq.seq_id, seq.worker, not seq.running and seq.live_jobs() > 0)
            for seq in self._open.values()
        ]

    def take(self, seq_id: str, worker: str) -> Job | None:
        """The next live job of a sequence, which now runs on (and is bound to) ``worker``."""
        seq = self._open[seq_id]
        while seq.jobs:
            job = seq.jobs.popleft()
            if not job.done:
                seq.worker, seq.running = worker, True
                return job
        return None

    def finished(self, seq_id: str) -> None:
        """A sequence's running request was answered (or failed)."""
        seq = self._open.get(seq_id)
        if seq is not None:
            seq.running = False
            self._maybe_idle(seq_id)

    def _maybe_idle(self, seq_id: str) -> None:
        seq = self._open.get(seq_id)
        if seq is not None and not seq.running and seq.live_jobs() == 0:
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
        if seq is not None and not seq.running and seq.live_jobs() == 0:
            logger.debug(
                "Sequence %s closed after %d ms idle", seq_id, self.settings.sequence_max_idle_msec
            )
            self._close(seq_id)

    def _close(self, seq_id: str) -> None:
        seq = self._open.pop(seq_id, None)
        if seq is not None:
            self._stop_idle_clock(seq)


def _arm_deadline(job: Job) -> None:
    """The job's deadline timer, as `serve.batching.JobQueue.put` sets it."""
    if job.timer is None:
        loop = asyncio.get_running_loop()
        job.timer = loop.call_at(
            loop.time() + max(0.0, job.deadline - time.monotonic()), _expire, job
        )


# ----- the dispatcher of a model with sequences --------------------------------------------------


class SequenceDispatcher(Dispatcher):
    """`Dispatcher` for ``sequenceBatching`` models: requests queue per sequence (the
    ``ts_request_sequence_id`` header, or a fresh ``ts-seq-<uuid>`` returned to the client in the
    same header), and `plan_sequence_batches` keeps each sequence in order on one worker.

    A request that was running on a worker that died is not retried: the sequence's state was in
    that worker. Its sequence stays bound to the worker slot, which restarts.
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
        self.queue = self.table  # type: ignore[assignment]  (the JobQueue surface it needs)

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
        plan = plan_sequence_batches(
            self.table.views(), list(free), live, self._settings().batch_size
        )
        for worker_id, seq_ids in plan.items():
            jobs = [job for s in seq_ids if (job := self.table.take(s, worker_id)) is not None]
            if not jobs:
                continue
            worker = free[worker_id]
            worker.state = WorkerState.BUSY
            task = asyncio.create_task(self._run(worker, jobs))
            self._batch_tasks.add(task)
            task.add_done_callback(self._batch_tasks.discard)

    async def _run(self, worker: Worker, jobs: list[Job]) -> None:
        try:
            await super()._run(worker, jobs)
        finally:
            for job in jobs:
                self.table.finished(job.item.headers[SEQUENCE_ID_HEADER])

    def _resolve(self, job: Job, result: ItemResult) -> None:
        # The client learns the id of a sequence the server opened for it (TorchServe's REST
        # answer leaves that to the handler; its gRPC answer carries it).
        result.headers.setdefault(SEQUENCE_ID_HEADER, job.item.headers[SEQUENCE_ID_HEADER])
        super()._resolve(job, result)

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
