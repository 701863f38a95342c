"""Run CPU-heavy request decoding off the event loop, unless the input is small.

A 5 MB JSON tensor body takes the better part of a second to check and convert; on the event loop
that stalls every port. Bodies over `INLINE_MAX` bytes are decoded on a small thread pool of its
own (so that archive extraction on the default pool is not held up). Smaller ones stay inline:
measured with ``python -m bench.decode``, the thread hop (~0.1 ms) costs more than decoding a body
of a few KiB, and a 16 KiB body decoded inline holds the loop for about 1-2 ms.

What a thread cannot do: ``json.loads`` is one C call that holds the GIL, about 30 ns per byte, so
the loop still pauses that long once per big body; ``max_request_size`` bounds it, and the
Python-level conversion after it (the larger part) shares the GIL with the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

INLINE_MAX = 16 * 1024
DECODE_THREADS = 1  # the GIL lets only one decode at a time anyway; more would starve the loop

T = TypeVar("T")

_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(
            DECODE_THREADS, thread_name_prefix="lantern-decode"
        )
    return _pool


async def run_sized(size: int, func: Callable[..., T], *args: object) -> T:
    """``func(*args)`` inline when ``size`` is at most `INLINE_MAX` bytes, else on the pool."""
    if size <= INLINE_MAX:
        return func(*args)
    return await asyncio.get_running_loop().run_in_executor(_executor(), func, *args)
