"""Sequence batching: the settings, the placement policy (a table) and the dispatcher with fakes."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from serve.config import ModelSettings
from serve.errors import BadRequest, GatewayTimeout, TooManyRequests, WorkerDied
from serve.jobs import BatchItem, BatchOutcome, ItemResult, WorkerState
from serve.sequences import (
    SEQUENCE_ID_HEADER,
    SEQUENCE_START_HEADER,
    SequenceDispatcher,
    SequenceSettings,
    SequenceView,
    check_supported_settings,
    plan_sequence_batches,
)

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
        ({"continuousBatching": True}, "continuousBatching"),
        (
            {"sequenceBatching": True, "sequenceMaxIdleMSec": 9, "continuousBatching": True},
            "contin",
        ),
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

    def kill(self) -> None:
        self.state = WorkerState.DEAD


class FakePool:
    def __init__(self, workers: list[FakeWorker]) -> None:
        self._workers = workers

    def workers(self) -> list[FakeWorker]:
        return self._workers

    def can_serve(self) -> bool:
        return True

    def batch_finished(self, worker: FakeWorker) -> None:
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


def make(workers: list[FakeWorker], **yaml: object) -> SequenceDispatcher:
    settings = ModelSettings(batch_size=4, max_batch_delay=10)
    config = {"sequenceBatching": True, "sequenceMaxIdleMSec": 60_000, **yaml}
    sequences = SequenceSettings.from_config(config, 4, len(workers))
    return SequenceDispatcher("m", "1", FakePool(workers), lambda: settings, sequences)


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
