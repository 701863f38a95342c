"""Large request bodies from the frontend to a worker through one shared-memory arena per worker.

Why: a 1–16 MB body streamed through the worker's Unix socket costs many partial writes,
event-loop wakeups and two kernel copies; through the arena it costs one copy in (the frontend)
and one copy out (the worker, into the ``bytearray`` a handler expects). Bodies under the
threshold (``worker_shm_threshold_kb``) stay inline.

* The frontend creates the arena when it starts a worker: an anonymous ``memfd`` (no name in
  ``/dev/shm``, nothing to unlink, freed by the kernel with its last descriptor or mapping, so a
  crash of either side leaks nothing; not capped by a container's ``/dev/shm``), sized with
  ``ftruncate`` (sparse: a page exists once touched), mapped read-write here, then sealed so that
  it can neither shrink (which would SIGBUS the frontend) nor grow, nor be written by anyone who
  maps it later (``F_SEAL_FUTURE_WRITE``, Linux 5.1+).
* The descriptor goes to the worker once, right after it connects, as ``SCM_RIGHTS`` on a fixed
  marker (`send_arena` / `receive_arena`); the worker maps it read-only and closes it.
* `BumpAllocator` hands out space per batch (its ``seq``); a batch's space is freed when its final
  RESULT arrives, and with the whole arena when the worker dies. A payload that does not fit goes
  inline: never an error.
* The PREDICT frame names the payloads that live in the arena (`serve.wire.frames.move_to_shared`,
  `serve.wire.frames.resolve_shared`, which checks every reference against the arena's size).

Where memfd is missing (not Linux) or any step fails, workers get no arena and every payload goes
inline.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import socket
from typing import Any

from serve.wire.frames import ProtocolError

logger = logging.getLogger(__name__)

# The one message that carries the arena's descriptor, sent before any frame.
MARKER = b"LANTERN-ARENA\x00\x00\x00"
ALIGN = 64  # each payload starts on a cache line
_MFD_NOEXEC_SEAL = 0x0008  # Linux 6.3+: also sealed against exec (silences a kernel warning)
_F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
_logged: set[bool] = set()  # which of the two messages below this process has logged


class BumpAllocator:
    """Space in an arena of ``size`` bytes, handed out from a moving offset, owned per batch.

    The offset returns to 0 whenever nothing is allocated, so with one batch at a time (a worker
    runs one) the pages in use stay at the peak of the bytes in flight, not the whole arena.
    Space is never reused while anything is allocated: a request that does not fit gets None.
    """

    def __init__(self, size: int, align: int = ALIGN) -> None:
        self.size = size
        self._align = align
        self._top = 0
        self._held: dict[int, int] = {}  # owner -> bytes allocated

    @property
    def top(self) -> int:
        """The next free offset (0 when nothing is allocated)."""
        return self._top

    @property
    def in_use(self) -> int:
        """Bytes allocated now."""
        return sum(self._held.values())

    def alloc(self, owner: int, length: int) -> int | None:
        """The offset of ``length`` bytes for ``owner``, or None if they do not fit."""
        if length < 0:
            raise ValueError("a negative length")
        start = self._top
        if start + length > self.size:
            return None
        self._top = -(-(start + length) // self._align) * self._align
        self._held[owner] = self._held.get(owner, 0) + length
        return start

    def free(self, owner: int) -> None:
        """Free everything ``owner`` holds (nothing if it holds nothing)."""
        self._held.pop(owner, None)
        if not self._held:
            self._top = 0


class Arena:
    """The frontend's side of one worker's arena: a sealed memfd, mapped read-write here."""

    def __init__(self, fd: int, size: int, view: mmap.mmap) -> None:
        self.fd: int | None = fd  # until sent to the worker
        self.size = size
        self._map: mmap.mmap | None = view
        self.allocator = BumpAllocator(size)
        self.placed = 0  # payloads that went through the arena
        self.inline = 0  # payloads at or above the threshold that did not fit: sent inline

    @classmethod
    def create(cls, size: int, name: str = "lantern-arena") -> Arena | None:
        """A new sealed arena of ``size`` bytes, or None where that is not possible (logged)."""
        if size <= 0:
            return None
        if not hasattr(os, "memfd_create"):
            _log_unavailable("os.memfd_create is not available on this platform")
            return None
        fd = -1
        view = None
        try:
            fd = _memfd(name[:200])
            os.ftruncate(fd, size)
            view = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            try:  # after our own writable mapping: F_SEAL_WRITE would refuse it (EBUSY)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _F_SEAL_FUTURE_WRITE)
            except OSError:  # Linux < 5.1: the worker could write to it, never shrink it
                _log_unavailable("F_SEAL_FUTURE_WRITE is not supported (Linux < 5.1)", fatal=False)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)
        except (OSError, ValueError) as exc:
            if view is not None:
                view.close()
            if fd >= 0:
                os.close(fd)
            _log_unavailable(f"creating a {size}-byte memfd arena failed: {exc}")
            return None
        return cls(fd, size, view)

    @property
    def closed(self) -> bool:
        return self._map is None

    def place(self, owner: int, data: Any) -> int | None:
        """Copy ``data`` (bytes-like) into the arena for batch ``owner``; its offset, or None
        (then it goes inline)."""
        if self._map is None:
            return None
        length = len(data) if isinstance(data, bytes | bytearray) else memoryview(data).nbytes
        offset = self.allocator.alloc(owner, length)
        if offset is None:
            self.inline += 1
            return None
        self._map[offset : offset + length] = data
        self.placed += 1
        return offset

    def release(self, owner: int) -> None:
        """Batch ``owner`` is answered (or failed): its space is free again."""
        self.allocator.free(owner)

    def close_fd(self) -> None:
        """Close our descriptor (once the worker has its own): the mapping stays."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Unmap it; the kernel frees the memory once the worker's mapping is gone too."""
        self.close_fd()
        view, self._map = self._map, None
        if view is not None:
            view.close()


def send_arena(sock: Any, fd: int) -> None:
    """Send the arena's descriptor on a connected Unix socket (``sock``: anything with
    ``fileno()``, e.g. an asyncio transport's), before any frame."""
    dup = socket.socket(fileno=os.dup(sock.fileno()))
    try:  # 16 bytes on a fresh socket: a full buffer (BlockingIOError) would be a broken peer
        socket.send_fds(dup, [MARKER], [fd])
    finally:
        dup.close()


def receive_arena(sock: socket.socket, size: int) -> mmap.mmap:
    """The worker's side: receive the marker and descriptor, map it read-only, close it.

    Raises `ProtocolError` if what arrives is not the marker with exactly one descriptor of an
    arena of ``size`` bytes.
    """
    flags = socket.MSG_WAITALL | getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    msg, fds, _, _ = socket.recv_fds(sock, len(MARKER), 1, flags)
    try:
        if msg != MARKER or len(fds) != 1:
            raise ProtocolError("expected the shared-memory arena's descriptor first")
        actual = os.fstat(fds[0]).st_size
        if actual != size:
            raise ProtocolError(f"the arena has {actual} bytes, {size} expected")
        return mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        for fd in fds:
            os.close(fd)


class WorkerArena:
    """The worker's side: its read-only mapping of the arena."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self._map = mapping
        self.view = memoryview(mapping)

    def drop_pages(self, refs: list[list[int]]) -> None:
        """Unmap the pages of payloads already copied out (``[index, offset, length]`` each, as
        checked by `serve.wire.frames.resolve_shared`) from this process, not from the arena.

        They stay in the arena for the frontend; here they would count in the worker's resident
        set (its ``worker_max_rss_mb`` recycling, memory admission) until the worker exits. The
        next read maps them again, many pages per fault."""
        end = max((offset + length for _, offset, length in refs), default=0)
        if end and hasattr(mmap, "MADV_DONTNEED"):
            with contextlib.suppress(OSError, ValueError):
                self._map.madvise(mmap.MADV_DONTNEED, 0, min(_round_up(end), len(self._map)))


def _round_up(n: int) -> int:
    return -(-n // mmap.PAGESIZE) * mmap.PAGESIZE


def _memfd(name: str) -> int:
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        return os.memfd_create(name, flags | _MFD_NOEXEC_SEAL)
    except OSError:  # a kernel before 6.3 refuses the flag (EINVAL)
        return os.memfd_create(name, flags)


def _log_unavailable(reason: str, fatal: bool = True) -> None:
    """Once per process each: request bodies go inline (``fatal``), or arenas are less sealed."""
    if fatal in _logged:
        return
    _logged.add(fatal)
    if fatal:
        logger.info("Shared-memory request bodies are off (%s): bodies go inline", reason)
    else:
        logger.info("Shared-memory arenas: %s", reason)
