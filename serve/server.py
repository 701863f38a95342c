"""The frontend process: three HTTP apps, the registry and its workers, one shutdown path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serve import __version__
from serve.access_log import AccessLog
from serve.apps.common import ServerState
from serve.apps.inference import create_inference_app
from serve.apps.management import create_management_app
from serve.apps.metrics import create_metrics_app
from serve.apps.protocols import protocol_routes
from serve.config import Config, host_port
from serve.errors import ServeError
from serve.http_server import bind_socket, run_servers
from serve.metrics import ServerMetrics
from serve.registry import Registry

if TYPE_CHECKING:
    from serve.snapshot import SnapshotStore

logger = logging.getLogger(__name__)


class Server:
    """Owns the listeners, the registry and the shutdown sequence."""

    def __init__(
        self, config: Config, *, state_file: Path | None = None, restore_snapshot: bool = True
    ) -> None:
        self.config = config
        self.state_file = state_file
        self.restore_snapshot = restore_snapshot
        self.stop_event = asyncio.Event()
        self.work_dir = Path(config.work_dir or tempfile.mkdtemp(prefix="lantern-"))
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.metrics = ServerMetrics()
        self.registry = Registry(config, self.work_dir, self.metrics)
        self.metrics.bind(self.registry)  # queue and worker gauges are read when scraped
        self.state = ServerState(config, self.registry, self.metrics, version=__version__)
        self.addresses: dict[str, str] = {}

    def _bind(self) -> dict[str, Any]:
        sockets = {}
        names = ["inference", "management"]
        if self.config.enable_metrics_api:
            names.append("metrics")
        for name in names:
            host, port = host_port(getattr(self.config, f"{name}_address"))
            sock = bind_socket(host, port)
            sockets[name] = sock
            bound = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            self.addresses[name] = f"http://{shown}:{bound}"
        return sockets

    def _apps(self) -> dict[str, Any]:
        from serve.auth import TokenAuth

        if not self.config.disable_token_authorization:
            self.state.auth = TokenAuth.create(self.config)
        apps = {
            "inference": create_inference_app(self.state, protocol_routes(self.state)),
            "management": create_management_app(self.state),
            "metrics": create_metrics_app(self.state),
        }
        if self.state.auth is not None:
            apps["inference"] = self.state.auth.guard(apps["inference"], "inference")
            apps["management"] = self.state.auth.guard(apps["management"], "management")
        # Outermost, so that refused (401) requests are logged and counted too.
        return {
            name: AccessLog(app, self.metrics, resolve_default=name == "inference")
            for name, app in apps.items()
        }

    async def serve(self) -> None:
        """Run until SIGTERM/SIGINT or `stop()`; then drain and stop every worker."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop)
        sockets = self._bind()
        apps = self._apps()
        bindings = [(apps[name], sock) for name, sock in sockets.items()]
        self._write_state_file()
        logger.info(
            "Lantern %s listening: %s",
            __version__,
            ", ".join(f"{k} {v}" for k, v in self.addresses.items()),
        )
        loader = asyncio.create_task(self._load_startup_models())
        drainer = asyncio.create_task(self._drain_on_stop())
        try:
            await run_servers(
                bindings, self.config.http_server, self.stop_event, self.config.drain_timeout
            )
        finally:
            self.stop_event.set()
            loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loader
            await drainer
            await self.registry.stop()
            for sock in sockets.values():
                with contextlib.suppress(OSError):
                    sock.close()
            if self.state.auth is not None:
                self.state.auth.remove_key_file()
            self._remove_state_file()
            if not self.config.work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            logger.info("Lantern stopped")

    def stop(self) -> None:
        if not self.stop_event.is_set():
            logger.info("Stopping: no new requests; finishing those in flight")
        self.stop_event.set()

    async def _drain_on_stop(self) -> None:
        await self.stop_event.wait()
        await self.registry.drain(self.config.drain_timeout)

    async def _load_startup_models(self) -> None:
        try:
            await self._register_startup_models()
        finally:
            self.state.starting = False
            self._write_state_file()  # tells a waiting `serve start` that loading has ended

    async def _register_startup_models(self) -> None:
        from serve.snapshot import SnapshotStore

        snapshots = SnapshotStore(Path(self.config.log_dir) / "config")
        if self.config.snapshot:
            self.registry.listeners.append(lambda: snapshots.save(self.registry, self.config))
        if self.restore_snapshot and self.config.snapshot:
            state = snapshots.latest()
            if state is not None:
                await snapshots.restore(self.registry, state)
                return
        if self.config.model_snapshot:
            await self._load_config_snapshot(snapshots)
            return
        # A model that fails to load stays registered, so /ping reports it (TorchServe's /ping
        # stays blind to such failures).
        models = []
        for spec in expand_models(self.config.load_models, self.config.model_store):
            name, _, url = spec.rpartition("=")
            try:
                models.append(
                    await self.registry.register(
                        url, model_name=name or None, loaded_at_startup=True, synchronous=False
                    )
                )
            except ServeError as exc:
                logger.error("Failed to load model %s at startup: %s", spec, exc.message)
                self.state.startup_failures.append(spec)
        results = await asyncio.gather(*(m.wait_loaded() for m in models), return_exceptions=True)
        for model, result in zip(models, results, strict=True):
            if isinstance(result, Exception):
                logger.error(
                    "Model %s version %s failed to load: %s", model.name, model.version, result
                )
        if self.config.snapshot:
            snapshots.save(self.registry, self.config)

    async def _load_config_snapshot(self, snapshots: SnapshotStore) -> None:
        """TorchServe's ``model_snapshot`` config key: load exactly the models it lists, with
        their settings (TorchServe's KServe images describe their models this way)."""
        from serve.snapshot import SnapshotError, validate

        data = {"model_snapshot": self.config.model_snapshot}
        try:
            validate(data)
        except SnapshotError as exc:
            logger.error("Config 'model_snapshot' cannot be used: %s", exc)
            self.state.startup_failures.append("model_snapshot")
            return
        restored = await snapshots.restore(self.registry, data)
        wanted = sum(len(v) for v in data["model_snapshot"]["models"].values())
        if len(restored) < wanted:
            self.state.startup_failures.append("model_snapshot")

    def _write_state_file(self) -> None:
        if self.state_file is None:
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "pid": os.getpid(),
            "addresses": self.addresses,
            "key_file": str(self.state.auth.key_file) if self.state.auth else None,
            "log_dir": str(Path(self.config.log_dir).resolve()),
            "started": not self.state.starting,
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.state_file)

    def _remove_state_file(self) -> None:
        if self.state_file is not None:
            with contextlib.suppress(FileNotFoundError):
                data = json.loads(self.state_file.read_text())
                if data.get("pid") == os.getpid():
                    self.state_file.unlink()


def expand_models(specs: list[str], model_store: str | None) -> list[str]:
    """``--models`` entries as ``name=url`` or ``url``; ``all`` means every archive in the store."""
    out: list[str] = []
    for spec in specs:
        for part in spec.replace(",", " ").split():
            if part == "all":
                out.extend(_store_archives(model_store))
            else:
                out.append(part)
    return out


def _store_archives(model_store: str | None) -> list[str]:
    if not model_store or not Path(model_store).is_dir():
        return []
    found = []
    for entry in sorted(Path(model_store).iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.name.endswith((".mar", ".tar.gz", ".tgz")):
            found.append(entry.name)
        elif entry.is_dir() and (entry / "MAR-INF" / "MANIFEST.json").is_file():
            found.append(entry.name)
    return found
