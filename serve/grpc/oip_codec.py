"""Open Inference Protocol gRPC messages <-> the tensors the HTTP OIP path uses (sans-IO).

``request_from_pb`` validates a ``ModelInferRequest`` into ``serve.wire.oip.InferRequest``
(raw inputs are only length-checked, never copied into arrays); ``response_to_pb`` answers the
model's tensors as ``raw_output_contents``, which ``tritonclient.grpc`` decodes for every datatype.
Typed ``contents`` are read for clients that send them (every datatype but FP16 and BF16, which
the protocol allows only raw). Problems raise ``BadRequest`` (INVALID_ARGUMENT).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import unknown_fields

from serve.wire.errors import BadRequest
from serve.wire.oip import (
    InferRequest,
    RequestedOutput,
    answered_outputs,
    requested_output,
    timeout_parameter,
)
from serve.wire.tensor_params import Tensor
from serve.wire.tensors import (
    NUMPY_DTYPES,
    TensorError,
    check_datatype,
    check_raw,
    element_count,
    serialize_bytes,
)

# Datatype -> the InferTensorContents field that carries it typed.
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters(params: Any) -> dict[str, Any]:
    """An ``InferParameter`` map as plain values (bool, int, float or str)."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        value = getattr(param, choice) if choice is not None else _triton_only_value(param)
        if value is None:
            raise BadRequest(f"parameter '{key}' has no value")
        out[key] = value
    for key in ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"):
        if key in out:
            raise BadRequest("shared memory is not supported by this server")
    return out


def _triton_only_value(param: Any) -> float | int | None:
    """Triton's ``double_param`` (4) or ``uint64_param`` (5), which the OIP protos that TorchServe
    and KServe publish lack (tritonclient sends a Python float as ``double_param``): they arrive
    as unknown fields."""
    found = unknown_fields.UnknownFieldSet(param)
    for index in range(len(found)):  # its stubs declare indexing, not iteration
        field = found[index]
        if field.field_number == 4 and field.wire_type == 1:  # fixed64: an IEEE double
            return float(struct.unpack("<d", struct.pack("<Q", field.data))[0])
        if field.field_number == 5 and field.wire_type == 0:  # varint: an unsigned integer
            return int(field.data)
    return None


def request_from_pb(request: Any) -> InferRequest:
    """Validate a ``ModelInferRequest`` (either service name's message) into tensors."""
    raw_contents = request.raw_input_contents
    if raw_contents and len(raw_contents) != len(request.inputs):
        raise BadRequest(
            f"raw_input_contents has {len(raw_contents)} entries for "
            f"{len(request.inputs)} inputs; give one per input, in order"
        )
    inputs: list[Tensor] = []
    seen: set[str] = set()
    for i, entry in enumerate(request.inputs):
        what = f"input '{entry.name}'"
        if entry.name in seen:
            raise BadRequest(f"{what} appears more than once")
        seen.add(entry.name)
        datatype = check_datatype(entry.datatype, what)
        shape = tuple(int(d) for d in entry.shape)
        if any(d < 0 for d in shape):
            raise BadRequest(f"{what}: shape {list(shape)} has a negative dimension")
        if raw_contents:
            if entry.HasField("contents"):
                raise BadRequest(f"{what} has both contents and raw_input_contents")
            raw: bytes = raw_contents[i]
            check_raw(datatype, shape, raw, what)
        else:
            raw = _raw_from_contents(entry, datatype, shape, what)
        inputs.append(Tensor(entry.name, datatype, shape, raw))
    params = parameters(request.parameters)
    timeout_us = timeout_parameter(params)
    params.pop("binary_data_output", None)  # gRPC answers raw bytes always
    outputs: list[RequestedOutput] | None = None
    if len(request.outputs):
        outputs = []
        for out in request.outputs:
            outputs.append(requested_output(out.name, True, parameters(out.parameters), outputs))
    return InferRequest(request.id or None, params, inputs, outputs, True, timeout_us)


def _raw_from_contents(entry: Any, datatype: str, shape: tuple[int, ...], what: str) -> bytes:
    field = _CONTENTS.get(datatype)
    if field is None:
        raise BadRequest(f"{what}: {datatype} data must be sent in raw_input_contents")
    values = getattr(entry.contents, field)
    count = element_count(shape)
    if len(values) != count:
        raise TensorError(
            f"{what}: {len(values)} elements of data do not match shape {list(shape)}"
        )
    if datatype == "BYTES":
        return serialize_bytes(list(values))
    dtype = NUMPY_DTYPES[datatype]
    array = np.asarray(values)
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if int(array.min()) < info.min or int(array.max()) > info.max:
            raise TensorError(f"{what}: a value is out of range for {datatype}")
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def response_to_pb(
    messages: Any,
    request: InferRequest,
    model_name: str,
    model_version: str,
    tensors: list[Tensor],
    labels: Mapping[str, Sequence[str]] | None = None,
) -> Any:
    """A ``ModelInferResponse`` of ``messages`` (the service's generated module)."""
    response = messages.ModelInferResponse(
        model_name=model_name, model_version=model_version, id=request.id or ""
    )
    for _, tensor in answered_outputs(request, model_name, tensors, labels):
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        response.raw_output_contents.append(bytes(tensor.raw))
    return response
