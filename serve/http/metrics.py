"""The metrics API (port 8082): Prometheus text on ``GET /metrics``."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve.http.common import EXCEPTION_HANDLERS, ServerState
from serve.metrics.exposition import CONTENT_TYPE


def create_metrics_app(state: ServerState) -> Starlette:
    async def metrics(request: Request) -> Response:
        # TorchServe's filter: ?name[]=a&name[]=b selects metric families by name.
        names = request.query_params.getlist("name[]") or request.query_params.getlist("name")
        await state.metrics.refresh()
        body = state.metrics.exposition(names or None)
        return Response(body, media_type=CONTENT_TYPE)

    routes = [Route("/metrics", metrics, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)
