"""Serialisation of one handler result into response bytes, as TorchServe's backend does it."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

from handlers.exceptions import UnsupportedOutputType

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain"
TENSOR_TYPE = "application/octet-stream"


def encode_output(value: Any) -> tuple[bytes, str | None]:
    """One result -> ``(body, content_type)``.

    bytes/bytearray are sent as they are (content type None: the handler's own, if it set one);
    str is UTF-8 ``text/plain``; a ``torch.Tensor`` is ``torch.save`` bytes; anything else is
    ``json.dumps(value, indent=2)`` (TorchServe's format), with numpy arrays and scalars turned
    into lists and numbers first. Raises ``UnsupportedOutputType`` for what JSON cannot hold.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), None
    if isinstance(value, str):
        return value.encode("utf-8"), TEXT_TYPE
    torch = sys.modules.get("torch")  # if torch was never imported, no value can be a tensor
    if torch is not None and isinstance(value, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue(), TENSOR_TYPE
    try:
        body = json.dumps(value, indent=2, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise UnsupportedOutputType(
            f"Unsupported model output data type: {type(value).__name__} ({exc})"
        ) from exc
    return body.encode("utf-8"), JSON_TYPE


def _json_default(value: Any) -> Any:
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
