"""The worker pool in process: restart back-off, memory recycling, supervisors never die unseen."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from serve.config import ModelSettings
from serve.core.jobs import BatchOutcome, WorkerState, next_state
from serve.core.pool import WorkerFactory, WorkerPool, WorkerSlot
from serve.worker.process import WorkerStartFailed
from tests.support.waiting import until


class _Proc:
    """A worker that loads at once and exits when told to."""

    def __init__(self, worker_id: str, *, fail_start: BaseException | None = None) -> None:
        self.worker_id = worker_id
        self.state = WorkerState.STARTING
        self.pid: int | None = os.getpid()
        self.started_at = 0.0
        self.fail_start = fail_start
        self.stopped = False
        self._exit = asyncio.Event()

    def change_state(self, wanted: WorkerState) -> bool:
        self.state = next_state(self.state, wanted)
        return self.state is wanted

    async def start(self, timeout: float) -> None:
        if self.fail_start is not None:
            raise self.fail_start
        self.state = WorkerState.READY

    async def wait_exit(self) -> int | None:
        await self._exit.wait()
        return 0

    async def stop(self, grace: float = 5.0) -> None:
        self.stopped = True
        self.state = WorkerState.DEAD
        self._exit.set()

    def kill(self) -> None:
        self.state = WorkerState.DEAD
        self._exit.set()

    async def run_batch(self, items: object, on_partial: object = None) -> BatchOutcome:
        raise AssertionError("not used")


def _recording(procs: list[_Proc]) -> WorkerFactory:
    """A factory of `_Proc` workers that appends each one it makes to ``procs``."""

    def factory(slot: WorkerSlot) -> _Proc:
        procs.append(_Proc(slot.worker_id))
        return procs[-1]

    return factory


def _pool(factory: WorkerFactory, **settings: object) -> WorkerPool:
    model_settings = ModelSettings().merged(settings)
    return WorkerPool("m", "1", factory, lambda: model_settings, max_backoff=0.0)


def test_an_unexpected_start_error_is_a_logged_start_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        pool = _pool(
            lambda slot: _Proc(slot.worker_id, fail_start=OSError("AF_UNIX path too long")),
            max_retry_timeout_in_sec=0,
        )
        slot = pool.add()
        with pytest.raises(WorkerStartFailed, match="AF_UNIX path too long"):
            await asyncio.wait_for(pool.wait_loaded(), 5)
        await asyncio.wait_for(slot.task, 5)  # type: ignore[arg-type]
        assert slot.gave_up and slot.state is WorkerState.DEAD
        assert slot.last_error == "OSError: AF_UNIX path too long"
        assert not pool.can_serve()
        (info,) = pool.infos()
        assert info.state is WorkerState.DEAD and info.last_error == slot.last_error

    with caplog.at_level(logging.ERROR, logger="serve.core.pool"):
        asyncio.run(scenario())
    assert any(r.exc_info and "failed to start" in r.getMessage() for r in caplog.records)
    assert any("Giving up on worker" in r.getMessage() for r in caplog.records)


def test_a_supervisor_that_fails_marks_its_slot_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    def factory(slot: WorkerSlot) -> _Proc:
        raise RuntimeError("factory broke")

    async def scenario() -> None:
        pool = _pool(factory)
        slot = pool.add()
        await asyncio.wait_for(slot.task, 5)  # type: ignore[arg-type]
        assert slot.gave_up and slot.last_error == "RuntimeError: factory broke"
        assert slot.settled.is_set() and not pool.can_serve()

    with caplog.at_level(logging.ERROR, logger="serve.core.pool"):
        asyncio.run(scenario())
    assert any(
        r.exc_info and "Supervisor of worker m_1-w0 failed" in r.getMessage()
        for r in caplog.records
    )


def test_a_worker_over_its_memory_cap_is_recycled_between_batches(
    caplog: pytest.LogCaptureFixture,
) -> None:
    procs: list[_Proc] = []
    recycled: list[bool] = []

    def factory(slot: WorkerSlot) -> _Proc:
        procs.append(_Proc(slot.worker_id))  # its pid is ours: well over 1 MiB
        return procs[-1]

    async def scenario() -> None:
        model_settings = ModelSettings().merged({"workerMaxRssMb": 1})
        pool = WorkerPool(
            "m",
            "1",
            factory,
            lambda: model_settings,
            max_backoff=30.0,
            on_recycle=lambda: recycled.append(True),
        )
        slot = pool.add()
        await asyncio.wait_for(pool.wait_loaded(), 5)
        first = procs[0]
        first.state = WorkerState.BUSY
        pool.batch_finished(first)  # mid-batch (still BUSY): never recycled
        assert first.state is WorkerState.BUSY and not recycled
        first.state = WorkerState.READY
        pool.batch_finished(first)
        assert first.state is WorkerState.STOPPING  # takes no new batch from here on
        assert recycled == [True]
        await until(lambda: len(procs) >= 2 and procs[1].state is WorkerState.READY)
        assert first.stopped and slot.process is procs[1]
        assert slot.restarts == 0 and slot.crash_streak == 0  # not a crash
        await pool.stop()

    with caplog.at_level(logging.INFO, logger="serve.core.pool"):
        asyncio.run(scenario())
    assert any("over its cap of 1 MiB" in r.getMessage() for r in caplog.records)


def test_no_memory_cap_no_recycling() -> None:
    async def scenario() -> None:
        procs: list[_Proc] = []
        pool = _pool(_recording(procs))
        pool.add()
        await asyncio.wait_for(pool.wait_loaded(), 5)
        pool.batch_finished(procs[0])
        assert procs[0].state is WorkerState.READY
        await pool.stop()

    asyncio.run(scenario())


def test_a_crash_restarts_at_once_then_backs_off_in_a_loop() -> None:
    async def scenario() -> None:
        procs: list[_Proc] = []
        model_settings = ModelSettings()
        pool = WorkerPool(
            "m",
            "1",
            _recording(procs),
            lambda: model_settings,
            max_backoff=30.0,
            stable_after=60.0,
        )
        slot = pool.add()
        await asyncio.wait_for(pool.wait_loaded(), 5)
        procs[0].kill()  # first crash: replaced without delay
        await until(lambda: len(procs) >= 2 and procs[1].state is WorkerState.READY)
        procs[1].kill()  # second crash seconds later: a streak, 1 s back-off
        await until(lambda: slot.crash_streak >= 2)
        await asyncio.sleep(0.2)  # a tenth of the 1 s back-off: a restart now would be early
        assert len(procs) == 2, "restarted before its back-off"
        assert slot.restarts == 2
        await pool.stop()

    asyncio.run(scenario())


def test_a_crash_in_service_restarts_at_once_a_crash_loop_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool's clock is the test's: a worker's uptime is what the test says, not the load."""
    now = [0.0]

    async def scenario() -> None:
        procs: list[_Proc] = []
        model_settings = ModelSettings()
        pool = WorkerPool(
            "m",
            "1",
            _recording(procs),
            lambda: model_settings,
            max_backoff=30.0,
            stable_after=60.0,
            immediate_per_minute=2,
            clock=lambda: now[0],
        )
        slot = pool.add()
        await asyncio.wait_for(pool.wait_loaded(), 5)
        now[0] += 3.0  # READY for 3 s, never served: an isolated crash
        procs[0].kill()
        await until(lambda: len(procs) >= 2 and procs[1].state is WorkerState.READY)
        pool.batch_finished(procs[1])  # served a batch, then dies at once: still in service
        procs[1].kill()
        await until(lambda: len(procs) >= 3 and procs[2].state is WorkerState.READY)
        assert slot.crash_streak == 2
        pool.batch_finished(procs[2])  # in service, but the third in a minute: the limit
        procs[2].kill()
        await until(lambda: slot.crash_streak >= 3)
        # Waited a fifth of its 1 s back-off (the loop runs nothing else meanwhile): a restart
        # by now would have been immediate.
        await asyncio.sleep(0.2)
        assert len(procs) == 3, "restarted past the crash-rate limit without back-off"
        await until(lambda: len(procs) >= 4 and procs[3].state is WorkerState.READY, timeout=10)
        procs[3].kill()  # right after READY, unserved: a crash loop, 2 s back-off
        await until(lambda: slot.crash_streak >= 4)
        await asyncio.sleep(0.2)
        assert len(procs) == 4 and slot.restarts == 4
        await pool.stop()

    with caplog.at_level(logging.ERROR, logger="serve.core.pool"):
        asyncio.run(scenario())
    delays = [
        r.getMessage().split("restarting in ")[1]
        for r in caplog.records
        if "exited" in r.getMessage()
    ]
    assert delays == [
        "0 s (it crashed in service)",
        "0 s (it crashed in service)",
        "1 s (over 2 immediate restarts a minute)",
        "2 s (it died right after it became ready)",
    ]
