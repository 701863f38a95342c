"""Protocol requests as TorchServe hands them to a handler: the request JSON as the row's ``body``.

TorchServe passes a KServe v1 or v2 (Open Inference Protocol) request to the handler as the HTTP
body, and turns a gRPC ``ModelInfer`` into the same v2 JSON (``{"id", "model_name", "inputs":
[{"name", "shape", "datatype", "data"}]}``). A handler that reads ``row.get("data") or
row.get("body")``, or the ``kserve`` / ``kservev2`` envelope that wraps it, gets that here, for
HTTP v2 and gRPC OIP alike (the frontend has parsed both into tensors).

A model's handler gets requests this way when a ``service_envelope`` wraps it (server-wide in
config.properties, or ``service_envelope:`` in its model-config.yaml) or when its model-config.yaml
says ``protocol_inputs: torchserve``; otherwise it gets Lantern's tensor rows
(`serve.worker.protocol_batch`).
"""

from __future__ import annotations

import json
from typing import Any

from serve.wire import OIP_ID_HEADER, OUTPUTS_HEADER, PARAMETERS_HEADER
from serve.wire.errors import BadRequest, ServeError
from serve.wire.kserve_v1 import jsonable
from serve.wire.tensor_params import Tensor
from serve.wire.tensors import bf16_to_float32

TORCHSERVE = "torchserve"
TENSORS = "tensors"


def wants_torchserve_rows(service: Any, context: Any) -> bool:
    """Does this model's handler get protocol requests as TorchServe's JSON bodies?"""
    if getattr(service, "envelope", None):
        return True
    config = getattr(context, "model_yaml_config", None) or {}
    choice = str(config.get("protocol_inputs", TENSORS)).lower()
    if choice not in (TORCHSERVE, TENSORS):
        raise ServeError(f"model-config.yaml protocol_inputs must be {TORCHSERVE} or {TENSORS}")
    return choice == TORCHSERVE


def v2_request(tensors: dict[str, Tensor], headers: dict[str, str], model_name: str) -> dict:
    """An OIP request's tensors as the v2 JSON body: flat ``data`` lists, BYTES as text."""
    body: dict[str, Any] = {}
    if headers.get(OIP_ID_HEADER):
        body["id"] = headers[OIP_ID_HEADER]
    body["model_name"] = model_name
    body["inputs"] = [_input_json(t) for t in tensors.values()]
    if headers.get(PARAMETERS_HEADER):
        body["parameters"] = json.loads(headers[PARAMETERS_HEADER])
    if headers.get(OUTPUTS_HEADER):
        body["outputs"] = [{"name": name} for name in json.loads(headers[OUTPUTS_HEADER])]
    return body


def _input_json(tensor: Tensor) -> dict[str, Any]:
    array = tensor.array()
    if tensor.datatype == "BF16":
        array = bf16_to_float32(array)
    flat = array.reshape(-1).tolist()
    if tensor.datatype == "BYTES":
        flat = [_text(v) for v in flat]
    return {
        "name": tensor.name,
        "shape": list(tensor.shape),
        "datatype": tensor.datatype,
        "data": flat,
    }


def _text(value: bytes) -> Any:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return jsonable(value)  # {"b64": ...}, as Lantern's v1 answers undecodable bytes


def v1_request(body: bytes) -> Any:
    """A KServe v1 body as TorchServe's worker decodes ``application/json``."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from None


def v2_response(value: Any) -> Any:
    """A handler's answer to a v2 request: its JSON text or bytes parsed, anything else as is."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
