"""KServe v1, TF-Serving-style and Open Inference Protocol v2 routes on the inference port.

Open Inference Protocol v2 (``/v2``): server metadata, liveness, readiness, model metadata and
readiness, ``infer`` with the binary tensor extension and ``explain`` (KServe's explainer route:
the same request, with the ``explain: True`` header a handler's ``explain_handle`` looks for),
each with an optional ``/versions/{v}``. The frontend parses and checks OIP requests into raw
tensors (``serve.wire.oip``) and the worker batches them across requests
(``serve/worker/tensor_path.py``).

KServe v1 / TF Serving (``/v1``): ``GET /v1/models``, ``GET /v1/models/{m}[/versions/{v}]``
(KServe's ``{"name", "ready"}`` merged with TF Serving's ``model_version_status``), and
``POST /v1/models/{m}[/versions/{v}]:predict`` / ``:explain``. The body goes to the worker as it
is: only there are the model's input types known.

Errors under ``/v1`` and ``/v2`` are ``{"error": "..."}`` (both protocols' form) with the status
the rest of the server would use (400 bad input, 404 unknown model/version/route, 503 ...).
"""

from __future__ import annotations

import functools
import json
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route, Router

from serve.core.jobs import BatchItem, ItemResult
from serve.core.model import ModelVersion
from serve.core.offload import INLINE_MAX, run_big, run_sized
from serve.core.triton import output_labels
from serve.core.version_labels import resolve
from serve.http import inputs, ort_server
from serve.http.common import NO_CACHE_HEADERS, ServerState, request_id
from serve.http.inputs import request_timeout
from serve.wire import (
    KSERVE_V1,
    MAX_ELEMENTS_HEADER,
    METADATA,
    OIP,
    OIP_ID_HEADER,
    OUTPUTS_HEADER,
    PARAMETERS_HEADER,
    PROTOCOL_HEADER,
    kserve_v1,
    oip,
    tfserving,
)
from serve.wire.errors import (
    BadRequest,
    MethodNotAllowed,
    NotFound,
    ServeError,
    WorkerError,
    response_too_large,
)
from serve.wire.tensor_params import decode_bundle, is_bundle, tensor_content_type

logger = logging.getLogger(__name__)

SERVER_NAME = "lantern"
# Request headers that describe the HTTP body, not the request: the worker gets tensors instead.
_BODY_HEADERS = frozenset(
    {"content-length", "content-type", "content-encoding", oip.HEADER_LENGTH, "transfer-encoding"}
)


def protocol_routes(state: ServerState) -> list[BaseRoute]:
    """The ``/v1`` and ``/v2`` routes; each tree answers its own errors as ``{"error"}``."""
    from serve.http.triton import triton_routes

    api = _Protocols(state)
    v2 = [
        *triton_routes(state),
        Route("/", api.server_metadata, methods=["GET"]),
        Route("/health/live", api.live, methods=["GET"]),
        Route("/health/ready", api.ready, methods=["GET"]),
    ]
    for prefix in ("/models/{model}", "/models/{model}/versions/{version}"):
        v2 += [
            Route(prefix, api.model_metadata, methods=["GET"]),
            Route(prefix + "/ready", api.model_ready, methods=["GET"]),
            Route(prefix + "/infer", api.infer, methods=["POST"]),
            Route(prefix + "/explain", api.explain, methods=["POST"]),
        ]
    v1 = [
        Route("/models", api.list_models, methods=["GET"]),
        Route("/models/{target}", api.v1_status, methods=["GET"]),
        Route("/models/{target}", api.v1_predict, methods=["POST"]),
        Route("/models/{model}/versions/{target}", api.v1_status, methods=["GET"]),
        Route("/models/{model}/versions/{target}", api.v1_predict, methods=["POST"]),
        # TF Serving's version labels and metadata
        Route("/models/{model}/labels/{target}", api.v1_status, methods=["GET"]),
        Route("/models/{model}/labels/{target}", api.v1_predict, methods=["POST"]),
        Route("/models/{model}/metadata", api.v1_metadata, methods=["GET"]),
        Route("/models/{model}/versions/{version}/metadata", api.v1_metadata, methods=["GET"]),
        Route("/models/{model}/labels/{label}/metadata", api.v1_metadata, methods=["GET"]),
    ]
    return [
        Route("/v2", api.server_metadata, methods=["GET"]),
        Mount("/v2", app=_JsonErrors(Router(v2))),
        Mount("/v1", app=_JsonErrors(Router(v1))),
    ]


# ----- errors ---------------------------------------------------------------------------------


def error_response(err: ServeError, rid: str | None) -> Response:
    headers = {**NO_CACHE_HEADERS, **err.headers}
    if rid:
        headers["x-request-id"] = rid
    return Response(
        oip.error_body(err.message),
        status_code=err.status_code,
        headers=headers,
        media_type="application/json",
    )


def _protocol_errors(method: Callable[[Any, Request], Awaitable[Response]]) -> Any:
    """Answer a ServeError (or a bug) raised by an endpoint as ``{"error": "..."}``."""

    @functools.wraps(method)
    async def wrapped(self: Any, request: Request) -> Response:
        try:
            return await method(self, request)
        except ServeError as err:
            return error_response(err, request_id(request))
        except Exception:
            rid = request_id(request)
            logger.exception("Unhandled error in request %s", rid)
            return error_response(ServeError(f"Internal server error (request id {rid})."), rid)

    return wrapped


class _JsonErrors:
    """ASGI wrapper: the router's own 404/405 answered as ``{"error": "..."}``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except HTTPException as exc:
            if exc.status_code == 405:
                err: ServeError = MethodNotAllowed(f"Method {scope['method']} is not allowed here.")
            elif exc.status_code == 404:
                err = NotFound(f"No such resource: {scope['path']}")
            else:
                raise
            await error_response(err, request_id(Request(scope)))(scope, receive, send)


# ----- request helpers ------------------------------------------------------------------------


async def read_body(request: Request, max_size: int) -> bytes:
    """The request body, decompressed when ``Content-Encoding`` is gzip or deflate."""
    body = await inputs.read_body(request, max_size)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise BadRequest(f"Unsupported Content-Encoding {encoding!r}; use gzip or deflate.")
    # tritonclient's "deflate" is zlib-wrapped (zlib.compress); gzip has its own header.
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        data = inflater.decompress(body, max_size + 1)
    except zlib.error as exc:
        raise BadRequest(f"The {encoding} body could not be decompressed: {exc}") from None
    if len(data) > max_size or inflater.unconsumed_tail:
        raise inputs.too_large(max_size)
    if not inflater.eof:
        raise BadRequest(f"The {encoding} body could not be decompressed: it is truncated.")
    return data


def _forward_headers(request: Request, kind: str) -> dict[str, str]:
    """Client headers for the handler, minus body framing and anything posing as ours."""
    headers = {
        k: v
        for k, v in request.headers.items()
        if k not in _BODY_HEADERS and not k.startswith("x-lantern-")
    }
    headers[PROTOCOL_HEADER] = kind
    return headers


def _timeout(request: Request, timeout_us: int | None = None) -> float | None:
    limits = []
    value = request_timeout(request)
    if value is not None:
        limits.append(value)
    if timeout_us:
        limits.append(timeout_us / 1e6)
    return min(limits) if limits else None


def model_state(model: ModelVersion) -> tuple[str, str]:
    """TF Serving's state for a version (``AVAILABLE``, ``LOADING``, or ``END`` for a version
    that failed or has no worker), and an error message when it has one."""
    if model.ready_workers() > 0:
        return "AVAILABLE", ""
    error = model.load_error()
    if error is not None:
        return "END", error
    return ("LOADING" if any(not w.retiring for w in model.workers()) else "END"), ""


class _Protocols:
    """The endpoints; one instance per server."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry

    # ----- OIP: health and metadata --------------------------------------------------------

    @_protocol_errors
    async def server_metadata(self, request: Request) -> Response:
        return _json(
            {"name": SERVER_NAME, "version": self.state.version, "extensions": oip.EXTENSIONS}
        )

    @_protocol_errors
    async def live(self, request: Request) -> Response:
        return _json({"live": True})

    @_protocol_errors
    async def ready(self, request: Request) -> Response:
        ready = self.registry.is_healthy()
        return _json({"ready": ready}, 200 if ready else 503)

    @_protocol_errors
    async def model_ready(self, request: Request) -> Response:
        path = request.path_params
        model = self.registry.get(path["model"], path.get("version"))
        ready = model.ready_workers() > 0
        return _json({"name": model.name, "ready": ready}, 200 if ready else 503)

    @_protocol_errors
    async def model_metadata(self, request: Request) -> Response:
        path = request.path_params
        model = self.registry.get(path["model"], path.get("version"))
        metadata = await self.metadata(model, request_id(request))
        return _json(
            {
                "name": model.name,
                "versions": [mv.version for mv in self.registry.versions(model.name)],
                "platform": metadata.get("platform", ""),
                "inputs": metadata.get("inputs", []),
                "outputs": metadata.get("outputs", []),
            }
        )

    async def metadata(self, model: ModelVersion, rid: str) -> dict[str, Any]:
        return await model_metadata(model, rid)

    # ----- OIP: inference ------------------------------------------------------------------

    @_protocol_errors
    async def infer(self, request: Request) -> Response:
        return await self._infer(request, explain=False)

    @_protocol_errors
    async def explain(self, request: Request) -> Response:
        return await self._infer(request, explain=True)

    async def _infer(self, request: Request, explain: bool) -> Response:
        rid = request_id(request)
        path = request.path_params
        name, version = path["model"], path.get("version")
        self.registry.get(name, version)  # an unknown model is a 404 before the body is read

        async def answer() -> Response:
            body = await read_body(request, self.state.config.max_request_size)
            length = oip.header_length(request.headers.get(oip.HEADER_LENGTH), len(body))
            limit = self.state.config.max_request_elements
            if length is None:  # all JSON: a big one is decoded in a process of its own
                if len(body) > INLINE_MAX:  # a small one is parsed at once, as fast
                    oip.refuse_declared(body, limit)  # 413 from the shapes, before any parse
                infer = await run_big(len(body), oip.parse_request, body, None, limit)
            else:  # a JSON header and raw tensors, sliced from the body (not copied)
                infer = await run_sized(len(body), oip.parse_request, body, length, limit)
            headers = _forward_headers(request, OIP)
            if explain:
                headers["explain"] = "True"
            timeout = _timeout(request, infer.timeout_us)
            # Look again: the default version may have moved (a swap) while the body was read.
            model = self.registry.get(name, version)
            tensors = await run_oip(model, rid, headers, infer, timeout)
            payload, extra = await run_sized(
                sum(len(t.raw) for t in tensors),
                oip.build_response,
                infer,
                model.name,
                model.version,
                tensors,
                output_labels(model),
            )
            self._check_size(payload)
            headers = {**NO_CACHE_HEADERS, **extra, "x-request-id": rid}
            return Response(payload, 200, headers=headers)

        return await self._counted(name, version, rid, answer)

    async def _counted(
        self, name: str, version: str | None, rid: str, answer: Callable[[], Awaitable[Response]]
    ) -> Response:
        """``answer()``, a ServeError it raises answered as ``{"error"}``; counted either way."""
        started = time.perf_counter()
        status = 500
        try:
            response = await answer()
            status = response.status_code
            return response
        except ServeError as err:
            status = err.status_code
            return error_response(err, rid)
        finally:
            self.state.metrics.request_done(
                name, version or "default", status, time.perf_counter() - started
            )

    def _check_size(self, body: bytes) -> None:
        limit = self.state.config.max_response_size
        if len(body) > limit:
            raise response_too_large(limit)

    # ----- KServe v1 / TF Serving ----------------------------------------------------------

    @_protocol_errors
    async def list_models(self, request: Request) -> Response:
        return _json({"models": sorted(self.registry.models)})

    def _v1_model(self, request: Request, name: str, target: str | None) -> ModelVersion:
        """The version a ``/v1`` path names: ``/versions/{v}`` (0: the default version, as OVMS)
        or TF Serving's ``/labels/{l}``."""
        by_label = "/labels/" in request.url.path
        _label(request, name, target)
        return resolve(
            self.registry,
            self.state.labels,
            name,
            None if by_label else target,
            target if by_label else None,
        )

    @_protocol_errors
    async def v1_status(self, request: Request) -> Response:
        path = request.path_params
        target, action = kserve_v1.split_target(path["target"])
        if action is not None:
            raise MethodNotAllowed(f"Use POST for :{action}.")
        if "model" in path and target == "0" and "/versions/" in request.url.path:
            _label(request, path["model"], None)  # OVMS: version 0 is every version's status
            models = self.registry.versions(path["model"])
        elif "model" in path:
            models = [self._v1_model(request, path["model"], target)]
        else:
            _label(request, target, None)
            models = self.registry.versions(target)
        states = [(m.version, *model_state(m)) for m in models]
        return _json(kserve_v1.status_body(models[0].name, states))

    @_protocol_errors
    async def v1_metadata(self, request: Request) -> Response:
        path = request.path_params
        target = path.get("version") or path.get("label")
        if "label" in path:
            _label(request, path["model"], target)
            model = resolve(self.registry, self.state.labels, path["model"], None, target)
        else:
            model = self._v1_model(request, path["model"], target)
        metadata = await self.metadata(model, request_id(request))
        return _json(tfserving.metadata_body(model.name, model.version, metadata))

    @_protocol_errors
    async def v1_predict(self, request: Request) -> Response:
        rid = request_id(request)
        path = request.path_params
        target, action = kserve_v1.split_target(path["target"])
        if action not in (*kserve_v1.ACTIONS, *EXAMPLE_ACTIONS):
            what = f"':{action}'" if action else "no ':predict' or ':explain'"
            raise NotFound(
                f"Unsupported request {what}; use :predict, :classify, :regress or :explain."
            )
        name, version = (path["model"], target) if "model" in path else (target, None)
        # ONNX Runtime Server's predict shares this route (serve/http/ort_server.py).
        ort_route = action == "predict" and "/versions/" in request.url.path
        # An unknown model or version is a 404 before the body is read.
        try:
            if version:
                version = self._v1_model(request, name, version).version
            else:
                _label(request, name, None)
                self.registry.get(name)
        except ServeError as err:
            if ort_route and ort_server.is_protobuf(request):
                return ort_server.error_response(request, rid, err)
            raise

        async def answer() -> Response:
            body = await read_body(request, self.state.config.max_request_size)
            if ort_route and (
                ort_server.is_protobuf(request)
                or await run_sized(len(body), ort_server.is_ort_json, body)
            ):
                model = self.registry.get(name, version)
                headers = _forward_headers(request, OIP)
                timeout = _timeout(request)
                return await ort_server.predict(
                    request, rid, model, body, headers, timeout, run_oip
                )
            if action in EXAMPLE_ACTIONS:
                model = self.registry.get(name, version)
                headers = _forward_headers(request, OIP)
                data = await run_examples(model, rid, headers, body, action, _timeout(request))
                return Response(
                    data,
                    200,
                    headers={**NO_CACHE_HEADERS, "x-request-id": rid},
                    media_type="application/json",
                )
            headers = _forward_headers(request, KSERVE_V1)
            headers[MAX_ELEMENTS_HEADER] = str(self.state.config.max_request_elements)
            if action == "explain":
                headers["explain"] = "True"
            item = BatchItem(rid, headers, [("body", "application/json", body)])
            model = self.registry.get(name, version)  # the default may have moved meanwhile
            result = await model.submit(item, _timeout(request))
            self._check_size(result.body)
            return Response(
                result.body,
                result.status,
                headers={**NO_CACHE_HEADERS, "x-request-id": rid},
                media_type="application/json",
            )

        return await self._counted(name, version, rid, answer)


async def model_metadata(model: ModelVersion, rid: str) -> dict[str, Any]:
    """The model's input/output metadata, asked of a worker once and kept (HTTP and gRPC)."""
    if model.protocol_metadata is not None:
        return model.protocol_metadata
    item = BatchItem(rid, {PROTOCOL_HEADER: METADATA}, [])
    try:
        result = await model.submit(item)
    except ServeError:
        declared = model.source.model_config.get("metadata")
        if isinstance(declared, dict):  # no worker to ask: what the archive declares
            return declared
        raise
    metadata = json.loads(result.body)
    model.protocol_metadata = metadata
    return metadata


async def run_oip(
    model: ModelVersion,
    rid: str,
    headers: dict[str, str],
    infer: oip.InferRequest,
    timeout: float | None,
) -> list[Any]:
    """Submit a parsed OIP request (HTTP or gRPC) to ``model``; its output tensors.

    ``headers`` are the client's, with ``PROTOCOL_HEADER`` set to ``OIP``.
    """
    result = await model.submit(oip_item(rid, headers, infer), timeout)
    return _tensors(result)


EXAMPLE_ACTIONS = ("classify", "regress")


async def run_examples(
    model: ModelVersion,
    rid: str,
    headers: dict[str, str],
    body: bytes,
    action: str,
    timeout: float | None,
) -> bytes:
    """A TF Serving REST ``:classify`` or ``:regress``: its examples as the model's input
    tensors (``serve.wire.tfserving``), and TF Serving's ``{"result": ...}`` answer."""
    signature, examples, context = await run_sized(len(body), tfserving.parse_examples, body)
    tfserving.check_signature(signature)
    tensors = tfserving.examples_to_tensors(examples, context)
    infer = oip.InferRequest(None, {}, tensors, None, True, None)
    answered = await run_oip(model, rid, headers, infer, timeout)
    if action == "classify":
        result: Any = [
            [[label, score] for label, score in row]
            for row in tfserving.classifications(answered, len(examples))
        ]
    else:
        result = tfserving.regressions(answered, len(examples))
    return json.dumps({"result": result}, separators=(",", ":")).encode()


def oip_item(rid: str, headers: dict[str, str], infer: oip.InferRequest) -> BatchItem:
    """A parsed OIP request as the batch item a worker gets: its input tensors, and the outputs
    and parameters it asks for in ``headers`` (which it adds to)."""
    if infer.outputs is not None:
        headers[OUTPUTS_HEADER] = json.dumps(infer.output_names)
    if infer.parameters:
        headers[PARAMETERS_HEADER] = json.dumps(infer.parameters)
    if infer.id:
        headers[OIP_ID_HEADER] = infer.id
    params: list[tuple[str, str | None, bytes]] = [
        (t.name, tensor_content_type(t.datatype, t.shape), bytes(t.raw)) for t in infer.inputs
    ]
    return BatchItem(rid, headers, params)


def _label(request: Request, name: str, version: str | None) -> None:
    """Name the model in the path parameters, where the access log looks for it."""
    params = request.scope.setdefault("path_params", {})
    params["model"] = name
    if version:
        params["version"] = version


def _tensors(result: ItemResult) -> list[Any]:
    if not is_bundle(result.content_type):
        raise WorkerError("The worker did not answer with tensors.")
    return decode_bundle(result.body, result.content_type or "")


def _json(data: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(data, separators=(",", ":")),
        status_code=status,
        headers=NO_CACHE_HEADERS,
        media_type="application/json",
    )
