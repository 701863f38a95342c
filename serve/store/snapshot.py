"""Config snapshots: the registry's state after each change, restored by the next start.

Files are ``<log_dir>/config/<timestamp>-snapshot.json``, written atomically (temp file, fsync,
rename); the newest ten are kept. ``model_snapshot`` has TorchServe's shape: ``{"modelCount": N,
"models": {name: {version: {"defaultVersion", "marName", "minWorkers", "maxWorkers", "batchSize",
"maxBatchDelay", "responseTimeout", ...}}}}``. A corrupt or unreadable snapshot is reported and
skipped (the next older one is tried); a version that cannot be restored is reported and skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serve.config import Config

if TYPE_CHECKING:
    from serve.core.model import ModelVersion
    from serve.core.registry import Registry

logger = logging.getLogger(__name__)

_KEEP = 10
# Keys of a version entry that are not model settings.
_NOT_SETTINGS = ("marName", "modelUrl", "defaultVersion", "handler", "runtime")


class SnapshotError(ValueError):
    """A snapshot file that does not hold a usable model snapshot."""


class SnapshotStore:
    """The snapshot folder: write the registry's state, find the newest good one, restore it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def save(self, registry: Registry, config: Config) -> Path | None:
        """Write the registry's state; a failure is logged, never raised (serving goes on)."""
        data = {
            "created": time.time(),
            "model_snapshot": registry.state(),
            "model_store": config.model_store,
        }
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d%H%M%S") + f"{time.time_ns() % 1_000_000_000:09d}"
            path = self.folder / f"{stamp}-snapshot.json"
            tmp = self.folder / f".{stamp}-snapshot.tmp"
            with open(tmp, "w") as fh:
                json.dump(data, fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            logger.error("Could not write a config snapshot: %s", exc)
            return None
        self._prune()
        return path

    def _prune(self) -> None:
        files = sorted(self.folder.glob("*-snapshot.json"))
        for old in files[:-_KEEP]:
            old.unlink(missing_ok=True)

    def latest(self) -> dict[str, Any] | None:
        """The newest snapshot that reads and validates; corrupt ones are logged and skipped."""
        found = self.newest()
        return found[1] if found else None

    def newest(self) -> tuple[Path, dict[str, Any]] | None:
        """`latest` with the file it came from."""
        if not self.folder.is_dir():
            return None
        for path in sorted(self.folder.glob("*-snapshot.json"), reverse=True):
            try:
                data = json.loads(path.read_text())
                validate(data)
            except (OSError, ValueError) as exc:  # JSONDecodeError and SnapshotError included
                logger.error("Skipping corrupt snapshot %s: %s", path, exc)
                continue
            logger.info("Using config snapshot %s", path)
            return path, data
        return None

    async def restore(
        self,
        registry: Registry,
        data: dict[str, Any],
        failures: list[tuple[str, str]] | None = None,
    ) -> list[ModelVersion]:
        """Register every version in ``data`` with its settings, worker count and default.

        Versions load in parallel; one that fails is logged and left out, and added to
        ``failures`` as ``("name version", reason)``. One snapshot is written when all are done
        (not one per version, which could leave a partial newest snapshot).
        """
        failed = failures if failures is not None else []
        models = data["model_snapshot"]["models"]
        logger.info("Restoring %d model(s) from the config snapshot", len(models))
        restored: list[ModelVersion] = []
        with registry.quiet():
            for name, versions in models.items():
                for version, entry in versions.items():
                    try:
                        model = await registry.register(
                            entry["marName"],
                            model_name=name,
                            version=version,  # a versioned folder holds several
                            handler=entry.get("handler"),
                            runtime=entry.get("runtime"),
                            initial_workers=int(entry.get("minWorkers", 0)),
                            synchronous=False,
                            settings={k: v for k, v in entry.items() if k not in _NOT_SETTINGS},
                            loaded_at_startup=True,
                            make_default=bool(entry.get("defaultVersion")),
                            model_url=entry.get("modelUrl"),
                        )
                    except Exception as exc:  # one bad entry must not stop the others
                        logger.error("Could not restore %s version %s: %s", name, version, exc)
                        failed.append((f"{name} {version}", getattr(exc, "message", str(exc))))
                        continue
                    if model.version != version:
                        logger.warning(
                            "Snapshot entry %s version %s now holds version %s",
                            name,
                            version,
                            model.version,
                        )
                    restored.append(model)
            results = await asyncio.gather(
                *(m.wait_loaded() for m in restored), return_exceptions=True
            )
        for model, result in zip(restored, results, strict=True):
            if isinstance(result, Exception):
                logger.error(
                    "Restored model %s version %s failed to load: %s",
                    model.name,
                    model.version,
                    result,
                )
                failed.append((f"{model.name} {model.version}", str(result)))
        registry.changed()
        return restored


def validate(data: Any) -> None:
    """Raise `SnapshotError` unless ``data`` is a snapshot that `restore` can use."""
    if not isinstance(data, dict) or not isinstance(data.get("model_snapshot"), dict):
        raise SnapshotError("no model_snapshot object")
    models = data["model_snapshot"].get("models")
    if not isinstance(models, dict):
        raise SnapshotError("model_snapshot.models is not an object")
    for name, versions in models.items():
        if not isinstance(versions, dict):
            raise SnapshotError(f"model {name!r}: versions are not an object")
        for version, entry in versions.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("marName"), str):
                raise SnapshotError(f"model {name!r} version {version!r}: no marName")
            workers = entry.get("minWorkers", 0)
            if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
                raise SnapshotError(f"model {name!r} version {version!r}: bad minWorkers")
