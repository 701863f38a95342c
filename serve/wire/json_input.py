"""JSON request bodies parsed with one set of answers: 400 for malformed and for too deep.

``json.loads`` raises ``RecursionError`` (not ``ValueError``) for nesting deeper than the
interpreter's recursion limit, e.g. ``[[[[...]]]]`` 100,000 deep; unanswered, that was a 500.
"""

from __future__ import annotations

import json
from typing import Any

from serve.wire.errors import BadRequest

TOO_DEEP = "is nested too deeply"


def parse_json(data: bytes | str, what: str = "the request JSON") -> Any:
    """``data`` parsed; raises `BadRequest` naming ``what`` if it is malformed or too deep."""
    try:
        return json.loads(data)
    except RecursionError:
        raise BadRequest(f"{what} {TOO_DEEP}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"failed to parse {what}: {exc}") from None
