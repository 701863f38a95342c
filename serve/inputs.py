"""Read an inference request's inputs the TorchServe way.

Query parameters become parameters by name, form fields (multipart or urlencoded) by field name
(several files under one field are all kept), and any other body becomes one parameter named
``body`` with the request's Content-Type.
"""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request

from serve.errors import BadRequest, PayloadTooLarge

Param = tuple[str, "str | None", bytes]

_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


async def read_params(request: Request, max_size: int) -> list[Param]:
    """The request's parameters as ``(name, content_type, bytes)``; raises 413 past ``max_size``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > max_size:
                raise _too_large(max_size)
        except ValueError:
            raise BadRequest("Invalid Content-Length header.") from None
    params: list[Param] = [(k, None, v.encode()) for k, v in request.query_params.multi_items()]
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() in _FORM_TYPES:
        params.extend(await _read_form(request, max_size))
    else:
        body = await _read_body(request, max_size)
        if body or not params:
            params.append(("body", content_type or None, body))
    return params


async def _read_body(request: Request, max_size: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_size:
            raise _too_large(max_size)
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
        raise _too_large(max_size)
    return params


def _too_large(max_size: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body exceeds max_request_size of {max_size} bytes.")
