"""Tensor datatypes and their byte encodings, as the Open Inference Protocol defines them.

Raw tensor bytes are little-endian and row-major without padding; ``BOOL`` is one byte per element;
``BYTES`` elements are each prefixed by their length as a 4-byte little-endian integer; ``BF16`` has
no numpy type, so its elements travel as the upper 16 bits of a float32 in a ``uint16`` array.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import numpy as np

from serve.wire.errors import BadRequest

# OIP datatype -> the little-endian numpy dtype of its elements.
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),  # raw bits: numpy has no bfloat16
    "BYTES": np.dtype(object),
}
DATATYPES = tuple(NUMPY_DTYPES)
_BY_KIND_SIZE = {
    (dt.kind, dt.itemsize): name
    for name, dt in NUMPY_DTYPES.items()
    if name not in ("BF16", "BYTES")
}
_LENGTH = struct.Struct("<I")


class TensorError(BadRequest):
    """A tensor whose datatype, shape or data do not agree (answered 400)."""


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def check_datatype(datatype: Any, what: str) -> str:
    if not isinstance(datatype, str) or datatype not in NUMPY_DTYPES:
        raise TensorError(
            f"invalid datatype {datatype!r} for {what}; expected one of {', '.join(DATATYPES)}"
        )
    return datatype


def check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise TensorError(f"invalid shape {shape!r} for {what}: expected a list of integers >= 0")
    return tuple(shape)


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype of a numpy array (object, str and bytes arrays are ``BYTES``)."""
    dt = array.dtype
    if dt.kind in "OSU":
        return "BYTES"
    name = _BY_KIND_SIZE.get((dt.kind, dt.itemsize))
    if name is None:
        raise TensorError(f"numpy dtype {dt} has no Open Inference Protocol datatype")
    return name


# ----- raw bytes ------------------------------------------------------------------------------


def _element_bytes(element: Any) -> bytes:
    if isinstance(element, str):
        return element.encode("utf-8")
    if isinstance(element, (bytes, bytearray, memoryview, np.bytes_)):
        return bytes(element)
    return str(element).encode("utf-8")


def serialize_bytes(elements: Iterable[Any]) -> bytes:
    """``BYTES`` elements as length-prefixed strings (str is UTF-8 encoded)."""
    parts = list(elements)
    if not set(map(type, parts)) <= {bytes}:
        parts = [_element_bytes(e) for e in parts]
    # map/zip/chain run in C, many times faster than a loop per element; in slices, so that a
    # decoding thread lets the event loop have the GIL between them.
    return b"".join(
        b"".join(chain.from_iterable(zip(map(_LENGTH.pack, map(len, part)), part, strict=True)))
        for part in _slices(parts)
    )


_SLICE = 32_768


def _slices(items: list[Any]) -> Iterable[list[Any]]:
    for start in range(0, len(items), _SLICE):
        yield items[start : start + _SLICE]


def deserialize_bytes(raw: bytes | memoryview, count: int | None = None) -> list[bytes]:
    """Length-prefixed elements back to a list; raises if the buffer is malformed."""
    view = memoryview(raw)
    out: list[bytes] = []
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise TensorError("BYTES data ends inside an element's length prefix")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise TensorError("BYTES data ends inside an element")
        out.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(out) != count:
        raise TensorError(f"BYTES data holds {len(out)} elements, the shape needs {count}")
    return out


def check_raw(datatype: str, shape: Sequence[int], raw: bytes | memoryview, what: str) -> None:
    """Raise unless ``raw`` is exactly the bytes a tensor of this datatype and shape needs."""
    count = element_count(shape)
    if datatype == "BYTES":
        try:
            deserialize_bytes(raw, count)
        except TensorError as exc:
            raise TensorError(f"{what}: {exc.message}") from None
        return
    expected = count * NUMPY_DTYPES[datatype].itemsize
    if len(raw) != expected:
        raise TensorError(
            f"{what}: {len(raw)} bytes of {datatype} data do not match shape {list(shape)} "
            f"({expected} bytes expected)"
        )


def array_from_raw(datatype: str, shape: Sequence[int], raw: bytes | memoryview) -> np.ndarray:
    """The array for raw tensor bytes (zero-copy for fixed-size types; read-only then)."""
    if datatype == "BYTES":
        array = np.empty(element_count(shape), dtype=object)
        array[:] = deserialize_bytes(raw, element_count(shape))
        return array.reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if len(raw) != element_count(shape) * dtype.itemsize:
        raise TensorError(f"{len(raw)} bytes of {datatype} data do not match shape {list(shape)}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def raw_from_array(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes(array.reshape(-1).tolist())
    return np.ascontiguousarray(array, dtype=NUMPY_DTYPES[datatype]).tobytes()


# ----- JSON data ------------------------------------------------------------------------------

_INT_RANGES = {
    name: (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
    for name, dt in NUMPY_DTYPES.items()
    if dt.kind in "iu"
}


def _flatten(data: Any) -> list[Any]:
    """Nested lists flattened row-major, one nesting level per pass (no recursion)."""
    if not isinstance(data, list):
        return [data]
    flat = data
    while list in set(map(type, flat)):
        flat = [x for item in flat for x in (item if type(item) is list else (item,))]
    return flat


def array_from_json(data: Any, datatype: str, shape: Sequence[int], what: str) -> np.ndarray:
    """JSON ``data`` (nested or flat, row-major) as an array of ``datatype`` and ``shape``.

    Values must fit the datatype: booleans for ``BOOL``, integers in range for integer types,
    numbers for floating types, strings for ``BYTES``; ``BF16`` has no JSON form.
    """
    count = element_count(shape)
    if datatype == "BYTES":
        flat = _flatten(data)
        if not set(map(type, flat)) <= {str}:
            raise TensorError(f"{what}: BYTES data must be JSON strings")
        if len(flat) != count:
            raise TensorError(
                f"{what}: {len(flat)} elements of data do not match shape {list(shape)}"
            )
        array = np.empty(count, dtype=object)
        array[:] = [b for part in _slices(flat) for b in map(str.encode, part)]
        return array.reshape(shape)
    if datatype == "BF16":
        raise TensorError(f"{what}: BF16 data must be sent as binary data")
    try:
        values = np.asarray(data)
    except (ValueError, TypeError):
        values = np.asarray(list(_flatten(data)), dtype=object)
    if values.dtype == object:  # ragged nesting: flatten it, row-major order is what counts
        flat = list(_flatten(data))
        try:
            values = np.asarray(flat)
        except (ValueError, TypeError):
            values = np.asarray(flat, dtype=object)
    kind = values.dtype.kind
    if values.size and datatype == "BOOL" and kind != "b":
        raise TensorError(f"{what}: BOOL data must be JSON booleans")
    if values.size and datatype in _INT_RANGES:
        low, high = _INT_RANGES[datatype]
        if kind not in "iu":
            # numpy falls back to floats or objects for ints past int64 (UINT64's upper half).
            flat = list(_flatten(data))
            if not all(type(v) is int for v in flat):
                raise TensorError(f"{what}: {datatype} data must be JSON integers")
            if min(flat) < low or max(flat) > high:
                raise TensorError(f"{what}: a value is out of range for {datatype}")
            values = np.array(flat, dtype=NUMPY_DTYPES[datatype])
        elif int(values.min()) < low or int(values.max()) > high:
            raise TensorError(f"{what}: a value is out of range for {datatype}")
    if values.size and datatype.startswith("FP") and kind not in "iuf":
        raise TensorError(f"{what}: {datatype} data must be JSON numbers")
    if values.size != count:
        raise TensorError(
            f"{what}: {values.size} elements of data do not match shape {list(shape)}"
        )
    return values.astype(NUMPY_DTYPES[datatype], copy=False).reshape(shape)


def json_from_array(array: np.ndarray, datatype: str) -> list[Any]:
    """A flat, row-major JSON list of the elements (BYTES as UTF-8 text, BF16 as floats)."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [_text(v) for v in flat.tolist()]
    if datatype == "BF16":
        return bf16_to_float32(flat).tolist()
    return flat.tolist()


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype("<u4") << 16).view("<f4")


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bits."""
    as_int = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    rounded = as_int + 0x7FFF + ((as_int >> 16) & 1)
    return (rounded >> 16).astype("<u2")
