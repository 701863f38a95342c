"""`SparePool.acquire`: a worker start waits for a spare on its way only while that spare has no
other waiter; a second start goes on at once (and starts cold) instead of waiting for nothing."""

from __future__ import annotations

import asyncio

import pytest

from serve.worker.spares import SparePool


@pytest.mark.anyio
async def test_one_waiter_per_spare_on_its_way() -> None:
    pool = SparePool(1, {})
    gate = asyncio.Event()

    async def spare_start() -> None:  # stands in for a spare's start
        await gate.wait()

    on_its_way = asyncio.create_task(spare_start())
    pool._starting.add(on_its_way)
    first = asyncio.create_task(pool.acquire(wait=60))
    await asyncio.sleep(0)  # the first start is now waiting for that spare
    # The second must not wait: 5 s is far below the 60 s it would otherwise wait.
    second = await asyncio.wait_for(pool.acquire(wait=60), 5)
    assert second is None and not first.done()
    gate.set()
    assert await asyncio.wait_for(first, 5) is None  # the stand-in brought no spare
    assert pool._waiters == 0


@pytest.mark.anyio
async def test_no_spare_on_its_way_means_no_wait() -> None:
    pool = SparePool(1, {})
    assert await asyncio.wait_for(pool.acquire(wait=60), 5) is None
