"""What every gRPC method shares: request ids, headers, deadlines, errors, access log, metrics.

A method is written as ``async def method(call: Call, request) -> response`` (or an async
generator for a server stream) and raises `ServeError` for failures; `unary` and `server_stream`
turn it into a ``grpc.aio`` handler that answers the error with its gRPC status
(``serve/grpc/errors.py``), logs one access line (``protocol=grpc``) and counts the response in
the server metrics, as the HTTP access log does.

Requests are decoded by `decoder`, not by grpc: a message that is not valid protobuf is answered
INVALID_ARGUMENT after the token check (grpc itself would answer UNKNOWN and log a traceback per
call), and logged in one line, at most once per `MALFORMED_LOG_INTERVAL` seconds per method.
An error's text is cut to `MAX_DETAILS` characters: it travels in the trailers, which have the
``max_header_size`` bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from serve.grpc.errors import grpc_code_for
from serve.identifiers import MAX_NAME, check_length, shown
from serve.logs import ACCESS_LOGGER
from serve.metrics.prometheus import ServerMetrics
from serve.wire.errors import BadRequest, Forbidden, ServeError, Unauthorized

if TYPE_CHECKING:
    from serve.http.auth import TokenAuth

logger = logging.getLogger(__name__)
access_logger = logging.getLogger(ACCESS_LOGGER)

_FORMAT = '%s "gRPC %s" %s %.2fms model=%s version=%s request_id=%s protocol=grpc'
# Metadata that is gRPC's own, not the client's: never handed to a handler as a header.
_TRANSPORT = ("grpc-", ":", "x-lantern-")
MAX_DETAILS = 2000  # characters of an error's text sent to the client
MALFORMED_LOG_INTERVAL = 10.0  # seconds between log lines about undecodable requests


@dataclass(frozen=True)
class Undecodable:
    """What `decoder` hands the method when the bytes are not a ``message`` protobuf."""

    message: str
    reason: str


def decoder(message_type: Any) -> Callable[[bytes], Any]:
    """A request deserializer for grpc that never raises: `Undecodable` stands for bad bytes."""
    name = message_type.DESCRIPTOR.full_name

    def decode(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception as exc:  # google.protobuf.message.DecodeError, or worse
            return Undecodable(name, f"{type(exc).__name__}: {exc}")

    return decode


class _Throttled:
    """Says "malformed request" once per interval per method, with how many went unsaid."""

    def __init__(self, interval: float = MALFORMED_LOG_INTERVAL) -> None:
        self.interval = interval
        self._last: dict[str, tuple[float, int]] = {}  # method -> (last logged, unsaid since)

    def warn(self, method: str, peer: str, bad: Undecodable) -> None:
        now = time.monotonic()
        last, unsaid = self._last.get(method, (-self.interval, 0))
        if now - last < self.interval:
            self._last[method] = (last, unsaid + 1)
            return
        self._last[method] = (now, 0)
        more = f" ({unsaid} more since the last line)" if unsaid else ""
        logger.warning(
            "Malformed gRPC request on %s from %s: not a %s (%s)%s",
            method,
            peer,
            bad.message,
            shown(bad.reason, 200),
            more,
        )


_malformed = _Throttled()


@dataclass
class Call:
    """One RPC in progress: its context, request id and what the access log will say."""

    context: grpc.aio.ServicerContext
    method: str
    request_id: str
    metadata: dict[str, str]
    peer: str = "-"  # read at the start: grpcio's peer() on a cancelled call can crash the process
    model: str | None = None
    version: str | None = None
    http_status: int = 200  # what HTTP would have answered; counts Requests2XX/4XX/5XX
    started: float = field(default_factory=time.perf_counter)

    def headers(self) -> dict[str, str]:
        """The client's metadata as request headers for the handler (text keys only)."""
        return {
            k: v
            for k, v in self.metadata.items()
            if not k.endswith("-bin") and not k.startswith(_TRANSPORT)
        }

    def timeout(self) -> float | None:
        """Seconds left before the client's deadline: the request's deadline, as for HTTP."""
        remaining = self.context.time_remaining()
        return max(remaining, 0.0) if remaining is not None else None

    def label(self, model: str, version: str | None) -> None:
        """Name the call's model for the access log; absurdly long names are refused."""
        self.model, self.version = shown(model), shown(version) if version else version
        check_length(model, "model name", MAX_NAME)  # refused: the access log shows it cut
        check_length(version or "", "model version", MAX_NAME)
        self.model, self.version = model, version


# A unary method's implementation: the call and the decoded request in, the response out.
UnaryFn = Callable[[Call, Any], Awaitable[Any]]


def _start(context: grpc.aio.ServicerContext, method: str) -> Call:
    """The call's metadata and request id; the id goes back in the trailers, as HTTP's header."""
    metadata: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            metadata[key] = value
    given = metadata.get("x-request-id", "")
    rid = given if 0 < len(given) <= 128 and given.isprintable() else str(uuid.uuid4())
    context.set_trailing_metadata((("x-request-id", rid),))
    return Call(context, method, rid, metadata, context.peer() or "-")


def _decoded(call: Call, request: Any) -> Any:
    """``request`` as decoded by `decoder`; `Undecodable` is a 400 (INVALID_ARGUMENT)."""
    if isinstance(request, Undecodable):
        _malformed.warn(call.method, call.peer, request)
        raise BadRequest(f"The request is not a valid {request.message} message.")
    return request


class Methods:
    """Wraps service methods with token auth, error handling, access log and metrics.

    With ``auth``, each call needs ``authorization: Bearer <key>`` with the ``kind`` key
    (``inference`` or ``management``), checked on every call; a missing or wrong one is
    PERMISSION_DENIED, as in TorchServe.
    """

    def __init__(
        self, metrics: ServerMetrics | None, auth: TokenAuth | None = None, kind: str = ""
    ) -> None:
        self.metrics = metrics
        self.auth = auth
        self.kind = kind

    def _authorize(self, call: Call) -> None:
        if self.auth is not None:
            given = call.metadata.get("authorization", "").encode("latin-1", errors="replace")
            try:
                self.auth.check(self.kind, {b"authorization": given})
            except Unauthorized as err:
                raise Forbidden(err.message) from None

    def unary(self, method: str, fn: UnaryFn) -> Any:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = _start(context, method)
            async with self._answered(call):
                return await fn(call, _decoded(call, request))

        return handler

    def server_stream(self, method: str, fn: Callable[[Call, Any], AsyncIterator[Any]]) -> Any:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            call = _start(context, method)
            async with self._answered(call):
                async for response in fn(call, _decoded(call, request)):
                    yield response

        return handler

    @contextlib.asynccontextmanager
    async def _answered(self, call: Call) -> AsyncIterator[None]:
        """Around a method's body: authorise the call, end a failure with its gRPC status, and
        log and count the call once, however it ends."""
        code = "OK"
        try:
            self._authorize(call)
            yield
        except ServeError as err:
            code = grpc_code_for(err)
            await self._abort(call, err)
        except asyncio.CancelledError:
            code, call.http_status = "CANCELLED", 499
            raise
        except Exception:
            code = "INTERNAL"
            await self._abort(call, self._unexpected(call))
        finally:
            self._done(call, code)

    def stream_stream(
        self, method: str, fn: Callable[[Call, AsyncIterator[Any]], AsyncIterator[Any]]
    ) -> Any:
        """A bidirectional stream: ``fn`` answers its per-request errors in band itself; the
        call's own errors, auth and accounting are a server stream's. An undecodable message
        ends the stream with INVALID_ARGUMENT."""

        def checked(call: Call, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async def decoded() -> AsyncIterator[Any]:
                async for request in requests:
                    yield _decoded(call, request)

            return fn(call, decoded())

        return self.server_stream(method, checked)

    def _unexpected(self, call: Call) -> ServeError:
        logger.exception("Unhandled error in gRPC request %s", call.request_id)
        return ServeError(f"Internal server error (request id {call.request_id}).")

    async def _abort(self, call: Call, err: ServeError) -> None:
        """End the call with ``err``'s status; raises ``grpc.aio.AbortError``, as abort does."""
        call.http_status = err.status_code
        code = getattr(grpc.StatusCode, grpc_code_for(err))
        await call.context.abort(code, shown(err.message, MAX_DETAILS))

    def _done(self, call: Call, code: str) -> None:
        seconds = time.perf_counter() - call.started
        if self.metrics is not None:
            self.metrics.response_sent(call.http_status)
        if not access_logger.isEnabledFor(logging.INFO):
            return
        peer = call.peer
        ms = seconds * 1000.0
        record = access_logger.makeRecord(
            ACCESS_LOGGER,
            logging.INFO,
            "",
            0,
            _FORMAT,
            (peer, call.method, code, ms, call.model or "-", call.version or "-", call.request_id),
            None,
        )
        record.__dict__.update(
            client=peer,
            method="gRPC",
            path=call.method,
            status=code,
            latency_ms=round(ms, 3),
            model=call.model,
            version=call.version,
            request_id=call.request_id,
            protocol="grpc",
        )
        access_logger.handle(record)
