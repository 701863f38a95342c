"""`serve.core.offload`: small decodes inline, big ones in a process that does not share the
event loop's GIL, and a decoding process that dies is replaced (issue 27, item 7)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator

import pytest

from serve.core import offload
from serve.wire.errors import ServeError


@pytest.fixture(autouse=True)
def _stop_the_process() -> Iterator[None]:
    yield
    offload.shutdown()


def where() -> tuple[int, str]:
    return os.getpid(), threading.current_thread().name


def test_each_size_runs_where_it_should() -> None:
    async def sizes() -> list[tuple[int, str]]:
        return [
            await offload.run_big(size, where)
            for size in (offload.INLINE_MAX, offload.PROCESS_MIN - 1, offload.PROCESS_MIN)
        ]

    inline, threaded, process = asyncio.run(sizes())
    assert inline == (os.getpid(), "MainThread")
    assert threaded[0] == os.getpid() and threaded[1].startswith("lantern-decode")
    assert process[0] != os.getpid()


def test_a_decoder_that_dies_fails_its_request_and_is_replaced() -> None:
    async def die_then_decode() -> int:
        with pytest.raises(ServeError, match="decoder stopped"):
            await offload.run_big(offload.PROCESS_MIN, os._exit, 3)
        pid, _ = await offload.run_big(offload.PROCESS_MIN, where)
        return pid

    assert asyncio.run(die_then_decode()) != os.getpid()
