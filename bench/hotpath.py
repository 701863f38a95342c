"""``python -m bench.hotpath``: the frontend's per-request pieces, before and after, in-process.

End-to-end CPU per request moves by a few µs with each of these changes, less than a shared
machine's run-to-run noise; timed alone, in one process, one after the other, the ratios are
steady. Each line times the previous implementation (kept here, verbatim in behaviour) against the
current one, best of ``--repeats`` runs of ``--number`` calls, the two alternating:

* request id: ``str(uuid.uuid4())`` (an ``os.urandom`` system call) vs `serve.core.request_ids`;
* IPC metadata: ``json.dumps(meta, separators=...)`` (a new ``JSONEncoder`` per call) vs the one
  cached encoder in `serve.wire.frames`;
* frame decoding: payloads sliced out of the ``bytearray`` and copied again vs one copy through a
  ``memoryview``, for a 1.2 KB body (the tiny model's) and an 8 MB one;
* forwarded headers: Starlette's ``Headers.items()`` vs the raw ASGI scope.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import timeit
import uuid
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers

from serve.core.request_ids import new_request_id
from serve.http.inference import _forwarded_headers
from serve.wire.frames import Frame, FrameDecoder, MsgType, encode_bytes

_HEADER = struct.Struct("!BIII")
_LENGTH = struct.Struct("!Q")


def old_decode(buf: bytearray) -> Frame:
    """The decoder's payload handling before: slice (a copy) then ``bytes`` (another)."""
    kind, seq, meta_len, count = _HEADER.unpack_from(buf)
    table_end = _HEADER.size + count * _LENGTH.size
    lengths = [_LENGTH.unpack_from(buf, _HEADER.size + i * 8)[0] for i in range(count)]
    meta = json.loads(bytes(buf[table_end : table_end + meta_len]) or b"{}")
    payloads = []
    offset = table_end + meta_len
    for length in lengths:
        payloads.append(bytes(buf[offset : offset + length]))
        offset += length
    return Frame(MsgType(kind), seq, meta, tuple(payloads))


def _meta(batch: int) -> dict[str, Any]:
    headers = {"host": "127.0.0.1:8080", "content-type": "application/json", "accept": "*/*"}
    return {
        "requests": [
            {"id": new_request_id(), "headers": headers, "params": [("body", "application/json")]}
            for _ in range(batch)
        ]
    }


def _best_pair(
    before: Callable[[], Any], after: Callable[[], Any], number: int, repeats: int
) -> tuple[float, float]:
    """Seconds per call of each, best of ``repeats``; the two alternate, so that a shared
    machine's load drifting between them weighs on both."""
    b, a = [], []
    for _ in range(repeats):
        b.append(timeit.timeit(before, number=number))
        a.append(timeit.timeit(after, number=number))
    return min(b) / number, min(a) / number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    n, r = args.number, args.repeats
    meta = _meta(8)
    encoder = json.JSONEncoder(separators=(",", ":")).encode
    small = encode_bytes(Frame(MsgType.PREDICT, 1, _meta(1), (b"x" * 1200,)))
    big = encode_bytes(Frame(MsgType.PREDICT, 1, _meta(1), (b"x" * (8 << 20),)))
    raw_headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"user-agent", b"wrk"),
        (b"content-type", b"application/json"),
        (b"content-length", b"1200"),
    ]

    def headers_before() -> dict[str, str]:
        items = Headers(raw=raw_headers).items()
        return {k: v for k, v in items if not k.startswith("x-lantern-")}

    def decode_new(data: bytes) -> Callable[[], Any]:
        return lambda: FrameDecoder().feed(data)

    def decode_old(data: bytes) -> Callable[[], Any]:
        return lambda: old_decode(bytearray(data))

    cases = [
        ("request id", lambda: str(uuid.uuid4()), new_request_id, n),
        (
            "IPC meta, batch of 8",
            lambda: json.dumps(meta, separators=(",", ":")).encode(),
            lambda: encoder(meta).encode(),
            n,
        ),
        ("decode frame, 1.2 KB body", decode_old(small), decode_new(small), n),
        ("decode frame, 8 MB body", decode_old(big), decode_new(big), max(1, n // 1000)),
        ("forwarded headers", headers_before, lambda: _forwarded_headers(raw_headers), n),
    ]
    print(f"{'piece':<28} {'before µs':>10} {'after µs':>9} {'after/before':>12}")
    for name, before, after, number in cases:
        b, a = (t * 1e6 for t in _best_pair(before, after, number, r))
        print(f"{name:<28} {b:>10.2f} {a:>9.2f} {a / b:>12.2f}")
    print(f"\nbest of {r} × {n} calls (8 MB: {max(1, n // 1000)}); one process, in turn.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
