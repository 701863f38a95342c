"""Answer an error at the ASGI edge, before any app ran: the same body and headers the apps use."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from serve.http.common import NO_CACHE_HEADERS, request_id
from serve.wire.errors import ServeError, error_body


async def answer_error(scope: Any, send: Any, err: ServeError) -> None:
    """``err`` as the app at this path would answer it, with ``Connection: close``.

    The body is never read, so the connection cannot carry another request; ``/v1`` and ``/v2``
    get those protocols' ``{"error"}`` shape, everything else TorchServe's.
    """
    path = scope.get("path", "")
    if path.startswith(("/v1/", "/v2/")) or path == "/v2":
        body = json.dumps({"error": err.message}).encode()
    else:
        body = error_body(err)
    rid = request_id(Request(scope))  # the client's x-request-id, or a new one; logged too
    headers = [(k.lower().encode(), v.encode()) for k, v in NO_CACHE_HEADERS.items()]
    headers += [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", rid.encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": err.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
