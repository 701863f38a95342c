"""Per-file packing progress on stderr, shown only to a person at a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

# Below this a file packs in well under a second; reporting it would only be noise.
MIN_REPORTED_SIZE = 16 * 1024 * 1024
_MIN_INTERVAL = 0.2  # seconds between redraws
_MIB = 1024 * 1024


class Progress:
    """Draws ``packing NAME: NN% (x/y MiB)`` for large files when the stream is a TTY."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        try:
            self.enabled = self._stream.isatty()
        except (AttributeError, ValueError):  # closed or file-like without isatty
            self.enabled = False
        self._label = ""
        self._total = 0
        self._done = 0
        self._active = False
        self._last = 0.0

    def start(self, label: str, total: int) -> None:
        """Begin a file of ``total`` bytes; nothing is drawn for small files."""
        self._label, self._total, self._done = label, total, 0
        self._active = self.enabled and total >= MIN_REPORTED_SIZE
        self._last = 0.0
        if self._active:
            self._draw()

    def advance(self, nbytes: int) -> None:
        """Record ``nbytes`` more of the current file."""
        self._done += nbytes
        if self._active and time.monotonic() - self._last >= _MIN_INTERVAL:
            self._draw()

    def finish(self) -> None:
        """End the current file's line."""
        if self._active:
            self._done = self._total
            self._draw()
            self._stream.write("\n")
            self._stream.flush()
            self._active = False

    def _draw(self) -> None:
        self._last = time.monotonic()
        percent = 100 * self._done // max(self._total, 1)
        self._stream.write(
            f"\rpacking {self._label}: {percent:3d}% "
            f"({self._done / _MIB:.0f}/{self._total / _MIB:.0f} MiB)"
        )
        self._stream.flush()
