"""The OpenAI routes on a real server with the ``text_generation`` handler and the tiny model.

The wiring: the real ``openai`` client over a socket, the worker process, the engine, SSE.
The API's logic and errors are in ``tests/app/test_openai_app.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.server import LanternServer, build_archive

pytest.importorskip("transformers")

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    from tests.support.generation_fixtures import save_pretrained

    work = tmp_path_factory.mktemp("openai_llm")
    folder = work / "tiny"
    _, tokenizer = save_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    store = work / "store"
    store.mkdir()
    build_archive(
        store,
        "tiny",
        "text_generation",
        config={"minWorkers": 1, "handler": {"max_model_len": 128}},
        extra_files=sorted(folder.iterdir()),
    )
    # A chat without max_tokens answers the rest of the context (128), at most 100 tokens.
    env = {"LANTERN_OPENAI_CHAT_MAX_TOKENS": "100"}
    lantern = LanternServer(work, store, ["tiny=tiny.mar"], args=["--no-grpc"], env=env)
    lantern.start(timeout=180)
    yield lantern
    lantern.stop()


def test_completions_whole_and_streamed_agree(server: LanternServer) -> None:
    client = openai.OpenAI(api_key="none", base_url=f"{server.inference}/v1", max_retries=0)
    whole = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 8
    text = whole.choices[0].text
    assert text
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_logprobs_name_each_token_whole_and_streamed(server: LanternServer) -> None:
    client = openai.OpenAI(api_key="none", base_url=f"{server.inference}/v1", max_retries=0)
    asked: Any = {
        "model": "tiny",
        "max_tokens": 6,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(prompt=PROMPT, logprobs=2, **asked)
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert "".join(lp.tokens) == whole.choices[0].text and len(lp.tokens) == 6
    assert lp.top_logprobs is not None and lp.text_offset is not None
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0 and len(top) == 2
        assert max(top, key=top.__getitem__) == token  # greedy: the chosen one is the likeliest
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    streamed = client.completions.create(prompt=PROMPT, logprobs=2, stream=True, **asked)
    pieces = [c.choices[0].logprobs for c in streamed if c.choices and c.choices[0].logprobs]
    assert [t for p in pieces for t in p.tokens or []] == lp.tokens
    assert [o for p in pieces for o in p.text_offset or []] == lp.text_offset

    messages: Any = [{"role": "user", "content": "the lazy dog"}]
    chat = client.chat.completions.create(messages=messages, logprobs=True, top_logprobs=3, **asked)
    content = chat.choices[0].logprobs and chat.choices[0].logprobs.content
    assert content and "".join(e.token for e in content) == chat.choices[0].message.content
    assert all(len(e.top_logprobs) == 3 and e.bytes == list(e.token.encode()) for e in content)
    plain = client.chat.completions.create(messages=messages, **asked)
    assert plain.choices[0].logprobs is None  # not asked: none


def test_chat_async_renders_the_template_and_streams(server: LanternServer) -> None:
    import asyncio

    async def chat() -> tuple[str, str]:
        client = openai.AsyncOpenAI(
            api_key="none", base_url=f"{server.inference}/v1", max_retries=0
        )
        messages: Any = [
            {"role": "system", "content": "answer"},
            {"role": "user", "content": "the lazy dog"},
        ]
        whole = await client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=6,
            temperature=0,
        )
        stream = await client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=6,
            temperature=0,
            stream=True,
        )
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        await client.close()
        return whole.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(chat())
    assert whole == streamed


def test_a_dropped_stream_leaves_the_server_serving(server: LanternServer) -> None:
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 64,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.inference}/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            first = next(resp.iter_lines())
            assert first.startswith("data: {")
        # Dropped after one event: its slot is freed at the engine's next step (that it is, and
        # not waited out, is tests/e2e/test_generation_server.py's); the server serves on.
        after = http.post(
            f"{server.inference}/v1/completions",
            json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0},
        )
        assert after.status_code == 200
        assert after.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_bad_fields_are_400_in_openai_shape(server: LanternServer) -> None:
    client = openai.OpenAI(api_key="none", base_url=f"{server.inference}/v1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt=PROMPT, extra_body={"top_k": -3})
    assert "top_k" in bad.value.response.json()["error"]["message"]


def test_the_chat_default_length_is_the_rest_of_the_context_up_to_the_cap(
    server: LanternServer,
) -> None:
    """OpenAI's chat default (the rest of the context), bounded by openai_chat_max_tokens (100
    here); a completion's default stays 16. ignore_eos: the tiny model never stops early."""
    client = openai.OpenAI(api_key="none", base_url=f"{server.inference}/v1", max_retries=0)
    no_eos: Any = {"ignore_eos": True}
    short: Any = [{"role": "user", "content": "the lazy dog"}]
    capped = client.chat.completions.create(model="tiny", messages=short, extra_body=no_eos)
    assert capped.usage is not None and capped.usage.completion_tokens == 100
    assert capped.choices[0].finish_reason == "length"
    long: Any = [{"role": "user", "content": " ".join([PROMPT] * 6)}]
    rest = client.chat.completions.create(model="tiny", messages=long, extra_body=no_eos)
    assert rest.usage is not None and rest.usage.prompt_tokens > 28  # so that the rest < 100
    assert rest.usage.prompt_tokens + rest.usage.completion_tokens == 128  # max_model_len
    done = client.completions.create(model="tiny", prompt=PROMPT, extra_body=no_eos)
    assert done.usage is not None and done.usage.completion_tokens == 16
    described = httpx.get(f"{server.management}/models/tiny", timeout=30).json()[0]
    assert described["generative"] is True and described["maxModelLen"] == 128


def test_what_guidellm_sends_and_checks_first(server: LanternServer) -> None:
    """GET /health, then a streamed completion with vLLM's continuous_usage_stats: every chunk
    counts the tokens so far; the last text chunk holds the whole usage."""
    assert httpx.get(f"{server.inference}/health", timeout=30).status_code == 200
    version = httpx.get(f"{server.inference}/version", timeout=30).json()["version"]
    assert version
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 5,
        "stream": True,
        "stop": None,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with httpx.stream("POST", f"{server.inference}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
    chunks = [json.loads(ln[6:]) for ln in lines]
    counted = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert counted == sorted(counted) and counted[-1] == 5
    final = [c for c in chunks if c["choices"]][-1]
    assert final["choices"][0]["finish_reason"] == "length"
    usage = final["usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage
