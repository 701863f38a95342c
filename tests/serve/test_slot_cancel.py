"""Cancellation on a worker with slots: a client that leaves a stream, a deadline, the hard limit.

The dispatcher cancels that one request's call (on a real worker: a CANCEL frame) instead of
killing the worker; the slot frees and the next waiting request takes it. Also the wire message,
the placement choice and a slot worker's budget learnt from LOADED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from serve.config import ModelSettings
from serve.core.dispatcher import Dispatcher
from serve.core.jobs import (
    BatchItem,
    BatchOutcome,
    ItemResult,
    WorkerState,
    abandoned_if_left,
    next_state,
)
from serve.core.slots import SlotPlacement, runs_many_at_once
from serve.wire.errors import GatewayTimeout
from serve.wire.frames import MsgType
from serve.wire.messages import (
    Cancel,
    Loaded,
    decode_cancel,
    decode_load,
    encode_cancel,
    encode_load,
)


class Cancellable:
    """A worker that runs requests side by side until each is ended or cancelled."""

    def __init__(self) -> None:
        self.worker_id = "w0"
        self.state = WorkerState.READY
        self.running: dict[str, asyncio.Future[BatchOutcome]] = {}
        self.cancelled: list[str] = []
        self.killed = False

    def change_state(self, wanted: WorkerState) -> bool:
        self.state = next_state(self.state, wanted)
        return self.state is wanted

    async def run_batch(
        self,
        items: list[BatchItem],
        on_partial: Callable[[list[ItemResult]], None] | None = None,
    ) -> BatchOutcome:
        rid = items[0].request_id
        self.running[rid] = asyncio.get_running_loop().create_future()
        if on_partial is not None and items[0].headers.get("stream"):
            on_partial([ItemResult(200, b"part", None)])
        try:
            return await self.running[rid]
        except asyncio.CancelledError:
            self.cancelled.append(rid)  # WorkerProcess sends CANCEL here
            raise
        finally:
            self.running.pop(rid, None)

    def end(self, rid: str) -> None:
        self.running[rid].set_result(BatchOutcome([ItemResult(200, rid.encode(), None)], {}, []))

    def kill(self) -> None:
        self.killed = True


class Pool:
    def __init__(self, worker: Cancellable) -> None:
        self.worker = worker

    def workers(self) -> list[Cancellable]:
        return [self.worker]

    def can_serve(self) -> bool:
        return True

    def batch_finished(self, worker: object) -> None:
        pass


async def until(condition: Callable[[], bool]) -> None:
    async def holds() -> None:
        while not condition():
            await asyncio.sleep(0)

    await asyncio.wait_for(holds(), 5)


def make(worker: Cancellable, **settings: object) -> Dispatcher:
    merged = ModelSettings().merged({"batch_size": 8, **settings})
    return Dispatcher("m", "1", Pool(worker), lambda: merged, SlotPlacement(100, 1))


def item(rid: str, stream: bool = False) -> BatchItem:
    return BatchItem(rid, {"stream": "1"} if stream else {}, [])


def test_a_client_that_leaves_a_stream_frees_its_slot_for_the_next_request() -> None:
    async def scenario() -> None:
        w = Cancellable()
        d = make(w)
        first = await d.submit(item("a", stream=True))
        waiting = d.submit(item("b"))
        await until(lambda: "a" in w.running)
        assert first.abandon is not None and d.queue.live_count() == 1
        first.abandon()  # the edge saw the client go
        await until(lambda: "b" in w.running)
        assert w.cancelled == ["a"] and not w.killed
        w.end("b")
        assert (await waiting).body == b"b"

    asyncio.run(scenario())


def test_a_request_not_waited_for_any_more_is_cancelled_on_the_worker() -> None:
    async def scenario() -> None:
        w = Cancellable()
        d = make(w)
        future = d.submit(item("a"))
        await until(lambda: "a" in w.running)
        future.cancel()  # the client's task was cancelled
        await until(lambda: w.cancelled == ["a"])
        await until(lambda: d.in_flight == 0)
        assert w.state is WorkerState.READY and not w.killed

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "limits",
    [{"response_timeout": 0.05}, {"response_timeout": 60, "hard_timeout": 0.05}],
    ids=["deadline", "hard-limit"],
)
def test_a_deadline_or_the_hard_limit_cancels_the_request_not_the_worker(limits) -> None:
    async def scenario() -> None:
        w = Cancellable()
        d = make(w, **limits)
        future = d.submit(item("a"))
        with pytest.raises(GatewayTimeout):
            await future
        await until(lambda: w.cancelled == ["a"])
        assert not w.killed
        nxt = d.submit(item("b"))
        await until(lambda: "b" in w.running)
        w.end("b")
        assert (await nxt).body == b"b"

    asyncio.run(scenario())


def test_cancel_and_the_limits_in_loaded_cross_the_wire() -> None:
    frame = encode_cancel(Cancel(7, "deadline"))
    assert frame.type == MsgType.CANCEL and decode_cancel(frame) == Cancel(7, "deadline")
    loaded = Loaded(1, [], {}, None, {"slots": 4, "max_running_sequences": 4})
    assert decode_load(encode_load(loaded)) == loaded
    classic = decode_load(encode_load(Loaded(1, [], {})))
    assert isinstance(classic, Loaded) and classic.limits == {}


@pytest.mark.parametrize(
    ("config", "handler", "expected"),
    [
        ({}, "text_generation", True),
        ({"continuousBatching": True}, "text_generation", False),  # one handle() per step
        ({"asyncCommunication": True}, "vllm_handler.py", True),
        ({"asyncCommunication": True, "sequenceBatching": True}, "h.py", False),
        ({}, "image_classifier", False),
    ],
)
def test_which_models_run_many_requests_per_worker(config, handler, expected) -> None:
    assert runs_many_at_once(config, handler) is expected


def test_the_slot_budget_comes_from_the_worker() -> None:
    placement = SlotPlacement(10)
    settings = ModelSettings().merged({"batch_size": 2})
    assert placement.per_worker(settings) == 2
    placement.learn({"slots": 6, "max_cached_tokens": 100})
    assert placement.per_worker(settings) == 6
    placement.learn({})
    assert placement.per_worker(settings) == 6


def test_retire_drains_a_ready_slot_worker_that_still_runs_requests() -> None:
    from tests.serve.test_pool import _pool, _recording

    procs: list[Any] = []  # tests.serve.test_pool's _Proc, given an in_flight count here

    async def scenario() -> None:
        pool = _pool(_recording(procs))
        slot = pool.add()
        await asyncio.wait_for(pool.wait_loaded(), 5)
        worker = procs[0]
        worker.in_flight = 2  # READY (a free slot) yet running two requests
        pool.retire(slot)
        for _ in range(10):  # what the old rule scheduled would have run by now
            await asyncio.sleep(0)
        assert not worker.stopped
        worker.in_flight = 1
        pool.batch_finished(worker)  # one of them ended: the other still runs
        await asyncio.sleep(0)
        assert not worker.stopped
        worker.in_flight = 0
        pool.batch_finished(worker)  # the last one: now it stops
        await until(lambda: worker.stopped)
        await pool.stop()

    asyncio.run(scenario())


def _answer_of(calls: list[str]) -> ItemResult:
    return ItemResult(200, b"first", None, abandon=lambda: calls.append("abandoned"))


async def _events(*later: bytes | BaseException) -> Any:
    yield b"first"
    for item in later:
        if isinstance(item, BaseException):
            raise item
        yield item


@pytest.mark.anyio
async def test_an_edge_abandons_a_stream_only_when_its_client_leaves_before_the_end() -> None:
    calls: list[str] = []
    whole = [e async for e in abandoned_if_left(_answer_of(calls), _events(b"a", b"b"))]
    assert whole == [b"first", b"a", b"b"] and calls == []  # read to the end: nothing to free

    left = abandoned_if_left(_answer_of(calls), _events(b"a", b"b"))
    assert await anext(left) == b"first"
    await left.aclose()  # the client went away after the first event
    assert calls == ["abandoned"]

    calls.clear()
    cut = abandoned_if_left(_answer_of(calls), _events(b"a", asyncio.CancelledError()))
    with pytest.raises(asyncio.CancelledError):  # the edge's task cancelled while it waited
        [e async for e in cut]
    assert calls == ["abandoned"]


@pytest.mark.anyio
async def test_a_whole_answer_is_given_up_as_a_499_when_its_client_disconnects() -> None:
    from starlette.requests import Request

    from serve.http.openai import _while_connected
    from serve.wire.errors import ClientClosedRequest

    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[str] = loop.create_future()
    answered.set_result("text")
    assert await _while_connected(request, answered) == "text"  # in time: the answer

    never: asyncio.Future[str] = loop.create_future()
    waiting = asyncio.ensure_future(_while_connected(request, never))
    await asyncio.sleep(0)
    gone.set()  # the client goes
    with pytest.raises(ClientClosedRequest) as caught:
        await waiting
    assert caught.value.status_code == 499 and never.cancelled()  # the request's wait, cancelled
