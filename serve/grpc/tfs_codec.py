"""TensorFlow's ``TensorProto`` <-> the tensors Lantern's tensor path carries (sans-IO).

``tensor_from_proto`` reads every encoding TF Serving's clients send: ``tensor_content`` (raw
little-endian bytes, as ``tf.make_tensor_proto`` writes for numbers) and the typed ``*_val``
fields (as hand-built requests and other languages write them), strings in ``string_val``. The
typed fields follow TensorFlow's ``Tensor::FromProto``: no values is all zeros, fewer values than
the shape holds repeat the last one (a single value fills the tensor), more is an error.
``tensor_to_proto`` answers with the typed fields, as TF Serving does by default
(``AsProtoField``), so clients reading ``outputs["y"].float_val`` and ``tf.make_ndarray`` both work.
Problems raise ``TensorError`` (INVALID_ARGUMENT).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from serve.grpc.gen.tensorflow.core.framework import tensor_pb2, types_pb2
from serve.wire.tensor_params import Tensor
from serve.wire.tensors import NUMPY_DTYPES, TensorError, element_count, serialize_bytes

DataType = types_pb2.DataType

# TensorFlow DataType -> (OIP datatype, the typed TensorProto field that carries it).
_BY_DTYPE: dict[int, tuple[str, str]] = {
    DataType.DT_FLOAT: ("FP32", "float_val"),
    DataType.DT_DOUBLE: ("FP64", "double_val"),
    DataType.DT_INT32: ("INT32", "int_val"),
    DataType.DT_INT16: ("INT16", "int_val"),
    DataType.DT_INT8: ("INT8", "int_val"),
    DataType.DT_UINT8: ("UINT8", "int_val"),
    DataType.DT_UINT16: ("UINT16", "int_val"),
    DataType.DT_INT64: ("INT64", "int64_val"),
    DataType.DT_UINT32: ("UINT32", "uint32_val"),
    DataType.DT_UINT64: ("UINT64", "uint64_val"),
    DataType.DT_BOOL: ("BOOL", "bool_val"),
    DataType.DT_HALF: ("FP16", "half_val"),
    DataType.DT_BFLOAT16: ("BF16", "half_val"),
    DataType.DT_STRING: ("BYTES", "string_val"),
}
_BY_DATATYPE: dict[str, int] = {datatype: dtype for dtype, (datatype, _) in _BY_DTYPE.items()}


def dtype_name(dtype: int) -> str:
    """``DT_FLOAT`` for 1; the number itself when TensorFlow has no such type."""
    try:
        return DataType.Name(dtype)
    except ValueError:
        return str(dtype)


def datatype_of_dtype(dtype: int, what: str) -> str:
    """The OIP datatype of a TensorFlow ``DataType``; unsupported ones are a ``TensorError``."""
    found = _BY_DTYPE.get(dtype)
    if found is None:
        raise TensorError(f"{what}: {dtype_name(dtype)} tensors are not supported by this server")
    return found[0]


def dtype_of_datatype(datatype: str) -> int:
    """The TensorFlow ``DataType`` of an OIP datatype (``DT_INVALID`` when it has none)."""
    return _BY_DATATYPE.get(datatype, DataType.DT_INVALID)


def shape_of(proto: Any, what: str) -> tuple[int, ...]:
    """A ``TensorShapeProto`` as a concrete shape; unknown ranks and sizes are refused."""
    if proto.unknown_rank:
        raise TensorError(f"{what}: a tensor's shape must have a known rank")
    shape = tuple(int(d.size) for d in proto.dim)
    if any(d < 0 for d in shape):
        raise TensorError(f"{what}: shape {list(shape)} has an unknown (negative) dimension")
    return shape


def tensor_from_proto(name: str, proto: Any) -> Tensor:
    """A ``tensorflow.TensorProto`` as a named ``Tensor`` of raw bytes."""
    what = f"input '{name}'"
    datatype = datatype_of_dtype(proto.dtype, what)
    field = _BY_DTYPE[proto.dtype][1]
    shape = shape_of(proto.tensor_shape, what)
    count = element_count(shape)
    if proto.tensor_content:
        if datatype == "BYTES":
            raise TensorError(f"{what}: DT_STRING tensors must be sent in string_val")
        dtype = NUMPY_DTYPES[datatype]
        want = count * dtype.itemsize
        got = len(proto.tensor_content)
        if got != want:
            raise TensorError(
                f"{what}: tensor_content has {got} bytes; shape {list(shape)} of "
                f"{dtype_name(proto.dtype)} needs {want}"
            )
        return Tensor(name, datatype, shape, bytes(proto.tensor_content))
    values = list(getattr(proto, field))
    if len(values) > count:
        raise TensorError(
            f"{what}: {len(values)} values in {field} do not fit shape {list(shape)} "
            f"({count} elements)"
        )
    if datatype == "BYTES":
        filled = _filled(values, count, b"")
        return Tensor(name, datatype, shape, serialize_bytes(filled))
    dtype = NUMPY_DTYPES[datatype]
    if datatype in ("FP16", "BF16"):  # half_val carries the 16 bits in an int32
        array = np.asarray(_filled(values, count, 0), dtype=np.int64)
        if array.size and (int(array.min()) < 0 or int(array.max()) > 0xFFFF):
            raise TensorError(f"{what}: a half_val entry is not a 16-bit pattern")
        return Tensor(name, datatype, shape, array.astype("<u2").tobytes())
    array = np.asarray(_filled(values, count, 0))
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if int(array.min()) < info.min or int(array.max()) > info.max:
            raise TensorError(f"{what}: a value is out of range for {dtype_name(proto.dtype)}")
    return Tensor(name, datatype, shape, np.ascontiguousarray(array, dtype=dtype).tobytes())


def _filled(values: list[Any], count: int, zero: Any) -> list[Any]:
    """TensorFlow's rule for typed fields: pad with the last value (zeros when there is none)."""
    if len(values) == count:
        return values
    pad = values[-1] if values else zero
    return values + [pad] * (count - len(values))


def tensor_to_proto(tensor: Tensor, proto: Any | None = None) -> Any:
    """A ``Tensor`` as a ``tensorflow.TensorProto`` with the typed field of its dtype."""
    out = proto if proto is not None else tensor_pb2.TensorProto()
    dtype = dtype_of_datatype(tensor.datatype)
    if dtype == DataType.DT_INVALID:
        raise TensorError(f"output '{tensor.name}': {tensor.datatype} has no TensorFlow type")
    out.dtype = dtype
    for size in tensor.shape:
        out.tensor_shape.dim.add(size=int(size))
    field = _BY_DTYPE[dtype][1]
    array = tensor.array()
    if tensor.datatype == "BYTES":
        out.string_val.extend(
            bytes(v) if not isinstance(v, str) else v.encode() for v in array.flat
        )
    elif tensor.datatype in ("FP16", "BF16"):
        bits = np.frombuffer(bytes(tensor.raw), dtype="<u2")
        out.half_val.extend(bits.astype(np.int32).tolist())
    else:
        getattr(out, field).extend(array.reshape(-1).tolist())
    return out
