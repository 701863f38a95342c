"""A small closed-loop HTTP/1.1 load generator, for machines without ``wrk``.

``python -m bench.pyload URL -c 32 -d 5`` POSTs ``$BENCH_BODY`` (Content-Type
``$BENCH_CONTENT_TYPE``) over ``-c`` keep-alive connections for ``-d`` seconds and prints the same
``BENCH_JSON`` line as ``post.lua``. It speaks raw HTTP on asyncio streams (uvloop when installed)
rather than through an HTTP client library, whose per-request cost would make the generator, not
the server, the bottleneck. It still costs several times what wrk does per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit


class Stats:
    def __init__(self, timeline: bool = False) -> None:
        self.latencies: list[float] = []
        # With a timeline: (CLOCK_MONOTONIC at send, latency) per answered request, so that a
        # caller can cut the run into windows around an event (bench.scaleup).
        self.timeline: list[tuple[float, float]] | None = [] if timeline else None
        self.errors = {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; returns its status and whether the server keeps the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers.get("connection", "").lower() != "close"


async def _connection(
    host: str, port: int, request: bytes, deadline: float, timeout: float, stats: Stats
) -> None:
    reader = writer = None
    while time.perf_counter() < deadline:
        if writer is None:
            try:
                reader, writer = await asyncio.open_connection(host, port)
                writer.get_extra_info("socket").setsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
                )
            except OSError:
                stats.errors["connect"] += 1
                await asyncio.sleep(0.01)
                continue
        sent_at = time.monotonic()
        started = time.perf_counter()
        try:
            assert reader is not None  # opened together with the writer
            writer.write(request)
            status, keep = await asyncio.wait_for(_read_response(reader), timeout)
        except asyncio.TimeoutError:
            stats.errors["timeout"] += 1
            keep = False
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            stats.errors["read"] += 1
            keep = False
        else:
            latency = time.perf_counter() - started
            stats.latencies.append(latency)
            if stats.timeline is not None:
                stats.timeline.append((sent_at, latency))
            if not 200 <= status < 400:
                stats.errors["status"] += 1
        if not keep:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def percentile(ordered: list[float], pct: float) -> float:
    """The ``pct`` percentile of sorted values (nearest rank); 0.0 when there are none."""
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]


async def run(
    url: str, concurrency: int, seconds: float, timeout: float, timeline: Path | None = None
) -> dict[str, float]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = Path(os.environ["BENCH_BODY"]).read_bytes()
    content_type = os.environ.get("BENCH_CONTENT_TYPE", "application/octet-stream")
    path = parts.path or "/"
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1") + body
    stats = Stats(timeline is not None)
    started = time.perf_counter()
    deadline = started + seconds
    await asyncio.gather(
        *(_connection(host, port, request, deadline, timeout, stats) for _ in range(concurrency))
    )
    elapsed = time.perf_counter() - started
    if timeline is not None and stats.timeline is not None:
        timeline.write_text(json.dumps(stats.timeline))
    ordered = sorted(stats.latencies)
    us = 1e6
    return {
        "requests": len(ordered),
        "duration_us": elapsed * us,
        **stats.errors,
        "p50_us": percentile(ordered, 50) * us,
        "p90_us": percentile(ordered, 90) * us,
        "p99_us": percentile(ordered, 99) * us,
        "mean_us": (sum(ordered) / len(ordered) * us) if ordered else 0.0,
        "max_us": (ordered[-1] * us) if ordered else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("-d", "--duration", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument(
        "--timeline", type=Path, help="write [send time (CLOCK_MONOTONIC), latency] per request"
    )
    args = parser.parse_args()
    coro = run(args.url, args.concurrency, args.duration, args.timeout, args.timeline)
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(coro)
    else:
        result = uvloop.run(coro)
    print("BENCH_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
