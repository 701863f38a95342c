"""Errors a handler or the handler runtime can raise, and what the worker should make of them."""

from __future__ import annotations

import logging


class PredictionException(Exception):
    """Raised by a handler to fail a request with a chosen HTTP status (TorchServe's contract)."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        self.message = message
        self.error_code = error_code
        super().__init__(message)

    def __str__(self) -> str:
        # Same text as ts.utils.util.PredictionException, which some handlers log or parse.
        return f"{self.message} : {self.error_code}"


class TensorError(Exception):
    """The tensor fast path (`handlers.tensor_models`) cannot run a request or use a model's
    outputs. It carries the HTTP status and error type the client is answered with, the shape of
    the server's own errors (``serve.wire.errors``), which handlers do not raise."""

    status_code = 500
    error_type = "InternalServerException"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidTensorInput(TensorError):
    """A request's tensors do not fit the model's inputs (names, types, shapes, values)."""

    status_code = 400
    error_type = "BadRequestException"


class HandlerLoadError(RuntimeError):
    """The handler module, its entry point or the model it loads could not be set up."""


class InvalidHandlerOutput(RuntimeError):
    """A handler returned something that is not one result per request of the batch."""


class UnsupportedOutputType(InvalidHandlerOutput):
    """A handler result that cannot be serialised (not bytes, str, tensor or JSON-able)."""


def report_failure(
    exc: BaseException, request_ids: list[str], logger: logging.Logger
) -> tuple[int, str, str]:
    """Log a handler failure once (traceback and request ids) and say how to answer it.

    Returns ``(status, type, message)``: a `PredictionException` keeps its code and message;
    out-of-memory is 507; anything else is a 500 named after the exception type.
    """
    if isinstance(exc, PredictionException):
        code, kind = int(exc.error_code or 500), "PredictionException"
    elif isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        code, kind = 507, "OutOfResources"
    else:
        code, kind = 500, type(exc).__name__
    logger.error(
        "Handler raised %s for request(s) %s",
        kind,
        ", ".join(request_ids),
        exc_info=exc,
        extra={"request_ids": request_ids},
    )
    # PredictionException's str() is "msg : code" (TorchServe); clients get the message alone.
    message = str(getattr(exc, "message", None) or exc) or kind
    if kind != "PredictionException":
        message = f"{kind}: {message}"
    return code, kind, message
