"""The frontend's side of ENGINE frames (`WorkerProcess`): the latest counts, each request's
reservation while it is in flight, the dispatcher woken, and nothing left once the worker is gone.

The frames are fed to the process's own reader over an in-memory stream (no subprocess)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from serve.core.jobs import WorkerState
from serve.wire.errors import WorkerDied
from serve.wire.frames import FrameDecoder, encode_bytes
from serve.wire.messages import (
    BatchResult,
    EngineReport,
    ResultItem,
    WorkerSpec,
    encode_engine_report,
    encode_result,
)
from serve.worker.process import WorkerProcess

STATS = {"waiting": 1, "prefilling": 0, "running": 1, "reserved_tokens": 100}


def test_reports_fill_the_counts_and_the_reservations_of_requests_in_flight(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        spec = WorkerSpec("m", "1.0", str(tmp_path), {})
        worker = WorkerProcess("w0", spec, tmp_path)
        worker.change_state(WorkerState.READY)
        woken: list[bool] = []
        worker.on_reservations = lambda: woken.append(True)
        loop = asyncio.get_running_loop()
        sixth = loop.create_future()
        worker._pending = {5: loop.create_future(), 6: sixth}
        reader = asyncio.StreamReader()
        task = asyncio.create_task(worker._read_results(reader, FrameDecoder()))
        assert worker.expected_reservation() is None  # before any report: placement's worst
        # 9 was answered (or cancelled) before its report came: it is not counted
        reader.feed_data(encode_bytes(encode_engine_report(EngineReport(STATS, {5: 100, 9: 7}))))
        await until(lambda: worker.engine_stats == STATS)
        assert worker.reservations() == (100, 1) and woken == [True]
        assert worker.expected_reservation() == 100  # the largest recent one, answered or not
        reader.feed_data(encode_bytes(encode_engine_report(EngineReport({**STATS, "steps": 3}))))
        await until(lambda: worker.engine_stats.get("steps") == 3)
        assert woken == [True]  # counts alone change no placement
        reader.feed_data(
            encode_bytes(encode_result(5, BatchResult([ResultItem(200, None, {}, b"")])))
        )
        await until(lambda: 5 not in worker._pending)
        assert worker.reservations() == (0, 0)  # its answer frees its reservation
        reader.feed_data(encode_bytes(encode_engine_report(EngineReport({}, {6: 40}))))
        await until(lambda: worker.reservations() == (40, 1))
        assert worker.expected_reservation() == 100
        assert worker.engine_stats["steps"] == 3  # reservations alone keep the last counts
        reader.feed_eof()  # the worker is gone
        await asyncio.wait_for(task, 10)
        assert worker.state is WorkerState.DEAD
        assert worker.engine_stats == {} and worker.reservations() == (0, 0)
        assert isinstance(sixth.exception(), WorkerDied)

    asyncio.run(scenario())


async def until(condition: Callable[[], bool]) -> None:
    async def holds() -> None:
        while not condition():
            await asyncio.sleep(0)

    await asyncio.wait_for(holds(), 10)
