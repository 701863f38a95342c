"""Read an inference request's inputs the TorchServe way.

Query parameters become parameters by name, form fields (multipart or urlencoded) by field name
(several files under one field are all kept), and any other body becomes one parameter named
``body`` with the request's Content-Type.
"""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request

from serve.wire.errors import BadRequest, PayloadTooLarge

Param = tuple[str, "str | None", bytes]

_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


TIMEOUT_HEADER = "x-request-timeout"  # seconds; a per-request deadline below responseTimeout


def request_timeout(request: Request) -> float | None:
    """The client's own deadline from the ``x-request-timeout`` header, if it sent one."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"Header {TIMEOUT_HEADER} must be a number of seconds.") from None
    if value <= 0:
        raise BadRequest(f"Header {TIMEOUT_HEADER} must be positive.")
    return value


def check_declared_size(request: Request, max_size: int) -> None:
    """Refuse a body whose Content-Length is over ``max_size`` before reading any of it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest("Invalid Content-Length header.") from None
        if size > max_size:
            raise too_large(max_size)


async def read_params(request: Request, max_size: int) -> list[Param]:
    """The request's parameters as ``(name, content_type, bytes)``; raises 413 past ``max_size``."""
    check_declared_size(request, max_size)
    params: list[Param] = []
    if request.scope.get("query_string"):  # most requests have none: skip building QueryParams
        params = [(k, None, v.encode()) for k, v in request.query_params.multi_items()]
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() in _FORM_TYPES:
        params.extend(await _read_form(request, max_size))
    else:
        body = await read_body(request, max_size)
        if body or not params:
            params.append(("body", content_type or None, body))
    return params


async def read_body(request: Request, max_size: int) -> bytes:
    """The raw body, read in chunks; 413 as soon as it passes ``max_size``."""
    check_declared_size(request, max_size)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_size:
            raise too_large(max_size)
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_form(request: Request, max_size: int) -> list[Param]:
    try:
        form = await request.form(max_files=1000, max_fields=1000, max_part_size=max_size)
    except PayloadTooLarge:
        raise
    except Exception as exc:  # the multipart parser raises its own types for malformed bodies
        raise BadRequest(f"Malformed form body: {exc}") from exc
    params: list[Param] = []
    try:
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                data = await value.read()
                params.append((name, value.content_type, data))
            else:
                params.append((name, None, value.encode()))
    finally:
        await form.close()
    if sum(len(p[2]) for p in params) > max_size:
        raise too_large(max_size)
    return params


def too_large(max_size: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body exceeds max_request_size of {max_size} bytes.")
