"""Client-supplied text made safe for a line-oriented log: control characters escaped.

A path, model name, version, header or id comes from a client; written raw, ``\\n`` in it forges
a complete log line and ``\\x1b`` sends escape sequences to whoever views the file in a terminal.
`escape_controls` is the one function that writes such text: C0 and C1 controls, DEL and the
Unicode line and paragraph separators become ``\\n``, ``\\r``, ``\\t`` or ``\\xNN`` / ``\\uNNNN``.
Everything else, backslashes included, is kept, so escaping twice changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character written as an escape; one line, always."""
    if _CONTROLS.search(text) is None:  # the usual case: no copy
        return text
    return _CONTROLS.sub(_escape, text)


def is_plain(args: tuple[Any, ...] | Mapping[str, Any]) -> bool:
    """Whether `escape_args` would change nothing: a tuple of numbers, None and exact ``str``
    values without a control. The cheap test every log line passes (one search, no copy)."""
    if type(args) is not tuple or not _PLAIN_TYPES.issuperset(map(type, args)):
        return False
    return _CONTROLS.search("".join([a for a in args if type(a) is str])) is None


def escape_args(args: tuple[Any, ...] | Mapping[str, Any]) -> tuple[Any, ...] | Mapping[str, Any]:
    """A log record's ``args`` with strings escaped; numbers stay numbers (``%d`` needs them),
    and any other value whose text holds a control (an exception's message) becomes that text."""
    if isinstance(args, Mapping):
        return {k: _safe(v) for k, v in args.items()}
    return tuple(_safe(a) for a in args)


def _safe(value: Any) -> Any:
    if isinstance(value, str):
        return escape_controls(value)
    if value is None or isinstance(value, (int, float)):
        return value
    try:
        text = str(value)
    except Exception:  # a broken __str__ is the formatter's to report
        return value
    return escape_controls(text) if _CONTROLS.search(text) else value
