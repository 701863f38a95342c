"""The worker loops that keep many requests in flight (`serve.worker.concurrent`), in process.

A fake connection stands in for the socket: the test puts frames in and reads what the loop sends,
waiting on queues (no sleeps). The engine loop runs the built-in ``text_generation`` handler on the
tiny model built in code; the async loop runs a handler shaped like TorchServe's VLLMHandler.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from handlers.context import Context
from handlers.service import load_service
from serve.wire.frames import Frame, MsgType
from serve.wire.messages import (
    Cancel,
    EngineReport,
    ErrorItem,
    PredictItem,
    ResultItem,
    WorkerSpec,
    decode_engine_report,
    decode_partial,
    decode_result,
    encode_cancel,
    encode_predict,
)
from serve.worker.concurrent import CANCELLED_STATUS, AsyncLoop, EngineLoop, concurrent_loop
from tests.support.generation_fixtures import load_tiny_service

MANIFEST = {"model": {"modelName": "tiny", "handler": "text_generation"}}
WAIT = 120  # seconds for one frame on a loaded machine
HANDLERS = Path(__file__).resolve().parents[1] / "support" / "handlers"
HANDLER = "async_engine_handler"


class FakeConnection:
    """Frames in through ``put``, frames out through ``sent`` (ENGINE reports in ``reports``)."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[Frame | None] = queue.Queue()
        self.sent: queue.Queue[Frame] = queue.Queue()
        self.reports: queue.Queue[EngineReport] = queue.Queue()
        self.writes: list[list[Frame]] = []  # the frames of each send, in order

    def receive(self) -> Frame | None:
        return self.inbox.get()

    def send(self, *frames: Frame) -> None:
        self.writes.append(list(frames))
        for frame in frames:
            if frame.type == MsgType.ENGINE:
                self.reports.put(decode_engine_report(frame))
            else:
                self.sent.put(frame)

    def put(self, frame: Frame | None) -> None:
        self.inbox.put(frame)

    def next(self) -> Frame:
        return self.sent.get(timeout=WAIT)


def predict(seq: int, body: dict[str, Any] | bytes, request_id: str | None = None) -> Frame:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    item = PredictItem(request_id or f"r{seq}", {}, [("body", "application/json", raw)])
    return encode_predict(seq, [item])


def ok(item: ResultItem | ErrorItem) -> ResultItem:
    assert isinstance(item, ResultItem), item
    return item


def failed(item: ResultItem | ErrorItem) -> ErrorItem:
    assert isinstance(item, ErrorItem), item
    return item


def run_in_thread(loop: Any, conn: FakeConnection) -> tuple[threading.Thread, list[int]]:
    code: list[int] = []
    thread = threading.Thread(
        target=lambda: code.append(loop.run(conn, True, lambda n: None)), daemon=True
    )
    thread.start()
    return thread, code


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return load_tiny_service(tmp_path_factory.mktemp("tiny-llm"), 4, 8)


def greedy(service, prompt: str, n: int) -> list[int]:
    engine = service.handler.engine
    ids = torch.tensor([engine.tokenizer.encode(prompt)])
    out = engine.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
    )
    return out[0, ids.shape[1] :].tolist()


def body(prompt: str, n: int, stream: bool = True) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


def test_the_text_generation_handler_gets_the_engine_loop_with_its_limits(service):
    spec = WorkerSpec("m", "1", ".", {}, batch_size=4)
    loop = concurrent_loop(service, service.context, spec)
    assert isinstance(loop, EngineLoop)
    assert loop.limits["slots"] == 4 and loop.limits["max_running_sequences"] == 4


def test_streams_interleave_a_late_request_joins_and_a_cancel_frees_its_slot(service):
    conn = FakeConnection()
    loop = EngineLoop(
        service, service.context, service.handler, service.handler.request_streams(), 4
    )
    thread, code = run_in_thread(loop, conn)
    engine = service.handler.engine
    parts: dict[int, list[int]] = {1: [], 2: [], 3: []}
    results: dict[int, ResultItem | ErrorItem] = {}

    def read() -> Frame:
        frame = conn.next()
        if frame.type == MsgType.PARTIAL:
            parts[frame.seq] += json.loads(decode_partial(frame)[0].body)["tokens"]
        else:
            results[frame.seq] = decode_result(frame).items[0]
        return frame

    conn.put(predict(1, body("the quick brown fox", 200)))
    while not parts[1]:
        read()
    conn.put(predict(2, body("a model server answers", 6)))  # joins the running batch
    conn.put(predict(3, {"prompt": "x", "temprature": 0}))  # bad input: that request alone
    conn.put(predict(4, b"\xff\xfe not utf-8"))
    while 2 not in results:
        frame = read()
        if frame.seq == 2 and frame.type == MsgType.PARTIAL:
            assert 1 not in results and engine.stats()["running"] >= 1
    assert isinstance(results[3], ErrorItem) and results[3].code == 400
    assert "temprature" in results[3].message
    assert isinstance(results[4], ErrorItem) and results[4].code == 400
    assert isinstance(results[2], ResultItem)
    final = json.loads(results[2].body)
    assert parts[2] + final["tokens"] == greedy(service, "a model server answers", 6)
    assert 1 not in results  # the long stream still runs beside them
    conn.put(encode_cancel(Cancel(1)))  # its client left
    while 1 not in results:
        read()
    assert isinstance(results[1], ErrorItem) and results[1].code == CANCELLED_STATUS
    assert parts[1] == greedy(service, "the quick brown fox", 200)[: len(parts[1])]
    assert engine.stats()["reserved_tokens"] == 0 and not engine.has_work()
    conn.put(Frame(MsgType.SHUTDOWN, 0))
    thread.join(WAIT)
    assert code == [0]


def test_a_steps_parts_go_out_together_in_one_write(service):
    conn = FakeConnection()
    loop = EngineLoop(
        service, service.context, service.handler, service.handler.request_streams(), 4
    )
    thread, code = run_in_thread(loop, conn)
    conn.put(predict(1, body("the quick brown fox", 200)))
    conn.put(predict(2, body("a model server answers", 12)))
    while (frame := conn.next()).type != MsgType.RESULT:
        pass
    assert frame.seq == 2  # the long stream still runs: cancel it
    conn.put(encode_cancel(Cancel(1)))
    while conn.next().type != MsgType.RESULT:
        pass
    conn.put(Frame(MsgType.SHUTDOWN, 0))
    thread.join(WAIT)
    assert code == [0]
    streamed = [[f.seq for f in write if f.type == MsgType.PARTIAL] for write in conn.writes]
    assert all(len(seqs) == len(set(seqs)) for seqs in streamed)  # one step per write
    # while both ran, each step's two parts went out in one write (12 tokens: 11 steps)
    assert sum(sorted(seqs) == [1, 2] for seqs in streamed) >= 10
    # and an answer goes out with the other parts of its step
    final = next(write for write in conn.writes if any(f.type == MsgType.RESULT for f in write))
    assert {(f.type, f.seq) for f in final} >= {(MsgType.PARTIAL, 1), (MsgType.RESULT, 2)}


def test_an_unstreamed_request_is_answered_whole(service):
    conn = FakeConnection()
    loop = EngineLoop(
        service, service.context, service.handler, service.handler.request_streams(), 4
    )
    thread, code = run_in_thread(loop, conn)
    conn.put(predict(1, body("héllo world", 5, stream=False)))
    frame = conn.next()
    assert frame.type == MsgType.RESULT  # no parts
    result = decode_result(frame)
    answer = json.loads(ok(result.items[0]).body)
    assert answer["tokens"] == greedy(service, "héllo world", 5)
    assert answer["usage"]["completion_tokens"] == 5 and "first_token" in result.timings
    conn.put(None)  # the frontend closed the socket
    thread.join(WAIT)
    assert code == [0]


def test_the_engine_reports_each_reservation_as_it_reads_it_and_zeros_once_idle(service):
    conn = FakeConnection()
    loop = EngineLoop(
        service, service.context, service.handler, service.handler.request_streams(), 4
    )
    thread, code = run_in_thread(loop, conn)
    prompt = "the quick brown fox"
    conn.put(predict(1, body(prompt, 5, stream=False)))
    first = conn.reports.get(timeout=WAIT)  # sent as the frame is read, before any step
    expected = len(service.handler.engine.tokenizer.encode(prompt)) + 5
    assert first.reserved == {1: expected} and first.stats == {}
    assert conn.next().type == MsgType.RESULT
    conn.put(Frame(MsgType.SHUTDOWN, 0))
    thread.join(WAIT)
    assert code == [0]
    later = [conn.reports.get_nowait() for _ in range(conn.reports.qsize())]
    assert any(r.stats["reserved_tokens"] == expected for r in later)
    last = later[-1]  # the step that ended the last request left the counts at zero
    assert not last.reserved and last.stats["steps"] > 0
    live = ("waiting", "prefilling", "running", "reserved_tokens", "cached_tokens")
    assert {k: last.stats[k] for k in live} == dict.fromkeys(live, 0)
    # what outlives the request: the prefix cache keeps its prompt for the next one like it
    assert last.stats["prefix_cache_tokens"] >= expected - 5  # and earlier tests' prompts


def test_a_reservation_is_reported_while_a_step_runs(service):
    """The reader thread reports a new request's reservation at once: the frontend's KV budget
    need not wait for the step in progress (held here until the report came) to end."""
    streams = service.handler.request_streams()
    in_step, release = threading.Event(), threading.Event()
    step = streams.step

    def held_step() -> Any:
        in_step.set()
        assert release.wait(WAIT)
        return step()

    streams.step = held_step
    conn = FakeConnection()
    thread, code = run_in_thread(
        EngineLoop(service, service.context, service.handler, streams, 4), conn
    )
    conn.put(predict(1, body("the quick brown fox", 3, stream=False)))
    assert set(conn.reports.get(timeout=WAIT).reserved) == {1}
    assert in_step.wait(WAIT)  # the loop is inside a step, held there
    conn.put(predict(2, body("a model", 4, stream=False)))
    report = conn.reports.get(timeout=WAIT)  # while the step is still held
    assert report.reserved == {2: len(service.handler.engine.tokenizer.encode("a model")) + 4}
    release.set()
    assert {conn.next().seq, conn.next().seq} == {1, 2}
    conn.put(Frame(MsgType.SHUTDOWN, 0))
    thread.join(WAIT)
    assert code == [0]


@pytest.mark.parametrize("init", ["async", "sync"])
def test_the_async_loop_runs_many_requests_at_once_and_cancels_one(init: str):
    """With ``async def initialize`` awaited by the loader (on the loop ``handle`` then runs
    on: the handler checks it), and with a sync one."""
    from handlers.compat import install_ts_alias

    install_ts_alias()  # the handler imports the ts shim, as in a worker
    context = Context("vllm-like", str(HANDLERS), {}, 8, None, "0.12.0")
    if init == "async":
        service: Any = load_service(HANDLERS, {"model": {"handler": HANDLER}}, context)
        assert service.loop is not None and service.handler.initialized
    else:
        from tests.support.handlers.async_engine_handler import AsyncEngineHandler

        handler = AsyncEngineHandler()
        handler.setup(context)
        service = SimpleNamespace(entry_point=handler.handle, handler=handler, loop=None)
    spec = WorkerSpec("m", "1", ".", {}, batch_size=8)
    spec.model_yaml_config = {"asyncCommunication": True}
    loop = concurrent_loop(service, context, spec)
    assert isinstance(loop, AsyncLoop) and loop.limits == {"slots": 8}
    conn = FakeConnection()
    thread, code = run_in_thread(loop, conn)
    for seq in (1, 2, 3):
        conn.put(predict(seq, {"prompt": f"p{seq}-", "max_tokens": 3, "gate": True}))
    parts: dict[int, list[str]] = {1: [], 2: [], 3: []}
    while sum(map(len, parts.values())) < 9:  # every token of all three, none finished
        frame = conn.next()
        assert frame.type == MsgType.PARTIAL
        parts[frame.seq].append(decode_partial(frame)[0].body.decode())
    assert parts[2] == ["p2-0 ", "p2-1 ", "p2-2 "]
    conn.put(encode_cancel(Cancel(3)))
    cancelled = conn.next()
    assert cancelled.seq == 3 and failed(decode_result(cancelled).items[0]).code == CANCELLED_STATUS
    conn.put(predict(4, {"open": True}))
    done: dict[int, ResultItem] = {}
    while len(done) < 3:
        frame = conn.next()
        done[frame.seq] = ok(decode_result(frame).items[0])
    assert done[1].body == b"p1-0 p1-1 p1-2 " and done[4].body == b"opened"
    conn.put(predict(5, {"stats": True}))
    assert json.loads(ok(decode_result(conn.next()).items[0]).body) == {"most": 3}
    conn.put(Frame(MsgType.SHUTDOWN, 0))
    thread.join(WAIT)
    assert code == [0]
