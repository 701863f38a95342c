"""The management API (port 8081), route for route TorchServe 0.12's.

Every change goes through the `Registry`, the same methods startup and snapshot restore use.
Bodies, parameter names and defaults are TorchServe's (``ManagementRequestHandler``/``ApiUtils``):
register takes query parameters or a JSON body; ``synchronous`` defaults to true for register and
false for scale; ``initial_workers`` defaults to the archive's ``minWorkers``, else the configured
``default_workers_per_model`` (0 unless set, as in TorchServe).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

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
from serve.describe import describe_model
from serve.errors import BadRequest, MethodNotAllowed, error_for_status
from serve.model import ModelVersion
from serve.openapi import management_description

if TYPE_CHECKING:
    from serve.workflows.manager import Workflows

_MODEL_API_OFF = "Requested method is not allowed, please refer to API document."
_IN_PROGRESS = "Workers scaling in progress..."
_ACCEPTED = "Processing worker updates..."
# Register parameters that are model settings: (parameter, ModelSettings attribute, minimum).
_SETTINGS = (
    ("batch_size", "batch_size", 1),
    ("max_batch_delay", "max_batch_delay", 0),
    ("response_timeout", "response_timeout", 1),
    ("startup_timeout", "startup_timeout", 1),
)


def create_management_app(state: ServerState) -> Starlette:
    registry = state.registry
    config = state.config

    def require_model_api() -> None:
        if not config.enable_model_api:
            raise MethodNotAllowed(_MODEL_API_OFF)

    async def describe_api(request: Request) -> Response:
        return json_response(management_description(state.version))

    async def describe_model_api(request: Request) -> Response:
        registry.get(request.path_params["model"])  # 404 for a model nobody registered
        return json_response(management_description(state.version))

    async def list_models(request: Request) -> Response:
        # TorchServe's ApiUtils.getModelList: out-of-range values fall back, they do not fail.
        limit = parse_int(request.query_params, "limit", 100)
        assert limit is not None
        if limit <= 0 or limit > 100:  # 0 too: a page of nothing would never advance
            limit = 100
        offset = max(parse_int(request.query_params, "next_page_token", 0) or 0, 0)
        names = sorted(registry.models)
        body: dict[str, Any] = {}
        if offset + limit < len(names):
            body["nextPageToken"] = str(offset + limit)
        body["models"] = [
            {"modelName": n, "modelUrl": registry.models[n].default.source.url}
            for n in names[offset : offset + limit]
        ]
        return json_response(body)

    async def register(request: Request) -> Response:
        require_model_api()
        params = await _register_params(request)
        url = _text(params.get("url"))
        if not url:
            raise BadRequest("Parameter url is required.")
        settings: dict[str, Any] = {}
        for param, key, minimum in _SETTINGS:
            value = _optional_int(params, param, minimum)
            if value is not None:
                settings[key] = value
        workers = _optional_int(params, "initial_workers", 0)
        synchronous = parse_bool(_text(params.get("synchronous")) or None, True)
        model = await registry.register(
            url,
            model_name=_text(params.get("model_name")) or None,
            handler=_text(params.get("handler")) or None,
            runtime=_text(params.get("runtime")) or None,
            initial_workers=workers,
            synchronous=synchronous,
            settings=settings,
            fallback_workers=config.default_workers_per_model,
        )
        requested = model.min_workers
        if requested == 0:
            return _status(
                f'Model "{model.name}" Version: {model.version} registered with 0 initial workers.'
                " Use scale workers API to add workers for the model."
            )
        if not synchronous:
            return _status(_ACCEPTED, 202)
        if model.ready_workers() < requested:
            return _status(_IN_PROGRESS, 206)
        return _status(
            f'Model "{model.name}" Version: {model.version} registered with '
            f"{requested} initial workers"
        )

    async def describe(request: Request) -> Response:
        name = request.path_params["model"]
        version = request.path_params.get("version")
        customized = parse_bool(request.query_params.get("customized"), False)
        if version == "all":  # TorchServe ignores customized=true here too
            return json_response([describe_model(m) for m in registry.versions(name)])
        model = registry.get(name, version)
        data = describe_model(model)
        if customized:
            data["customizedMetadata"] = await _customized(model)
        return json_response([data])

    async def scale(request: Request) -> Response:
        name = request.path_params["model"]
        params = request.query_params
        version = request.path_params.get("version") or params.get("model_version") or None
        min_worker = parse_int(params, "min_worker", 1)
        max_worker = parse_int(params, "max_worker", min_worker)
        synchronous = parse_bool(params.get("synchronous"), False)
        assert min_worker is not None
        model = await registry.scale(name, version, min_worker, max_worker, synchronous=synchronous)
        if not synchronous:
            return _status(_ACCEPTED, 202)
        if model.ready_workers() < min_worker:
            return _status(_IN_PROGRESS, 206)
        return _status(
            f"Workers scaled to {min_worker} for model: {model.name}, version: {model.version}"
        )

    async def unregister(request: Request) -> Response:
        require_model_api()
        name = request.path_params["model"]
        model = await registry.unregister(name, request.path_params.get("version"))
        return _status(f'Model "{model.name}" unregistered')

    async def set_default(request: Request) -> Response:
        name = request.path_params["model"]
        model = registry.set_default(name, request.path_params["version"])
        return _status(
            f'Default version successfully updated for model "{name}" to "{model.version}"'
        )

    async def readiness(request: Request) -> Response:
        # KServe v1 model readiness, on the management port as in TorchServe; `m:ready` works too.
        name = request.path_params["model"].split(":", 1)[0]
        model = registry.get(name)
        return json_response({"name": model.name, "ready": model.ready_workers() > 0})

    routes = [
        Route("/", describe_api, methods=["OPTIONS"]),
        Route("/api-description", describe_api, methods=["GET"]),
        Route("/models", list_models, methods=["GET"]),
        Route("/models", register, methods=["POST"]),
        Route("/models/{model}", describe, methods=["GET"]),
        Route("/models/{model}", scale, methods=["PUT"]),
        Route("/models/{model}", unregister, methods=["DELETE"]),
        Route("/models/{model}", describe_model_api, methods=["OPTIONS"]),
        Route("/models/{model}/{version}", describe, methods=["GET"]),
        Route("/models/{model}/{version}", scale, methods=["PUT"]),
        Route("/models/{model}/{version}", unregister, methods=["DELETE"]),
        Route("/models/{model}/{version}/set-default", set_default, methods=["PUT"]),
        Route("/v1/models/{model}", readiness, methods=["GET"]),
        *workflow_routes(state, require_model_api),
    ]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)


def _status(message: str, code: int = 200) -> Response:
    return json_response({"status": message}, code)


async def _register_params(request: Request) -> dict[str, Any]:
    """Query parameters, or, with ``Content-Type: application/json``, the body's keys over them."""
    params: dict[str, Any] = dict(request.query_params)
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type == "application/json":
        body = await request.body()
        if body.strip():
            try:
                data = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise BadRequest(f"Invalid JSON body: {exc}") from exc
            if not isinstance(data, dict):
                raise BadRequest("The JSON body must be an object of register parameters.")
            params.update(data)
    return params


def _optional_int(params: Mapping[str, Any], name: str, minimum: int) -> int | None:
    """An integer parameter, or None when absent; -1 means absent, as TorchServe's defaults do."""
    raw = params.get(name)
    if isinstance(raw, bool) or isinstance(raw, float) and not raw.is_integer():
        raise BadRequest(f"Parameter {name} must be an integer, got {raw!r}")
    value = parse_int(params, name)
    if value is None or value == -1:
        return None
    if value < minimum:
        raise BadRequest(f"Parameter {name} must be at least {minimum}, got {value}")
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


async def _customized(model: ModelVersion) -> str:
    """Run the handler's ``describe_handle`` on a worker; its output, as text (TorchServe's shape).

    Like TorchServe, a model with no worker answers 503 and a failing handler its error.
    """
    from serve.worker.process import BatchItem

    item = BatchItem(str(uuid.uuid4()), {"describe": "True"}, [("body", None, b"")])
    result = await model.submit(item)
    if result.status >= 400:
        raise error_for_status(result.status, result.body.decode(errors="replace"))
    return result.body.decode(errors="replace")


# ----- workflows (TorchServe's workflow management API) -----------------------------------------


def workflow_routes(state: ServerState, require_model_api: Callable[[], None]) -> list[Route]:
    """``/workflows``: register, list, describe, unregister; changes need the model API switch.

    Answers are TorchServe 0.12's (``WorkflowMgmtRequestHandler``). Unlike TorchServe, register
    and unregister are refused (405) unless the model API is enabled, as for models: registering a
    workflow registers models.
    """

    def workflows() -> Workflows:
        assert state.workflows is not None, "the server sets up the workflows"
        return state.workflows

    async def register_workflow(request: Request) -> Response:
        require_model_api()
        params = await _register_params(request)
        url = _text(params.get("url"))
        if not url:
            raise BadRequest("Parameter url is required.")
        wf = await workflows().register(url, _text(params.get("workflow_name")) or None)
        return _status(f"Workflow {wf.name} has been registered and scaled successfully.")

    async def list_workflows(request: Request) -> Response:
        limit = parse_int(request.query_params, "limit", 100)
        assert limit is not None
        if limit <= 0 or limit > 100:
            limit = 100
        offset = max(parse_int(request.query_params, "next_page_token", 0) or 0, 0)
        return json_response(workflows().page(limit, offset))

    async def describe_workflow(request: Request) -> Response:
        return json_response([workflows().describe(request.path_params["workflow"])])

    async def unregister_workflow(request: Request) -> Response:
        require_model_api()
        wf = await workflows().unregister(request.path_params["workflow"])
        return _status(f'Workflow "{wf.name}" unregistered')

    return [
        Route("/workflows", list_workflows, methods=["GET"]),
        Route("/workflows", register_workflow, methods=["POST"]),
        Route("/workflows/{workflow}", describe_workflow, methods=["GET"]),
        Route("/workflows/{workflow}", unregister_workflow, methods=["DELETE"]),
    ]
