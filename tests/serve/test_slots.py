"""Slot placement: the rule as a table, then the one dispatcher with a many-at-once fake worker."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest

from serve.config import ModelSettings
from serve.core.dispatcher import Dispatcher
from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, Job, WorkerState, next_state
from serve.core.placement import WorkerView
from serve.core.slots import SlotPlacement, plan_slots
from serve.wire.errors import WorkerDied


@pytest.mark.parametrize(
    ("waiting", "free", "expected"),
    [
        (0, [("w0", 4)], []),
        (3, [], []),
        (3, [("w0", 0)], []),  # all its slots taken: the requests wait
        (2, [("w0", 4)], ["w0", "w0"]),
        (5, [("w0", 2)], ["w0", "w0"]),  # no more than its free slots
        # spread: each to the worker with the most free slots, the first of equals
        (4, [("w0", 2), ("w1", 2)], ["w0", "w1", "w0", "w1"]),
        (3, [("w0", 1), ("w1", 3)], ["w1", "w1", "w0"]),
        (2, [("w0", 0), ("w1", 1), ("w2", 1)], ["w1", "w2"]),
    ],
)
def test_plan_slots(waiting: int, free: list[tuple[str, int]], expected: list[str]) -> None:
    assert plan_slots(waiting, free) == expected


_ids = itertools.count()


def _job() -> Job:
    future: asyncio.Future[ItemResult] = asyncio.get_running_loop().create_future()
    return Job(BatchItem(f"r{next(_ids)}", {}, []), future, 0.0, 1e9)


def test_a_busy_worker_with_free_slots_is_offered_work_and_a_full_one_is_not() -> None:
    async def scenario() -> None:
        placement = SlotPlacement(100, slots=3)
        for job in [_job() for _ in range(4)]:
            placement.admit(job)
        settings = ModelSettings()
        views = [
            WorkerView("w0", WorkerState.READY, running=2),  # one slot left
            WorkerView("w1", WorkerState.BUSY, running=3),  # full
            WorkerView("w2", WorkerState.STOPPING, running=0),  # leaving: nothing
        ]
        plan = placement.plan(views, 0.0, settings)
        assert [(w, len(jobs)) for w, jobs in plan.batches] == [("w0", 1)]
        assert placement.live_count() == 3

    asyncio.run(scenario())


class ManyAtOnce:
    """A worker that runs every request it is sent side by side, until the test ends each."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.state = WorkerState.READY
        self.running: dict[str, asyncio.Future[BatchOutcome]] = {}
        self.most = 0  # the most it ran at once

    def change_state(self, wanted: WorkerState) -> bool:
        self.state = next_state(self.state, wanted)
        return self.state is wanted

    async def run_batch(
        self,
        items: list[BatchItem],
        on_partial: Callable[[list[ItemResult]], None] | None = None,
    ) -> BatchOutcome:
        assert len(items) == 1, "each request is a batch of its own"
        future: asyncio.Future[BatchOutcome] = asyncio.get_running_loop().create_future()
        rid = items[0].request_id
        self.running[rid] = future
        self.most = max(self.most, len(self.running))
        if on_partial is not None:
            on_partial([ItemResult(200, b"first part", None)])
        try:
            return await future
        finally:
            self.running.pop(rid, None)

    def end(self, rid: str) -> None:
        self.running[rid].set_result(BatchOutcome([ItemResult(200, rid.encode(), None)], {}, []))

    def kill(self) -> None:
        self.state = WorkerState.DEAD
        for future in self.running.values():
            future.set_exception(WorkerDied("gone"))


class Pool:
    def __init__(self, *workers: ManyAtOnce) -> None:
        self._workers = list(workers)

    def workers(self) -> list[ManyAtOnce]:
        return self._workers

    def can_serve(self) -> bool:
        return True

    def batch_finished(self, worker: object) -> None:
        pass


async def until(condition: Callable[[], bool]) -> None:
    async def holds() -> None:
        while not condition():
            await asyncio.sleep(0)

    await asyncio.wait_for(holds(), 5)


def make(*workers: ManyAtOnce, slots: int) -> Dispatcher:
    settings = ModelSettings().merged({"batch_size": 8, "max_batch_delay": 100})
    return Dispatcher("m", "1", Pool(*workers), lambda: settings, SlotPlacement(100, slots))


def test_the_dispatcher_keeps_a_busy_worker_fed_up_to_its_slots_and_an_end_frees_one() -> None:
    async def scenario() -> None:
        w = ManyAtOnce("w0")
        d = make(w, slots=3)
        futures = [d.submit(BatchItem(f"r{i}", {}, [])) for i in range(5)]
        await until(lambda: len(w.running) == 3)
        assert w.state is WorkerState.BUSY and d.queue.live_count() == 2
        first = await futures[0]  # a streamed answer: its first part came at once
        assert first.body == b"first part" and first.stream is not None
        w.end("r1")
        await until(lambda: "r3" in w.running)  # r1's slot went to the next one waiting
        assert set(w.running) == {"r0", "r2", "r3"} and w.state is WorkerState.BUSY
        for rid in ("r0", "r2", "r3"):
            w.end(rid)
        await until(lambda: "r4" in w.running)
        assert w.state is WorkerState.READY  # one running, two slots free
        w.end("r4")
        assert (await futures[4]).body == b"first part"
        await until(lambda: d.in_flight == 0)
        assert w.most == 3 and w.state is WorkerState.READY

    asyncio.run(scenario())


def test_requests_spread_over_workers_by_free_slots() -> None:
    async def scenario() -> None:
        a, b = ManyAtOnce("a"), ManyAtOnce("b")
        d = make(a, b, slots=2)
        for i in range(5):
            d.submit(BatchItem(f"r{i}", {}, []))
        await until(lambda: len(a.running) + len(b.running) == 4)
        assert len(a.running) == len(b.running) == 2 and d.queue.live_count() == 1
        ended = 0
        while ended < 5:  # end all five, so that no batch task outlives the loop
            for w in (a, b):
                for rid in list(w.running):
                    w.end(rid)
                    ended += 1
            await asyncio.sleep(0)
        await until(lambda: not a.running and not b.running)

    asyncio.run(scenario())


def test_a_streamed_request_on_a_worker_that_dies_ends_with_an_error_not_a_retry() -> None:
    async def scenario() -> None:
        a, b = ManyAtOnce("a"), ManyAtOnce("b")
        d = make(a, b, slots=1)
        first = await d.submit(BatchItem("r0", {}, []))
        assert first.stream is not None
        dead = a if "r0" in a.running else b
        dead.kill()
        assert isinstance(await asyncio.wait_for(first.stream.get(), 5), WorkerDied)
        assert await first.stream.get() is None
        assert "r0" not in a.running and "r0" not in b.running

    asyncio.run(scenario())
