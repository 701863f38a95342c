"""Continuous batching (TorchServe 0.12's ``continuousBatching``): requests carried across steps.

A continuous-batching handler answers a request in steps: every ``handle`` call is one step
over the requests now on that worker (``context.request_ids``), its ``context.stopping_criteria``
says per row whether the answer is complete, and the worker marks an incomplete one
``ts_stream_next: true``. Such a partial answer goes to the client as a chunk and the request is
*carried*: it goes back to the same worker in its next batch, with its headers and no input (the
handler keeps what it needs in ``context.cache``), until an answer comes without that mark. New
requests join a worker's next step while it has room: at most ``batchSize`` requests per step,
carried ones included (TorchServe's batch quota is ``batchSize`` less the jobs it runs).

Two pieces live here: `CarriedJobs`, the bookkeeping of carried requests that this policy and the
sequence variant (`serve.core.sequences.SequencePlacement`) share, and `ContinuousPlacement`, the
policy of a model with ``continuousBatching`` and no ``sequenceBatching``, whose decision is the
pure `plan_continuous`.

One difference from TorchServe, on purpose: TorchServe keeps a request in the batch unless its
answer says ``ts_stream_next: false``, so a handler that sets no stopping criteria would be sent
the same request forever; here only ``ts_stream_next: true`` carries a request, and any other
answer completes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence

from serve.config import ModelSettings
from serve.core.batching import BatchPlacement, plan_batches
from serve.core.jobs import LIVE_STATES, BatchItem, Job, WorkerState
from serve.core.placement import Answer, Plan, WorkerView
from serve.core.slots import plan_slots
from serve.wire.errors import ServeError, ShuttingDown, WorkerDied

# A response header the worker sets from the handler's stopping criteria: "true" while the
# request's answer goes on (TorchServe's RequestInput.TS_STREAM_NEXT).
STREAM_NEXT_HEADER = "ts_stream_next"


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value, its name matched in any case; None when absent or blank."""
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value.strip() if isinstance(value, str) and value.strip() else None


def goes_on(headers: Mapping[str, str]) -> bool:
    """Whether an answer is partial (``ts_stream_next: true``): its request is carried."""
    return (header(headers, STREAM_NEXT_HEADER) or "").lower() == "true"


class CarriedJobs:
    """Requests whose answer goes on, per worker: waiting for its next batch, or running in it.

    A carried request's state is in its worker, so it can only ever go back to that worker; one
    whose worker left can never complete. `drain` lets carried requests end for a while, then
    `carry` refuses to carry any further.
    """

    def __init__(self) -> None:
        self.waiting: dict[str, list[Job]] = {}  # per worker, in the order they were carried
        self._held: set[int] = set()  # ids of every carried job, waiting or running
        self._none_held = asyncio.Event()  # set while ``_held`` is empty
        self._none_held.set()
        self._cut = False  # set once a drain's time is up

    def counts(self) -> dict[str, int]:
        """Per worker, how many carried requests go back to it in its next batch."""
        return {worker: len(jobs) for worker, jobs in self.waiting.items()}

    def holds(self, job: Job) -> bool:
        return id(job) in self._held

    def carry(self, worker_id: str, job: Job) -> bool:
        """Keep ``job`` for ``worker_id``'s next batch; False once a drain has cut carrying.

        It is sent again with its headers only, as TorchServe re-sends a request whose answer
        goes on (the handler kept its input), and its wait for the next step starts now.
        """
        if self._cut:
            return False
        job.item = BatchItem(job.item.request_id, job.item.headers, [])
        job.arrived = time.monotonic()
        self.waiting.setdefault(worker_id, []).append(job)
        self._held.add(id(job))
        self._none_held.clear()
        return True

    def take(self, worker_id: str) -> list[Job]:
        """The carried requests that go in ``worker_id``'s batch now (they stay held)."""
        return self.waiting.pop(worker_id, [])

    def orphans(self, live: Sequence[str]) -> list[Job]:
        """The waiting carried requests of workers no longer in service (taken out)."""
        gone = [worker for worker in self.waiting if worker not in live]
        return [job for worker in gone for job in self.waiting.pop(worker)]

    def take_all(self) -> list[Job]:
        everything, self.waiting = self.waiting, {}
        return [job for jobs in everything.values() for job in jobs]

    def release(self, job: Job) -> None:
        """``job`` left its worker for good."""
        self._held.discard(id(job))
        if not self._held:
            self._none_held.set()

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) for every carried request to end; then carry no more."""
        if self._held:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._none_held.wait(), timeout)
        self._cut = True


def plan_continuous(
    waiting: int,
    free: Sequence[tuple[str, int]],
    busy_workers: int,
    batch_size: int,
    oldest_age: float,
    max_delay: float,
) -> tuple[dict[str, int], float]:
    """Which free workers step now, and how many waiting requests join each one's step.

    ``free`` is (worker id, requests carried back to it) per worker that can take a batch. A
    worker with carried requests steps now, with or without new ones. New requests go, oldest
    first, each to the worker with the most room (``batch_size`` less its carried and newly
    given ones; the first of equals), so that load spreads; the rest wait. With nothing carried
    the batch waits to fill as plain batching's does (`plan_batches`): only while another worker
    is busy, and never past ``max_delay`` from the oldest arrival.

    Returns ``(new per stepping worker, wait)``; ``wait`` > 0: look again after it.
    """
    stepping = {worker: 0 for worker, carried in free if carried > 0}
    if not stepping:
        _, wait = plan_batches(waiting, len(free), busy_workers, batch_size, oldest_age, max_delay)
        if wait > 0 or waiting == 0 or not free:
            return {}, wait
    room = [(worker, batch_size - carried) for worker, carried in free]
    for worker in plan_slots(waiting, room):
        stepping[worker] = stepping.get(worker, 0) + 1
    return stepping, 0.0


class ContinuousPlacement(BatchPlacement):
    """``continuousBatching`` without sequences: one FIFO, steps per worker (`plan_continuous`).

    A request carried on a worker that died, or left service, fails (its state was there); one
    that died in its first step, before any part of its answer, is retried once elsewhere as in
    plain batching. A request answered meanwhile without a stream (it passed its deadline) is not
    carried: it leaves the batch, and the handler sees its id gone from the next step.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.carried = CarriedJobs()

    def plan(self, workers: Sequence[WorkerView], now: float, settings: ModelSettings) -> Plan:
        live = [w.worker_id for w in workers if w.state in LIVE_STATES]
        for job in self.carried.orphans(live):
            self._finish(job, WorkerDied(f"Its worker left before request {_rid(job)} ended."))
        counts = self.carried.counts()
        free = [
            (w.worker_id, counts.get(w.worker_id, 0))
            for w in workers
            if w.state is WorkerState.READY
        ]
        busy = sum(1 for w in workers if w.state is WorkerState.BUSY)
        oldest = self.queue.oldest_arrival()
        sizes, wait = plan_continuous(
            self.queue.live_count(),
            free,
            busy,
            settings.batch_size,
            now - oldest if oldest is not None else 0.0,
            settings.max_batch_delay / 1000.0,
        )
        plan = Plan(wait=wait)
        for worker_id, new in sizes.items():
            jobs = self.carried.take(worker_id) + (self.queue.take(new) if new else [])
            if jobs:
                plan.batches.append((worker_id, jobs))
        return plan

    def put_back(self, worker_id: str, jobs: list[Job]) -> None:
        carried = [job for job in jobs if self.carried.holds(job)]
        for job in carried:
            self._finish(
                job, WorkerDied(f"Worker {worker_id} left before request {_rid(job)} ended.")
            )
        super().put_back(worker_id, [job for job in jobs if not self.carried.holds(job)])

    def settle(self, worker_id: str, jobs: list[Job], answers: Sequence[Answer]) -> None:
        for job, answer in zip(jobs, answers, strict=True):
            if isinstance(answer, ServeError):
                self._finish(job, answer)
            elif not goes_on(answer.headers):
                job.resolve(answer)
                self._finish(job)
            elif job.done and job.stream is None:  # answered already (its deadline): it leaves
                self._finish(job)
            else:
                job.push_chunk(answer)
                if not self.carried.carry(worker_id, job):
                    self._finish(job, ShuttingDown("The model was unloaded before it completed."))

    def lost(self, worker_id: str, jobs: list[Job], *, retry: bool) -> None:
        fresh = [job for job in jobs if not self.carried.holds(job)]
        for job in jobs:
            if self.carried.holds(job):
                self._finish(
                    job,
                    WorkerDied(
                        f"Worker died while processing request {_rid(job)}; the state of its "
                        "unfinished answer was lost."
                    ),
                )
        super().lost(worker_id, fresh, retry=retry)

    def fail_waiting(self, error: ServeError) -> None:
        super().fail_waiting(error)
        for job in self.carried.take_all():
            self._finish(job, error)

    async def drain_carried(self, timeout: float) -> None:
        await self.carried.drain(timeout)

    def _finish(self, job: Job, error: ServeError | None = None) -> None:
        if error is not None:
            job.fail(error)
        self.carried.release(job)


def _rid(job: Job) -> str:
    return job.item.request_id
