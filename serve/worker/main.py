"""The worker process: load one model's handler, then answer batches over a Unix socket.

Started by the frontend as ``python -m serve.worker SPEC_JSON``. It knows nothing of HTTP: a PREDICT
frame carries each request's id, headers and parameters; the RESULT frame carries one encoded result
(or error) per request, the handler's phase timings and its custom metrics.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from serve.logs import encode_worker_record
from serve.protocol import Frame, FrameReader, MsgType, encode

logger = logging.getLogger("serve.worker")


class Connection:
    """Blocking frame I/O on the worker's socket."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        # Large request bodies are received straight into their own buffers (one copy).
        self.reader = FrameReader(self.sock.recv_into)

    def send(self, frame: Frame) -> None:
        self.sock.sendall(b"".join(encode(frame)))

    def receive(self) -> Frame | None:
        return self.reader.read()


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


def _pin_cpus(spec: dict[str, Any]) -> None:
    """Pin to the CPUs the frontend chose, before any thread pool starts (threads inherit it)."""
    cpus = spec.get("cpu_affinity")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))


def _cap_threads(spec: dict[str, Any]) -> None:
    """Cap torch's intra-op threads, if the handler uses torch at all."""
    threads = spec.get("num_threads")
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


def load(spec: dict[str, Any]) -> tuple[Any, Any]:
    """Build the context and load the handler named by the spec (or its manifest)."""
    from handlers.compat import install_ts_alias
    from handlers.context import Context
    from handlers.metrics import MetricsStore
    from handlers.service import load_service

    install_ts_alias()
    manifest = spec["manifest"]
    context = Context(
        spec["model_name"],
        spec["model_dir"],
        manifest,
        spec["batch_size"],
        spec.get("gpu_id"),
        spec.get("server_version", "0.1.0"),
        limit_max_image_pixels=spec.get("limit_max_image_pixels", True),
        metrics=MetricsStore(model_name=spec["model_name"]),
        model_yaml_config=spec.get("model_yaml_config") or {},
        num_threads=spec.get("num_threads"),
    )
    service = load_service(spec["model_dir"], manifest, context, handler=spec.get("handler"))
    return service, context


def _chunk_sender(conn: Connection, seq: int) -> Callable[[dict[str, Any]], None]:
    """Where ``send_intermediate_predict_response`` chunks go: straight to the frontend."""
    from handlers.output import encode_output

    def send(chunk: dict[str, Any]) -> None:
        items, bodies = [], []
        for value in chunk["results"]:
            body, content_type = encode_output(value)
            items.append({"ct": content_type})
            bodies.append(body)
        conn.send(Frame(MsgType.PARTIAL, seq, {"items": items}, tuple(bodies)))

    return send


def run_batch(service: Any, context: Any, frame: Frame, decode: bool) -> Frame:
    """Run one PREDICT frame through the handler and build its RESULT frame."""
    from handlers.context import RequestProcessor
    from handlers.exceptions import report_failure
    from handlers.inputs import decode_value
    from handlers.output import encode_output
    from handlers.tensor_path import run_protocol_batch

    # OIP / KServe v1 requests take the tensor path (handlers/tensor_path.py), which calls back
    # here for any regular requests in the same batch.
    routed = run_protocol_batch(service, context, frame, decode, run_batch)
    if routed is not None:
        return routed

    requests = frame.meta["requests"]
    batch: list[dict[str, Any]] = []
    payloads = iter(frame.payloads)
    for req in requests:
        row: dict[str, Any] = {}
        for name, content_type in req["params"]:
            raw = next(payloads)
            value = decode_value(raw, content_type) if decode else raw
            if name in row:  # several files under one form field arrive as a list
                prev = row[name]
                row[name] = [*prev, value] if isinstance(prev, list) else [prev, value]
            else:
                row[name] = value
        batch.append(row)
    context.request_ids = {i: req["id"] for i, req in enumerate(requests)}
    context.request_processor = [RequestProcessor(req["headers"]) for req in requests]
    context.handler_timings = {}
    started = time.perf_counter()
    items: list[dict[str, Any]] = []
    bodies: list[bytes] = []
    try:
        results = service.predict(batch, context)
        for i, result in enumerate(results):
            body, content_type = encode_output(result)
            proc = context.request_processor[i]
            items.append(
                {
                    "status": proc.get_response_status_code() or 200,
                    "ct": context.get_response_content_type(i) or content_type,
                    "headers": dict(proc.get_response_headers() or {}),
                }
            )
            bodies.append(body)
    except Exception as exc:  # a handler bug must not end the worker
        # One record (traceback included) carrying the ids the clients got in x-request-id.
        code, kind, message = report_failure(exc, [req["id"] for req in requests], logger)
        items = [
            {"error": {"code": code, "type": kind, "message": message, "request_id": req["id"]}}
            for req in requests
        ]
        bodies = [b""] * len(requests)
    timings = dict(getattr(context, "handler_timings", None) or {})
    timings["handler"] = time.perf_counter() - started
    meta = {"items": items, "timings": timings, "metrics": context.metrics.drain()}
    return Frame(MsgType.RESULT, frame.seq, meta, tuple(bodies))


class _RecordLines(logging.Handler):
    """Each record as one line on stderr that the frontend decodes (`serve.logs`)."""

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

        spare_spec = wait_as_spare(argv[2].split(",") if len(argv) > 2 else [])
        if spare_spec is None:
            return 0
        spec = spare_spec
    else:
        spec = json.loads(argv[1])
    _setup_logging(str(spec.get("log_level") or "INFO").upper())
    conn = Connection(spec["socket"])
    conn.send(Frame(MsgType.HELLO, 0, {"worker_id": spec["worker_id"], "pid": os.getpid()}))
    try:
        _pin_cpus(spec)
        service, context = load(spec)
        _cap_threads(spec)
    except BaseException as exc:
        logger.error("Failed to load the model", exc_info=True)
        meta = {"type": type(exc).__name__, "message": str(exc) or type(exc).__name__}
        conn.send(Frame(MsgType.LOAD_FAILED, 0, meta))
        return 1
    from serve.worker.spares import loaded_frameworks

    # What it imported tells the server's spares what to preload (serve/worker/spares.py).
    conn.send(Frame(MsgType.LOADED, 0, {"pid": os.getpid(), "modules": loaded_frameworks()}))
    decode = spec.get("decode_input_request", True)
    while True:
        frame = conn.receive()
        if frame is None or frame.type == MsgType.SHUTDOWN:
            return 0
        if frame.type == MsgType.THREADS:
            _set_threads(int(frame.meta["threads"]), context)
            continue
        if frame.type == MsgType.PREDICT:
            context.intermediate_sink = _chunk_sender(conn, frame.seq)
            conn.send(run_batch(service, context, frame, decode))
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
