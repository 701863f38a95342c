"""Hostile or misdirected bodies on the generative routes, in process (issue 39).

The OpenAI routes (completions, chat, embeddings) and OIP generate: JSON nested 100,000 deep is
a 400 with no traceback logged; a generation request to a model that does not generate text
(an echo handler) is a 400 saying so, not a 500 or an empty 200.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from serve.core import offload
from serve.wire import json_input
from serve.wire import openai as oai
from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import HANDLERS, build_archive, echo_archive

FAKE_LLM = HANDLERS / "fake_llm_handler.py"


def serve(root: Path, test: Callable[[Lantern], Awaitable[None]], **overrides: Any) -> None:
    store = root / "store"
    store.mkdir(parents=True)
    build_archive(store, "llm", FAKE_LLM, config={"minWorkers": 1, "embeddings": True})
    echo_archive(store, "echo", config={"minWorkers": 1, "embeddings": True})

    async def body() -> None:
        values = {"load_models": ["llm.mar", "echo.mar"], **overrides}
        async with in_process(test_config(root, store, **values), InlineWorkers()) as lantern:
            await test(lantern)

    run(body, limit=120)


def _nested(field: str, depth: int = 100_000) -> bytes:
    return b'{"model": "llm", "' + field.encode() + b'": ' + b"[" * depth + b"]" * depth + b"}"


NESTED = [
    ("/v1/completions", _nested("prompt")),
    ("/v1/chat/completions", _nested("messages")),
    ("/v1/embeddings", _nested("input")),
    ("/openai/v1/completions", _nested("stop")),
    ("/v2/models/llm/generate", b'{"text_input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    (
        "/v2/models/llm/generate_stream",
        b'{"parameters": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}",
    ),
]


def test_json_nested_too_deep_is_a_400_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def test(lantern: Lantern) -> None:
        for path, content in NESTED:
            resp = await lantern.inference.post(path, content=content)
            assert resp.status_code == 400, (path, resp.text)
            error = resp.json()["error"]
            message = error if isinstance(error, str) else error["message"]
            assert "nested too deeply" in message, (path, message)

    with caplog.at_level(logging.WARNING):
        serve(tmp_path, test)
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text


def test_generation_on_a_model_that_does_not_generate_is_a_400(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        infer = lantern.inference
        chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
        for path, body in [
            ("/v1/completions", {"model": "echo", "prompt": "hi"}),
            ("/v1/completions", {"model": "echo", "prompt": "hi", "stream": True}),
            ("/v1/chat/completions", chat),
            ("/v1/chat/completions", {**chat, "stream": True}),
        ]:
            resp = await infer.post(path, json=body)
            assert resp.status_code == 400, (path, body, resp.text)
            error = resp.json()["error"]
            assert "does not generate text" in error["message"], error
            assert error["param"] == "model"
        for path in ("/v2/models/echo/generate", "/v2/models/echo/generate_stream"):
            resp = await infer.post(path, json={"text_input": "hi"})
            assert resp.status_code == 400, (path, resp.text)
            assert "does not generate text" in resp.json()["error"]
        # A big answer (the echo of a 600 KB prompt) is parsed off the loop, with the same 400.
        big = {"model": "echo", "prompt": "x" * 600_000}
        resp = await infer.post("/v1/completions", json=big)
        assert resp.status_code == 400 and "does not generate" in resp.json()["error"]["message"]
        # The generative model beside it still answers.
        done = await infer.post("/v1/completions", json={"model": "llm", "prompt": "a"})
        assert done.status_code == 200 and done.json()["choices"][0]["text"]
        whole = await infer.post("/v2/models/llm/generate", json={"text_input": "a"})
        assert whole.status_code == 200 and json.loads(whole.text)["text_output"]

    try:
        serve(tmp_path, test)
    finally:
        offload.shutdown()


def _ids_body(count: int = 3_100_000) -> bytes:
    """The issue's body: ~6 MB, millions of stop_token_ids, to a model that does not exist."""
    ids = ",".join(["1"] * count)
    return ('{"model": "nope", "prompt": "hello", "stop_token_ids": [' + ids + "]}").encode()


def test_long_lists_are_refused_before_the_body_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []
    real = json_input.parse_json

    def recording(data: bytes | str, what: str = "") -> Any:
        parsed.append(len(data))
        return real(data, what)

    async def test(lantern: Lantern) -> None:
        infer = lantern.inference
        big = _ids_body()
        assert len(big) > 6_000_000
        started = time.perf_counter()
        resp = await infer.post("/v1/completions", content=big)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "stop_token_ids"
        assert time.perf_counter() - started < 5  # a full parse alone took 0.3-0.9 s
        with monkeypatch.context() as patched:  # a small body is checked in this process
            patched.setattr(oai, "parse_json", recording)
            chat = {"model": "llm", "messages": [{"role": "user", "content": "x"}] * 16_385}
            for path, body, param in [
                ("/v1/completions", {"model": "llm", "prompt": "a", "stop": ["a"] * 5}, "stop"),
                ("/v1/chat/completions", chat, "messages"),
                ("/v1/embeddings", {"model": "llm", "input": ["a"] * 2049}, "input"),
            ]:
                resp = await infer.post(path, json=body)
                assert resp.status_code == 400, (path, resp.text)
                error = resp.json()["error"]
                assert error["param"] == param and "at most" in error["message"], error
            assert parsed == []  # refused from the commas, before any parse
            stops = {"text_input": "a", "parameters": {"stop_token_ids": list(range(2000))}}
            resp = await infer.post("/v2/models/llm/generate", json=stops)
            assert resp.status_code == 400 and "parameters.stop_token_ids" in resp.json()["error"]
            assert parsed == []
            # A key spelled with an escape passes the scan; the parsed document is checked too.
            spelled = b'{"model": "llm", "prompt": "a", "stop\\u005ftoken_ids": [' + b"1," * 1100
            resp = await infer.post("/v1/completions", content=spelled + b"1]}")
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "stop_token_ids"
            assert len(parsed) == 1
        # Within the bounds the requests are answered.
        ok = {"model": "llm", "prompt": "a", "stop": ["x"] * 4, "stop_token_ids": [1] * 1024}
        assert (await infer.post("/v1/completions", json=ok)).status_code == 200

    try:
        serve(tmp_path, test)
    finally:
        offload.shutdown()


def test_answers_over_max_response_size_are_refused(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        infer = lantern.inference
        message = "The model's response exceeds max_response_size of 300 bytes."
        for path, body in [
            ("/v1/embeddings", {"model": "llm", "input": ["word"] * 100}),
            ("/v1/completions", {"model": "llm", "prompt": "a", "max_tokens": 60}),
        ]:
            resp = await infer.post(path, json=body)
            assert resp.status_code == 500, (path, resp.text)
            assert resp.json()["error"]["message"] == message
        long = {"text_input": "a", "parameters": {"max_tokens": 60}}
        resp = await infer.post("/v2/models/llm/generate", json=long)
        assert resp.status_code == 500 and resp.json()["error"] == message
        small = await infer.post("/v1/embeddings", json={"model": "llm", "input": ["a b"]})
        assert small.status_code == 200 and small.json()["data"][0]["embedding"]
        one = await infer.post(
            "/v1/completions", json={"model": "llm", "prompt": "a", "max_tokens": 1}
        )
        assert one.status_code == 200, one.text

    serve(tmp_path, test, max_response_size=300)
