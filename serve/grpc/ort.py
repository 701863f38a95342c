"""ONNX Runtime Server's gRPC API: ``onnxruntime.server.PredictionService/Predict``.

ORT Server served one model per process, so its ``PredictRequest`` names none. Lantern serves
many: the call's metadata names the model (``model-name``, and ``model-version`` for other than
the default version); without it, the server's only model answers. Inputs take the OIP tensor
path (``serve.http.protocols.run_oip``); messages and tensors are ``serve/grpc/ort_codec.py``'s.
"""

from __future__ import annotations

from typing import Any

from serve.core.model import ModelVersion
from serve.grpc import ort_codec
from serve.grpc.calls import Call, Methods, decoder
from serve.http.common import ServerState
from serve.http.protocols import run_oip
from serve.wire import OIP, PROTOCOL_HEADER
from serve.wire.errors import BadRequest
from serve.wire.oip import InferRequest

SERVICE = ort_codec.SERVICE
MODEL_KEY = "model-name"
VERSION_KEY = "model-version"


class OrtService:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry

    def handlers(self, methods: Methods) -> dict[str, Any]:
        import grpc

        request, response = ort_codec.predict_request(), ort_codec.predict_response()
        return {
            "Predict": grpc.unary_unary_rpc_method_handler(
                methods.unary(f"/{SERVICE}/Predict", self.predict),
                request_deserializer=decoder(request),
                response_serializer=response.SerializeToString,
            )
        }

    def _model(self, call: Call) -> ModelVersion:
        name = call.metadata.get(MODEL_KEY, "")
        version = call.metadata.get(VERSION_KEY) or None
        if not name:
            names = sorted(self.registry.models)
            if len(names) != 1:
                raise BadRequest(
                    f"this server serves {len(names)} models: name one in the call's "
                    f"'{MODEL_KEY}' metadata"
                )
            name = names[0]
        call.label(name, version)
        model = self.registry.get(name, version)
        call.label(model.name, model.version)
        return model

    async def predict(self, call: Call, request: Any) -> Any:
        model = self._model(call)
        inputs, wanted = ort_codec.request_tensors(request)
        headers = call.headers()
        headers[PROTOCOL_HEADER] = OIP
        infer = InferRequest(None, {}, inputs, None, True, None)
        tensors = await run_oip(model, call.request_id, headers, infer, call.timeout())
        return ort_codec.build_response(tensors, wanted)
