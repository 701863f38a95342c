"""Query and form parameters as the management operations read them (HTTP and gRPC alike)."""

from __future__ import annotations

from typing import Any

from serve.wire.errors import BadRequest


def parse_bool(value: str | None, default: bool) -> bool:
    """``true``, ``1``, ``yes`` or ``on`` (any case) is True; missing or empty is ``default``."""
    if value is None or value == "":
        return default
    return value.strip().lower() in ("true", "1", "yes", "on")


def parse_int(params: Any, name: str, default: int | None = None) -> int | None:
    """``params[name]`` as an int, ``default`` when missing or empty; `BadRequest` otherwise."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise BadRequest(f"Parameter {name} must be an integer, got {raw!r}") from None
