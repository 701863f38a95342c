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


@pytest.mark.parametrize(
    ("waiting", "free", "tokens", "need", "expected"),
    [
        # the cache budget binds before the slots: 1000 positions, 400 a request
        (4, [("w0", 4)], {"w0": 1000}, 400, ["w0", "w0"]),
        (1, [("w0", 4)], {"w0": 399}, 400, []),  # not even one fits: it waits
        (2, [("w0", 4)], {"w0": 400}, 400, ["w0"]),  # exactly one
        (3, [("w0", 1)], {"w0": 10_000}, 400, ["w0"]),  # the slots bind
        # a worker whose cache is full is passed over for one with room, even with more slots
        (2, [("w0", 4), ("w1", 1)], {"w0": 100, "w1": 500}, 400, ["w1"]),
        (3, [("w0", 3), ("w1", 3)], {"w0": 800, "w1": 400}, 400, ["w0", "w1", "w0"]),
        # a worker with no token budget (not in ``tokens``) counts slots only
        (3, [("w0", 2), ("w1", 2)], {"w1": 0}, 400, ["w0", "w0"]),
        (2, [("w0", 2)], None, 400, ["w0", "w0"]),
    ],
)
def test_plan_slots_with_a_cache_budget(
    waiting: int,
    free: list[tuple[str, int]],
    tokens: dict[str, int] | None,
    need: int,
    expected: list[str],
) -> None:
    assert plan_slots(waiting, free, tokens, need) == expected


@pytest.mark.parametrize(
    ("limits", "views", "expected"),
    [
        # 4096 positions over 8 slots: unreported requests count 512, 8 go to an idle worker
        ({"slots": 8, "max_cached_tokens": 4096, "max_model_len": 1024}, [(0, 0, 0)], 8),
        # two reported at 100 each, one not: 4096 - 200 - 512 = 3384 left: the 5 free slots
        ({"slots": 8, "max_cached_tokens": 4096, "max_model_len": 1024}, [(3, 200, 1)], 5),
        # reported reservations use up the budget: 4096 - 3700 = 396 < 512, none more
        ({"slots": 8, "max_cached_tokens": 4096, "max_model_len": 1024}, [(3, 3700, 0)], 0),
        # a context longer than the budget: still the fair share, 512 / 8 = 64 each
        ({"slots": 8, "max_cached_tokens": 512, "max_model_len": 2048}, [(0, 0, 0)], 8),
        ({"slots": 8, "max_cached_tokens": 512, "max_model_len": 2048}, [(1, 0, 1)], 7),
        # the burst the frontend refused with 429s on a GPU: 256 on 256 slots all go at once
        ({"slots": 256, "max_cached_tokens": 65536, "max_model_len": 2048}, [(0, 0, 0)], 256),
        # no token budget reported (an asyncCommunication worker): slots only
        ({"slots": 3}, [(1, 0, 1)], 2),
    ],
)
def test_slot_placement_counts_the_cache_budget_the_worker_reported(
    limits: dict[str, int], views: list[tuple[int, int, int]], expected: int
) -> None:
    async def scenario() -> None:
        placement = SlotPlacement(max(100, expected + 2))
        placement.learn(limits)
        for job in [_job() for _ in range(max(10, expected + 2))]:
            placement.admit(job)
        workers = [
            WorkerView("w0", WorkerState.READY, running, reserved, unreported)
            for running, reserved, unreported in views
        ]
        queued = placement.live_count()
        plan = placement.plan(workers, 0.0, ModelSettings())
        assert sum(len(jobs) for _, jobs in plan.batches) == expected
        assert placement.live_count() == queued - expected  # the rest wait in the queue

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("expected_need", "views", "sent"),
    [
        (None, (0, 0, 0), 8),  # no report yet: the fair share, 4096 / 8 slots
        (44, (0, 0, 0), 8),  # recent requests took 44: the burst goes at once (8 slots)
        (44, (6, 3800, 0), 2),  # 296 left: two more of 44 fit in the budget beside six reported
        (44, (6, 3800, 6), 0),  # six sent, unreported at 44 each: 4096 - 3800 - 264 < 44
        (600, (4, 2000, 0), 4),  # recent ones took more than the fair share: still 512 each
    ],
)
def test_unreported_requests_count_as_what_the_worker_recently_reserved(
    expected_need: int | None, views: tuple[int, int, int], sent: int
) -> None:
    async def scenario() -> None:
        placement = SlotPlacement(100)
        placement.learn({"slots": 8, "max_cached_tokens": 4096, "max_model_len": 1024})
        for job in [_job() for _ in range(10)]:
            placement.admit(job)
        running, reserved, unreported = views
        view = WorkerView("w0", WorkerState.READY, running, reserved, unreported, expected_need)
        plan = placement.plan([view], 0.0, ModelSettings())
        assert sum(len(jobs) for _, jobs in plan.batches) == min(sent, 8 - running)

    asyncio.run(scenario())


def test_plan_slots_takes_a_need_per_worker() -> None:
    free = [("a", 4), ("b", 4)]
    # a's requests count 100 of its 250, b's 10 of its 30: a takes 2, b takes 3
    assert sorted(plan_slots(8, free, {"a": 250, "b": 30}, {"a": 100, "b": 10})) == [
        "a", "a", "b", "b", "b",
    ]  # fmt: skip


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


class Reporting(ManyAtOnce):
    """A generative worker: it says each request's KV-cache reservation once it has it, as
    `WorkerProcess.reservations` does from the engine's ENGINE frames."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.reserved: dict[str, int] = {}

    def reservations(self) -> tuple[int, int]:
        return sum(self.reserved.values()), len(self.reserved)

    def end(self, rid: str) -> None:
        self.reserved.pop(rid, None)
        super().end(rid)


def test_requests_beyond_the_cache_budget_wait_in_the_queue_until_reservations_come() -> None:
    async def scenario() -> None:
        w = Reporting("w0")
        d = make(w, slots=4)
        assert isinstance(d.placement, SlotPlacement)
        d.placement.learn({"slots": 4, "max_cached_tokens": 1000, "max_model_len": 400})
        for i in range(6):
            d.submit(BatchItem(f"r{i}", {}, []))
        await until(lambda: len(w.running) == 4)  # 4 x 250 (the fair share) of 1000
        assert d.queue.live_count() == 2 and w.state is WorkerState.BUSY
        w.reserved.update(r0=300, r1=300, r2=300, r3=300)  # the engine says what they take
        d.schedule()  # (WorkerProcess.on_reservations)
        w.end("r0")  # a free slot, but 1000 - 900 = 100 < 250: r4 waits
        await until(lambda: "r0" not in w.running)
        for _ in range(3):  # the release schedules a dispatch with call_soon
            await asyncio.sleep(0)
        assert not d._dispatch_pending and d.queue.live_count() == 2
        w.end("r1")  # 1000 - 600 = 400: r4 goes, counted 250; 150 left is short for r5
        await until(lambda: "r4" in w.running)
        for _ in range(3):
            await asyncio.sleep(0)
        assert d.queue.live_count() == 1
        w.reserved.update(r4=100)  # r4 reported: 1000 - 700 = 300 >= 250
        d.schedule()
        await until(lambda: "r5" in w.running)
        for rid in list(w.running):
            w.end(rid)
        await until(lambda: d.in_flight == 0)

    asyncio.run(scenario())


def test_a_burst_as_large_as_the_slots_is_taken_whole_and_none_refused() -> None:
    """256 requests at once on a worker with 256 slots and 65,536 positions, before it reports
    any reservation, and a queue of 100: every one is sent to the worker (which queues what its
    cache cannot hold yet); none is refused."""

    async def scenario() -> None:
        w = Reporting("w0")
        settings = ModelSettings().merged({"batch_size": 256, "max_batch_delay": 0})
        d = Dispatcher("m", "1", Pool(w), lambda: settings, SlotPlacement(100, 256))
        assert isinstance(d.placement, SlotPlacement)
        d.placement.learn({"slots": 256, "max_cached_tokens": 65536, "max_model_len": 2048})
        futures = [d.submit(BatchItem(f"r{i}", {}, [])) for i in range(256)]
        await until(lambda: len(w.running) == 256)
        answers = await asyncio.gather(*futures, return_exceptions=True)
        assert not [a for a in answers if isinstance(a, BaseException)]
        for rid in list(w.running):
            w.end(rid)
        await until(lambda: d.in_flight == 0)

    asyncio.run(scenario())
