"""Queue -> batches -> workers for one model version: retries, deadlines and hard time limits.

The dispatcher knows nothing of processes. It sees its workers through two small protocols,
`Worker` (one worker: run a batch, be killed) and `WorkerSource` (the pool that owns them), so it
runs as well against in-process fakes as against `serve.worker.process.WorkerProcess`. Which
waiting job goes to which worker is its `serve.core.placement.Placement` policy's to say: plain
batching, sequence affinity (and its continuous variant) or slots on a worker that runs many
requests at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from serve.config import ModelSettings
from serve.core.batching import BatchPlacement
from serve.core.jobs import LIVE_STATES, BatchItem, BatchOutcome, ItemResult, Job, WorkerState
from serve.core.placement import Answer, Placement, WorkerView
from serve.wire.errors import (
    GatewayTimeout,
    NoHealthyWorkers,
    ServeError,
    ShuttingDown,
    TooManyRequests,
    WorkerDied,
)

logger = logging.getLogger(__name__)


class Worker(Protocol):
    """One worker as the dispatcher drives it.

    The worker is the one writer of its ``state``. The dispatcher asks for BUSY when the worker
    can take no more work (it runs a batch, or all its slots) and for READY once it can again;
    `change_state` refuses what `serve.core.jobs.next_state` does not allow (a worker that began
    to stop or died meanwhile stays so).
    """

    worker_id: str

    @property
    def state(self) -> WorkerState: ...

    def change_state(self, wanted: WorkerState) -> bool:
        """Move to ``wanted`` if the state table allows it; whether the worker is in it now."""
        ...

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

    def workers(self) -> Sequence[Worker]:
        """The workers in service (started, not retiring), in any state."""
        ...

    def can_serve(self) -> bool:
        """Whether some worker serves now or will (one is starting or restarting)."""
        ...

    def batch_finished(self, worker: Worker) -> None:
        """Called after each batch, before the next dispatch (a retiring worker leaves here)."""
        ...


class Dispatcher:
    """Accepts jobs for one model version and runs them on its workers where ``placement`` says.

    Without a placement it batches plainly (`serve.core.batching.BatchPlacement`).
    """

    def __init__(
        self,
        name: str,
        version: str,
        source: WorkerSource,
        settings: Callable[[], ModelSettings],
        placement: Placement | None = None,
        *,
        on_outcome: Callable[[list[Job], BatchOutcome], None] | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.source = source
        self._settings = settings
        self._on_outcome = on_outcome
        if placement is None:  # not ``placement or``: an empty placement is falsy (its len)
            placement = BatchPlacement(settings().job_queue_size)
        self.placement = placement
        self.closing = False
        self.in_flight = 0
        self._running: dict[Worker, int] = {}  # jobs on each worker now
        self._dispatch_pending = False
        self._delay_timer: asyncio.TimerHandle | None = None
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queue(self) -> Placement:
        """The waiting jobs (its placement holds them): ``len``, ``live_count``, ``capacity``."""
        return self.placement

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
        job = Job(item, future, now, now + limit)
        try:
            self.placement.admit(job)
        except TooManyRequests:
            if not self._dispatch_pending:
                raise
            # A burst that arrives within one event-loop tick fills the queue before the
            # dispatch it scheduled has run (256 requests at once on a worker with 256 free
            # slots met a queue of 100): hand out what the workers can take now, then look again.
            self._dispatch()
            self.placement.admit(job)
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
        self.placement.fail_waiting(error)

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
        workers = {w.worker_id: w for w in self.source.workers()}
        views = [self._view(i, w) for i, w in workers.items()]
        plan = self.placement.plan(views, time.monotonic(), settings)
        if plan.wait > 0:
            self._delay_timer = asyncio.get_running_loop().call_later(plan.wait, self.schedule)
            return
        per_worker = self.placement.per_worker(settings)
        for worker_id, jobs in plan.batches:
            worker = workers[worker_id]
            running = self._running.get(worker, 0) + len(jobs)
            self._running[worker] = running
            if per_worker is None or running >= per_worker:
                worker.change_state(WorkerState.BUSY)
            task = asyncio.create_task(self._run(worker, jobs))
            self._batch_tasks.add(task)
            task.add_done_callback(self._batch_tasks.discard)

    def _view(self, worker_id: str, worker: Worker) -> WorkerView:
        running = self._running.get(worker, 0)
        # A generative worker says what its requests reserve (`WorkerProcess.reservations`);
        # a job it has not said for yet (or a worker that never says) is "unreported".
        reservations = getattr(worker, "reservations", None)
        reserved, reported = reservations() if callable(reservations) else (0, 0)
        expected = getattr(worker, "expected_reservation", None)
        return WorkerView(
            worker_id,
            worker.state,
            running,
            reserved,
            max(0, running - reported),
            expected() if callable(expected) else None,
        )

    async def _run(self, worker: Worker, jobs: list[Job]) -> None:
        if worker.state not in LIVE_STATES:
            # It died (or began to stop) between dispatch and now: the batch was never sent.
            self._release(worker, jobs)
            self.placement.put_back(worker.worker_id, jobs)
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

        async def send() -> BatchOutcome | None:
            # The task takes its first step a loop iteration from now: the worker may have died
            # in between, and then the batch is never sent (None).
            if worker.state not in LIVE_STATES:
                return None
            return await worker.run_batch(
                [job.item for job in jobs], lambda chunks: _deliver_chunks(jobs, chunks)
            )

        call = asyncio.ensure_future(send())
        cancelled_for_time = False
        cancelled = False  # by this dispatcher (not the task awaiting it)
        if getattr(self.placement, "cancels_requests", False):
            # A worker with slots drops one request (CANCEL) instead of being killed: when its
            # client leaves or its deadline passes, and past the hard limit.
            def cancel_if_gone(_: object = None) -> None:
                nonlocal cancelled
                if not call.done() and all(job.gone for job in jobs):
                    cancelled = True
                    call.cancel()

            def cancel_stuck() -> None:
                nonlocal cancelled_for_time, cancelled
                if call.done():
                    return
                cancelled_for_time = cancelled = True
                logger.error(
                    "A request on worker %s ran past its hard limit of %.1f s; cancelling it",
                    worker.worker_id,
                    hard_limit,
                )
                call.cancel()

            for job in jobs:
                job.on_abandon = cancel_if_gone
                job.future.add_done_callback(cancel_if_gone)
            watchdog = loop.call_later(hard_limit, cancel_stuck)
        else:
            watchdog = loop.call_later(hard_limit, kill_stuck)
        try:
            try:
                sent = await asyncio.shield(call)
            except asyncio.CancelledError:
                if not cancelled:  # the awaiting task itself is cancelled: so is the call
                    call.cancel()
                    raise
                raise _Cancelled() from None
            if sent is None:
                self.placement.put_back(worker.worker_id, jobs)
                return
            outcome = sent
        except _Cancelled:
            error = GatewayTimeout("The request ran past its hard time limit and was cancelled.")
            if not cancelled_for_time:
                error = GatewayTimeout("The request was cancelled (client gone or deadline).")
            self.placement.settle(worker.worker_id, jobs, [error for _ in jobs])
            return
        except WorkerDied:
            if killed_for_time:
                self.placement.settle(
                    worker.worker_id,
                    jobs,
                    [
                        GatewayTimeout("The worker ran past its hard time limit and was restarted.")
                        for _ in jobs
                    ],
                )
            else:
                self.placement.lost(worker.worker_id, jobs, retry=self._may_retry(worker))
            return
        except Exception:  # a bug here must still answer the batch, and say so in the log
            logger.exception("Running a batch on worker %s failed", worker.worker_id)
            errors = [
                ServeError(f"Internal error running request {j.item.request_id}.") for j in jobs
            ]
            self.placement.settle(worker.worker_id, jobs, errors)
            return
        finally:
            watchdog.cancel()
            self._release(worker, jobs)
            self.source.batch_finished(worker)
            self.schedule()
        self.placement.settle(worker.worker_id, jobs, _answers(jobs, outcome.results))
        if self._on_outcome is not None:
            self._on_outcome(jobs, outcome)

    def _release(self, worker: Worker, jobs: list[Job]) -> None:
        """``jobs`` left ``worker``: it takes work again if it has room (and is in service)."""
        left = self._running.pop(worker, 0) - len(jobs)
        if left > 0:
            self._running[worker] = left
        per_worker = self.placement.per_worker(self._settings())
        room = left == 0 if per_worker is None else left < per_worker
        if room and worker.state is WorkerState.BUSY:
            worker.change_state(WorkerState.READY)

    def _may_retry(self, dead: Worker) -> bool:
        """Whether the jobs of a dead worker may try once more elsewhere.

        Without another live worker there is no retry: a request that kills its worker would
        otherwise kill the restarted one too. While unloading, nothing retries either.
        """
        others = any(w is not dead and w.state in LIVE_STATES for w in self.source.workers())
        return others and not self.closing

    # ----- draining ------------------------------------------------------------------------

    async def drain(self, timeout: float) -> None:
        """Refuse new work, let queued and running work finish, then fail what is left.

        Requests the policy carries from batch to batch (continuous batching) may end within
        ``timeout`` too; after it, they are cut.
        """
        self.closing = True
        loop = asyncio.get_running_loop()
        start = loop.time()
        await self.placement.drain_carried(timeout)
        self.schedule()
        if any(w.state in LIVE_STATES for w in self.source.workers()):
            # With no loaded worker, nothing queued would ever run: do not wait for it.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), max(0.0, timeout - (loop.time() - start)))
        self.fail_queued(ShuttingDown("The model was unloaded before the request ran."))


class _Cancelled(Exception):
    """This dispatcher cancelled a worker call: its requests are gone or past the hard limit."""


def _answers(jobs: list[Job], results: list[ItemResult | ServeError]) -> list[Answer]:
    """A worker's results, its errors told which request they were and where the traceback is."""
    for job, result in zip(jobs, results, strict=True):
        if isinstance(result, ServeError) and result.status_code == 500:
            result.message = (
                f"{result.message} (request id {job.item.request_id}; "
                "the traceback is in the model log)"
            )
    return results


def _deliver_chunks(jobs: list[Job], chunks: list[ItemResult]) -> None:
    for job, chunk in zip(jobs, chunks, strict=False):
        job.push_chunk(chunk)
