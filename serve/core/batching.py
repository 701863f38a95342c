"""Plain dynamic batching: the job queue, the rule that turns it into batches, and the policy.

The queue is per model version and bounded. A free worker takes the oldest jobs. When several
workers are free the waiting jobs are spread over them (TorchServe hands everything to one worker).
A batch that is not full waits for more jobs only while another worker of the model is busy, and
never past ``max_batch_delay`` counted from the oldest job's arrival: a lone request on an
idle model is dispatched on the next event-loop tick instead of waiting the whole delay.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Sequence

from serve.config import ModelSettings
from serve.core.jobs import Job, WorkerState
from serve.core.placement import Answer, Plan, WorkerView
from serve.wire.errors import GatewayTimeout, ServeError, TooManyRequests, WorkerDied


class JobQueue:
    """A bounded FIFO of jobs whose deadlines are enforced by timers, not polling."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._jobs: deque[Job] = deque()

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: Job, *, front: bool = False) -> None:
        if not front and len(self._jobs) >= self.capacity:
            self._jobs = deque(j for j in self._jobs if not j.done)  # cancelled ones hold no slot
        if not front and len(self._jobs) >= self.capacity:
            raise TooManyRequests("Model queue is full; retry later.", headers={"Retry-After": "1"})
        arm_deadline(job)
        if front:
            self._jobs.appendleft(job)
        else:
            self._jobs.append(job)

    def oldest_arrival(self) -> float | None:
        self._drop_done()
        return self._jobs[0].arrived if self._jobs else None

    def take(self, count: int) -> list[Job]:
        batch: list[Job] = []
        while self._jobs and len(batch) < count:
            job = self._jobs.popleft()
            if not job.done:  # answered already: expired while queued
                batch.append(job)
        return batch

    def live_count(self) -> int:
        self._drop_done()
        return sum(1 for job in self._jobs if not job.done)

    def fail_all(self, error: ServeError) -> None:
        while self._jobs:
            self._jobs.popleft().fail(error)

    def _drop_done(self) -> None:
        while self._jobs and self._jobs[0].done:
            self._jobs.popleft()


def arm_deadline(job: Job) -> None:
    """Start ``job``'s deadline timer (once): past it, the job is answered 504."""
    if job.timer is None:
        loop = asyncio.get_running_loop()
        job.timer = loop.call_at(
            loop.time() + max(0.0, job.deadline - time.monotonic()), _expire, job
        )


def _expire(job: Job) -> None:
    job.timer = None
    if not job.future.done():
        job.future.set_exception(
            GatewayTimeout(f"Request {job.item.request_id} passed its deadline before completing.")
        )


def plan_batches(
    waiting: int,
    free_workers: int,
    busy_workers: int,
    batch_size: int,
    oldest_age: float,
    max_delay: float,
) -> tuple[list[int], float]:
    """How many jobs each free worker gets now, and how long to wait before asking again.

    Returns ``(sizes, wait)``: ``sizes`` has one entry per worker to dispatch to; when it is empty
    and ``wait`` > 0 the caller should look again after ``wait`` seconds.
    """
    if waiting == 0 or free_workers == 0:
        return [], 0.0
    if waiting < batch_size and busy_workers > 0 and oldest_age < max_delay:
        # More work is likely on its way while other workers are busy: let the batch fill.
        return [], max_delay - oldest_age
    per_worker = min(batch_size, math.ceil(waiting / free_workers))
    sizes: list[int] = []
    remaining = waiting
    while remaining > 0 and len(sizes) < free_workers:
        take = min(per_worker, remaining)
        sizes.append(take)
        remaining -= take
    return sizes, 0.0


def split_retries(jobs: Sequence[Job], now: float, allowed: bool) -> tuple[list[Job], list[Job]]:
    """The jobs of a dead worker that get one more try, and those that fail.

    A job is retried once at most, only while ``allowed`` (another live worker, not unloading),
    and only if unanswered (a streamed answer has begun: it cannot start over) and in time.
    """
    retry = [j for j in jobs if allowed and j.retries == 0 and not j.done and j.deadline > now]
    return retry, [j for j in jobs if j not in retry]


class BatchPlacement:
    """Dynamic batching: one bounded FIFO, spread over the free workers by `plan_batches`.

    A job on a worker that died is retried once on another live worker (`split_retries`).
    """

    def __init__(self, capacity: int) -> None:
        self.queue = JobQueue(capacity)
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self.queue)

    def live_count(self) -> int:
        return self.queue.live_count()

    def per_worker(self, settings: ModelSettings) -> int | None:
        return None

    def admit(self, job: Job) -> None:
        self.queue.put(job)

    def plan(self, workers: Sequence[WorkerView], now: float, settings: ModelSettings) -> Plan:
        free = [w.worker_id for w in workers if w.state is WorkerState.READY]
        busy = sum(1 for w in workers if w.state is WorkerState.BUSY)
        oldest = self.queue.oldest_arrival()
        sizes, wait = plan_batches(
            self.queue.live_count(),
            len(free),
            busy,
            settings.batch_size,
            now - oldest if oldest is not None else 0.0,
            settings.max_batch_delay / 1000.0,
        )
        plan = Plan(wait=wait)
        for worker_id, size in zip(free, sizes, strict=False):
            jobs = self.queue.take(size)
            if not jobs:
                break
            plan.batches.append((worker_id, jobs))
        return plan

    def put_back(self, worker_id: str, jobs: list[Job]) -> None:
        # The batch was never sent: back to the front, without using up a retry.
        for job in reversed(jobs):
            if not job.done:
                self.queue.put(job, front=True)

    def settle(self, worker_id: str, jobs: list[Job], answers: Sequence[Answer]) -> None:
        for job, answer in zip(jobs, answers, strict=True):
            if isinstance(answer, ServeError):
                job.fail(answer)
            else:
                job.resolve(answer)

    def lost(self, worker_id: str, jobs: list[Job], *, retry: bool) -> None:
        again, failed = split_retries(jobs, time.monotonic(), retry)
        for job in failed:
            job.fail(WorkerDied(f"Worker died while processing request {job.item.request_id}."))
        for job in reversed(again):
            job.retries += 1
            self.queue.put(job, front=True)

    def fail_waiting(self, error: ServeError) -> None:
        self.queue.fail_all(error)

    async def drain_carried(self, timeout: float) -> None:
        return None
