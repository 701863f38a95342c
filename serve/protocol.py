"""Sans-IO codec for the frames between the frontend and a worker.

A frame is a fixed header, a table of payload lengths, JSON metadata, then the raw payloads:

    !BIII   type, seq, meta length, payload count
    !Q * n  payload lengths
    meta    UTF-8 JSON object
    payloads

Bytes go in, frames come out; the I/O lives with the callers. No pickle crosses the socket.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Sequence
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
    DESCRIBE = 6  # frontend → worker: run the handler's describe_handle
    SHUTDOWN = 7  # frontend → worker: finish and exit
    LOG = 8  # reserved
    PARTIAL = 9  # worker → frontend: an intermediate (streamed) chunk for each batch item
    THREADS = 10  # frontend → worker: {"threads": n}, its new intra-op share (serve/threads.py)


class ProtocolError(Exception):
    """A frame could not be decoded: a bug or a corrupted stream, never user input."""


@dataclass(frozen=True, slots=True)
class Frame:
    type: MsgType
    seq: int
    meta: dict[str, Any] = field(default_factory=dict)
    payloads: tuple[bytes, ...] = ()


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
        frames = []
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
            meta = json.loads(buf[table_end : table_end + meta_len] or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"malformed frame: {exc}") from exc
        payloads = []
        offset = table_end + meta_len
        with memoryview(buf) as view:  # one copy per payload (a bytearray slice is another)
            for length in lengths:
                payloads.append(view[offset : offset + length].tobytes())
                offset += length
        del buf[:total]
        return Frame(msg_type, seq, meta, tuple(payloads))


def frames_from(chunks: Sequence[bytes]) -> list[Frame]:
    """Decode a complete byte stream; for tests and tools."""
    decoder = FrameDecoder()
    out: list[Frame] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out
