"""Worker loops that keep many requests in flight: a generative engine's, ``asyncCommunication``.

The classic loop (`serve.worker.main`) runs one PREDICT to its RESULT before reading the next
frame. The loops here read frames on a thread of their own (`Inbox`) and go on taking PREDICTs
while earlier ones run; the frontend's slot placement (`serve.core.slots`) sends each request as a
batch of one, up to the budget reported in LOADED (``Loaded.limits["slots"]``).

* `EngineLoop`: a handler with ``request_streams()`` (the built-in ``text_generation``). Each
  request is added to the engine as it arrives and joins its next step; a streamed request's parts
  go out as PARTIAL frames, the final RESULT ends it (a step's frames in one write: one system
  call and one wake-up of the frontend per step, not one per stream); CANCEL drops it before the
  next forward.
  ENGINE frames (`serve.wire.messages.EngineReport`) carry the engine's live counts and each new
  request's cache reservation to the frontend.
* `AsyncLoop`: ``asyncCommunication: true`` (TorchServe's key). The handler's ``handle`` may be a
  coroutine; each request runs as its own task on one asyncio loop, with a context of its own, and
  ``send_intermediate_predict_response`` streams its parts; CANCEL cancels that task.

A cancelled request is still answered (a RESULT whose error says so), so the frontend's books
close either way.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from serve.wire.frames import Frame, MsgType
from serve.wire.messages import (
    BatchResult,
    EngineReport,
    ErrorItem,
    PartialItem,
    PredictItem,
    ResultItem,
    decode_cancel,
    decode_predict,
    encode_engine_report,
    encode_partial,
    encode_result,
)

if TYPE_CHECKING:
    from handlers.context import Context
    from handlers.generation.interface import GenerativeHandler
    from handlers.generation.streams import Event, RequestStreams
    from handlers.service import Service
    from serve.wire.messages import WorkerSpec

logger = logging.getLogger("serve.worker")

CANCELLED_STATUS = 499  # the client closed the request (nginx's code); it never reaches one
# While only the cache grows (every decode step), the engine's counts go out at most this often;
# a change in its sequences or reservations goes out after the step that made it.
REPORT_INTERVAL = 0.5
# Threads that parse, render (chat templates) and tokenize arriving requests: two, so that one
# request whose template runs to its time bound does not hold every other one back.
PREPARE_THREADS = 2


class Connection(Protocol):
    def send(self, *frames: Frame) -> None: ...

    def receive(self) -> Frame | None: ...


class LockedConnection:
    """A connection whose sends may come from several threads (the loop, the frame reader's
    PONGs, the preparation threads' reservations): one write at a time."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, *frames: Frame) -> None:
        with self._lock:
            self._conn.send(*frames)

    def receive(self) -> Frame | None:
        return self._conn.receive()


class Inbox:
    """Frames read on a thread of their own, so the loop can step while none arrive.

    The reader runs nothing a request controls: it answers PING at once (the frontend's liveness
    check: a reader that stops is noticed) and hands every other frame to ``on_frame``. ``None``
    is the end of the stream (the frontend closed the socket)."""

    def __init__(self, conn: Connection, on_frame: Callable[[Frame | None], None]) -> None:
        self._conn = conn
        self._on_frame = on_frame
        self._thread = threading.Thread(target=self._read, name="frame-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _read(self) -> None:
        try:
            while (frame := self._conn.receive()) is not None:
                if frame.type == MsgType.PING:
                    self._conn.send(Frame(MsgType.PONG, frame.seq))
                    continue
                self._on_frame(frame)
        except Exception:  # a broken stream ends the worker as a closed one does
            logger.exception("Reading from the frontend failed")
        self._on_frame(None)


def decode_row(req: PredictItem, decode: bool) -> dict[str, Any]:
    """One request's fields as a handler row (as `serve.worker.main.run_items` builds it);
    raises `PredictionException` for input that cannot be decoded."""
    from handlers.inputs import decode_value

    row: dict[str, Any] = {}
    for name, content_type, raw in req.params:
        value = decode_value(raw, content_type) if decode else raw
        if name in row:
            prev = row[name]
            row[name] = [*prev, value] if isinstance(prev, list) else [prev, value]
        else:
            row[name] = value
    return row


def _error(exc: Any, request_id: str) -> ErrorItem:
    return ErrorItem(int(exc.error_code), "PredictionException", str(exc.message), request_id)


def _cancelled(request_id: str) -> ErrorItem:
    return ErrorItem(CANCELLED_STATUS, "Cancelled", "the request was cancelled", request_id)


def _result(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> ResultItem:
    from handlers.output import encode_output

    body, content_type = encode_output(value)
    return ResultItem(status, content_type, dict(headers or {}), body)


# ----- the engine loop -----------------------------------------------------------------------


@dataclass
class _Prepared:
    """A PREDICT's requests as the reader thread parsed and checked them: per item, the request
    and `Engine.check`'s (prompt ids, reservation), or the error that answers it."""

    requests: list[PredictItem]
    items: list[Any] = field(default_factory=list)
    reserved: int = 0  # cache positions over its items that will run


@dataclass
class _Batch:
    """One PREDICT frame in flight: one answer per item, sent together when all are in."""

    seq: int
    requests: list[PredictItem]
    answers: list[ResultItem | ErrorItem | None]
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def complete(self) -> bool:
        return all(answer is not None for answer in self.answers)

    def result(self) -> BatchResult:
        now = time.perf_counter()
        timings = {"handler": now - self.started}
        if self.first_token is not None:
            timings["first_token"] = self.first_token - self.started
        # Token counts ride with the timings (`serve.metrics.prometheus` counts them apart).
        timings["prompt_tokens"] = float(self.prompt_tokens)
        timings["completion_tokens"] = float(self.completion_tokens)
        items = [a for a in self.answers if a is not None]
        return BatchResult(items, timings)


class EngineLoop:
    """Drives a handler's `RequestStreams` step by step, taking new requests between steps."""

    def __init__(
        self,
        service: Service,
        context: Context,
        handler: GenerativeHandler,
        streams: RequestStreams,
        slots: int,
    ) -> None:
        self.service = service
        self.context = context
        self.streams = streams
        self.handler = handler
        self.slots = slots
        self._inbox: queue.SimpleQueue[tuple[Frame, _Prepared | None] | None] = queue.SimpleQueue()
        self._batches: dict[int, _Batch] = {}
        self._owner: dict[str, tuple[int, int]] = {}  # engine id -> (seq, item index)
        self._reported: dict[str, int] = {}  # the counts last sent
        self._reported_at = 0.0
        self._outbox: list[Frame] = []
        # PREDICTs are parsed, rendered and tokenized here, never on the reader or the loop.
        self._preparers = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="prepare")
        self._unprepared: set[int] = set()  # seqs read and not yet taken by the loop
        self._cancelled_early: set[int] = set()  # of those, the ones cancelled meanwhile

    @property
    def limits(self) -> dict[str, int]:
        return {"slots": self.slots, **self.streams.engine.limits().as_dict()}

    def run(self, conn: Connection, decode: bool, on_threads: Callable[[int], None]) -> int:
        self._conn = LockedConnection(conn)
        self._decode = decode
        Inbox(self._conn, self._read).start()
        while True:
            for taken in self._take(block=not self.streams.has_work()):
                if taken is None or taken[0].type == MsgType.SHUTDOWN:
                    self._flush()
                    self._preparers.shutdown(wait=False, cancel_futures=True)
                    return 0
                frame, prepared = taken
                if frame.type == MsgType.THREADS:
                    on_threads(int(frame.meta["threads"]))
                elif frame.type == MsgType.PREDICT:
                    self._arrive(frame, decode, prepared)
                elif frame.type == MsgType.CANCEL:
                    self._cancel(decode_cancel(frame).seq)
            if self.streams.has_work():
                self._step()
                self._report_if_due()
            self._flush()

    def _send(self, *frames: Frame) -> None:
        self._conn.send(*frames)

    def _post(self, frame: Frame) -> None:
        """Queue a frame for the end of this turn of the loop (`_flush`): a step's parts and
        answers go out in one write."""
        self._outbox.append(frame)

    def _flush(self) -> None:
        if self._outbox:
            frames, self._outbox = self._outbox, []
            self._send(*frames)

    def _read(self, frame: Frame | None) -> None:
        """On the reader thread: a PREDICT goes to a preparation thread, every other frame to
        the loop. The reader itself runs nothing a request controls, so it keeps reading
        CANCEL, SHUTDOWN and PING whatever a chat template or a tokenizer does."""
        if frame is not None and frame.type == MsgType.PREDICT:
            self._unprepared.add(frame.seq)
            try:
                self._preparers.submit(self._prepare_for_loop, frame)
                return
            except RuntimeError:  # shutting down: the loop has returned or soon will
                pass
        self._inbox.put(None if frame is None else (frame, None))

    def _prepare_for_loop(self, frame: Frame) -> None:
        """On a preparation thread: parse, render and tokenize a PREDICT's requests, report its
        reservation at once (even while the loop runs a step, so that the frontend's KV budget
        counts it exactly within a round trip, not a step), then hand it to the loop."""
        prepared = None
        try:
            prepared = self._prepare(frame)
        except Exception:  # e.g. a malformed frame: the loop meets it again and says so
            logger.debug("Preparing batch %d failed; the loop takes it as it is", frame.seq)
        if prepared is not None and prepared.reserved:
            report = EngineReport({}, {frame.seq: prepared.reserved})
            self._send(encode_engine_report(report))
        self._inbox.put((frame, prepared))

    def _prepare(self, frame: Frame) -> _Prepared | None:
        from handlers.exceptions import PredictionException, report_failure

        requests = decode_predict(frame)
        if any(req.headers.get("describe") for req in requests):
            return None
        engine = self.streams.engine
        prepared = _Prepared(requests)
        most = self.handler.max_request_bytes
        for req in requests:
            try:
                size = sum(len(raw) for _, _, raw in req.params)
                if most and size > most:  # refused before its JSON is parsed
                    raise PredictionException(
                        f"the request has {size} bytes; no request this model can take has "
                        f"more than {most} (its longest prompt, escaped, and the other fields)",
                        400,
                    )
                request = self.handler.parse(decode_row(req, self._decode))
                checked = engine.check(request)
            except PredictionException as exc:
                prepared.items.append(exc)
                continue
            except Exception as exc:  # a parser or tokenizer bug fails this request alone
                code, _, message = report_failure(exc, [req.request_id], logger)
                prepared.items.append(PredictionException(message, code))
                continue
            prepared.items.append((request, checked))
            prepared.reserved += checked[1]
        return prepared

    def _report(self) -> None:
        stats = self.streams.engine.stats()
        self._post(encode_engine_report(EngineReport(stats)))
        self._reported = stats
        self._reported_at = time.monotonic()

    def _report_if_due(self) -> None:
        """After a step: the counts when a sequence came, went or changed state (so the step
        that leaves the engine idle sends zeros), else at most every `REPORT_INTERVAL`."""
        stats = self.streams.engine.stats()
        changed = any(
            stats[key] != self._reported.get(key)
            for key in ("waiting", "prefilling", "running", "reserved_tokens")
        )
        due = time.monotonic() - self._reported_at >= REPORT_INTERVAL
        if stats != self._reported and (changed or due):
            self._report()

    def _take(self, block: bool) -> list[tuple[Frame, _Prepared | None] | None]:
        frames: list[tuple[Frame, _Prepared | None] | None] = []
        try:
            frames.append(self._inbox.get(block=block))
            while True:
                frames.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        return frames

    def _arrive(self, frame: Frame, decode: bool, prepared: _Prepared | None) -> None:
        from handlers.exceptions import PredictionException, report_failure

        self._unprepared.discard(frame.seq)
        requests = prepared.requests if prepared is not None else decode_predict(frame)
        if frame.seq in self._cancelled_early:  # cancelled while it was being prepared
            self._cancelled_early.discard(frame.seq)
            answers = [_cancelled(req.request_id) for req in requests]
            self._post(encode_result(frame.seq, BatchResult(list(answers))))
            return
        if prepared is None and any(req.headers.get("describe") for req in requests):
            from serve.worker.main import client_errors, run_items  # the handler answers

            self._post(
                encode_result(
                    frame.seq,
                    client_errors(run_items(self.service, self.context, requests, decode)),
                )
            )
            return
        batch = _Batch(frame.seq, requests, [None] * len(requests))
        self._batches[frame.seq] = batch
        for index, req in enumerate(requests):
            engine_id = f"{frame.seq}/{index}"
            try:
                item = prepared.items[index] if prepared is not None else None
                if isinstance(item, PredictionException):
                    raise item
                if item is None:  # not prepared on the reader thread
                    self.streams.open(engine_id, self.handler.parse(decode_row(req, decode)))
                else:
                    self.streams.open(engine_id, item[0], item[1])
            except PredictionException as exc:
                batch.answers[index] = _error(exc, req.request_id)
                continue
            except Exception as exc:  # e.g. seeding: this request fails, never the worker
                code, kind, message = report_failure(exc, [req.request_id], logger)
                batch.answers[index] = ErrorItem(code, kind, message, req.request_id)
                continue
            self._owner[engine_id] = (frame.seq, index)
        self._maybe_done(batch)

    def _cancel(self, seq: int) -> None:
        batch = self._batches.get(seq)
        if batch is None:
            if seq in self._unprepared:  # still being prepared: answered once it is
                self._cancelled_early.add(seq)
            return
        for index in range(len(batch.requests)):
            self.streams.cancel(f"{seq}/{index}")

    def _step(self) -> None:
        from handlers.exceptions import report_failure

        try:
            events = self.streams.step()
        except Exception as exc:  # an engine bug fails what it runs, not the worker
            ids = [self._batches[s].requests[i].request_id for s, i in self._owner.values()]
            code, kind, message = report_failure(exc, ids, logger)
            for engine_id, (seq, index) in list(self._owner.items()):
                self.streams.cancel(engine_id)
                request_id = self._batches[seq].requests[index].request_id
                self._answer(engine_id, ErrorItem(code, kind, message, request_id))
            return
        for event in events:
            try:
                self._deliver(event)
            except Exception as exc:  # e.g. an answer that cannot be encoded: this request fails
                owner = self._owner.get(event.request_id)
                if owner is None:
                    continue
                request_id = self._batches[owner[0]].requests[owner[1]].request_id
                code, kind, message = report_failure(exc, [request_id], logger)
                self.streams.cancel(event.request_id)
                self._answer(event.request_id, ErrorItem(code, kind, message, request_id))

    def _deliver(self, event: Event) -> None:
        """One request's event of a step: its part out, or its answer."""
        owner = self._owner.get(event.request_id)
        if owner is None:
            return
        batch = self._batches[owner[0]]
        if batch.first_token is None:
            batch.first_token = time.perf_counter()
        if event.part is not None:
            if len(batch.requests) == 1:  # parts align with the batch's one request
                self._send_part(batch.seq, event.part)
            return
        batch.prompt_tokens += event.usage.get("prompt_tokens", 0)
        batch.completion_tokens += event.usage.get("completion_tokens", 0)
        request_id = batch.requests[owner[1]].request_id
        if event.error is not None:
            answer: ResultItem | ErrorItem = _error(event.error, request_id)
            if event.error.error_code == CANCELLED_STATUS:
                answer = _cancelled(request_id)
        else:
            answer = _result(event.result)
        self._answer(event.request_id, answer)

    def _send_part(self, seq: int, part: dict[str, Any]) -> None:
        from handlers.output import encode_output

        body, content_type = encode_output(part)
        self._post(encode_partial(seq, [PartialItem(content_type, body)]))

    def _answer(self, engine_id: str, answer: ResultItem | ErrorItem) -> None:
        seq, index = self._owner.pop(engine_id)
        batch = self._batches[seq]
        batch.answers[index] = answer
        self._maybe_done(batch)

    def _maybe_done(self, batch: _Batch) -> None:
        if batch.complete:
            from serve.worker.main import client_errors

            del self._batches[batch.seq]
            self._post(encode_result(batch.seq, client_errors(batch.result())))


# ----- asyncCommunication -----------------------------------------------------------------------


def request_context(context: Any, requests: list[PredictItem]) -> Any:
    """A shallow copy of the worker's context for one request in flight: its own request ids,
    headers, response statuses, timings and intermediate sink; model facts, metrics and
    ``cache`` shared."""
    from handlers.context import RequestProcessor

    ctx = copy.copy(context)
    ctx.request_ids = {i: req.request_id for i, req in enumerate(requests)}
    ctx.request_processor = [RequestProcessor(req.headers) for req in requests]
    ctx.handler_timings = {}
    ctx.intermediate_responses = []
    ctx.intermediate_sink = None
    ctx.stopping_criteria = None
    return ctx


class AsyncLoop:
    """``asyncCommunication: true``: each PREDICT a task on one event loop, many at once."""

    def __init__(self, service: Any, context: Any, slots: int) -> None:
        self.service = service
        self.context = context
        self.slots = slots
        self._tasks: dict[int, asyncio.Task[None]] = {}

    @property
    def limits(self) -> dict[str, int]:
        return {"slots": self.slots}

    def run(self, conn: Connection, decode: bool, on_threads: Callable[[int], None]) -> int:
        # On the loop an ``async def initialize`` ran on (`handlers.service.Service.loop`): an
        # engine made there (vLLM's AsyncLLMEngine) is bound to it.
        loop: asyncio.AbstractEventLoop | None = getattr(self.service, "loop", None)
        if loop is None:
            return asyncio.run(self._serve(conn, decode, on_threads))
        asyncio.set_event_loop(loop)
        try:
            return loop.run_until_complete(self._serve(conn, decode, on_threads))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            asyncio.set_event_loop(None)
            loop.close()

    async def _serve(
        self, conn: Connection, decode: bool, on_threads: Callable[[int], None]
    ) -> int:
        loop = asyncio.get_running_loop()
        frames: asyncio.Queue[Frame | None] = asyncio.Queue()

        def arrive(frame: Frame | None) -> None:
            loop.call_soon_threadsafe(frames.put_nowait, frame)

        conn = LockedConnection(conn)  # the reader thread answers PINGs on it too
        Inbox(conn, arrive).start()
        while True:
            frame = await frames.get()
            if frame is None or frame.type == MsgType.SHUTDOWN:
                for task in self._tasks.values():
                    task.cancel()
                return 0
            if frame.type == MsgType.THREADS:
                on_threads(int(frame.meta["threads"]))
            elif frame.type == MsgType.PREDICT:
                self._start(conn, frame, decode)
            elif frame.type == MsgType.CANCEL:
                running = self._tasks.get(decode_cancel(frame).seq)
                if running is not None:
                    running.cancel()

    def _start(self, conn: Connection, frame: Frame, decode: bool) -> None:
        seq = frame.seq
        task = asyncio.create_task(self._one(conn, frame, decode))
        self._tasks[seq] = task

        def done(_: asyncio.Task[None]) -> None:
            self._tasks.pop(seq, None)

        task.add_done_callback(done)

    async def _one(self, conn: Connection, frame: Frame, decode: bool) -> None:
        from serve.worker.main import client_errors

        requests = decode_predict(frame)
        try:
            result = await self.run_items(conn, frame.seq, requests, decode)
        except asyncio.CancelledError:
            result = BatchResult([_cancelled(req.request_id) for req in requests])
        conn.send(encode_result(frame.seq, client_errors(result)))

    async def run_items(
        self, conn: Connection, seq: int, requests: list[PredictItem], decode: bool
    ) -> BatchResult:
        """One batch through the handler, awaiting its ``handle`` if it is a coroutine."""
        from handlers.exceptions import PredictionException, report_failure
        from serve.worker.main import mark_stream_next

        ctx = request_context(self.context, requests)
        ctx.intermediate_sink = _part_sender(conn, seq)
        started = time.perf_counter()
        try:
            rows = [decode_row(req, decode) for req in requests]
        except PredictionException as exc:
            return BatchResult([_error(exc, req.request_id) for req in requests])
        try:
            results = self.service.entry_point(rows, ctx)
            if inspect.isawaitable(results):
                results = await results
            if not isinstance(results, list) or len(results) != len(rows):
                raise TypeError(
                    f"the handler returned {type(results).__name__}, expected a list of "
                    f"{len(rows)} results"
                )
            mark_stream_next(ctx, results)
            items: list[ResultItem | ErrorItem] = []
            for i, value in enumerate(results):
                proc = ctx.request_processor[i]
                item = _result(
                    value, proc.get_response_status_code() or 200, proc.get_response_headers()
                )
                item.content_type = ctx.get_response_content_type(i) or item.content_type
                items.append(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a handler bug fails this request, not the others
            ids = [req.request_id for req in requests]
            code, kind, message = report_failure(exc, ids, logger)
            items = [ErrorItem(code, kind, message, rid) for rid in ids]
        timings = dict(ctx.handler_timings or {})
        timings["handler"] = time.perf_counter() - started
        return BatchResult(items, timings, self.context.metrics.drain())


def _part_sender(conn: Connection, seq: int) -> Callable[[dict[str, Any]], None]:
    from handlers.output import encode_output

    def send(chunk: dict[str, Any]) -> None:
        items = []
        for value in chunk["results"]:
            body, content_type = encode_output(value)
            items.append(PartialItem(content_type, body))
        conn.send(encode_partial(seq, items))

    return send


def concurrent_loop(
    service: Service, context: Context, spec: WorkerSpec
) -> EngineLoop | AsyncLoop | None:
    """The loop this worker runs, if it keeps many requests in flight; None: the classic one."""
    from handlers.generation.interface import GenerativeHandler

    yaml_config = spec.model_yaml_config or {}
    handler = service.handler
    if isinstance(handler, GenerativeHandler):
        streams = handler.request_streams()
        if streams is not None:
            slots = streams.engine.limits().max_running_sequences
            return EngineLoop(service, context, handler, streams, slots)
    if yaml_config.get("asyncCommunication"):
        return AsyncLoop(service, context, max(1, int(spec.batch_size or 1)))
    return None
