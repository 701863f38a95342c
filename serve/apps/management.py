"""The management API (port 8081), route for route TorchServe 0.12's."""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve.apps.common import (
    EXCEPTION_HANDLERS,
    ServerState,
    json_response,
    parse_bool,
    parse_int,
)
from serve.errors import BadRequest, MethodNotAllowed, ServeError
from serve.model import ModelVersion
from serve.openapi import management_description

_MODEL_API_OFF = "Requested method is not allowed, please refer to API document."


def create_management_app(state: ServerState) -> Starlette:
    registry = state.registry
    config = state.config

    def require_model_api() -> None:
        if not config.enable_model_api:
            raise MethodNotAllowed(_MODEL_API_OFF)

    async def describe_api(request: Request) -> Response:
        return json_response(management_description(state.version))

    async def list_models(request: Request) -> Response:
        limit = parse_int(request.query_params, "limit", 100) or 100
        limit = min(max(limit, 1), 100)
        offset = parse_int(request.query_params, "next_page_token", 0) or 0
        if offset < 0:
            raise BadRequest("next_page_token must not be negative")
        names = sorted(registry.models)
        page = names[offset : offset + limit]
        body: dict[str, Any] = {}
        if offset + limit < len(names):
            body["nextPageToken"] = str(offset + limit)
        body["models"] = [
            {"modelName": n, "modelUrl": registry.models[n].default.source.url} for n in page
        ]
        return json_response(body)

    async def register(request: Request) -> Response:
        require_model_api()
        params = await _params(request)
        url = params.get("url")
        if not url:
            raise BadRequest("Parameter url is required.")
        settings: dict[str, Any] = {}
        for param, key in (
            ("batch_size", "batch_size"),
            ("max_batch_delay", "max_batch_delay"),
            ("response_timeout", "response_timeout"),
            ("startup_timeout", "startup_timeout"),
        ):
            value = parse_int(params, param)
            if value is not None:
                settings[key] = value
        workers = parse_int(params, "initial_workers")
        synchronous = parse_bool(_str(params.get("synchronous")), True)
        model = await _register(url, params, settings, workers, synchronous and workers != 0)
        count = len(model.slots)
        if count == 0:
            return json_response(
                {
                    "status": (
                        f'Model "{model.name}" Version: {model.version} registered with 0 initial workers.'
                        " Use scale workers API to add workers for the model."
                    )
                }
            )
        if not synchronous:
            return json_response({"status": "Processing worker updates..."}, 202)
        return json_response(
            {
                "status": (
                    f'Model "{model.name}" Version: {model.version} registered with '
                    f"{model.ready_workers()} initial workers"
                )
            }
        )

    async def _register(
        url: str, params: dict[str, Any], settings: dict[str, Any], workers: int | None, wait: bool
    ) -> ModelVersion:
        return await registry.register(
            url,
            model_name=_str(params.get("model_name")) or None,
            handler=_str(params.get("handler")) or None,
            runtime=_str(params.get("runtime")) or None,
            initial_workers=workers,
            synchronous=wait,
            settings=settings,
        )

    async def describe(request: Request) -> Response:
        name = request.path_params["model"]
        version = request.path_params.get("version")
        if version == "all":
            models = registry.versions(name)
        else:
            models = [registry.get(name, version)]
        customized = parse_bool(request.query_params.get("customized"), False)
        out = []
        for model in models:
            data = model.describe()
            if customized:
                data["customizedMetadata"] = await _customized(model)
            out.append(data)
        return json_response(out)

    async def scale(request: Request) -> Response:
        name = request.path_params["model"]
        params = dict(request.query_params)
        version = request.path_params.get("version") or params.get("model_version")
        min_worker = parse_int(params, "min_worker", 1)
        max_worker = parse_int(params, "max_worker", min_worker)
        synchronous = parse_bool(params.get("synchronous"), False)
        assert min_worker is not None
        model = registry.get(name, version)
        if not synchronous:
            import asyncio

            registry.get(name, version)  # 404 before we answer 202
            task = asyncio.create_task(
                registry.scale(name, version, min_worker, max_worker, synchronous=False)
            )
            state.extras.setdefault("tasks", set()).add(task)
            task.add_done_callback(state.extras["tasks"].discard)
            return json_response({"status": "Processing worker updates..."}, 202)
        model = await registry.scale(name, version, min_worker, max_worker, synchronous=True)
        ready = model.ready_workers()
        if ready < min_worker:
            return json_response({"status": "Workers scaling in progress..."}, 206)
        return json_response(
            {
                "status": (
                    f"Workers scaled to {min_worker} for model: {model.name}, version: {model.version}"
                )
            }
        )

    async def unregister(request: Request) -> Response:
        require_model_api()
        name = request.path_params["model"]
        model = await registry.unregister(name, request.path_params.get("version"))
        return json_response({"status": f'Model "{model.name}" unregistered'})

    async def set_default(request: Request) -> Response:
        name = request.path_params["model"]
        model = registry.set_default(name, request.path_params["version"])
        return json_response(
            {
                "status": (
                    f'Default version successfully updated for model "{name}" to "{model.version}"'
                )
            }
        )

    async def readiness(request: Request) -> Response:
        model = registry.get(request.path_params["model"])
        return json_response({"name": model.name, "ready": model.ready_workers() > 0})

    routes = [
        Route("/", describe_api, methods=["OPTIONS"]),
        Route("/api-description", describe_api, methods=["GET"]),
        Route("/models", list_models, methods=["GET"]),
        Route("/models", register, methods=["POST"]),
        Route("/models/{model}", describe, methods=["GET"]),
        Route("/models/{model}", scale, methods=["PUT"]),
        Route("/models/{model}", unregister, methods=["DELETE"]),
        Route("/models/{model}", describe_api, methods=["OPTIONS"]),
        Route("/models/{model}/{version}", describe, methods=["GET"]),
        Route("/models/{model}/{version}", scale, methods=["PUT"]),
        Route("/models/{model}/{version}", unregister, methods=["DELETE"]),
        Route("/models/{model}/{version}/set-default", set_default, methods=["PUT"]),
        Route("/v1/models/{model}", readiness, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)


async def _params(request: Request) -> dict[str, Any]:
    """Query parameters, overlaid by a JSON body's keys when the body is JSON."""
    params: dict[str, Any] = dict(request.query_params)
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await request.body()
        if body.strip():
            try:
                data = json.loads(body)
            except json.JSONDecodeError as exc:
                raise BadRequest(f"Invalid JSON body: {exc}") from exc
            if not isinstance(data, dict):
                raise BadRequest("The JSON body must be an object.")
            params.update(data)
    return params


def _str(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def _customized(model: ModelVersion) -> Any:
    """Run the handler's describe_handle on a worker (a request with ``describe: True``)."""
    import uuid

    from serve.worker.process import BatchItem

    item = BatchItem(str(uuid.uuid4()), {"describe": "True"}, [("body", None, b"")])
    try:
        result = await model.submit(item)
    except ServeError as exc:
        return f"describe failed: {exc.message}"
    text = result.body.decode(errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
