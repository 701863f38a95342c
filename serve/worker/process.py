"""The frontend's handle on one worker process: start it, send it batches, see it die."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, WorkerState, next_state
from serve.wire.errors import ServeError, WorkerDied
from serve.wire.frames import Frame, FrameDecoder, MsgType, ProtocolError, encode, move_to_shared
from serve.wire.log_records import decode_worker_line
from serve.wire.messages import (
    BatchResult,
    Cancel,
    ErrorItem,
    Loaded,
    LoadFailed,
    PartialItem,
    WorkerSpec,
    decode_engine_report,
    decode_load,
    decode_partial,
    decode_result,
    encode_cancel,
    encode_predict,
)
from serve.wire.shm import Arena, send_arena
from serve.worker.spares import SparePool
from serve.worker.spawn import Child, spawn

__all__ = ["SOCKET_PATH_MAX", "WorkerProcess", "WorkerStartFailed"]

logger = logging.getLogger(__name__)
model_logger = logging.getLogger("serve.worker")

# sun_path holds 108 bytes on Linux, the terminating NUL included.
SOCKET_PATH_MAX = 107
# How many of an engine's latest reservations its expected one is the largest of.
RECENT_RESERVATIONS = 32


class WorkerStartFailed(ServeError):
    error_type = "WorkerStartFailed"


class WorkerProcess:
    """One ``python -m serve.worker`` subprocess and its socket."""

    def __init__(
        self,
        worker_id: str,
        spec: WorkerSpec,
        socket_dir: Path,
        *,
        env: dict[str, str] | None = None,
        spares: SparePool | None = None,
        use_spare: bool = True,
        arena_bytes: int = 0,
        arena_threshold: int = 1 << 16,
        liveness_timeout: float = 0.0,
    ) -> None:
        self.worker_id = worker_id
        self.spares = spares
        self.use_spare = use_spare  # False: start cold even when a spare is ready
        self.modules: list[str] | None = None  # the frameworks it imported, once loaded
        self.spec = spec
        # A short random name: the path must not grow with the model's name (sun_path limit).
        self.socket_path = socket_dir / f"w-{secrets.token_hex(6)}.sock"
        self.env = env
        self._state = WorkerState.STARTING
        self.pid: int | None = None
        self.started_at = time.time()
        self.gpu_id: int | None = spec.gpu_id
        self.threads: int | None = spec.num_threads  # its share of the thread budget
        self.warm = False  # started from a warm spare
        self.proc: Child | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._partials: dict[int, Callable[[list[ItemResult]], None]] = {}
        self._seq = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._exited = asyncio.Event()
        self.exit_code: int | None = None
        self.warmup: dict[str, Any] = {}
        self.gpu_memory: int | None = None  # bytes torch holds, once loaded
        # What a worker that runs many requests at once reported in LOADED ("slots", and its
        # engine's limits); empty for the one-batch-at-a-time loop.
        self.limits: dict[str, int] = {}
        # A generative engine's latest live counts (ENGINE frames: `EngineReport.stats`), and
        # the cache positions each of its requests in flight reserves, once it said.
        self.engine_stats: dict[str, int] = {}
        self._reserved: dict[int, int] = {}
        self._recent: collections.deque[int] = collections.deque(maxlen=RECENT_RESERVATIONS)
        self.on_reservations: Callable[[], None] | None = None  # called when some arrive
        # Large request bodies go through a shared-memory arena (serve/wire/shm.py); 0: inline only.
        self.arena_bytes = arena_bytes
        self.arena_threshold = max(1, arena_threshold)
        self.arena: Arena | None = None
        # A worker that keeps many requests in flight reads frames on a thread of its own that
        # answers PING at once; one silent this long (seconds; 0: not checked) is replaced.
        self.liveness_timeout = liveness_timeout
        self._last_pong = time.monotonic()

    @property
    def state(self) -> WorkerState:
        return self._state

    @property
    def in_flight(self) -> int:
        """Batches sent and not yet answered (more than one on a worker with slots)."""
        return len(self._pending)

    def change_state(self, wanted: WorkerState) -> bool:
        """The one way its state changes (the dispatcher and the pool ask here too)."""
        self._state = next_state(self._state, wanted)
        return self._state is wanted

    async def start(self, timeout: float) -> None:
        """Spawn the process and wait until its handler is loaded; raises `WorkerStartFailed`."""
        connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        connected = asyncio.get_running_loop().create_future()

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if connected.done():
                writer.close()
                return
            if self.arena is not None and self.arena.fd is not None:
                try:  # before any frame: the worker expects it first (its spec says so)
                    send_arena(writer.get_extra_info("socket"), self.arena.fd)
                except OSError as exc:
                    logger.error("Sending worker %s its arena failed: %s", self.worker_id, exc)
                    writer.close()  # the worker sees the socket close and exits
                    return
                self.arena.close_fd()
            connected.set_result((reader, writer))

        if len(os.fsencode(self.socket_path)) > SOCKET_PATH_MAX:
            raise WorkerStartFailed(
                f"the work directory's path is too long for a Unix socket ({SOCKET_PATH_MAX} "
                "bytes at most); set a shorter work_dir"
            )
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = await asyncio.start_unix_server(on_connect, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self.arena = Arena.create(self.arena_bytes, f"lantern-arena-{self.worker_id}")
        spec = self.spec.started(
            str(self.socket_path), self.worker_id, self.arena.size if self.arena is not None else 0
        )
        if self.spares is not None:
            self.spares.worker_starting()
        try:
            self.proc = await self._spawn(spec, timeout / 2)
            self.pid = self.proc.pid
            if self.warm:
                logging.getLogger("serve.spares").info(
                    "Worker %s started from a warm spare (pid %s)", self.worker_id, self.pid
                )
            self._tasks = [
                asyncio.create_task(self._pipe_log(self.proc.stdout, logging.INFO)),
                asyncio.create_task(self._pipe_log(self.proc.stderr, logging.INFO)),
                asyncio.create_task(self._watch_exit()),
            ]
            reader, writer = await self._await_or_exit(connected, timeout)
            self._writer = writer
            decoder = FrameDecoder()
            deadline = time.monotonic() + timeout
            loaded = await self._await_or_exit(
                self._read_until_loaded(reader, decoder), max(0.1, deadline - time.monotonic())
            )
            if isinstance(loaded, LoadFailed):
                raise WorkerStartFailed(str(loaded))
            self.modules = loaded.modules
            if self.spares is not None:
                self.spares.learn(self.modules)
            self.warmup = loaded.warmup  # requests, batches, seconds
            self.gpu_memory = loaded.gpu_memory
            self.limits = loaded.limits
            self._tasks.append(asyncio.create_task(self._read_results(reader, decoder)))
            if self.liveness_timeout > 0 and self.limits.get("slots"):
                self._tasks.append(asyncio.create_task(self._watch_liveness()))
            self.change_state(WorkerState.READY)
        except BaseException:
            self.kill()
            self._close_arena()
            raise
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            if self.spares is not None:
                self.spares.worker_started()

    async def _spawn(self, spec: WorkerSpec, wait: float) -> Child:
        """A warm spare given ``spec`` on its stdin (see `serve.worker.spares`; one still
        starting is waited for, up to ``wait`` seconds), else a fresh interpreter given it on
        its command line."""
        spare = None
        if self.spares is not None and self.use_spare:
            spare = await self.spares.acquire(wait)
        if spare is not None:
            assert spare.stdin is not None
            try:
                spare.stdin.write(spec.encode().encode() + b"\n")
                await spare.stdin.drain()
                spare.stdin.close()
                self.warm = True
                return spare
            except (ConnectionError, RuntimeError):  # it died meanwhile: start afresh
                spare.kill()
        return await spawn([sys.executable, "-m", "serve.worker", spec.encode()], env=self.env)

    async def _await_or_exit(self, awaitable: Any, timeout: float) -> Any:
        task = asyncio.ensure_future(awaitable)
        exited = asyncio.create_task(self._exited.wait())
        try:
            done, _ = await asyncio.wait(
                {task, exited}, timeout=timeout, return_when="FIRST_COMPLETED"
            )
        finally:
            exited.cancel()
        if task in done:
            return task.result()
        task.cancel()
        if exited in done:
            raise WorkerStartFailed(
                f"worker {self.worker_id} exited with code {self.exit_code} while loading"
            )
        raise WorkerStartFailed(f"worker {self.worker_id} did not load within {timeout:g} s")

    async def _read_until_loaded(
        self, reader: asyncio.StreamReader, decoder: FrameDecoder
    ) -> Loaded | LoadFailed:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                raise WorkerStartFailed(f"worker {self.worker_id} closed its socket while loading")
            for frame in decoder.feed(data):
                if frame.type in (MsgType.LOADED, MsgType.LOAD_FAILED):
                    return decode_load(frame)

    async def _read_results(self, reader: asyncio.StreamReader, decoder: FrameDecoder) -> None:
        try:
            while data := await reader.read(1 << 20):
                for frame in decoder.feed(data):
                    if frame.type == MsgType.PARTIAL:
                        on_partial = self._partials.get(frame.seq)
                        if on_partial is not None:
                            on_partial(_partial_results(frame))
                        continue
                    if frame.type == MsgType.ENGINE:
                        self._engine_report(frame)
                        continue
                    if frame.type == MsgType.PONG:
                        self._last_pong = time.monotonic()
                        continue
                    self._partials.pop(frame.seq, None)
                    self._reserved.pop(frame.seq, None)
                    if self.arena is not None:  # the final RESULT: the worker is done with it
                        self.arena.release(frame.seq)
                    future = self._pending.pop(frame.seq, None)
                    if future is not None and not future.done():
                        future.set_result(frame)
        except (ConnectionError, ProtocolError) as exc:
            logger.error("Worker %s connection failed: %s", self.worker_id, exc)
        # A closed socket means the worker is gone: stop taking batches now, not once the exit
        # watcher has seen the process end (jobs sent meanwhile would fail instead of retrying).
        self.change_state(WorkerState.DEAD)
        self._fail_pending()
        self.kill()
        if self._writer is not None:  # our end of the socket, now, not when collected
            self._writer.close()

    async def _watch_liveness(self) -> None:
        """PING the worker every tenth of `liveness_timeout`; kill it when no PONG came for
        that long (its frame reader is stuck: it would never read a request or a cancel again).
        Its death takes the usual path: in-flight jobs fail, the pool restarts it."""
        interval = self.liveness_timeout / 10
        self._last_pong = time.monotonic()
        seq = 0
        while self.state not in (WorkerState.DEAD, WorkerState.STOPPING):
            silent = time.monotonic() - self._last_pong
            if silent > self.liveness_timeout:
                logging.getLogger("serve.liveness").error(  # lantern.log, not the model's
                    "Worker %s (pid %s) answered no liveness ping for %.1f s "
                    "(worker_liveness_timeout); killing it",
                    self.worker_id,
                    self.pid,
                    silent,
                )
                self.change_state(WorkerState.DEAD)
                self.kill()
                return
            seq += 1
            if self._writer is not None:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    self._writer.writelines(encode(Frame(MsgType.PING, seq)))
            slept = time.monotonic()
            await asyncio.sleep(interval)
            if time.monotonic() - slept > 2 * interval:
                # This event loop was held (not the worker): PONGs may wait unread. Count anew.
                self._last_pong = time.monotonic()

    def _engine_report(self, frame: Frame) -> None:
        report = decode_engine_report(frame)
        if report.stats:  # a report of reservations alone carries none
            self.engine_stats = report.stats
        for seq, tokens in report.reserved.items():
            self._recent.append(tokens)
            if seq in self._pending:  # not one answered (or cancelled) meanwhile
                self._reserved[seq] = tokens
        if report.reserved and self.on_reservations is not None:
            self.on_reservations()

    def reservations(self) -> tuple[int, int]:
        """(cache positions reserved, requests) over the requests in flight whose reservation
        the engine reported; slot placement estimates the others (`expected_reservation`)."""
        return sum(self._reserved.values()), len(self._reserved)

    def expected_reservation(self) -> int | None:
        """The largest of the engine's last `RECENT_RESERVATIONS` reservations (None before
        its first): what slot placement counts a request at until the engine reports it."""
        return max(self._recent) if self._recent else None

    async def _pipe_log(self, stream: asyncio.StreamReader | None, level: int) -> None:
        if stream is None:
            return
        is_stdout = self.proc is not None and stream is self.proc.stdout
        extra = {
            "model": self.spec.model_name,
            "version": self.spec.model_version,
            "worker_id": self.worker_id,
            "stream": "stdout" if is_stdout else "stderr",
        }
        while True:
            try:
                line = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    return
                line = exc.partial
            except asyncio.LimitOverrunError as exc:
                # A line past the reader's 64 KiB limit arrives in pieces instead of ending this
                # task (an unread pipe would soon block the worker).
                line = await stream.read(max(exc.consumed, 1))
            text = line.decode(errors="replace").rstrip("\r\n")
            record = decode_worker_line(text)
            if record is None:  # print() output and anything else not from logging
                model_logger.log(level, "%s", text, extra=extra)
            else:
                record_level, message, fields = record
                model_logger.log(record_level, "%s", message, extra={**extra, **fields})

    async def _watch_exit(self) -> None:
        assert self.proc is not None
        self.exit_code = await self.proc.wait()
        self.change_state(WorkerState.DEAD)
        self._exited.set()
        self._fail_pending()

    def _fail_pending(self) -> None:
        self._close_arena()  # the worker is gone: so is every batch's space
        self._reserved.clear()
        self.engine_stats = {}  # nothing runs there any more
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(WorkerDied(f"Worker {self.worker_id} died."))

    async def run_batch(
        self,
        items: list[BatchItem],
        on_partial: Callable[[list[ItemResult]], None] | None = None,
    ) -> BatchOutcome:
        """Send one batch and wait for its results; raises `WorkerDied` if the process dies.

        ``on_partial`` receives each intermediate chunk a streaming handler sends (one result per
        item) before the final results.
        """
        if self._writer is None or self.state == WorkerState.DEAD:
            raise WorkerDied(f"Worker {self.worker_id} is not running.")
        self._seq += 1
        seq = self._seq
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[seq] = future
        if on_partial is not None:
            self._partials[seq] = on_partial
        frame = encode_predict(seq, items)
        arena = self.arena
        if arena is not None:  # bodies that fit go by shared memory, freed with the RESULT
            frame = move_to_shared(frame, self.arena_threshold, lambda p: arena.place(seq, p))
        try:
            self._writer.writelines(encode(frame))
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._pending.pop(seq, None)
            self._partials.pop(seq, None)
            if self.arena is not None:
                self.arena.release(seq)
            raise WorkerDied(f"Worker {self.worker_id} died.") from exc
        try:
            result = await future
        except asyncio.CancelledError:
            # The client left or the deadline passed: the worker drops the request and still
            # answers it (that RESULT frees the arena space and is otherwise ignored).
            self._pending.pop(seq, None)
            self._partials.pop(seq, None)
            self._reserved.pop(seq, None)
            self.cancel(seq)
            raise
        return _outcome(result)

    def cancel(self, seq: int, reason: str = "cancelled") -> None:
        """Send CANCEL for batch ``seq`` (a worker with slots drops it; others ignore it)."""
        if self._writer is None or self.state == WorkerState.DEAD:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.writelines(encode(encode_cancel(Cancel(seq, reason))))

    def set_threads(self, threads: int) -> None:
        """Give a running worker a new intra-op thread share (applied before its next batch)."""
        if threads == self.threads or self._writer is None or self.state == WorkerState.DEAD:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.writelines(encode(Frame(MsgType.THREADS, 0, {"threads": threads})))
            self.threads = threads

    async def wait_exit(self) -> int | None:
        await self._exited.wait()
        return self.exit_code

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)

    async def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit; SIGTERM, then SIGKILL, if it does not."""
        self.change_state(WorkerState.STOPPING)
        if self.proc is None:
            return
        if self._writer is not None and self.proc.returncode is None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self._writer.writelines(encode(Frame(MsgType.SHUTDOWN, 0, {})))
                await self._writer.drain()
        for sig, wait in ((None, grace), (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            if sig is not None and self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self._exited.wait(), wait)
                break
            except asyncio.TimeoutError:
                continue
        for task in self._tasks:
            if not task.done():
                task.cancel()
        if self._writer is not None:
            self._writer.close()
        self._close_arena()

    def _close_arena(self) -> None:
        arena, self.arena = self.arena, None
        if arena is not None:
            arena.close()


def _outcome(frame: Frame) -> BatchOutcome:
    return batch_outcome(decode_result(frame))


def batch_outcome(result: BatchResult) -> BatchOutcome:
    """A worker's answer to a batch as the dispatcher takes it: errors become `ServeError`s."""
    return BatchOutcome(
        [
            item.exception()
            if isinstance(item, ErrorItem)
            else ItemResult(item.status, item.body, item.content_type, item.headers)
            for item in result.items
        ],
        result.timings,
        result.metrics,
    )


def _partial_results(frame: Frame) -> list[ItemResult]:
    return partial_results(decode_partial(frame))


def partial_results(items: Sequence[PartialItem]) -> list[ItemResult]:
    """Streamed chunks as the results the dispatcher pushes to each request's stream."""
    return [ItemResult(200, item.body, item.content_type) for item in items]
