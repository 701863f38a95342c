"""Log formatters, the worker record line format and the access-log ASGI wrapper."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from serve.http.access_log import AccessLog
from serve.http.common import request_id
from serve.logs import JsonFormatter, LogFile, TextFormatter
from serve.metrics.prometheus import ServerMetrics
from serve.metrics.system import SystemMetrics
from tests.support.log_records import make_record


def test_text_formatter_prefixes_worker_records() -> None:
    fmt = TextFormatter()
    plain = fmt.format(make_record())
    assert plain.endswith(" WARNING serve.worker hello world")
    tagged = fmt.format(make_record(model="m", version="2.0", worker_id="m_2.0-w1"))
    assert tagged.endswith(" WARNING serve.worker [m 2.0 m_2.0-w1] hello world")


def test_text_formatter_time_matches_loggings_own() -> None:
    record = make_record()
    assert TextFormatter().formatTime(record) == logging.Formatter().formatTime(record)
    later = make_record()
    later.created, later.msecs = record.created + 1.0, 5.0
    assert TextFormatter().formatTime(later) == logging.Formatter().formatTime(later)


def test_log_file_reopens_after_rotation(tmp_path: Path) -> None:
    path = tmp_path / "access_log.log"
    handler = LogFile(str(path))
    handler.setFormatter(TextFormatter())
    handler.emit(make_record("first", ()))
    path.rename(tmp_path / "access_log.log.1")  # what logrotate does
    soon = make_record("same second", ())
    handler.emit(soon)  # checked at most once a second: still the old file
    later = make_record("after rotation", ())
    later.created = time.time() + 2
    handler.emit(later)
    handler.close()
    rotated = (tmp_path / "access_log.log.1").read_text()
    assert "first" in rotated and "same second" in rotated
    assert "after rotation" in path.read_text()


def test_json_formatter_keeps_extra_fields_and_exceptions() -> None:
    try:
        raise KeyError("k")
    except KeyError:
        exc_info = sys.exc_info()
    record = make_record(request_ids=["a"], model="m")
    record.exc_info = exc_info
    data = json.loads(JsonFormatter().format(record))
    assert data["message"] == "hello world"
    assert data["level"] == "WARNING"
    assert data["logger"] == "serve.worker"
    assert data["request_ids"] == ["a"]
    assert data["model"] == "m"
    assert "KeyError: 'k'" in data["exception"]
    assert data["time"].endswith("Z")


# ----- the access log -----------------------------------------------------------------------------


async def predict(request: Request) -> Response:
    rid = request_id(request)
    return PlainTextResponse("ok", headers={"x-request-id": rid})


async def header_only(request: Request) -> Response:
    return PlainTextResponse("ok", headers={"x-request-id": "from-header"})


async def fail(request: Request) -> Response:
    raise RuntimeError("unhandled")


APP = Starlette(
    routes=[
        Route("/predictions/{model}", predict, methods=["POST"]),
        Route("/predictions/{model}/{version}", predict, methods=["POST"]),
        Route("/plain", header_only),
        Route("/fail", fail),
    ]
)


def metrics() -> ServerMetrics:
    return ServerMetrics(system=SystemMetrics(find_nvidia_smi=False))


async def call(app: Any, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 4567))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.request(method, path, **kwargs)


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="serve.access")
    return caplog


@pytest.mark.anyio
async def test_access_log_line_has_the_fields(access: pytest.LogCaptureFixture) -> None:
    m = metrics()
    app = AccessLog(APP, m)
    response = await call(app, "POST", "/predictions/resnet/2.0", headers={"x-request-id": "rid-1"})
    assert response.status_code == 200
    [record] = access.records
    assert record.name == "serve.access"
    assert record.getMessage().startswith(
        '10.1.2.3:4567 "POST /predictions/resnet/2.0 HTTP/1.1" 200 '
    )
    assert record.getMessage().endswith("ms model=resnet version=2.0 request_id=rid-1")
    fields = {
        k: record.__dict__[k]
        for k in ("client", "method", "path", "status", "model", "version", "request_id")
    }
    assert fields == {
        "client": "10.1.2.3:4567",
        "method": "POST",
        "path": "/predictions/resnet/2.0",
        "status": 200,
        "model": "resnet",
        "version": "2.0",
        "request_id": "rid-1",
    }
    assert record.__dict__["latency_ms"] >= 0
    assert m.status_classes == {2: 1, 4: 0, 5: 0}


@pytest.mark.anyio
async def test_access_log_covers_misses_headers_and_crashes(
    access: pytest.LogCaptureFixture,
) -> None:
    m = metrics()
    app = AccessLog(APP, m, resolve_default=True)
    assert (await call(app, "GET", "/nowhere")).status_code == 404
    assert (await call(app, "GET", "/plain")).status_code == 200
    assert (await call(app, "POST", "/predictions/unknown")).status_code == 200
    with pytest.raises(RuntimeError):
        await call(app, "GET", "/fail")
    messages = [r.getMessage() for r in access.records]
    assert len(messages) == 4
    assert '"GET /nowhere HTTP/1.1" 404 ' in messages[0] and messages[0].endswith("request_id=-")
    assert messages[1].endswith("model=- version=- request_id=from-header")
    # No registry bound: a model nobody knows keeps version "-".
    assert "model=unknown version=- " in messages[2]
    assert '"GET /fail HTTP/1.1" 500 ' in messages[3]
    assert m.status_classes == {2: 2, 4: 1, 5: 1}


@pytest.mark.anyio
async def test_access_log_off_still_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL + 1, logger="serve.access")
    m = metrics()
    assert (await call(AccessLog(APP, m), "GET", "/plain")).status_code == 200
    assert not [r for r in caplog.records if r.name == "serve.access"]
    assert m.status_classes[2] == 1


@pytest.mark.anyio
async def test_access_log_passes_other_scopes_through() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await AccessLog(app)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
