"""Our access log: a pure-ASGI wrapper writing one line per request on ``serve.access``.

It also counts every response for TorchServe's ``Requests2XX/4XX/5XX``. The servers' own access
logs stay off (hypercorn, uvicorn); this one costs one ``perf_counter`` pair and one log call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from serve.logs import ACCESS_LOGGER

if TYPE_CHECKING:
    from serve.metrics.prometheus import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

access_logger = logging.getLogger(ACCESS_LOGGER)

_FORMAT = '%s "%s %s HTTP/%s" %d %.2fms model=%s version=%s request_id=%s'


class AccessLog:
    """Wrap ``app``: log each HTTP request and count its status class in ``metrics``.

    Model and version come from the route's path parameters; with ``resolve_default`` a request
    that named no version is logged with the model's default version (the inference port).
    """

    def __init__(
        self,
        app: ASGIApp,
        metrics: ServerMetrics | None = None,
        *,
        resolve_default: bool = False,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.resolve_default = resolve_default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        response: list[Any] = [500, None]  # status, headers: a 500 if the app dies unanswered

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                response[0] = message["status"]
                response[1] = message.get("headers")
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self._done(scope, response[0], response[1], time.perf_counter() - started)

    def _done(self, scope: Scope, status: int, headers: Any, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.response_sent(status)
        if not access_logger.isEnabledFor(logging.INFO):
            return
        params = scope.get("path_params") or {}
        model = params.get("model")
        version = params.get("version")
        if model and not version and self.resolve_default and self.metrics is not None:
            version = self.metrics.default_version(model)
        rid = scope.get("lantern.request_id") or _header(headers, b"x-request-id") or "-"
        client = scope.get("client")
        address = f"{client[0]}:{client[1]}" if client else "-"
        ms = seconds * 1000.0
        method, path = scope["method"], scope["path"]
        args = (address, method, path, scope.get("http_version", "1.1"), status, ms)
        # makeRecord + handle: logger.info() would also walk the stack (findCaller) per request.
        record = access_logger.makeRecord(
            ACCESS_LOGGER,
            logging.INFO,
            "",
            0,
            _FORMAT,
            (*args, model or "-", version or "-", rid),
            None,
        )
        record.__dict__.update(
            client=address,
            method=method,
            path=path,
            status=status,
            latency_ms=round(ms, 3),
            model=model,
            version=version,
            request_id=rid,
        )
        access_logger.handle(record)


def _header(headers: Any, name: bytes) -> str | None:
    for key, value in headers or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None
