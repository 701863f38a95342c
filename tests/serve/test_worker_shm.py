"""`WorkerProcess` with a shared-memory arena, against a real (torch-free) worker subprocess: which
bodies go through the arena, that they arrive intact, and when its space and memory are freed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from serve.core.jobs import BatchItem, BatchOutcome, ItemResult
from serve.wire.errors import WorkerDied
from serve.worker.process import WorkerProcess
from tests.support.arena import arena_fds, arena_mappings
from tests.support.server import HANDLERS
from tests.support.waiting import until
from tests.support.worker_spec import worker_spec

MiB = 1 << 20


def body(size: int, seed: int) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1))[:size]


def items(*bodies: bytes) -> list[BatchItem]:
    return [
        BatchItem(f"r{i}", {}, [("body", "application/octet-stream", b)])
        for i, b in enumerate(bodies)
    ]


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path, arena_bytes: int, handler: str = "digest_handler.py", grace: float = 5
) -> AsyncIterator[WorkerProcess]:
    """A started worker of ``handler`` with an arena of ``arena_bytes``, stopped afterwards."""
    proc = WorkerProcess(
        "m_1.0-w0",
        worker_spec(tmp_path, HANDLERS / handler, batch_size=8),
        tmp_path,
        arena_bytes=arena_bytes,
    )
    await proc.start(60)
    try:
        yield proc
    finally:
        await proc.stop(grace)


def answers(outcome: BatchOutcome) -> list[dict]:
    results = [r for r in outcome.results if isinstance(r, ItemResult)]
    assert len(results) == len(outcome.results), outcome.results
    return [json.loads(r.body) for r in results]


def test_large_bodies_go_through_the_arena_intact_and_their_space_is_freed(
    tmp_path: Path,
) -> None:
    bodies = [body(MiB, 1), b"small", body(8 * MiB, 2), body(64 << 10, 3), body((64 << 10) - 1, 4)]

    async def scenario() -> None:
        async with running(tmp_path, 16 * MiB) as proc:
            assert proc.arena is not None
            assert proc.arena.fd is None  # sent to the worker, closed here
            assert arena_fds() == 1  # the mapping's own descriptor, one per live worker
            got = answers(await proc.run_batch(items(*bodies)))
            assert [(a["n"], a["sha256"], a["type"]) for a in got] == [
                (len(b), hashlib.sha256(b).hexdigest(), "bytearray") for b in bodies
            ]
            # 1 MiB, 8 MiB and the body of exactly the threshold went by the arena.
            assert (proc.arena.placed, proc.arena.inline) == (3, 0)
            assert (proc.arena.allocator.in_use, proc.arena.allocator.top) == (0, 0)
            # The worker maps it read-only and shared; once it has copied the bodies out it drops
            # the pages from its own resident set (they stay in the arena).
            assert got[0]["arena"] == {"perms": "r--s", "rss_kb": 0}
            ((perms, resident),) = arena_mappings()
            assert perms == "rw-s" and resident >= (9 * MiB + (64 << 10)) // 1024
            # The next batch starts at offset 0 again: the same pages, not new ones.
            again = answers(await proc.run_batch(items(body(8 * MiB, 5))))
            assert again[0]["sha256"] == hashlib.sha256(body(8 * MiB, 5)).hexdigest()
            assert arena_mappings() == [(perms, resident)]
        assert proc.arena is None
        assert arena_fds() == 0 and arena_mappings() == []

    asyncio.run(scenario())


def test_bodies_that_do_not_fit_go_inline(tmp_path: Path) -> None:
    bodies = [body(3 * MiB, 1), body(3 * MiB, 2), body(8 * MiB, 3)]

    async def scenario() -> None:
        async with running(tmp_path, 4 * MiB) as proc:
            got = answers(await proc.run_batch(items(*bodies)))
            assert [a["sha256"] for a in got] == [hashlib.sha256(b).hexdigest() for b in bodies]
            assert proc.arena is not None
            assert (proc.arena.placed, proc.arena.inline) == (1, 2)  # the first 3 MiB fitted
            assert proc.arena.allocator.in_use == 0

    asyncio.run(scenario())


def test_without_an_arena_every_body_goes_inline(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, 0) as proc:
            assert proc.arena is None and arena_fds() == 0
            (got,) = answers(await proc.run_batch(items(body(2 * MiB, 1))))
            assert got["sha256"] == hashlib.sha256(body(2 * MiB, 1)).hexdigest()
            assert got["arena"] is None  # the worker maps nothing

    asyncio.run(scenario())


def test_a_worker_whose_arena_cannot_be_created_starts_and_goes_inline(tmp_path: Path) -> None:
    async def scenario() -> None:
        # 4 EiB: the frontend cannot map that much (any failure creating it: no arena).
        async with running(tmp_path, 1 << 62) as proc:
            assert proc.arena is None and arena_fds() == 0
            (got,) = answers(await proc.run_batch(items(body(2 * MiB, 1))))
            assert got["sha256"] == hashlib.sha256(body(2 * MiB, 1)).hexdigest()
            assert got["arena"] is None

    asyncio.run(scenario())


def test_a_streamed_batch_keeps_its_space_until_the_final_result(tmp_path: Path) -> None:
    held_during_partials: list[int] = []

    async def scenario() -> None:
        async with running(tmp_path, 4 * MiB, handler="stream_handler.py") as proc:
            arena = proc.arena
            assert arena is not None
            outcome = await proc.run_batch(
                items(body(MiB, 1)),
                lambda _: held_during_partials.append(arena.allocator.in_use),
            )
            result = outcome.results[0]
            assert isinstance(result, ItemResult) and result.body == b"done"
            assert held_during_partials == [MiB] * 3
            assert arena.allocator.in_use == 0

    asyncio.run(scenario())


def test_a_worker_killed_mid_batch_takes_its_arena_with_it(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    held = f"wait:{gate}\n".encode() + body(2 * MiB, 1)

    async def scenario() -> None:
        async with running(tmp_path, 4 * MiB, grace=1) as proc:
            arena = proc.arena
            assert arena is not None
            batch = asyncio.create_task(proc.run_batch(items(held)))
            # The handler has the body: it created the flag.
            await until(Path(f"{gate}.started").exists, 60, interval=0.05)
            assert arena.allocator.in_use == len(held)  # held while the worker has it
            proc.kill()
            with pytest.raises(WorkerDied):
                await asyncio.wait_for(batch, 30)
            assert proc.arena is None and arena.closed
            assert arena_fds() == 0  # the worker is gone, and so is every descriptor of it

    asyncio.run(scenario())
