"""ONNX Runtime Server's REST API: ``POST /v1/models/{m}/versions/{v}:predict``.

The route is KServe v1's / TF Serving's too; a request is ONNX Runtime Server's when its body is
protobuf (``application/octet-stream``, ``application/x-protobuf``,
``application/vnd.google.protobuf``) or JSON whose ``inputs`` are ``onnx.TensorProto`` objects
(``{"dims": ["2", "3"], "dataType": 1, "rawData": "..."}``). Its inputs take the OIP tensor path
(``serve.http.protocols.run_oip``) to the model's worker batching. ``Accept`` picks the answer's
encoding (JSON or protobuf; ``*/*`` or none: the request's). Errors are ORT Server's
``{"error_code": status, "error_message": "..."}``; every answer carries ``x-ms-request-id`` and,
when the client sent one, ``x-ms-client-request-id``, on this route only.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from serve.core.model import ModelVersion
from serve.core.offload import run_sized
from serve.grpc import ort_codec
from serve.http.common import NO_CACHE_HEADERS
from serve.wire.errors import ServeError
from serve.wire.oip import InferRequest

PROTOBUF_TYPES = (
    "application/octet-stream",
    "application/x-protobuf",
    "application/vnd.google.protobuf",
)
JSON_TYPE = "application/json"
REQUEST_ID = "x-ms-request-id"
CLIENT_REQUEST_ID = "x-ms-client-request-id"


def media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def is_protobuf(request: Request) -> bool:
    return media_type(request.headers.get("content-type")) in PROTOBUF_TYPES


def is_ort_json(body: bytes) -> bool:
    """JSON whose ``inputs`` are ``onnx.TensorProto`` objects (not KServe's columnar values)."""
    if b'"inputs"' not in body or not (b'"dims"' in body or b'"dataType"' in body):
        return False
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return False
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    return (
        isinstance(inputs, dict)
        and bool(inputs)
        and all(isinstance(v, dict) and ("dims" in v or "dataType" in v) for v in inputs.values())
    )


def _headers(request: Request, rid: str) -> dict[str, str]:
    headers = {**NO_CACHE_HEADERS, REQUEST_ID: rid}
    client = request.headers.get(CLIENT_REQUEST_ID)
    if client and len(client) <= 128 and client.isprintable():
        headers[CLIENT_REQUEST_ID] = client
    return headers


def error_response(request: Request, rid: str, err: ServeError) -> Response:
    body = json.dumps({"error_code": err.status_code, "error_message": err.message})
    return Response(
        body + "\n",
        err.status_code,
        headers={**_headers(request, rid), **err.headers},
        media_type=JSON_TYPE,
    )


def _answer_type(request: Request, protobuf_in: bool) -> str:
    accept = media_type(request.headers.get("accept"))
    if accept in ("", "*/*"):
        return PROTOBUF_TYPES[0] if protobuf_in else JSON_TYPE
    if accept == JSON_TYPE or accept in PROTOBUF_TYPES:
        return accept
    raise _UnknownAccept()


class _UnknownAccept(ServeError):
    status_code = 400

    def __init__(self) -> None:
        super().__init__("Unknown 'Accept' header field in the request")


async def predict(
    request: Request,
    rid: str,
    model: ModelVersion,
    body: bytes,
    headers: dict[str, str],
    timeout: float | None,
    run: Any,
) -> Response:
    """Answer one ORT Server predict; ``run(model, rid, headers, infer, timeout)`` is the OIP
    path's ``run_oip``. ``ServeError``s are answered in ORT Server's shape."""
    try:
        protobuf_in = is_protobuf(request)
        answer_type = _answer_type(request, protobuf_in)
        parse = ort_codec.parse_protobuf if protobuf_in else ort_codec.parse_json
        message = await run_sized(len(body), parse, body)
        inputs, wanted = ort_codec.request_tensors(message)
        infer = InferRequest(None, {}, inputs, None, True, None)
        tensors = await run(model, rid, headers, infer, timeout)
        response = ort_codec.build_response(tensors, wanted)
        if answer_type == JSON_TYPE:
            payload = ort_codec.response_json(response)
        else:
            payload = response.SerializeToString()
        return Response(payload, 200, headers=_headers(request, rid), media_type=answer_type)
    except ServeError as err:
        return error_response(request, rid, err)
