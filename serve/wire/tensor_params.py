"""How protocol requests travel between the frontend and a worker (inside Lantern only).

A protocol request is an ordinary ``BatchItem`` marked by the ``x-lantern-protocol`` header:

* ``oip``: one parameter per input tensor, named after the input, with content type
  ``application/x-lantern-tensor; datatype=FP32; shape=2,3`` and the raw little-endian bytes as
  payload. ``x-lantern-outputs`` (a JSON list) names the requested outputs, when the client named
  them; ``x-lantern-parameters`` (a JSON object) carries the request's ``parameters``.
* ``kserve-v1``: one parameter ``body`` with the client's JSON body, parsed in the worker, where the
  model's input types are known (KServe v1 / TF Serving bodies carry no datatypes).
* ``metadata``: no parameters; the worker answers the model's input/output metadata as JSON.

Tensor results come back as a *bundle*: the Open Inference Protocol's own binary form (a JSON
header ``{"outputs": [{"name", "datatype", "shape", "parameters": {"binary_data_size": n}}]}``
followed by each tensor's raw bytes), with content type
``application/x-lantern-tensors; header-length=N``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from serve.wire import (  # noqa: F401  (re-exported: the contract in one place)
    KINDS,
    KSERVE_V1,
    METADATA,
    OIP,
    OUTPUTS_HEADER,
    PARAMETERS_HEADER,
    PROTOCOL_HEADER,
)
from serve.wire.tensors import (
    TensorError,
    array_from_raw,
    check_datatype,
    check_raw,
    raw_from_array,
)

TENSOR_TYPE = "application/x-lantern-tensor"
BUNDLE_TYPE = "application/x-lantern-tensors"


@dataclass(slots=True)
class Tensor:
    """One named tensor as raw bytes (see ``serve.wire.tensors`` for the encoding)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes | memoryview

    def array(self) -> Any:
        return array_from_raw(self.datatype, self.shape, self.raw)

    @classmethod
    def from_array(cls, name: str, array: Any, datatype: str) -> Tensor:
        return cls(
            name, datatype, tuple(int(d) for d in array.shape), raw_from_array(array, datatype)
        )


def _media_params(content_type: str) -> tuple[str, dict[str, str]]:
    head, *rest = content_type.split(";")
    params = {}
    for part in rest:
        key, _, value = part.partition("=")
        params[key.strip().lower()] = value.strip()
    return head.strip().lower(), params


def tensor_content_type(datatype: str, shape: Sequence[int]) -> str:
    return f"{TENSOR_TYPE}; datatype={datatype}; shape={','.join(str(d) for d in shape)}"


def is_tensor_param(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == TENSOR_TYPE


def tensor_from_param(name: str, content_type: str, raw: bytes) -> Tensor:
    """A tensor parameter back to a ``Tensor``; raises ``TensorError`` if it does not add up."""
    _, params = _media_params(content_type)
    datatype = check_datatype(params.get("datatype"), f"input '{name}'")
    text = params.get("shape", "")
    try:
        shape = tuple(int(d) for d in text.split(",")) if text else ()
    except ValueError:
        raise TensorError(f"invalid shape {text!r} for input '{name}'") from None
    if any(d < 0 for d in shape):
        raise TensorError(f"invalid shape {list(shape)} for input '{name}'")
    check_raw(datatype, shape, raw, f"input '{name}'")
    return Tensor(name, datatype, shape, raw)


def encode_bundle(tensors: Sequence[Tensor]) -> tuple[bytes, str]:
    """Tensors -> (body, content type)."""
    header = {
        "outputs": [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": list(t.shape),
                "parameters": {"binary_data_size": len(t.raw)},
            }
            for t in tensors
        ]
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    body = b"".join([head, *(bytes(t.raw) for t in tensors)])
    return body, f"{BUNDLE_TYPE}; header-length={len(head)}"


def is_bundle(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == BUNDLE_TYPE


def decode_bundle(body: bytes, content_type: str) -> list[Tensor]:
    """A bundle back to tensors (views into ``body``)."""
    _, params = _media_params(content_type)
    length = int(params["header-length"])
    header = json.loads(body[:length])
    view = memoryview(body)
    offset = length
    tensors = []
    for out in header["outputs"]:
        size = int(out["parameters"]["binary_data_size"])
        raw = view[offset : offset + size]
        offset += size
        tensors.append(Tensor(out["name"], out["datatype"], tuple(out["shape"]), raw))
    return tensors
