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
