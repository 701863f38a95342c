"""Log injection (issue 27, item 6): client text never forges a log line or writes a raw ESC."""

from __future__ import annotations

import io
import json
import logging
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from serve.grpc.calls import Call, Methods
from serve.http.access_log import AccessLog
from serve.log_safety import escape_args, escape_controls, is_plain
from serve.logs import ACCESS_LOGGER, JsonFormatter, TextFormatter
from serve.workflows.executor import NodeReport
from serve.workflows.metrics import WorkflowMetrics

FORGED = "x\n2026-01-01 00:00:00,000 INFO serve.access forged line"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain/path", "plain/path"),
        ("a\nb", "a\\nb"),
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("nul\x00del\x7f", "nul\\x00del\\x7f"),
        ("c1\x85", "c1\\x85"),
        ("sep\u2028par\u2029", "sep\\u2028par\\u2029"),
        ("back\\slash é ✓", "back\\slash é ✓"),
    ],
)
def test_controls_are_escaped_and_the_rest_kept(raw: str, shown: str) -> None:
    assert escape_controls(raw) == shown
    assert escape_controls(shown) == shown  # escaping twice changes nothing


def test_args_keep_numbers_and_escape_text_of_other_values() -> None:
    assert escape_args(("a\nb", 3, 2.5, None)) == ("a\\nb", 3, 2.5, None)
    assert escape_args({"k": "\x1b"}) == {"k": "\\x1b"}
    assert escape_args((ValueError("bad\nline"),)) == ("bad\\nline",)


class _Text(str):
    pass


@pytest.mark.parametrize(
    ("args", "plain"),
    [
        (("127.0.0.1:1", "POST", "/predictions/m", "1.1", 200, 1.5, "m", "-", "rid"), True),
        (("ok", 3, 2.5, None, True), True),
        (("ok", "a\nb"), False),
        (("sep\u2028",), False),
        ((ValueError("no control"),), False),  # not a plain type: escape_args decides
        ((_Text("ok"),), False),
        ({"k": "ok"}, False),
    ],
)
def test_plain_args_are_the_ones_escaping_leaves_alone(args: Any, plain: bool) -> None:
    assert is_plain(args) is plain
    if plain:
        assert escape_args(args) == args


def lines_of(record: logging.LogRecord, formatter: logging.Formatter) -> list[str]:
    return formatter.format(record).splitlines()


def capture(logger_name: str) -> tuple[logging.Logger, io.StringIO, logging.Handler]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, stream, handler


@pytest.fixture
def access_text() -> Any:
    logger, stream, handler = capture(ACCESS_LOGGER)
    yield stream
    logger.removeHandler(handler)


async def _ok(request: Any) -> PlainTextResponse:
    return PlainTextResponse("no", status_code=401)


APP = Starlette(routes=[Route("/predictions/{model}", _ok, methods=["POST"])])


@pytest.mark.anyio
async def test_an_http_path_cannot_forge_an_access_line(access_text: io.StringIO) -> None:
    transport = httpx.ASGITransport(app=AccessLog(APP), client=("10.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path in ("/predictions/x%0A" + FORGED[2:].replace(" ", "%20"), "/predictions/e%1Bc"):
            assert (await client.post(path)).status_code == 401
    text = access_text.getvalue()
    assert len(text.splitlines()) == 2
    assert "\x1b" not in text
    assert "model=x\\n2026" in text and "\\x1bc" in text


def test_a_grpc_model_name_cannot_forge_an_access_line(access_text: io.StringIO) -> None:
    context = SimpleNamespace(peer=lambda: "ipv4:127.0.0.1:5")
    call = Call(context, "/p.S/Predictions", "rid", {}, context.peer())  # type: ignore[arg-type]
    call.label(FORGED, "1\x1b")
    Methods(None)._done(call, "NOT_FOUND")
    [line] = access_text.getvalue().splitlines()
    assert "model=x\\n2026" in line and "version=1\\x1b" in line


def test_a_grpc_access_line_names_the_peer_read_when_the_call_began(
    access_text: io.StringIO,
) -> None:
    # grpcio's peer() on a cancelled call dereferenced a freed call and crashed the frontend
    # (4 of 10 cancelled StreamPredictions, tests/e2e/test_generation_server.py): once the call
    # has ended, its context is not asked again.
    def gone() -> str:
        raise AssertionError("peer() asked after the call ended")

    context = SimpleNamespace(peer=lambda: "ipv4:127.0.0.1:5")
    call = Call(context, "/p.S/Predictions", "rid", {}, context.peer())  # type: ignore[arg-type]
    context.peer = gone
    Methods(None)._done(call, "CANCELLED")
    [line] = access_text.getvalue().splitlines()
    assert "ipv4:127.0.0.1:5" in line and "CANCELLED" in line


def test_a_workflow_node_line_is_one_line(access_text: io.StringIO) -> None:
    report = NodeReport(node="n", status=200, seconds=0.1, attempts=1, request_id="r\nforged")
    WorkflowMetrics(None).node_done("wf\x1b", "wf__n", "1.0", report)
    [line] = access_text.getvalue().splitlines()
    assert "workflow=wf\\x1b" in line and "request_id=r\\nforged" in line


def test_server_log_args_are_escaped_but_a_workers_traceback_is_kept() -> None:
    fmt = TextFormatter()
    record = logging.LogRecord("serve.x", logging.INFO, "", 0, "Registered %s", (FORGED,), None)
    assert len(lines_of(record, fmt)) == 1
    assert record.args == (FORGED,)  # other handlers still see the record as it was
    worker = logging.LogRecord(
        "serve.worker", logging.ERROR, "", 0, "%s", ("Traceback\n  x",), None
    )
    worker.__dict__.update(worker_id="w1", model="m", version="1")
    assert len(lines_of(worker, fmt)) == 2


def test_json_log_lines_escape_controls_too() -> None:
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, "", 0, "%s", (FORGED + "\x1b",), None)
    record.__dict__["path"] = FORGED
    [line] = lines_of(record, JsonFormatter())
    assert "\x1b" not in line
    data = json.loads(line)
    assert data["path"] == FORGED and data["message"] == FORGED + "\x1b"
