"""One served model version: its settings and lifecycle, composing a worker pool and a dispatcher.

`serve.core.pool.WorkerPool` keeps the workers running, `serve.core.dispatcher.Dispatcher` turns
requests into batches on them; this module scales, drains and unloads the version, and says what its
workers need (spec, environment, devices). Who builds them is a `WorkerFactory`, the registry's
seam: `spawn_worker` starts worker processes; tests pass one that answers from Python.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from serve import __version__
from serve.config import Config, ModelSettings
from serve.core.devices import visible_gpus
from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, Job, WorkerState
from serve.core.placement import Placement
from serve.core.pool import ManagedWorker, WorkerInfo, WorkerPool, WorkerSlot
from serve.core.sequences import SequenceSettings, make_dispatcher
from serve.core.slots import SlotPlacement, is_engine_handler, runs_many_at_once
from serve.core.threads import ThreadBudget, ThreadDemand
from serve.wire.errors import ShuttingDown
from serve.wire.messages import WorkerSpec
from serve.worker.frameworks import archive_frameworks
from serve.worker.process import WorkerProcess, WorkerStartFailed
from serve.worker.spares import SparePool, worker_base_env

if TYPE_CHECKING:
    from serve.core.observer import Observer

__all__ = [
    "ModelSource",
    "ModelVersion",
    "WorkerFactory",
    "WorkerSlot",
    "WorkerStartFailed",
    "spawn_worker",
]


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
    dependency_path: Path | None = None  # install_py_dep_per_model: first on the workers' path
    workflow: str | None = None  # the workflow this version is a node of, if any


class WorkerFactory(Protocol):
    """Builds the worker for one slot of a model version; the pool starts, watches and stops it."""

    def __call__(self, model: ModelVersion, slot: WorkerSlot) -> ManagedWorker: ...


def spawn_worker(model: ModelVersion, slot: WorkerSlot) -> WorkerProcess:
    """The real kind: a ``python -m serve.worker`` process (or a warm spare) for ``slot``."""
    config = model.config
    worker = WorkerProcess(
        slot.worker_id,
        model.worker_spec(slot),
        model.socket_dir,
        env=model.worker_env(),
        # A spinning engine's worker starts cold (`ModelVersion.worker_env`), and what it
        # imports teaches the spares nothing: no spare is made for it.
        spares=None if model.spins else model.spares,
        use_spare=model.loads_torch(),
        arena_bytes=config.worker_shm_arena_mb << 20,
        arena_threshold=config.worker_shm_threshold_kb << 10,
        liveness_timeout=config.worker_liveness_timeout,
    )
    # An engine's exact reservations free KV budget that slot placement counted at the worst.
    worker.on_reservations = lambda: model.dispatcher.schedule()
    return worker


class ModelVersion:
    """One model version: its settings, its worker pool and its dispatcher, and their lifecycle."""

    def __init__(
        self,
        name: str,
        version: str,
        source: ModelSource,
        settings: ModelSettings,
        config: Config,
        socket_dir: Path,
        metrics: Observer | None = None,
        *,
        loaded_at_startup: bool = False,
        worker_factory: WorkerFactory = spawn_worker,
    ) -> None:
        self.name = name
        self.version = version
        self.source = source
        self.settings = settings
        self.config = config
        self.socket_dir = socket_dir
        self.metrics = metrics
        self.loaded_at_startup = loaded_at_startup
        self.pool = WorkerPool(
            name,
            version,
            lambda slot: worker_factory(self, slot),
            lambda: self.settings,
            max_backoff=config.worker_restart_max_backoff,
            stable_after=config.worker_restart_backoff_reset,
            immediate_per_minute=config.worker_restart_immediate_per_minute,
            gpu_for=self._gpu_for,
            on_ready=self._worker_ready,
            on_restart=self._count_restart,
            on_recycle=self._count_recycle,
        )
        # sequenceBatching (stateful models) in the archive's model-config.yaml.
        self.sequences = SequenceSettings.from_config(
            source.model_config, settings.batch_size, self.max_workers
        )
        handler = source.handler or (source.manifest.get("model") or {}).get("handler")
        self.dispatcher = make_dispatcher(
            name,
            version,
            self.pool,
            lambda: self.settings,
            self.sequences,
            on_outcome=self._observe,
            many_at_once=runs_many_at_once(source.model_config, handler),
        )
        # The built-in generative engine runs its steps back to back on the worker's cores.
        self.runs_engine = is_engine_handler(handler)
        # Input/output metadata for the OIP and KServe routes, asked of a worker once.
        self.protocol_metadata: dict[str, Any] | None = None
        # The server-wide intra-op thread budget (set by the registry); None: this version's
        # cores are divided among its own workers only.
        self.thread_budget: ThreadBudget | None = None
        # Whether any model of the server has requests in flight (set by the registry); a cold
        # start imports its frameworks at `worker_start_nice` only then (`start_nice`).
        self.server_busy: Callable[[], bool] = lambda: True
        # Warm spare interpreters shared by the server (set by the registry); None: cold starts.
        self.spares: SparePool | None = None
        # What its handler imports as it loads, read off the archive: its first worker, and the
        # replacement of its first crash, may take a spare that preloaded them.
        self.expected_frameworks = archive_frameworks(
            source.manifest, source.model_dir, source.handler
        )

    # ----- what other modules read ---------------------------------------------------------

    @property
    def min_workers(self) -> int:
        return self.settings.min_workers or 0

    @property
    def max_workers(self) -> int:
        return max(self.settings.max_workers or 0, self.min_workers)

    @property
    def closing(self) -> bool:
        """True once the version drains or unloads: it takes no new work."""
        return self.dispatcher.closing

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet answered (queued or running)."""
        return self.dispatcher.in_flight

    @property
    def queue(self) -> Placement:
        return self.dispatcher.queue

    @property
    def slots(self) -> list[WorkerSlot]:
        return self.pool.slots

    def max_model_len(self) -> int | None:
        """The longest sequence (prompt + answer) this version's engine takes, as its workers
        reported it (the smallest, should they differ); None before one has, or without one."""
        lengths = [w.limits["max_model_len"] for w in self.workers() if "max_model_len" in w.limits]
        return min(lengths) if lengths else None

    def workers(self) -> list[WorkerInfo]:
        """A snapshot of every worker slot, retiring ones included."""
        return self.pool.infos()

    def queue_capacity(self) -> int:
        return self.dispatcher.queue.capacity

    def pending_requests(self) -> int:
        """Requests waiting for a worker."""
        return self.dispatcher.queue.live_count()

    def remaining_capacity(self) -> int:
        return self.dispatcher.queue.capacity - len(self.dispatcher.queue)

    def load_error(self) -> str | None:
        """Why no worker runs, when every worker in service gave up starting; else None."""
        active = self.pool.active()
        if active and all(s.state == WorkerState.DEAD for s in active):
            return next((s.last_error for s in active if s.last_error), "") or ""
        return None

    def ready_workers(self) -> int:
        return self.pool.ready_count()

    def is_healthy(self) -> bool:
        return self.ready_workers() >= self.min_workers

    # ----- lifecycle -----------------------------------------------------------------------

    async def scale(self, min_workers: int, max_workers: int | None = None, *, wait: bool) -> None:
        """Run ``min_workers`` workers; with ``wait``, return once new ones are loaded (or failed)
        and retired ones are gone (a busy one finishes its batch first)."""
        if self.closing:
            raise ShuttingDown(f'Model "{self.name}" version {self.version} is being unloaded.')
        self.settings = self.settings.merged(
            {"min_workers": min_workers, "max_workers": max(max_workers or 0, min_workers)}
        )
        active = self.pool.active()
        for _ in range(min_workers - len(active)):
            self.pool.add()
        retired = active[min_workers:][::-1] if len(active) > min_workers else []
        for slot in retired:
            self.pool.retire(slot)
        if min_workers == 0:
            # Nothing will ever take what is queued: answer it now, not at its deadline.
            self.dispatcher.fail_queued(self.dispatcher.no_workers())
        if wait:
            await self.wait_loaded()
            await asyncio.gather(*(s.stopped.wait() for s in retired))

    async def wait_loaded(self) -> None:
        """Wait until every slot has loaded once or given up; raises if none could start."""
        await self.pool.wait_loaded()

    def submit(self, item: BatchItem, timeout: float | None = None) -> asyncio.Future[ItemResult]:
        """Queue one request; raises at once when it cannot be served."""
        return self.dispatcher.submit(item, timeout)

    async def drain(self, timeout: float) -> None:
        """Refuse new work, let queued and running work finish, then fail what is left."""
        self.pool.closing = True
        await self.dispatcher.drain(timeout)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop every worker now."""
        self.dispatcher.closing = True
        await self.pool.stop(grace)

    def _count_restart(self) -> None:
        if self.metrics is not None:
            self.metrics.worker_restarted(self.name, self.version)

    def _count_recycle(self) -> None:
        if self.metrics is not None:
            self.metrics.worker_recycled(self.name, self.version, "memory")

    def _observe(self, jobs: list[Job], outcome: BatchOutcome) -> None:
        if self.metrics is not None:
            self.metrics.batch_done(self.name, self.version, jobs, outcome)

    # ----- building workers ----------------------------------------------------------------

    def loads_torch(self) -> bool:
        """Whether this version's workers import torch (its archive says so, or a worker did):
        only then does a spare (an interpreter with torch imported) fit it. A torch-free
        handler's workers stay free of torch: their memory (the RSS cap, admission) is their
        own."""
        return "torch" in self.frameworks()

    def frameworks(self) -> list[str]:
        """The frameworks (`serve.worker.spares.PRELOADABLE`) this version's workers import: read
        off its archive at registration, and what its workers reported once loaded."""
        seen: set[str] = set(self.expected_frameworks)
        for slot in self.pool.slots:
            seen.update(getattr(slot.process, "modules", None) or ())
        return sorted(seen)

    def _gpu_for(self, index: int) -> int | None:
        if (self.settings.device_type or "").lower() == "cpu":
            return None
        ids = self.settings.device_ids
        if not ids:
            count = visible_gpus(self.config.number_of_gpu)
            ids = list(range(count))
        return ids[index % len(ids)] if ids else None

    def worker_spec(self, slot: WorkerSlot) -> WorkerSpec:
        return WorkerSpec(
            model_name=self.name,
            model_version=self.version,
            model_dir=str(self.source.model_dir),
            manifest=self.source.manifest,
            handler=self.source.handler,
            batch_size=self.settings.batch_size,
            gpu_id=slot.gpu_id,
            num_threads=self.threads_per_worker(),
            cpu_affinity=self._affinity(slot),
            model_yaml_config=self.source.model_config,
            limit_max_image_pixels=self.config.limit_max_image_pixels,
            decode_input_request=self.config.decode_input_request,
            log_level=self.config.log_level,
            metrics_config=self.config.metrics_config,  # its model_metrics are declared
            dependency_path=(
                str(self.source.dependency_path) if self.source.dependency_path else None
            ),
            # A cold start of a model known to use torch & co. imports them first (`preload`).
            preload=self.frameworks(),
            start_nice=self.start_nice(),
            server_version=__version__,
            envelope=self.config.service_envelope or None,
        )

    def start_nice(self) -> int:
        """The nice value a cold worker imports its frameworks at: `worker_start_nice` while
        the server serves requests (a start must not slow them), else 0 — nothing would gain
        from the wait, and under other processes' load a nice-10 torch import took 30-80 s
        against ~2 s (docs/performance.md, scale-up). Spares always import at
        `worker_start_nice`: nobody waits for them."""
        return self.config.worker_start_nice if self.server_busy() else 0

    def threads_per_worker(self) -> int:
        if self.settings.num_threads:
            return self.settings.num_threads
        if self.thread_budget is not None:
            return self.thread_budget.threads_for(self)
        workers = max(1, self.max_workers, len(self.pool.active()))
        return max(1, (os.cpu_count() or 1) // workers)

    def thread_demand(self) -> ThreadDemand:
        """This version's claim on the server's thread budget."""
        return ThreadDemand(
            f"{self.name}/{self.version}", len(self.pool.active()), self.settings.num_threads
        )

    def apply_threads(self, threads: int) -> None:
        """Pass a new share to every running worker that has another."""
        for worker in self.pool.workers():
            set_threads = getattr(worker, "set_threads", None)
            if set_threads is not None:
                set_threads(threads)

    def _worker_ready(self) -> None:
        placement = self.dispatcher.placement
        if isinstance(placement, SlotPlacement):
            for worker in self.pool.workers():
                placement.learn(getattr(worker, "limits", None) or {})
        if self.thread_budget is not None:  # the budget may have moved while it started
            self.apply_threads(self.threads_per_worker())
        self.dispatcher.schedule()

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

    @property
    def spins(self) -> bool:
        """Whether this version's workers keep OpenMP's own (spinning) wait policy: a generative
        engine's, when the operator asks for it (``engine_spin_wait``)."""
        return self.runs_engine and self.config.engine_spin_wait

    def worker_env(self) -> dict[str, str]:
        """A worker's environment: the server's (`worker_base_env`) with its thread share.

        Every worker gets ``OMP_WAIT_POLICY=PASSIVE`` unless the server's environment sets it. A
        generative engine runs one forward pass after another, where OpenMP's own policy (its
        threads spin between operators) was a few percent faster on a quiet machine, but beside
        any other work on the same cores each step took many times longer (docs/performance.md):
        only ``engine_spin_wait`` keeps it. Such a worker starts cold, not from a spare, whose
        OpenMP runtime already read the passive policy when it imported torch.
        """
        env = worker_base_env(self.config)  # blacklist, OMP_WAIT_POLICY, unbuffered output
        if self.spins and "OMP_WAIT_POLICY" not in os.environ:
            del env["OMP_WAIT_POLICY"]
        threads = str(self.threads_per_worker())
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env.setdefault(key, threads)
        return env
