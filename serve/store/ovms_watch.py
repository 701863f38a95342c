"""Serve the models an OVMS ``config.json`` lists, and follow the file as it changes.

`OvmsConfigWatcher.apply` reads the file (`serve.store.ovms_config`) and brings the registry in
line: a model no longer listed is unloaded, a new one loaded, one whose entry changed reloaded;
the others are left alone. `run` checks the file every ``interval`` seconds and applies it when
its contents change, as OVMS does. A file that cannot be read changes nothing: the error is logged
and the models keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from archiver import ArchiveError
from serve.store.ovms_config import OvmsModel, read_ovms_config
from serve.wire.errors import ServeError

if TYPE_CHECKING:
    from serve.core.model import ModelVersion
    from serve.core.registry import Registry

logger = logging.getLogger(__name__)


class OvmsConfigWatcher:
    def __init__(self, registry: Registry, path: Path, interval: float) -> None:
        self.registry = registry
        self.path = path
        self.interval = max(interval, 0.05)
        self.listed: dict[str, OvmsModel] = {}  # what the last applied file listed
        self._seen: bytes | None = None
        self._stop = asyncio.Event()

    async def apply(self) -> tuple[list[ModelVersion], list[tuple[str, str]]]:
        """Read the file and act on what changed: (versions registered, (model, error) pairs)."""
        try:
            self._seen = await asyncio.to_thread(self.path.read_bytes)
            models = await asyncio.to_thread(read_ovms_config, self.path)
        except (OSError, ArchiveError) as exc:
            logger.error("OVMS configuration not applied: %s", exc)
            return [], [(str(self.path), str(exc))]
        wanted = {m.name: m for m in models}
        registered: list[ModelVersion] = []
        failures: list[tuple[str, str]] = []
        for name in sorted(set(self.listed) - set(wanted)):
            logger.info("OVMS configuration: unloading %s (no longer listed)", name)
            await self._unload(name)
        for name, model in wanted.items():
            if self.listed.get(name) == model and name in self.registry.models:
                continue
            if name in self.registry.models:
                logger.info("OVMS configuration: reloading %s (its entry changed)", name)
                await self._unload(name)
            try:
                registered.append(await self._load(model))
            except ServeError as exc:
                logger.error("OVMS configuration: model %s failed to load: %s", name, exc.message)
                failures.append((name, exc.message))
        self.listed = wanted
        return registered, failures

    async def _load(self, model: OvmsModel) -> ModelVersion:
        store = self.registry.sources.store
        base = model.base_path.resolve()
        url = str(base)
        if store is not None and base.is_relative_to(store) and base != store:
            url = base.relative_to(store).as_posix()  # inside the store: no allowed_urls needed
        return await self.registry.register(
            url, model_name=model.name, overlay=model.overlay, synchronous=False
        )

    async def _unload(self, name: str) -> None:
        if name not in self.registry.models:
            return
        try:
            await self.registry.unregister_all(name)
        except ServeError as exc:
            logger.error("OVMS configuration: could not unload %s: %s", name, exc.message)

    async def run(self) -> None:
        """Re-apply the file whenever its contents change, until `stop`."""
        while not self._stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)
            if self._stop.is_set():
                return
            try:
                current = await asyncio.to_thread(self.path.read_bytes)
            except OSError:
                continue  # being replaced: looked at again next time
            if current != self._seen:
                logger.info("OVMS configuration %s changed: applying it", self.path)
                try:
                    await self.apply()
                except Exception:  # a bad round must not end the watching
                    logger.exception("Applying the OVMS configuration failed")

    def stop(self) -> None:
        self._stop.set()
