"""KServe v1, TF-Serving-style and Open Inference Protocol v2 routes on the inference port."""

from __future__ import annotations

from starlette.routing import BaseRoute

from serve.apps.common import ServerState


def protocol_routes(state: ServerState) -> list[BaseRoute]:
    return []
