"""Errors a handler or the handler runtime can raise, and what the worker should make of them."""

from __future__ import annotations


class PredictionException(Exception):
    """Raised by a handler to fail a request with a chosen HTTP status (TorchServe's contract)."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        self.message = message
        self.error_code = error_code
        super().__init__(message)

    def __str__(self) -> str:
        # Same text as ts.utils.util.PredictionException, which some handlers log or parse.
        return f"{self.message} : {self.error_code}"


class HandlerLoadError(RuntimeError):
    """The handler module, its entry point or the model it loads could not be set up."""


class InvalidHandlerOutput(RuntimeError):
    """A handler returned something that is not one result per request of the batch."""


class UnsupportedOutputType(InvalidHandlerOutput):
    """A handler result that cannot be serialised (not bytes, str, tensor or JSON-able)."""
