"""Token authorisation at the ASGI edge: a request without its port's key is answered 401.

Health, readiness and API-description routes are open (`is_open`). ``GET /token?type=...`` on the
management port takes the ``API`` key and answers the rotated key itself. Refusals go through
`serve.http.edge.answer_error`, like every other answer given before the app runs: the request
id, and the body the route family answers with (``{"error"}`` under the inference port's ``/v1``
and ``/v2``, TorchServe's ``{"code", "type", "message"}`` elsewhere).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs

from serve.http.auth import TokenAuth
from serve.http.common import json_response
from serve.http.edge import answer_error
from serve.wire.errors import MethodNotAllowed, ServeError

# Health, readiness, the version and API descriptions answer without a token (TorchServe
# guards /ping; vLLM leaves /health and /version open).
_OPEN_PATHS = re.compile(
    r"^/(ping|health|version|api-description|v2/health/(live|ready)"
    r"|v2/models/[^/]+(/versions/[^/]+)?/ready"
    r"|v2/?)$"
)
# KServe v1 model readiness (GET /v1/models/{m}); `m:predict` and friends are POSTs and guarded.
_READINESS = re.compile(r"^/v1/models/[^/:]+(:ready)?$")


# Triton's repository extension on the inference port: loading and unloading are management.
_REPOSITORY_CHANGE = re.compile(r"^/v2/repository/models/[^/]+/(load|unload)$")


def is_open(method: str, path: str) -> bool:
    """Whether ``method path`` answers without a token."""
    if _OPEN_PATHS.match(path) or (method == "OPTIONS" and path == "/"):
        return True
    return method in ("GET", "HEAD") and _READINESS.match(path) is not None


class TokenGuard:
    """ASGI middleware: every HTTP request but the open ones needs ``kind``'s key.

    ``kind`` is ``inference`` or ``management``, the port it guards; the inference port's
    ``/v1`` and ``/v2`` routes are the KServe v1 and Open Inference Protocol ones.
    """

    def __init__(self, app: Any, auth: TokenAuth, kind: str) -> None:
        self.app = app
        self.auth = auth
        self.kind = kind

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or is_open(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        try:
            if self.kind == "management" and scope["path"] == "/token":
                self.auth.check("API", headers)
                if scope["method"] != "GET":
                    raise MethodNotAllowed(
                        "Requested method is not allowed, please refer to API document."
                    )
                rotated = self.auth.rotate(_query_type(scope))
                await json_response(rotated)(scope, receive, send)
                return
            kind = self.kind
            if kind == "inference" and _REPOSITORY_CHANGE.match(scope["path"]):
                kind = "management"  # Triton's load/unload change models: the management key
            self.auth.check(kind, headers)
        except ServeError as err:
            await answer_error(scope, send, err, protocols=self.kind == "inference", close=False)
            return
        await self.app(scope, receive, send)


def _query_type(scope: Any) -> str:
    return parse_qs(scope.get("query_string", b"").decode()).get("type", [""])[0]
