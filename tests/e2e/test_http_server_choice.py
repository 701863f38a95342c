"""`http_server: auto` on real servers: uvicorn by default, hypercorn (with HTTP/2) when asked for,
and a refusal when uvicorn is named together with HTTP/2. The choice is logged with its reason."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.server import LanternServer, echo_archive


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store")
    echo_archive(path, "echo")
    return path


def _server(tmp_path: Path, store: Path, env: dict[str, str] | None = None) -> LanternServer:
    server = LanternServer(tmp_path, store, ["echo=echo.mar"], env=env)
    server.http_server = None  # the default, whatever LANTERN_TEST_HTTP_SERVER says
    return server


def test_default_is_uvicorn_and_says_why(tmp_path: Path, store: Path) -> None:
    with _server(tmp_path, store) as server:
        resp = httpx.post(f"{server.inference}/predictions/echo", content=b"hi", timeout=30)
        assert resp.status_code == 200
        assert resp.headers["server"] == "uvicorn"
        assert resp.http_version == "HTTP/1.1"
        assert "HTTP server: uvicorn (auto: fastest for HTTP/1.1" in server.log_text("lantern.log")
        # Not the choice of server, but this torch-free server is the place to see it: its warm
        # spare preloads nothing, since no worker of it imported torch (serve/worker/spares.py).
        deadline = time.monotonic() + 60
        while "preloaded: nothing" not in server.log_text("lantern.log"):
            assert time.monotonic() < deadline, "no spare became ready in 60 s"
            time.sleep(0.05)
        assert "preloaded: torch" not in server.log_text("lantern.log")


def test_http2_asked_for_picks_hypercorn_and_serves_http2(tmp_path: Path, store: Path) -> None:
    with _server(tmp_path, store, env={"LANTERN_HTTP2": "true"}) as server:
        # Prior-knowledge HTTP/2 over plain TCP (h2c), as gRPC-style clients speak it.
        with httpx.Client(http1=False, http2=True, timeout=30) as client:
            resp = client.post(f"{server.inference}/predictions/echo", content=b"hi")
        assert resp.status_code == 200
        assert resp.http_version == "HTTP/2"
        log = server.log_text("lantern.log")
        assert "HTTP server: hypercorn (auto: http2 (HTTP/2) asked for" in log


def test_uvicorn_with_http2_is_refused_before_starting(tmp_path: Path, store: Path) -> None:
    server = _server(tmp_path, store)
    cmd = [*server.command(), "--http-server", "uvicorn"]
    proc = subprocess.run(
        cmd,
        cwd=tmp_path,
        env={**os.environ, "LANTERN_HTTP2": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "http2 (HTTP/2) needs hypercorn" in proc.stderr
    assert not server.state_file.exists()
