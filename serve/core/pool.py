"""The worker pool of one model version: spawn workers, watch them, restart them with back-off.

A `WorkerSlot` is a place for one worker; its supervisor task keeps a live worker in it, starting
a replacement when one exits. The pool builds workers through a factory, so it never names a
process class; the dispatcher sees the pool as a `serve.core.dispatcher.WorkerSource`.

A worker that crashes in service (it had served, or stayed READY a while) is restarted at once, up
to ``immediate_per_minute`` times a minute per version; one that dies right after READY backs off
while its slot crash-loops (`serve.core.restarts.decide_restart`, pure); a worker that stayed up
for ``stable_after`` seconds starts the count over. A worker whose resident memory passes its cap is
recycled between batches: it takes no new batch, is stopped gracefully and replaced at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from serve.config import ModelSettings
from serve.core.dispatcher import Worker
from serve.core.host import process_unique
from serve.core.jobs import LIVE_STATES, WorkerState
from serve.core.restarts import Exit, RestartPolicy, backoff_delay, decide_restart
from serve.worker.process import WorkerStartFailed

logger = logging.getLogger(__name__)

# How long a READY worker must have been up, without serving, for its crash to count as one in
# service (restarted at once): a worker that dies sooner is taken for a crash loop.
SETTLED_AFTER_S = 1.0


class ManagedWorker(Worker, Protocol):
    """A worker the pool can start, watch and stop (`WorkerProcess` is one)."""

    pid: int | None
    started_at: float

    async def start(self, timeout: float) -> None:
        """Start and wait until loaded; raises `WorkerStartFailed`."""
        ...

    async def wait_exit(self) -> int | None:
        """Wait until the worker has exited; its exit code."""
        ...

    async def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit, then make it."""
        ...


@dataclass
class WorkerSlot:
    """A place for one worker; the supervisor keeps a live process in it."""

    index: int
    worker_id: str
    gpu_id: int | None
    process: ManagedWorker | None = None
    task: asyncio.Task[None] | None = None
    retiring: bool = False
    restarts: int = 0  # every restart after an unasked exit, for describe and metrics
    crash_streak: int = 0  # crashes in a row, each replacement up less than `stable_after`
    served: int = 0  # batches its current worker answered
    recycling: bool = False  # its worker is being replaced on purpose (the memory cap)
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


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A read-only view of one worker slot, for describe, metrics and health."""

    worker_id: str
    state: WorkerState
    retiring: bool
    pid: int | None
    started_at: float | None
    gpu_id: int | None
    restarts: int
    last_error: str | None
    warmup_seconds: float | None = None  # what its warm-up took (serve/worker/warmup.py)
    gpu_memory: int | None = None  # bytes torch holds on its GPU once loaded and warm
    # A worker that runs many requests at once: its slots and engine limits (from LOADED) and
    # the requests it runs now.
    limits: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    # A generative engine's latest live counts (`serve.wire.messages.EngineReport.stats`).
    engine: dict[str, int] = field(default_factory=dict)

    @property
    def kv_cache_usage(self) -> float | None:
        """The engine's KV-cache budget in use (reserved / max_cached_tokens), 0..1; None
        without an engine."""
        budget = self.limits.get("max_cached_tokens")
        if not budget or "reserved_tokens" not in self.engine:
            return None
        return min(1.0, self.engine["reserved_tokens"] / budget)


WorkerFactory = Callable[[WorkerSlot], ManagedWorker]


class WorkerPool:
    """Keeps the workers of one model version running."""

    def __init__(
        self,
        name: str,
        version: str,
        factory: WorkerFactory,
        settings: Callable[[], ModelSettings],
        *,
        max_backoff: float,
        stable_after: float = 60.0,
        immediate_per_minute: int = 10,
        settled_after: float = SETTLED_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        gpu_for: Callable[[int], int | None] = lambda _: None,
        on_ready: Callable[[], None] = lambda: None,
        on_restart: Callable[[], None] = lambda: None,
        on_recycle: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.version = version
        self._factory = factory
        self._settings = settings
        self._max_backoff = max_backoff
        self._policy = RestartPolicy(max_backoff, stable_after, settled_after, immediate_per_minute)
        self._clock = clock
        # When this version's last immediate restarts were (the crash-rate limit's window).
        self._immediate: deque[float] = deque(maxlen=max(1, immediate_per_minute))
        self._gpu_for = gpu_for
        self._on_ready = on_ready
        self._on_restart = on_restart
        self._on_recycle = on_recycle
        self.slots: list[WorkerSlot] = []
        self.closing = False
        self._next_index = 0
        self._tasks: set[asyncio.Task[None]] = set()  # strong references to background work

    # ----- what the dispatcher sees (WorkerSource) -----------------------------------------

    def workers(self) -> list[Worker]:
        return [s.process for s in self.slots if not s.retiring and s.process is not None]

    def can_serve(self) -> bool:
        # A slot whose worker died is restarting: requests wait for it (or for their deadline).
        return any(not s.gave_up and not s.retiring for s in self.slots)

    def batch_finished(self, worker: Worker) -> None:
        for slot in self.slots:
            if slot.process is not worker:
                continue
            slot.served += 1
            if slot.retiring:
                if not _in_flight(worker):  # the last of a slot worker's requests
                    self._background(self._stop_slot(slot))
            elif worker.state == WorkerState.READY:
                self._check_memory(slot)

    def _check_memory(self, slot: WorkerSlot) -> None:
        cap_mb = self._settings().worker_max_rss_mb
        proc = slot.process
        if not cap_mb or proc is None:
            return
        # Its USS (what replacing it frees; RSS where unreadable): torch's shared library pages
        # are not the worker's to give back (docs/configuration.md, worker_max_rss_mb).
        unique = process_unique(proc.pid)
        if unique is None or unique <= cap_mb * 1024 * 1024:
            return
        logger.warning(
            "Worker %s (pid %s) uses %d MiB of its own (USS), over its cap of %d MiB "
            "(worker_max_rss_mb); recycling it",
            slot.worker_id,
            proc.pid,
            unique // (1024 * 1024),
            cap_mb,
        )
        # STOPPING at once, before the dispatcher looks again: it gets no further batch.
        proc.change_state(WorkerState.STOPPING)
        slot.recycling = True
        self._on_recycle()
        self._background(proc.stop())

    # ----- views ---------------------------------------------------------------------------

    def active(self) -> list[WorkerSlot]:
        """Slots in service (not retiring)."""
        return [s for s in self.slots if not s.retiring]

    def ready_count(self) -> int:
        return sum(1 for s in self.slots if s.state in LIVE_STATES)

    def infos(self) -> list[WorkerInfo]:
        return [_info(s) for s in list(self.slots)]

    # ----- growing and shrinking -----------------------------------------------------------

    def add(self) -> WorkerSlot:
        """Add a slot and start supervising a worker in it."""
        index = self._next_index
        self._next_index += 1
        slot = WorkerSlot(index, f"{self.name}_{self.version}-w{index}", self._gpu_for(index))
        slot.task = asyncio.create_task(self._supervise(slot))
        # However the supervisor ends (even cancelled before its first start), waiters move on.
        slot.task.add_done_callback(lambda _: slot.settled.set())
        self.slots.append(slot)
        return slot

    def retire(self, slot: WorkerSlot) -> None:
        """Take a slot out of service; a busy worker finishes its batch first."""
        slot.retiring = True
        slot.settled.set()
        proc = slot.process
        # A worker with slots may be READY while it runs requests: it drains them first.
        if proc is None or (proc.state != WorkerState.BUSY and not _in_flight(proc)):
            self._background(self._stop_slot(slot))

    async def wait_loaded(self) -> None:
        """Wait until every slot has loaded once or given up; raises if none could start."""
        slots = self.active()
        if slots:
            await asyncio.gather(*(s.settled.wait() for s in slots))
        failed = [s for s in slots if s.gave_up or (not s.loaded.is_set() and s.last_error)]
        if slots and len(failed) == len(slots):
            raise WorkerStartFailed(
                f'Failed to start workers for model "{self.name}" version {self.version}: '
                f"{failed[0].last_error}"
            )

    async def stop(self, grace: float = 5.0) -> None:
        """Stop every worker now (SHUTDOWN, then signals after ``grace``)."""
        self.closing = True
        slots, self.slots = self.slots, []
        for slot in slots:
            slot.retiring = True
        await asyncio.gather(*(self._stop_slot_now(s, grace) for s in slots))

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

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task that is kept alive and whose failure is logged."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "Stopping a worker of %s %s failed",
                self.name,
                self.version,
                exc_info=task.exception(),
            )

    # ----- supervision ---------------------------------------------------------------------

    async def _supervise(self, slot: WorkerSlot) -> None:
        """Keep a worker in ``slot``; whatever goes wrong is logged and shows on the slot."""
        try:
            await self._keep_running(slot)
        except Exception as exc:  # a supervisor must never end unseen
            logger.exception(
                "Supervisor of worker %s failed; the worker is out of service", slot.worker_id
            )
            slot.last_error = f"{type(exc).__name__}: {exc}"
            slot.gave_up = True
            if slot.process is not None:
                slot.process.kill()
            self._on_ready()  # the dispatcher looks again (queued work may have nowhere to go)

    async def _keep_running(self, slot: WorkerSlot) -> None:
        failing_since: float | None = None
        while not slot.retiring and not self.closing:
            proc = self._factory(slot)
            slot.process = proc
            slot.recycling = False
            slot.served = 0
            settings = self._settings()
            try:
                await proc.start(settings.startup_timeout)
            except Exception as exc:
                slot.failures += 1
                if isinstance(exc, WorkerStartFailed):
                    slot.last_error = exc.message
                    logger.error("Worker %s failed to start: %s", slot.worker_id, exc.message)
                else:  # not a failure we foresaw: keep the traceback
                    slot.last_error = f"{type(exc).__name__}: {exc}"
                    logger.exception("Worker %s failed to start", slot.worker_id)
                failing_since = failing_since or time.monotonic()
                slot.settled.set()
                if time.monotonic() - failing_since > settings.max_retry_timeout_in_sec:
                    slot.gave_up = True
                    logger.error("Giving up on worker %s after repeated failures", slot.worker_id)
                    self._on_ready()
                    return
                await asyncio.sleep(self.backoff(slot.failures))
                continue
            failing_since = None
            slot.failures = 0
            slot.last_error = None
            slot.loaded.set()
            slot.settled.set()
            ready_at = self._clock()
            logger.info("Worker %s ready (pid %s)", slot.worker_id, proc.pid)
            self._on_ready()
            code = await proc.wait_exit()
            if slot.retiring or self.closing:
                return
            if slot.recycling:
                logger.info(
                    "Worker %s (pid %s) recycled; starting its replacement",
                    slot.worker_id,
                    proc.pid,
                )
                continue
            slot.restarts += 1
            self._on_restart()
            now = self._clock()
            decision = decide_restart(
                Exit(now - ready_at, slot.served, slot.crash_streak, tuple(self._immediate), now),
                self._policy,
            )
            slot.crash_streak = decision.streak
            if decision.immediate:
                self._immediate.append(now)
            logger.error(
                "Worker %s (pid %s) exited with code %s; restarting in %g s (%s)",
                slot.worker_id,
                proc.pid,
                code,
                decision.delay,
                decision.reason,
            )
            # Even at 0 s this yields once: the dispatcher settles the dead worker's jobs first.
            await asyncio.sleep(decision.delay)

    def backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, self._max_backoff)


def _info(slot: WorkerSlot) -> WorkerInfo:
    proc = slot.process
    return WorkerInfo(
        worker_id=slot.worker_id,
        state=slot.state,
        retiring=slot.retiring,
        pid=proc.pid if proc is not None else None,
        started_at=proc.started_at if proc is not None else None,
        gpu_id=slot.gpu_id,
        restarts=slot.restarts,
        last_error=slot.last_error,
        warmup_seconds=(getattr(proc, "warmup", None) or {}).get("seconds"),
        gpu_memory=getattr(proc, "gpu_memory", None),
        limits=dict(getattr(proc, "limits", None) or {}),
        in_flight=_in_flight(proc) if proc is not None else 0,
        engine=dict(getattr(proc, "engine_stats", None) or {}),
    )


def _in_flight(worker: object) -> int:
    """Batches a worker still runs (`WorkerProcess.in_flight`; 0 for a worker without it)."""
    return int(getattr(worker, "in_flight", 0) or 0)
