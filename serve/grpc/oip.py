"""The Open Inference Protocol over gRPC, under both names its clients call.

``inference.GRPCInferenceService`` (KServe's and Triton's name: ``tritonclient.grpc``) and
``org.pytorch.serve.grpc.openinference.GRPCInferenceService`` (TorchServe's) have the same messages
field for field, so one implementation answers both with TorchServe's generated messages. An
inference request takes the HTTP OIP path (``serve.http.protocols.run_oip``): the same tensors to
the same worker batching, metadata asked of a worker once (``model_metadata``).
"""

from __future__ import annotations

import time
from typing import Any

from google.protobuf.message import Message

from serve.core.model import ModelVersion
from serve.grpc.calls import Call, Methods, UnaryFn, decoder
from serve.grpc.gen import open_inference_grpc_pb2 as pb
from serve.grpc.triton import SERVICE as TRITON_SERVICE
from serve.grpc.triton import TritonService, model_infer
from serve.http.common import ServerState
from serve.http.protocols import SERVER_NAME, model_metadata
from serve.wire import oip as oip_codec
from serve.wire.errors import BadRequest, ServeError

SERVICES = (
    "inference.GRPCInferenceService",
    "org.pytorch.serve.grpc.openinference.GRPCInferenceService",
)


class OipService:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry

    def handlers(self, methods: Methods, service: str) -> dict[str, Any]:
        import grpc

        table: dict[str, tuple[UnaryFn, type[Message], type[Message]]] = {
            "ServerLive": (self.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": (self.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": (self.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": (
                self.server_metadata,
                pb.ServerMetadataRequest,
                pb.ServerMetadataResponse,
            ),
            "ModelMetadata": (
                self.model_metadata,
                pb.ModelMetadataRequest,
                pb.ModelMetadataResponse,
            ),
            "ModelInfer": (self.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                methods.unary(f"/{service}/{name}", fn),
                request_deserializer=decoder(request),
                response_serializer=response.SerializeToString,
            )
            for name, (fn, request, response) in table.items()
        }
        if service == TRITON_SERVICE:  # Triton's extensions: under Triton's name only
            handlers.update(TritonService(self.state).handlers(methods, service))
        return handlers

    async def server_live(self, call: Call, request: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, call: Call, request: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.registry.is_healthy())

    async def server_metadata(self, call: Call, request: Any) -> Any:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=self.state.version, extensions=oip_codec.EXTENSIONS
        )

    async def model_ready(self, call: Call, request: Any) -> Any:
        model = self._model(call, request.name, request.version)
        return pb.ModelReadyResponse(ready=model.ready_workers() > 0)

    async def model_metadata(self, call: Call, request: Any) -> Any:
        model = self._model(call, request.name, request.version)
        metadata = await model_metadata(model, call.request_id)
        response = pb.ModelMetadataResponse(
            name=model.name,
            versions=[mv.version for mv in self.registry.versions(model.name)],
            platform=str(metadata.get("platform", "")),
        )
        for kind in ("inputs", "outputs"):
            for tensor in metadata.get(kind) or []:
                getattr(response, kind).add(
                    name=str(tensor.get("name", "")),
                    datatype=str(tensor.get("datatype", "")),
                    shape=[int(d) for d in tensor.get("shape", [])],
                )
        return response

    async def model_infer(self, call: Call, request: Any) -> Any:
        model = self._model(call, request.model_name, request.model_version)
        started = time.perf_counter()
        status = 500
        try:
            response = await model_infer(pb, model, call, request)
            status = 200
            return response
        except ServeError as err:
            status = err.status_code
            raise
        finally:
            version = request.model_version or "default"
            self.state.metrics.request_done(
                model.name, version, status, time.perf_counter() - started
            )

    def _model(self, call: Call, name: str, version: str) -> ModelVersion:
        if not name:
            raise BadRequest("a model name is required")
        call.label(name, version or None)
        model = self.registry.get(name, version or None)
        call.label(model.name, model.version)
        return model
