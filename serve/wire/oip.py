"""Open Inference Protocol v2 (REST) requests and responses, with the binary tensor extension.

``parse_request`` turns a request body (JSON, or a JSON header plus raw tensors when
``Inference-Header-Content-Length`` is given) into validated tensors; binary inputs are only
length-checked and never copied into arrays. ``build_response`` turns the model's output tensors
into the response body, each output as JSON ``data`` or raw bytes as the request asked. Every
problem with the request raises ``BadRequest`` with a message for the client.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from serve.wire.errors import BadRequest, PayloadTooLarge
from serve.wire.json_input import TOO_DEEP, parse_json
from serve.wire.tensor_params import Tensor
from serve.wire.tensors import (
    TensorError,
    array_from_json,
    check_datatype,
    check_raw,
    check_shape,
    element_count,
    json_from_array,
    raw_from_array,
)

HEADER_LENGTH = "inference-header-content-length"
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "model_versions",
    "parameters",
    "model_configuration",
    "model_repository",
    "statistics",
]
_UNSUPPORTED_PARAMS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: the request's ``binary_data_output`` decides
    classification: int = 0


@dataclass(slots=True)
class InferRequest:
    id: str | None
    parameters: dict[str, Any]
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None  # None: every output
    binary_output: bool = False
    timeout_us: int | None = None

    @property
    def output_names(self) -> list[str] | None:
        return None if self.outputs is None else [o.name for o in self.outputs]


def header_length(value: str | None, body_size: int) -> int | None:
    """The ``Inference-Header-Content-Length`` value, validated against the body size."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise BadRequest(
            f"Inference-Header-Content-Length must be an integer, got {value!r}"
        ) from None
    if length <= 0 or length > body_size:
        raise BadRequest(
            f"Inference-Header-Content-Length {length} does not fit a body of {body_size} bytes"
        )
    return length


def _parameters(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(v, (str, int, float, bool)) for v in value.values()
    ):
        raise BadRequest(f"{what} parameters must be an object of strings, numbers or booleans")
    for key in _UNSUPPORTED_PARAMS:
        if key in value:
            raise BadRequest(f"{what}: shared memory is not supported by this server")
    return value


def parse_request(body: bytes, length: int | None, max_elements: int | None = None) -> InferRequest:
    """Parse and validate an inference request body.

    ``max_elements`` caps the tensor elements of all inputs together (413 past it), checked from
    the declared shapes before any data is converted.
    """
    head = body if length is None else body[:length]
    doc = parse_json(head)
    try:
        return _parse_doc(doc, body, length, max_elements)
    except RecursionError:  # data nested deeper than the converters recurse
        raise BadRequest(f"the request JSON {TOO_DEEP}") from None


# ----- refusing before parsing -----------------------------------------------------------------

PRESCAN_BYTES = 64 * 1024  # the head of a JSON body read for declared shapes before any parse
_SHAPE_KEY = re.compile(rb'"shape"\s*:\s*\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]')
_STRUCTURE = re.compile(rb'"[^"]*"|[{}\[\]]')  # strings (no escapes, see below) and brackets


def declared_elements(body: bytes | memoryview) -> int:
    """A lower bound on the tensor elements a JSON request's inputs declare, read from the
    ``shape`` of each input in the first `PRESCAN_BYTES` without parsing the body (its data).

    Counted only where it is certain: each ``inputs[i].shape`` key outside any string (a head
    with a backslash, where strings may hold escaped quotes, counts nothing), the last of an
    input's shapes if it has several (and of the last ``inputs``), as `_check_elements` counts
    them after a full parse. So a body refused for this is one the full parse would refuse too
    (or find malformed), short of a document that repeats ``inputs`` past the head.
    """
    head = bytes(body[:PRESCAN_BYTES])
    if b"\\" in head:
        return 0
    shapes: dict[int, int] = {}
    stack: list[tuple[bytes, bytes]] = []  # (bracket, the key it is the value of)
    entries = 0  # objects opened as elements of the top-level "inputs"
    last_string = b""
    tokens = _STRUCTURE.finditer(head)
    for match in _SHAPE_KEY.finditer(head):
        for token in tokens:  # the structure up to this "shape" key, which is a string token
            if token.start() >= match.start() or token.end() > match.start():
                break
            text = token.group()
            if text[:1] == b'"':
                last_string = text
            elif text in (b"{", b"["):
                stack.append((text, last_string))
                if text == b"{" and _in_inputs(stack[:-1]):
                    entries += 1
                elif _in_inputs(stack):  # another "inputs" list: the last one counts
                    shapes.clear()
            elif stack:
                stack.pop()
        else:
            break
        if token.start() != match.start():
            break  # this "shape" lies inside a string: nothing after it is certain
        if len(stack) == 3 and stack[2][0] == b"{" and _in_inputs(stack[:2]):
            dims = [int(d) for d in match.group(1).split(b",")] if match.group(1) else []
            shapes[entries] = element_count(dims)
    return sum(shapes.values())


def _in_inputs(stack: list[tuple[bytes, bytes]]) -> bool:
    """Whether ``stack`` is the document's object, then its ``inputs`` list."""
    return len(stack) == 2 and stack[0][0] == b"{" and stack[1] == (b"[", b'"inputs"')


def refuse_declared(body: bytes | memoryview, max_elements: int | None) -> None:
    """413 at once when the shapes `declared_elements` reads already pass ``max_elements``."""
    if max_elements is not None:
        _refuse_over(declared_elements(body), max_elements)


def _refuse_over(total: int, max_elements: int) -> None:
    if total > max_elements:
        raise PayloadTooLarge(
            f"the request's inputs hold {total} tensor elements; this server accepts at most "
            f"{max_elements} per request (max_request_elements)"
        )


def _check_elements(raw_inputs: list[Any], max_elements: int | None) -> None:
    if max_elements is None:
        return
    total = 0
    for entry in raw_inputs:
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape):
            total += element_count(shape)
    _refuse_over(total, max_elements)


def _parse_doc(doc: Any, body: bytes, length: int | None, max_elements: int | None) -> InferRequest:
    if not isinstance(doc, dict):
        raise BadRequest("the inference request must be a JSON object")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("the request 'id' must be a string")
    params = dict(_parameters(doc.get("parameters"), "request"))
    binary_output = params.pop("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise BadRequest("parameter binary_data_output must be a boolean")
    timeout_us = timeout_parameter(params)
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise BadRequest("the inference request needs an 'inputs' list")
    _check_elements(raw_inputs, max_elements)
    binary = memoryview(body)[length:] if length is not None else None
    offset = 0
    inputs: list[Tensor] = []
    seen: set[str] = set()
    for entry in raw_inputs:
        tensor, used = _parse_input(entry, binary, offset)
        if tensor.name in seen:
            raise BadRequest(f"input '{tensor.name}' appears more than once")
        seen.add(tensor.name)
        inputs.append(tensor)
        offset += used
    if binary is not None and offset != len(binary):
        raise BadRequest(
            f"the request carries {len(binary) - offset} bytes of binary data no input claims"
        )
    return InferRequest(
        rid, params, inputs, _parse_outputs(doc.get("outputs")), binary_output, timeout_us
    )


def _parse_input(entry: Any, binary: memoryview | None, offset: int) -> tuple[Tensor, int]:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise BadRequest("each input needs a 'name' string")
    name = entry["name"]
    what = f"input '{name}'"
    datatype = check_datatype(entry.get("datatype"), what)
    shape = check_shape(entry.get("shape"), what)
    params = _parameters(entry.get("parameters"), what)
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in entry:
            raise BadRequest(f"{what} has both 'data' and binary_data_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BadRequest(f"{what}: binary_data_size must be a non-negative integer")
        if binary is None:
            raise BadRequest(
                f"{what} has binary_data_size but the request has no "
                "Inference-Header-Content-Length header"
            )
        if offset + size > len(binary):
            raise BadRequest(f"{what}: binary_data_size {size} runs past the end of the body")
        raw = binary[offset : offset + size]
        check_raw(datatype, shape, raw, what)
        return Tensor(name, datatype, shape, raw), size
    if "data" not in entry:
        raise BadRequest(f"{what} has neither 'data' nor binary_data_size")
    array = array_from_json(entry["data"], datatype, shape, what)
    return Tensor(name, datatype, shape, raw_from_array(array, datatype)), 0


def _parse_outputs(value: Any) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest("'outputs' must be a list")
    outputs: list[RequestedOutput] = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadRequest("each requested output needs a 'name' string")
        name = entry["name"]
        params = _parameters(entry.get("parameters"), f"output '{name}'")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise BadRequest(f"output '{name}': binary_data must be a boolean")
        outputs.append(requested_output(name, binary, params, outputs))
    return outputs


def timeout_parameter(params: dict[str, Any]) -> int | None:
    """The request's ``timeout`` parameter, checked: microseconds, None for none (or 0).

    Shared by the HTTP and gRPC codecs (``serve.grpc.oip_codec``), as is `requested_output`."""
    timeout = params.get("timeout")
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise BadRequest("parameter timeout must be a non-negative integer (microseconds)")
    return timeout or None


def requested_output(
    name: str, binary: bool | None, params: dict[str, Any], before: list[RequestedOutput]
) -> RequestedOutput:
    """One requested output, its ``classification`` parameter checked and its name not among
    those requested ``before`` it."""
    classes = params.get("classification", 0)
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 0:
        raise BadRequest(f"output '{name}': classification must be a non-negative integer")
    if any(o.name == name for o in before):
        raise BadRequest(f"output '{name}' is requested more than once")
    return RequestedOutput(name, binary, classes)


# ----- responses ------------------------------------------------------------------------------


def classify(tensor: Tensor, count: int, labels: Sequence[str] = ()) -> Tensor:
    """Triton's classification extension: the top ``count`` ``"value:index"`` per batch row,
    ``"value:index:label"`` where the output has labels (config.pbtxt's ``label_filename``)."""
    if tensor.datatype in ("BYTES", "BF16"):
        raise BadRequest(f"output '{tensor.name}' of {tensor.datatype} cannot be classified")
    array = tensor.array()
    rows = array.reshape(1, -1) if array.ndim <= 1 else array.reshape(array.shape[0], -1)
    k = min(count, rows.shape[1])
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :k]
    texts = np.empty(order.shape, dtype=object)
    for r, row in enumerate(order):
        texts[r] = [_class(float(rows[r, i]), int(i), labels) for i in row]
    shape = (k,) if array.ndim <= 1 else (array.shape[0], k)
    return Tensor.from_array(tensor.name, texts.reshape(shape), "BYTES")


def _class(value: float, index: int, labels: Sequence[str]) -> bytes:
    if index < len(labels):
        return f"{value:f}:{index}:{labels[index]}".encode()
    return f"{value:f}:{index}".encode()


def answered_outputs(
    request: InferRequest,
    model_name: str,
    tensors: list[Tensor],
    labels: Mapping[str, Sequence[str]] | None = None,
) -> list[tuple[RequestedOutput, Tensor]]:
    """The outputs a response carries, in order: those the request named (classified where it
    asked), else every tensor the model answered. Shared with ``serve.grpc.oip_codec``."""
    by_name = {t.name: t for t in tensors}
    if request.outputs is None:
        wanted = [RequestedOutput(t.name) for t in tensors]
    else:
        wanted = request.outputs
    answered = []
    for out in wanted:
        tensor = by_name.get(out.name)
        if tensor is None:
            raise BadRequest(f"unexpected inference output '{out.name}' for model '{model_name}'")
        if out.classification:
            tensor = classify(tensor, out.classification, (labels or {}).get(out.name, ()))
        answered.append((out, tensor))
    return answered


def build_response(
    request: InferRequest,
    model_name: str,
    model_version: str,
    tensors: list[Tensor],
    labels: Mapping[str, Sequence[str]] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers (content type, and the header length when binary)."""
    outputs: list[dict[str, Any]] = []
    raws: list[bytes | memoryview] = []
    for out, tensor in answered_outputs(request, model_name, tensors, labels):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        binary = out.binary if out.binary is not None else request.binary_output
        if binary:
            entry["parameters"] = {"binary_data_size": len(tensor.raw)}
            raws.append(tensor.raw)
        else:
            try:
                entry["data"] = json_from_array(tensor.array(), tensor.datatype)
            except TensorError as exc:
                raise BadRequest(f"output '{tensor.name}': {exc.message}") from None
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        doc["id"] = request.id
    doc["outputs"] = outputs
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not raws:
        return head, {"content-type": "application/json"}
    body = b"".join([head, *(bytes(r) for r in raws)])
    return body, {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
