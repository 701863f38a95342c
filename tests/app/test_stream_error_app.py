"""A chunked stream (``send_intermediate_predict_response`` parts on ``/predictions``) that fails
after its first part ends with TorchServe's error object as its last chunk, never silently."""

from __future__ import annotations

import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve.core.jobs import ItemResult, PartQueue
from serve.http.inference import _result_response, stream_error_chunk
from serve.wire.errors import ServeError, WorkerDied


def app_streaming(*later: ItemResult | ServeError) -> Starlette:
    async def route(request: Request) -> Response:
        stream = PartQueue()
        for item in (*later, None):
            stream.put_nowait(item)
        return _result_response(ItemResult(200, b"a ", "text/plain", stream=stream), "r1", 1 << 20)

    return Starlette(routes=[Route("/", route)])


async def body_of(app: Starlette) -> tuple[int, bytes]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/")
        return response.status_code, response.content


@pytest.mark.anyio
async def test_a_stream_whose_worker_dies_ends_with_an_error_chunk() -> None:
    died = WorkerDied("Worker died while processing request r1.")
    status, body = await body_of(app_streaming(ItemResult(200, b"b ", "text/plain"), died))
    assert status == 200  # the first part set it
    assert body.startswith(b"a b ") and body.endswith(stream_error_chunk(died))
    last = json.loads(body.splitlines()[-1])
    assert last == {"code": died.status_code, "type": "WorkerDied", "message": died.message}


@pytest.mark.anyio
async def test_a_stream_that_ends_well_has_no_error_chunk() -> None:
    status, body = await body_of(app_streaming(ItemResult(200, b"b ", "text/plain")))
    assert (status, body) == (200, b"a b ")


@pytest.mark.anyio
async def test_a_part_over_max_response_size_ends_the_stream() -> None:
    cancelled: list[bool] = []
    big = ItemResult(200, b"x" * ((1 << 20) + 1), "text/plain")

    async def route(request: Request) -> Response:
        stream = PartQueue()
        for item in (ItemResult(200, b"b ", "text/plain"), big, None):
            stream.put_nowait(item)
        first = ItemResult(200, b"a ", "text/plain", stream=stream)
        first.abandon = lambda: cancelled.append(True)
        return _result_response(first, "r1", 1 << 20)

    status, body = await body_of(Starlette(routes=[Route("/", route)]))
    assert status == 200 and body.startswith(b"a b ")
    last = json.loads(body.splitlines()[-1])
    assert last["message"] == f"The model's response exceeds max_response_size of {1 << 20} bytes."
    assert cancelled  # the request is cancelled on its worker
