"""Model URLs with ``allowed_urls``, in process: downloads that match, refusals that never connect.

A tiny HTTP listener (a thread in this process) serves archives and records every request; the
server (in process, fake workers) allows ``http://127.0.0.1:<port>/allowed/.*`` and one folder
outside the model store, with a small download cap and timeout.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import echo_archive

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


def serve(root: Path, listener: Listener, test: Callable[[Lantern, Path], Awaitable[None]]) -> None:
    """Run ``test(lantern, outside)`` against a server that allows the listener's ``/allowed/``
    paths and the folder ``outside``."""
    store = root / "store"
    store.mkdir()
    outside = root / "outside"
    outside.mkdir()
    echo_archive(outside, name="local")
    allowed = [
        rf"http://127\.0\.0\.1:{listener.port}/allowed/.*",
        f"file://{re.escape(str(outside))}/.*",
    ]

    async def body() -> None:
        config = test_config(
            root,
            store,
            enable_model_api=True,
            allowed_urls=allowed,
            download_max_size=CAP,
            download_timeout=1.0,
        )
        async with in_process(config) as lantern:
            await test(lantern, outside)

    run(body)


async def register(lantern: Lantern, url: str, **params: Any) -> httpx.Response:
    return await lantern.management.post("/models", params={"url": url, **params})


def assert_error(response: httpx.Response, code: int) -> str:
    assert response.status_code == code, response.text
    body = response.json()
    assert set(body) == {"code", "type", "message"} and body["code"] == code
    return body["message"]


def store_files(lantern: Lantern) -> set[str]:
    return {p.name for p in Path(lantern.server.config.model_store or "").iterdir()}


def test_allowed_url_downloads_into_the_store_and_serves(
    tmp_path: Path, listener: Listener
) -> None:
    async def test(lantern: Lantern, outside: Path) -> None:
        api = lantern.management
        url = listener.url("/allowed/dl.mar")
        response = await register(lantern, url, initial_workers=1)
        assert response.status_code == 200, response.text
        assert response.json() == {
            "status": 'Model "dl" Version: 1.0 registered with 1 initial workers'
        }
        assert listener.requests.count("/allowed/dl.mar") == 1
        assert "dl.mar" in store_files(lantern)
        assert not [n for n in store_files(lantern) if n.startswith(".download")]
        (data,) = (await api.get("/models/dl")).json()
        assert data["modelUrl"] == url
        predicted = await lantern.inference.post("/predictions/dl", content=b"fetched")
        assert predicted.json()["echo"] == "fetched"

        # The stored file is never overwritten by a second download; the store name serves.
        assert (await api.delete("/models/dl")).status_code == 200
        message = assert_error(await register(lantern, url), 409)
        assert "already exists" in message and "url=dl.mar" in message
        assert listener.requests.count("/allowed/dl.mar") == 1
        assert (await register(lantern, "dl.mar", initial_workers=0)).status_code == 200
        assert (await api.delete("/models/dl")).status_code == 200

    serve(tmp_path, listener, test)


def test_refusals_never_contact_the_listener(tmp_path: Path, listener: Listener) -> None:
    async def test(lantern: Lantern, outside: Path) -> None:
        seen = len(listener.requests)
        for path in (
            "/denied/echo.mar",  # does not match the pattern
            "/allowedX/echo.mar",
            "/allowed/../denied/echo.mar",  # matches the pattern, but `..` is refused first
            "/allowed/%2e%2e/denied/echo.mar",
            "/allowed/%252e%252e/denied/echo.mar",
            "/allowed/download?id=3",  # no archive file name to store it under
        ):
            assert_error(await register(lantern, listener.url(path)), 400)
        other = f"http://127.0.0.2:{listener.port}/allowed/x.mar"
        message = assert_error(await register(lantern, other), 400)
        assert "allowed_urls" in message
        assert len(listener.requests) == seen

    serve(tmp_path, listener, test)


def test_redirect_to_a_url_that_is_not_allowed_is_not_followed(
    tmp_path: Path, listener: Listener
) -> None:
    async def test(lantern: Lantern, outside: Path) -> None:
        response = await register(lantern, listener.url("/allowed/redirect.mar"))
        assert "Redirect" in assert_error(response, 400)
        assert "/allowed/redirect.mar" in listener.requests
        assert "/denied/echo.mar" not in listener.requests

    serve(tmp_path, listener, test)


@pytest.mark.parametrize("name", ["big.mar", "big-nolength.mar"])
def test_download_over_the_size_cap_fails_cleanly(
    tmp_path: Path, listener: Listener, name: str
) -> None:
    async def test(lantern: Lantern, outside: Path) -> None:
        response = await register(lantern, listener.url(f"/allowed/{name}"))
        assert "download_max_size" in assert_error(response, 400)
        files = store_files(lantern)
        assert name not in files
        assert not [n for n in files if n.startswith(".download")]

    serve(tmp_path, listener, test)


def test_slow_download_times_out_cleanly(tmp_path: Path, listener: Listener) -> None:
    async def test(lantern: Lantern, outside: Path) -> None:
        started = time.monotonic()
        message = assert_error(await register(lantern, listener.url("/allowed/slow.mar")), 400)
        assert time.monotonic() - started < 30  # bounded by download_timeout, not the listener
        assert "download" in message.lower()
        assert "slow.mar" not in store_files(lantern)

    serve(tmp_path, listener, test)


def test_downloaded_file_that_is_no_archive_is_removed(tmp_path: Path, listener: Listener) -> None:
    async def test(lantern: Lantern, outside: Path) -> None:
        response = await register(lantern, listener.url("/allowed/garbage.mar"))
        assert "garbage.mar" in assert_error(response, 400)
        assert "garbage.mar" not in store_files(lantern)

    serve(tmp_path, listener, test)


def test_allowed_file_url_and_path_outside_the_store(tmp_path: Path, listener: Listener) -> None:
    async def test(lantern: Lantern, outside: Path) -> None:
        api = lantern.management
        archive = outside / "local.mar"
        response = await register(lantern, archive.as_uri(), initial_workers=0)
        assert response.status_code == 200, response.text
        assert (await api.delete("/models/local")).status_code == 200
        response = await register(lantern, str(archive), initial_workers=0)
        assert response.status_code == 200, response.text
        assert (await api.delete("/models/local")).status_code == 200
        # Other absolute paths stay refused, and `..` cannot climb out of an allowed folder.
        secret = tmp_path / "lantern.yaml"
        secret.write_text("{}")
        assert_error(await register(lantern, str(secret)), 400)
        assert_error(await register(lantern, f"{outside}/../lantern.yaml"), 400)
        assert_error(await register(lantern, (outside / ".." / "lantern.yaml").as_uri()), 400)

    serve(tmp_path, listener, test)
