"""The inference API (port 8080): ``/ping``, ``/predictions`` and ``/explanations``."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from serve.core.jobs import BatchItem, ItemResult, abandoned_if_left, answer_parts
from serve.http.common import (
    EXCEPTION_HANDLERS,
    NO_CACHE_HEADERS,
    ServerState,
    error_response,
    handle_unexpected,
    json_response,
    request_id,
)
from serve.http.inputs import read_params, request_timeout
from serve.http.openapi import inference_description
from serve.wire.errors import ServeError, response_too_large

logger = logging.getLogger(__name__)


def create_inference_app(
    state: ServerState, extra_routes: list[BaseRoute] | None = None
) -> InferenceApp:
    """The inference app; protocol modules add their routes through ``extra_routes``."""

    def healthy() -> bool:
        # Unhealthy while startup models load, and for good if one could not even be registered.
        return not state.starting and not state.startup_failures and state.registry.is_healthy()

    async def ping(request: Request) -> Response:
        ok = healthy()
        return json_response({"status": "Healthy" if ok else "Unhealthy"}, 200 if ok else 500)

    async def health(request: Request) -> Response:
        """vLLM's (and TGI's) ``GET /health``, which LLM tools check first: an empty 200 when
        /ping would say Healthy, else 503."""
        return Response(status_code=200 if healthy() else 503)

    async def version(request: Request) -> Response:
        """vLLM's ``GET /version``: the server's version."""
        return json_response({"version": state.version})

    async def describe_api(request: Request) -> Response:
        generative = state.config.enable_openai_api
        return json_response(inference_description(state.version, generative=generative))

    async def predict(request: Request) -> Response:
        return await _infer(request, explain=False)

    async def explain(request: Request) -> Response:
        return await _infer(request, explain=True)

    async def _infer(request: Request, *, explain: bool) -> Response:
        rid = request_id(request)
        path = request.path_params
        name, version = path["model"], path.get("version")
        started = time.perf_counter()
        try:
            model = state.registry.get(name, version)
        except ServeError as err:
            return error_response(err, rid)  # no metric labels for names nobody registered
        status = 500
        model_version = version or "default"
        try:
            params = await read_params(request, state.config.max_request_size)
            # x-lantern-* headers are ours (protocol requests to workers); clients cannot set them.
            headers = _forwarded_headers(request.scope["headers"])
            if path.get("rest"):
                headers["url_path"] = path["rest"]
            if explain:
                headers["explain"] = "True"
            item = BatchItem(rid, headers, params)
            # Look again: the default version may have changed while the body was read.
            model = state.registry.get(name, version)
            result = await model.submit(item, request_timeout(request))
            status = result.status
            return _result_response(result, rid, state.config.max_response_size)
        except ServeError as err:
            status = err.status_code
            return error_response(err, rid)
        finally:
            state.metrics.request_done(name, model_version, status, time.perf_counter() - started)

    routes: list[BaseRoute] = [
        Route("/ping", ping, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/", describe_api, methods=["OPTIONS"]),
        Route("/api-description", describe_api, methods=["GET"]),
    ]
    for prefix, endpoint in (("/predictions", predict), ("/explanations", explain)):
        routes += [
            Route(prefix + "/{model}", endpoint, methods=["POST", "PUT"]),
            Route(prefix + "/{model}/{version}", endpoint, methods=["POST", "PUT"]),
            Route(prefix + "/{model}/{version}/{rest:path}", endpoint, methods=["POST", "PUT"]),
        ]
    routes += [Route("/predictions/{model}", describe_api, methods=["OPTIONS"])]
    routes += workflow_predict_routes(state)
    routes += extra_routes or []
    return InferenceApp(Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS), _infer)


# POST/PUT /predictions|explanations/{model}[/{version}[/{rest:path}]], as the routes above match
# them: a path they would not match (a trailing slash, an empty segment) falls through to Starlette.
_INFER_PATH = re.compile(r"/(predictions|explanations)/([^/]+)(?:/([^/]+)(?:/(.*))?)?")


class InferenceApp:
    """The Starlette app with the prediction routes taken straight to their endpoint.

    A prediction skips Starlette's two middlewares, its scan of every route's regex and its
    request/response wrappers: a tenth of the frontend's CPU per request on uvicorn (see
    ``docs/performance.md``). Every other request, and any prediction path that Starlette would
    treat differently, goes through Starlette unchanged.
    """

    def __init__(self, app: Starlette, infer: Callable[..., Awaitable[Response]]) -> None:
        self.app = app
        self._infer = infer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in ("POST", "PUT")
            and not scope.get("root_path")
            and (match := _INFER_PATH.fullmatch(scope["path"])) is not None
        ):
            kind, model, version, rest = match.groups()
            params = {"model": model}
            if version is not None:
                params["version"] = version
                if rest is not None:
                    params["rest"] = rest
            scope["path_params"] = params  # where Starlette puts them; the access log reads them
            request = Request(scope, receive, send)
            try:
                response = await self._infer(request, explain=kind == "explanations")
            except ClientDisconnect:
                return  # nobody to answer
            except Exception as exc:  # what Starlette's ServerErrorMiddleware would answer
                response = await handle_unexpected(request, exc)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _forwarded_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request's headers as the worker sees them, straight from the ASGI scope (no
    intermediate `Headers`); names arrive lower-cased. The last of repeated names wins."""
    return {
        k.decode("latin-1"): v.decode("latin-1") for k, v in raw if not k.startswith(b"x-lantern-")
    }


def _result_response(result: ItemResult, rid: str, max_size: int) -> Response:
    if len(result.body) > max_size:
        if result.abandon is not None:
            result.abandon()  # a stream's first part: the rest is not wanted
        return error_response(response_too_large(max_size), rid)
    if result.stream is not None:
        return _streaming_response(result, rid, max_size)
    headers = {**NO_CACHE_HEADERS, **result.headers, "x-request-id": rid}
    # Raw bytes with no type from the handler go without a Content-Type, as in TorchServe.
    media_type = result.content_type
    return Response(result.body, status_code=result.status, headers=headers, media_type=media_type)


def _streaming_response(first: ItemResult, rid: str, max_size: int) -> Response:
    """A handler that calls ``send_intermediate_predict_response``: chunked transfer, as TorchServe.

    The status is the first chunk's; an error after it (the worker died, the request was cut, a
    part over ``max_size``, which TorchServe also holds each part to) is logged and sent as the
    last chunk, `stream_error_chunk`, before the chunked body ends.
    """
    assert first.stream is not None

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for part in answer_parts(first):
                if len(part.body) > max_size:
                    if first.abandon is not None:
                        first.abandon()
                    raise response_too_large(max_size)
                yield part.body
        except ServeError as err:
            logger.error("Request %s failed mid-stream: %s", rid, err.message)
            yield stream_error_chunk(err)

    headers = {**NO_CACHE_HEADERS, **first.headers, "x-request-id": rid}
    media_type = first.content_type  # none for raw bytes, as in TorchServe
    body = abandoned_if_left(first, chunks())  # the client left: free its slot
    return StreamingResponse(body, status_code=first.status, headers=headers, media_type=media_type)


def stream_error_chunk(err: ServeError) -> bytes:
    """The last chunk of a stream that failed after its first part: TorchServe's error object
    (``{"code", "type", "message"}``) as one line of compact JSON, on a line of its own.

    TorchServe 0.12 defines no error part for a broken stream (its frontend closes the
    connection); a client reading lines or JSON objects tells this one by its ``code``."""
    return b"\n" + json.dumps(err.to_dict(), separators=(",", ":")).encode() + b"\n"


# ----- workflows ----------------------------------------------------------------------------------


def workflow_predict_routes(state: ServerState) -> list[BaseRoute]:
    """``/wfpredict/{workflow}``: the workflow's DAG for one request (TorchServe's route).

    The answer is the leaf node's bytes as ``application/json`` (TorchServe sends that type
    whatever the bytes are), or a JSON object of the leaves' outputs when there are several.
    """

    async def wfpredict(request: Request) -> Response:
        rid = request_id(request)
        assert state.workflows is not None, "the server sets up the workflows"
        workflows = state.workflows
        try:
            workflows.get(request.path_params["workflow"])
            params = await read_params(request, state.config.max_request_size)
            headers = {k: v for k, v in request.headers.items() if not k.startswith("x-lantern-")}
            body = await workflows.predict(request.path_params["workflow"], params, headers, rid)
        except ServeError as err:
            return error_response(err, rid)
        headers = {**NO_CACHE_HEADERS, "x-request-id": rid}
        return Response(body, headers=headers, media_type="application/json")

    return [Route("/wfpredict/{workflow}", wfpredict, methods=["POST", "PUT"])]
