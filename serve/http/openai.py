"""The OpenAI-compatible routes on the inference port (``/v1/...`` and ``/openai/v1/...``).

A codec at the edge like the KServe v1 and OIP routes (``serve.http.protocols``): each request is
checked (``serve.wire.openai``), sent down the one registry -> dispatcher -> worker path as the
JSON body the ``text_generation`` handler reads, and its answer turned into OpenAI's shape;
``"stream": true`` answers server-sent events from the handler's intermediate parts.

``GET /v1/models`` and ``GET /v1/models/{m}`` are KServe v1's routes too: they answer OpenAI's
shape when the request comes from an OpenAI SDK (``X-Stainless-Lang``), KServe's otherwise;
``/openai/v1/models`` is always OpenAI's (docs/llm.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Scope

from serve.core.jobs import BatchItem, ItemResult, abandoned_if_left, answer_parts
from serve.core.model import ModelVersion
from serve.core.offload import run_big
from serve.http.common import NO_CACHE_HEADERS, ServerState, openai_error_response, request_id
from serve.http.inputs import read_body, request_timeout
from serve.wire import oip
from serve.wire import openai as oai
from serve.wire.errors import (
    ClientClosedRequest,
    ServeError,
    error_for_status,
    response_too_large,
)

logger = logging.getLogger(__name__)

# Request headers that describe the HTTP body, not the request.
_BODY_HEADERS = frozenset(
    {"content-length", "content-type", "content-encoding", "transfer-encoding"}
)
# The handler's marker for an embeddings request (its url_path, as on TorchServe's vLLM paths).
EMBEDDINGS_PATH = "v1/embeddings"


class _OpenAIClientRoute(Route):
    """A route that matches only requests from an OpenAI SDK, else falls through (to KServe's)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE and not oai.is_openai_client(scope.get("headers", [])):
            return Match.NONE, {}
        return match, child


def openai_routes(state: ServerState) -> list[BaseRoute]:
    """The routes; mount them before the KServe ``/v1`` tree so that they win where both match."""
    api = _OpenAI(state)
    routes: list[BaseRoute] = []
    for prefix in oai.PREFIXES:
        routes += [
            Route(prefix + "/completions", api.completions, methods=["POST"]),
            Route(prefix + "/chat/completions", api.chat, methods=["POST"]),
            Route(prefix + "/embeddings", api.embeddings, methods=["POST"]),
        ]
    routes += [
        _OpenAIClientRoute("/v1/models", api.list_models, methods=["GET"]),
        _OpenAIClientRoute("/v1/models/{model:path}", api.get_model, methods=["GET"]),
        Route("/openai/v1/models", api.list_models, methods=["GET"]),
        Route("/openai/v1/models/{model:path}", api.get_model, methods=["GET"]),
    ]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(prefix + "/generate", api.generate, methods=["POST"]),
            Route(prefix + "/generate_stream", api.generate, methods=["POST"]),
        ]
    return routes


def _forward_headers(request: Request) -> dict[str, str]:
    return {
        k: v
        for k, v in request.headers.items()
        if k not in _BODY_HEADERS and not k.startswith("x-lantern-")
    }


T = TypeVar("T")


async def _while_connected(request: Request, answer: Awaitable[T]) -> T:
    """``answer`` (a request's submission), given up if the client disconnects first: a whole
    (not streamed) generation would otherwise run to its ``max_tokens`` for nobody. Giving up
    cancels the request's wait, and so the request on its worker (a CANCEL frame); it is
    counted as a 499. (Once a stream has begun, `abandoned_if_left` does the same.)"""
    task = asyncio.ensure_future(answer)

    async def until_disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        task.cancel()

    watcher = asyncio.ensure_future(until_disconnected())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            raise ClientClosedRequest("The client closed the request.") from None
        raise
    finally:
        watcher.cancel()


def _answer(part: ItemResult) -> dict[str, Any] | None:
    """A part's JSON object (None for the empty part a row that does not stream gets)."""
    return _parse_answer(part.status, part.body)


def _parse_answer(status: int, body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body) if body else None
    except (ValueError, RecursionError):
        raise ServeError("The model's answer is not JSON.") from None
    if status >= 400:
        message = data.get("message") if isinstance(data, dict) else None
        raise error_for_status(status, str(message or body.decode(errors="replace")))
    return data if isinstance(data, dict) else None


def _is_final(answer: dict[str, Any]) -> bool:
    return "finish_reason" in answer


async def _final_part(result: ItemResult, limit: int) -> dict[str, Any] | None:
    """The part of an answer that ends it (with ``finish_reason``), None if none does; a part
    over ``limit`` bytes (``max_response_size``) is refused before it is parsed."""
    final = None
    async for part in answer_parts(result):
        _check_size(len(part.body), limit)
        # A whole answer may be megabytes (an echo of a big prompt): parsed off the loop.
        data = await run_big(len(part.body), _parse_answer, part.status, part.body)
        if data is not None and _is_final(data):
            final = data
    return final


class _OpenAI:
    """The endpoints; one instance per server."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, oai.parse_completion)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, oai.parse_chat)

    async def _counted(
        self, request: Request, answer: Callable[[], Awaitable[Response]]
    ) -> Response:
        """``answer()`` with errors in OpenAI's shape; counted in the request metrics once the
        model is known (`_label` names it)."""
        rid = request_id(request)
        started = time.perf_counter()
        status = 500
        try:
            response = await answer()
            status = response.status_code
            return response
        except ServeError as err:
            status = err.status_code
            return openai_error_response(err, rid)
        finally:
            params = request.scope.get("path_params", {})
            if "model" in params:
                elapsed = time.perf_counter() - started
                version = params.get("version") or "default"
                self.state.metrics.request_done(params["model"], version, status, elapsed)

    def _with_chat_length(self, call: oai.GenerationCall, body: bytes) -> bytes:
        """The worker's body, with OpenAI's chat default length where the request gives none:
        the rest of the context (the engine stops there), bounded by ``openai_chat_max_tokens``.
        Completions keep their default of 16 (the handler's)."""
        if not call.chat or "max_tokens" in call.body:
            return body
        mv, _, _ = self._model(call.model)
        model_len = mv.max_model_len() if mv.runs_engine else None
        if model_len is None:
            return body
        longest = min(self.state.config.openai_chat_max_tokens, model_len)
        return json.dumps({**call.body, "max_tokens": longest}).encode()

    def _model(self, model: str) -> tuple[ModelVersion, str, str | None]:
        name, version = oai.split_model(model)
        return self.registry.get(name, version), name, version

    async def _submit(
        self, request: Request, model: str, body: bytes, url_path: str | None = None
    ) -> ItemResult:
        mv, name, version = self._model(model)
        _label(request, name, version)
        headers = _forward_headers(request)
        if url_path:
            headers["url_path"] = url_path
        item = BatchItem(request_id(request), headers, [("body", "application/json", body)])
        return await mv.submit(item, request_timeout(request))

    async def _generate(
        self, request: Request, parse: Callable[[bytes], oai.GenerationCall]
    ) -> Response:
        async def answer() -> Response:
            raw = await read_body(request, self.state.config.max_request_size)
            call, worker_body = await run_big(len(raw), _decode_generation, parse, raw)
            worker_body = self._with_chat_length(call, worker_body)
            submitted = self._submit(request, call.model, worker_body)
            result = await _while_connected(request, submitted)
            cid = oai.new_id("chatcmpl" if call.chat else "cmpl")
            created = int(time.time())
            if call.stream:
                return await self._stream(request, call, cid, created, result)
            final = await _final_part(result, self.state.config.max_response_size)
            if final is None:
                raise oai.not_generative(call.model)
            body = json.dumps(oai.completion_body(call, cid, created, final)).encode()
            _check_size(len(body), self.state.config.max_response_size)
            return _json_bytes(body, request_id(request))

        return await self._counted(request, answer)

    async def _stream(
        self, request: Request, call: oai.GenerationCall, cid: str, created: int, first: ItemResult
    ) -> Response:
        rid = request_id(request)
        parts = answer_parts(first)
        head = _answer(await anext(parts))  # an error before the first part is a plain error
        _check_generated(call.model, first, head)

        async def events() -> AsyncIterator[bytes]:
            completion = 0  # tokens streamed so far (continuous_usage_stats)
            if call.chat:
                running = oai.running_usage({}, completion)
                yield oai.sse(
                    oai.chunk_body(call, cid, created, role=True, text="", running=running)
                )
            data = head
            offset = 0  # the completions API's text_offset: its tokens' text so far
            try:
                while True:
                    if data is not None:
                        completion += len(data.get("tokens") or [])
                        running = oai.running_usage(data, completion)
                        text = data.get("text") or ""
                        logprobs = oai.logprobs_body(call, data.get("logprobs"), offset)
                        if logprobs is not None and not call.chat:
                            offset += sum(len(token) for token in logprobs["tokens"])
                        if _is_final(data):
                            reason = oai.finish_reason(data)
                            running = dict(oai.usage(data))  # the final part: the whole
                            chunk = oai.chunk_body(
                                call,
                                cid,
                                created,
                                text=text,
                                reason=reason,
                                logprobs=logprobs,
                                running=running,
                            )
                            yield oai.sse(chunk)
                            if call.include_usage:
                                usage = oai.usage(data)
                                yield oai.sse(oai.chunk_body(call, cid, created, usage_=usage))
                            break
                        if text or logprobs:
                            chunk = oai.chunk_body(
                                call, cid, created, text=text, logprobs=logprobs, running=running
                            )
                            yield oai.sse(chunk)
                    try:
                        data = _answer(await anext(parts))
                    except StopAsyncIteration:
                        break
            except ServeError as err:  # after the first event only the stream can say it
                logger.error("Request %s failed mid-stream: %s", rid, err.message)
                yield oai.sse(oai.error_dict(err))
            yield oai.SSE_DONE

        headers = {**NO_CACHE_HEADERS, "x-request-id": rid}
        sent = abandoned_if_left(first, events())
        return StreamingResponse(sent, headers=headers, media_type=oai.SSE_MEDIA_TYPE)

    async def embeddings(self, request: Request) -> Response:
        """For models whose model-config.yaml says ``embeddings: true``: the handler gets
        ``{"input": [texts]}`` with ``url_path: v1/embeddings`` and answers one vector per input
        (a JSON list, or ``{"data": [...], "usage": {"prompt_tokens"}}``)."""

        async def answer() -> Response:
            raw = await read_body(request, self.state.config.max_request_size)
            call, body = await run_big(len(raw), _decode_embeddings, raw)
            mv, _, _ = self._model(call.model)
            if not mv.source.model_config.get("embeddings"):
                raise oai.OpenAIError(
                    f"Model {call.model} does not offer embeddings "
                    "(its model-config.yaml does not say 'embeddings: true').",
                    "model",
                )
            result = await self._submit(request, call.model, body, EMBEDDINGS_PATH)
            limit = self.state.config.max_response_size
            _check_size(len(result.body), limit)  # the answer is bigger still: refuse at once
            size = len(result.body)
            answer = await run_big(size, _embeddings_answer, call, result.status, result.body)
            _check_size(len(answer), limit)
            return _json_bytes(answer, request_id(request))

        return await self._counted(request, answer)

    async def generate(self, request: Request) -> Response:
        """OIP's generate extension: ``{"text_output"}``, or SSE events of it (``_stream``);
        errors in the OIP routes' ``{"error": "..."}`` shape."""
        rid = request_id(request)
        name, version = request.path_params["model"], request.path_params.get("version")
        stream = request.url.path.endswith("_stream")
        try:
            raw = await read_body(request, self.state.config.max_request_size)
            body = await run_big(len(raw), _decode_generate, raw, stream)
            model = name if version is None else f"{name}/{version}"
            result = await _while_connected(request, self._submit(request, model, body))
            mv = self.registry.get(name, version)
            if not stream:
                final = await _final_part(result, self.state.config.max_response_size)
                if final is None:
                    raise oai.not_generative(name)
                text = final.get("text", "")
                reason = oai.finish_reason(final)
                answer = json.dumps(oai.generate_body(name, mv.version, text, reason)).encode()
                _check_size(len(answer), self.state.config.max_response_size)
                return _json_bytes(answer, rid)
            parts = answer_parts(result)
            head = _answer(await anext(parts))
            _check_generated(name, result, head)
        except ServeError as err:
            return _oip_error(err, rid)

        async def events() -> AsyncIterator[bytes]:
            data = head
            try:
                while True:
                    if data is not None:
                        reason = oai.finish_reason(data) if _is_final(data) else None
                        text = data.get("text") or ""
                        if text or reason:
                            yield oai.sse(oai.generate_body(name, mv.version, text, reason))
                        if reason:
                            break
                    try:
                        data = _answer(await anext(parts))
                    except StopAsyncIteration:
                        break
            except ServeError as err:
                yield oai.sse({"error": err.message})

        headers = {**NO_CACHE_HEADERS, "x-request-id": rid}
        sent = abandoned_if_left(result, events())
        return StreamingResponse(sent, headers=headers, media_type=oai.SSE_MEDIA_TYPE)

    async def list_models(self, request: Request) -> Response:
        rid = request_id(request)
        models = [self._model_entry(name) for name in sorted(self.registry.models)]
        return _json(oai.models_body(models), rid)

    async def get_model(self, request: Request) -> Response:
        rid = request_id(request)
        try:
            mv, _, _ = self._model(request.path_params["model"])
        except ServeError as err:
            return openai_error_response(err, rid)
        return _json(self._model_entry(request.path_params["model"], mv), rid)

    def _model_entry(self, shown: str, mv: ModelVersion | None = None) -> dict[str, Any]:
        created = getattr(mv, "created_at", None) if mv is not None else None
        return oai.model_body(shown, created)


# Request bodies are read and checked by these, off the event loop (`run_big`: inline when
# small, on a thread, in the decoding process from 512 KiB): a 6 MB body took the loop 0.3-0.9 s.


def _decode_generation(
    parse: Callable[[bytes], oai.GenerationCall], raw: bytes
) -> tuple[oai.GenerationCall, bytes]:
    call = parse(raw)
    return call, call.worker_body()


def _decode_embeddings(raw: bytes) -> tuple[oai.EmbeddingsCall, bytes]:
    call = oai.parse_embeddings(raw)
    return call, json.dumps({"input": call.inputs}).encode()


def _decode_generate(raw: bytes, stream: bool) -> bytes:
    return json.dumps(oai.parse_generate(raw, stream)).encode()


def _check_generated(model: str, first: ItemResult, head: dict[str, Any] | None) -> None:
    """Refuse a stream whose model answered at once (not streamed) with no ``finish_reason``:
    its answer is not generated text (an echo handler, a classifier), and the stream would be
    empty."""
    if first.stream is None and (head is None or not _is_final(head)):
        raise oai.not_generative(model)


def _check_size(size: int, limit: int) -> None:
    """What ``/predictions`` answers for a model's answer over ``max_response_size``."""
    if size > limit:
        raise response_too_large(limit)


def _embeddings_answer(call: oai.EmbeddingsCall, status: int, body: bytes) -> bytes:
    """The embeddings answer's JSON from the handler's (off the loop: it may be megabytes)."""
    vectors, tokens = _vectors(ItemResult(status, body, "application/json"), len(call.inputs))
    return json.dumps(oai.embeddings_body(call, vectors, tokens)).encode()


def _vectors(result: ItemResult, count: int) -> tuple[list[list[float]], int]:
    data = _answer(result)
    if data is None:
        try:
            data = {"data": json.loads(result.body)}
        except ValueError:
            data = {}
    vectors = data.get("data")
    ok = (
        isinstance(vectors, list)
        and len(vectors) == count
        and all(
            isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) for v in vectors
        )
    )
    if not ok:
        raise oai.OpenAIError("This model does not offer embeddings.", "model")
    tokens = (data.get("usage") or {}).get("prompt_tokens", 0)
    return [[float(x) for x in v] for v in vectors], int(tokens)  # type: ignore[union-attr]


def _label(request: Request, name: str, version: str | None) -> None:
    """Name the model in the path parameters, where the access log and `_counted` look."""
    params = request.scope.setdefault("path_params", {})
    params["model"] = name
    if version:
        params["version"] = version


def _oip_error(err: ServeError, rid: str) -> Response:
    headers = {**NO_CACHE_HEADERS, **err.headers, "x-request-id": rid}
    return Response(oip.error_body(err.message), err.status_code, headers, "application/json")


def _json(data: Any, rid: str, status: int = 200) -> Response:
    return _json_bytes(json.dumps(data).encode(), rid, status)


def _json_bytes(body: bytes, rid: str, status: int = 200) -> Response:
    return Response(
        body,
        status_code=status,
        headers={**NO_CACHE_HEADERS, "x-request-id": rid},
        media_type="application/json",
    )
