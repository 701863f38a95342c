"""Sans-IO codec for the frames between the frontend and a worker.

A frame is a fixed header, a table of payload lengths, JSON metadata, then the raw payloads:

    !BIII   type, seq, meta length, payload count
    !Q * n  payload lengths
    meta    UTF-8 JSON object
    payloads

Bytes go in, frames come out; the I/O lives with the callers. No pickle crosses the socket. What
the metadata and payloads of each frame type mean is `serve.wire.messages`.

A PREDICT frame may keep large payloads in the worker's shared-memory arena (`serve.wire.shm`): its
metadata's ``"shm"`` lists ``[index, offset, length]`` for each, and that payload is sent empty
(`move_to_shared`, `resolve_shared`).
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

_HEADER = struct.Struct("!BIII")
_LENGTH = struct.Struct("!Q")
MAX_FRAME_SIZE = 2**31
# One encoder for every frame: ``json.dumps`` with any non-default argument builds a new
# ``JSONEncoder`` per call, a measurable share of the frontend's time per batch.
_encode_meta = json.JSONEncoder(separators=(",", ":")).encode


class MsgType(enum.IntEnum):
    HELLO = 1  # worker → frontend, once connected: {"worker_id", "pid"}
    LOADED = 2  # worker → frontend: the handler is initialised
    LOAD_FAILED = 3  # worker → frontend: {"type", "message"}
    PREDICT = 4  # frontend → worker: one batch
    RESULT = 5  # worker → frontend: one result per batch item
    # 6 is unused: a describe request is a PREDICT whose item has the header ``describe: True``
    # (serve/core/manage.py); the handler's describe_handle answers it like any other request.
    SHUTDOWN = 7  # frontend → worker: finish and exit
    LOG = 8  # reserved
    PARTIAL = 9  # worker → frontend: an intermediate (streamed) chunk for each batch item
    THREADS = 10  # frontend → worker: {"threads": n}, its new intra-op share (core/threads.py)
    CANCEL = 11  # frontend → worker: stop the batch ``seq`` (client gone, deadline passed)
    ENGINE = 12  # worker → frontend: its engine's live counts and new requests' reservations
    # Liveness of a worker that keeps many requests in flight (serve/worker/concurrent.py): the
    # thread that reads its frames answers each PING with a PONG of the same seq at once.
    PING = 13  # frontend → worker
    PONG = 14  # worker → frontend


class ProtocolError(Exception):
    """A frame could not be decoded: a bug or a corrupted stream, never user input."""


@dataclass(frozen=True, slots=True)
class Frame:
    type: MsgType
    seq: int
    meta: dict[str, Any] = field(default_factory=dict)
    payloads: tuple[bytes, ...] = ()


def move_to_shared(frame: Frame, threshold: int, place: Callable[[bytes], int | None]) -> Frame:
    """``frame`` with each payload of at least ``threshold`` bytes that ``place`` takes (it copies
    the payload into the arena and returns its offset, or None: then it stays inline) replaced by
    an empty payload and named in ``meta["shm"]``. The frame itself if none moved."""
    refs: list[list[int]] = []
    payloads = list(frame.payloads)
    for index, payload in enumerate(payloads):
        if len(payload) < threshold:
            continue
        offset = place(payload)
        if offset is not None:
            refs.append([index, offset, len(payload)])
            payloads[index] = b""
    if not refs:
        return frame
    return Frame(frame.type, frame.seq, {**frame.meta, "shm": refs}, tuple(payloads))


def resolve_shared(frame: Frame, arena: memoryview | None) -> Frame:
    """``frame`` with the payloads its ``meta["shm"]`` names copied out of ``arena`` (a read-only
    view of the worker's whole arena) into ``bytearray``s, as inline payloads arrive.

    Every reference is checked first: an index of an empty inline payload, named once, and a range
    inside the arena; anything else (or references without an arena) is a `ProtocolError`.
    """
    refs = frame.meta.get("shm")
    if refs is None:
        return frame
    if arena is None:
        raise ProtocolError("the frame names shared-memory payloads, and this worker has no arena")
    if not isinstance(refs, list):
        raise ProtocolError("malformed frame: its shm references are not a list")
    size = arena.nbytes
    payloads = list(frame.payloads)
    seen: set[int] = set()
    for ref in refs:
        if not (isinstance(ref, list) and len(ref) == 3 and all(type(v) is int for v in ref)):
            raise ProtocolError(f"malformed shm reference: {ref!r}"[:200])
        index, offset, length = ref
        if not 0 <= index < len(payloads) or index in seen or len(payloads[index]):
            raise ProtocolError(f"shm reference to payload {index} of {len(payloads)}")
        if offset < 0 or length < 0 or offset + length > size:
            raise ProtocolError(
                f"shm reference to bytes {offset}..{offset + length} of a {size}-byte arena"
            )
        seen.add(index)
    for index, offset, length in refs:
        payloads[index] = bytearray(arena[offset : offset + length])
    meta = {k: v for k, v in frame.meta.items() if k != "shm"}
    return Frame(frame.type, frame.seq, meta, tuple(payloads))


def encode(frame: Frame) -> list[bytes]:
    """The frame as a list of byte strings, ready for ``writelines``/``sendmsg``."""
    meta = _encode_meta(frame.meta).encode()
    parts = [_HEADER.pack(frame.type, frame.seq, len(meta), len(frame.payloads))]
    parts.extend(_LENGTH.pack(len(p)) for p in frame.payloads)
    parts.append(meta)
    parts.extend(bytes(p) if not isinstance(p, bytes) else p for p in frame.payloads)
    return parts


def encode_bytes(frame: Frame) -> bytes:
    return b"".join(encode(frame))


class FrameDecoder:
    """Accumulates bytes and yields every complete frame."""

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self._buffer = bytearray()
        self._max = max_frame_size

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while True:
            frame = self._next()
            if frame is None:
                return frames
            frames.append(frame)

    def _next(self) -> Frame | None:
        buf = self._buffer
        if len(buf) < _HEADER.size:
            return None
        kind, seq, meta_len, count = _HEADER.unpack_from(buf)
        table_end = _HEADER.size + count * _LENGTH.size
        if table_end + meta_len > self._max:  # known from the header: do not wait for it
            raise ProtocolError(f"frame header claims more than the limit of {self._max} bytes")
        if len(buf) < table_end:
            return None
        lengths = [
            _LENGTH.unpack_from(buf, _HEADER.size + i * _LENGTH.size)[0] for i in range(count)
        ]
        total = table_end + meta_len + sum(lengths)
        if total > self._max:
            raise ProtocolError(f"frame of {total} bytes exceeds the limit of {self._max}")
        if len(buf) < total:
            return None
        try:
            msg_type = MsgType(kind)
            meta = json.loads(bytes(buf[table_end : table_end + meta_len]) or b"{}")
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ProtocolError(f"malformed frame: {exc!r}"[:500]) from exc
        if not isinstance(meta, dict):
            raise ProtocolError(f"malformed frame: its metadata is a {type(meta).__name__}")
        payloads = []
        offset = table_end + meta_len
        with memoryview(buf) as view:  # one copy per payload (a bytearray slice is another)
            for length in lengths:
                payloads.append(view[offset : offset + length].tobytes())
                offset += length
        del buf[:total]
        return Frame(msg_type, seq, meta, tuple(payloads))


class FrameReader:
    """Blocking frames from ``recv_into`` (a socket's), with large payloads received in place.

    Headers, metadata and small payloads come through one reused buffer; a payload larger than
    that buffer gets a ``bytearray`` of its exact size that the kernel writes into directly. A
    1–16 MB tensor or image thus costs one copy (kernel to payload) instead of three (into a
    ``recv`` chunk, into the decoder's buffer, out of it), and its pages are touched once.
    Payloads are ``bytearray`` (as TorchServe hands request bodies to handlers).
    """

    def __init__(
        self,
        recv_into: Callable[[memoryview], int],
        buffer_size: int = 1 << 16,
        max_frame_size: int = MAX_FRAME_SIZE,
    ) -> None:
        self._recv_into = recv_into
        self._buf = bytearray(buffer_size)
        self._view = memoryview(self._buf)
        self._start = 0  # unread bytes are _buf[_start:_end]
        self._end = 0
        self._max = max_frame_size

    def read(self) -> Frame | None:
        """The next frame; None at a clean end of stream (between frames)."""
        if self._start == self._end and not self._fill(clean_eof=True):
            return None
        kind, seq, meta_len, count = _HEADER.unpack(self._exact(_HEADER.size))
        table = self._exact(count * _LENGTH.size)
        lengths = [_LENGTH.unpack_from(table, i * _LENGTH.size)[0] for i in range(count)]
        total = _HEADER.size + len(table) + meta_len + sum(lengths)
        if total > self._max:
            raise ProtocolError(f"frame of {total} bytes exceeds the limit of {self._max}")
        try:
            msg_type = MsgType(kind)
            meta = json.loads(self._exact(meta_len) or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"malformed frame: {exc}") from exc
        return Frame(msg_type, seq, meta, tuple(self._payload(n) for n in lengths))

    def _fill(self, clean_eof: bool = False) -> bool:
        """Read more into the buffer (moving unread bytes to its start first)."""
        if self._start:
            unread = self._end - self._start
            self._buf[:unread] = self._buf[self._start : self._end]
            self._start, self._end = 0, unread
        n = self._recv_into(self._view[self._end :])
        if n == 0:
            if clean_eof and self._end == 0:
                return False
            raise ProtocolError("the stream ended inside a frame")
        self._end += n
        return True

    def _exact(self, n: int) -> bytes:
        """``n`` bytes of header or metadata (which may be larger than the buffer)."""
        if n > len(self._buf):
            return bytes(self._payload(n))
        while self._end - self._start < n:
            self._fill()
        out = bytes(self._view[self._start : self._start + n])
        self._start += n
        return out

    def _payload(self, n: int) -> bytearray:
        out = bytearray(n)
        view = memoryview(out)
        have = min(n, self._end - self._start)
        view[:have] = self._view[self._start : self._start + have]
        self._start += have
        got = have
        while got < n:
            k = self._recv_into(view[got:])
            if k == 0:
                raise ProtocolError("the stream ended inside a frame")
            got += k
        if self._start == self._end:
            self._start = self._end = 0
        return out


def frames_from(chunks: Sequence[bytes]) -> list[Frame]:
    """Decode a complete byte stream; for tests and tools."""
    decoder = FrameDecoder()
    out: list[Frame] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out
