"""Unit tests for the pure parts of the fault handling: redaction, JSON depth, size and drain
answers at the ASGI edge, log rotation."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from serve.http.body_limit import DeclaredSizeLimit
from serve.http.draining import Draining
from serve.logs import LogFile, rotate_files
from serve.wire.errors import BadRequest
from serve.wire.json_input import parse_json
from serve.wire.redact import client_message, one_line, strip_paths

TORCHSCRIPT = """The following operation failed in the TorchScript interpreter.
Traceback of TorchScript (most recent call last):
  File "/home/build/proj/handler.py", line 12, in _scripted_check
    if bool(x.sum() > 0):
        raise RuntimeError("input rejected")
        ~~~~~~~~~~~~~~~~~~ <--- HERE
RuntimeError: input rejected at /srv/models/store/m.pt"""


@pytest.mark.parametrize(
    "text,expected",
    [
        (TORCHSCRIPT, "RuntimeError: input rejected at m.pt"),
        ("ValueError: boom requested", "ValueError: boom requested"),
        ("first line\nsecond line", "first line"),
        ("cannot open /srv/a/b/weights.bin: denied", "cannot open weights.bin: denied"),
        ("see file:///tmp/q/r.txt", "see r.txt"),
        (r"C:\Users\me\model.pt missing", "model.pt missing"),
        ("a route /v2 and a ratio 3/4 stay", "a route /v2 and a ratio 3/4 stay"),
        ("", ""),
    ],
)
def test_client_message(text: str, expected: str) -> None:
    assert client_message(text) == expected


def test_client_message_is_bounded() -> None:
    assert len(client_message("x" * 10_000)) == 300


def test_one_line_and_strip_paths_alone() -> None:
    assert one_line("  \n  only  \n") == "only"
    assert strip_paths('"/a/b/"') == '"<path>"'


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1"])
def test_json_nested_too_deep_is_a_bad_request(text: str) -> None:
    with pytest.raises(BadRequest, match="nested too deeply"):
        parse_json(text)


def test_malformed_json_is_a_bad_request_naming_what() -> None:
    with pytest.raises(BadRequest, match="failed to parse the body"):
        parse_json(b"{", "the body")
    assert parse_json(b'{"a": [1]}') == {"a": [1]}


async def _call(app: Any, path: str, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body must not be read")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    await app(scope, receive, send)
    return sent


async def _inner(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})


def test_declared_size_limit_answers_before_reading() -> None:
    app = DeclaredSizeLimit(_inner, 100)
    sent = asyncio.run(_call(app, "/predictions/m", [(b"content-length", b"101")]))
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert b"x-request-id" in dict(sent[0]["headers"])  # like every other answer
    assert json.loads(sent[1]["body"])["type"] == "PayloadTooLarge"
    sent = asyncio.run(_call(app, "/v2/models/m/infer", [(b"content-length", b"101")]))
    assert "max_request_size" in json.loads(sent[1]["body"])["error"]
    sent = asyncio.run(_call(app, "/predictions/m", [(b"content-length", b"100")]))
    assert sent[0]["status"] == 200


def test_draining_answers_503_close_only_once_stopping() -> None:
    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        stopping = asyncio.Event()
        app = Draining(_inner, stopping)
        before = await _call(app, "/ping", [])
        stopping.set()
        return before, await _call(app, "/ping", [])

    before, after = asyncio.run(scenario())
    assert before[0]["status"] == 200
    assert after[0]["status"] == 503
    assert (b"connection", b"close") in after[0]["headers"]
    assert json.loads(after[1]["body"])["type"] == "ShuttingDown"


def test_log_file_rotates_at_its_cap(tmp_path: Path) -> None:
    handler = LogFile(str(tmp_path / "model_log.log"), max_bytes=1000, backup_count=2)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for i in range(100):
        handler.emit(logging.makeLogRecord({"msg": f"{i:03d} " + "x" * 96}))
    handler.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["model_log.log", "model_log.log.1", "model_log.log.2"]
    assert all(p.stat().st_size <= 1100 for p in tmp_path.iterdir())
    assert (tmp_path / "model_log.log").read_text().splitlines()[-1].startswith("099 ")


def test_rotate_files_without_backups_truncates(tmp_path: Path) -> None:
    path = tmp_path / "console.log"
    path.write_text("old")
    rotate_files(path, 0)
    assert not path.exists()
