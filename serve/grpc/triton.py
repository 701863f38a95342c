"""Triton's gRPC extensions on ``inference.GRPCInferenceService``: ModelConfig, ModelStatistics,
RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload and ModelStreamInfer (one response
per request, errors in band), with Triton's own messages
(vendored ``grpc_service.proto``). The answers are ``serve.core.triton``'s, as over HTTP; load and
unload take the management token, as the HTTP routes do.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from serve.core import triton
from serve.core.model import ModelVersion
from serve.grpc.calls import Call, Methods, UnaryFn, decoder
from serve.grpc.gen import grpc_service_pb2 as pb
from serve.grpc.oip_codec import request_from_pb, response_to_pb
from serve.http.common import ServerState
from serve.http.protocols import model_metadata, run_oip
from serve.wire import OIP, PROTOCOL_HEADER
from serve.wire.errors import BadRequest, ServeError

SERVICE = "inference.GRPCInferenceService"


async def model_infer(pb: Any, model: ModelVersion, call: Call, request: Any) -> Any:
    """One ``ModelInferRequest`` (OIP's, or Triton's own messages: ``pb`` is their module)
    through the one path, as its ``ModelInferResponse``: the call's headers and deadline, the
    request's own ``timeout`` parameter (microseconds) where it is shorter."""
    infer = request_from_pb(request)
    headers = call.headers()
    headers[PROTOCOL_HEADER] = OIP
    timeout = call.timeout()
    if infer.timeout_us:
        limit = infer.timeout_us / 1e6
        timeout = limit if timeout is None else min(timeout, limit)
    tensors = await run_oip(model, call.request_id, headers, infer, timeout)
    labels = triton.output_labels(model)
    return response_to_pb(pb, infer, model.name, model.version, tensors, labels)


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
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                wrapper.unary(f"/{service}/{name}", fn),
                request_deserializer=decoder(request),
                response_serializer=response.SerializeToString,
            )
            for name, (fn, request, response, wrapper) in table.items()
        }
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            methods.stream_stream(f"/{service}/ModelStreamInfer", self.stream_infer),
            request_deserializer=decoder(pb.ModelInferRequest),
            response_serializer=pb.ModelStreamInferResponse.SerializeToString,
        )
        return handlers

    async def stream_infer(
        self, call: Call, requests: AsyncIterator[Any]
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Triton's streaming inference: one response per request, in order; a failed request is
        answered in band (``error_message``) and the stream goes on, as Triton does."""
        async for request in requests:
            started = time.perf_counter()
            status = 500
            name = request.model_name
            try:
                if not name:
                    raise BadRequest("a model name is required")
                model = self.registry.get(name, request.model_version or None)
                call.label(model.name, model.version)
                answer = await model_infer(pb, model, call, request)
                status = 200
                yield pb.ModelStreamInferResponse(infer_response=answer)
            except ServeError as err:
                status = err.status_code
                yield pb.ModelStreamInferResponse(error_message=err.message)
            finally:
                if name:
                    self.state.metrics.request_done(
                        name, request.model_version or "default", status,
                        time.perf_counter() - started,
                    )  # fmt: skip

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
