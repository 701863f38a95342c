"""The worker frame codec: round trips, partial input, and corrupt streams."""

from __future__ import annotations

import struct

import pytest

from serve.protocol import Frame, FrameDecoder, MsgType, ProtocolError, encode_bytes, frames_from


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
