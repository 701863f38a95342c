"""The worker process: load one model's handler, then answer batches over a Unix socket.

Started by the frontend as ``python -m serve.worker SPEC_JSON``. It knows nothing of HTTP: a PREDICT
frame carries each request's id, headers and parameters; the RESULT frame carries one encoded result
(or error) per request, the handler's phase timings and its custom metrics.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from serve import __version__
from serve.wire.frames import Frame, FrameReader, MsgType, encode, resolve_shared
from serve.wire.log_records import encode_worker_record
from serve.wire.messages import (
    BatchResult,
    ErrorItem,
    Loaded,
    LoadFailed,
    PartialItem,
    PredictItem,
    ResultItem,
    WorkerSpec,
    decode_predict,
    encode_load,
    encode_partial,
    encode_result,
)
from serve.wire.shm import WorkerArena, receive_arena

logger = logging.getLogger("serve.worker")


class Connection:
    """Blocking frame I/O on the worker's socket, and the read-only view of the shared-memory arena
    that big request bodies come through (``shm_bytes`` in the spec, 0: none; `serve.wire.shm`)."""

    def __init__(self, path: str, shm_bytes: int = 0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.arena: WorkerArena | None = None
        if shm_bytes:  # the frontend sends its descriptor first, before any frame
            self.arena = WorkerArena(receive_arena(self.sock, shm_bytes))
        # Large request bodies are received straight into their own buffers (one copy).
        self.reader = FrameReader(self.sock.recv_into)

    def send(self, *frames: Frame) -> None:
        """Write ``frames`` in one go (one system call for a step's many parts)."""
        self.sock.sendall(b"".join(chunk for frame in frames for chunk in encode(frame)))

    def receive(self) -> Frame | None:
        """The next frame (shared-memory payloads copied out, one copy each); None at the end."""
        frame = self.reader.read()
        if frame is not None and "shm" in frame.meta:
            refs = frame.meta["shm"]
            view = self.arena.view if self.arena is not None else None
            frame = resolve_shared(frame, view)  # a bad reference raises ProtocolError
            if self.arena is not None:
                self.arena.drop_pages(refs)
        return frame


def _die_with_parent() -> None:
    """Ask Linux to kill us if the frontend dies, even mid-batch: no orphaned workers."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() == 1:  # the frontend died before we asked
            os._exit(1)


def _pin_cpus(spec: WorkerSpec) -> None:
    """Pin to the CPUs the frontend chose, before any thread pool starts (threads inherit it)."""
    cpus = spec.cpu_affinity
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))


def _cap_threads(spec: WorkerSpec) -> None:
    """Cap torch's intra-op threads, if the handler uses torch at all."""
    threads = spec.num_threads
    # OMP_NUM_THREADS is set in our environment already; torch-free handlers never pay for
    # importing torch here.
    if threads and "torch" in sys.modules:
        import torch

        torch.set_num_threads(int(threads))


def _set_threads(threads: int, context: Any) -> None:
    """A new share of the server's thread budget: torch takes it from the next operator on.

    ONNX Runtime sessions and BLAS pools keep what they were created with (until a restart)."""
    if threads < 1:
        return
    context.system_properties["num_threads"] = threads
    if "torch" in sys.modules:
        import torch

        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _gpu_memory(spec: WorkerSpec) -> int | None:
    """Bytes torch holds on this worker's GPU after load and warm-up (memory admission's
    measure); None when the handler did not use CUDA through torch."""
    gpu_id = spec.gpu_id
    if gpu_id is None or "torch" not in sys.modules:
        return None
    import torch

    try:
        if not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.memory_reserved(int(gpu_id)))
    except Exception:  # a broken CUDA setup must not fail a loaded worker
        return None


def enter_model_dir(spec: WorkerSpec) -> WorkerSpec:
    """Run in the model's directory, as TorchServe's workers do: a handler's relative paths
    (``os.path.isfile("vocab.txt")``) name the archive's files. The spec's paths are made
    absolute first; ``PYTHONPATH`` gains the model directory too, as TorchServe sets it, so the
    processes a handler starts import its modules as it does."""
    model_dir = os.path.abspath(spec.model_dir)
    absolute = replace(
        spec,
        model_dir=model_dir,
        metrics_config=os.path.abspath(spec.metrics_config) if spec.metrics_config else None,
        dependency_path=os.path.abspath(spec.dependency_path) if spec.dependency_path else None,
    )
    if os.path.isdir(model_dir):
        os.chdir(model_dir)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, model_dir])
    return absolute


def load(spec: WorkerSpec) -> tuple[Any, Any]:
    """Build the context and load the handler named by the spec (or its manifest), wrapped in
    the model-config.yaml's ``service_envelope`` if it names one, else the server's."""
    from handlers.compat import install_ts_alias
    from handlers.context import Context
    from handlers.metrics import MetricsStore, read_metrics_yaml
    from handlers.request_envelope import apply_envelope
    from handlers.service import load_service

    if spec.dependency_path:  # install_py_dep_per_model: the model's own packages first
        sys.path.insert(0, spec.dependency_path)
    install_ts_alias()  # after it: the ts shim stays first even if a dependency brought TorchServe
    metrics = MetricsStore(model_name=spec.model_name)
    if spec.metrics_config:  # TorchServe's metrics.yaml: declare its model_metrics
        metrics.declare(read_metrics_yaml(spec.metrics_config).get("model_metrics"))
    context = Context(
        spec.model_name,
        spec.model_dir,
        spec.manifest,
        spec.batch_size,
        spec.gpu_id,
        spec.server_version or __version__,
        limit_max_image_pixels=spec.limit_max_image_pixels,
        metrics=metrics,
        model_yaml_config=spec.model_yaml_config,
        num_threads=spec.num_threads,
    )
    service = load_service(spec.model_dir, spec.manifest, context, handler=spec.handler)
    envelope = (spec.model_yaml_config or {}).get("service_envelope") or spec.envelope
    if envelope:
        apply_envelope(service, str(envelope))
    return service, context


def _chunk_sender(conn: Connection, seq: int) -> Callable[[dict[str, Any]], None]:
    """Where ``send_intermediate_predict_response`` chunks go: straight to the frontend."""
    from handlers.output import encode_output

    def send(chunk: dict[str, Any]) -> None:
        items = []
        for value in chunk["results"]:
            body, content_type = encode_output(value)
            items.append(PartialItem(content_type, body))
        conn.send(encode_partial(seq, items))

    return send


def run_batch(service: Any, context: Any, frame: Frame, decode: bool) -> Frame:
    """One PREDICT frame through the handler: its RESULT frame (`run_items` on the frame's
    messages)."""
    return encode_result(frame.seq, run_items(service, context, decode_predict(frame), decode))


def run_items(service: Any, context: Any, requests: list[PredictItem], decode: bool) -> BatchResult:
    """Run one batch of requests through the handler: one result or error per request."""
    from handlers.context import RequestProcessor
    from handlers.exceptions import PredictionException, report_failure
    from handlers.inputs import decode_value
    from handlers.output import encode_output
    from serve.worker.tensor_path import run_protocol_batch

    # OIP / KServe v1 requests take the tensor path (serve/worker/tensor_path.py), which calls back
    # here for any regular requests in the same batch.
    routed = run_protocol_batch(service, context, requests, decode, run_items)
    if routed is not None:
        return routed

    batch: list[dict[str, Any]] = []
    refused: dict[int, PredictionException] = {}
    for index, req in enumerate(requests):
        row: dict[str, Any] = {}
        for name, content_type, raw in req.params:
            try:
                value = decode_value(raw, content_type) if decode else raw
            except PredictionException as exc:  # e.g. JSON nested too deeply to parse
                refused[index] = exc
                continue
            if name in row:  # several files under one form field arrive as a list
                prev = row[name]
                row[name] = [*prev, value] if isinstance(prev, list) else [prev, value]
            else:
                row[name] = value
        batch.append(row)
    if refused:
        return _without_refused(service, context, requests, decode, refused)
    context.request_ids = {i: req.request_id for i, req in enumerate(requests)}
    context.request_processor = [RequestProcessor(req.headers) for req in requests]
    context.handler_timings = {}
    started = time.perf_counter()
    items: list[ResultItem | ErrorItem] = []
    try:
        results = service.predict(batch, context)
        mark_stream_next(context, results)
        for i, result in enumerate(results):
            body, content_type = encode_output(result)
            proc = context.request_processor[i]
            items.append(
                ResultItem(
                    proc.get_response_status_code() or 200,
                    context.get_response_content_type(i) or content_type,
                    dict(proc.get_response_headers() or {}),
                    body,
                )
            )
    except Exception as exc:  # a handler bug must not end the worker
        # One record (traceback included) carrying the ids the clients got in x-request-id.
        ids = [req.request_id for req in requests]
        code, kind, message = report_failure(exc, ids, logger)
        items = [ErrorItem(code, kind, message, rid) for rid in ids]
    timings = dict(getattr(context, "handler_timings", None) or {})
    timings["handler"] = time.perf_counter() - started
    return BatchResult(items, timings, context.metrics.drain())


def mark_stream_next(context: Any, results: list[Any]) -> None:
    """Ask the handler's ``context.stopping_criteria`` (one callable per row, given the row's
    result) whether each answer is complete, as TorchServe's worker does: True sets the response
    header ``ts_stream_next: false``, False sets ``true`` (the answer goes on), None sets none.
    """
    criteria = getattr(context, "stopping_criteria", None)
    if not criteria:
        return
    for i, result in enumerate(results):
        if i >= len(criteria):
            break
        stop = criteria[i](result)
        if stop is not None:
            context.set_response_header(i, "ts_stream_next", "false" if stop else "true")


def _without_refused(
    service: Any,
    context: Any,
    requests: list[PredictItem],
    decode: bool,
    refused: dict[int, Any],
) -> BatchResult:
    """Answer the requests whose input could not be decoded with their 4xx; run the others."""
    keep = [req for index, req in enumerate(requests) if index not in refused]
    ran = run_items(service, context, keep, decode) if keep else BatchResult([])
    done = iter(ran.items)
    items: list[ResultItem | ErrorItem] = []
    for index, req in enumerate(requests):
        exc = refused.get(index)
        if exc is None:
            items.append(next(done))
        else:
            items.append(
                ErrorItem(exc.error_code, "PredictionException", exc.message, req.request_id)
            )
    return BatchResult(items, ran.timings, ran.metrics)


def client_errors(result: BatchResult) -> BatchResult:
    """A batch's errors as clients may see them: one line, no paths (`serve.wire.redact`).

    The full text is in the model log already (the frontend adds the request id to 500s).
    """
    from serve.wire.redact import client_message

    for item in result.items:
        if isinstance(item, ErrorItem):
            item.message = client_message(item.message) or item.type
    return result


def load_failure(spec: WorkerSpec, exc: BaseException) -> LoadFailed:
    """What the frontend (and a management client) hears of a handler that failed to load.

    It names the handler and the exception; its text, one line without paths, stays short: the
    traceback is in the model log.
    """
    from serve.wire.redact import client_message

    handler = spec.handler or spec.manifest.get("model", {}).get("handler")
    detail = client_message(str(exc)) or type(exc).__name__
    message = f"handler {handler or '?'} failed to load ({detail}); see the model log"
    return LoadFailed(type(exc).__name__, message)


class _RecordLines(logging.Handler):
    """Each record as one line on stderr that the frontend decodes (`serve.wire.log_records`)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = encode_worker_record(record, self.formatter or logging.Formatter())
            sys.stderr.write(line)
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _setup_logging(level: str) -> None:
    handler = _RecordLines()
    handler.setFormatter(logging.Formatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)  # warnings.warn() in handlers becomes a model-log record


def main(argv: list[str]) -> int:
    # The frontend stops us with SHUTDOWN or SIGTERM; Ctrl-C in a foreground server must not
    # kill workers before the frontend drains them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if argv[1] == "--spare":  # a warm spare: the spec comes on stdin when a worker is needed
        from serve.worker.spares import wait_as_spare

        modules = argv[2].split(",") if len(argv) > 2 and argv[2] else []
        line = wait_as_spare(modules, int(argv[3]) if len(argv) > 3 else 0)
        if line is None:
            return 0
        spec = WorkerSpec.decode(line)
    else:
        spec = WorkerSpec.decode(argv[1])
    _setup_logging(spec.log_level.upper())
    conn = Connection(spec.socket, spec.shm_bytes)
    spec = enter_model_dir(spec)
    conn.send(Frame(MsgType.HELLO, 0, {"worker_id": spec.worker_id, "pid": os.getpid()}))
    try:
        _pin_cpus(spec)
        if spec.preload and argv[1] != "--spare":  # a spare has imported them already
            from serve.worker.spares import preload

            took = preload(spec.preload, spec.start_nice)
            logger.info(
                "Imported %s at nice %d in %.2f s", ", ".join(spec.preload), spec.start_nice, took
            )
        service, context = load(spec)
        _cap_threads(spec)
    except BaseException as exc:
        logger.error("Failed to load the model", exc_info=True)
        conn.send(encode_load(load_failure(spec, exc)))
        return 1
    # Warm-up runs through the real handler before we report loaded: no request ever meets a
    # cold worker, whether it was started by a register, a scale-up, a restart or a swap.
    from serve.worker.spares import loaded_frameworks
    from serve.worker.warmup import WarmupFailed, run_warmup

    try:
        warmup = run_warmup(service, context, spec, run_batch)
    except WarmupFailed as exc:
        logger.error("Warm-up failed: %s", exc)
        conn.send(encode_load(LoadFailed("WarmupFailed", str(exc))))
        return 1
    from serve.worker.concurrent import concurrent_loop

    # A generative engine or an asyncCommunication handler keeps many requests in flight.
    many = concurrent_loop(service, context, spec)
    limits = many.limits if many is not None else {}
    # What it imported tells the server's spares what to preload (serve/worker/spares.py).
    loaded = Loaded(os.getpid(), loaded_frameworks(), warmup, _gpu_memory(spec), limits)
    conn.send(encode_load(loaded))
    decode = spec.decode_input_request
    if many is not None:
        return many.run(conn, decode, lambda threads: _set_threads(threads, context))
    while True:
        frame = conn.receive()
        if frame is None or frame.type == MsgType.SHUTDOWN:
            return 0
        if frame.type == MsgType.THREADS:
            _set_threads(int(frame.meta["threads"]), context)
            continue
        if frame.type == MsgType.PREDICT:
            context.intermediate_sink = _chunk_sender(conn, frame.seq)
            result = run_items(service, context, decode_predict(frame), decode)
            conn.send(encode_result(frame.seq, client_errors(result)))
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
