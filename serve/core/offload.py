"""Run CPU-heavy request decoding off the event loop: inline when small, in a thread when
medium, in a process of its own when big.

A 5 MB JSON tensor body takes the better part of a second to check and convert. Bodies up to
`INLINE_MAX` bytes stay inline: measured with ``python -m bench.decode``, the thread hop (~0.1 ms)
costs more than decoding a body of a few KiB, and a 16 KiB body decoded inline holds the loop
for about 1-2 ms. Bodies up to `PROCESS_MIN` go to a small thread pool of their own (so that
archive extraction on the default pool is not held up).

Bigger ones go to one decoding process (`run_big`): a thread does not free the loop, because
``json.loads`` is one C call that holds the GIL for its whole run (about 30-80 ns per byte, 0.2 s
and more for 6 MB on a loaded machine), and the Python-level conversion after it contends for
the GIL with the loop (the loop's every system call waits for it again). A client looping 6 MB
bodies held a neighbour model's p99 at 3.8 s that way; in a process the loop only reads the body
and hands it over (``python -m bench.bigjson``). The process starts on the first big body and
is started again if it dies (a decode that crashed it fails with a 500, not the server). It is
a ``spawn`` process: it imports the frontend's main module again (as multiprocessing does), which
``python -m serve.cli`` and the ``serve`` script allow; a program embedding the server keeps its
start-up under ``if __name__ == "__main__":``. A 5 MB FP32 body within the limits took 0.54 s
in the thread and 0.56 s in the process on the loaded 2-core machine: the hop costs little.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from serve.wire.errors import ServeError

INLINE_MAX = 16 * 1024
PROCESS_MIN = 512 * 1024
DECODE_THREADS = 1  # the GIL lets only one decode at a time anyway; more would starve the loop
DECODE_PROCESSES = 1  # one big decode at a time beside the loop: the rest wait their turn

T = TypeVar("T")

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_processes: concurrent.futures.ProcessPoolExecutor | None = None
_processes_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(
            DECODE_THREADS, thread_name_prefix="lantern-decode"
        )
    return _pool


def _process_executor() -> concurrent.futures.ProcessPoolExecutor:
    """The decoding process, started (and up) on first use: call it off the event loop."""
    global _processes
    with _processes_lock:
        if _processes is None:
            # spawn, not fork: the frontend has threads and an event loop a fork would copy.
            context = multiprocessing.get_context("spawn")
            pool = concurrent.futures.ProcessPoolExecutor(DECODE_PROCESSES, mp_context=context)
            try:
                pool.submit(int).result()  # the process starts on a first call: have it up now
            except BrokenProcessPool:
                pool.shutdown(wait=False)
                raise ServeError("The request decoder could not start.") from None
            _processes = pool
        return _processes


def _forget(broken: concurrent.futures.ProcessPoolExecutor) -> None:
    global _processes
    with _processes_lock:
        if _processes is broken:
            _processes = None
    broken.shutdown(wait=False, cancel_futures=True)


async def run_sized(size: int, func: Callable[..., T], *args: object) -> T:
    """``func(*args)`` inline when ``size`` is at most `INLINE_MAX` bytes, else on the pool."""
    if size <= INLINE_MAX:
        return func(*args)
    return await asyncio.get_running_loop().run_in_executor(_executor(), func, *args)


async def run_big(size: int, func: Callable[..., T], *args: object) -> T:
    """As `run_sized`, but from `PROCESS_MIN` bytes on in the decoding process: ``func`` must be
    a module-level function, and its arguments, result and errors must pickle."""
    if size < PROCESS_MIN:
        return await run_sized(size, func, *args)
    pool = _processes
    if pool is None:
        pool = await asyncio.to_thread(_process_executor)
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, func, *args)
    except BrokenProcessPool:
        _forget(pool)
        raise ServeError("The request decoder stopped while decoding this request.") from None


def shutdown() -> None:
    """Stop the decoding process, if one started (the server's shutdown)."""
    global _processes
    with _processes_lock:
        pool, _processes = _processes, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
