"""What a client may see of an internal error: one line, no file paths, no traceback.

Handler exceptions, TorchScript errors and archive problems often carry tracebacks and absolute
paths of the machine that built or serves the model. The full text goes to the log; clients get
`client_message` of it.
"""

from __future__ import annotations

import re

MAX_MESSAGE = 300

# An absolute POSIX path of two or more parts (``/a/b``, ``/tmp/x.py``), a ``file://`` URL, or a
# Windows path (``C:\\x\\y``). A lone ``/`` or ``/v2`` (a route) is left alone.
_PART = r"[^\s/'\"`:,;()<>\[\]{}]"
_POSIX_PATH = re.compile(rf"(?<![\w.~:/-])(?:file://)?/(?:{_PART}+/)+({_PART}*)")
_WINDOWS_PATH = re.compile(r"\b[A-Za-z]:\\(?:[^\s\\'\"`:,;()<>]+\\)*([^\s\\'\"`:,;()<>]*)")
_TRACEBACK = re.compile(r"^\s*(Traceback|File \"|at |  File )", re.MULTILINE)


def strip_paths(text: str) -> str:
    """Every absolute path in ``text`` cut down to its last part (``/srv/m/x.pt`` -> ``x.pt``)."""
    text = _POSIX_PATH.sub(lambda m: m.group(1) or "<path>", text)
    return _WINDOWS_PATH.sub(lambda m: m.group(1) or "<path>", text)


def one_line(text: str) -> str:
    """The line of ``text`` that says what went wrong.

    A text holding a traceback (Python's or TorchScript's) ends with the error itself, so its
    last line is taken; otherwise the first non-empty line.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if _TRACEBACK.search(text) else lines[0]


def client_message(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as a client may see it: one line, paths stripped, at most ``limit`` characters."""
    line = strip_paths(one_line(text))
    return line if len(line) <= limit else line[: limit - 3] + "..."
