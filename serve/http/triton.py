"""Triton's HTTP extensions under ``/v2``, beside the Open Inference Protocol routes.

- ``GET /v2/models/{m}[/versions/{v}]/config``: the model configuration (``serve.core.triton``).
- ``POST /v2/repository/index``: every model of the store and every registered version, with its
  state (body ``{"ready": true}`` lists only the ready ones).
- ``POST /v2/repository/models/{m}/load`` (body ``{"parameters": {"config": "<JSON>"}}`` to
  override config.pbtxt) and ``.../unload``: the management API's register and unregister, behind
  ``enable_model_api`` and the management token, refused with ``--model-control-mode poll``.
- ``GET /v2/models/stats``, ``/v2/models/{m}[/versions/{v}]/stats``: ``{"model_stats": [...]}``.

Errors are ``{"error": "..."}`` like the rest of ``/v2``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from serve.core import triton
from serve.http.common import ServerState, request_id
from serve.http.protocols import _json, _protocol_errors, model_metadata, read_body
from serve.wire.errors import BadRequest

_MAX_BODY = 1024 * 1024  # index/load/unload bodies are small JSON objects


def triton_routes(state: ServerState) -> list[BaseRoute]:
    """The routes, to go inside the ``/v2`` router (before the model routes they resemble)."""
    api = _Triton(state)
    routes: list[BaseRoute] = [
        Route("/repository/index", api.index, methods=["POST"]),
        Route("/repository/models/{model}/load", api.load, methods=["POST"]),
        Route("/repository/models/{model}/unload", api.unload, methods=["POST"]),
        Route("/models/stats", api.stats, methods=["GET"]),
    ]
    for prefix in ("/models/{model}", "/models/{model}/versions/{version}"):
        routes += [
            Route(prefix + "/config", api.config, methods=["GET"]),
            Route(prefix + "/stats", api.stats, methods=["GET"]),
        ]
    return routes


class _Triton:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry

    @_protocol_errors
    async def config(self, request: Request) -> Response:
        path = request.path_params
        model = self.registry.get(path["model"], path.get("version"))
        metadata = await model_metadata(model, request_id(request))
        return _json(triton.model_config(model, metadata))

    @_protocol_errors
    async def index(self, request: Request) -> Response:
        body = await _body(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise BadRequest("'ready' must be a boolean")
        return _json(await triton.repository_index(self.registry, ready))

    @_protocol_errors
    async def load(self, request: Request) -> Response:
        body = await _body(request)
        override = None
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise BadRequest("'parameters' must be a JSON object")
        if "config" in parameters:
            override = _config_override(parameters["config"])
        await triton.load(self.registry, request.path_params["model"], override)
        return _json({})

    @_protocol_errors
    async def unload(self, request: Request) -> Response:
        await _body(request)
        await triton.unload(self.registry, request.path_params["model"])
        return _json({})

    @_protocol_errors
    async def stats(self, request: Request) -> Response:
        path = request.path_params
        rows = triton.statistics(
            self.registry, self.state.metrics.tallies, path.get("model"), path.get("version")
        )
        return _json({"model_stats": rows})


async def _body(request: Request) -> dict[str, Any]:
    raw = await read_body(request, _MAX_BODY)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def _config_override(value: Any) -> dict[str, Any]:
    """Triton sends the config as a JSON string; an object is taken too."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"parameter 'config' is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("parameter 'config' must be a model configuration (a JSON object)")
    return value
