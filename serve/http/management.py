"""The management API (port 8081), route for route TorchServe 0.12's.

Every change goes through the `Registry`, the same methods startup and snapshot restore use.
Bodies, parameter names and defaults are TorchServe's (``ManagementRequestHandler``/``ApiUtils``):
register takes query parameters or a JSON body; ``synchronous`` defaults to true for register and
false for scale; ``initial_workers`` defaults to the archive's ``minWorkers``, else the configured
``default_workers_per_model`` (0 unless set, as in TorchServe).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve.core import manage
from serve.core.offload import run_big
from serve.core.params import parse_bool, parse_int
from serve.http.common import EXCEPTION_HANDLERS, ServerState, json_response
from serve.http.inputs import read_body
from serve.http.openapi import management_description
from serve.wire.errors import BadRequest
from serve.wire.json_input import parse_json

if TYPE_CHECKING:
    from serve.workflows.manager import Workflows


def create_management_app(state: ServerState) -> Starlette:
    registry = state.registry
    config = state.config

    async def describe_api(request: Request) -> Response:
        return json_response(management_description(state.version))

    async def describe_model_api(request: Request) -> Response:
        registry.get(request.path_params["model"])  # 404 for a model nobody registered
        return json_response(management_description(state.version))

    async def list_models(request: Request) -> Response:
        limit = parse_int(request.query_params, "limit", 100)
        token = parse_int(request.query_params, "next_page_token", 0)
        hidden = state.workflows.function_nodes() if state.workflows is not None else ()
        return json_response(manage.list_models(registry, limit, token, hidden))

    async def register(request: Request) -> Response:
        manage.require_model_api(config)
        params = await _register_params(request, config.max_request_size)
        reply = await manage.register_model(registry, config, params, synchronous_default=True)
        return _status(reply)

    async def describe(request: Request) -> Response:
        name = request.path_params["model"]
        version = request.path_params.get("version")
        customized = parse_bool(request.query_params.get("customized"), False)
        return json_response(await manage.describe(registry, name, version, customized=customized))

    async def scale(request: Request) -> Response:
        name = request.path_params["model"]
        params = request.query_params
        version = request.path_params.get("version") or params.get("model_version") or None
        min_worker = parse_int(params, "min_worker", 1)
        max_worker = parse_int(params, "max_worker", min_worker)
        synchronous = parse_bool(params.get("synchronous"), False)
        assert min_worker is not None
        reply = await manage.scale(
            registry, name, version, min_worker, max_worker, synchronous=synchronous
        )
        return _status(reply)

    async def unregister(request: Request) -> Response:
        name = request.path_params["model"]
        version = request.path_params.get("version")
        return _status(await manage.unregister(registry, config, name, version))

    async def set_default(request: Request) -> Response:
        path = request.path_params
        return _status(await manage.set_default(registry, path["model"], path["version"]))

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
        *workflow_routes(state, lambda: manage.require_model_api(config)),
    ]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)


def _status(reply: manage.Reply) -> Response:
    return json_response({"status": reply.message}, reply.status)


async def _register_params(request: Request, max_size: int) -> dict[str, Any]:
    """Query parameters, or, with ``Content-Type: application/json``, the body's keys over them."""
    params: dict[str, Any] = dict(request.query_params)
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type == "application/json":
        body = await read_body(request, max_size)
        if body.strip():
            data = await run_big(len(body), parse_json, body, "the JSON body")  # off the loop
            if not isinstance(data, dict):
                raise BadRequest("The JSON body must be an object of register parameters.")
            params.update(data)
    return params


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
        params = await _register_params(request, state.config.max_request_size)
        url = manage.text_param(params.get("url"))
        if not url:
            raise BadRequest("Parameter url is required.")
        wf = await workflows().register(url, manage.text_param(params.get("workflow_name")) or None)
        return _status(
            manage.Reply(f"Workflow {wf.name} has been registered and scaled successfully.")
        )

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
        return _status(manage.Reply(f'Workflow "{wf.name}" unregistered'))

    return [
        Route("/workflows", list_workflows, methods=["GET"]),
        Route("/workflows", register_workflow, methods=["POST"]),
        Route("/workflows/{workflow}", describe_workflow, methods=["GET"]),
        Route("/workflows/{workflow}", unregister_workflow, methods=["DELETE"]),
    ]
