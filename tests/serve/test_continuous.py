"""Plain continuous batching: the settings, the rule as a table, the dispatcher with a step fake."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from serve.config import ModelSettings
from serve.core.continuous import (
    STREAM_NEXT_HEADER,
    ContinuousPlacement,
    goes_on,
    plan_continuous,
)
from serve.core.dispatcher import Dispatcher, Worker
from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, Job, WorkerState, next_state
from serve.core.placement import WorkerView
from serve.core.sequences import SequenceSettings, check_supported_settings, make_dispatcher
from serve.wire.errors import GatewayTimeout, ServeError, ShuttingDown, WorkerDied

# ----- settings --------------------------------------------------------------------------------


def test_continuous_batching_alone_is_accepted_and_picks_the_continuous_placement() -> None:
    check_supported_settings({"continuousBatching": True})
    settings = SequenceSettings.from_config({"continuousBatching": "true"}, 4, 2)
    assert settings == SequenceSettings(continuous=True)  # no sequences: all else 0
    assert not SequenceSettings.from_config({"continuousBatching": False}, 4, 2).continuous
    model = ModelSettings(batch_size=4, job_queue_size=7)
    d = make_dispatcher("m", "1", Pool([]), lambda: model, settings)
    assert isinstance(d.placement, ContinuousPlacement) and d.queue.capacity == 7
    plain = make_dispatcher("m", "1", Pool([]), lambda: model, SequenceSettings())
    assert not isinstance(plain.placement, ContinuousPlacement)


def test_only_stream_next_true_carries_a_request() -> None:
    assert goes_on({"ts_stream_next": "true"}) and goes_on({"TS_Stream_Next": " True "})
    assert not goes_on({"ts_stream_next": "false"}) and not goes_on({})


# ----- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("waiting", "free", "busy", "age", "expected"),
    [
        (0, [], 0, 0.0, ({}, 0.0)),
        (0, [("w0", 0)], 0, 0.0, ({}, 0.0)),
        (3, [], 1, 0.0, ({}, 0.0)),  # no free worker: wait for one to settle
        (2, [("w0", 0)], 0, 0.0, ({"w0": 2}, 0.0)),  # idle model: at once
        (6, [("w0", 0)], 0, 0.0, ({"w0": 4}, 0.0)),  # at most batch_size
        (2, [("w0", 0)], 1, 0.002, ({}, 0.008)),  # nothing carried, another busy: let it fill
        (2, [("w0", 0)], 1, 0.02, ({"w0": 2}, 0.0)),  # ... never past max_delay
        # a worker with carried requests steps now, new ones or not, the delay never applies
        (0, [("w0", 2)], 1, 0.0, ({"w0": 0}, 0.0)),
        (1, [("w0", 2)], 1, 0.0, ({"w0": 1}, 0.0)),
        (5, [("w0", 3)], 0, 0.0, ({"w0": 1}, 0.0)),  # carried + new <= batch_size
        (3, [("w0", 4)], 0, 0.0, ({"w0": 0}, 0.0)),  # full: the new ones wait
        # new requests to the most room first: the idle worker before the stepping one
        (3, [("w0", 2), ("w1", 0)], 0, 0.0, ({"w0": 1, "w1": 2}, 0.0)),
        (1, [("w0", 2), ("w1", 0)], 0, 0.0, ({"w0": 0, "w1": 1}, 0.0)),
        (4, [("w0", 0), ("w1", 0)], 0, 0.0, ({"w0": 2, "w1": 2}, 0.0)),
    ],
)
def test_plan_continuous(
    waiting: int,
    free: list[tuple[str, int]],
    busy: int,
    age: float,
    expected: tuple[dict[str, int], float],
) -> None:
    sizes, wait = plan_continuous(waiting, free, busy, 4, age, 0.01)
    assert (sizes, round(wait, 6)) == expected


# ----- the dispatcher, with workers that step when the test says -------------------------------


def in_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test in a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


class Stepper:
    """A TorchServe-style continuous-batching worker: each batch is one step, held until `step`.

    A new request's body is how many parts its answer has; every step answers each request in
    the batch with its parts so far, marked ``ts_stream_next: true`` until the last. A carried
    request comes with no input and is known by its id (the handler's ``context.cache``).
    """

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.state = WorkerState.READY
        self.batches: list[list[str]] = []
        self.inputs: list[list[bool]] = []  # per batch, per item: did it carry input
        self.cache: dict[str, list[int]] = {}  # request id -> [parts, sent]
        self._step: asyncio.Future[None] | None = None

    def change_state(self, wanted: WorkerState) -> bool:
        self.state = next_state(self.state, wanted)
        return self.state is wanted

    def kill(self) -> None:
        self.state = WorkerState.DEAD

    async def run_batch(self, items: list[BatchItem], on_partial: Any = None) -> BatchOutcome:
        if self.state is WorkerState.DEAD:
            raise WorkerDied(f"Worker {self.worker_id} is not running.")
        self.batches.append([it.request_id for it in items])
        self.inputs.append([bool(it.params) for it in items])
        self._step = asyncio.get_running_loop().create_future()
        await self._step
        results: list[ItemResult | ServeError] = []
        for it in items:
            if it.params:
                self.cache[it.request_id] = [int(it.params[0][2]), 0]
            state = self.cache[it.request_id]
            state[1] += 1
            more = state[1] < state[0]
            headers = {STREAM_NEXT_HEADER: "true" if more else "false"}
            results.append(ItemResult(200, f"{it.request_id}:{state[1]}".encode(), None, headers))
            if not more:
                del self.cache[it.request_id]
        return BatchOutcome(results, {}, [])

    async def step(self) -> None:
        """Let the step in hand finish, and wait until the next one (if any) has begun."""
        await until(lambda: self._step is not None and not self._step.done())
        assert self._step is not None
        self._step.set_result(None)
        await asyncio.sleep(0)

    def die(self) -> None:
        self.state = WorkerState.DEAD
        if self._step is not None and not self._step.done():
            self._step.set_exception(WorkerDied(f"Worker {self.worker_id} died."))


class Pool:
    def __init__(self, workers: list[Stepper]) -> None:
        self.workers_ = workers

    def workers(self) -> list[Worker]:
        return list(self.workers_)

    def can_serve(self) -> bool:
        return True

    def batch_finished(self, worker: Worker) -> None:
        pass


async def until(condition: Callable[[], object], seconds: float = 5.0) -> None:
    """Let the loop run until ``condition()`` holds; fail after ``seconds`` (a hang guard)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


def make(workers: list[Stepper], batch_size: int = 3, delay: int = 0) -> Dispatcher:
    settings = ModelSettings(batch_size=batch_size, max_batch_delay=delay)
    placement = ContinuousPlacement(100)
    return Dispatcher("m", "1", Pool(workers), lambda: settings, placement)


def item(rid: str, parts: int) -> BatchItem:
    return BatchItem(rid, {}, [("body", None, str(parts).encode())])


async def parts(answer: asyncio.Future[ItemResult]) -> list[bytes | ServeError]:
    """Every part of a (perhaps streamed) answer, its last one or error included."""
    first = await asyncio.wait_for(answer, 5)
    out: list[bytes | ServeError] = [first.body]
    if first.stream is not None:
        while (nxt := await asyncio.wait_for(first.stream.get(), 5)) is not None:
            out.append(nxt if isinstance(nxt, ServeError) else nxt.body)
    return out


@in_loop
async def test_late_requests_join_the_next_step_and_finished_ones_leave() -> None:
    w = Stepper("w0")
    d = make([w], batch_size=3)
    a = d.submit(item("a", 3))
    await until(lambda: w.batches)
    b, c, late = d.submit(item("b", 1)), d.submit(item("c", 2)), d.submit(item("d", 1))
    for _ in range(3):
        await w.step()
    assert w.batches == [
        ["a"],
        ["a", "b", "c"],  # b and c join a's second step; d waits: batchSize 3
        ["a", "c", "d"],  # b finished and left; d takes its place
    ]
    assert w.inputs == [[True], [False, True, True], [False, False, True]]  # carried: no input
    assert await parts(a) == [b"a:1", b"a:2", b"a:3"]
    assert await parts(b) == [b"b:1"] and await parts(c) == [b"c:1", b"c:2"]
    assert await parts(late) == [b"d:1"]
    first = a.result()
    assert first.stream is not None and first.headers[STREAM_NEXT_HEADER] == "true"
    assert not d.placement.carried.waiting and not w.cache  # type: ignore[attr-defined]


@in_loop
async def test_requests_spread_over_free_workers_and_each_keeps_its_own() -> None:
    w0, w1 = Stepper("w0"), Stepper("w1")
    d = make([w0, w1], batch_size=2)
    answers = [d.submit(item(f"r{i}", 2)) for i in range(4)]
    await until(lambda: w0.batches and w1.batches)
    assert (w0.batches, w1.batches) == ([["r0", "r1"]], [["r2", "r3"]])
    late = d.submit(item("late", 1))
    await w0.step()
    await w1.step()
    await until(lambda: len(w0.batches) == 2 and len(w1.batches) == 2)
    assert (w0.batches[1], w1.batches[1]) == (["r0", "r1"], ["r2", "r3"])  # both full: late waits
    await w0.step()
    await until(lambda: len(w0.batches) == 3)
    assert w0.batches[2] == ["late"]
    await w0.step()
    await w1.step()
    assert [len(await parts(f)) for f in answers] == [2, 2, 2, 2]
    assert await parts(late) == [b"late:1"]


@in_loop
async def test_a_carried_request_fails_when_its_worker_dies_and_a_first_step_one_retries() -> None:
    w0, w1 = Stepper("w0"), Stepper("w1")
    w1.state = WorkerState.STARTING  # not yet in service: everything goes to w0
    d = make([w0, w1], batch_size=2)
    long = d.submit(item("long", 5))
    await until(lambda: w0.batches)
    await w0.step()  # long is carried now
    fresh = d.submit(item("fresh", 1))
    await until(lambda: len(w0.batches) == 2)
    assert w0.batches[1] == ["long", "fresh"]
    w1.state = WorkerState.READY
    w0.die()
    chunks = await parts(long)
    assert chunks[0] == b"long:1" and isinstance(chunks[-1], WorkerDied)
    assert "unfinished answer was lost" in chunks[-1].message
    await until(lambda: w1.batches)
    assert w1.batches == [["fresh"]]  # no part of its answer had gone: tried once more
    await w1.step()
    assert await parts(fresh) == [b"fresh:1"]


@in_loop
async def test_carried_requests_fail_when_their_worker_leaves_between_steps() -> None:
    w = Stepper("w0")
    d = make([w])
    answer = d.submit(item("a", 10))
    await until(lambda: w.batches)
    w.state = WorkerState.STOPPING  # its next step is never planned: it is out of service
    await w.step()
    d.schedule()
    chunks = await parts(answer)
    assert isinstance(chunks[-1], WorkerDied) and "left before request a" in chunks[-1].message
    assert not d.placement.carried.waiting  # type: ignore[attr-defined]


@in_loop
async def test_a_carried_request_on_a_batch_that_was_never_sent_fails_fresh_ones_go_back() -> None:
    placement = ContinuousPlacement(10)
    loop = asyncio.get_running_loop()
    carried, fresh = (
        d_job(item("c", 3), loop.create_future()),
        d_job(item("f", 1), loop.create_future()),
    )
    placement.admit(carried)
    settings = ModelSettings(batch_size=2, max_batch_delay=0)
    [(worker, jobs)] = placement.plan([view("w0")], 0.0, settings).batches
    partial = ItemResult(200, b"c:1", None, {STREAM_NEXT_HEADER: "true"})
    placement.settle(worker, jobs, [partial])
    placement.admit(fresh)
    [(worker, jobs)] = placement.plan([view("w0")], 0.0, settings).batches
    assert jobs == [carried, fresh]
    placement.put_back(worker, jobs)  # the worker left before the send
    assert placement.live_count() == 1 and not fresh.done
    stream = carried.future.result().stream
    assert stream is not None
    error = await stream.get()
    assert isinstance(error, WorkerDied) and "Worker w0 left before request c" in error.message


@in_loop
async def test_a_request_answered_by_its_deadline_leaves_the_batch() -> None:
    w = Stepper("w0")
    d = make([w])
    answer = d.submit(item("slow", 5), timeout=0.01)
    await until(lambda: w.batches)
    with pytest.raises(GatewayTimeout):
        await answer  # before its first part
    other = d.submit(item("next", 1))
    await w.step()
    await until(lambda: len(w.batches) == 2)
    assert w.batches[1] == ["next"]  # the expired one is not sent again
    await w.step()
    assert await parts(other) == [b"next:1"]


@in_loop
async def test_drain_lets_carried_requests_end_then_cuts_the_rest() -> None:
    w = Stepper("w0")
    d = make([w])
    answer = d.submit(item("a", 1_000_000))
    await until(lambda: w.batches)

    async def keep_stepping() -> None:
        while True:
            await w.step()

    stepping = asyncio.create_task(keep_stepping())
    await d.drain(timeout=0.05)
    chunks = await parts(answer)
    stepping.cancel()
    assert isinstance(chunks[-1], ShuttingDown) and len(chunks) > 1
    assert not d.placement.carried.waiting  # type: ignore[attr-defined]


@in_loop
async def test_fail_waiting_answers_carried_requests_too() -> None:
    placement = ContinuousPlacement(10)
    job = d_job(item("c", 3), asyncio.get_running_loop().create_future())
    placement.admit(job)
    settings = ModelSettings(batch_size=2)
    [(worker, jobs)] = placement.plan([view("w0")], 0.0, settings).batches
    placement.settle(worker, jobs, [ItemResult(200, b"1", None, {STREAM_NEXT_HEADER: "true"})])
    placement.fail_waiting(ShuttingDown("bye"))
    stream = job.future.result().stream
    assert stream is not None and isinstance(await stream.get(), ShuttingDown)
    await asyncio.wait_for(placement.drain_carried(1), 1)  # nothing is held any more


def d_job(it: BatchItem, future: asyncio.Future[ItemResult]) -> Job:
    return Job(it, future, 0.0, 1e9)


def view(worker_id: str) -> WorkerView:
    return WorkerView(worker_id, WorkerState.READY)
