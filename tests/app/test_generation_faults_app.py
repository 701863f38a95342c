"""Hostile or misdirected bodies on the generative routes, in process (issue 39).

The OpenAI routes (completions, chat, embeddings) and OIP generate: JSON nested 100,000 deep is
a 400 with no traceback logged; a generation request to a model that does not generate text
(an echo handler) is a 400 saying so, not a 500 or an empty 200.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

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
        # The generative model beside it still answers.
        done = await infer.post("/v1/completions", json={"model": "llm", "prompt": "a"})
        assert done.status_code == 200 and done.json()["choices"][0]["text"]
        whole = await infer.post("/v2/models/llm/generate", json={"text_input": "a"})
        assert whole.status_code == 200 and json.loads(whole.text)["text_output"]

    serve(tmp_path, test)
