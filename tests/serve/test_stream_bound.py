"""The bound on a stream's parts waiting for its client (`serve.core.jobs`, issue 39 item 7)."""

from __future__ import annotations

import asyncio

import pytest

from serve.core import jobs
from serve.core.jobs import BatchItem, ItemResult, Job, StreamNotRead, answer_parts
from serve.wire.errors import ServeError
from tests.support.inprocess import run, until

PART = 256 * 1024


def _job() -> tuple[Job, list[str]]:
    loop = asyncio.get_running_loop()
    job = Job(BatchItem("r1", {}, []), loop.create_future(), 0.0, 1e9)
    cancelled: list[str] = []
    job.on_abandon = lambda: cancelled.append("r1")
    return job, cancelled


def _part() -> ItemResult:
    return ItemResult(200, b"x" * PART, None)


async def _rest(first: ItemResult) -> list[ItemResult | ServeError]:
    got: list[ItemResult | ServeError] = []
    try:
        async for part in answer_parts(first):
            got.append(part)
    except ServeError as err:
        got.append(err)
    return got


def test_parts_past_the_cap_cancel_the_request_and_are_dropped() -> None:
    async def test() -> None:
        job, cancelled = _job()
        job.push_chunk(_part())  # the first part answers the request
        first = job.future.result()
        assert first.stream is not None
        for _ in range(jobs.STREAM_BUFFER_CAP // PART + 1):
            job.push_chunk(_part())
        assert cancelled == ["r1"] and job.abandoned
        assert first.stream.waiting == 0  # dropped: only the error and the end wait
        job.push_chunk(_part())  # later parts and the answer are dropped too
        job.resolve(_part())
        assert first.stream.waiting == 0
        rest = await _rest(first)
        assert len(rest) == 2 and isinstance(rest[1], StreamNotRead)
        assert rest[1].status_code == 408 and "did not read its stream" in rest[1].message

    run(test)


def test_parts_over_the_bound_wait_for_the_send_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "STREAM_SEND_TIMEOUT", 0.2)

    async def test() -> None:
        # A client that takes its parts back under the bound in time keeps its stream.
        job, cancelled = _job()
        job.push_chunk(_part())
        first = job.future.result()
        assert first.stream is not None
        for _ in range(jobs.STREAM_BUFFER_MAX // PART + 1):
            job.push_chunk(_part())
        assert first.stream.waiting > jobs.STREAM_BUFFER_MAX and job.unread is not None
        first.stream.get_nowait()
        first.stream.get_nowait()
        await until(lambda: job.unread is None, limit=5)
        assert cancelled == []
        job.resolve(_part())
        rest = await _rest(first)
        assert all(isinstance(p, ItemResult) for p in rest)
        # One that does not is cut when the timeout passes.
        job, cancelled = _job()
        job.push_chunk(_part())
        first = job.future.result()
        for _ in range(jobs.STREAM_BUFFER_MAX // PART + 1):
            job.push_chunk(_part())
        await until(lambda: cancelled == ["r1"], limit=5)
        rest = await _rest(first)
        assert isinstance(rest[-1], StreamNotRead)

    run(test)
