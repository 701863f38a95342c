"""ONNX Runtime Server's ``PredictRequest``/``PredictResponse`` <-> Lantern's tensors (sans-IO).

The messages come from ``serve/grpc/gen/onnxruntime_server.binpb`` (ORT Server's
``predict.proto`` and the ``onnx.TensorProto`` it uses, see ``serve/grpc/generate.py``), loaded
into a private descriptor pool: the ``onnx`` package's own ``onnx.TensorProto`` may live in the
default pool of the same process. Both the REST route (JSON or protobuf bodies) and the gRPC
service use this module. Inputs may carry ``raw_data`` (little-endian bytes) or the typed
``*_data`` fields; outputs are answered as ``raw_data`` (``string_data`` for strings).
Problems raise ``TensorError`` (400 / INVALID_ARGUMENT).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError

from serve.wire.errors import BadRequest
from serve.wire.tensor_params import Tensor
from serve.wire.tensors import NUMPY_DTYPES, TensorError, element_count, serialize_bytes

DESCRIPTORS = Path(__file__).resolve().parent / "gen" / "onnxruntime_server.binpb"
SERVICE = "onnxruntime.server.PredictionService"

# ONNX TensorProto.DataType -> (OIP datatype, the typed field that carries it).
_BY_TYPE: dict[int, tuple[str, str]] = {
    1: ("FP32", "float_data"),
    2: ("UINT8", "int32_data"),
    3: ("INT8", "int32_data"),
    4: ("UINT16", "int32_data"),
    5: ("INT16", "int32_data"),
    6: ("INT32", "int32_data"),
    7: ("INT64", "int64_data"),
    8: ("BYTES", "string_data"),
    9: ("BOOL", "int32_data"),
    10: ("FP16", "int32_data"),
    11: ("FP64", "double_data"),
    12: ("UINT32", "uint64_data"),
    13: ("UINT64", "uint64_data"),
    16: ("BF16", "int32_data"),
}
_BY_DATATYPE = {datatype: number for number, (datatype, _) in _BY_TYPE.items()}


@functools.cache
def file_set() -> descriptor_pb2.FileDescriptorSet:
    return descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes())


@functools.cache
def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    for proto in file_set().file:
        pool.Add(proto)
    names = ("onnxruntime.server.PredictRequest", "onnxruntime.server.PredictResponse")
    return {
        name.rsplit(".", 1)[1]: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        for name in (*names, "onnx.TensorProto")
    }


def predict_request() -> Any:
    return _classes()["PredictRequest"]


def predict_response() -> Any:
    return _classes()["PredictResponse"]


def parse_protobuf(body: bytes) -> Any:
    """A ``PredictRequest`` from its binary form."""
    try:
        return predict_request().FromString(body)
    except DecodeError:
        raise BadRequest("Invalid payload.") from None


def parse_json(body: bytes) -> Any:
    """A ``PredictRequest`` from its JSON form (unknown fields ignored, as ORT Server did)."""
    request = predict_request()()
    try:
        json_format.Parse(body, request, ignore_unknown_fields=True)
    except (json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"Invalid JSON PredictRequest: {exc}") from None
    return request


def response_json(response: Any) -> bytes:
    """A ``PredictResponse`` as ORT Server wrote it (proto3 JSON, camelCase, no whitespace)."""
    text = json_format.MessageToJson(response, indent=None, preserving_proto_field_name=False)
    return text.encode()


def tensor_from_onnx(name: str, proto: Any) -> Tensor:
    """An ``onnx.TensorProto`` as a named ``Tensor`` of raw bytes."""
    what = f"input '{name}'"
    found = _BY_TYPE.get(proto.data_type)
    if found is None:
        raise TensorError(f"{what}: ONNX data type {proto.data_type} is not supported")
    datatype, field = found
    shape = tuple(int(d) for d in proto.dims)
    if any(d < 0 for d in shape):
        raise TensorError(f"{what}: dims {list(shape)} has a negative dimension")
    count = element_count(shape)
    if proto.HasField("raw_data"):
        if datatype == "BYTES":
            raise TensorError(f"{what}: STRING tensors must be sent in string_data")
        want = count * NUMPY_DTYPES[datatype].itemsize
        if len(proto.raw_data) != want:
            raise TensorError(
                f"{what}: raw_data has {len(proto.raw_data)} bytes; dims {list(shape)} need {want}"
            )
        return Tensor(name, datatype, shape, bytes(proto.raw_data))
    values = list(getattr(proto, field))
    if len(values) != count:
        raise TensorError(
            f"{what}: {len(values)} values in {field} do not match dims {list(shape)}"
        )
    if datatype == "BYTES":
        return Tensor(name, datatype, shape, serialize_bytes(values))
    if datatype in ("FP16", "BF16"):
        array = np.asarray(values, dtype=np.int64)
        if array.size and (int(array.min()) < 0 or int(array.max()) > 0xFFFF):
            raise TensorError(f"{what}: an int32_data entry is not a 16-bit pattern")
        return Tensor(name, datatype, shape, array.astype("<u2").tobytes())
    dtype = NUMPY_DTYPES[datatype]
    array = np.asarray(values)
    if dtype.kind in "iub" and array.size and dtype.kind != "b":
        info = np.iinfo(dtype)
        if int(array.min()) < info.min or int(array.max()) > info.max:
            raise TensorError(f"{what}: a value is out of range for {datatype}")
    return Tensor(name, datatype, shape, np.ascontiguousarray(array, dtype=dtype).tobytes())


def tensor_to_onnx(tensor: Tensor, proto: Any) -> None:
    """Fill ``proto`` (an ``onnx.TensorProto``) with ``tensor``: ``raw_data``, or
    ``string_data`` for strings."""
    number = _BY_DATATYPE.get(tensor.datatype)
    if number is None:
        raise TensorError(f"output '{tensor.name}': {tensor.datatype} has no ONNX type")
    proto.data_type = number
    proto.dims.extend(int(d) for d in tensor.shape)
    if tensor.datatype == "BYTES":
        proto.string_data.extend(bytes(v) for v in tensor.array().reshape(-1))
    else:
        proto.raw_data = bytes(tensor.raw)


def request_tensors(request: Any) -> tuple[list[Tensor], list[str]]:
    """A ``PredictRequest``'s input tensors (by name) and its ``output_filter``."""
    inputs = [tensor_from_onnx(n, request.inputs[n]) for n in sorted(request.inputs)]
    if not inputs:
        raise BadRequest("the PredictRequest has no inputs")
    wanted = list(request.output_filter)
    if len(set(wanted)) != len(wanted):
        raise BadRequest("output_filter names an output more than once")
    return inputs, wanted


def build_response(tensors: list[Tensor], wanted: list[str]) -> Any:
    """The ``PredictResponse`` of the model's outputs, those in ``wanted`` when it names any."""
    by_name = {t.name: t for t in tensors}
    for name in wanted:
        if name not in by_name:
            raise BadRequest(f"output '{name}' in output_filter is not an output of the model")
    response = predict_response()()
    for tensor in tensors:
        if not wanted or tensor.name in wanted:
            tensor_to_onnx(tensor, response.outputs[tensor.name])
    return response
