"""A gRPC call that reaches an HTTP port: answered UNIMPLEMENTED, saying where gRPC is served.

gRPC needs HTTP/2; hypercorn speaks it (cleartext, with prior knowledge), so a gRPC client pointed
at the HTTP port reaches the ASGI app. Without this wrapper it gets a bare HTTP 404 that clients
report as "Received http2 header with status: 404". The check costs one comparison per HTTP/1.1
request. (uvicorn speaks no HTTP/2: there the client's connection attempt fails at once.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

_UNIMPLEMENTED = b"12"


class GrpcOnHttp:
    """ASGI wrapper: answer gRPC requests with an UNIMPLEMENTED gRPC status."""

    def __init__(self, app: Any, addresses: Mapping[str, str], port: str) -> None:
        self.app = app
        self.addresses = addresses  # the server's, filled in once the gRPC listeners are bound
        self.port = port

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("http_version") == "2" and _is_grpc(scope):
            message = _message(self.port, self.addresses.get(f"grpc_{self.port}"))
            # Status in trailers (gRPC clients send ``te: trailers``; hypercorn sends them).
            start = [(b"content-type", b"application/grpc")]
            trailers = [
                (b"grpc-status", _UNIMPLEMENTED),
                (b"grpc-message", quote(message).encode()),
            ]
            await send(
                {"type": "http.response.start", "status": 200, "headers": start, "trailers": True}
            )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            await send({"type": "http.response.trailers", "headers": trailers})
            return
        await self.app(scope, receive, send)


def _message(port: str, grpc_at: str | None) -> str:
    here = f"This is Lantern's HTTP {port} port"
    if grpc_at:
        return f"{here}; gRPC {port} calls go to {grpc_at}"
    if port in ("inference", "management"):
        return f"{here}; gRPC is not served (enable_grpc is false)"
    return f"{here}; it serves no gRPC"


def _is_grpc(scope: Any) -> bool:
    for key, value in scope["headers"]:
        if key == b"content-type":
            return value.startswith(b"application/grpc")
    return False
