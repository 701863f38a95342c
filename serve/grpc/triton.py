"""Triton's gRPC extensions on ``inference.GRPCInferenceService``: ModelConfig, ModelStatistics,
RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload, with Triton's own messages
(vendored ``grpc_service.proto``). The answers are ``serve.core.triton``'s, as over HTTP; load and
unload take the management token, as the HTTP routes do.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from serve.core import triton
from serve.grpc.calls import Call, Methods, UnaryFn, decoder
from serve.grpc.gen import grpc_service_pb2 as pb
from serve.http.common import ServerState
from serve.http.protocols import model_metadata
from serve.wire.errors import BadRequest

SERVICE = "inference.GRPCInferenceService"


class TritonService:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry

    def handlers(self, methods: Methods, service: str) -> dict[str, Any]:
        import grpc

        changes = Methods(methods.metrics, methods.auth, "management")
        table: dict[str, tuple[UnaryFn, type[Message], type[Message], Methods]] = {
            "ModelConfig": (
                self.model_config,
                pb.ModelConfigRequest,
                pb.ModelConfigResponse,
                methods,
            ),
            "ModelStatistics": (
                self.statistics,
                pb.ModelStatisticsRequest,
                pb.ModelStatisticsResponse,
                methods,
            ),
            "RepositoryIndex": (
                self.index,
                pb.RepositoryIndexRequest,
                pb.RepositoryIndexResponse,
                methods,
            ),
            "RepositoryModelLoad": (
                self.load,
                pb.RepositoryModelLoadRequest,
                pb.RepositoryModelLoadResponse,
                changes,
            ),
            "RepositoryModelUnload": (
                self.unload,
                pb.RepositoryModelUnloadRequest,
                pb.RepositoryModelUnloadResponse,
                changes,
            ),
        }
        return {
            name: grpc.unary_unary_rpc_method_handler(
                wrapper.unary(f"/{service}/{name}", fn),
                request_deserializer=decoder(request),
                response_serializer=response.SerializeToString,
            )
            for name, (fn, request, response, wrapper) in table.items()
        }

    async def model_config(self, call: Call, request: Any) -> Any:
        model = self.registry.get(request.name, request.version or None)
        call.label(model.name, model.version)
        metadata = await model_metadata(model, call.request_id)
        config = triton.model_config(model, metadata)
        response = pb.ModelConfigResponse()
        json_format.ParseDict({"config": config}, response)
        return response

    async def statistics(self, call: Call, request: Any) -> Any:
        rows = triton.statistics(
            self.registry,
            self.state.metrics.tallies,
            request.name or None,
            request.version or None,
        )
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict({"model_stats": rows}, response)
        return response

    async def index(self, call: Call, request: Any) -> Any:
        rows = await triton.repository_index(self.registry, bool(request.ready))
        response = pb.RepositoryIndexResponse()
        json_format.ParseDict({"models": rows}, response)
        return response

    async def load(self, call: Call, request: Any) -> Any:
        override = None
        if "config" in request.parameters:
            text = request.parameters["config"].string_param
            try:
                override = json.loads(text)
            except json.JSONDecodeError as exc:
                raise BadRequest(f"parameter 'config' is not JSON: {exc}") from None
            if not isinstance(override, dict):
                raise BadRequest("parameter 'config' must be a model configuration")
        await triton.load(self.registry, request.model_name, override)
        return pb.RepositoryModelLoadResponse()

    async def unload(self, call: Call, request: Any) -> Any:
        await triton.unload(self.registry, request.model_name)
        return pb.RepositoryModelUnloadResponse()
