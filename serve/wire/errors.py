"""The server's error hierarchy and the one place that turns errors into HTTP answers.

    ServeError (500)
      BadRequest (400)
        InvalidInput (400)          a handler rejected its input
        InvalidModelUrl (400)       a model URL that may not be fetched
      Unauthorized (401)            missing, wrong or expired token
      Forbidden (403)               e.g. unregistering the default version while others exist
      NotFound (404)
        ModelNotFound (404)
        ModelVersionNotFound (404)
      MethodNotAllowed (405)
      RequestTimeout (408)
      Conflict (409)                the model version is registered already
      PayloadTooLarge (413)
      TooManyRequests (429)         the model's queue is full
      ServiceUnavailable (503)
        NoHealthyWorkers (503)
        ShuttingDown (503)
      GatewayTimeout (504)          the request's deadline passed
      WorkerError (500)             the handler raised
        WorkerDied (500)            the worker process died with the request on it
      InsufficientResources (507)   out of memory in the worker
        InsufficientMemory (507)    admission: no memory for the workers asked for

Every error is answered as ``{"code": int, "type": str, "message": str}``, TorchServe's shape.
"""

from __future__ import annotations

import json
from typing import Any


class ServeError(Exception):
    """Base of every error the server answers with; carries its HTTP status."""

    status_code = 500
    error_type = "InternalServerException"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.status_code, "type": self.error_type, "message": self.message}


class BadRequest(ServeError):
    status_code = 400
    error_type = "BadRequestException"


class InvalidInput(BadRequest):
    error_type = "InvalidInput"


class InvalidModelUrl(BadRequest):
    error_type = "InvalidModelUrl"


class Unauthorized(ServeError):
    status_code = 401
    error_type = "InvalidKeyException"


class Forbidden(ServeError):
    status_code = 403
    error_type = "InvalidModelVersionException"


class NotFound(ServeError):
    status_code = 404
    error_type = "ResourceNotFoundException"


class ModelNotFound(NotFound):
    error_type = "ModelNotFoundException"


class ModelVersionNotFound(NotFound):
    error_type = "ModelVersionNotFoundException"


class MethodNotAllowed(ServeError):
    status_code = 405
    error_type = "MethodNotAllowedException"


class RequestTimeout(ServeError):
    status_code = 408
    error_type = "RequestTimeoutException"


class ClientClosedRequest(ServeError):
    """The client went away before its answer was ready (nginx's 499): counted, never sent."""

    status_code = 499
    error_type = "ClientClosedRequest"


class Conflict(ServeError):
    status_code = 409
    error_type = "ConflictStatusException"


class PayloadTooLarge(ServeError):
    status_code = 413
    error_type = "PayloadTooLarge"


class TooManyRequests(ServeError):
    status_code = 429
    error_type = "TooManyRequests"


class ServiceUnavailable(ServeError):
    status_code = 503
    error_type = "ServiceUnavailableException"


class NoHealthyWorkers(ServiceUnavailable):
    error_type = "NoHealthyWorkers"


class ShuttingDown(ServiceUnavailable):
    error_type = "ShuttingDown"


class GatewayTimeout(ServeError):
    status_code = 504
    error_type = "RequestTimeout"


class WorkerError(ServeError):
    error_type = "InternalServerException"


class WorkerDied(WorkerError):
    error_type = "WorkerDied"


class InsufficientResources(ServeError):
    status_code = 507
    error_type = "OutOfResources"


class InsufficientMemory(InsufficientResources):
    """Workers refused before they start: the host has no memory for them (core/admission.py)."""

    error_type = "InsufficientMemory"


_BY_STATUS: dict[int, type[ServeError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    413: PayloadTooLarge,
    429: TooManyRequests,
    503: ServiceUnavailable,
    504: GatewayTimeout,
    507: InsufficientResources,
}


def error_for_status(status: int, message: str, error_type: str | None = None) -> ServeError:
    """An error of the class that answers ``status``; ``error_type`` overrides its type name."""
    cls = _BY_STATUS.get(status, ServeError)
    err = cls(message)
    if cls is ServeError or cls.status_code != status:
        err.status_code = status
    if error_type:
        err.error_type = error_type
    return err


def response_too_large(limit: int) -> ServeError:
    """What every route answers for a model's answer over ``max_response_size`` (``limit``)."""
    return ServeError(f"The model's response exceeds max_response_size of {limit} bytes.")


def error_body(err: ServeError) -> bytes:
    return (json.dumps(err.to_dict(), indent=2) + "\n").encode()
