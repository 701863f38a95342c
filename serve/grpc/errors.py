"""The gRPC status for each server error, beside the HTTP one in ``serve/wire/errors.py``.

TorchServe's table (``GRPCUtils.getGRPCStatusCode``) where it is consistent; where TorchServe
answers differently by call (INTERNAL for an unknown model on ``Predictions``, UNKNOWN for a
duplicate registration) the code here is the one its own table gives the HTTP status
(``docs/migrating-from-torchserve.md`` lists these). Kept free of ``grpc`` imports: codes are
the names of ``grpc.StatusCode`` members, so the table stays a pure, testable mapping.
"""

from __future__ import annotations

from serve.wire.errors import ServeError

# HTTP status -> grpc.StatusCode member name (TorchServe's GRPCUtils, plus the statuses it lacks).
_BY_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "PERMISSION_DENIED",  # the model API is off: TorchServe's "Model API disabled"
    408: "DEADLINE_EXCEEDED",
    409: "ALREADY_EXISTS",  # TorchServe's table says ABORTED, its register answers UNKNOWN
    413: "RESOURCE_EXHAUSTED",
    416: "OUT_OF_RANGE",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
    507: "RESOURCE_EXHAUSTED",
}


def grpc_code_name(http_status: int) -> str:
    """The ``grpc.StatusCode`` member name for an HTTP status, as TorchServe maps them."""
    if http_status in _BY_STATUS:
        return _BY_STATUS[http_status]
    if 200 <= http_status < 300:
        return "OK"
    if 400 <= http_status < 500:
        return "FAILED_PRECONDITION"
    if 500 <= http_status < 600:
        return "INTERNAL"
    return "UNKNOWN"


def grpc_code_for(err: ServeError) -> str:
    """The ``grpc.StatusCode`` member name that answers ``err``: its own ``grpc_code`` where a
    protocol names one (TF Serving's FAILED_PRECONDITION for an unknown signature), else the
    HTTP status's."""
    own = getattr(err, "grpc_code", None)
    return own if isinstance(own, str) else grpc_code_name(err.status_code)
