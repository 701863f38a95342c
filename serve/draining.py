"""Answer every request that arrives after SIGTERM with 503 and ``Connection: close``.

The listeners close at once on SIGTERM (`serve.http_server`), but a client may still hold an
open keep-alive connection and send on it during the drain. Closing such connections under it
could cut off a request already on the wire; instead it gets a clear answer and the connection
is closed after it. Requests accepted before SIGTERM are not affected: they finish.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from serve.errors import ShuttingDown, error_body

MESSAGE = "The server is shutting down; retry on another instance."


class Draining:
    """ASGI wrapper: once ``stopping`` is set, new HTTP requests get 503 + ``Connection: close``."""

    def __init__(self, app: Any, stopping: asyncio.Event) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.stopping.is_set():
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path.startswith(("/v1/", "/v2/")) or path == "/v2":  # those protocols' error shape
            body = json.dumps({"error": MESSAGE}).encode()
        else:
            body = error_body(ShuttingDown(MESSAGE))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
