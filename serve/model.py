"""One served model version: its settings, its worker processes and its batcher."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serve.batching import Job, JobQueue, plan_batches
from serve.config import Config, ModelSettings
from serve.devices import visible_gpus
from serve.errors import (
    GatewayTimeout,
    NoHealthyWorkers,
    ServeError,
    ShuttingDown,
    WorkerDied,
)
from serve.worker.process import (
    BatchItem,
    ItemResult,
    WorkerProcess,
    WorkerStartFailed,
    WorkerState,
)

if TYPE_CHECKING:
    from serve.metrics import ServerMetrics

logger = logging.getLogger(__name__)

# TorchServe's restart back-off, in seconds; capped by `worker_restart_max_backoff`.
_BACKOFF = (0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89)


@dataclass
class WorkerSlot:
    """A place for one worker; the supervisor keeps a live process in it."""

    index: int
    worker_id: str
    gpu_id: int | None
    process: WorkerProcess | None = None
    task: asyncio.Task[None] | None = None
    retiring: bool = False
    restarts: int = 0
    failures: int = 0
    last_error: str | None = None
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # loaded once, or failed
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # retired and its process gone
    gave_up: bool = False

    @property
    def state(self) -> WorkerState:
        if self.gave_up:
            return WorkerState.DEAD
        if self.process is None:
            return WorkerState.STARTING
        return self.process.state


@dataclass(frozen=True)
class ModelSource:
    """Where a model version came from and what its archive says."""

    url: str
    model_dir: Path
    manifest: dict[str, Any]
    model_config: dict[str, Any]
    handler: str | None  # an override of the manifest's handler
    runtime: str = "python"
    cleanup_dir: Path | None = None  # the folder we extracted into; None for a folder in place
    workflow: str | None = None  # the workflow this version is a node of, if any


class ModelVersion:
    """Accepts jobs for one model version, batches them and runs them on its workers."""

    def __init__(
        self,
        name: str,
        version: str,
        source: ModelSource,
        settings: ModelSettings,
        config: Config,
        socket_dir: Path,
        metrics: ServerMetrics | None = None,
        *,
        loaded_at_startup: bool = False,
    ) -> None:
        self.name = name
        self.version = version
        self.source = source
        self.settings = settings
        self.config = config
        self.socket_dir = socket_dir
        self.metrics = metrics
        self.loaded_at_startup = loaded_at_startup
        self.queue = JobQueue(settings.job_queue_size)
        self.slots: list[WorkerSlot] = []
        self.closing = False
        self.in_flight = 0
        self._next_index = 0
        self._dispatch_pending = False
        self._delay_timer: asyncio.TimerHandle | None = None
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        # Input/output metadata for the OIP and KServe routes, asked of a worker once.
        self.protocol_metadata: dict[str, Any] | None = None

    # ----- workers -------------------------------------------------------------------------

    @property
    def min_workers(self) -> int:
        return self.settings.min_workers or 0

    @property
    def max_workers(self) -> int:
        return max(self.settings.max_workers or 0, self.min_workers)

    def ready_workers(self) -> int:
        return sum(1 for s in self.slots if s.state in (WorkerState.READY, WorkerState.BUSY))

    def is_healthy(self) -> bool:
        return self.ready_workers() >= self.min_workers

    async def scale(self, min_workers: int, max_workers: int | None = None, *, wait: bool) -> None:
        """Run ``min_workers`` workers; with ``wait``, return once new ones are loaded (or failed)
        and retired ones are gone (a busy one finishes its batch first)."""
        if self.closing:
            raise ShuttingDown(f'Model "{self.name}" version {self.version} is being unloaded.')
        self.settings = self.settings.merged(
            {"min_workers": min_workers, "max_workers": max(max_workers or 0, min_workers)}
        )
        active = [s for s in self.slots if not s.retiring]
        for _ in range(min_workers - len(active)):
            self._add_slot()
        retired = active[min_workers:][::-1] if len(active) > min_workers else []
        for slot in retired:
            self._retire(slot)
        if min_workers == 0:
            # Nothing will ever take what is queued: answer it now, not at its deadline.
            self.queue.fail_all(self._no_workers())
        if wait:
            await self.wait_loaded()
            await asyncio.gather(*(s.stopped.wait() for s in retired))

    async def wait_loaded(self) -> None:
        """Wait until every slot has loaded once or given up; raises if none could start."""
        slots = [s for s in self.slots if not s.retiring]
        if slots:
            await asyncio.gather(*(s.settled.wait() for s in slots))
        failed = [s for s in slots if s.gave_up or (not s.loaded.is_set() and s.last_error)]
        if slots and len(failed) == len(slots):
            raise WorkerStartFailed(
                f'Failed to start workers for model "{self.name}" version {self.version}: '
                f"{failed[0].last_error}"
            )

    def _add_slot(self) -> WorkerSlot:
        index = self._next_index
        self._next_index += 1
        slot = WorkerSlot(index, f"{self.name}_{self.version}-w{index}", self._gpu_for(index))
        slot.task = asyncio.create_task(self._supervise(slot))
        # However the supervisor ends (even cancelled before its first start), waiters move on.
        slot.task.add_done_callback(lambda _: slot.settled.set())
        self.slots.append(slot)
        return slot

    def _retire(self, slot: WorkerSlot) -> None:
        """Take a slot out of service; a busy worker finishes its batch first."""
        slot.retiring = True
        slot.settled.set()
        proc = slot.process
        if proc is None or proc.state != WorkerState.BUSY:
            asyncio.create_task(self._stop_slot(slot))

    async def _stop_slot(self, slot: WorkerSlot) -> None:
        if slot in self.slots:
            self.slots.remove(slot)
        try:
            if slot.process is not None:
                await slot.process.stop()
            if slot.task is not None and not slot.task.done():
                slot.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await slot.task
        finally:
            slot.stopped.set()

    def _gpu_for(self, index: int) -> int | None:
        if (self.settings.device_type or "").lower() == "cpu":
            return None
        ids = self.settings.device_ids
        if not ids:
            count = visible_gpus(self.config.number_of_gpu)
            ids = list(range(count))
        return ids[index % len(ids)] if ids else None

    def worker_spec(self, slot: WorkerSlot) -> dict[str, Any]:
        return {
            "model_name": self.name,
            "model_version": self.version,
            "model_dir": str(self.source.model_dir),
            "manifest": self.source.manifest,
            "handler": self.source.handler,
            "batch_size": self.settings.batch_size,
            "gpu_id": slot.gpu_id,
            "num_threads": self.threads_per_worker(),
            "cpu_affinity": self._affinity(slot),
            "model_yaml_config": self.source.model_config,
            "limit_max_image_pixels": self.config.limit_max_image_pixels,
            "decode_input_request": self.config.decode_input_request,
            "log_level": self.config.log_level,
        }

    def threads_per_worker(self) -> int:
        if self.settings.num_threads:
            return self.settings.num_threads
        workers = max(1, self.max_workers, len([s for s in self.slots if not s.retiring]))
        return max(1, (os.cpu_count() or 1) // workers)

    def _affinity(self, slot: WorkerSlot) -> list[int] | None:
        enabled = self.settings.cpu_affinity
        if enabled is None:
            enabled = self.config.cpu_affinity
        if not enabled or not hasattr(os, "sched_getaffinity"):
            return None
        cpus = sorted(os.sched_getaffinity(0))
        per = self.threads_per_worker()
        start = (slot.index * per) % len(cpus)
        return [cpus[(start + i) % len(cpus)] for i in range(min(per, len(cpus)))]

    def _worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.config.blacklist_env_vars:
            import re

            pattern = re.compile(self.config.blacklist_env_vars)
            env = {k: v for k, v in env.items() if not pattern.fullmatch(k)}
        threads = str(self.threads_per_worker())
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env.setdefault(key, threads)
        # OpenMP threads otherwise spin after every operator, burning the cores the frontend
        # and the other workers need (measured: half the server CPU per request; bench/).
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def _supervise(self, slot: WorkerSlot) -> None:
        failing_since: float | None = None
        while not slot.retiring and not self.closing:
            proc = WorkerProcess(
                slot.worker_id,
                self.worker_spec(slot),
                self.socket_dir,
                env=self._worker_env(),
            )
            slot.process = proc
            try:
                await proc.start(self.settings.startup_timeout)
            except WorkerStartFailed as exc:
                slot.failures += 1
                slot.last_error = exc.message
                failing_since = failing_since or time.monotonic()
                slot.settled.set()
                logger.error("Worker %s failed to start: %s", slot.worker_id, exc.message)
                if time.monotonic() - failing_since > self.settings.max_retry_timeout_in_sec:
                    slot.gave_up = True
                    logger.error("Giving up on worker %s after repeated failures", slot.worker_id)
                    return
                await asyncio.sleep(self._backoff(slot.failures))
                continue
            failing_since = None
            slot.failures = 0
            slot.last_error = None
            slot.loaded.set()
            slot.settled.set()
            logger.info("Worker %s ready (pid %s)", slot.worker_id, proc.pid)
            self._schedule()
            code = await proc.wait_exit()
            if slot.retiring or self.closing:
                return
            slot.restarts += 1
            if self.metrics is not None:
                self.metrics.worker_restarted(self.name, self.version)
            logger.error(
                "Worker %s (pid %s) exited with code %s; restarting", slot.worker_id, proc.pid, code
            )
            await asyncio.sleep(self._backoff(slot.restarts - 1))

    def _backoff(self, attempt: int) -> float:
        step = _BACKOFF[min(max(attempt, 0), len(_BACKOFF) - 1)]
        return float(min(step, self.config.worker_restart_max_backoff))

    # ----- requests ------------------------------------------------------------------------

    def submit(self, item: BatchItem, timeout: float | None = None) -> asyncio.Future[ItemResult]:
        """Queue one request; raises at once when it cannot be served."""
        if self.closing:
            raise ShuttingDown(f'Model "{self.name}" version {self.version} is being unloaded.')
        if not any(s.state != WorkerState.DEAD and not s.retiring for s in self.slots):
            raise self._no_workers()
        now = time.monotonic()
        limit = self.settings.response_timeout
        if timeout is not None:
            limit = min(limit, timeout)
        future: asyncio.Future[ItemResult] = asyncio.get_running_loop().create_future()
        self.queue.put(Job(item, future, now, now + limit))
        self.in_flight += 1
        self._idle.clear()
        future.add_done_callback(self._request_done)
        self._schedule()
        return future

    def _no_workers(self) -> NoHealthyWorkers:
        return NoHealthyWorkers(
            f'Model "{self.name}" has no worker to serve inference request. '
            "Please use scale workers API to add workers."
        )

    def _request_done(self, _: asyncio.Future[ItemResult]) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def _schedule(self) -> None:
        if not self._dispatch_pending:
            self._dispatch_pending = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        free = [
            s
            for s in self.slots
            if not s.retiring and s.process is not None and s.process.state == WorkerState.READY
        ]
        busy = sum(1 for s in self.slots if s.state == WorkerState.BUSY)
        waiting = self.queue.live_count()
        oldest = self.queue.oldest_arrival()
        age = time.monotonic() - oldest if oldest is not None else 0.0
        sizes, wait = plan_batches(
            waiting,
            len(free),
            busy,
            self.settings.batch_size,
            age,
            self.settings.max_batch_delay / 1000.0,
        )
        if wait > 0:
            self._delay_timer = asyncio.get_running_loop().call_later(wait, self._schedule)
            return
        for slot, size in zip(free, sizes, strict=False):
            jobs = self.queue.take(size)
            if not jobs:
                break
            assert slot.process is not None
            slot.process.state = WorkerState.BUSY
            task = asyncio.create_task(self._run(slot, slot.process, jobs))
            self._batch_tasks.add(task)
            task.add_done_callback(self._batch_tasks.discard)

    async def _run(self, slot: WorkerSlot, proc: WorkerProcess, jobs: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for job in jobs:
            job.dispatched_at = now
        killed_for_time = False

        def kill_stuck() -> None:
            nonlocal killed_for_time
            killed_for_time = True
            logger.error(
                "Worker %s ran past its hard limit of %.1f s; killing it",
                slot.worker_id,
                self.settings.effective_hard_timeout,
            )
            proc.kill()

        watchdog = loop.call_later(self.settings.effective_hard_timeout, kill_stuck)
        try:
            outcome = await proc.run_batch(
                [job.item for job in jobs], lambda chunks: _deliver_chunks(jobs, chunks)
            )
        except WorkerDied:
            if killed_for_time:
                for job in jobs:
                    job.fail(
                        GatewayTimeout("The worker ran past its hard time limit and was restarted.")
                    )
            else:
                self._retry_or_fail(jobs, slot)
            return
        finally:
            watchdog.cancel()
            if proc.state == WorkerState.BUSY:
                proc.state = WorkerState.READY
            if slot.retiring:
                asyncio.create_task(self._stop_slot(slot))
            self._schedule()
        for job, result in zip(jobs, outcome.results, strict=True):
            if isinstance(result, ServeError):
                if result.status_code == 500:
                    result.message = (
                        f"{result.message} (request id {job.item.request_id}; "
                        "the traceback is in the model log)"
                    )
                job.fail(result)
            else:
                job.resolve(result)
        if self.metrics is not None:
            self.metrics.batch_done(self.name, self.version, jobs, outcome)

    def _retry_or_fail(self, jobs: list[Job], dead: WorkerSlot) -> None:
        """Jobs on a worker that died get one more try on another live worker, then an error.

        Without another live worker there is no retry: a request that kills its worker would
        otherwise kill the restarted one too. While unloading, nothing retries either.
        """
        now = time.monotonic()
        others = any(
            s is not dead and not s.retiring and s.state in (WorkerState.READY, WorkerState.BUSY)
            for s in self.slots
        )
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

    # ----- lifecycle -----------------------------------------------------------------------

    async def drain(self, timeout: float) -> None:
        """Refuse new work, let queued and running work finish, then fail what is left."""
        self.closing = True
        self._schedule()
        if self.ready_workers() > 0:  # with no loaded worker, nothing queued would ever run
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
        self.queue.fail_all(ShuttingDown("The model was unloaded before the request ran."))

    async def stop(self, grace: float = 5.0) -> None:
        self.closing = True
        slots, self.slots = self.slots, []
        for slot in slots:
            slot.retiring = True
        await asyncio.gather(*(self._stop_slot_now(s, grace) for s in slots))

    async def _stop_slot_now(self, slot: WorkerSlot, grace: float) -> None:
        try:
            if slot.task is not None and not slot.task.done():
                slot.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await slot.task
            if slot.process is not None:
                await slot.process.stop(grace)
        finally:
            slot.stopped.set()


def _deliver_chunks(jobs: list[Job], chunks: list[ItemResult]) -> None:
    for job, chunk in zip(jobs, chunks, strict=False):
        job.push_chunk(chunk)
