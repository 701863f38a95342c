"""Sequence batching for stateful models (TorchServe 0.11+): settings, open sequences, placement.

Here are the model-config settings and their checks (`SequenceSettings`), the open sequences of
one model version with their own queues and idle clocks (`SequenceTable`), the pure rule of which
sequence runs where (`plan_sequence_batches`) and the placement policy the one dispatcher runs
with for such a model (`SequencePlacement`; see `serve.core.placement`).

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
``;``-separated) closes those sequences. The carrying is shared with plain continuous batching
(``continuousBatching`` alone: `serve.core.continuous`).
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

from serve.config import ModelSettings
from serve.core.batching import arm_deadline
from serve.core.continuous import STREAM_NEXT_HEADER as STREAM_NEXT_HEADER
from serve.core.continuous import CarriedJobs, ContinuousPlacement, goes_on
from serve.core.continuous import header as _header
from serve.core.dispatcher import Dispatcher, WorkerSource
from serve.core.jobs import LIVE_STATES, BatchOutcome, Job, WorkerState
from serve.core.placement import Answer, Placement, Plan, WorkerView
from serve.core.slots import SlotPlacement
from serve.identifiers import MAX_SEQUENCE_ID, check_length
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
# Settings of TorchServe 0.12 that Lantern does not implement: refused at registration, never
# silently ignored.
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
    # continuousBatching: with sequences TorchServe's sequence continuous batching, alone plain
    # continuous batching (`serve.core.continuous`; the other fields are then 0).
    continuous: bool = False

    @classmethod
    def from_config(
        cls, values: Mapping[str, Any], batch_size: int, max_workers: int
    ) -> SequenceSettings:
        """The settings in a model-config.yaml mapping, with TorchServe's rules applied."""
        check_supported_settings(values)
        if not _flag(values, "sequenceBatching"):
            return cls(continuous=_flag(values, "continuousBatching"))
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

    ``capacity``, ``len`` and ``live_count`` count the requests waiting in all sequences (the
    placement answers describe and admission with them).
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


# ----- the placement policy of a model with sequences -------------------------------------------


class SequencePlacement:
    """Sequence affinity for ``sequenceBatching`` models: requests queue per sequence (the
    ``ts_request_sequence_id`` header, or a fresh ``ts-seq-<uuid>`` returned to the client in the
    same header), and `plan_sequence_batches` keeps each sequence in order on one worker.

    A request that was running on a worker that died is not retried: the sequence's state was in
    that worker. Its sequence stays bound to the worker slot, which restarts.

    With continuous batching, a request whose answer was partial (``ts_stream_next: true``) is
    *carried*: its answer so far went to the client as a chunk, and it goes back to the same
    worker in every next batch, with no input, until its answer is complete.
    """

    def __init__(self, settings: SequenceSettings) -> None:
        self.table = SequenceTable(settings)
        self.capacity = self.table.capacity
        self.continuous = settings.continuous
        self.carried = CarriedJobs()  # continuous batching: the requests carried per worker

    def __len__(self) -> int:
        return len(self.table)

    def live_count(self) -> int:
        return self.table.live_count()

    def per_worker(self, settings: ModelSettings) -> int | None:
        return None

    def admit(self, job: Job) -> None:
        headers = job.item.headers
        seq_id = _header(headers, SEQUENCE_ID_HEADER)
        check_length(seq_id or "", "sequence id", MAX_SEQUENCE_ID)
        if not seq_id:
            seq_id = f"ts-seq-{uuid.uuid4()}"
            headers[SEQUENCE_START_HEADER] = "true"
        headers[SEQUENCE_ID_HEADER] = seq_id
        self.table.admit(seq_id, job)

    def plan(self, workers: Sequence[WorkerView], now: float, settings: ModelSettings) -> Plan:
        free = [w.worker_id for w in workers if w.state is WorkerState.READY]
        live = [w.worker_id for w in workers if w.state in LIVE_STATES]
        for orphan in self.carried.orphans(live):  # carried on a worker that left: never ends
            rid = orphan.item.request_id
            self._finish(orphan, WorkerDied(f"Its worker left before request {rid} ended."))
        carried = self.carried.counts() if self.continuous else None
        chosen = plan_sequence_batches(self.table.views(), free, live, settings.batch_size, carried)
        plan = Plan()
        for worker_id, seq_ids in chosen.items():
            jobs = self.carried.take(worker_id)
            jobs += [job for s in seq_ids if (job := self.table.take(s, worker_id)) is not None]
            if jobs:
                plan.batches.append((worker_id, jobs))
        return plan

    def put_back(self, worker_id: str, jobs: list[Job]) -> None:
        # New jobs go back to their sequences; carried ones were in the worker, which is gone,
        # and so is their state.
        carried = [job for job in jobs if self.carried.holds(job)]
        fresh = [job for job in jobs if not self.carried.holds(job)]
        for job in carried:
            rid = job.item.request_id
            self._finish(job, WorkerDied(f"Worker {worker_id} left before request {rid} ended."))
        for job in reversed(fresh):
            if not job.done:
                self.table.put(job, front=True)
        for job in fresh:
            self._finish(job)

    def settle(self, worker_id: str, jobs: list[Job], answers: Sequence[Answer]) -> None:
        ended: list[str] = []
        for job, answer in zip(jobs, answers, strict=True):
            if isinstance(answer, ServeError):
                self._finish(job, answer)
                continue
            # The client learns the id of a sequence the server opened for it (TorchServe's REST
            # answer leaves that to the handler; its gRPC answer carries it).
            answer.headers.setdefault(SEQUENCE_ID_HEADER, job.item.headers[SEQUENCE_ID_HEADER])
            if self.continuous:
                ended += _ended_sequences(answer.headers)
                if goes_on(answer.headers):
                    job.push_chunk(answer)
                    if not self.carried.carry(worker_id, job):
                        self._finish(
                            job, ShuttingDown("The model was unloaded before it completed.")
                        )
                    continue
            job.resolve(answer)
            self._finish(job)
        for seq_id in ended:
            self.table.end(
                seq_id,
                Conflict(
                    f"Sequence {seq_id} was ended by the model's handler before this "
                    "request ran; start a new sequence."
                ),
            )

    def lost(self, worker_id: str, jobs: list[Job], *, retry: bool) -> None:
        for job in jobs:
            self._finish(
                job,
                WorkerDied(
                    f"Worker died while processing request {job.item.request_id} of sequence "
                    f"{job.item.headers[SEQUENCE_ID_HEADER]}; its state was lost."
                ),
            )

    def fail_waiting(self, error: ServeError) -> None:
        self.table.fail_all(error)
        for job in self.carried.take_all():
            self._finish(job, error)

    async def drain_carried(self, timeout: float) -> None:
        await self.carried.drain(timeout)

    def _finish(self, job: Job, error: ServeError | None = None) -> None:
        """A job leaves the worker for good (answered already, or now with ``error``)."""
        if error is not None:
            job.fail(error)
        self.carried.release(job)
        self.table.finished(job.item.headers[SEQUENCE_ID_HEADER])


def make_dispatcher(
    name: str,
    version: str,
    source: WorkerSource,
    settings: Callable[[], ModelSettings],
    sequences: SequenceSettings,
    *,
    on_outcome: Callable[[list[Job], BatchOutcome], None] | None = None,
    many_at_once: bool = False,
) -> Dispatcher:
    """The dispatcher of a model version: slot placement for workers that run many requests at
    once (`serve.core.slots.runs_many_at_once`), sequence placement with sequence batching,
    continuous placement with continuous batching alone, else plain batching."""
    placement: Placement | None = None
    if many_at_once:
        # Many requests in flight per worker, up to the budget it reports in LOADED.
        placement = SlotPlacement(settings().job_queue_size)
    elif sequences.enabled:
        placement = SequencePlacement(sequences)
    elif sequences.continuous:
        placement = ContinuousPlacement(settings().job_queue_size)
    return Dispatcher(name, version, source, settings, placement, on_outcome=on_outcome)


def _ended_sequences(headers: Mapping[str, str]) -> list[str]:
    """The sequences a ``ts_request_sequence_end`` response header closes."""
    ended = _header(headers, SEQUENCE_END_HEADER)
    return [s.strip() for s in ended.split(";") if s.strip()] if ended else []
