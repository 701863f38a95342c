"""Queue -> batches -> workers for one model version: retries, deadlines and hard time limits.

The dispatcher knows nothing of processes. It sees its workers through two small protocols,
`Worker` (one worker: run a batch, be killed) and `WorkerSource` (the pool that owns them), so it
runs as well against in-process fakes as against `serve.worker.process.WorkerProcess`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from serve.config import ModelSettings
from serve.core.batching import JobQueue, plan_batches
from serve.core.jobs import LIVE_STATES, BatchItem, BatchOutcome, ItemResult, Job, WorkerState
from serve.wire.errors import GatewayTimeout, NoHealthyWorkers, ServeError, ShuttingDown, WorkerDied

logger = logging.getLogger(__name__)


class Worker(Protocol):
    """One worker as the dispatcher drives it.

    The dispatcher sets ``state`` to BUSY when it hands the worker a batch and back to READY when
    the batch is answered (unless the worker has meanwhile become DEAD or STOPPING).
    """

    worker_id: str
    state: WorkerState

    async def run_batch(
        self,
        items: list[BatchItem],
        on_partial: Callable[[list[ItemResult]], None] | None = None,
    ) -> BatchOutcome:
        """Run one batch; raises `WorkerDied` if the worker dies before answering."""
        ...

    def kill(self) -> None:
        """End the worker now (it ran past its hard time limit)."""
        ...


class WorkerSource(Protocol):
    """The dispatcher's view of the pool that owns its workers."""

    def workers(self) -> list[Worker]:
        """The workers in service (started, not retiring), in any state."""
        ...

    def can_serve(self) -> bool:
        """Whether some worker serves now or will (one is starting or restarting)."""
        ...

    def batch_finished(self, worker: Worker) -> None:
        """Called after each batch, before the next dispatch (a retiring worker leaves here)."""
        ...


class Dispatcher:
    """Accepts jobs for one model version, batches them and runs the batches on its workers."""

    def __init__(
        self,
        name: str,
        version: str,
        source: WorkerSource,
        settings: Callable[[], ModelSettings],
        *,
        on_outcome: Callable[[list[Job], BatchOutcome], None] | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.source = source
        self._settings = settings
        self._on_outcome = on_outcome
        self.queue = JobQueue(settings().job_queue_size)
        self.closing = False
        self.in_flight = 0
        self._dispatch_pending = False
        self._delay_timer: asyncio.TimerHandle | None = None
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    # ----- accepting work ------------------------------------------------------------------

    def submit(self, item: BatchItem, timeout: float | None = None) -> asyncio.Future[ItemResult]:
        """Queue one request; raises at once when it cannot be served."""
        if self.closing:
            raise ShuttingDown(f'Model "{self.name}" version {self.version} is being unloaded.')
        if not self.source.can_serve():
            raise self.no_workers()
        now = time.monotonic()
        limit = self._settings().response_timeout
        if timeout is not None:
            limit = min(limit, timeout)
        future: asyncio.Future[ItemResult] = asyncio.get_running_loop().create_future()
        self.queue.put(Job(item, future, now, now + limit))
        self.in_flight += 1
        self._idle.clear()
        future.add_done_callback(self._request_done)
        self.schedule()
        return future

    def no_workers(self) -> NoHealthyWorkers:
        return NoHealthyWorkers(
            f'Model "{self.name}" has no worker to serve inference request. '
            "Please use scale workers API to add workers."
        )

    def fail_queued(self, error: ServeError) -> None:
        """Answer every queued job with ``error`` (running batches go on)."""
        self.queue.fail_all(error)

    def _request_done(self, _: asyncio.Future[ItemResult]) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    # ----- dispatching ---------------------------------------------------------------------

    def schedule(self) -> None:
        """Look for work to hand out on the next event-loop tick (idempotent)."""
        if not self._dispatch_pending:
            self._dispatch_pending = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        if not self.source.can_serve():
            # No worker runs or will: what is queued would only wait for its deadline.
            self.fail_queued(self.no_workers())
            return
        settings = self._settings()
        workers = self.source.workers()
        free = [w for w in workers if w.state == WorkerState.READY]
        busy = sum(1 for w in workers if w.state == WorkerState.BUSY)
        waiting = self.queue.live_count()
        oldest = self.queue.oldest_arrival()
        age = time.monotonic() - oldest if oldest is not None else 0.0
        sizes, wait = plan_batches(
            waiting,
            len(free),
            busy,
            settings.batch_size,
            age,
            settings.max_batch_delay / 1000.0,
        )
        if wait > 0:
            self._delay_timer = asyncio.get_running_loop().call_later(wait, self.schedule)
            return
        for worker, size in zip(free, sizes, strict=False):
            jobs = self.queue.take(size)
            if not jobs:
                break
            worker.state = WorkerState.BUSY
            task = asyncio.create_task(self._run(worker, jobs))
            self._batch_tasks.add(task)
            task.add_done_callback(self._batch_tasks.discard)

    async def _run(self, worker: Worker, jobs: list[Job]) -> None:
        if worker.state != WorkerState.BUSY:
            # It died (or began to stop) between dispatch and now: the batch was never sent,
            # so it goes back to the front of the queue without using up its retry.
            for job in reversed(jobs):
                if not job.done:
                    self.queue.put(job, front=True)
            self.source.batch_finished(worker)
            self.schedule()
            return
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for job in jobs:
            job.dispatched_at = now
        killed_for_time = False
        hard_limit = self._settings().effective_hard_timeout

        def kill_stuck() -> None:
            nonlocal killed_for_time
            killed_for_time = True
            logger.error(
                "Worker %s ran past its hard limit of %.1f s; killing it",
                worker.worker_id,
                hard_limit,
            )
            worker.kill()

        watchdog = loop.call_later(hard_limit, kill_stuck)
        try:
            outcome = await worker.run_batch(
                [job.item for job in jobs], lambda chunks: _deliver_chunks(jobs, chunks)
            )
        except WorkerDied:
            if killed_for_time:
                for job in jobs:
                    job.fail(
                        GatewayTimeout("The worker ran past its hard time limit and was restarted.")
                    )
            else:
                self._retry_or_fail(jobs, worker)
            return
        except Exception:  # a bug here must still answer the batch, and say so in the log
            logger.exception("Running a batch on worker %s failed", worker.worker_id)
            for job in jobs:
                job.fail(ServeError(f"Internal error running request {job.item.request_id}."))
            return
        finally:
            watchdog.cancel()
            if worker.state == WorkerState.BUSY:
                worker.state = WorkerState.READY
            self.source.batch_finished(worker)
            self.schedule()
        for job, result in zip(jobs, outcome.results, strict=True):
            if isinstance(result, ServeError):
                if result.status_code == 500:
                    result.message = (
                        f"{result.message} (request id {job.item.request_id}; "
                        "the traceback is in the model log)"
                    )
                job.fail(result)
            else:
                self._resolve(job, result)
        if self._on_outcome is not None:
            self._on_outcome(jobs, outcome)

    def _resolve(self, job: Job, result: ItemResult) -> None:
        """Answer one job with its worker's result (a subclass may add to the result first)."""
        job.resolve(result)

    def _retry_or_fail(self, jobs: list[Job], dead: Worker) -> None:
        """Jobs on a worker that died get one more try on another live worker, then an error.

        Without another live worker there is no retry: a request that kills its worker would
        otherwise kill the restarted one too. While unloading, nothing retries either.
        """
        now = time.monotonic()
        others = any(w is not dead and w.state in LIVE_STATES for w in self.source.workers())
        retry = [
            j
            for j in jobs
            if others and j.retries == 0 and not j.done and j.deadline > now and not self.closing
        ]
        for job in jobs:
            if job not in retry:
                job.fail(WorkerDied(f"Worker died while processing request {job.item.request_id}."))
        for job in reversed(retry):
            job.retries += 1
            self.queue.put(job, front=True)

    # ----- draining ------------------------------------------------------------------------

    async def drain(self, timeout: float) -> None:
        """Refuse new work, let queued and running work finish, then fail what is left."""
        self.closing = True
        self.schedule()
        if any(w.state in LIVE_STATES for w in self.source.workers()):
            # With no loaded worker, nothing queued would ever run: do not wait for it.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        self.fail_queued(ShuttingDown("The model was unloaded before the request ran."))


def _deliver_chunks(jobs: list[Job], chunks: list[ItemResult]) -> None:
    for job, chunk in zip(jobs, chunks, strict=False):
        job.push_chunk(chunk)
