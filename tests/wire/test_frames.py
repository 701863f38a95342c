"""The worker frame codec: round trips, partial input, and corrupt streams."""

from __future__ import annotations

import struct

import pytest

from serve.wire.frames import (
    Frame,
    FrameDecoder,
    FrameReader,
    MsgType,
    ProtocolError,
    encode_bytes,
    frames_from,
)


def test_round_trip_with_payloads() -> None:
    frame = Frame(MsgType.PREDICT, 7, {"requests": [{"id": "a"}]}, (b"one", b"", b"\x00" * 10))
    (decoded,) = frames_from([encode_bytes(frame)])
    assert decoded == frame


def test_byte_at_a_time_and_several_frames_in_one_chunk() -> None:
    frames = [Frame(MsgType.RESULT, i, {"i": i}, (bytes([i]) * i,)) for i in range(5)]
    data = b"".join(encode_bytes(f) for f in frames)
    decoder = FrameDecoder()
    out = []
    for i in range(len(data)):
        out.extend(decoder.feed(data[i : i + 1]))
    assert out == frames
    assert FrameDecoder().feed(data) == frames


def test_oversized_frame_is_refused() -> None:
    data = encode_bytes(Frame(MsgType.PREDICT, 1, {}, (b"x" * 100,)))
    with pytest.raises(ProtocolError, match="exceeds"):
        FrameDecoder(max_frame_size=50).feed(data)


def test_unknown_type_and_bad_json_are_protocol_errors() -> None:
    bad_type = struct.pack("!BIII", 99, 1, 2, 0) + b"{}"
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(bad_type)
    bad_json = struct.pack("!BIII", 4, 1, 3, 0) + b"{x]"
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(bad_json)


def test_incomplete_frame_waits_for_more() -> None:
    data = encode_bytes(Frame(MsgType.HELLO, 0, {"worker_id": "w"}))
    decoder = FrameDecoder()
    assert decoder.feed(data[:-1]) == []
    assert decoder.feed(data[-1:])[0].meta == {"worker_id": "w"}


def _reader_over(data: bytes, chunk: int, buffer_size: int = 64) -> FrameReader:
    """A `FrameReader` over ``data`` whose ``recv_into`` returns at most ``chunk`` bytes."""
    source = memoryview(data)
    pos = 0

    def recv_into(view: memoryview) -> int:
        nonlocal pos
        n = min(len(view), chunk, len(source) - pos)
        view[:n] = source[pos : pos + n]
        pos += n
        return n

    return FrameReader(recv_into, buffer_size=buffer_size)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_reader_reads_small_and_large_frames_in_any_chunking(chunk: int) -> None:
    frames = [
        Frame(MsgType.THREADS, 0, {"threads": 2}),
        Frame(MsgType.PREDICT, 1, {"requests": [{"id": "a" * 200}]}, (b"x" * 10, b"")),
        Frame(MsgType.PREDICT, 2, {}, (bytes(range(256)) * 1000, b"tail")),  # past the buffer
        Frame(MsgType.SHUTDOWN, 0, {}),
    ]
    reader = _reader_over(b"".join(encode_bytes(f) for f in frames), chunk)
    got = [reader.read() for _ in frames]
    assert got == frames
    assert all(isinstance(p, bytearray) for f in got if f for p in f.payloads)
    assert reader.read() is None  # a clean end between frames


def test_reader_refuses_a_stream_cut_inside_a_frame_and_oversized_frames() -> None:
    data = encode_bytes(Frame(MsgType.PREDICT, 1, {}, (b"x" * 1000,)))
    with pytest.raises(ProtocolError, match="ended inside a frame"):
        _reader_over(data[:-1], 100).read()
    with pytest.raises(ProtocolError, match="ended inside a frame"):
        _reader_over(data[:5], 100).read()
    reader = _reader_over(data, 100)
    reader._max = 100
    with pytest.raises(ProtocolError, match="exceeds"):
        reader.read()
    with pytest.raises(ProtocolError):
        _reader_over(struct.pack("!BIII", 4, 1, 3, 0) + b"{x]", 100).read()
