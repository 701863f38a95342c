"""Answer an error at the ASGI edge, before any app ran: the same body and headers the apps use."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from serve.http.common import NO_CACHE_HEADERS, request_id
from serve.wire import oip
from serve.wire import openai as oai
from serve.wire.errors import ServeError, error_body


def is_protocol_path(path: str) -> bool:
    """Whether ``path`` lies under the KServe v1 (``/v1``) or Open Inference (``/v2``) routes."""
    return path.startswith(("/v1/", "/v2/")) or path == "/v2"


def is_openai_request(path: str, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the inference port's OpenAI routes would answer ``path`` for this client."""
    if oai.is_openai_path(path):
        return True
    is_models = path == "/v1/models" or path.startswith("/v1/models/")
    return is_models and oai.is_openai_client(headers)


async def answer_error(
    scope: Any, send: Any, err: ServeError, *, protocols: bool = True, close: bool = True
) -> None:
    """``err`` as the app at this path would answer it, with the request id and ``err.headers``.

    With ``protocols`` (the inference port, where ``/v1`` and ``/v2`` are those protocols'
    routes), paths under them get the protocols' ``{"error"}`` shape; everything else gets
    TorchServe's. With ``close``, the answer says ``Connection: close``: for callers that refuse
    before the body is read and want no further request on the connection.
    """
    path = scope.get("path", "")
    if protocols and is_openai_request(path, scope.get("headers", [])):
        body = oai.error_body(err)
    elif protocols and is_protocol_path(path):
        body = oip.error_body(err.message)
    else:
        body = error_body(err)
    rid = request_id(Request(scope))  # the client's x-request-id, or a new one; logged too
    fields = {**NO_CACHE_HEADERS, **err.headers}
    headers = [(k.lower().encode(), v.encode()) for k, v in fields.items()]
    headers += [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", rid.encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
