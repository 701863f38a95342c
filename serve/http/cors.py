"""CORS the TorchServe way: configured values added to every response, and preflights answered.

TorchServe 0.12 (``NettyUtils.sendHttpResponse``) sets ``Access-Control-Allow-Origin`` to
``cors_allowed_origin`` verbatim (``*`` or an origin) on every response when that key is set, and
``Access-Control-Allow-Methods`` / ``-Headers`` to ``cors_allowed_methods`` /
``cors_allowed_headers`` when those are set, unless the response already has them. It does not
compare the request's ``Origin``; neither do we.

One deliberate difference: a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is
answered here, 200 with an empty body, before token auth and routing. TorchServe routes it like any
``OPTIONS`` request, so a preflight for ``/models`` gets 405 there and a browser gives up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve.config import Config

Scope = dict[str, Any]


@dataclass(frozen=True)
class CorsPolicy:
    """The CORS headers to add; built only when ``cors_allowed_origin`` is set."""

    origin: str
    methods: str | None = None
    headers: str | None = None

    @classmethod
    def from_config(cls, config: Config) -> CorsPolicy | None:
        origin = (config.cors_allowed_origin or "").strip()
        if not origin:
            return None
        methods = (config.cors_allowed_methods or "").strip() or None
        headers = (config.cors_allowed_headers or "").strip() or None
        return cls(origin, methods, headers)

    def header_pairs(self) -> list[tuple[bytes, bytes]]:
        pairs = [(b"access-control-allow-origin", self.origin.encode("latin-1"))]
        if self.methods:
            pairs.append((b"access-control-allow-methods", self.methods.encode("latin-1")))
        if self.headers:
            pairs.append((b"access-control-allow-headers", self.headers.encode("latin-1")))
        return pairs

    def add_to(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``headers`` with each CORS header the response does not already set."""
        present = {name.lower() for name, _ in headers}
        return list(headers) + [(n, v) for n, v in self.header_pairs() if n not in present]

    def wrap(self, app: Any) -> Any:
        return CorsMiddleware(app, self)


def is_preflight(scope: Scope) -> bool:
    if scope.get("method") != "OPTIONS":
        return False
    return any(name.lower() == b"access-control-request-method" for name, _ in scope["headers"])


class CorsMiddleware:
    """ASGI middleware applying a `CorsPolicy` to one app."""

    def __init__(self, app: Any, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if is_preflight(scope):
            headers = self.policy.add_to([(b"content-length", b"0")])
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": self.policy.add_to(message.get("headers", []))}
            await send(message)

        await self.app(scope, receive, send_with_cors)
