"""Server, access and model logs of a running server, as plain text and as JSON lines."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import HANDLERS, LanternServer, build_archive

# A text record starts with logging's asctime; continuation lines (tracebacks) do not.
RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.M)


def _start(tmp: Path, args: list[str]) -> LanternServer:
    store = tmp / "store"
    store.mkdir()
    build_archive(store, "logs", HANDLERS / "log_handler.py", config={"minWorkers": 1})
    return LanternServer(tmp, store, ["logs.mar"], args=args).start()


@pytest.fixture(scope="module")
def text_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    srv = _start(tmp_path_factory.mktemp("text-logs"), [])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    srv = _start(
        tmp_path_factory.mktemp("json-logs"), ["--log-format", "json", "--log-level", "debug"]
    )
    yield srv
    srv.stop()


def wait_for(read: Callable[[], Any], check: Callable[[Any], bool], timeout: float = 20) -> Any:
    """Poll ``read()`` until ``check`` accepts it: log lines are written after the response."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if check(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def text_records(text: str) -> list[str]:
    starts = [m.start() for m in RECORD_START.finditer(text)]
    return [text[a:b].rstrip("\n") for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def json_records(server: LanternServer, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.log_text(name).splitlines()]


def post(
    server: LanternServer, body: bytes, rid: str | None = None, path: str = "logs"
) -> httpx.Response:
    headers = {"x-request-id": rid} if rid else {}
    return httpx.post(
        f"{server.inference}/predictions/{path}", content=body, headers=headers, timeout=30
    )


# ----- plain text (the default) ------------------------------------------------------------------


def test_access_log_has_one_line_per_request(text_server: LanternServer) -> None:
    ids = [f"acc-{uuid.uuid4()}" for _ in range(3)]
    for rid in ids:
        assert post(text_server, b"hi", rid).status_code == 200
    missing = f"acc-{uuid.uuid4()}"
    assert post(text_server, b"hi", missing, path="missing").status_code == 404
    assert httpx.get(f"{text_server.management}/models", timeout=10).status_code == 200
    lines = wait_for(
        lambda: text_server.log_text("access_log.log").splitlines(),
        lambda ls: (
            any(missing in line for line in ls) and any("GET /models" in line for line in ls)
        ),
    )
    for rid in ids:
        mine = [line for line in lines if rid in line]
        assert len(mine) == 1, mine
        assert RECORD_START.match(mine[0])  # the time
        assert re.search(
            r' 127\.0\.0\.1:\d+ "POST /predictions/logs HTTP/1\.1" 200 \d+\.\d+ms '
            rf"model=logs version=1\.0 request_id={rid}$",
            mine[0],
        ), mine[0]
    [unknown] = [line for line in lines if missing in line]
    assert '"POST /predictions/missing HTTP/1.1" 404 ' in unknown
    assert "model=missing version=- " in unknown
    assert any('"GET /models HTTP/1.1" 200 ' in line for line in lines)
    # Access lines stay out of the server log, and off the console when there is a log folder
    # (a second copy of a line per request would double the access log's cost).
    assert not any(rid in text_server.log_text("lantern.log") for rid in ids)
    assert not any(rid in text_server.console_text() for rid in ids)


def test_handler_traceback_is_logged_once_with_the_request_id(text_server: LanternServer) -> None:
    response = post(text_server, b"boom")
    assert response.status_code == 500
    rid = response.headers["x-request-id"]
    assert rid in response.json()["message"]
    records = wait_for(
        lambda: text_records(text_server.log_text("model_log.log")),
        lambda recs: any(rid in r for r in recs),
    )
    mine = [r for r in records if rid in r]
    assert len(mine) == 1, mine
    record = mine[0]
    assert " ERROR serve.worker [logs 1.0 logs_1.0-w0] Handler raised ValueError" in record
    assert record.count("Traceback (most recent call last):") == 1
    assert record.rstrip().endswith("ValueError: boom requested")
    # Once: not again in the server log, and no other traceback in the model log for it.
    assert rid not in text_server.log_text("lantern.log")
    assert text_server.log_text("model_log.log").count(rid) == 1


def test_client_request_id_reaches_the_model_log(text_server: LanternServer) -> None:
    rid = f"mine-{uuid.uuid4()}"
    response = post(text_server, b"boom", rid)
    assert response.status_code == 500
    assert response.headers["x-request-id"] == rid
    records = wait_for(
        lambda: text_records(text_server.log_text("model_log.log")),
        lambda recs: any(rid in r for r in recs),
    )
    assert sum("Traceback" in r for r in records if rid in r) == 1


def test_worker_output_and_logging_reach_the_model_log(text_server: LanternServer) -> None:
    word = f"w{uuid.uuid4().hex[:8]}"
    assert post(text_server, f"say {word}".encode()).status_code == 200
    records = wait_for(
        lambda: text_records(text_server.log_text("model_log.log")),
        lambda recs: any(f"warn {word}" in r for r in recs),
    )
    prefix = "serve.worker [logs 1.0 logs_1.0-w0]"
    assert any(r.endswith(f"INFO {prefix} {word}") for r in records)  # print()
    assert any(r.endswith(f"INFO {prefix} info {word}") for r in records)
    assert any(r.endswith(f"WARNING {prefix} warn {word}") for r in records)
    assert not any(f"debug {word}" in r for r in records)  # below the default INFO level


def test_huge_output_lines_do_not_stall_the_worker(text_server: LanternServer) -> None:
    # 200 KB on one line is past the frontend's 64 KiB line limit; it arrives in pieces.
    assert post(text_server, b"say " + b"y" * 200_000).status_code == 200
    word = f"after-{uuid.uuid4().hex[:8]}"
    assert post(text_server, f"say {word}".encode()).status_code == 200
    text = wait_for(lambda: text_server.log_text("model_log.log"), lambda t: f"warn {word}" in t)
    assert f"warn {word}" in text
    assert text.count("y") >= 200_000
    assert "[truncated]" in text  # the logging records of that line were cut in the worker


def test_server_log_has_lifecycle_records(text_server: LanternServer) -> None:
    records = text_records(text_server.log_text("lantern.log"))
    assert any(" INFO serve.server Lantern " in r and "listening" in r for r in records)
    assert any("Worker logs_1.0-w0 ready" in r for r in records)
    # Each line once (the three ports' uvicorn servers each wrote "Started server process").
    servers = (" INFO serve.server ", ".error ")
    lines = [r.split(" ", 2)[2] for r in records if any(s in r for s in servers)]  # no time
    assert len(lines) == len(set(lines)), [line for line in lines if lines.count(line) > 1]


# ----- JSON lines, level DEBUG -------------------------------------------------------------------


def test_json_logs_parse_as_json_lines(json_server: LanternServer) -> None:
    rid = f"json-{uuid.uuid4()}"
    word = f"w{uuid.uuid4().hex[:8]}"
    assert post(json_server, f"say {word}".encode()).status_code == 200
    assert post(json_server, b"boom", rid).status_code == 500
    access = wait_for(
        lambda: json_records(json_server, "access_log.log"),
        lambda recs: any(r.get("request_id") == rid for r in recs),
    )
    [line] = [r for r in access if r.get("request_id") == rid]
    assert line["logger"] == "serve.access"
    assert line["time"].endswith("Z")
    assert line["method"] == "POST"
    assert line["path"] == "/predictions/logs"
    assert line["status"] == 500
    assert line["latency_ms"] > 0
    assert (line["model"], line["version"]) == ("logs", "1.0")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", line["client"])

    model = wait_for(
        lambda: json_records(json_server, "model_log.log"),
        lambda recs: (
            any(rid in r.get("request_ids", []) for r in recs)
            and any(r["message"] == f"warn {word}" for r in recs)
        ),
    )
    [error] = [r for r in model if rid in r.get("request_ids", [])]
    assert error["level"] == "ERROR"
    assert (error["model"], error["version"], error["worker_id"]) == ("logs", "1.0", "logs_1.0-w0")
    assert error["message"].count("Traceback (most recent call last):") == 1
    assert "ValueError: boom requested" in error["message"]
    [warning] = [r for r in model if r["message"] == f"warn {word}"]
    assert warning["level"] == "WARNING"
    assert warning["worker_logger"] == "log_handler"
    # --log-level debug reaches the worker: its DEBUG record is kept this time.
    [debug] = [r for r in model if r["message"] == f"debug {word}"]
    assert debug["level"] == "DEBUG"
    [printed] = [r for r in model if r["message"] == word]
    assert (printed["level"], printed["stream"]) == ("INFO", "stdout")

    server = json_records(json_server, "lantern.log")
    assert any(r["logger"] == "serve.server" and "listening" in r["message"] for r in server)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in server)
