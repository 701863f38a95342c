"""The frontend process: three HTTP apps, the registry and its workers, one shutdown path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archiver import ArchiveError
from serve import __version__
from serve.cli.startup_report import StartupReport
from serve.config import Config, host_port
from serve.core import offload
from serve.core.model import WorkerFactory, spawn_worker
from serve.core.registry import Registry
from serve.http.access_log import AccessLog
from serve.http.body_limit import DeclaredSizeLimit
from serve.http.common import ServerState
from serve.http.draining import Draining
from serve.http.inference import create_inference_app
from serve.http.management import create_management_app
from serve.http.metrics import create_metrics_app
from serve.http.openai import openai_routes
from serve.http.protocols import protocol_routes
from serve.http.server_choice import resolve_http_server
from serve.http.servers import bind_socket, run_servers
from serve.metrics.collectors import UpdateCollector
from serve.metrics.config import load_policy
from serve.metrics.prometheus import ServerMetrics
from serve.store.layouts import recognise, scan_store
from serve.store.ovms_watch import OvmsConfigWatcher
from serve.store.tfs_batching import BatchingError, read_batching
from serve.store.tfs_config import (
    ConfigWatcher,
    ModelsConfigError,
    read_models_config,
    single_model,
)
from serve.store.watcher import StoreWatcher
from serve.wire.errors import ServeError
from serve.workflows.manager import Workflows

if TYPE_CHECKING:
    from serve.core.model import ModelVersion
    from serve.http.auth import TokenAuth
    from serve.store.snapshot import SnapshotStore

logger = logging.getLogger(__name__)


class Server:
    """Owns the listeners, the registry and the shutdown sequence."""

    def __init__(
        self,
        config: Config,
        *,
        state_file: Path | None = None,
        restore_snapshot: bool = True,
        worker_factory: WorkerFactory = spawn_worker,
        on_started: Callable[[Server], None] | None = None,
    ) -> None:
        self.config = config
        self.on_started = on_started  # called once the startup models have loaded (or failed)
        self.state_file = state_file
        self.restore_snapshot = restore_snapshot
        self.stop_event = asyncio.Event()
        self.work_dir = Path(config.work_dir or tempfile.mkdtemp(prefix="lantern-"))
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.metrics = ServerMetrics()
        self.metrics.handler.policy = load_policy(config)  # metrics_config, auto-detect, mode
        self.registry = Registry(config, self.work_dir, self.metrics, worker_factory=worker_factory)
        self.metrics.bind(self.registry)  # queue and worker gauges are read when scraped
        self.metrics.registry.register(UpdateCollector(self.registry))
        self.watcher: StoreWatcher | None = None
        self.ovms_watcher: OvmsConfigWatcher | None = None
        if config.ovms_config:
            self.ovms_watcher = OvmsConfigWatcher(
                self.registry, Path(config.ovms_config), config.watch_interval
            )
        self.state = ServerState(config, self.registry, self.metrics, version=__version__)
        self.state.workflows = Workflows(config, self.registry, self.work_dir, self.metrics)
        self.addresses: dict[str, str] = {}
        self.startup = StartupReport()  # told to `serve start` through the server record
        self.tls: Any = None  # serve.http.tls.TlsFiles when any address is https

    def _bind(self) -> dict[str, Any]:
        sockets = {}
        names = ["inference", "management"]
        if self.config.enable_metrics_api:
            names.append("metrics")
        for name in names:
            address = getattr(self.config, f"{name}_address")
            host, port = host_port(address)
            sock = _bind_named(name, address, host, port)
            sockets[name] = sock
            bound = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            self.addresses[name] = f"{_scheme(address)}://{shown}:{bound}"
        return sockets

    def _protocol_routes(self) -> list[Any]:
        """KServe v1 and OIP, the OpenAI routes before them (they win where both match)."""
        routes = openai_routes(self.state) if self.config.enable_openai_api else []
        return routes + protocol_routes(self.state)

    def apps(self) -> dict[str, Any]:
        """The three ASGI apps with their edge middleware, as the listeners serve them (tests
        call them in process, through httpx's ASGI transport)."""
        from serve.http.auth import TokenAuth
        from serve.http.token_guard import TokenGuard

        if not self.config.disable_token_authorization:
            self.state.auth = TokenAuth.create(self.config)
        apps = {
            "inference": create_inference_app(self.state, self._protocol_routes()),
            "management": create_management_app(self.state),
            "metrics": create_metrics_app(self.state),
        }
        if self.state.auth is not None:
            for kind in ("inference", "management"):
                apps[kind] = TokenGuard(apps[kind], self.state.auth, kind)
        apps = _with_console(apps, self.config, self.state.auth)  # page files open; rest guarded
        apps = _with_cors(apps, self.config)  # outside auth: a browser's preflight has no token
        apps = self._answer_grpc_clients(apps)
        if self.state.auth is None and self.config.check_host_header:
            apps = _with_host_check(apps, self.config)  # DNS rebinding, with no token to stop it
        # Outermost, so that refused (401) requests are logged and counted too; inside it, the
        # 503 for requests that arrive during a drain and the 413 for declared oversized bodies.
        limit = self.config.max_request_size
        return {
            name: AccessLog(
                Draining(DeclaredSizeLimit(app, limit), self.stop_event),
                self.metrics,
                resolve_default=name == "inference",
            )
            for name, app in apps.items()
        }

    async def serve(self) -> None:
        """Run until SIGTERM/SIGINT or `stop()`; then drain and stop every worker."""
        http_server = resolve_http_server(self.config)  # raises ConfigError before binding
        logger.info("%s", http_server.describe())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop)
        sockets = self._bind()
        self.tls = _server_tls(self.config, self.work_dir)
        apps = self.apps()
        # Triton Python backend models call other models (BLS) through this server's OIP route.
        self.registry.bls = {
            "url": self.addresses["inference"],
            "key_file": str(self.state.auth.key_file) if self.state.auth else None,
        }
        grpc_servers = await self._start_grpc()
        bindings = [(apps[name], sock) for name, sock in sockets.items()]
        tls = [self.tls if self.addresses[name].startswith("https:") else None for name in sockets]
        self._write_state_file()
        logger.info(
            "Lantern %s listening: %s",
            __version__,
            ", ".join(f"{k} {v}" for k, v in self.addresses.items()),
        )
        loader = asyncio.create_task(self.load_startup_models())
        drained = asyncio.Event()
        drainer = asyncio.create_task(self._drain_on_stop(drained))
        watching = asyncio.create_task(self._watch_store(loader))
        try:
            await run_servers(
                bindings,
                http_server.kind,
                self.stop_event,
                self.config.drain_timeout,
                drained=drained,
                tls=tls,
                max_header_size=self.config.max_header_size,
            )
        finally:
            self.stop_event.set()
            loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loader
            await self._stop_watching(watching)
            await drainer
            if grpc_servers is not None:
                await grpc_servers.wait_stopped()
            await self.registry.stop()
            await asyncio.to_thread(offload.shutdown)  # the decoding process, if one started
            if self.state.workflows is not None:
                self.state.workflows.close()
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

    def _answer_grpc_clients(self, apps: dict[str, Any]) -> dict[str, Any]:
        """A gRPC client on an HTTP port gets a gRPC error naming the gRPC address."""
        from serve.grpc.http_port import GrpcOnHttp

        return {name: GrpcOnHttp(app, self.addresses, name) for name, app in apps.items()}

    async def _start_grpc(self) -> Any:
        """TorchServe's gRPC listeners (``serve/grpc``), unless ``enable_grpc`` is off."""
        if not self.config.enable_grpc:
            return None
        from serve.grpc.server import GrpcListenError, GrpcServers

        servers = GrpcServers(self.state, self.stop_event)
        try:
            await servers.start()
        except GrpcListenError as exc:  # names the address and why, as for the HTTP ones: exit 4
            error = ListenError(str(exc))
            error.errno = exc.errno
            raise error from exc
        self.addresses.update(servers.addresses)
        return servers

    def stop(self) -> None:
        if not self.stop_event.is_set():
            logger.info("Stopping: no new requests; finishing those in flight")
        self.stop_event.set()
        if self.watcher is not None:
            self.watcher.stop()

    async def _watch_store(self, loader: asyncio.Task[None]) -> None:
        """With ``watch_model_store``: keep the served versions in line with the store
        (serve/store/watcher.py), from when the startup models are loaded until the server stops."""
        config = self.config
        tf_serving = bool(config.model_config_file or config.model_base_path)
        watching = config.watch_model_store or config.model_control_mode == "poll"
        following = self.ovms_watcher is not None
        if not (watching and config.model_store) and not following and not tf_serving:
            return
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(loader)
        if self.stop_event.is_set():
            return
        loops = []
        if self.ovms_watcher is not None:  # OVMS's config.json, re-read when it changes
            loops.append(self.ovms_watcher.run())
        if tf_serving:  # TF Serving's models.config or --model_base_path
            self.watcher = self._config_watcher()
            if self.watcher is not None:
                loops.append(self.watcher.run())
        elif watching and config.model_store:
            self.watcher = StoreWatcher(
                self.registry, Path(config.model_store), config.watch_interval
            )
            loops.append(self.watcher.run())
        await asyncio.gather(*loops)

    def _config_watcher(self) -> StoreWatcher | None:
        """TF Serving's start: the models of ``model_config_file``, or ``model_name`` from
        ``model_base_path`` (serve/store/tfs_config.py); None (and said) when the file is bad."""
        from serve.grpc.tfs_warmup import Warmup  # TF Serving's messages, imported only here
        from serve.grpc.tfserving import TfServingService

        config = self.config
        config_file = Path(config.model_config_file) if config.model_config_file else None
        try:
            if config_file is not None:
                models = read_models_config(config_file)
            else:
                models = single_model(str(config.model_name), str(config.model_base_path))
            batching = None
            if config.batching_parameters_file:
                batching = read_batching(Path(config.batching_parameters_file))
        except (ModelsConfigError, BatchingError) as exc:
            logger.error("%s", exc)
            self.startup.fail(str(config_file or config.batching_parameters_file), str(exc))
            return None
        return ConfigWatcher(
            self.registry,
            self.state.labels,
            config_file=config_file,
            models=models,
            interval=config.watch_interval,
            config_poll=config.model_config_file_poll_wait_seconds,
            batching=batching,
            warmup=Warmup(TfServingService(self.state)).replay,
        )

    async def _stop_watching(self, watching: asyncio.Task[None]) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.ovms_watcher is not None:
            self.ovms_watcher.stop()
        try:
            await asyncio.wait_for(asyncio.shield(watching), 1.0)
        except asyncio.TimeoutError:  # a load in progress: the registry stops its workers
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        except asyncio.CancelledError:
            pass

    async def _drain_on_stop(self, drained: asyncio.Event) -> None:
        """After SIGTERM: let the accepted work finish, then let the HTTP servers close."""
        await self.stop_event.wait()
        try:
            await self.registry.drain(self.config.drain_timeout)
        finally:
            drained.set()

    async def load_startup_models(self) -> None:
        """The snapshot, ``model_snapshot`` or ``--models``, once; `serve` runs it beside the
        listeners."""
        try:
            await self._register_startup_models()
        finally:
            self.state.starting = False
            self._write_state_file()  # tells a waiting `serve start` that loading has ended
            if self.on_started is not None:
                self.on_started(self)

    async def _register_startup_models(self) -> None:
        from serve.store.snapshot import SnapshotStore

        snapshots = SnapshotStore(Path(self.config.log_dir) / "config")
        found = snapshots.newest() if self.restore_snapshot and self.config.snapshot else None
        if found is not None and self.config.load_models:
            # Models named for this start (--models) win over the snapshot; unlike TorchServe.
            self.startup.passed_over = str(found[0].resolve())
            logger.info(
                "Not restoring the config snapshot %s: loading %s instead",
                found[0],
                ",".join(self.config.load_models),
            )
            found = None
        if found is not None:
            await self._restore(snapshots, *found)
        elif self.config.model_snapshot:
            await self._load_config_snapshot(snapshots)
        else:
            await self._load_models()
        if self.ovms_watcher is not None:
            await self._load_ovms_config(self.ovms_watcher)
        if self.config.snapshot:
            if self.startup.failed:
                # A snapshot of a start that went wrong (a missing archive, a model that does not
                # load) would replace the good one and poison the next start.
                logger.warning("Not writing a config snapshot: some startup models did not load")
            else:
                snapshots.save(self.registry, self.config)

            def save() -> None:
                snapshots.save(self.registry, self.config)

            self.registry.listeners.append(save)

    async def _restore(self, snapshots: Any, path: Path, data: dict[str, Any]) -> None:
        """TorchServe's rule: without a config file (and here, without ``--models``), the last
        snapshot is what loads."""
        failures: list[tuple[str, str]] = []
        restored = await snapshots.restore(self.registry, data, failures)
        self.startup.snapshot = str(path.resolve())
        self.startup.restored = [f"{m.name} {m.version}" for m in restored]
        self._restore_failures(restored, failures)

    def _restore_failures(
        self, restored: list[ModelVersion], failures: list[tuple[str, str]]
    ) -> None:
        for model, reason in failures:
            self.startup.fail(model, reason)
            if not any(f"{m.name} {m.version}" == model for m in restored):
                self.state.startup_failures.append(model)  # never registered: /ping says so

    async def _load_models(self) -> None:
        # A model that fails to load stays registered, so /ping reports it (TorchServe's /ping
        # stays blind to such failures).
        models = []
        specs = expand_models(self.config.load_models, self.config.model_store, self.startup)
        for spec in specs:
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
                self.startup.fail(spec, exc.message)
        results = await asyncio.gather(*(m.wait_loaded() for m in models), return_exceptions=True)
        for model, result in zip(models, results, strict=True):
            if isinstance(result, Exception):
                logger.error(
                    "Model %s version %s failed to load: %s", model.name, model.version, result
                )
                self.startup.fail(f"{model.name} {model.version}", str(result))
        self.startup.notes.extend(self.registry.notes.values())
        self._note_store_outcome(specs, sum(not isinstance(r, Exception) for r in results))

    def _note_store_outcome(self, specs: list[str], loaded: int) -> None:
        """``--models all`` that found entries in the store but loaded none says so plainly."""
        if "all" not in " ".join(self.config.load_models).replace(",", " ").split():
            return
        if loaded:
            return
        store = self.config.model_store
        found = len(specs) + len(self.startup.skipped)
        if found:
            line = (
                f"--models all loaded no model: the model store {store} has {found} "
                f"entr{'ies' if found != 1 else 'y'}, none of which loaded (see above)."
            )
        else:
            line = f"--models all: the model store {store} holds no models; none are served."
        logger.warning("%s", line)
        self.startup.notes.append(line)

    async def _load_ovms_config(self, watcher: OvmsConfigWatcher) -> None:
        """The models OVMS's config.json lists, loaded as ``--models`` are."""
        models, failures = await watcher.apply()
        for name, reason in failures:
            self.state.startup_failures.append(name)
            self.startup.fail(name, reason)
        results = await asyncio.gather(*(m.wait_loaded() for m in models), return_exceptions=True)
        for model, result in zip(models, results, strict=True):
            if isinstance(result, Exception):
                self.startup.fail(f"{model.name} {model.version}", str(result))
        self.startup.notes.extend(
            line for line in self.registry.notes.values() if line not in self.startup.notes
        )

    async def _load_config_snapshot(self, snapshots: SnapshotStore) -> None:
        """TorchServe's ``model_snapshot`` config key: load exactly the models it lists, with
        their settings (TorchServe's KServe images describe their models this way)."""
        from serve.store.snapshot import SnapshotError, validate

        data = {"model_snapshot": self.config.model_snapshot}
        try:
            validate(data)
        except SnapshotError as exc:
            logger.error("Config 'model_snapshot' cannot be used: %s", exc)
            self.state.startup_failures.append("model_snapshot")
            self.startup.fail("model_snapshot", str(exc))
            return
        failures: list[tuple[str, str]] = []
        restored = await snapshots.restore(self.registry, data, failures)
        self._restore_failures(restored, failures)

    def _write_state_file(self) -> None:
        from serve.cli import server_record

        if self.state_file is None:
            return
        data = {
            "addresses": self.addresses,
            "key_file": str(self.state.auth.key_file) if self.state.auth else None,
            "log_dir": str(Path(self.config.log_dir).resolve()),
            "started": not self.state.starting,
            "startup": self.startup.as_dict(),
            "certificate_file": str(self.tls.certfile) if self.tls else None,
        }
        server_record.write(self.state_file, data)

    def _remove_state_file(self) -> None:
        from serve.cli import server_record

        if self.state_file is not None:
            server_record.remove_own(self.state_file)


def expand_models(
    specs: list[str],
    model_store: str | None,
    report: StartupReport | None = None,
    *,
    archives_only: bool = False,
) -> list[str]:
    """``--models`` entries as ``name=url`` or ``url``; ``all`` means every model in the store
    (`serve.store.layouts.scan_store`: archives, Triton and OVMS folders, bare model files;
    ``archives_only``: archives alone, for the Ray adapter, which opens archives itself).
    The entries ``all`` skips are logged and added to ``report``, with the reason."""
    out: list[str] = []
    for spec in specs:
        for part in spec.replace(",", " ").split():
            if part != "all":
                out.append(part)
                continue
            if not model_store:
                continue
            listing = scan_store(Path(model_store))
            if archives_only:
                listing.models = [
                    entry for entry in listing.models if _is_archive(Path(model_store) / entry)
                ]
            out.extend(listing.models)
            for name, reason in listing.skipped:
                logger.warning("Skipped %s in the model store: %s", name, reason)
                if report is not None:
                    report.skipped.append((name, reason))
    return out


def _is_archive(path: Path) -> bool:
    try:
        return recognise(path).kind == "archive"
    except ArchiveError:
        return False


class ListenError(OSError):
    """An address that cannot be listened on; the message names it."""


def _bind_named(name: str, address: str, host: str, port: int) -> Any:
    try:
        return bind_socket(host, port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        error = ListenError(f"Cannot listen on {name} address {address}: {reason}")
        error.errno = exc.errno
        raise error from exc


def _scheme(address: str) -> str:
    return "https" if address.strip().lower().startswith("https://") else "http"


def _server_tls(config: Config, work_dir: Path) -> Any:
    """The certificate and key for the https listeners (serve.http.tls), or None if none is."""
    addresses = [config.inference_address, config.management_address, config.metrics_address]
    if not any(_scheme(a) == "https" for a in addresses):
        return None
    from serve.http.tls import server_tls_files

    return server_tls_files(config, work_dir)


def _with_cors(apps: dict[str, Any], config: Config) -> dict[str, Any]:
    from serve.http.cors import CorsPolicy

    policy = CorsPolicy.from_config(config)
    if policy is None:
        return apps
    return {name: policy.wrap(app) for name, app in apps.items()}


def _with_host_check(apps: dict[str, Any], config: Config) -> dict[str, Any]:
    from serve.http.host_guard import HostGuard, HostPolicy

    guarded = {}
    for name, app in apps.items():
        host, _ = host_port(getattr(config, f"{name}_address"))
        policy = HostPolicy(host, config.allowed_hosts)
        guarded[name] = HostGuard(app, policy, protocols=name == "inference")
    return guarded


def _with_console(apps: dict[str, Any], config: Config, auth: TokenAuth | None) -> dict[str, Any]:
    """The console on the management port, over the guarded apps (serve/http/console.py); its
    metrics need the management key, as the rest of the management port does."""
    if not config.console_path:
        return apps
    from serve.http.console import ConsoleMount
    from serve.http.token_guard import TokenGuard

    metrics = apps["metrics"] if config.enable_metrics_api else None
    if metrics is not None and auth is not None:
        metrics = TokenGuard(metrics, auth, "management")
    console = ConsoleMount(apps["management"], apps["inference"], metrics, config.console_path)
    return {**apps, "management": console}
