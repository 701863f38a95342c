"""Sequence batching: the settings, the placement policy (a table) and the dispatcher with fakes."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from serve.config import ModelSettings
from serve.core.dispatcher import Dispatcher, Worker
from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, Job, WorkerState, next_state
from serve.core.sequences import (
    SEQUENCE_END_HEADER,
    SEQUENCE_ID_HEADER,
    SEQUENCE_START_HEADER,
    STREAM_NEXT_HEADER,
    SequencePlacement,
    SequenceSettings,
    SequenceTable,
    SequenceView,
    check_supported_settings,
    plan_sequence_batches,
)
from serve.wire.errors import (
    BadRequest,
    Conflict,
    GatewayTimeout,
    ServeError,
    ShuttingDown,
    TooManyRequests,
    WorkerDied,
)
from serve.worker.main import mark_stream_next

# ----- settings -------------------------------------------------------------------------------


def test_settings_follow_torchserve_rules() -> None:
    yaml = {
        "sequenceBatching": True,
        "maxNumSequence": 4,
        "sequenceMaxIdleMSec": 10,
        "maxSequenceJobQueueSize": 10,
    }
    s = SequenceSettings.from_config(yaml, batch_size=4, max_workers=2)
    assert s == SequenceSettings(True, 8, 10, 10, 0)  # maxNumSequence >= batchSize x maxWorkers
    assert SequenceSettings.from_config({}, 4, 2) == SequenceSettings()  # all 0, as describe shows
    assert SequenceSettings.from_config(
        {"sequenceBatching": "true", "sequenceMaxIdleMSec": 5}, 1, 1
    )


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        (
            {
                "sequenceBatching": True,
                "sequenceMaxIdleMSec": 9,
                "continuousBatching": True,
                "useJobTicket": True,
            },
            "useJobTicket",
        ),  # fmt: skip
        ({"useJobTicket": True}, "useJobTicket"),
        ({"sequenceBatching": True}, "sequenceMaxIdleMSec > 0"),
        ({"sequenceBatching": True, "sequenceMaxIdleMSec": -1}, "cannot be negative"),
        ({"maxNumSequence": "many"}, "whole number"),
        ({"maxSequenceJobQueueSize": 2.5}, "whole number"),
    ],
)
def test_unsupported_or_broken_settings_are_refused(yaml: dict, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        check_supported_settings(yaml)


def test_settings_that_are_off_pass() -> None:
    check_supported_settings({"continuousBatching": False, "useJobTicket": "false"})


def test_sequence_continuous_batching_is_accepted() -> None:
    yaml = {"sequenceBatching": True, "sequenceMaxIdleMSec": 9, "continuousBatching": "true"}
    s = SequenceSettings.from_config(yaml, batch_size=4, max_workers=2)
    assert s.enabled and s.continuous
    assert not SequenceSettings.from_config({**yaml, "continuousBatching": False}, 4, 2).continuous


# ----- the placement policy ----------------------------------------------------------------------


def v(seq: str, worker: str | None = None, ready: bool = True) -> SequenceView:
    return SequenceView(seq, worker, ready)


@pytest.mark.parametrize(
    ("sequences", "free", "live", "batch", "expected"),
    [
        # nothing ready, nothing to do
        ([v("a", ready=False)], ["w0"], ["w0"], 4, {}),
        # new sequences spread over free workers by how many each already holds
        ([v("a"), v("b"), v("c")], ["w0", "w1"], ["w0", "w1"], 4, {"w0": ["a", "c"], "w1": ["b"]}),
        ([v("x", "w0", False), v("a"), v("b")], ["w0", "w1"], ["w0", "w1"], 4,
         {"w1": ["a"], "w0": ["b"]}),
        # a bound sequence waits for its own worker, even when another is free
        ([v("a", "w0")], ["w1"], ["w0", "w1"], 4, {}),
        ([v("a", "w0"), v("b", "w1")], ["w0", "w1"], ["w0", "w1"], 4, {"w0": ["a"], "w1": ["b"]}),
        # a sequence whose worker left service is rebound
        ([v("a", "gone")], ["w1"], ["w1"], 4, {"w1": ["a"]}),
        # at most batch_size sequences per worker, oldest first
        ([v("a"), v("b"), v("c")], ["w0"], ["w0"], 2, {"w0": ["a", "b"]}),
        ([v("a", "w0"), v("b", "w0"), v("c", "w0")], ["w0"], ["w0"], 2, {"w0": ["a", "b"]}),
        # a busy worker's sequences and new ones: new ones go to the free worker
        ([v("a", "w0"), v("b")], ["w1"], ["w0", "w1"], 4, {"w1": ["b"]}),
    ],
)  # fmt: skip
def test_plan_sequence_batches(
    sequences: list[SequenceView],
    free: list[str],
    live: list[str],
    batch: int,
    expected: dict[str, list[str]],
) -> None:
    assert plan_sequence_batches(sequences, free, live, batch) == expected


@pytest.mark.parametrize(
    ("sequences", "free", "carried", "batch", "expected"),
    [
        # continuous: a worker takes 2 x batch_size requests, carried ones included
        ([v("a"), v("b"), v("c")], ["w0"], {}, 1, {"w0": ["a", "b"]}),
        ([v("a"), v("b"), v("c")], ["w0"], {"w0": 1}, 1, {"w0": ["a"]}),
        ([v("a"), v("b")], ["w0"], {"w0": 2}, 1, {"w0": []}),
        # a free worker with carried requests runs even with nothing new
        ([v("a", "w0", False)], ["w0"], {"w0": 1}, 4, {"w0": []}),
        # a busy worker's carried requests wait for it; new sequences go to the free one
        ([v("a", "w0"), v("b")], ["w1"], {"w0": 3}, 4, {"w1": ["b"]}),
        # still one new request per sequence per batch
        ([v("a", "w0")], ["w0"], {"w0": 1}, 4, {"w0": ["a"]}),
    ],
)  # fmt: skip
def test_plan_sequence_batches_continuous(
    sequences: list[SequenceView],
    free: list[str],
    carried: dict[str, int],
    batch: int,
    expected: dict[str, list[str]],
) -> None:
    assert plan_sequence_batches(sequences, free, ["w0", "w1"], batch, carried) == expected


# ----- the dispatcher, with fake workers ---------------------------------------------------------


def in_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test in a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


class FakeWorker:
    """Runs a batch by calling ``behaviour``; records what it ran."""

    def __init__(self, worker_id: str, behaviour: Callable[[FakeWorker, list[BatchItem]], list]):
        self.worker_id = worker_id
        self.state = WorkerState.READY
        self.behaviour = behaviour
        self.batches: list[list[str]] = []
        self.gate: asyncio.Event | None = None

    async def run_batch(self, items: list[BatchItem], on_partial=None) -> BatchOutcome:
        self.batches.append([i.request_id for i in items])
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        results = self.behaviour(self, items)
        return BatchOutcome(results, {}, [])

    def change_state(self, wanted: WorkerState) -> bool:
        self.state = next_state(self.state, wanted)
        return self.state is wanted

    def kill(self) -> None:
        self.state = WorkerState.DEAD


class FakePool:
    def __init__(self, workers: list[FakeWorker]) -> None:
        self._workers = workers

    def workers(self) -> list[Worker]:
        return list(self._workers)

    def can_serve(self) -> bool:
        return True

    def batch_finished(self, worker: Worker) -> None:
        pass


def summing(state: dict[str, int]) -> Callable[[FakeWorker, list[BatchItem]], list]:
    """A stateful handler keyed by sequence id, per worker (like the TorchServe example)."""

    def run(worker: FakeWorker, items: list[BatchItem]) -> list:
        out = []
        for item in items:
            key = f"{worker.worker_id}/{item.headers[SEQUENCE_ID_HEADER]}"
            state[key] = state.get(key, 0) + int(item.params[0][2])
            out.append(ItemResult(200, str(state[key]).encode(), "text/plain"))
        return out

    return run


async def until(condition: Callable[[], object], seconds: float = 2.0) -> None:
    """Let the loop run until ``condition()`` holds; fail after ``seconds`` (a hang guard)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


class SequenceDispatcher(Dispatcher):
    """The one dispatcher with sequence placement, and a short way to its state for the tests."""

    placement: SequencePlacement

    @property
    def table(self) -> SequenceTable:
        return self.placement.table

    @property
    def _carried(self) -> dict[str, list[Job]]:
        return self.placement.carried.waiting


def make(workers: list[FakeWorker], **yaml: object) -> SequenceDispatcher:
    settings = ModelSettings(batch_size=4, max_batch_delay=10)
    config = {"sequenceBatching": True, "sequenceMaxIdleMSec": 60_000, **yaml}
    sequences = SequenceSettings.from_config(config, 4, len(workers))
    placement = SequencePlacement(sequences)
    return SequenceDispatcher("m", "1", FakePool(workers), lambda: settings, placement)


def item(rid: str, value: int, seq: str | None = None) -> BatchItem:
    headers = {SEQUENCE_ID_HEADER: seq} if seq else {}
    return BatchItem(rid, headers, [("body", None, str(value).encode())])


@in_loop
async def test_pipelined_requests_of_a_sequence_run_in_order_on_one_worker() -> None:
    state: dict[str, int] = {}
    workers = [FakeWorker("w0", summing(state)), FakeWorker("w1", summing(state))]
    d = make(workers, maxSequenceJobQueueSize=10)
    futures = [d.submit(item(f"{s}{i}", 1, s)) for i in range(5) for s in ("a", "b")]
    results = await asyncio.gather(*futures)
    by_seq: dict[str, list[int]] = {"a": [], "b": []}
    for future_item, result in zip([f"{s}" for i in range(5) for s in "ab"], results, strict=True):
        by_seq[future_item].append(int(result.body))
    assert by_seq == {"a": [1, 2, 3, 4, 5], "b": [1, 2, 3, 4, 5]}  # in submission order
    for w in workers:
        seen = {rid[0] for batch in w.batches for rid in batch}
        assert len(seen) <= 1  # each sequence stayed on one worker
        for batch in w.batches:  # never two requests of one sequence in a batch
            assert len({rid[0] for rid in batch}) == len(batch)
    assert {k.split("/")[1] for k in state} == {"a", "b"} and len(state) == 2


@in_loop
async def test_a_sequence_waits_for_its_busy_worker_rather_than_move() -> None:
    state: dict[str, int] = {}
    w0, w1 = FakeWorker("w0", summing(state)), FakeWorker("w1", summing(state))
    d = make([w0, w1])
    assert (await d.submit(item("a1", 1, "a"))).body == b"1"  # a -> w0
    assert (await d.submit(item("b1", 1, "b"))).body == b"1"  # b -> w1 (fewest sequences)
    assert (await d.submit(item("c1", 1, "c"))).body == b"1"  # c -> w0 (a tie: the first)
    w0.gate = asyncio.Event()
    c2 = d.submit(item("c2", 1, "c"))
    await until(lambda: ["c2"] in w0.batches)  # w0 is busy with c; w1 is free
    a2 = d.submit(item("a2", 1, "a"))
    w0.gate.set()
    assert (await a2).body == b"2"  # ran on w0, where a's state is
    assert (await c2).body == b"2"
    assert all("a2" not in batch for batch in w1.batches)


@in_loop
async def test_requests_without_an_id_get_a_fresh_one_each_and_it_is_returned() -> None:
    state: dict[str, int] = {}
    d = make([FakeWorker("w0", summing(state))])
    first, second = d.submit(item("r1", 1)), d.submit(item("r2", 10))
    one, two = await first, await second
    assert (one.body, two.body) == (b"1", b"10")  # not 11: separate state
    a, b = one.headers[SEQUENCE_ID_HEADER], two.headers[SEQUENCE_ID_HEADER]
    assert a != b and a.startswith("ts-seq-")
    again = await d.submit(item("r3", 2, a))
    assert (again.body, again.headers[SEQUENCE_ID_HEADER]) == (b"3", a)


@in_loop
async def test_the_handler_sees_the_start_flag_only_on_a_server_named_sequence() -> None:
    seen: list[dict[str, str]] = []

    def record(worker: FakeWorker, items: list[BatchItem]) -> list:
        seen.extend(dict(i.headers) for i in items)
        return [ItemResult(200, b"", None) for _ in items]

    d = make([FakeWorker("w0", record)])
    await d.submit(item("r1", 1))
    await d.submit(item("r2", 1, "mine"))
    assert seen[0][SEQUENCE_START_HEADER] == "true"
    assert SEQUENCE_START_HEADER not in seen[1] and seen[1][SEQUENCE_ID_HEADER] == "mine"


@in_loop
async def test_too_many_sequences_or_a_full_sequence_queue_answer_429() -> None:
    w = FakeWorker("w0", summing({}))
    w.gate = asyncio.Event()  # hold the first batch so that requests pile up
    d = make([w], maxNumSequence=1, maxSequenceJobQueueSize=2)  # effective maxNumSequence 4
    futures = [d.submit(item(f"s{i}", 1, f"s{i}")) for i in range(4)]
    with pytest.raises(TooManyRequests, match="maxNumSequence"):
        d.submit(item("s4", 1, "s4"))
    await until(lambda: w.batches)  # all four sequences run (held at the gate)
    futures += [d.submit(item("x", 1, "s0")) for _ in range(2)]  # s0: one running, two queued
    with pytest.raises(TooManyRequests, match="maxSequenceJobQueueSize"):
        d.submit(item("y", 1, "s0"))
    w.gate.set()
    assert len(await asyncio.gather(*futures)) == 6


@in_loop
async def test_a_request_on_a_dead_worker_is_not_retried_elsewhere() -> None:
    def die(worker: FakeWorker, items: list[BatchItem]) -> list:
        raise WorkerDied("gone")

    healthy = FakeWorker("w1", summing({}))
    dying = FakeWorker("w0", die)
    d = make([dying, healthy])
    with pytest.raises(WorkerDied, match="state was lost"):
        await d.submit(item("r1", 1, "seq"))
    assert healthy.batches == []


@in_loop
async def test_an_idle_sequence_closes_after_sequence_max_idle() -> None:
    d = make([FakeWorker("w0", summing({}))], sequenceMaxIdleMSec=20)
    await d.submit(item("r1", 1, "seq"))
    assert "seq" in d.table
    await until(lambda: "seq" not in d.table, seconds=2.0)  # a 20 ms timer; 2 s: does not hang


@in_loop
async def test_a_sequence_whose_requests_all_expired_closes_too() -> None:
    w = FakeWorker("w0", summing({}))
    w.gate = asyncio.Event()
    d = make([w], sequenceMaxIdleMSec=20, maxNumSequence=0, maxSequenceJobQueueSize=2)
    first = d.submit(item("r0", 1, "other"))  # holds the only worker
    await until(lambda: w.batches)
    late = d.submit(item("r1", 1, "seq"), timeout=0.01)  # expires in the queue
    with pytest.raises(GatewayTimeout):
        await late
    await until(lambda: "seq" not in d.table)  # closed by its idle clock, never having run
    w.gate.set()
    await first


@in_loop
async def test_a_job_put_back_goes_first_in_its_sequence() -> None:
    w = FakeWorker("w0", summing({}))
    w.gate = asyncio.Event()
    d = make([w], maxSequenceJobQueueSize=3)
    first = d.submit(item("r1", 1, "seq"))
    await until(lambda: w.batches)
    second = d.submit(item("r2", 2, "seq"))
    [job] = [j for j in d.table._open["seq"].jobs]
    d.table._open["seq"].jobs.clear()
    d.table.put(job, front=True)  # what the dispatcher does with a batch it could not send
    assert d.queue.live_count() == 1
    w.gate.set()
    assert ((await first).body, (await second).body) == (b"1", b"3")


@in_loop
async def test_drain_answers_what_waits_in_sequences() -> None:
    w = FakeWorker("w0", summing({}))
    w.gate = asyncio.Event()
    d = make([w], maxSequenceJobQueueSize=2)
    running = d.submit(item("r1", 1, "seq"))
    waiting = d.submit(item("r2", 1, "seq"))
    await until(lambda: w.batches)
    assert d.queue.live_count() == 1 and len(d.queue) == 1
    d.fail_queued(BadRequest("stop"))
    with pytest.raises(BadRequest):
        await waiting
    w.gate.set()
    assert (await running).body == b"1"


# ----- sequence continuous batching, with fake workers --------------------------------------------


def continuous_handler(steps: int) -> Callable[[FakeWorker, list[BatchItem]], list]:
    """A fake of TorchServe's sequence continuous batching example, per worker and sequence.

    A new request adds its number to the sequence's total. An odd number answers in ``steps``
    parts (``ts_stream_next: true`` until the last); -1 cancels the sequence's unfinished
    requests, which then answer b"stopped"; 0 answers the total and ends the sequence.
    """
    totals: dict[str, int] = {}
    left: dict[str, int] = {}  # request id -> parts still to send
    stopped: set[str] = set()

    def part(body: bytes, more: bool, **headers: str) -> ItemResult:
        if more:
            headers[STREAM_NEXT_HEADER] = "true"
        return ItemResult(200, body, "text/plain", headers)

    def run(worker: FakeWorker, items: list[BatchItem]) -> list:
        out = []
        for it in items:
            key = f"{worker.worker_id}/{it.headers[SEQUENCE_ID_HEADER]}"
            if not it.params:  # carried: the next part
                if it.request_id in stopped:
                    out.append(part(b"stopped", False))
                    continue
                left[it.request_id] -= 1
                out.append(part(str(totals[key]).encode(), left[it.request_id] > 0))
                continue
            value = int(it.params[0][2])
            if value == -1:
                stopped.update(r for r, n in left.items() if n > 0 and r.startswith(key[3:]))
                out.append(part(b"-1", False))
            elif value == 0:
                out.append(part(str(totals.get(key, 0)).encode(), False, **{
                    SEQUENCE_END_HEADER: it.headers[SEQUENCE_ID_HEADER]}))  # fmt: skip
            else:
                totals[key] = totals.get(key, 0) + value
                left[it.request_id] = steps if value % 2 else 0
                out.append(part(str(totals[key]).encode(), value % 2 == 1))
        return out

    return run


def make_continuous(workers: list[FakeWorker], **yaml: object) -> SequenceDispatcher:
    return make(workers, continuousBatching=True, **yaml)


async def drain_stream(result: ItemResult) -> list[bytes | ServeError]:
    """The first chunk and the rest of a streamed answer."""
    assert result.stream is not None, "not a streamed answer"
    out: list[bytes | ServeError] = [result.body]
    while (next_item := await asyncio.wait_for(result.stream.get(), 5)) is not None:
        out.append(next_item if isinstance(next_item, ServeError) else next_item.body)
    return out


@in_loop
async def test_continuous_partial_answers_stream_and_are_carried_with_no_input() -> None:
    w = FakeWorker("w0", continuous_handler(steps=3))
    d = make_continuous([w])
    first = await d.submit(item("a1", 5, "a"))
    assert first.headers[STREAM_NEXT_HEADER] == "true"
    assert first.headers[SEQUENCE_ID_HEADER] == "a"
    assert await drain_stream(first) == [b"5", b"5", b"5", b"5"]
    assert w.batches == [["a1"]] * 4  # the same request, four batches
    assert "a" in d.table and d.table._open["a"].running == 0


@in_loop
async def test_continuous_a_later_request_cancels_an_unfinished_one_on_its_worker() -> None:
    w0, w1 = FakeWorker("w0", continuous_handler(10_000)), FakeWorker("w1", summing({}))
    d = make_continuous([w0, w1], maxSequenceJobQueueSize=4)
    streaming = await d.submit(item("a1-long", 5, "a"))  # a partial answer: carried on w0
    cancel = await d.submit(item("a2-cancel", -1, "a"))  # joins w0 while a1 is carried
    assert cancel.body == b"-1" and cancel.stream is None
    chunks = await drain_stream(streaming)
    assert chunks[-1] == b"stopped" and len(chunks) < 10_000  # cut short, not run out
    assert any(batch == ["a1-long", "a2-cancel"] for batch in w0.batches)
    assert w1.batches == []  # the sequence never left its worker
    assert d.table._open["a"].running == 0  # the sequence stays open, free of work


@in_loop
async def test_continuous_sequences_stay_separate_and_in_order() -> None:
    workers = [FakeWorker("w0", continuous_handler(2)), FakeWorker("w1", continuous_handler(2))]
    d = make_continuous(workers, maxSequenceJobQueueSize=10)
    futures = {s: [d.submit(item(f"{s}{i}", 2 * (i + 1), s)) for i in range(4)] for s in "ab"}
    for s in "ab":
        results = [int((await f).body) for f in futures[s]]
        assert results == [2, 6, 12, 20]  # running totals in submission order
    for w in workers:
        assert len({rid[0] for batch in w.batches for rid in batch}) <= 1  # one worker each


@in_loop
async def test_continuous_sequence_end_header_closes_it_and_answers_what_waits() -> None:
    w = FakeWorker("w0", continuous_handler(2))
    w.gate = asyncio.Event()  # hold the first batch while the rest queue up
    d = make_continuous([w], maxSequenceJobQueueSize=4)
    start = d.submit(item("a1", 2, "a"))
    await until(lambda: w.batches)
    end, after = d.submit(item("a2", 0, "a")), d.submit(item("a3", 4, "a"))
    w.gate.set()
    assert (await start).body == b"2"
    ended = await end
    assert (ended.body, ended.headers[SEQUENCE_END_HEADER]) == (b"2", "a")
    with pytest.raises(Conflict, match="ended by the model's handler"):
        await after
    assert "a" not in d.table
    assert all("a3" not in batch for batch in w.batches)


@in_loop
async def test_continuous_carried_requests_fail_when_their_worker_dies() -> None:
    handler = continuous_handler(10_000)

    def dies_on_third(worker: FakeWorker, items: list[BatchItem]) -> list:
        if len(worker.batches) == 3:
            raise WorkerDied("gone")
        return handler(worker, items)

    d = make_continuous([FakeWorker("w0", dies_on_third)])
    chunks = await drain_stream(await d.submit(item("a1", 5, "a")))
    assert chunks[:2] == [b"5", b"5"]
    assert isinstance(chunks[-1], WorkerDied) and "state was lost" in chunks[-1].message
    assert d.table._open["a"].running == 0


@in_loop
async def test_continuous_carried_requests_fail_when_their_worker_leaves_between_batches() -> None:
    w = FakeWorker("w0", continuous_handler(10_000))
    d = make_continuous([w])
    first = await d.submit(item("a1", 5, "a"))
    w.state = WorkerState.DEAD  # gone while the request is carried (its state with it)
    chunks = await drain_stream(first)
    assert isinstance(chunks[-1], WorkerDied) and "left before request a1" in chunks[-1].message
    assert not d._carried and d.table._open["a"].running == 0


@in_loop
async def test_continuous_a_carried_request_whose_worker_dies_before_the_send_fails() -> None:
    w = FakeWorker("w0", continuous_handler(10_000))
    d = make_continuous([w], maxSequenceJobQueueSize=4)
    first = await d.submit(item("a1", 5, "a"))  # carried on w0 from here on
    pool = d.source
    assert isinstance(pool, FakePool)
    listed = pool.workers

    def workers_then_die() -> list[Worker]:
        # Called by the dispatch that plans a1's next batch with a2: w0 dies before the send.
        if w.state is not WorkerState.READY or not d.table._open["a"].jobs:
            return listed()
        asyncio.get_running_loop().call_soon(w.change_state, WorkerState.DEAD)
        return listed()

    pool.workers = workers_then_die  # type: ignore[method-assign]
    second = d.submit(item("a2", 2, "a"))
    chunks = await drain_stream(first)
    last = chunks[-1]
    assert isinstance(last, WorkerDied) and "Worker w0 left before request a1" in last.message
    assert not second.done() and d.queue.live_count() == 1  # a2 went back to its sequence
    assert d.table._open["a"].running == 0 and not d._carried
    assert all("a2" not in batch for batch in w.batches)
    second.cancel()


@in_loop
async def test_continuous_drain_lets_carried_requests_end_then_cuts_the_rest() -> None:
    short = FakeWorker("w0", continuous_handler(3))
    d = make_continuous([short])
    first = await d.submit(item("a1", 5, "a"))
    await d.drain(timeout=5)  # returns once the carried request has ended
    assert await drain_stream(first) == [b"5", b"5", b"5", b"5"]

    endless = FakeWorker("w0", continuous_handler(10_000_000))
    d = make_continuous([endless])
    first = await d.submit(item("a1", 5, "a"))
    await d.drain(timeout=0.05)  # a 50 ms budget; the stream would run for 10 million parts
    chunks = await drain_stream(first)
    assert isinstance(chunks[-1], ShuttingDown)
    assert "a" not in d.table and not d._carried


def test_the_worker_marks_partial_answers_from_the_stopping_criteria() -> None:
    class Ctx:
        def __init__(self) -> None:
            self.headers: dict[int, dict[str, str]] = {0: {}, 1: {}, 2: {}}
            self.stopping_criteria: list[Callable[[Any], Any]] | None = [
                lambda r: r > 10,
                lambda r: None,
                lambda r: False,
            ]

        def set_response_header(self, idx: int, key: str, value: str) -> None:
            self.headers[idx][key] = value

    ctx = Ctx()
    mark_stream_next(ctx, [11, 1, 1])
    assert ctx.headers == {
        0: {"ts_stream_next": "false"},
        1: {},  # None: a whole answer, no header (TorchServe's rule)
        2: {"ts_stream_next": "true"},
    }
    plain = Ctx()
    plain.stopping_criteria = None
    mark_stream_next(plain, [1])
    assert plain.headers[0] == {}
