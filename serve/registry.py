"""The one owner of models, versions and their workers.

Startup (``--models``), the management API and snapshot restore all go through these methods.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archiver import ArchiveError, open_archive
from serve.config import Config, ModelSettings
from serve.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    ModelNotFound,
    ModelVersionNotFound,
    ServeError,
)
from serve.model import ModelSource, ModelVersion
from serve.sources import ModelSources

if TYPE_CHECKING:
    from serve.metrics import ServerMetrics

logger = logging.getLogger(__name__)


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
    ) -> ModelVersion:
        """Open the archive ``url`` names, add it as a new version and start its workers."""
        path = await self.sources.resolve(url)
        dest = self.extract_dir / uuid.uuid4().hex
        try:
            archive = await asyncio.to_thread(open_archive, path, dest)
        except ArchiveError as exc:
            shutil.rmtree(dest, ignore_errors=True)
            raise BadRequest(f"Invalid model archive {url}: {exc}") from exc
        name = model_name or archive.model_name
        version = str(archive.version or "1.0")
        source = ModelSource(
            url=url,
            model_dir=archive.model_dir,
            manifest=archive.manifest,
            model_config=archive.model_config,
            handler=handler,
            runtime=runtime or archive.manifest.get("runtime", "python"),
            cleanup_dir=dest if archive.model_dir.is_relative_to(dest) else None,
        )
        model_settings = (
            self.config.default_model_settings().merged(archive.model_config).merged(settings or {})
        )
        workers = initial_workers
        if workers is None:
            workers = model_settings.min_workers
        if workers is None:
            workers = self.default_workers()
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
        logger.info("Registered model %s version %s from %s", name, version, url)
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
        from serve.model import _visible_gpus

        return max(1, _visible_gpus(self.config.number_of_gpu))

    async def scale(
        self,
        name: str,
        version: str | None,
        min_worker: int,
        max_worker: int | None,
        *,
        synchronous: bool,
    ) -> ModelVersion:
        if min_worker < 0:
            raise BadRequest("min_worker cannot be negative")
        if max_worker is not None and max_worker < min_worker:
            raise BadRequest("max_worker cannot be less than min_worker")
        model = self.get(name, version)
        await model.scale(min_worker, max_worker, wait=synchronous)
        self.changed()
        return model

    def set_default(self, name: str, version: str) -> ModelVersion:
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
        await model.stop()
        _cleanup(model.source)

    async def drain(self, timeout: float) -> None:
        """Let every model finish its queued and running work, then refuse the rest."""
        await asyncio.gather(*(m.drain(timeout) for m in self.all_versions()))

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.all_versions()))
        for model in self.all_versions():
            _cleanup(model.source)

    def changed(self) -> None:
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
                versions[mv.version] = {
                    "defaultVersion": mv.version == entry.default_version,
                    "marName": mv.source.url,
                    "handler": mv.source.handler,
                    **_settings_dict(mv.settings),
                    "minWorkers": mv.min_workers,
                    "maxWorkers": mv.max_workers,
                }
            models[entry.name] = versions
        return {"modelCount": len(models), "models": models}


def _settings_dict(settings: ModelSettings) -> dict[str, Any]:
    return settings.as_yaml_dict()


def _cleanup(source: ModelSource) -> None:
    if source.cleanup_dir is not None:
        shutil.rmtree(source.cleanup_dir, ignore_errors=True)
