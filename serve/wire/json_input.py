"""JSON request bodies parsed with one set of answers: 400 for malformed and for too deep.

``json.loads`` raises ``RecursionError`` (not ``ValueError``) for nesting deeper than the
interpreter's recursion limit, e.g. ``[[[[...]]]]`` 100,000 deep; unanswered, that was a 500.
"""

from __future__ import annotations

import json
import re
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


# ----- bounding lists before parsing ------------------------------------------------------------

PRESCAN_TOKENS = 200_000  # structural tokens read at most (~0.1 s; a string is one token)
ListBounds = dict[tuple[str, ...], int]  # a list's key path from the document's object -> its bound
# A string (its closing quote in group 1: none when the body ends inside it) or a bracket, a
# comma or a colon. Numbers and literals are not tokens: a list of them costs a token an item.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(")?|[\[\]{},:]')


def long_list(body: bytes | memoryview, bounds: ListBounds) -> tuple[str, ...] | None:
    """The key path of a list in ``body`` that holds more items than ``bounds`` allows it, found
    without parsing: by its commas, reading up to `PRESCAN_TOKENS` tokens (a bounded list is
    left as soon as it passes its bound, so a list of millions of ids costs its bound).

    Only lists reached through objects from the document's top-level object are bounded (key
    paths such as ``("parameters", "stop")``). None when no such list was found over its bound
    in what was read; the caller checks the parsed document too (`check_lists`), as a key
    spelled with escapes is not recognised here. A malformed body may be reported where the full
    parse would refuse it anyway.
    """
    # For each open container: whether an object, its key path (None off the object chain),
    # the bound of a bounded list (0 for none) and the commas counted in it.
    open_: list[list[Any]] = []
    deepest = max((len(path) for path in bounds), default=0)  # no path is followed further
    key = ""  # the last object key read (a string just before a colon)
    candidate = ""
    previous = b""
    for count, match in enumerate(_TOKEN.finditer(bytes(body))):
        if count >= PRESCAN_TOKENS:
            return None
        token = match.group()
        first = token[:1]
        if first == b'"':
            if match.group(1) is None:
                return None  # the body ends inside a string: nothing after is certain
            candidate = token[1:-1].decode("utf-8", "replace")
        elif first == b":":
            key = candidate
        elif first in b"[{":
            path: tuple[str, ...] | None = None
            if not open_:
                path = ()
            elif open_[-1][0] and open_[-1][1] is not None and previous == b":":
                path = (*open_[-1][1], key) if len(open_[-1][1]) < deepest else None
            bound = bounds.get(path, 0) if first == b"[" and path is not None else 0
            open_.append([first == b"{", path, bound, 0])
        elif first in b"]}":
            if not open_:
                return None
            open_.pop()
        elif first == b"," and open_:
            top = open_[-1]
            if top[2]:
                top[3] += 1
                if top[3] >= top[2]:  # bound + 1 items at least
                    return tuple(top[1])
        previous = first
    return None


def check_lists(doc: Any, bounds: ListBounds) -> tuple[str, ...] | None:
    """The key path of a list in the parsed ``doc`` longer than ``bounds`` allows, or None."""
    for path, bound in bounds.items():
        value = doc
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        if isinstance(value, list) and len(value) > bound:
            return path
    return None
