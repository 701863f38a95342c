"""TorchServe's ``org.pytorch.serve.grpc.inference.InferenceAPIsService`` on the inference port.

Every prediction takes the path an HTTP ``/predictions`` request takes: the registry's
`ModelVersion`, its queue and batcher, its workers. The request's ``input`` map becomes the
handler's parameters by name (TorchServe's ``InputParameter``s), the call's metadata its request
headers and the call's deadline the request's deadline.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from google.rpc import error_details_pb2, status_pb2

from serve.core.jobs import BatchItem, ItemResult, abandoned_if_left, answer_parts
from serve.core.model import ModelVersion
from serve.grpc.calls import Call, Methods, decoder
from serve.grpc.errors import grpc_code_for
from serve.grpc.gen import inference_pb2 as pb
from serve.http.common import ServerState
from serve.identifiers import MAX_SEQUENCE_ID, check_length
from serve.wire.errors import BadRequest, ServeError, error_for_status

SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
# TorchServe's request headers for sequences (``ts_header_key_sequence_*``), set on the item as
# the HTTP route passes a client's ``ts_request_sequence_id`` header.
SEQUENCE_ID = "ts_request_sequence_id"
SEQUENCE_START = "ts_request_sequence_start"
SEQUENCE_END = "ts_request_sequence_end"


class InferenceService:
    """``Ping``, ``Predictions``, ``StreamPredictions`` and ``StreamPredictions2``."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry

    def handlers(self, methods: Methods) -> dict[str, Any]:
        import grpc

        def unary(name: str, fn: Any, request: Any, response: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                methods.unary(f"/{SERVICE}/{name}", fn),
                request_deserializer=decoder(request),
                response_serializer=response.SerializeToString,
            )

        from google.protobuf import empty_pb2

        return {
            "Ping": unary("Ping", self.ping, empty_pb2.Empty, pb.TorchServeHealthResponse),
            "Predictions": unary(
                "Predictions", self.predictions, pb.PredictionsRequest, pb.PredictionResponse
            ),
            "StreamPredictions": grpc.unary_stream_rpc_method_handler(
                methods.server_stream(f"/{SERVICE}/StreamPredictions", self.stream_predictions),
                request_deserializer=decoder(pb.PredictionsRequest),
                response_serializer=pb.PredictionResponse.SerializeToString,
            ),
            "StreamPredictions2": grpc.stream_stream_rpc_method_handler(
                methods.stream_stream(f"/{SERVICE}/StreamPredictions2", self.stream_predictions2),
                request_deserializer=decoder(pb.PredictionsRequest),
                response_serializer=pb.PredictionResponse.SerializeToString,
            ),
        }

    # ----- methods -------------------------------------------------------------------------

    async def ping(self, call: Call, request: Any) -> pb.TorchServeHealthResponse:
        """``health`` is the JSON the HTTP ``/ping`` answers (TorchServe's StatusResponse)."""
        state = self.state
        healthy = not state.starting and not state.startup_failures and self.registry.is_healthy()
        body = {"status": "Healthy" if healthy else "Unhealthy"}
        return pb.TorchServeHealthResponse(health=json.dumps(body, indent=2))

    async def predictions(
        self, call: Call, request: pb.PredictionsRequest
    ) -> pb.PredictionResponse:
        model = self._model(call, request)
        results = self._run(call, model, request, call.headers(), call.request_id)
        body = b"".join([r.body async for r in results])
        return pb.PredictionResponse(prediction=body)

    async def stream_predictions(
        self, call: Call, request: pb.PredictionsRequest
    ) -> AsyncIterator[pb.PredictionResponse]:
        model = self._model(call, request)
        async for result in self._run(call, model, request, call.headers(), call.request_id):
            yield pb.PredictionResponse(prediction=result.body)

    async def stream_predictions2(
        self, call: Call, requests: AsyncIterator[pb.PredictionsRequest]
    ) -> AsyncIterator[pb.PredictionResponse]:
        """One response (or several, from a streaming handler) per request, in order.

        A failed request is answered in band with ``status`` (a ``google.rpc.Status`` with an
        ``ErrorInfo``), as TorchServe does, and the stream goes on.
        """
        async for request in requests:
            try:
                headers, sequence_id = _sequence_headers(call.headers(), request)
                model = self._model(call, request)
                rid = str(uuid.uuid4())
                async for result in self._run(call, model, request, headers, rid):
                    yield pb.PredictionResponse(prediction=result.body, sequence_id=sequence_id)
            except ServeError as err:
                echoed = request.sequence_id if len(request.sequence_id) <= MAX_SEQUENCE_ID else ""
                yield pb.PredictionResponse(sequence_id=echoed, status=_status_message(err))

    # ----- the shared path -----------------------------------------------------------------

    def _model(self, call: Call, request: pb.PredictionsRequest) -> ModelVersion:
        if not request.model_name:
            raise BadRequest("Parameter model_name is required.")
        call.label(request.model_name, request.model_version or None)
        model = self.registry.get(request.model_name, request.model_version or None)
        call.label(model.name, model.version)  # the access log names the version that served
        return model

    async def _run(
        self,
        call: Call,
        model: ModelVersion,
        request: pb.PredictionsRequest,
        headers: dict[str, str],
        rid: str,
    ) -> AsyncIterator[ItemResult]:
        """Submit one prediction and yield its result, or each chunk of a streaming handler."""
        started = time.perf_counter()
        status = 500
        name, version = request.model_name, request.model_version or "default"
        try:
            params: list[tuple[str, str | None, bytes]] = [
                (key, None, value) for key, value in request.input.items()
            ]
            item = BatchItem(rid, headers, params)
            result = await model.submit(item, call.timeout())
            _check(result)
            status = result.status
            async for chunk in abandoned_if_left(result, answer_parts(result)):
                _check(chunk)
                yield chunk
        except ServeError as err:
            status = err.status_code
            raise
        finally:
            self.state.metrics.request_done(name, version, status, time.perf_counter() - started)


def _check(result: ItemResult) -> None:
    """A handler that set an error status answers that error (``context.set_response_status``)."""
    if result.status >= 400:
        raise error_for_status(result.status, result.body.decode(errors="replace"))


def _sequence_headers(
    headers: dict[str, str], request: pb.PredictionsRequest
) -> tuple[dict[str, str], str]:
    """The request headers for one ``StreamPredictions2`` request, with its sequence id.

    As TorchServe 0.12: a request without ``sequence_id`` must start a sequence (input
    ``ts_request_sequence_start`` true) and gets a new ``ts-seq-<uuid>`` id; an input
    ``ts_request_sequence_end`` true ends the sequence.
    """
    headers = dict(headers)
    sequence_id = request.sequence_id
    check_length(sequence_id, "sequence id", MAX_SEQUENCE_ID)
    if not sequence_id:
        if not _flag(request.input.get(SEQUENCE_START)):
            raise BadRequest("Parameter sequenceId is required.")
        sequence_id = f"ts-seq-{uuid.uuid4()}"
        headers[SEQUENCE_START] = "true"
    headers[SEQUENCE_ID] = sequence_id
    if _flag(request.input.get(SEQUENCE_END)):
        headers[SEQUENCE_END] = "true"
    return headers, sequence_id


def _flag(value: bytes | None) -> bool:
    return value is not None and value.decode(errors="replace").strip().lower() == "true"


def _status_message(err: ServeError) -> status_pb2.Status:
    import grpc

    code = getattr(grpc.StatusCode, grpc_code_for(err)).value[0]
    status = status_pb2.Status(code=code, message=err.message)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=err.error_type))
    return status
