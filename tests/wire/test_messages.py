"""The typed messages: each encodes to the frame the dict-built code wrote (byte for byte), and
decodes back to itself; what a decoder cannot read is a `ProtocolError`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serve import __version__
from serve.config import Config, ModelSettings
from serve.core.model import ModelSource, ModelVersion
from serve.core.pool import WorkerSlot
from serve.wire.errors import BadRequest, InsufficientResources, ServeError
from serve.wire.frames import Frame, MsgType, ProtocolError, encode_bytes, frames_from
from serve.wire.messages import (
    ENGINE_STATS,
    BatchResult,
    EngineReport,
    ErrorItem,
    Loaded,
    LoadFailed,
    PartialItem,
    PredictItem,
    ResultItem,
    WorkerSpec,
    decode_engine_report,
    decode_load,
    decode_partial,
    decode_predict,
    decode_result,
    encode_engine_report,
    encode_load,
    encode_partial,
    encode_predict,
    encode_result,
)


def over_the_wire(frame: Frame) -> Frame:
    (out,) = frames_from([encode_bytes(frame)])
    return out


JSON = "application/json"

# (the items, the metadata and payloads the frontend wrote for them before the messages were typed)
PREDICTS: list[tuple[list[PredictItem], dict[str, Any], tuple[bytes, ...]]] = [
    ([], {"requests": []}, ()),
    (
        [PredictItem("r0", {"content-type": JSON}, [("body", JSON, b'{"a": 1}')])],
        {"requests": [{"id": "r0", "headers": {"content-type": JSON}, "params": [["body", JSON]]}]},
        (b'{"a": 1}',),
    ),
    (
        [
            PredictItem("r0", {}, [("a", "text/plain", b"x"), ("a", None, b"")]),
            PredictItem("r1", {"describe": "True"}, []),
            PredictItem("r2", {}, [("body", None, b"\x00" * 3)]),
        ],
        {
            "requests": [
                {"id": "r0", "headers": {}, "params": [["a", "text/plain"], ["a", None]]},
                {"id": "r1", "headers": {"describe": "True"}, "params": []},
                {"id": "r2", "headers": {}, "params": [["body", None]]},
            ]
        },
        (b"x", b"", b"\x00\x00\x00"),
    ),
]


@pytest.mark.parametrize(("items", "meta", "payloads"), PREDICTS)
def test_predict_items(items: list[PredictItem], meta: dict[str, Any], payloads: tuple) -> None:
    frame = encode_predict(9, items)
    assert encode_bytes(frame) == encode_bytes(Frame(MsgType.PREDICT, 9, meta, payloads))
    assert decode_predict(over_the_wire(frame)) == items


RESULTS: list[tuple[BatchResult, dict[str, Any], tuple[bytes, ...]]] = [
    (
        BatchResult([ResultItem(200, JSON, {}, b"{}")], {"handler": 0.5}, []),
        {"items": [{"status": 200, "ct": JSON, "headers": {}}], "timings": {"handler": 0.5}},
        (b"{}",),
    ),
    (
        BatchResult(
            [
                ResultItem(206, None, {"ts_stream_next": "true"}, b"part"),
                ErrorItem(507, "OutOfResources", "OutOfMemoryError: CUDA", "r1"),
                ErrorItem(500, "RuntimeError", "boom"),  # no request id: none on the wire
            ],
            {"preprocess": 0.25, "handler": 1.0},
            [{"name": "Loss", "value": 1.5}],
        ),
        {
            "items": [
                {"status": 206, "ct": None, "headers": {"ts_stream_next": "true"}},
                {
                    "error": {
                        "code": 507,
                        "type": "OutOfResources",
                        "message": "OutOfMemoryError: CUDA",
                        "request_id": "r1",
                    }
                },
                {"error": {"code": 500, "type": "RuntimeError", "message": "boom"}},
            ],
            "timings": {"preprocess": 0.25, "handler": 1.0},
            "metrics": [{"name": "Loss", "value": 1.5}],
        },
        (b"part", b"", b""),
    ),
]


@pytest.mark.parametrize(("result", "meta", "payloads"), RESULTS)
def test_batch_results(result: BatchResult, meta: dict[str, Any], payloads: tuple) -> None:
    frame = encode_result(4, result)
    meta = {"items": meta["items"], "timings": meta["timings"], "metrics": meta.get("metrics", [])}
    assert encode_bytes(frame) == encode_bytes(Frame(MsgType.RESULT, 4, meta, payloads))
    assert decode_result(over_the_wire(frame)) == result


def test_result_decoding_defaults_what_older_frames_left_out() -> None:
    frame = Frame(MsgType.RESULT, 1, {"items": [{"status": 200}]}, (b"x",))
    assert decode_result(frame) == BatchResult([ResultItem(200, None, {}, b"x")], {}, [])


def test_partial_items() -> None:
    items = [PartialItem("text/plain", b"tok"), PartialItem(None, b"")]
    frame = encode_partial(2, items)
    expected = Frame(
        MsgType.PARTIAL, 2, {"items": [{"ct": "text/plain"}, {"ct": None}]}, (b"tok", b"")
    )
    assert encode_bytes(frame) == encode_bytes(expected)
    assert decode_partial(over_the_wire(frame)) == items


@pytest.mark.parametrize(
    "frame",
    [
        Frame(MsgType.PREDICT, 1, {}, ()),
        Frame(MsgType.PREDICT, 1, {"requests": [{"id": "r", "headers": {}}]}, ()),
        Frame(MsgType.PREDICT, 1, {"requests": [{"id": "r", "headers": {}, "params": [["b"]]}]}),
        # a parameter without its payload, and a payload without its parameter
        Frame(
            MsgType.PREDICT, 1, {"requests": [{"id": "r", "headers": {}, "params": [["b", None]]}]}
        ),
        Frame(MsgType.PREDICT, 1, {"requests": []}, (b"stray",)),
    ],
)
def test_malformed_predict_frames(frame: Frame) -> None:
    with pytest.raises(ProtocolError, match="PREDICT"):
        decode_predict(frame)


@pytest.mark.parametrize(
    "frame",
    [
        Frame(MsgType.RESULT, 1, {}, ()),
        Frame(MsgType.RESULT, 1, {"items": [{"ct": "x"}]}, (b"",)),  # no status
        Frame(MsgType.RESULT, 1, {"items": [{"error": {"code": 500}}]}, (b"",)),
        Frame(MsgType.RESULT, 1, {"items": [{"status": 200}]}, ()),  # items and payloads differ
        Frame(MsgType.RESULT, 1, {"items": ["ok"]}, (b"",)),
    ],
)
def test_malformed_result_frames(frame: Frame) -> None:
    with pytest.raises(ProtocolError, match="RESULT"):
        decode_result(frame)


def test_malformed_partial_frames() -> None:
    with pytest.raises(ProtocolError, match="PARTIAL"):
        decode_partial(Frame(MsgType.PARTIAL, 1, {"items": [{}, {}]}, (b"",)))


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (
            Loaded(41, ["torch"], {"requests": 2, "batches": 1, "seconds": 0.5}, 1 << 30),
            Frame(
                MsgType.LOADED,
                0,
                {
                    "pid": 41,
                    "modules": ["torch"],
                    "warmup": {"requests": 2, "batches": 1, "seconds": 0.5},
                    "gpu_memory": 1 << 30,
                },
            ),
        ),
        (
            Loaded(7, [], {}),
            Frame(MsgType.LOADED, 0, {"pid": 7, "modules": [], "warmup": {}, "gpu_memory": None}),
        ),
        (
            LoadFailed("WarmupFailed", "warm-up request failed"),
            Frame(
                MsgType.LOAD_FAILED,
                0,
                {"type": "WarmupFailed", "message": "warm-up request failed"},
            ),
        ),
    ],
)
def test_load_outcomes(outcome: Loaded | LoadFailed, expected: Frame) -> None:
    assert encode_bytes(encode_load(outcome)) == encode_bytes(expected)
    assert decode_load(over_the_wire(encode_load(outcome))) == outcome


def test_a_load_failure_reads_as_type_and_message() -> None:
    assert str(LoadFailed("ImportError", "no module x")) == "ImportError: no module x"


@pytest.mark.parametrize(
    "frame",
    [
        Frame(MsgType.LOADED, 0, {}),
        Frame(MsgType.LOAD_FAILED, 0, {"type": "X"}),
        Frame(MsgType.RESULT, 0, {"items": []}),
    ],
)
def test_malformed_load_frames(frame: Frame) -> None:
    with pytest.raises(ProtocolError, match="LOAD|RESULT"):
        decode_load(frame)


@pytest.mark.parametrize(
    ("item", "kind"),
    [
        (ErrorItem(400, "BadRequestException", "no"), BadRequest),
        (ErrorItem(507, "OutOfResources", "oom"), InsufficientResources),
        (ErrorItem(500, "RuntimeError", "boom"), ServeError),
    ],
)
def test_error_items_become_the_servers_errors(item: ErrorItem, kind: type[ServeError]) -> None:
    error = item.exception()
    assert isinstance(error, kind)
    assert (error.status_code, error.error_type, error.message) == (
        item.code,
        item.type,
        item.message,
    )
    assert ErrorItem.of(BadRequest("bad"), "r9") == ErrorItem(
        400, "BadRequestException", "bad", "r9"
    )


def test_worker_spec_round_trips_and_is_filled_in_per_process() -> None:
    spec = WorkerSpec("m", "2.0", "/models/m", {"model": {"handler": "h.py"}}, batch_size=4)
    started = spec.started("/run/w.sock", "m_2.0-w1", 1 << 20)
    assert (started.socket, started.worker_id, started.shm_bytes) == (
        "/run/w.sock",
        "m_2.0-w1",
        1 << 20,
    )
    assert spec.socket == ""  # the version's spec is left as it was
    assert WorkerSpec.decode(started.encode()) == started
    assert WorkerSpec.decode(started.encode().encode()) == started


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("not json", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"model_name": "m"}', "incomplete"),
        (
            '{"model_name": "m", "model_version": "1", "model_dir": "/", "manifest": {}, "x": 1}',
            "x",
        ),
    ],
)
def test_worker_spec_decoding_refuses(text: str, complaint: str) -> None:
    with pytest.raises(ProtocolError, match=complaint):
        WorkerSpec.decode(text)


def test_the_frontends_spec_names_its_version(tmp_path: Path) -> None:
    source = ModelSource("m.mar", tmp_path, {"model": {}}, {"minWorkers": 1}, None)
    version = ModelVersion("m", "1.0", source, ModelSettings(batch_size=3), Config(), tmp_path)
    spec = version.worker_spec(WorkerSlot(0, "m_1.0-w0", None))
    assert spec.server_version == __version__
    assert (spec.model_name, spec.batch_size, spec.model_dir) == ("m", 3, str(tmp_path))
    assert WorkerSpec.decode(spec.encode()) == spec


def test_an_engine_report_crosses_the_wire() -> None:
    stats = dict(zip(ENGINE_STATS, (1, 0, 2, 300, 260, 9), strict=True))
    report = EngineReport(stats, {7: 120, 8: 180})
    (frame,) = frames_from([encode_bytes(encode_engine_report(report))])
    assert frame.type == MsgType.ENGINE and decode_engine_report(frame) == report
    assert decode_engine_report(encode_engine_report(EngineReport(stats))).reserved == {}


@pytest.mark.parametrize(
    "meta",
    [{}, {"stats": []}, {"stats": {"running": "x"}}, {"stats": {}, "reserved": [[1]]}],
)
def test_a_malformed_engine_report_is_a_protocol_error(meta: dict) -> None:
    with pytest.raises(ProtocolError, match="ENGINE"):
        decode_engine_report(Frame(MsgType.ENGINE, 0, meta))
