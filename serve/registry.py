"""The one owner of models, versions and their workers.

Startup (``--models``), the management API and snapshot restore all go through these methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archiver import ArchiveError, open_archive
from serve.config import Config, ModelSettings
from serve.devices import visible_gpus
from serve.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    ModelNotFound,
    ModelVersionNotFound,
    ServeError,
)
from serve.model import ModelSource, ModelVersion
from serve.sources import ModelLocation, ModelSources

if TYPE_CHECKING:
    from serve.metrics import ServerMetrics

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


class Registry:
    """Models by name, each with versions and a default version."""

    def __init__(
        self, config: Config, work_dir: Path, metrics: ServerMetrics | None = None
    ) -> None:
        self.config = config
        self.work_dir = work_dir
        self.metrics = metrics
        self.sources = ModelSources(config)
        self.models: dict[str, ModelEntry] = {}
        self.socket_dir = work_dir / "sockets"
        self.extract_dir = work_dir / "models"
        self.socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.extract_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.listeners: list[Callable[[], None]] = []
        self._lock = asyncio.Lock()
        self._quiet = 0
        # (name, version) -> how a snapshot finds the archive again without fetching it.
        self._archives: dict[tuple[str, str], str] = {}

    # ----- lookups ---------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The named version, or the default one; raises 404 errors."""
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"Model not found: {name}")
        if not version:
            return entry.default
        model = entry.versions.get(version)
        if model is None:
            raise ModelVersionNotFound(f"Model version: {version} does not exist for model: {name}")
        return model

    def versions(self, name: str) -> list[ModelVersion]:
        entry = self.models.get(name)
        if entry is None:
            raise ModelNotFound(f"Model not found: {name}")
        return list(entry.versions.values())

    def all_versions(self) -> list[ModelVersion]:
        return [mv for entry in self.models.values() for mv in entry.versions.values()]

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
        initial_workers: int | None = None,
        synchronous: bool = True,
        settings: dict[str, Any] | None = None,
        loaded_at_startup: bool = False,
        make_default: bool = False,
        fallback_workers: int | None = None,
        model_url: str | None = None,
        workflow: str | None = None,
    ) -> ModelVersion:
        """Open the archive ``url`` names, add it as a new version and start its workers.

        Settings: server defaults < the archive's ``model-config.yaml`` < ``settings``. Workers:
        ``initial_workers``, else the yaml ``minWorkers``, else ``fallback_workers``, else
        `default_workers`. ``model_url`` is the URL to report when ``url`` is a stored copy of it.
        ``workflow`` names the workflow the version belongs to (left out of snapshots).
        """
        if model_name:
            _check_name(model_name, "model_name")
        if runtime and runtime not in RUNTIMES:
            raise BadRequest(
                f"Invalid runtime {runtime!r}: Lantern runs {' and '.join(RUNTIMES)} handlers."
            )
        if initial_workers is not None and initial_workers < 0:
            raise BadRequest("initial_workers cannot be negative.")
        location = await self.sources.resolve(url)
        dest = self.extract_dir / uuid.uuid4().hex
        try:
            archive = await asyncio.to_thread(open_archive, location.path, dest)
            name = model_name or archive.model_name
            version = str(archive.version or "1.0")
            _check_name(name, "model name")
            _check_name(version, "model version")
            if version == "all":  # GET /models/{m}/all lists versions: this one could not be named
                raise BadRequest("Model version 'all' is reserved.")
        except (ArchiveError, BadRequest, OSError) as exc:
            shutil.rmtree(dest, ignore_errors=True)
            _forget_download(location)
            if isinstance(exc, BadRequest):
                raise
            raise BadRequest(f"Invalid model archive {url}: {exc}") from exc
        source = ModelSource(
            url=model_url or url,
            model_dir=archive.model_dir,
            manifest=archive.manifest,
            model_config=archive.model_config,
            handler=handler,
            runtime=runtime or archive.manifest.get("runtime", "python"),
            cleanup_dir=dest if archive.model_dir.is_relative_to(dest) else None,
            workflow=workflow,
        )
        return await self.add_source(
            name,
            version,
            source,
            initial_workers=initial_workers,
            synchronous=synchronous,
            settings=settings,
            loaded_at_startup=loaded_at_startup,
            make_default=make_default,
            fallback_workers=fallback_workers,
            store_name=location.store_name,
        )

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
            )
            if entry is None:
                entry = self.models[name] = ModelEntry(name, default_version=version)
            entry.versions[version] = model
            if make_default:
                entry.default_version = version
            self._archives[(name, version)] = store_name or source.url
        logger.info("Registered model %s version %s from %s", name, version, source.url)
        try:
            await model.scale(workers, model_settings.max_workers, wait=synchronous)
        except ServeError:
            await self._remove(model)
            raise
        self.changed()
        return model

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
        try:
            await model.scale(min_worker, max_worker, wait=synchronous)
        finally:
            self.changed()  # the new count stands even when some workers failed to start
        return model

    def set_default(self, name: str, version: str) -> ModelVersion:
        """Route unversioned requests to ``version`` from now on (the next request sees it)."""
        model = self.get(name, version)
        self.models[name].default_version = model.version
        self.changed()
        return model

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
        await model.drain(self.config.unregister_model_timeout)
        await model.stop()
        _cleanup(model.source)
        logger.info("Unregistered model %s version %s", name, model.version)
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
        await model.stop()
        _cleanup(model.source)

    async def drain(self, timeout: float) -> None:
        """Let every model finish its queued and running work, then refuse the rest."""
        await asyncio.gather(*(m.drain(timeout) for m in self.all_versions()))

    async def stop(self) -> None:
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
