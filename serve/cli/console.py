"""A detached server's ``console.log``, capped: its stdout and stderr go through a pipe to a
thread that writes the file and rotates it at a size, like the other logs.

Whatever reaches file descriptors 1 and 2 (tracebacks at exit, C libraries, a stray ``print``) is
kept; none of it can grow the disk without bound. Each descriptor has one owner that closes it
once: the pipe's read end is the copying thread's (no event loop watches it), its write end lives
on only as 1 and 2, and the saved originals are closed once put back.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from pathlib import Path
from typing import BinaryIO

from serve.logs import rotate_files

_CHUNK = 64 * 1024


class RotatingConsole:
    """Copy a pipe into ``path``, rotating at ``max_bytes`` with ``backup_count`` old copies."""

    def __init__(self, path: Path, max_bytes: int, backup_count: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        self._read, self._write = os.pipe()
        self._thread = threading.Thread(target=self._copy, name="console-log", daemon=True)

    def capture(self) -> None:
        """Point fds 1 and 2 at the pipe and start copying; undone at interpreter exit."""
        saved = (os.dup(1), os.dup(2))
        os.dup2(self._write, 1)
        os.dup2(self._write, 2)
        os.close(self._write)
        self._thread.start()

        def restore() -> None:
            os.dup2(saved[0], 1)  # closes the last write end: the thread sees EOF and finishes
            os.dup2(saved[1], 2)
            for fd in saved:  # 1 and 2 are copies of them now
                os.close(fd)
            self._thread.join(5)

        atexit.register(restore)

    def _copy(self) -> None:
        out = None
        try:
            while data := os.read(self._read, _CHUNK):
                try:
                    out = self._write_out(out, data)
                except OSError:  # disk full, folder gone: drop it, but keep draining the pipe
                    if out is not None:  # (a pipe nobody reads would block every stderr write)
                        with contextlib.suppress(OSError):
                            out.close()
                    out = None
        finally:
            if out is not None:
                out.close()
            os.close(self._read)

    def _write_out(self, out: BinaryIO | None, data: bytes) -> BinaryIO:
        if out is None:
            out = open(self.path, "ab")
        if self.max_bytes > 0 and out.tell() and out.tell() + len(data) > self.max_bytes:
            out.close()
            rotate_files(self.path, self.backup_count)
            out = open(self.path, "ab")
        out.write(data)
        out.flush()
        return out


def capture_console(path: Path, max_bytes: int, backup_count: int) -> None:
    """Send this process's stdout and stderr to ``path``, rotated at ``max_bytes`` (0: never)."""
    RotatingConsole(path, max_bytes, backup_count).capture()
