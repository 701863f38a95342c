"""The request-head bound's pieces in process: its size, hypercorn's guard, the config key."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from serve.config import Config, ConfigError
from serve.http.header_limit import HeadLimit, head_size


def test_head_size_counts_the_request_line_and_every_header_line() -> None:
    raw = b"GET /ping HTTP/1.1\r\nhost: x\r\nab: cd\r\n"
    assert head_size(b"GET", b"/ping", [(b"host", b"x"), (b"ab", b"cd")]) == len(raw)


async def _ok(request: object) -> PlainTextResponse:
    return PlainTextResponse("ok")


@pytest.mark.anyio
async def test_the_guard_answers_431_past_the_limit_and_passes_the_rest() -> None:
    app = HeadLimit(Starlette(routes=[Route("/ping", _ok)]), 2048)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/ping", headers={"x-pad": "a" * 1500})).status_code == 200
        over = await c.get("/ping", headers={"x-pad": "a" * 2100})
        assert over.status_code == 431 and over.headers["connection"] == "close"
        assert (await c.get("/ping?" + "q" * 2100)).status_code == 431


def test_the_limit_is_a_config_key_with_a_floor() -> None:
    assert Config().max_header_size == 16 * 1024
    with pytest.raises(ConfigError, match="max_header_size"):
        Config(max_header_size=100).validate()


class _Transport:
    """What uvicorn's protocol writes, and whether it closed the connection."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, lines: list[bytes]) -> None:
        self.written += b"".join(lines)

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _empty(scope: object, receive: object, send: object) -> None:
    for message in (
        {"type": "http.response.start", "status": 204, "headers": []},
        {"type": "http.response.body", "body": b""},
    ):
        await send(message)  # type: ignore[operator]


async def _answer(head: bytes, limit: int, reads: int) -> bytes:
    """uvicorn's bounded protocol fed ``head`` in ``reads`` pieces: what it answered."""
    import asyncio

    from uvicorn.config import Config as UvicornConfig
    from uvicorn.server import ServerState

    from serve.http.header_limit import limited_httptools

    protocol_class = limited_httptools(limit)
    config = UvicornConfig(_empty, lifespan="off", log_config=None, http=protocol_class)
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    step = -(-len(head) // reads)
    for start in range(0, len(head), step):
        protocol.data_received(head[start : start + step])
    for _ in range(5):
        await asyncio.sleep(0)
    return transport.written.split(b"\r\n", 1)[0]


@pytest.mark.anyio
@pytest.mark.parametrize("reads", [1, 2])
@pytest.mark.parametrize("sep", [b": ", b":"])
async def test_uvicorns_bound_is_exact_at_the_limit(reads: int, sep: bytes) -> None:
    limit = 1024

    def head(pad: int) -> tuple[bytes, int]:
        # With ":" and 3 headers, head_size counts a byte more than the head takes on the wire.
        headers = [(b"host", b"t"), (b"x-a", b"b"), (b"x-pad", b"a" * pad)]
        lines = b"".join(name + sep + value + b"\r\n" for name, value in headers)
        return b"GET /ping HTTP/1.1\r\n" + lines + b"\r\n", head_size(b"GET", b"/ping", headers)

    pad = next(p for p in range(900, 1100) if head(p)[1] == limit)
    assert await _answer(head(pad)[0], limit, reads) == b"HTTP/1.1 204 No Content"
    over = await _answer(head(pad + 1)[0], limit, reads)
    assert over == b"HTTP/1.1 431 Request Header Fields Too Large"
