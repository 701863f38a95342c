"""Pure pieces behind the operability work: the server record's identity check, the startup
report's lines, and the CORS policy (an ASGI app driven in-process)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serve.cli import server_record
from serve.cli.server_record import Status
from serve.cli.startup_report import StartupReport, failure_lines, report_lines
from serve.config import Config
from serve.http.cors import CorsPolicy


def test_a_record_written_by_a_process_is_running_until_it_exits(tmp_path: Path) -> None:
    path = tmp_path / "server.json"
    code = (
        "import sys, pathlib; from serve.cli import server_record; "
        "server_record.write(pathlib.Path(sys.argv[1]), {'addresses': {}}); "
        "print('written', flush=True); sys.stdin.read()"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "written\n"
        record = server_record.read(path)
        assert record is not None and record.pid == proc.pid
        assert record.cwd == os.getcwd()
        assert record.status() is Status.RUNNING
        # The same pid with another start time is another process (a reused pid).
        forged = json.loads(path.read_text())
        forged["identity"]["start_time"] = "0"
        path.write_text(json.dumps(forged))
        assert server_record.read(path).status() is Status.OTHER  # type: ignore[union-attr]
    finally:
        proc.communicate("", timeout=30)
    assert server_record.read(path).status() is Status.EXITED  # type: ignore[union-attr]


def test_remove_own_leaves_another_servers_record(tmp_path: Path) -> None:
    path = tmp_path / "server.json"
    path.write_text(json.dumps({"pid": os.getpid() + 1}))
    server_record.remove_own(path)
    assert path.exists()
    server_record.write(path, {})
    server_record.remove_own(path)
    assert not path.exists()


@pytest.mark.parametrize("text", ["", "{", "[]", '{"pid": "x"}', '{"addresses": {}}'])
def test_what_is_not_a_record_reads_as_none(tmp_path: Path, text: str) -> None:
    path = tmp_path / "server.json"
    path.write_text(text)
    assert server_record.read(path) is None


def test_report_lines() -> None:
    assert report_lines(StartupReport()) == []
    report = StartupReport(snapshot="/l/config/1-snapshot.json", restored=["a 1.0", "b 2.0"])
    assert report_lines(report) == ["Restored snapshot /l/config/1-snapshot.json: a 1.0, b 2.0."]
    passed = StartupReport(passed_over="/l/config/1-snapshot.json")
    assert report_lines(StartupReport.from_dict(passed.as_dict())) == [
        "Not restored: snapshot /l/config/1-snapshot.json; --models names the models to load "
        "(a start without --models restores the newest snapshot)."
    ]
    empty = StartupReport(snapshot="/s.json")
    assert report_lines(empty) == ["Restored snapshot /s.json: no models."]
    report.fail("a 1.0", "Traceback\n  line one\n  line two")
    assert failure_lines(StartupReport.from_dict(report.as_dict())) == [
        "  a 1.0: Traceback line one line two"
    ]


def run_asgi(app: Any, method: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": "/",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


async def inner(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"access-control-allow-methods", b"GET")],
        }
    )
    await send({"type": "http.response.body", "body": b"x"})


def test_cors_is_off_without_an_origin() -> None:
    assert CorsPolicy.from_config(Config()) is None
    assert CorsPolicy.from_config(Config(cors_allowed_origin="  ")) is None


def test_cors_adds_the_configured_values_and_keeps_the_apps_own() -> None:
    policy = CorsPolicy.from_config(
        Config(cors_allowed_origin="*", cors_allowed_methods="GET, POST")
    )
    assert policy is not None
    app = policy.wrap(inner)
    status, headers = run_asgi(app, "GET", {"Origin": "https://a.example"})
    assert status == 404
    assert headers["access-control-allow-origin"] == "*"
    assert headers["access-control-allow-methods"] == "GET"  # the response's own, as TorchServe
    assert "access-control-allow-headers" not in headers  # not configured
    status, headers = run_asgi(app, "OPTIONS", {"Access-Control-Request-Method": "POST"})
    assert status == 200 and headers["access-control-allow-methods"] == "GET, POST"
    status, _ = run_asgi(app, "OPTIONS", {})  # not a preflight: the app answers
    assert status == 404


def test_labelled_lines_put_every_value_in_one_column() -> None:
    from serve.cli.control import labelled

    lines = labelled(
        [("inference", "http://a"), ("grpc_management", "127.0.0.1:1"), ("logs", "/l")]
    )
    assert lines == [
        "  inference        http://a",
        "  grpc_management  127.0.0.1:1",
        "  logs             /l",
    ]
    assert len({line.index(line.split()[1]) for line in lines}) == 1
    assert labelled([]) == []


def test_engine_line_shows_a_generative_models_kind_limits_and_running_requests() -> None:
    from serve.cli.control import engine_line

    limits = {"slots": 8, "max_running_sequences": 8, "max_cached_tokens": 16384}
    described = {
        "modelVersion": "1.0",
        "workers": [
            {"limits": limits, "runningRequests": 3},
            {"limits": limits, "runningRequests": 2},
        ],
    }
    assert engine_line("smollm2", described) == [
        "  smollm2 1.0: generative; slots 8, max_running_sequences 8, max_cached_tokens 16384;"
        " running 5"
    ]
    engine = {"waiting": 1, "running": 3, "kvCacheUsage": 0.25}
    reporting = {"modelVersion": "1.0", "workers": [{"limits": limits, "runningRequests": 3,
                                                    "engine": engine}]}  # fmt: skip
    assert engine_line("smollm2", reporting)[0].endswith(
        "running 3; waiting in engine 1; KV cache 25%"
    )
    concurrent = {"modelVersion": "2", "workers": [{"limits": {"slots": 4}, "runningRequests": 0}]}
    assert engine_line("vllm", concurrent) == ["  vllm 2: concurrent; slots 4; running 0"]
    assert engine_line("echo", {"modelVersion": "1.0", "workers": [{"status": "READY"}]}) == []
    assert engine_line("idle", {"modelVersion": "1.0", "workers": []}) == []
