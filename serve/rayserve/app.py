"""Lantern as a Ray Serve application: one deployment per model version, one ingress.

- `LanternModel` replicas run the worker's own code: the archive is opened with the archiver's
  safe extraction, the handler is loaded by ``serve.worker.main.load`` and each batch runs through
  ``serve.worker.main.run_items`` as the same messages a worker process gets over its socket
  (`serve.wire.messages`; here in-process: the messages are the contract, Ray carries the
  requests). Batches are formed by ``@serve.batch`` with the model's ``batchSize`` and
  ``maxBatchDelay``.
- `LanternIngress` answers Lantern's routes through Ray's HTTP proxy: ``/ping``,
  ``/predictions/{model}[/{version}]``, KServe v1 ``/v1/models/{m}:predict``, Open Inference
  Protocol ``/v2/...`` (health, readiness, ``infer``), and the read-only management routes
  ``GET /models`` and ``GET /models/{model}[/{version}]``. A request whose replica died is retried
  once on another replica, as Lantern's own dispatcher does.

`build_app` is the application builder a Ray Serve config names:
``import_path: serve.rayserve.app:build_app`` with ``args: {model_store: ..., models: [...]}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from archiver import open_archive
from serve import __version__
from serve.config import Config, ModelSettings
from serve.core.jobs import BatchItem
from serve.core.params import parse_bool, parse_int
from serve.http.common import NO_CACHE_HEADERS, error_response, request_id
from serve.http.inputs import read_body, read_params, request_timeout
from serve.http.protocols import error_response as protocol_error_response
from serve.http.protocols import oip_item
from serve.rayserve import dashboard
from serve.rayserve.plan import plan_deployment, replica_options
from serve.server import expand_models
from serve.wire import KSERVE_V1, OIP, PROTOCOL_HEADER, oip
from serve.wire.errors import (
    BadRequest,
    GatewayTimeout,
    NotFound,
    ServeError,
    response_too_large,
)
from serve.wire.messages import ErrorItem, ResultItem, WorkerSpec
from serve.wire.tensor_params import decode_bundle, is_bundle

logger = logging.getLogger("ray.serve")

APP_NAME = "lantern"
DEFAULT_DASHBOARD = "http://127.0.0.1:8265"


@serve.deployment
class LanternModel:
    """One replica of a model version: its archive, its handler, batches through the worker code."""

    def __init__(
        self,
        name: str,
        version: str,
        archive: str,
        handler: str | None,
        settings: dict[str, Any],
        max_batch_size: int,
        batch_wait_timeout_s: float,
    ) -> None:
        from serve.worker.main import _cap_threads, load

        self.workdir = Path(tempfile.mkdtemp(prefix="lantern-ray-"))
        opened = open_archive(Path(archive), self.workdir / "model")
        gpu_ids = ray.get_gpu_ids()
        spec = WorkerSpec(
            model_name=name,
            model_version=version,
            model_dir=str(opened.model_dir),
            manifest=opened.manifest,
            handler=handler,
            batch_size=max_batch_size,
            gpu_id=0 if gpu_ids else None,  # Ray sets CUDA_VISIBLE_DEVICES to the replica's GPU
            num_threads=settings.get("num_threads") or 1,
            model_yaml_config=opened.model_config,
            server_version=__version__,
        )
        _cap_threads(spec)
        self.service, self.context = load(spec)
        self.infer.set_max_batch_size(max_batch_size)
        self.infer.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def infer(self, items: list[BatchItem]) -> list[ResultItem | ErrorItem]:
        from serve.worker.main import run_items

        result = await asyncio.to_thread(run_items, self.service, self.context, items, True)
        return result.items

    async def __call__(self, item: BatchItem) -> ResultItem | ErrorItem:
        return await self.infer(item)

    def where(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}


@dataclass(frozen=True)
class ModelEntry:
    """What the ingress knows of one model version."""

    name: str
    version: str
    url: str
    deployment: str
    settings: dict[str, Any]


_PREDICT = re.compile(r"^/(predictions|explanations)/([^/]+)(?:/([^/]+))?/?$")
_V1 = re.compile(r"^/v1/models/([^/:]+)(?:/versions/([^/:]+))?:(predict|explain)$")
_V2_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
_V2_READY = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/ready$")
_DESCRIBE = re.compile(r"^/models/([^/]+)(?:/([^/]+))?$")


@serve.deployment(ray_actor_options={"num_cpus": 0})
class LanternIngress:
    """Lantern's routes through Ray's HTTP proxy, onto the model deployments' handles."""

    def __init__(
        self,
        handles: dict[str, Any],
        entries: list[dict[str, Any]],
        max_request_size: int,
        max_response_size: int,
        dashboard: str = DEFAULT_DASHBOARD,
    ) -> None:
        self.handles = handles  # deployment name -> DeploymentHandle
        self.entries = [ModelEntry(**e) for e in entries]
        self.max_request_size = max_request_size
        self.max_response_size = max_response_size
        self.dashboard = dashboard.rstrip("/")  # Ray's REST API, where scaling is applied

    def resolve(self, name: str, version: str | None) -> ModelEntry:
        versions = [e for e in self.entries if e.name == name]
        if not versions:
            raise NotFound(f"Model not found: {name}")
        if version is None:
            return versions[0]
        for entry in versions:
            if entry.version == version:
                return entry
        raise NotFound(f"Model version not found: {name} version {version}")

    async def submit(self, entry: ModelEntry, item: BatchItem, timeout: float | None) -> ResultItem:
        """Run one request on the model's deployment; retried once if its replica died."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError

        handle = self.handles[entry.deployment]
        limit = min(timeout, entry.settings["response_timeout"]) if timeout else None
        limit = limit or entry.settings["response_timeout"]
        for attempt in (1, 2):
            try:
                result = await asyncio.wait_for(handle.remote(item), limit)
                break
            except (ActorDiedError, ActorUnavailableError) as exc:
                if attempt == 2:
                    raise ServeError(
                        f"The replica died while running request {item.request_id}."
                    ) from exc
                logger.warning("Replica died under request %s; retrying once", item.request_id)
            except asyncio.TimeoutError:
                raise GatewayTimeout(
                    f"Request {item.request_id} timed out after {limit:g} s."
                ) from None
        if isinstance(result, ErrorItem):
            raise result.exception()
        return result

    async def __call__(self, request: Request) -> Response:
        rid = request_id(request)
        path = request.url.path
        protocol = path.startswith(("/v1/", "/v2"))
        try:
            response = await self.route(request, path, rid)
        except ServeError as err:
            response = protocol_error_response(err, rid) if protocol else error_response(err, rid)
        # Ray's proxy sets x-request-id itself, to the id it put in the request (``rid`` here).
        if "x-request-id" in response.headers:
            del response.headers["x-request-id"]
        return response

    async def route(self, request: Request, path: str, rid: str) -> Response:
        method = request.method
        if path == "/ping" and method == "GET":
            return _json({"status": "Healthy"})
        if path in ("/v2/health/live", "/v2/health/ready") and method == "GET":
            return _json({"live": True} if path.endswith("live") else {"ready": True})
        if path == "/models" and method == "GET":
            return _json({"models": self.list_models()})
        if (match := _DESCRIBE.match(path)) and method == "GET":
            return _json(await self.describe(match[1], match[2]))
        if (match := _DESCRIBE.match(path)) and method == "PUT":
            return await self.scale(request, match[1], match[2])
        if (match := _PREDICT.match(path)) and method in ("POST", "PUT"):
            return await self.predict(request, rid, match[2], match[3], match[1] == "explanations")
        if (match := _V1.match(path)) and method == "POST":
            return await self.v1_predict(request, rid, match[1], match[2], match[3] == "explain")
        if (match := _V2_INFER.match(path)) and method == "POST":
            return await self.v2_infer(request, rid, match[1], match[2])
        if (match := _V2_READY.match(path)) and method == "GET":
            self.resolve(match[1], match[2])
            return _json({"name": match[1], "ready": True})
        raise NotFound("Requested resource is not found, please refer to API document.")

    async def predict(
        self, request: Request, rid: str, name: str, version: str | None, explain: bool
    ) -> Response:
        entry = self.resolve(name, version)
        params = await read_params(request, self.max_request_size)
        headers = {k: v for k, v in request.headers.items() if not k.startswith("x-lantern-")}
        if explain:
            headers["explain"] = "True"
        item = BatchItem(rid, headers, params)
        result = await self.submit(entry, item, request_timeout(request))
        return self.response(result, rid, result.content_type or "application/octet-stream")

    async def v1_predict(
        self, request: Request, rid: str, name: str, version: str | None, explain: bool
    ) -> Response:
        entry = self.resolve(name, version)
        body = await read_body(request, self.max_request_size)
        headers = _protocol_headers(request, KSERVE_V1)
        if explain:
            headers["explain"] = "True"
        item = BatchItem(rid, headers, [("body", "application/json", body)])
        result = await self.submit(entry, item, request_timeout(request))
        return self.response(result, rid, "application/json")

    async def v2_infer(
        self, request: Request, rid: str, name: str, version: str | None
    ) -> Response:
        entry = self.resolve(name, version)
        body = await read_body(request, self.max_request_size)
        infer = oip.parse_request(
            body, oip.header_length(request.headers.get(oip.HEADER_LENGTH), len(body))
        )
        item = oip_item(rid, _protocol_headers(request, OIP), infer)
        timeout = request_timeout(request)
        if infer.timeout_us:
            timeout = min(filter(None, (timeout, infer.timeout_us / 1e6)))
        result = await self.submit(entry, item, timeout)
        if not is_bundle(result.content_type):
            raise ServeError("The model did not answer with tensors.")
        tensors = decode_bundle(result.body, result.content_type or "")
        payload, extra = oip.build_response(infer, entry.name, entry.version, tensors)
        return Response(payload, 200, headers={**NO_CACHE_HEADERS, **extra, "x-request-id": rid})

    def response(self, result: ResultItem, rid: str, media_type: str) -> Response:
        if len(result.body) > self.max_response_size:
            raise response_too_large(self.max_response_size)
        headers = {**NO_CACHE_HEADERS, **result.headers, "x-request-id": rid}
        return Response(result.body, result.status, headers=headers, media_type=media_type)

    async def scale(self, request: Request, name: str, version: str | None) -> Response:
        """``PUT /models/{m}[/{v}]?min_worker=&max_worker=&synchronous=``, as TorchServe answers
        it: the deployment's replicas change through Ray's own config (a lightweight update of
        ``num_replicas`` or ``autoscaling_config``; nothing else restarts)."""
        entry = self.resolve(name, version)
        query = request.query_params
        low = parse_int(query, "min_worker", 1)
        high = parse_int(query, "max_worker", low)
        assert low is not None and high is not None
        if low < 1:
            raise BadRequest(
                "A Ray deployment keeps at least one replica: min_worker must be >= 1."
            )
        options = scaling_options(low, max(low, high))
        await asyncio.to_thread(self._update_deployment, entry.deployment, options)
        if not parse_bool(query.get("synchronous"), False):
            return _json({"status": "Processing worker updates..."}, 202)
        deadline = time.monotonic() + entry.settings["response_timeout"]
        while _ready(await asyncio.to_thread(_replicas, entry.deployment)) != low:
            if time.monotonic() > deadline:
                return _json({"status": "Workers scaling in progress..."}, 206)
            await asyncio.sleep(0.5)
        return _json(
            {"status": f"Workers scaled to {low} for model: {entry.name}, version: {entry.version}"}
        )

    def _update_deployment(self, deployment: str, options: dict[str, Any]) -> None:
        """Put ``options`` over ``deployment``'s in the running application's config."""
        details = _dashboard("GET", f"{self.dashboard}/api/serve/applications/")
        app = dict(details["applications"][APP_NAME]["deployed_app_config"])
        others = [d for d in app.get("deployments") or [] if d.get("name") != deployment]
        app["deployments"] = [*others, {"name": deployment, **options}]
        http = details.get("http_options") or {}
        body = {
            "proxy_location": details.get("proxy_location") or "EveryNode",
            "http_options": {k: http[k] for k in ("host", "port") if k in http},
            "applications": [app],
        }
        _dashboard("PUT", f"{self.dashboard}/api/serve/applications/", body)

    def list_models(self) -> list[dict[str, str]]:
        seen: dict[str, ModelEntry] = {}
        for entry in self.entries:
            seen.setdefault(entry.name, entry)
        return [{"modelName": e.name, "modelUrl": e.url} for e in seen.values()]

    async def describe(self, name: str, version: str | None) -> list[dict[str, Any]]:
        """TorchServe's describe shape; the workers are the deployment's live replicas."""
        entries = (
            [e for e in self.entries if e.name == name]
            if version == "all"
            else [self.resolve(name, version)]
        )
        if not entries:
            raise NotFound(f"Model not found: {name}")
        out = []
        for entry in entries:
            settings = entry.settings
            out.append(
                {
                    "modelName": entry.name,
                    "modelVersion": entry.version,
                    "modelUrl": entry.url,
                    "runtime": "python",
                    "minWorkers": settings["min_workers"],
                    "maxWorkers": settings["max_workers"],
                    "batchSize": settings["batch_size"],
                    "maxBatchDelay": settings["max_batch_delay"],
                    "loadedAtStartup": True,
                    "deployment": entry.deployment,
                    "workers": await asyncio.to_thread(_replicas, entry.deployment),
                }
            )
        return out


def _replicas(deployment: str) -> list[dict[str, Any]]:
    """The deployment's replica actors: id, pid, node and state, from Ray's state API."""
    from ray.util.state import list_actors

    actors = list_actors(
        filters=[("class_name", "=", f"ServeReplica:{APP_NAME}:{deployment}")], detail=True
    )
    workers = []
    for actor in actors:
        if actor.state in ("DEAD",):
            continue
        ready = actor.state == "ALIVE" and bool(actor.pid)  # a new actor's pid can read 0
        workers.append(
            {
                "id": actor.actor_id,
                "pid": actor.pid if actor.pid else -1,  # as describe shows a worker without one
                "nodeId": actor.node_id,
                "status": "READY" if ready else "STARTING",
            }
        )
    return workers


def _ready(workers: list[dict[str, Any]]) -> int:
    return sum(1 for w in workers if w["status"] == "READY")


def scaling_options(low: int, high: int) -> dict[str, Any]:
    """A config override for ``low``..``high`` replicas; it also clears the other mode."""
    options = replica_options(low, high)
    if "num_replicas" in options:
        return {**options, "autoscaling_config": None}
    return {**options, "num_replicas": "auto"}


def _dashboard(method: str, url: str, body: Any = None) -> Any:
    """One call to Ray's dashboard REST API, its failures as `ServeError`."""
    try:
        return dashboard.call(method, url, body)
    except dashboard.DashboardError as exc:
        if exc.status is None:
            raise ServeError(f"Cannot reach Ray's dashboard at {url}: {exc.detail}") from None
        raise ServeError(f"Ray refused the change ({exc.status}): {exc.detail[:500]}") from None


def _protocol_headers(request: Request, kind: str) -> dict[str, str]:
    skip = {"content-length", "content-type", "content-encoding", "transfer-encoding"}
    headers = {
        k: v for k, v in request.headers.items() if k not in skip and not k.startswith("x-lantern-")
    }
    headers[PROTOCOL_HEADER] = kind
    return headers


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status, media_type="application/json")


def build_app(args: Mapping[str, Any]) -> Any:
    """The Ray Serve application for a model store: ``args`` as a Serve config passes them.

    ``model_store`` (required; readable on every node), ``models`` (``--models`` entries,
    default ``all``), ``config`` / ``ts_config`` (Lantern's YAML and TorchServe's
    config.properties), ``max_replicas_per_node`` (spread replicas over nodes).
    """
    if not args.get("model_store"):
        raise BadRequest("build_app needs args.model_store")
    config = Config.load(
        config_file=args.get("config"),
        ts_config_file=args.get("ts_config"),
        overrides={"model_store": str(args["model_store"])},
    )
    models = args.get("models") or ["all"]
    specs = expand_models(
        [models] if isinstance(models, str) else list(models),
        config.model_store,
        archives_only=True,
    )
    if not specs:
        raise BadRequest(f"No models to deploy from {config.model_store}")
    store = Path(config.model_store or ".").resolve()
    per_node = args.get("max_replicas_per_node")
    deployments: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    model_deployment = _deployment(LanternModel)
    for spec in specs:
        name, _, url = spec.rpartition("=")
        archive = (store / url).resolve()
        if not archive.is_relative_to(store) or not archive.exists():
            raise BadRequest(f"Model archive not found in the model store {store}: {url}")
        with tempfile.TemporaryDirectory(prefix="lantern-ray-plan-") as tmp:
            opened = open_archive(archive, Path(tmp) / "model")
            manifest, model_config = opened.manifest, opened.model_config
        model_info = manifest.get("model") or {}
        name = name or model_info.get("modelName") or archive.stem
        version = str(model_info.get("modelVersion") or "1.0")
        settings = config.default_model_settings().merged(model_config)
        plan = plan_deployment(name, version, settings, max_replicas_per_node=per_node)
        deployments[plan.name] = model_deployment.options(**plan.options).bind(
            name,
            version,
            str(archive),
            None,
            _settings_dict(settings),
            plan.max_batch_size,
            plan.batch_wait_timeout_s,
        )
        entries.append(
            {
                "name": name,
                "version": version,
                "url": url,
                "deployment": plan.name,
                "settings": _settings_dict(settings),
            }
        )
    return _deployment(LanternIngress).bind(
        deployments,
        entries,
        config.max_request_size,
        config.max_response_size,
        args.get("dashboard_address") or DEFAULT_DASHBOARD,
    )


def _deployment(decorated: object) -> Any:
    """``decorated``: the Ray ``Deployment`` that ``@serve.deployment`` made of a class (a type
    checker keeps a decorated class's own type)."""
    return decorated


def _settings_dict(settings: ModelSettings) -> dict[str, Any]:
    low = max(1, settings.min_workers or 1)
    return {
        "min_workers": low,
        "max_workers": max(low, settings.max_workers or low),
        "batch_size": settings.batch_size,
        "max_batch_delay": settings.max_batch_delay,
        "response_timeout": settings.response_timeout,
        "num_threads": settings.num_threads,
    }
