"""The typed messages inside the frames: the worker's spec, a PREDICT batch's items, a RESULT
batch's answers and a PARTIAL frame's chunks, each with one encoder and one decoder.

    WorkerSpec    frontend → worker: JSON on its command line (or a spare's stdin)
    PredictItem   a PREDICT's ``{"requests": [{"id", "headers", "params": [[name, ct]]}]}``,
                  and a payload per parameter
    BatchResult   a RESULT's ``{"items": [...], "timings": {...}, "metrics": [...]}``, each item
      ResultItem    ``{"status", "ct", "headers"}`` and its body as the payload, or
      ErrorItem     ``{"error": {"code", "type", "message", "request_id"}}`` and an empty payload
    PartialItem   a PARTIAL's ``{"items": [{"ct"}]}``, a streamed chunk per item, and its body
    Loaded        LOADED ``{"pid", "modules", "warmup", "gpu_memory"}``: ready, after warm-up
    LoadFailed    LOAD_FAILED ``{"type", "message"}``: the handler did not load or warm up
    Cancel        CANCEL ``{"reason"}``: drop the batch ``seq`` (a worker with slots)
    EngineReport  ENGINE ``{"stats": {...}, "reserved": [[seq, tokens]]}``: a generative
                  engine's live counts, and the cache positions requests it just took reserve

These run for every batch on both sides: plain slotted dataclasses, no validation beyond what
decoding needs (a malformed frame is a `ProtocolError`, a bug rather than user input).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from serve.wire.errors import ServeError, error_for_status
from serve.wire.frames import Frame, MsgType, ProtocolError

__all__ = [
    "BatchResult",
    "EngineReport",
    "ErrorItem",
    "LoadFailed",
    "Loaded",
    "PartialItem",
    "PredictItem",
    "ResultItem",
    "WorkerSpec",
    "decode_engine_report",
    "decode_load",
    "decode_partial",
    "decode_predict",
    "decode_result",
    "encode_engine_report",
    "encode_load",
    "encode_partial",
    "encode_predict",
    "encode_result",
]


@dataclass(slots=True)
class WorkerSpec:
    """Everything a worker process needs to load its model and reach the frontend.

    The frontend builds it (`serve.core.model.ModelVersion.worker_spec`, the Ray adapter); the
    worker process fills in ``socket``, ``worker_id`` and ``shm_bytes`` when it starts one.
    """

    model_name: str
    model_version: str
    model_dir: str
    manifest: dict[str, Any]
    handler: str | None = None  # overrides the manifest's handler
    batch_size: int = 1
    gpu_id: int | None = None
    num_threads: int | None = None  # its share of the intra-op thread budget
    cpu_affinity: list[int] | None = None
    model_yaml_config: dict[str, Any] = field(default_factory=dict)
    limit_max_image_pixels: bool = True
    decode_input_request: bool = True
    log_level: str = "INFO"
    metrics_config: str | None = None  # TorchServe's metrics.yaml: its model_metrics
    dependency_path: str | None = None  # install_py_dep_per_model: first on sys.path
    preload: list[str] = field(default_factory=list)  # frameworks to import at low priority
    start_nice: int = 0
    server_version: str = ""  # the frontend's serve.__version__, for the handler's context
    envelope: str | None = None  # TorchServe's service_envelope: json, body, kserve, kservev2
    socket: str = ""
    worker_id: str = ""
    shm_bytes: int = 0  # the shared-memory arena's size; 0: none (serve.wire.shm)

    def started(self, socket: str, worker_id: str, shm_bytes: int) -> WorkerSpec:
        """This spec for one process: where it connects, its id and its arena."""
        return replace(self, socket=socket, worker_id=worker_id, shm_bytes=shm_bytes)

    def encode(self) -> str:
        return json.dumps({name: getattr(self, name) for name in _SPEC_FIELDS})

    @classmethod
    def decode(cls, text: str | bytes) -> WorkerSpec:
        """The spec ``encode`` wrote; unknown or missing keys are a `ProtocolError`."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ProtocolError(f"the worker spec is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ProtocolError("the worker spec is not a JSON object")
        unknown = data.keys() - _SPEC_FIELDS
        if unknown:
            raise ProtocolError(f"unknown worker spec keys: {', '.join(sorted(unknown))}")
        try:
            return cls(**data)
        except TypeError as exc:  # a required key missing
            raise ProtocolError(f"incomplete worker spec: {exc}") from exc


_SPEC_FIELDS = tuple(f.name for f in fields(WorkerSpec))


@dataclass(slots=True)
class PredictItem:
    """One request of a batch: its id, headers and parameters as ``(name, content type, body)``.

    The frontend's dispatcher queues these as they are (`serve.core.jobs.BatchItem`)."""

    request_id: str
    headers: dict[str, str]
    params: list[tuple[str, str | None, bytes]]


def encode_predict(seq: int, items: Sequence[PredictItem]) -> Frame:
    """The PREDICT frame: ids, headers and parameter names and types in the metadata, the bodies
    as the payloads, in order."""
    meta = {
        "requests": [
            {
                "id": it.request_id,
                "headers": it.headers,
                "params": [[n, ct] for n, ct, _ in it.params],
            }
            for it in items
        ]
    }
    return Frame(MsgType.PREDICT, seq, meta, tuple(p[2] for it in items for p in it.params))


def decode_predict(frame: Frame) -> list[PredictItem]:
    """A PREDICT frame's items, each parameter with its payload."""
    payloads = frame.payloads
    used = 0
    items = []
    try:
        for req in frame.meta["requests"]:
            params = []
            for name, content_type in req["params"]:
                params.append((name, content_type, payloads[used]))
                used += 1
            items.append(PredictItem(req["id"], req["headers"], params))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ProtocolError(f"malformed PREDICT frame: {exc!r}"[:200]) from exc
    if used != len(payloads):
        raise ProtocolError(f"malformed PREDICT frame: {len(payloads)} payloads, {used} parameters")
    return items


@dataclass(slots=True)
class ResultItem:
    """One request's answer: its status, content type, response headers and body."""

    status: int
    content_type: str | None
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class ErrorItem:
    """One request's failure, in the error tree's terms (`serve.wire.errors`)."""

    code: int
    type: str
    message: str
    request_id: str | None = None

    @classmethod
    def of(cls, error: ServeError, request_id: str | None = None) -> ErrorItem:
        return cls(error.status_code, error.error_type, error.message, request_id)

    def exception(self) -> ServeError:
        """The error the frontend answers the request with."""
        return error_for_status(self.code, self.message, self.type)


@dataclass(slots=True)
class BatchResult:
    """A batch's RESULT: one item per request, in order, with the handler's phase timings
    (seconds) and the custom metrics it recorded."""

    items: list[ResultItem | ErrorItem]
    timings: dict[str, float] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)


def encode_result(seq: int, result: BatchResult) -> Frame:
    items: list[dict[str, Any]] = []
    bodies: list[bytes] = []
    for item in result.items:
        if isinstance(item, ResultItem):
            items.append({"status": item.status, "ct": item.content_type, "headers": item.headers})
            bodies.append(item.body)
        else:
            assert isinstance(item, ErrorItem), item
            error: dict[str, Any] = {"code": item.code, "type": item.type, "message": item.message}
            if item.request_id is not None:
                error["request_id"] = item.request_id
            items.append({"error": error})
            bodies.append(b"")
    meta = {"items": items, "timings": result.timings, "metrics": result.metrics}
    return Frame(MsgType.RESULT, seq, meta, tuple(bodies))


def decode_result(frame: Frame) -> BatchResult:
    meta = frame.meta
    items: list[ResultItem | ErrorItem] = []
    try:
        for item, body in zip(meta["items"], frame.payloads, strict=True):
            error = item.get("error")
            if error:
                items.append(
                    ErrorItem(
                        error["code"], error["type"], error["message"], error.get("request_id")
                    )
                )
            else:
                items.append(
                    ResultItem(item["status"], item.get("ct"), item.get("headers") or {}, body)
                )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed RESULT frame: {exc!r}"[:200]) from exc
    return BatchResult(items, meta.get("timings") or {}, meta.get("metrics") or [])


@dataclass(slots=True)
class PartialItem:
    """One item's intermediate chunk from a streaming handler (status 200 by definition)."""

    content_type: str | None
    body: bytes


def encode_partial(seq: int, items: Sequence[PartialItem]) -> Frame:
    meta = {"items": [{"ct": item.content_type} for item in items]}
    return Frame(MsgType.PARTIAL, seq, meta, tuple(item.body for item in items))


def decode_partial(frame: Frame) -> list[PartialItem]:
    try:
        return [
            PartialItem(item.get("ct"), body)
            for item, body in zip(frame.meta["items"], frame.payloads, strict=True)
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed PARTIAL frame: {exc!r}"[:200]) from exc


@dataclass(slots=True)
class Loaded:
    """The worker is ready: its handler is loaded and warmed up."""

    pid: int
    modules: list[str]  # the frameworks it imported (`serve.worker.spares.loaded_frameworks`)
    warmup: dict[str, Any]  # requests, batches, seconds
    gpu_memory: int | None = None  # bytes torch holds on its GPU; None: no CUDA through torch
    # A worker that runs many requests at once (`serve.worker.concurrent`): its most in flight
    # ("slots"), plus its engine's limits when it has one; empty for the one-batch-at-a-time loop.
    limits: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class LoadFailed:
    """The worker's handler failed to load or to warm up; ``message`` is fit for a client."""

    type: str
    message: str

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


def encode_load(outcome: Loaded | LoadFailed) -> Frame:
    """The LOADED or LOAD_FAILED frame that ends a worker's start."""
    if isinstance(outcome, Loaded):
        meta: dict[str, Any] = {
            "pid": outcome.pid,
            "modules": outcome.modules,
            "warmup": outcome.warmup,
            "gpu_memory": outcome.gpu_memory,
        }
        if outcome.limits:  # only a worker that runs many requests at once has any
            meta["limits"] = outcome.limits
        return Frame(MsgType.LOADED, 0, meta)
    return Frame(MsgType.LOAD_FAILED, 0, {"type": outcome.type, "message": outcome.message})


def decode_load(frame: Frame) -> Loaded | LoadFailed:
    meta = frame.meta
    try:
        if frame.type == MsgType.LOAD_FAILED:
            return LoadFailed(str(meta["type"]), str(meta["message"]))
        if frame.type == MsgType.LOADED:
            return Loaded(
                meta["pid"],
                list(meta.get("modules") or []),
                meta.get("warmup") or {},
                meta.get("gpu_memory"),
                {str(k): int(v) for k, v in (meta.get("limits") or {}).items()},
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed {frame.type.name} frame: {exc!r}"[:200]) from exc
    raise ProtocolError(f"a {frame.type.name} frame where LOADED or LOAD_FAILED belongs")


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop the batch ``seq`` on a worker that runs many at once: its client left or its
    deadline passed. The worker still answers that batch with a RESULT (a cancelled error)."""

    seq: int
    reason: str = "cancelled"


def encode_cancel(cancel: Cancel) -> Frame:
    return Frame(MsgType.CANCEL, cancel.seq, {"reason": cancel.reason})


def decode_cancel(frame: Frame) -> Cancel:
    if frame.type != MsgType.CANCEL:
        raise ProtocolError(f"a {frame.type.name} frame where CANCEL belongs")
    return Cancel(frame.seq, str(frame.meta.get("reason") or "cancelled"))


# The engine's live counts, as `handlers.generation.engine.Engine.stats` names them (its stats
# also hold the prefix cache's figures, which outlive requests: ``prefix_cache_tokens`` held,
# ``prefix_queried_tokens`` and ``prefix_hit_tokens`` counted since the worker started, and
# ``shared_prompt_tokens``, the prompt tokens not prefilled because an equal prompt was).
ENGINE_STATS = ("waiting", "prefilling", "running", "reserved_tokens", "cached_tokens", "steps")


@dataclass(frozen=True, slots=True)
class EngineReport:
    """A generative engine's state, sent by its worker (`serve.worker.concurrent.EngineLoop`)
    after a step that changed its counts, at most every few tenths of a second while only its
    cache grows, and so always after the step that leaves it idle (all zeros): no count
    outlives its requests.

    ``reserved`` maps a batch ``seq`` the worker has just read to the cache positions its
    requests will reserve (prompt + max_tokens, capped by max_model_len), sent as soon as the
    frame is read (then ``stats`` is empty): the frontend's slot placement counts them against
    the worker's ``max_cached_tokens``.
    """

    stats: dict[str, int]
    reserved: dict[int, int] = field(default_factory=dict)


def encode_engine_report(report: EngineReport) -> Frame:
    meta = {"stats": report.stats, "reserved": [[seq, n] for seq, n in report.reserved.items()]}
    return Frame(MsgType.ENGINE, 0, meta)


def decode_engine_report(frame: Frame) -> EngineReport:
    if frame.type != MsgType.ENGINE:
        raise ProtocolError(f"a {frame.type.name} frame where ENGINE belongs")
    try:
        stats = {str(k): int(v) for k, v in frame.meta["stats"].items()}
        reserved = {int(seq): int(n) for seq, n in frame.meta.get("reserved") or []}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed ENGINE frame: {exc!r}"[:200]) from exc
    return EngineReport(stats, reserved)
