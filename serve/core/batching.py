"""Jobs waiting for a worker, and the rule that turns them into batches.

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

from serve.core.jobs import Job
from serve.wire.errors import GatewayTimeout, ServeError, TooManyRequests


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
