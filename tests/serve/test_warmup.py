"""Warm-up samples, batch sizes and failure detection (the worker side, in-process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serve.wire.frames import Frame, MsgType
from serve.wire.messages import WorkerSpec
from serve.worker.warmup import (
    Sample,
    WarmupFailed,
    batch_sizes,
    load_samples,
    run_warmup,
    warmup_frames,
)


def test_samples_from_the_list_then_the_folder(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "b.json").write_text('{"b": 1}')
    (tmp_path / "warmup" / "a.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "warmup" / ".hidden").write_text("skip")
    (tmp_path / "cat.bin").write_bytes(b"\x00\x01")
    config = {
        "warmup": [
            {"body": {"x": [1, 2]}},
            {"body": "hello"},
            {"file": "cat.bin", "contentType": "application/x-custom"},
        ]
    }
    samples = load_samples(tmp_path, config)
    assert samples == [
        Sample("warmup[0]", "application/json", b'{"x": [1, 2]}'),
        Sample("warmup[1]", "text/plain", b"hello"),
        Sample("cat.bin", "application/x-custom", b"\x00\x01"),
        Sample("a.jpg", "image/jpeg", b"\xff\xd8"),
        Sample("b.json", "application/json", b'{"b": 1}'),
    ]


@pytest.mark.parametrize(
    "config",
    [
        {"warmup": "not a list"},
        {"warmup": ["not a mapping"]},
        {"warmup": [{"contentType": "text/plain"}]},
        {"warmup": [{"file": "missing.json"}]},
        {"warmup": [{"file": "../outside.json"}]},
    ],
)
def test_bad_sample_lists_fail(tmp_path: Path, config: dict[str, Any]) -> None:
    (tmp_path.parent / "outside.json").write_text("{}")
    with pytest.raises(WarmupFailed):
        load_samples(tmp_path, config)


@pytest.mark.parametrize(
    ("batch_size", "override", "sizes"),
    [
        (1, None, [1]),
        (4, None, [1, 2, 3, 4]),
        (8, [1, 8], [1, 8]),
        (8, 4, [4]),
        (4, [2, 16], [2]),  # sizes the batcher can never form are dropped
        (4, [16], [1, 2, 3, 4]),  # nothing left: every size
    ],
)
def test_batch_sizes(batch_size: int, override: Any, sizes: list[int]) -> None:
    assert batch_sizes(batch_size, override) == sizes


def test_frames_cover_every_size_and_lead_every_sample() -> None:
    samples = [Sample("a", "text/plain", b"a"), Sample("b", None, b"b")]
    frames = warmup_frames(samples, [1, 3])
    bodies = [list(f.payloads) for f in frames]
    assert bodies == [[b"a"], [b"b"], [b"a", b"b", b"a"], [b"b", b"a", b"b"]]
    first = frames[0].meta["requests"][0]
    assert first["headers"] == {"content-type": "text/plain"}
    assert first["params"] == [["body", "text/plain"]]
    assert frames[1].meta["requests"][0]["headers"] == {}
    ids = [r["id"] for f in frames for r in f.meta["requests"]]
    assert len(set(ids)) == len(ids) == 8


def _answer(items: list[dict[str, Any]]) -> Any:
    def run_batch(service: Any, context: Any, frame: Frame, decode: bool) -> Frame:
        calls.append(len(frame.meta["requests"]))
        n = len(frame.meta["requests"])
        return Frame(MsgType.RESULT, 0, {"items": items * n}, (b"no",) * n)

    calls: list[int] = []
    run_batch.calls = calls  # type: ignore[attr-defined]
    return run_batch


def test_run_warmup_counts_and_times(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "s.json").write_text("{}")
    run_batch = _answer([{"status": 200, "ct": None, "headers": {}}])
    spec = WorkerSpec("m", "1.0", str(tmp_path), {}, batch_size=3)
    done = run_warmup(object(), object(), spec, run_batch)
    assert run_batch.calls == [1, 2, 3]
    assert done["requests"] == 6 and done["batches"] == 3 and done["seconds"] >= 0


def test_run_warmup_without_samples_runs_nothing(tmp_path: Path) -> None:
    run_batch = _answer([])
    spec = WorkerSpec("m", "1.0", str(tmp_path), {}, batch_size=4)
    done = run_warmup(object(), object(), spec, run_batch)
    assert done == {"requests": 0, "batches": 0, "seconds": 0.0}
    assert run_batch.calls == []


@pytest.mark.parametrize(
    "item",
    [
        {"error": {"code": 500, "type": "RuntimeError", "message": "boom"}},
        {"status": 400, "ct": None, "headers": {}},
    ],
)
def test_run_warmup_fails_on_an_error_answer(tmp_path: Path, item: dict[str, Any]) -> None:
    spec = WorkerSpec(
        "m", "1.0", str(tmp_path), {}, batch_size=2, model_yaml_config={"warmup": [{"body": "x"}]}
    )
    with pytest.raises(WarmupFailed, match="batch size 1"):
        run_warmup(object(), object(), spec, _answer([item]))
