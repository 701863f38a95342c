"""Model URLs with ``allowed_urls``: downloads that match, refusals that never connect.

A tiny HTTP listener (a thread in this process) serves archives and records every request; the
server gets a ``--config`` YAML file that allows ``http://127.0.0.1:<port>/allowed/.*`` and one
folder outside the model store, with a small download cap and timeout.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.server import LanternServer, echo_archive

CAP = 64 * 1024


@dataclass
class Listener:
    """What the listener serves, and every path it was asked for."""

    files: dict[str, bytes]
    requests: list[str] = field(default_factory=list)
    port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def make_handler(listener: Listener) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            listener.requests.append(self.path)
            if self.path == "/allowed/redirect.mar":
                self.send_response(302)
                self.send_header("Location", "/denied/echo.mar")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path == "/allowed/slow.mar":
                time.sleep(3)  # past the server's download_timeout of 1 s
            body = listener.files.get(self.path)
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            if not self.path.endswith("-nolength.mar"):  # else: read until the connection closes
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def listener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listener]:
    build = tmp_path_factory.mktemp("listener")
    archive = echo_archive(build, name="dl").read_bytes()
    big = b"\0" * (CAP * 2)
    files = {
        "/allowed/dl.mar": archive,
        "/allowed/big.mar": big,
        "/allowed/big-nolength.mar": big,
        "/allowed/slow.mar": archive,
        "/allowed/garbage.mar": b"this is not a model archive",
        "/denied/echo.mar": archive,
    }
    state = Listener(files)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, listener: Listener) -> Iterator[LanternServer]:
    root = tmp_path_factory.mktemp("urls")
    store = root / "store"
    store.mkdir()
    outside = root / "outside"
    outside.mkdir()
    echo_archive(outside, name="local")
    config = root / "lantern.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "allowed_urls": [
                    rf"http://127\.0\.0\.1:{listener.port}/allowed/.*",
                    f"file://{re.escape(str(outside))}/.*",
                ],
                "download_max_size": CAP,
                "download_timeout": 1.0,
            }
        )
    )
    srv = LanternServer(root, store, args=["--enable-model-api", "--config", str(config)])
    srv.outside = outside  # type: ignore[attr-defined]
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api(server: LanternServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.management, timeout=60) as client:
        yield client


def register(api: httpx.Client, url: str, **params: Any) -> httpx.Response:
    return api.post("/models", params={"url": url, **params})


def assert_error(response: httpx.Response, code: int) -> str:
    assert response.status_code == code, response.text
    body = response.json()
    assert set(body) == {"code", "type", "message"} and body["code"] == code
    return body["message"]


def store_files(server: LanternServer) -> set[str]:
    return {p.name for p in server.model_store.iterdir()}


def test_allowed_url_downloads_into_the_store_and_serves(
    server: LanternServer, api: httpx.Client, listener: Listener
) -> None:
    url = listener.url("/allowed/dl.mar")
    response = register(api, url, initial_workers=1)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "status": 'Model "dl" Version: 1.0 registered with 1 initial workers'
    }
    assert listener.requests.count("/allowed/dl.mar") == 1
    assert "dl.mar" in store_files(server)
    assert not [n for n in store_files(server) if n.startswith(".download")]
    (data,) = api.get("/models/dl").json()
    assert data["modelUrl"] == url
    predicted = httpx.post(f"{server.inference}/predictions/dl", content=b"fetched", timeout=30)
    assert predicted.json()["echo"] == "fetched"

    # The stored file is never overwritten by a second download; the store name serves instead.
    assert api.delete("/models/dl").status_code == 200
    message = assert_error(register(api, url), 409)
    assert "already exists" in message and "url=dl.mar" in message
    assert listener.requests.count("/allowed/dl.mar") == 1
    assert register(api, "dl.mar", initial_workers=0).status_code == 200
    assert api.delete("/models/dl").status_code == 200


def test_refusals_never_contact_the_listener(api: httpx.Client, listener: Listener) -> None:
    seen = len(listener.requests)
    for path in (
        "/denied/echo.mar",  # does not match the pattern
        "/allowedX/echo.mar",
        "/allowed/../denied/echo.mar",  # matches the pattern, but `..` is refused first
        "/allowed/%2e%2e/denied/echo.mar",
        "/allowed/%252e%252e/denied/echo.mar",
        "/allowed/download?id=3",  # no archive file name to store it under
    ):
        assert_error(register(api, listener.url(path)), 400)
    message = assert_error(register(api, f"http://127.0.0.2:{listener.port}/allowed/x.mar"), 400)
    assert "allowed_urls" in message
    assert len(listener.requests) == seen


def test_redirect_to_a_url_that_is_not_allowed_is_not_followed(
    api: httpx.Client, listener: Listener
) -> None:
    message = assert_error(register(api, listener.url("/allowed/redirect.mar")), 400)
    assert "Redirect" in message
    assert "/allowed/redirect.mar" in listener.requests
    assert "/denied/echo.mar" not in listener.requests


@pytest.mark.parametrize("name", ["big.mar", "big-nolength.mar"])
def test_download_over_the_size_cap_fails_cleanly(
    server: LanternServer, api: httpx.Client, listener: Listener, name: str
) -> None:
    message = assert_error(register(api, listener.url(f"/allowed/{name}")), 400)
    assert "download_max_size" in message
    files = store_files(server)
    assert name not in files
    assert not [n for n in files if n.startswith(".download")]


def test_slow_download_times_out_cleanly(
    server: LanternServer, api: httpx.Client, listener: Listener
) -> None:
    started = time.monotonic()
    message = assert_error(register(api, listener.url("/allowed/slow.mar")), 400)
    assert time.monotonic() - started < 30  # bounded by download_timeout, not the listener
    assert "download" in message.lower()
    assert "slow.mar" not in store_files(server)


def test_downloaded_file_that_is_no_archive_is_removed(
    server: LanternServer, api: httpx.Client, listener: Listener
) -> None:
    message = assert_error(register(api, listener.url("/allowed/garbage.mar")), 400)
    assert "garbage.mar" in message
    assert "garbage.mar" not in store_files(server)


def test_allowed_file_url_and_path_outside_the_store(
    server: LanternServer, api: httpx.Client
) -> None:
    outside: Path = server.outside  # type: ignore[attr-defined]
    archive = outside / "local.mar"
    response = register(api, archive.as_uri(), initial_workers=0)
    assert response.status_code == 200, response.text
    assert api.delete("/models/local").status_code == 200
    response = register(api, str(archive), initial_workers=0)
    assert response.status_code == 200, response.text
    assert api.delete("/models/local").status_code == 200
    # Other absolute paths stay refused, and `..` cannot climb out of an allowed folder.
    assert_error(register(api, str(server.model_store.parent / "lantern.yaml")), 400)
    assert_error(register(api, f"{outside}/../lantern.yaml"), 400)
    assert_error(register(api, (outside / ".." / "lantern.yaml").as_uri()), 400)
