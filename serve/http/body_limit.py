"""Refuse a request whose declared body is over ``max_request_size`` before reading any of it.

Checked from the ``Content-Length`` header before the app runs and before anything reads the
body, so that a client that sent ``Expect: 100-continue`` gets the 413 instead of an invitation to
upload. On uvicorn that is the whole story: it sends ``100 Continue`` only when the app first reads
the body. hypercorn sends ``100 Continue`` as soon as it has parsed the request head, before any
app code runs; there the 413 follows at once and the connection is closed (docs/faults.md).
"""

from __future__ import annotations

from typing import Any

from serve.http.edge import answer_error
from serve.http.inputs import too_large


class DeclaredSizeLimit:
    """ASGI wrapper: 413 + ``Connection: close`` for a declared body over ``max_size`` bytes."""

    def __init__(self, app: Any, max_size: int) -> None:
        self.app = app
        self.max_size = max_size

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self._declared(scope) > self.max_size:
            await answer_error(scope, send, too_large(self.max_size))
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _declared(scope: Any) -> int:
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    return int(value)
                except ValueError:
                    return -1  # the server's parser refuses those before we get here
        return -1
