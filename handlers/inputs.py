"""Decoding of request parameter bytes, as TorchServe's ``decode_input_request`` does it."""

from __future__ import annotations

import codecs
import json
import logging
from typing import Any

logger = logging.getLogger(__name__)


def _media_type(content_type: str) -> tuple[str, dict[str, str]]:
    """``"Text/Plain; charset=latin-1"`` -> ``("text/plain", {"charset": "latin-1"})``."""
    head, *params = content_type.split(";")
    parsed = {}
    for param in params:
        key, sep, value = param.partition("=")
        if sep:
            parsed[key.strip().lower()] = value.strip().strip('"')
    return head.strip().lower(), parsed


def _charset(params: dict[str, str]) -> str:
    charset = params.get("charset", "utf-8")
    try:
        codecs.lookup(charset)
    except LookupError:
        return "utf-8"
    return charset


def decode_value(raw: bytes, content_type: str | None, *, decode: bool = True) -> Any:
    """JSON -> object, ``text/*`` -> str, anything else (or any decode error) -> the raw bytes.

    The raw bytes are the payload as the worker received it: a ``bytearray`` (what TorchServe
    hands handlers too), passed on without a copy.

    Unlike TorchServe, which compares the whole header with ``application/json``, the media type
    is parsed, so ``application/json; charset=utf-8`` and ``+json`` types are JSON too, and a
    ``charset`` parameter on ``text/*`` is honoured. ``decode=False`` is TorchServe's
    ``decode_input_request=false``: always the raw bytes.
    """
    if not isinstance(raw, (bytes, bytearray)):  # a payload is used as received: no copy
        raw = bytes(raw)
    if not decode or not content_type:
        return raw
    media_type, params = _media_type(content_type)
    if media_type == "application/json" or media_type.endswith("+json"):
        try:
            return json.loads(raw.decode(_charset(params)))
        except RecursionError:
            from handlers.exceptions import PredictionException

            raise PredictionException("the JSON body is nested too deeply", 400) from None
        except (ValueError, UnicodeDecodeError):
            logger.warning("Failed JSON decoding of input data; forwarding the raw bytes")
            return raw
    if media_type.startswith("text/"):
        try:
            return raw.decode(_charset(params))
        except UnicodeDecodeError:
            logger.warning("Failed text decoding of input data; forwarding the raw bytes")
            return raw
    return raw
