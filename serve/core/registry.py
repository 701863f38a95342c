"""The one owner of models, versions and their workers.

Startup (``--models``), the management API and snapshot restore all go through these methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from archiver import ArchiveError
from serve.config import Config, ModelSettings
from serve.core import admission
from serve.core.devices import visible_gpus
from serve.core.host import process_memory, process_unique
from serve.core.jobs import LIVE_STATES, WorkerState
from serve.core.model import ModelSource, ModelVersion, WorkerFactory, spawn_worker
from serve.core.model_deps import install_requirements, requirements_file
from serve.core.sequences import check_supported_settings
from serve.core.threads import ThreadBudget
from serve.identifiers import shown
from serve.store.layouts import ModelLayout, Overlay, open_version, recognise
from serve.store.sources import ModelLocation, ModelSources
from serve.wire.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientMemory,
    ModelNotFound,
    ModelVersionNotFound,
    NoHealthyWorkers,
    ServeError,
)
from serve.wire.redact import client_message
from serve.worker.spares import SparePool, worker_base_env

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

    from serve.core.observer import Observer

logger = logging.getLogger(__name__)

# TorchServe's rule for model names; versions follow it too. Both become file and socket names and
# URL path segments, so nothing else (no '/', no '..') may pass.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")
RUNTIMES = ("python", "python3")


@dataclass
class ModelEntry:
    name: str
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    default_version: str = ""

    @property
    def default(self) -> ModelVersion:
        return self.versions[self.default_version]


class LoadOptions(TypedDict, total=False):
    """How a new version starts, as `Registry.register` passes it on to `Registry.add_source`."""

    initial_workers: int | None
    synchronous: bool
    settings: dict[str, Any] | None
    loaded_at_startup: bool
    make_default: bool
    fallback_workers: int | None


@dataclass
class VersionFailure:
    """A version that could not load, warm up or be admitted: it never took traffic."""

    version: str
    message: str
    at: float  # time.time()


class Registry:
    """Models by name, each with versions and a default version.

    ``worker_factory`` builds every worker of every version: `spawn_worker` starts processes;
    a test passes one whose workers answer from Python, and the rest runs unchanged.
    """

    def __init__(
        self,
        config: Config,
        work_dir: Path,
        metrics: Observer | None = None,
        *,
        worker_factory: WorkerFactory = spawn_worker,
    ) -> None:
        self.config = config
        self.work_dir = work_dir
        self.metrics = metrics
        self.worker_factory = worker_factory
        self.sources = ModelSources(config)
        self.models: dict[str, ModelEntry] = {}
        self.socket_dir = work_dir / "sockets"
        self.extract_dir = work_dir / "models"
        self.socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.extract_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Every change of models or worker counts moves the server-wide thread budget.
        self.thread_budget = ThreadBudget(self.all_versions)
        # Warm interpreters for the next worker start (serve/worker/spares.py); started lazily.
        self.spares = SparePool(
            config.worker_spares, worker_base_env(config), config.worker_start_nice
        )
        self.listeners: list[Callable[[], None]] = []
        self._lock = asyncio.Lock()
        self._quiet = 0
        # (name, version) -> how a snapshot finds the archive again without fetching it.
        self._archives: dict[tuple[str, str], str] = {}
        # Model updates: why versions failed (describe, metrics), how long loads took, swaps.
        self.failures: dict[str, dict[str, VersionFailure]] = {}
        self.failure_counts: dict[tuple[str, str], int] = {}
        self.load_seconds: dict[tuple[str, str], float] = {}
        self.swaps: dict[str, int] = {}
        # model -> the line naming what of its config.pbtxt Lantern does not honour (startup
        # report, once per model)
        self.notes: dict[str, str] = {}
        # Where a Triton Python backend model sends its BLS calls: {"url", "key_file"} (the
        # server sets it once bound; the models get it in their config as ``bls``).
        self.bls: dict[str, str | None] | None = None
        # Memory admission's promises (see `_admit_host`): what one worker of a version was
        # admitted with, and the worker counts admitted that are not (all) started yet.
        self._per_worker: dict[tuple[str, str], int] = {}
        self._promises: list[_Promise] = []

    # ----- lookups ---------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The named version, or the default one; raises 404 errors."""
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"Model not found: {shown(name)}")
        if not version:
            return entry.default
        model = entry.versions.get(version)
        if model is None:
            raise ModelVersionNotFound(
                f"Model version: {shown(version)} does not exist for model: {shown(name)}"
            )
        return model

    def versions(self, name: str) -> list[ModelVersion]:
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"Model not found: {shown(name)}")
        return list(entry.versions.values())

    def all_versions(self) -> list[ModelVersion]:
        return [mv for entry in self.models.values() for mv in entry.versions.values()]

    def busy(self) -> bool:
        """Whether any model version has requests in flight (dispatched or queued)."""
        return any(version.dispatcher.in_flight for version in self.all_versions())

    def is_healthy(self) -> bool:
        """Every model's default version has its minimum number of workers ready."""
        return all(entry.default.is_healthy() for entry in self.models.values())

    # ----- changes ---------------------------------------------------------------------

    async def register(
        self,
        url: str,
        *,
        model_name: str | None = None,
        handler: str | None = None,
        runtime: str | None = None,
        model_url: str | None = None,
        version: str | None = None,
        workflow: str | None = None,
        config_override: dict[str, Any] | None = None,
        overlay: Overlay | None = None,
        **options: Unpack[LoadOptions],
    ) -> ModelVersion:
        """Open the archive ``url`` names, add it as a new version and start its workers
        (`add_source`, with ``options``).

        Settings: server defaults < the archive's ``model-config.yaml`` < ``settings``. Workers:
        ``initial_workers``, else the yaml ``minWorkers``, else ``fallback_workers``, else
        `default_workers`. ``model_url`` is the URL to report when ``url`` is a stored copy of it.
        ``version`` overrides the manifest's (a versioned store's folder name).

        Memory admission runs first (507 when the workers do not fit); a version whose workers
        cannot load or warm up is removed again and its failure recorded in `failures`.
        ``workflow`` names the workflow the version belongs to (left out of snapshots).
        ``config_override`` (Triton's ModelConfig as JSON) replaces a model folder's config.pbtxt;
        ``overlay`` (OVMS's config.json entry) is laid over the layout's settings.
        """
        if model_name:
            _check_name(model_name, "model_name")
        if runtime and runtime not in RUNTIMES:
            raise BadRequest(
                f"Invalid runtime {runtime!r}: Lantern runs {' and '.join(RUNTIMES)} handlers."
            )
        initial_workers = options.get("initial_workers")
        if initial_workers is not None and initial_workers < 0:
            raise BadRequest("initial_workers cannot be negative.")
        location = await self.sources.resolve(url)
        try:
            layout = await asyncio.to_thread(recognise, location.path)
            if config_override is not None:
                layout.override_config(config_override, f"the configuration given for {url}")
            if overlay is not None:
                layout.apply_overlay(overlay)
            versions = [""] if layout.kind == "archive" else layout.served_versions(version)
        except ArchiveError as exc:
            _forget_download(location)
            logger.warning("Refused model %s: %s", url, exc)
            raise BadRequest(f"Invalid model {url}: {client_message(str(exc))}") from exc
        if layout.not_honoured:
            self._note_not_honoured(model_name or layout.name, layout)
        if len(versions) > 1:  # a versioned folder: each served version, the highest the default
            registered = None
            for one in versions:
                each: LoadOptions = {**options, "make_default": one == versions[-1]}
                registered = await self.register(
                    url,
                    model_name=model_name or layout.name,
                    handler=handler,
                    runtime=runtime,
                    model_url=model_url,
                    version=one,
                    workflow=workflow,
                    config_override=config_override,
                    overlay=overlay,
                    **each,
                )
            assert registered is not None
            return registered
        dest = self.extract_dir / uuid.uuid4().hex
        try:
            archive = await asyncio.to_thread(open_version, layout, versions[0], dest)
            name = model_name or archive.model_name
            version = version or str(archive.version or "1.0")
            _check_name(name, "model name")
            _check_name(version, "model version")
            if version == "all":  # GET /models/{m}/all lists versions: this one could not be named
                raise BadRequest("Model version 'all' is reserved.")
        except (ArchiveError, BadRequest, OSError) as exc:
            shutil.rmtree(dest, ignore_errors=True)
            _forget_download(location)
            if isinstance(exc, BadRequest):
                raise
            # The full reason names the store's paths: it goes to the log, the client gets less.
            logger.warning("Refused model archive %s: %s", url, exc)
            raise BadRequest(f"Invalid model archive {url}: {client_message(str(exc))}") from exc
        if archive.handler == "triton_python" and self.bls is not None:
            archive.model_config["bls"] = dict(self.bls)
        try:
            check_supported_settings({**archive.model_config, **(options.get("settings") or {})})
            dependency_path = await self._install_dependencies(name, archive, dest)
        except ServeError:
            shutil.rmtree(dest, ignore_errors=True)
            _forget_download(location)
            raise
        source = ModelSource(
            url=model_url or url,
            model_dir=archive.model_dir,
            manifest=archive.manifest,
            model_config=archive.model_config,
            handler=handler,
            runtime=runtime or archive.manifest.get("runtime", "python"),
            cleanup_dir=(
                dest if archive.model_dir.is_relative_to(dest) or dependency_path else None
            ),
            dependency_path=dependency_path,
            workflow=workflow,
        )
        return await self.add_source(
            name, version, source, store_name=location.store_name, **options
        )

    def _note_not_honoured(self, name: str, layout: ModelLayout) -> None:
        """One line per model naming the settings of its config Lantern does not honour."""
        line = (
            f"Model {name} ({layout.config_file or layout.path}): Lantern does not honour "
            f"{', '.join(layout.not_honoured)}"
        )
        if self.notes.get(name) != line:
            self.notes[name] = line
            logger.warning("%s", line)

    async def add_source(
        self,
        name: str,
        version: str,
        source: ModelSource,
        *,
        initial_workers: int | None = None,
        synchronous: bool = True,
        settings: dict[str, Any] | None = None,
        loaded_at_startup: bool = False,
        make_default: bool = False,
        fallback_workers: int | None = None,
        store_name: str | None = None,
    ) -> ModelVersion:
        """Add an opened model folder as version ``version`` of ``name`` and start its workers.

        `register` comes here after opening the archive; workflows come here directly for their
        function nodes (the workflow's folder, with the node's function as the handler).
        """
        _check_name(name, "model name")
        model_settings = (
            self.config.default_model_settings().merged(source.model_config).merged(settings or {})
        )
        workers = initial_workers
        if workers is None:
            workers = model_settings.min_workers
        if workers is None:
            workers = fallback_workers if fallback_workers is not None else self.default_workers()
        entry = self.models.get(name)
        if entry is not None and version in entry.versions:  # before admission: 409, not 507
            _cleanup(source)
            raise Conflict(f"Model version {version} is already registered for model {name}")
        started = time.monotonic()
        # One worker first when nothing is known of the model's size: its USS, measured once it
        # is loaded, then decides the others (with `synchronous` only: else the estimate does).
        first = workers
        try:
            need = await self._need(name, model_settings, source.model_dir)
            if need.source == "estimated" and synchronous and workers > 1:
                first = 1
            promise = await self._admit(name, version, first, need, model_settings)
        except InsufficientMemory as exc:
            _cleanup(source)
            self.record_failure(name, version, exc.message)
            raise
        try:
            return await self._start_version(
                name,
                version,
                source,
                model_settings,
                workers,
                first,
                synchronous=synchronous,
                loaded_at_startup=loaded_at_startup,
                make_default=make_default,
                store_name=store_name,
                started=started,
            )
        finally:
            self._release(promise)

    async def _start_version(
        self,
        name: str,
        version: str,
        source: ModelSource,
        model_settings: ModelSettings,
        workers: int,
        first: int,
        *,
        synchronous: bool,
        loaded_at_startup: bool,
        make_default: bool,
        store_name: str | None,
        started: float,
    ) -> ModelVersion:
        """`add_source` once its first workers are admitted: the version and its workers."""
        async with self._lock:
            entry = self.models.get(name)
            if entry is not None and version in entry.versions:
                _cleanup(source)
                raise Conflict(f"Model version {version} is already registered for model {name}")
            model = ModelVersion(
                name,
                version,
                source,
                model_settings,
                self.config,
                self.socket_dir,
                self.metrics,
                loaded_at_startup=loaded_at_startup,
                worker_factory=self.worker_factory,
            )
            model.thread_budget = self.thread_budget
            model.server_busy = self.busy
            model.spares = self.spares
            # The next spares preload what its workers will import (serve/worker/frameworks.py);
            # a generative engine's workers start cold (`ModelVersion.worker_env`) and need none.
            if not model.runs_engine:
                self.spares.expect(model.frameworks())
            if entry is None:
                entry = self.models[name] = ModelEntry(name, default_version=version)
            entry.versions[version] = model
            if make_default:
                entry.default_version = version
            self._archives[(name, version)] = store_name or source.url
        logger.info("Registered model %s version %s from %s", name, version, source.url)
        try:
            promise = None
            if first < workers:
                await model.scale(first, model_settings.max_workers, wait=True)
                more = self._measured(name, model_settings)
                promise = await self._admit(name, version, workers - first, more, model_settings)
            try:
                await model.scale(workers, model_settings.max_workers, wait=synchronous)
            finally:
                self._release(promise)
        except ServeError as exc:
            await self._remove(model)
            self.record_failure(name, version, exc.message)
            raise
        if synchronous:
            self.load_seconds[(name, version)] = time.monotonic() - started
        self.failures.get(name, {}).pop(version, None)
        self.changed()
        return model

    async def _install_dependencies(self, name: str, archive: Any, dest: Path) -> Path | None:
        """``install_py_dep_per_model``: the archive's requirements in a folder of its own."""
        if not self.config.install_py_dep_per_model:
            return None
        requirements = requirements_file(archive.model_dir, archive.manifest)
        if requirements is None:
            return None
        return await install_requirements(name, archive.model_dir, requirements, dest / "_deps")

    # ----- memory admission ------------------------------------------------------------

    async def _need(self, name: str, settings: ModelSettings, model_dir: Path) -> admission.Need:
        need = self._measured(name, settings)
        if need.source != "estimated":
            return need
        size = await asyncio.to_thread(admission.tree_size, model_dir)
        return admission.per_worker_need(None, (), size)

    def _measured(self, name: str, settings: ModelSettings) -> admission.Need:
        """The configured figure, or the largest USS (what one more worker adds; RSS where it
        cannot be read) of any running worker of model ``name``."""
        entry = self.models.get(name)
        unique = []
        for mv in entry.versions.values() if entry else ():
            unique += [u for u in map(process_unique, worker_pids(mv)) if u]
        return admission.per_worker_need(settings.memory_per_worker_mb, unique, 0)

    async def _admit(
        self,
        name: str,
        version: str,
        workers: int,
        need: admission.Need,
        settings: ModelSettings,
    ) -> _Promise | None:
        """Raise `InsufficientMemory` (507) unless ``workers`` more workers fit, in host memory
        and, for a GPU model whose GPU use is known, on its GPUs.

        The host memory they were admitted with is promised to them at once, so that the next
        admission counts it although they have not started: the caller hands the `_Promise`
        back to `_release` once the version has added their slots (a slot still starting counts
        its promise itself).
        """
        if not self.config.memory_admission or workers <= 0:
            return None
        promise = self._admit_host(name, version, workers, need)
        try:
            await self._admit_gpus(name, version, workers, settings)
        except BaseException:
            self._release(promise)
            raise
        return promise

    async def _admit_gpus(
        self, name: str, version: str, workers: int, settings: ModelSettings
    ) -> None:
        devices = self._devices(settings)
        need = self._gpu_need(name, settings)
        if not devices or need is None or self.metrics is None:
            return  # a CPU model, or nothing known of its GPU use yet: not checked
        free = {}
        for sample in await self.metrics.gpu_samples():
            total, used = sample.memory_total, sample.memory_used
            if sample.index.isdigit() and total is not None and used is not None:
                free[int(sample.index)] = int(total - used)
        visible = admission.visible_free(free, os.environ.get("CUDA_VISIBLE_DEVICES"))
        decision = admission.decide_gpus(
            f'model "{name}" version {version}',
            admission.gpu_placements(workers, devices),
            need,
            visible,
            self.config.gpu_memory_reserve_mb * admission.MIB,
        )
        if not decision.admitted:
            logger.error("Admission refused: %s", decision.message)
            raise InsufficientMemory(decision.message)

    def _devices(self, settings: ModelSettings) -> list[int]:
        """The GPUs a model's workers go to (as `ModelVersion` assigns them)."""
        if (settings.device_type or "").lower() == "cpu":
            return []
        return list(settings.device_ids or range(visible_gpus(self.config.number_of_gpu)))

    def _gpu_need(self, name: str, settings: ModelSettings) -> admission.Need | None:
        """The configured GPU figure, or the most any running worker of ``name`` holds."""
        if settings.gpu_memory_per_worker_mb:
            return admission.Need(settings.gpu_memory_per_worker_mb * admission.MIB, "configured")
        entry = self.models.get(name)
        held = [
            w.gpu_memory
            for mv in (entry.versions.values() if entry else ())
            for w in mv.workers()
            if w.gpu_memory
        ]
        return admission.Need(max(held), "measured") if held else None

    def _admit_host(self, name: str, version: str, workers: int, need: admission.Need) -> _Promise:
        """Decide and promise in one step (no await between): two admissions running side by
        side each see what the other was promised."""
        headroom = admission.host_headroom(self._committed(), self.config.worker_memory_limit_mb)
        reserve = self.config.memory_reserve_mb * admission.MIB
        what = f'model "{name}" version {version}'
        decision = admission.decide(what, workers, need, headroom, reserve)
        if not decision.admitted:
            logger.error("Admission refused: %s", decision.message)
            raise InsufficientMemory(decision.message)
        key = (name, version)
        model = self._version(key)
        self._per_worker[key] = max(self._per_worker.get(key, 0) if model else 0, need.per_worker)
        target = (active_workers(model) if model else 0) + workers
        promise = _Promise(key, target, need.per_worker)
        self._promises.append(promise)
        return promise

    def _committed(self) -> int:
        """Bytes the workers use or were promised: each worker's `admission.worker_charge` (a
        loaded one its PSS); workers admitted whose slots do not exist yet, what they were
        admitted with."""
        total = 0
        for mv in self.all_versions():
            promised = self._per_worker.get((mv.name, mv.version), 0)
            for w in mv.workers():
                if w.state == WorkerState.DEAD:
                    continue
                memory = process_memory(w.pid) if w.pid else None
                total += admission.worker_charge(
                    memory, w.state in LIVE_STATES, w.retiring, promised
                )
        for promise in self._promises:
            model = self._version(promise.key)
            started = active_workers(model) if model else 0
            total += max(0, promise.target - started) * promise.per_worker
        return total

    def _version(self, key: tuple[str, str]) -> ModelVersion | None:
        entry = self.models.get(key[0])
        return entry.versions.get(key[1]) if entry else None

    def _release(self, promise: _Promise | None) -> None:
        """Drop a promise: its slots exist now (they count for themselves) or never will."""
        if promise is not None and promise in self._promises:
            self._promises.remove(promise)

    # ----- failures --------------------------------------------------------------------

    def record_failure(self, name: str, version: str, message: str) -> None:
        """A version that will not take traffic: shown by describe and counted in the metrics."""
        self.failures.setdefault(name, {})[version] = VersionFailure(version, message, time.time())
        key = (name, version)
        self.failure_counts[key] = self.failure_counts.get(key, 0) + 1
        logger.error("Model %s version %s failed: %s", name, version, message)

    def default_workers(self) -> int:
        if self.config.default_workers_per_model > 0:
            return self.config.default_workers_per_model
        return max(1, visible_gpus(self.config.number_of_gpu))

    async def scale(
        self,
        name: str,
        version: str | None,
        min_worker: int,
        max_worker: int | None,
        *,
        synchronous: bool,
    ) -> ModelVersion:
        """Set a version's worker count; with ``synchronous``, return once it is reached."""
        if min_worker < 0:
            raise BadRequest("min_worker cannot be negative.")
        if max_worker is not None and max_worker < min_worker:
            raise BadRequest("max_worker cannot be less than min_worker.")
        model = self.get(name, version)
        added = min_worker - active_workers(model)
        promise = None
        if added > 0:
            measured = self._measured(name, model.settings)
            promise = await self._admit(model.name, model.version, added, measured, model.settings)
        try:
            await model.scale(min_worker, max_worker, wait=synchronous)
        finally:
            self._release(promise)
            self.changed()  # the new count stands even when some workers failed to start
        return model

    def set_default(self, name: str, version: str) -> ModelVersion:
        """Route unversioned requests to ``version`` from now on (the next request sees it).

        This does not wait: `swap_default` is the seamless swap the management API and the
        store watcher use.
        """
        model = self.get(name, version)
        entry = self.models[name]
        if entry.default_version != model.version:
            logger.info(
                "Model %s: default version %s -> %s", name, entry.default_version, model.version
            )
            entry.default_version = model.version
            self.swaps[name] = self.swaps.get(name, 0) + 1
        self.changed()
        return model

    async def swap_default(self, name: str, version: str) -> ModelVersion:
        """Route unversioned requests to ``version`` once its workers are loaded and warm.

        The swap: requests resolve their version when they are queued, so those already queued
        or running on the old default finish there; the next request goes to ``version``.
        Raises when no worker of ``version`` could start (the old default keeps serving). A
        version with no workers asked for switches at once, as in TorchServe.
        """
        model = self.get(name, version)
        if model.min_workers > 0:
            await model.wait_loaded()  # raises when every worker failed to load or warm up
            if model.ready_workers() == 0:
                raise NoHealthyWorkers(
                    f'Model "{name}" version {model.version} has no ready worker to take traffic.'
                )
        entry = self.models.get(name)
        if entry is None or entry.versions.get(model.version) is not model:  # gone meanwhile
            raise ModelVersionNotFound(f"Model version: {version} does not exist for model: {name}")
        return self.set_default(name, model.version)

    async def unregister_all(self, name: str) -> None:
        """Every version of ``name``, the default last (Triton's unload, OVMS's removal)."""
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"Model not found: {shown(name)}")
        default = entry.default_version
        for version in [v for v in list(entry.versions) if v != default] + [default]:
            await self.unregister(name, version)

    async def unregister(self, name: str, version: str | None = None) -> ModelVersion:
        """Remove a version: new requests get 404, queued and running ones finish first."""
        async with self._lock:
            model = self.get(name, version)
            entry = self.models[name]
            if model.version == entry.default_version and len(entry.versions) > 1:
                raise Forbidden(
                    f"Cannot remove default version {model.version} for model {name}; "
                    "set another version as default first."
                )
            del entry.versions[model.version]
            if not entry.versions:
                del self.models[name]
            self._archives.pop((name, model.version), None)
            self.load_seconds.pop((name, model.version), None)
            self._per_worker.pop((name, model.version), None)
        await model.drain(self.config.unregister_model_timeout)
        await model.stop()
        _cleanup(model.source)
        logger.info("Unregistered model %s version %s", name, model.version)
        self._forget_model(name)
        self.changed()
        return model

    async def _remove(self, model: ModelVersion) -> None:
        async with self._lock:
            entry = self.models.get(model.name)
            if entry is not None and entry.versions.get(model.version) is model:
                del entry.versions[model.version]
                if not entry.versions:
                    del self.models[model.name]
                elif entry.default_version == model.version:
                    entry.default_version = next(iter(entry.versions))
                self._archives.pop((model.name, model.version), None)
                self._per_worker.pop((model.name, model.version), None)
        await model.stop()
        _cleanup(model.source)
        self._forget_model(model.name)

    def _forget_model(self, name: str) -> None:
        """Once ``name``'s last version is gone (and answered what it had accepted), drop what
        the metrics keep of it; a name registered again meanwhile keeps its series."""
        if name in self.models:
            return
        self.swaps.pop(name, None)
        if self.metrics is not None:
            self.metrics.model_removed(name)

    async def drain(self, timeout: float) -> None:
        """Let every model finish its queued and running work, then refuse the rest."""
        await asyncio.gather(*(m.drain(timeout) for m in self.all_versions()))

    async def stop(self) -> None:
        await self.spares.stop()
        await asyncio.gather(*(m.stop() for m in self.all_versions()))
        for model in self.all_versions():
            _cleanup(model.source)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Hold back change notifications: one snapshot after a whole restore, not one per step."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def changed(self) -> None:
        """Tell the listeners (the snapshot writer) that models, versions or workers changed."""
        self.thread_budget.rebalance()  # never held back: running workers get their new share
        if self._quiet:
            return
        for listener in self.listeners:
            try:
                listener()
            except Exception:
                logger.exception("Registry listener failed")

    def state(self) -> dict[str, Any]:
        """What a snapshot records: every version with its settings and worker counts."""
        models: dict[str, Any] = {}
        for entry in self.models.values():
            versions = {}
            for mv in entry.versions.values():
                if mv.source.workflow:  # a workflow's models come and go with the workflow
                    continue
                versions[mv.version] = {
                    "defaultVersion": mv.version == entry.default_version,
                    "marName": self._archives.get((entry.name, mv.version), mv.source.url),
                    "modelUrl": mv.source.url,
                    "handler": mv.source.handler,
                    "runtime": mv.source.runtime,
                    **_settings_dict(mv.settings),
                    "minWorkers": mv.min_workers,
                    "maxWorkers": mv.max_workers,
                }
            if versions:
                models[entry.name] = versions
        return {"modelCount": len(models), "models": models}


@dataclass(eq=False)
class _Promise:
    """Host memory admitted to a version's workers before their slots exist: the version is
    to run ``target`` workers, each admitted with ``per_worker`` bytes."""

    key: tuple[str, str]
    target: int
    per_worker: int


def worker_pids(model: ModelVersion) -> list[int]:
    """Process ids of a version's live workers."""
    return [w.pid for w in model.workers() if w.pid and w.state != WorkerState.DEAD]


def active_workers(model: ModelVersion) -> int:
    """Workers the version runs or is starting (not those retiring)."""
    return sum(1 for w in model.workers() if not w.retiring)


def _settings_dict(settings: ModelSettings) -> dict[str, Any]:
    return settings.as_yaml_dict()


def _check_name(value: str, what: str) -> None:
    if not _NAME.fullmatch(value):
        raise BadRequest(
            f"Invalid {what} {value!r}: use letters, digits, '_', '-' and '.', "
            "starting with a letter or digit."
        )


def _forget_download(location: ModelLocation) -> None:
    """A file this call downloaded that is no archive must not block the next attempt."""
    if location.downloaded:
        location.path.unlink(missing_ok=True)


def _cleanup(source: ModelSource) -> None:
    if source.cleanup_dir is not None:
        shutil.rmtree(source.cleanup_dir, ignore_errors=True)
