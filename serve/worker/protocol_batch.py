"""One batch of protocol requests in the worker: the tensor fast path or the custom handler.

* ``metadata`` requests are answered with the model's input/output metadata (JSON).
* ``oip`` requests carry one tensor parameter per input; ``kserve-v1`` requests carry the client's
  JSON body, parsed here (``serve.wire.kserve_v1``), where the model's input types are known.
* A model the base handler serves as it is (``handlers.tensor_models.adapter_for``) takes the fast
  path: each request's inputs are checked against the model's metadata, requests are concatenated
  along dimension 0 across the batch, the model runs once and the outputs are split back. OIP
  requests get a tensor bundle (``serve.wire.tensor_params``), v1 requests their JSON answer.
* Every other handler gets the decoded requests through its usual ``handle(rows, context)``:

  - an OIP request is one row ``{input name: numpy array}`` (BYTES inputs: object arrays of
    bytes); its result may be a ``{output name: array-like}`` dict, an OIP-style
    ``{"outputs": [{"name", "datatype", "shape", "data"}]}`` dict, or one array-like (named after
    the first output declared under ``metadata:`` in model-config.yaml, else ``output0``).
  - a v1 ``instances`` request is one row per instance, ``{"data": value}`` or
    ``{input name: value}``, with ``{"b64": ...}`` values decoded to bytes; a columnar
    ``inputs`` request is a single such row. Results may be anything JSON can hold (arrays become
    lists, bytes ``{"b64": ...}``) and become ``predictions`` / ``outputs`` / ``explanations``.

  Request headers reach the handler as usual; ``x-lantern-parameters`` holds the OIP request's
  ``parameters`` as JSON.
* A handler wrapped in a ``service_envelope``, or whose model-config.yaml says
  ``protocol_inputs: torchserve``, gets the requests as TorchServe gives them instead: one row
  ``{"body": request JSON}`` per request (`serve.worker.torchserve_rows`), and a v2 answer is its
  v2 response object (``{"outputs": [...]}``). An envelope's handler is called once per request:
  TorchServe's envelopes read only the batch's first row. A fast-path model keeps its fast path.
* Regular requests that share the batch run through ``fallback`` (the worker's ``run_items``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from handlers import tensor_models
from handlers.exceptions import TensorError, report_failure
from handlers.tensor_models import Job, ModelAdapter, Outputs
from serve.wire import (
    KINDS,
    KSERVE_V1,
    MAX_ELEMENTS_HEADER,
    METADATA,
    OIP,
    OUTPUTS_HEADER,
    kserve_v1,
)
from serve.wire.errors import BadRequest, ServeError
from serve.wire.kserve_v1 import V1Request
from serve.wire.messages import BatchResult, ErrorItem, PredictItem, ResultItem
from serve.wire.tensor_params import Tensor, encode_bundle, is_tensor_param, tensor_from_param
from serve.wire.tensors import array_from_json, bf16_to_float32, datatype_of
from serve.worker import torchserve_rows

logger = logging.getLogger("serve.worker")

Answer = ResultItem | ErrorItem
RunItems = Callable[[Any, Any, list[PredictItem], bool], BatchResult]
# Errors whose status and type are the client's answer as they are: the server's, and those the
# tensor models raise (`handlers.exceptions.TensorError`, the same shape).
_ANSWERED = (ServeError, TensorError)

_UNSET = object()  # a service whose tensor adapter was not looked for yet


@dataclass(slots=True)
class Pending:
    """One protocol request of the batch, decoded."""

    index: int
    req: PredictItem
    kind: str
    tensors: dict[str, Tensor] | None = None
    v1: V1Request | None = None
    v1_json: Any = None  # a v1 request's JSON, for a handler given TorchServe's rows

    @property
    def explain(self) -> bool:
        return str(self.req.headers.get("explain", "")).lower() == "true"

    def requested_outputs(self) -> list[str] | None:
        raw = self.req.headers.get(OUTPUTS_HEADER)
        if not raw:
            return None
        try:
            names = json.loads(raw)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest(f"{OUTPUTS_HEADER} must be a JSON list of output names")
        return names


def adapter(service: Any) -> ModelAdapter | None:
    """The service's tensor adapter, found once and kept on the service itself (an id() key
    could be reused by a later service once the first is gone)."""
    found: Any = getattr(service, "_tensor_adapter", _UNSET)
    if found is _UNSET:
        try:
            found = tensor_models.adapter_for(service)
        except Exception:
            logger.warning("No tensor fast path for this model", exc_info=True)
            found = None
        service._tensor_adapter = found
    return found


def run(
    service: Any,
    context: Any,
    requests: list[PredictItem],
    decode: bool,
    fallback: RunItems,
    kinds: list[str | None],
) -> BatchResult:
    """Serve a batch with protocol requests: one item per request."""
    started = time.perf_counter()
    answers: list[Answer | None] = [None] * len(requests)
    timings: dict[str, float] = {}
    metrics: list[dict[str, Any]] = []

    regular = [i for i, kind in enumerate(kinds) if kind not in KINDS]
    if regular:
        result = fallback(service, context, [requests[i] for i in regular], decode)
        for i, item in zip(regular, result.items, strict=True):
            answers[i] = item
        _add(timings, result.timings)
        metrics.extend(result.metrics)

    model = adapter(service)
    # A fast-path model keeps its tensors (its explanations included), envelope or not: it needs
    # no handler code, and a server-wide service_envelope must not take its batching away.
    as_torchserve = model is None and torchserve_rows.wants_torchserve_rows(service, context)
    fast: list[Pending] = []
    custom: list[Pending] = []
    mark = time.perf_counter()
    for i, kind in enumerate(kinds):
        if kind not in KINDS:
            continue
        req = requests[i]
        if kind == METADATA:
            answers[i] = _json_answer(_metadata(model, context))
            continue
        try:
            pending = _decode(i, req, kind, as_torchserve)
        except ServeError as exc:
            answers[i] = ErrorItem.of(exc, req.request_id)
            continue
        if pending.explain and model is not None and not _explains(service):
            message = f"{type(service.handler).__name__} does not support explanations"
            answers[i] = ErrorItem(501, "PredictionException", message, req.request_id)
            continue
        (fast if model is not None and not pending.explain else custom).append(pending)
    _add(timings, {"preprocess": time.perf_counter() - mark})

    if fast:
        assert model is not None
        _add(timings, _run_fast(model, fast, context.model_name, answers))
    # BaseHandler decides explain-or-predict from the batch's first request: never mix them.
    for explain in (False, True):
        group = [p for p in custom if p.explain == explain]
        if group and as_torchserve:
            _add(timings, _run_torchserve(service, context, group, answers))
        elif group:
            _add(timings, _run_custom(service, context, group, answers))

    timings["handler"] = time.perf_counter() - started
    metrics.extend(context.metrics.drain())
    items = [a for a in answers if a is not None]
    assert len(items) == len(requests)
    return BatchResult(items, timings, metrics)


def _explains(service: Any) -> bool:
    """Does a fast-path model's handler override ``get_insights`` (BaseHandler answers 501)?"""
    from handlers.base_handler import BaseHandler

    return type(service.handler).get_insights is not BaseHandler.get_insights


def _add(total: dict[str, float], more: dict[str, float]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0.0) + value


def _ok(body: bytes, content_type: str) -> Answer:
    return ResultItem(200, content_type, {}, body)


def _json_answer(data: Any) -> Answer:
    return _ok(json.dumps(data).encode(), "application/json")


def _failure(req: PredictItem, exc: Exception) -> Answer:
    code, kind, message = error_status(exc)
    if code >= 500:
        logger.error(
            "Request %s failed with %s",
            req.request_id,
            kind,
            exc_info=exc,
            extra={"request_ids": [req.request_id]},
        )
    return ErrorItem(code, kind, message, req.request_id)


def _metadata(model: ModelAdapter | None, context: Any) -> dict[str, Any]:
    if model is not None:
        return model.metadata()
    config = getattr(context, "model_yaml_config", None) or {}
    inputs = tensor_models.declared_specs(config, "inputs") or []
    outputs = tensor_models.declared_specs(config, "outputs") or []
    return {
        "platform": tensor_models.declared_platform(config) or "python",
        "inputs": [s.as_json() for s in inputs],
        "outputs": [s.as_json() for s in outputs],
        "tensor_path": False,
    }


def _decode(index: int, req: PredictItem, kind: str, as_json: bool = False) -> Pending:
    pending = Pending(index, req, kind)
    if kind == OIP:
        tensors: dict[str, Tensor] = {}
        for name, content_type, raw in req.params:
            if content_type is None or not is_tensor_param(content_type):
                raise BadRequest(f"parameter '{name}' is not a tensor")
            tensors[name] = tensor_from_param(name, content_type, raw)
        pending.tensors = tensors
    elif kind == KSERVE_V1:
        bodies = [raw for name, _, raw in req.params if name == "body"]
        if len(bodies) != 1:
            raise BadRequest("a KServe v1 request needs one JSON body")
        if as_json:
            pending.v1_json = torchserve_rows.v1_request(bodies[0])
            return pending
        limit = req.headers.get(MAX_ELEMENTS_HEADER)
        pending.v1 = kserve_v1.parse_predict(bodies[0], int(limit) if limit else None)
    return pending


# ----- the fast path --------------------------------------------------------------------------


def _run_fast(
    model: ModelAdapter, batch: list[Pending], model_name: str, answers: list[Answer | None]
) -> dict[str, float]:
    mark = time.perf_counter()
    jobs: list[Job] = []
    ready: list[Pending] = []
    known_outputs = {s.name for s in model.outputs}
    for p in batch:
        try:
            if p.kind == OIP:
                assert p.tensors is not None
                feeds = {n: (t.array(), t.datatype) for n, t in p.tensors.items()}
                tensor_models.check_feeds(model, feeds, model_name, strict=True)
                for name in p.requested_outputs() or []:
                    if known_outputs and name not in known_outputs:
                        raise BadRequest(
                            f"unexpected inference output '{name}' for model '{model_name}'"
                        )
            else:
                assert p.v1 is not None
                feeds = tensor_models.values_to_feeds(
                    model, p.v1.rows, columnar=p.v1.columnar, model=model_name
                )
                tensor_models.check_feeds(model, feeds, model_name, strict=False)
        except _ANSWERED as exc:
            answers[p.index] = ErrorItem(
                exc.status_code, exc.error_type, exc.message, p.req.request_id
            )
            continue
        jobs.append(Job(p.index, feeds))
        ready.append(p)
    checked = time.perf_counter()
    results = tensor_models.run_jobs(model, jobs)
    ran = time.perf_counter()
    for p in ready:
        outcome = results[p.index]
        if isinstance(outcome, Exception):
            answers[p.index] = _failure(p.req, outcome)
            continue
        try:
            answers[p.index] = _encode_fast(p, outcome, model_name)
        except ServeError as exc:
            answers[p.index] = ErrorItem.of(exc, p.req.request_id)
    done = time.perf_counter()
    return {"preprocess": checked - mark, "inference": ran - checked, "postprocess": done - ran}


def _encode_fast(p: Pending, outputs: Outputs, model_name: str) -> Answer:
    if p.kind == OIP:
        tensors = [Tensor.from_array(n, a, dt) for n, a, dt in outputs]
        return _bundle(p, tensors, model_name)
    assert p.v1 is not None
    if p.v1.columnar:
        values = _v1_outputs([(n, _v1_value(a, dt)) for n, a, dt in outputs])
        return _ok(kserve_v1.answer(values, columnar=True, explain=False), "application/json")
    rows = len(p.v1.rows)
    per_output = [(n, _v1_value(a, dt)) for n, a, dt in outputs]
    predictions = [_v1_outputs([(n, v[i]) for n, v in per_output]) for i in range(rows)]
    return _ok(kserve_v1.answer(predictions, columnar=False, explain=False), "application/json")


def _v1_outputs(named: list[tuple[str, Any]]) -> Any:
    """TF Serving's rule: a model with one output answers its value, else an object by name."""
    return named[0][1] if len(named) == 1 else dict(named)


def _v1_value(array: np.ndarray, datatype: str) -> Any:
    if datatype == "BF16":
        return bf16_to_float32(array).tolist()
    if datatype == "BYTES":
        return _text_or_b64(array.tolist())
    return array.tolist()


def _text_or_b64(value: Any) -> Any:
    if isinstance(value, list):
        return [_text_or_b64(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return kserve_v1.jsonable(value)
    return value


def _bundle(p: Pending, tensors: list[Tensor], model_name: str) -> Answer:
    wanted = p.requested_outputs()
    if wanted is not None:
        by_name = {t.name: t for t in tensors}
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise BadRequest(f"unexpected inference output '{missing[0]}' for model '{model_name}'")
        tensors = [by_name[n] for n in wanted]
    body, content_type = encode_bundle(tensors)
    return _ok(body, content_type)


# ----- custom handlers ------------------------------------------------------------------------


def _run_custom(
    service: Any, context: Any, batch: list[Pending], answers: list[Answer | None]
) -> dict[str, float]:
    from handlers.context import RequestProcessor

    rows: list[Any] = []
    owners: list[tuple[Pending, range]] = []
    for p in batch:
        if p.kind == OIP:
            assert p.tensors is not None
            # Handler code may write to its inputs: give it arrays of its own.
            new = [{n: t.array().copy() for n, t in p.tensors.items()}]
        else:
            assert p.v1 is not None
            new = p.v1.rows
        owners.append((p, range(len(rows), len(rows) + len(new))))
        rows.extend(new)
    context.request_ids = {r: p.req.request_id for p, span in owners for r in span}
    context.request_processor = [
        RequestProcessor(p.req.headers) for p, span in owners for _ in span
    ]
    context.handler_timings = {}
    try:
        results = service.predict(rows, context)
    except Exception as exc:
        code, kind, message = report_failure(exc, [p.req.request_id for p, _ in owners], logger)
        for p, _ in owners:
            answers[p.index] = ErrorItem(code, kind, message, p.req.request_id)
        return dict(getattr(context, "handler_timings", None) or {})
    config = getattr(context, "model_yaml_config", None) or {}
    declared = tensor_models.declared_specs(config, "outputs") or []
    default_name = declared[0].name if declared else "output0"
    for p, span in owners:
        values = [results[r] for r in span]
        status = next(
            (
                s
                for r in span
                if (s := context.request_processor[r].get_response_status_code()) >= 400
            ),
            None,
        )
        try:
            if status is not None:
                message = _message(values[0])
                answers[p.index] = ErrorItem(status, "HandlerError", message, p.req.request_id)
            elif p.kind == OIP:
                answers[p.index] = _bundle(
                    p, result_tensors(values[0], default_name), context.model_name
                )
            else:
                assert p.v1 is not None
                value = values[0] if p.v1.columnar else values
                body = kserve_v1.answer(value, columnar=p.v1.columnar, explain=p.explain)
                answers[p.index] = _ok(body, "application/json")
        except Exception as exc:
            answers[p.index] = _failure(p.req, exc)
    return dict(getattr(context, "handler_timings", None) or {})


def _run_torchserve(
    service: Any, context: Any, batch: list[Pending], answers: list[Answer | None]
) -> dict[str, float]:
    """TorchServe's rows: ``{"body": request JSON}``; an envelope's handler one request a call."""
    from handlers.context import RequestProcessor
    from handlers.output import encode_output

    groups = [[p] for p in batch] if getattr(service, "envelope", None) else [batch]
    timings: dict[str, float] = {}
    config = getattr(context, "model_yaml_config", None) or {}
    declared = tensor_models.declared_specs(config, "outputs") or []
    default_name = declared[0].name if declared else "output0"
    for group in groups:
        rows = []
        for p in group:
            if p.kind == OIP:
                assert p.tensors is not None
                body = torchserve_rows.v2_request(p.tensors, p.req.headers, context.model_name)
            else:
                body = p.v1_json
            rows.append({"body": body})
        context.request_ids = {i: p.req.request_id for i, p in enumerate(group)}
        context.request_processor = [RequestProcessor(p.req.headers) for p in group]
        context.handler_timings = {}
        try:
            results = service.predict(rows, context)
        except Exception as exc:
            code, kind, message = report_failure(exc, [p.req.request_id for p in group], logger)
            for p in group:
                answers[p.index] = ErrorItem(code, kind, message, p.req.request_id)
            _add(timings, dict(getattr(context, "handler_timings", None) or {}))
            continue
        _add(timings, dict(getattr(context, "handler_timings", None) or {}))
        for i, (p, value) in enumerate(zip(group, results, strict=True)):
            status = context.request_processor[i].get_response_status_code()
            try:
                if status is not None and status >= 400:
                    answers[p.index] = ErrorItem(
                        status, "HandlerError", _message(value), p.req.request_id
                    )
                elif p.kind == OIP:
                    answer = torchserve_rows.v2_response(value)
                    tensors = result_tensors(answer, default_name)
                    answers[p.index] = _bundle(p, tensors, context.model_name)
                else:
                    raw, content_type = encode_output(value)
                    answers[p.index] = _ok(raw, content_type or "application/json")
            except Exception as exc:
                answers[p.index] = _failure(p.req, exc)
    return timings


def _message(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return value if isinstance(value, str) else json.dumps(kserve_v1.jsonable(value))


def result_tensors(result: Any, default_name: str) -> list[Tensor]:
    """A custom handler's result for an OIP request as named tensors."""
    if isinstance(result, dict) and isinstance(result.get("outputs"), list):
        tensors = []
        for entry in result["outputs"]:
            if not isinstance(entry, dict) or "name" not in entry:
                raise ServeError("each of the handler's 'outputs' needs a 'name'")
            name = str(entry["name"])
            datatype, shape = entry.get("datatype"), entry.get("shape")
            if datatype and shape is not None:
                array = array_from_json(entry.get("data"), datatype, shape, f"output '{name}'")
            else:
                array, datatype = as_array(entry.get("data"), name)
            tensors.append(Tensor.from_array(name, array, datatype))
        return tensors
    if isinstance(result, dict):
        return [Tensor.from_array(str(k), *as_array(v, str(k))) for k, v in result.items()]
    return [Tensor.from_array(default_name, *as_array(result, default_name))]


def as_array(value: Any, name: str) -> tuple[np.ndarray, str]:
    """A handler's value as an array and its OIP datatype (lists of floats are FP64)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return tensor_models._from_torch(value)
    if isinstance(value, (bytes, bytearray, str)):
        array = np.empty(1, dtype=object)
        array[0] = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return array, "BYTES"
    try:
        array = np.asarray(value)
        if array.dtype.kind in "SU":
            array = np.array(value, dtype=object)
    except ValueError:
        raise ServeError(f"output '{name}' from the handler is not a regular array") from None
    if array.dtype == object:
        flat = array.reshape(-1)
        if not all(isinstance(v, (bytes, str)) for v in flat):
            raise ServeError(
                f"output '{name}' from the handler holds {type(flat[0]).__name__} values; "
                "return numbers, strings, bytes or arrays"
            )
        flat[:] = [v.encode("utf-8") if isinstance(v, str) else v for v in flat]
    return array, datatype_of(array)


def error_status(exc: Exception) -> tuple[int, str, str]:
    """(HTTP status, error type, message) for an exception raised while running a model."""
    if isinstance(exc, _ANSWERED):
        return exc.status_code, exc.error_type, exc.message
    kind = type(exc).__name__
    if kind == "InvalidArgument":  # onnxruntime's complaint about the inputs it was given
        return 400, "BadRequestException", str(exc)
    if isinstance(exc, MemoryError) or kind == "OutOfMemoryError":
        return 507, "OutOfResources", f"{kind}: {exc}"
    return 500, kind, f"{kind}: {exc}"
