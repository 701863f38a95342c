"""KServe v1 and TF Serving REST predict bodies: parsing, and the JSON answers.

Requests are ``{"instances": [...]}`` (row format: one value per instance, or an object of named
inputs per instance) or ``{"inputs": ...}`` (columnar: one value, or an object of named inputs,
each holding the whole batch). Binary values are ``{"b64": "<base64>"}`` anywhere in the body.
Answers are ``{"predictions": [...]}`` (one per instance), ``{"outputs": ...}`` for columnar
requests, ``{"explanations": [...]}`` for ``:explain``, and ``{"error": "..."}`` on failure.
Parsing runs in the worker, where the model's input types are known; the frontend forwards bodies.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from dataclasses import dataclass
from typing import Any

from serve.wire.errors import BadRequest, PayloadTooLarge
from serve.wire.json_input import TOO_DEEP, parse_json
from serve.wire.tfserving import check_signature

DATA = "data"  # the row key of an unnamed instance (TorchServe handlers read row["data"])
ACTIONS = ("predict", "explain")


@dataclass(slots=True)
class V1Request:
    """A parsed predict body: ``rows`` are per-instance dicts, or one dict for columnar input."""

    rows: list[dict[str, Any]]
    columnar: bool


def split_target(target: str) -> tuple[str, str | None]:
    """``"mnist:predict"`` -> ``("mnist", "predict")``; no ``:`` -> ``(target, None)``."""
    name, sep, action = target.rpartition(":")
    return (name, action) if sep else (target, None)


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def decode_b64(value: Any) -> Any:
    """Replace every ``{"b64": "..."}`` in ``value`` with the bytes it encodes."""
    if _is_b64(value):
        text = value["b64"]
        if not isinstance(text, str):
            raise BadRequest("a b64 value must be a string")
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("invalid base64 in a b64 value") from None
    if isinstance(value, list):
        return [decode_b64(v) for v in value]
    if isinstance(value, dict):
        return {k: decode_b64(v) for k, v in value.items()}
    return value


def _row(value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and not _is_b64(value):
        if not value:
            raise BadRequest("an instance object must name at least one input")
        return {str(k): decode_b64(v) for k, v in value.items()}
    return {DATA: decode_b64(value)}


def parse_predict(body: bytes, max_elements: int | None = None) -> V1Request:
    """Parse a predict/explain body; raises ``BadRequest`` with TF Serving-like messages.

    ``max_elements`` caps the values in the body (numbers, strings, ``{"b64"}`` objects): 413 past
    it, before any of them is converted.
    """
    doc = parse_json(body)
    if max_elements is not None:
        count = count_values(doc, max_elements)
        if count > max_elements:
            raise PayloadTooLarge(
                f"the request holds more than {max_elements} values; this server accepts at "
                "most that many per request (max_request_elements)"
            )
    try:
        return _parse_doc(doc)
    except RecursionError:  # b64 values looked for in a (legally) deep document
        raise BadRequest(f"the request JSON {TOO_DEEP}") from None


def count_values(doc: Any, limit: int) -> int:
    """The scalar values in ``doc`` (a ``{"b64"}`` object is one), counting stops past ``limit``."""
    count = 0
    stack = [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict) and not _is_b64(value):
            stack.extend(value.values())
        else:
            count += 1
            if count > limit:
                break
    return count


def _parse_doc(doc: Any) -> V1Request:
    if not isinstance(doc, dict):
        raise BadRequest("the request must be a JSON object with 'instances' or 'inputs'")
    signature = doc.get("signature_name", "")
    check_signature(signature if isinstance(signature, str) else str(signature))
    has_rows, has_cols = "instances" in doc, "inputs" in doc
    if has_rows == has_cols:
        raise BadRequest("the request must have exactly one of 'instances' or 'inputs'")
    if has_cols:
        return V1Request([_row(doc["inputs"])], columnar=True)
    instances = doc["instances"]
    if not isinstance(instances, list) or not instances:
        raise BadRequest("'instances' must be a non-empty list")
    rows = [_row(v) for v in instances]
    keys = set(rows[0])
    if any(set(r) != keys for r in rows):
        raise BadRequest("every instance must name the same inputs")
    return V1Request(rows, columnar=False)


def jsonable(value: Any) -> Any:
    """A handler's or model's result as JSON data: arrays as lists, bytes as ``{"b64": ...}``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        if value.dtype.kind in "OSU":
            return jsonable(value.tolist())
        return value.tolist()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    return value


def answer(values: Any, *, columnar: bool, explain: bool) -> bytes:
    """The response body: predictions/outputs, or explanations for ``:explain``."""
    key = "explanations" if explain else "outputs" if columnar else "predictions"
    return json.dumps({key: jsonable(values)}, separators=(",", ":")).encode()


def status_body(name: str, versions: list[tuple[str, str, str]]) -> dict[str, Any]:
    """KServe v1 ``{"name", "ready"}`` merged with TF Serving's ``model_version_status``.

    ``versions`` holds ``(version, state, error)``, state being TF Serving's ``AVAILABLE``,
    ``LOADING`` or ``END`` (failed, or no worker).
    """
    return {
        "name": name,
        "ready": any(state == "AVAILABLE" for _, state, _ in versions),
        "model_version_status": [
            {
                "version": version,
                "state": state,
                "status": {
                    "error_code": "UNAVAILABLE" if error else "OK",
                    "error_message": error,
                },
            }
            for version, state, error in versions
        ],
    }
