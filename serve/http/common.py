"""What the three HTTP apps share: the server state, JSON answers and the error mapping."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from serve.core.request_ids import new_request_id
from serve.core.version_labels import VersionLabels
from serve.wire import openai as openai_wire
from serve.wire.errors import MethodNotAllowed, NotFound, ServeError, error_body, error_for_status

if TYPE_CHECKING:
    from serve.config import Config
    from serve.core.registry import Registry
    from serve.http.auth import TokenAuth
    from serve.metrics.prometheus import ServerMetrics
    from serve.workflows.manager import Workflows

logger = logging.getLogger(__name__)

# TorchServe sends these on every response (NettyUtils); clients and proxies rely on no caching.
NO_CACHE_HEADERS = {
    "Pragma": "no-cache",
    "Cache-Control": "no-cache; no-store, must-revalidate, private",
    "Expires": "Thu, 01 Jan 1970 00:00:00 UTC",
}


@dataclass
class ServerState:
    """Everything a request handler may need, built once by the server."""

    config: Config
    registry: Registry
    metrics: ServerMetrics
    auth: TokenAuth | None = None
    version: str = "0.1.0"
    starting: bool = True  # until the startup models (or the snapshot) are registered and loaded
    startup_failures: list[str] = field(default_factory=list)  # startup models never registered
    workflows: Workflows | None = None  # the workflow API's state (serve/workflows/)
    labels: VersionLabels = field(default_factory=VersionLabels)  # TF Serving's version labels


def request_id(request: Request) -> str:
    """The id for this request: the client's ``x-request-id`` if it sent one, else a new UUID."""
    rid = request.scope.get("lantern.request_id")
    if rid is None:
        given = request.headers.get("x-request-id", "")
        rid = given if 0 < len(given) <= 128 and given.isprintable() else new_request_id()
        request.scope["lantern.request_id"] = rid
    return rid


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None, *, indent: int | None = 2
) -> Response:
    body = json.dumps(data, indent=indent) + "\n"
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def error_response(err: ServeError, rid: str | None = None) -> Response:
    headers = {**NO_CACHE_HEADERS, **err.headers}
    if rid:
        headers["x-request-id"] = rid
    return Response(
        error_body(err), status_code=err.status_code, headers=headers, media_type="application/json"
    )


def openai_error_response(err: ServeError, rid: str | None = None) -> Response:
    """``err`` in the OpenAI API's shape (``serve.wire.openai.error_body``)."""
    headers = {**NO_CACHE_HEADERS, **err.headers}
    if rid:
        headers["x-request-id"] = rid
    return Response(
        openai_wire.error_body(err),
        status_code=err.status_code,
        headers=headers,
        media_type="application/json",
    )


async def handle_serve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServeError)
    return error_response(exc, request_id(request))


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err: ServeError = NotFound("Requested resource is not found, please refer to API document.")
    elif exc.status_code == 405:
        err = MethodNotAllowed("Requested method is not allowed, please refer to API document.")
    else:
        err = error_for_status(exc.status_code, str(exc.detail))
    return error_response(err, request_id(request))


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    rid = request_id(request)
    logger.exception("Unhandled error in request %s", rid)
    return error_response(ServeError(f"Internal server error (request id {rid})."), rid)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ServeError: handle_serve_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
