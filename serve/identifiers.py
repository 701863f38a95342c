"""Bounds on the identifiers a client names (models, versions, sequence ids) and how a message
shows them.

An identifier comes from a client and is echoed in error messages: a 3 MB model name made the
gRPC error's trailers too large (the client saw RESOURCE_EXHAUSTED, not NOT_FOUND). So a message
shows at most `SHOWN` characters of one (`shown`, cut with an ellipsis), and an absurd one is
refused (`check_length`): model names and versions past `MAX_NAME` characters, sequence ids past
`MAX_SEQUENCE_ID`. TorchServe's own ids (``ts-seq-<uuid>``) are 43 characters; names of 80 and
more are served.
"""

from __future__ import annotations

from serve.wire.errors import BadRequest

MAX_NAME = 1024  # characters of a model name or version
MAX_SEQUENCE_ID = 256  # characters of a sequence id
SHOWN = 100  # characters of an identifier a message shows


def shown(text: str, limit: int = SHOWN) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis when it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_length(value: str, what: str, most: int) -> None:
    """Raise `BadRequest` when ``value`` (a ``what``: "model name", ...) is over ``most``."""
    if len(value) > most:
        raise BadRequest(
            f"The {what} {shown(value, 40)!r} is {len(value)} characters long; "
            f"at most {most} are allowed."
        )
