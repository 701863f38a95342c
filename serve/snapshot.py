"""Config snapshots: the registry's state after each change, restored by the next start.

Files are ``<log_dir>/config/<timestamp>-snapshot.json``, written atomically. A corrupt or
unreadable snapshot is reported and skipped; the newest readable one wins.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serve.config import Config
from serve.errors import ServeError

if TYPE_CHECKING:
    from serve.registry import Registry

logger = logging.getLogger(__name__)

_KEEP = 10


class SnapshotStore:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def save(self, registry: Registry, config: Config) -> Path | None:
        data = {
            "created": time.time(),
            "model_snapshot": registry.state(),
            "model_store": config.model_store,
        }
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d%H%M%S") + f"{time.time_ns() % 1_000_000_000:09d}"
            path = self.folder / f"{stamp}-snapshot.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=2))
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
        """The newest snapshot that reads and parses; corrupt ones are logged and skipped."""
        if not self.folder.is_dir():
            return None
        for path in sorted(self.folder.glob("*-snapshot.json"), reverse=True):
            try:
                data = json.loads(path.read_text())
                models = data["model_snapshot"]["models"]
                if not isinstance(models, dict):
                    raise ValueError("models is not an object")
                return data
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.error("Skipping corrupt snapshot %s: %s", path, exc)
        return None

    async def restore(self, registry: Registry, data: dict[str, Any]) -> None:
        """Register every version in the snapshot with its settings and worker count."""
        models = data["model_snapshot"]["models"]
        logger.info("Restoring %d model(s) from snapshot", len(models))
        for name, versions in models.items():
            for version, entry in versions.items():
                try:
                    await registry.register(
                        entry["marName"],
                        model_name=name,
                        handler=entry.get("handler"),
                        initial_workers=int(entry.get("minWorkers", 1)),
                        synchronous=True,
                        settings={
                            k: v
                            for k, v in entry.items()
                            if k not in ("marName", "defaultVersion", "handler")
                        },
                        loaded_at_startup=True,
                        make_default=bool(entry.get("defaultVersion")),
                    )
                except (ServeError, KeyError, TypeError, ValueError) as exc:
                    logger.error("Could not restore %s version %s: %s", name, version, exc)
