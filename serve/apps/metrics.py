"""The metrics API (port 8082): Prometheus text on ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import RestrictedRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve.apps.common import EXCEPTION_HANDLERS, ServerState


def create_metrics_app(state: ServerState) -> Starlette:
    async def metrics(request: Request) -> Response:
        registry = state.metrics.registry
        names = request.query_params.getlist("name[]")
        if names:
            # TorchServe's filter: ?name[]=a&name[]=b selects metric families by name.
            wanted = set(names)
            for name in names:
                wanted.update(
                    {
                        f"{name}_total",
                        f"{name}_created",
                        f"{name}_bucket",
                        f"{name}_count",
                        f"{name}_sum",
                    }
                )
            registry = RestrictedRegistry(wanted, registry)  # type: ignore[assignment]
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    routes = [Route("/metrics", metrics, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)
