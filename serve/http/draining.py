"""Answer every request that arrives after SIGTERM with 503 and ``Connection: close``.

The listeners close at once on SIGTERM (`serve.http.servers`), but a client may still hold an
open keep-alive connection and send on it during the drain. Closing such connections under it
could cut off a request already on the wire; instead it gets a clear answer and the connection
is closed after it. Requests accepted before SIGTERM are not affected: they finish.
"""

from __future__ import annotations

import asyncio
from typing import Any

from serve.http.edge import answer_error
from serve.wire.errors import ShuttingDown

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
        await answer_error(scope, send, ShuttingDown(MESSAGE))
