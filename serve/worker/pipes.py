"""Event-loop transports over a child's pipes that own their descriptor and close it once.

``loop.connect_read_pipe`` / ``connect_write_pipe`` under uvloop (0.23, MagicStack/uvloop#763)
give the same descriptor number two owners: libuv (``uv_pipe_open`` over ``pipe.fileno()``,
closed by ``uv_close``) and the file object (closed by the transport right after, or by its
finalizer before). The second ``close`` of that number lands on whatever reused it meanwhile,
a socket or pipe of another thread or of libuv itself; in the frontend that meant workers' Unix
sockets refused with EEXIST, ``Popen`` failing with EBADF and aborts in ``epoll_ctl``
(docs/faults.md). The transports here watch the descriptor with ``add_reader``/``add_writer``
(which never take ownership, on any loop), stop watching it before they close it, and close it
exactly once, through the file object that owns it.
"""

from __future__ import annotations

import asyncio
import os
from typing import IO

_CHUNK = 1 << 16  # bytes read per readiness event, asyncio's pipe transports' size
_HIGH_WATER = 1 << 16  # unsent bytes above which the writer asks its protocol to pause


class PipeReader(asyncio.ReadTransport):
    """Feeds ``reader`` from ``pipe`` (a file object whose descriptor it now owns) until EOF."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], reader: asyncio.StreamReader
    ) -> None:
        super().__init__({"pipe": pipe})
        self._loop = loop
        self._pipe: IO[bytes] | None = pipe
        self._fd = pipe.fileno()
        self._reader = reader
        self._paused = False
        os.set_blocking(self._fd, False)
        reader.set_transport(self)
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, _CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._reader.set_exception(exc)
            self.close()
            return
        if data:
            self._reader.feed_data(data)
        else:
            self._reader.feed_eof()
            self.close()

    def is_reading(self) -> bool:
        return self._pipe is not None and not self._paused

    def pause_reading(self) -> None:
        if self.is_reading():
            self._loop.remove_reader(self._fd)
            self._paused = True

    def resume_reading(self) -> None:
        if self._pipe is not None and self._paused:
            self._paused = False
            self._loop.add_reader(self._fd, self._readable)

    def is_closing(self) -> bool:
        return self._pipe is None

    def close(self) -> None:
        """Stop watching the descriptor, then close it (the only close it gets)."""
        pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        if not self._paused:
            self._loop.remove_reader(self._fd)
        pipe.close()


class PipeWriter(asyncio.WriteTransport):
    """Writes to ``pipe`` (a file object whose descriptor it now owns) without blocking; tells
    ``protocol`` (e.g. ``asyncio.streams.FlowControlMixin``) to pause above 64 KiB unsent."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], protocol: asyncio.BaseProtocol
    ) -> None:
        super().__init__({"pipe": pipe})
        self._loop = loop
        self._pipe: IO[bytes] | None = pipe
        self._fd = pipe.fileno()
        self._protocol = protocol
        self._buffer = bytearray()
        self._closing = False
        self._paused = False
        os.set_blocking(self._fd, False)
        protocol.connection_made(self)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        if not self._buffer:
            try:
                sent = os.write(self._fd, data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:  # EPIPE: the child is gone
                self._finish(exc)
                return
            data = memoryview(data)[sent:]
            if not data:
                return
            self._loop.add_writer(self._fd, self._writable)
        self._buffer += data
        if not self._paused and len(self._buffer) > _HIGH_WATER:
            self._paused = True
            self._protocol.pause_writing()

    def _writable(self) -> None:
        try:
            sent = os.write(self._fd, self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._finish(exc)
            return
        del self._buffer[:sent]
        if self._buffer:
            return
        self._loop.remove_writer(self._fd)
        if self._paused:
            self._paused = False
            self._protocol.resume_writing()
        if self._closing:
            self._finish(None)

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close once what is buffered has been written (the reader then sees EOF)."""
        if self._closing:
            return
        self._closing = True
        if not self._buffer:
            self._finish(None)

    def abort(self) -> None:
        self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        pipe, self._pipe = self._pipe, None
        self._closing = True
        if pipe is None:
            return
        if self._buffer:
            self._buffer.clear()
            self._loop.remove_writer(self._fd)
        pipe.close()  # the only close: nothing else watches or owns this descriptor
        self._loop.call_soon(self._protocol.connection_lost, exc)
