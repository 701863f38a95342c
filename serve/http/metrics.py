"""The metrics API (port 8082): Prometheus text on ``GET /metrics``, and its OpenAPI description
on ``OPTIONS /`` (as TorchServe's metrics port answers)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve.http.common import EXCEPTION_HANDLERS, ServerState, json_response
from serve.http.openapi import metrics_description
from serve.metrics.exposition import CONTENT_TYPE


def create_metrics_app(state: ServerState) -> Starlette:
    async def metrics(request: Request) -> Response:
        # TorchServe's filter: ?name[]=a&name[]=b selects metric families by name.
        names = request.query_params.getlist("name[]") or request.query_params.getlist("name")
        await state.metrics.refresh()
        body = state.metrics.exposition(names or None)
        return Response(body, media_type=CONTENT_TYPE)

    async def describe_api(request: Request) -> Response:
        return json_response(metrics_description(state.version))

    routes = [
        Route("/", describe_api, methods=["OPTIONS"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)
