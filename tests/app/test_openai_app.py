"""The OpenAI-compatible API in process, driven by the real ``openai`` client (sync and async).

The model's handler is ``tests/support/handlers/fake_llm_handler.py``, run in this process
(`tests.support.inline_workers`): torch-free, it parses requests with the real
``handlers.generation.params`` and answers (and streams) as ``text_generation`` does.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import Lantern, ThreadedLantern, in_process, run, test_config
from tests.support.server import HANDLERS, build_archive, echo_archive

FAKE_LLM = HANDLERS / "fake_llm_handler.py"
LLM = ["llm=llm-1.0.mar", "llm=llm-2.0.mar"]


def _store(root: Path) -> Path:
    store = root / "store"
    store.mkdir(parents=True)
    config = {"minWorkers": 1, "embeddings": True}
    build_archive(store, "llm-1.0", FAKE_LLM, config=config)
    build_archive(store, "llm-2.0", FAKE_LLM, version="2.0", config={"minWorkers": 1})
    echo_archive(store, "echo", config={"minWorkers": 1})
    return store


def serve(root: Path, test: Callable[[Lantern], Awaitable[None]], **overrides: Any) -> None:
    store = _store(root)

    async def body() -> None:
        values = {"load_models": [*LLM, "echo.mar"], **overrides}
        config = test_config(root, store, **values)
        async with in_process(config, InlineWorkers()) as lantern:
            await test(lantern)

    run(body)


def async_client(lantern: Lantern, key: str = "none") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=key,
        base_url="http://inference/v1",
        http_client=lantern.inference,  # type: ignore[arg-type]  # openai types it as its own httpx
        max_retries=0,
    )


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_completions_and_chat_async_whole_and_streamed(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        client = async_client(lantern)
        done = await client.completions.create(model="llm", prompt="hello there", max_tokens=3)
        assert done.choices[0].text == "w0 w1 w2"
        assert done.choices[0].finish_reason == "length"
        assert done.object == "text_completion" and done.id.startswith("cmpl-")
        assert done.created > 0 and done.model == "llm"
        assert done.usage is not None
        assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (2, 3)

        chat = await client.chat.completions.create(
            model="llm",
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ],
            max_tokens=4,
            stop=["w2"],
        )
        assert chat.choices[0].message.role == "assistant"
        assert chat.choices[0].message.content == "w0 w1"
        assert chat.choices[0].finish_reason == "stop"
        assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")

        stream = await client.chat.completions.create(
            model="llm",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        assert "".join(texts) == "w0 w1 w2 w3 w4"
        assert len([t for t in texts if t]) == 5  # one chunk per token
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 5

        streamed = await client.completions.create(
            model="llm", prompt="x", max_tokens=3, stream=True
        )
        parts = [c async for c in streamed]
        assert "".join(c.choices[0].text for c in parts) == "w0 w1 w2"
        assert all(c.usage is None for c in parts)

    serve(tmp_path, test)


def test_requests_are_counted_under_the_model(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        client = async_client(lantern)
        await client.completions.create(model="llm/2.0", prompt="a", max_tokens=1)
        with pytest.raises(openai.BadRequestError):
            # Over the model's length (64): the handler's 400, so counted under the model.
            await client.completions.create(model="llm/2.0", prompt="a", max_tokens=100)
        text = (await lantern.metrics.get("/metrics")).text
        counted = [
            line
            for line in text.splitlines()
            if line.startswith("ts_inference_requests_total") and 'model_name="llm"' in line
        ]
        assert counted and all('model_version="2.0"' in line for line in counted), text
        assert sum(float(line.rsplit(" ", 1)[1]) for line in counted) == 2

    serve(tmp_path, test)


def test_the_stream_is_server_sent_events_ending_in_done(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        body = {"model": "llm", "prompt": "x", "max_tokens": 2, "stream": True}
        resp = await lantern.inference.post("/v1/completions", json=body)
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = resp.text.split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""]
        assert all(e.startswith("data: {") for e in events[:-2])
        assert json.loads(events[-3][6:])["choices"][0]["finish_reason"] == "length"

    serve(tmp_path, test)


def test_model_names_a_version_and_the_list_names_models(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        client = async_client(lantern)
        listed = await client.models.list()
        assert sorted(m.id for m in listed.data) == ["echo", "llm"]
        assert (await client.models.retrieve("llm")).id == "llm"
        two = await client.completions.create(model="llm/2.0", prompt="a b", max_tokens=1)
        assert two.choices[0].text == "w0" and two.model == "llm/2.0"
        with pytest.raises(openai.NotFoundError) as missing:
            await client.completions.create(model="nope", prompt="a")
        assert _error(missing.value)["code"] == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="llm/9.9", prompt="a")
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("nope")
        # A client that is not OpenAI's gets KServe v1's answers on the same paths.
        kserve = await lantern.inference.get("/v1/models")
        assert kserve.json() == {"models": ["echo", "llm"]}
        assert (await lantern.inference.get("/v1/models/llm")).json()["name"] == "llm"
        always = await lantern.inference.get("/openai/v1/models")
        assert always.json()["object"] == "list"

    serve(tmp_path, test)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "llm", "prompt": "a", "temprature": 1}, "temprature"),
        ({"model": "llm", "prompt": "a", "n": 2}, "n"),
        ({"model": "llm", "prompt": 3}, "prompt"),
        ({"model": "llm", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "llm", "prompt": "a", "stream": "yes"}, "stream"),
        (
            {"model": "llm", "prompt": "a", "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ({"prompt": "a"}, "model"),
        # OpenAI's documented ranges, each 400 naming its field.
        ({"model": "llm", "prompt": "a", "max_tokens": -1}, "max_tokens"),
        ({"model": "llm", "prompt": "a", "max_tokens": 1.5}, "max_tokens"),
        ({"model": "llm", "prompt": "a", "temperature": "hot"}, "temperature"),
        ({"model": "llm", "prompt": "a", "temperature": 2.5}, "temperature"),
        ({"model": "llm", "prompt": "a", "top_p": 0}, "top_p"),
        ({"model": "llm", "prompt": "a", "top_p": 1.1}, "top_p"),
        ({"model": "llm", "prompt": "a", "presence_penalty": -3}, "presence_penalty"),
        ({"model": "llm", "prompt": "a", "frequency_penalty": True}, "frequency_penalty"),
        ({"model": "llm", "prompt": "a", "seed": -1}, "seed"),
        ({"model": "llm", "prompt": "a", "seed": 2**64}, "seed"),
        # The handler's own check names its field too (the model's length: 64 here).
        ({"model": "llm", "prompt": "a", "max_tokens": 100}, "max_tokens"),
        (
            {"model": "llm", "prompt": "a", "stream": True, "stream_options": {"x": True}},
            "stream_options",
        ),
        (
            {"model": "llm", "prompt": "a", "stream": True, "stream_options": {"include_usage": 1}},
            "include_usage",
        ),
        ({"model": "llm", "prompt": "a", "modalities": ["audio"]}, "modalities"),
    ],
)
def test_bad_completion_requests_get_the_400_shape(
    tmp_path: Path, body: dict[str, Any], param: str | None
) -> None:
    async def test(lantern: Lantern) -> None:
        resp = await lantern.inference.post("/v1/completions", json=body)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
        assert error["message"]

    serve(tmp_path, test)


def test_chat_ranges_name_their_field(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        client = async_client(lantern)
        messages: Any = [{"role": "user", "content": "x"}]
        cases: list[tuple[dict[str, Any], str]] = [
            ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
            ({"max_completion_tokens": 0}, "max_completion_tokens"),
            ({"temperature": -0.1}, "temperature"),
        ]
        for fields, param in cases:
            with pytest.raises(openai.BadRequestError) as bad:
                await client.chat.completions.create(model="llm", messages=messages, **fields)
            assert _error(bad.value)["param"] == param, fields

    serve(tmp_path, test)


def test_harmless_fields_and_the_tools_stream_options_are_accepted(tmp_path: Path) -> None:
    """guidellm's stream_options (vLLM's continuous_usage_stats: usage in every chunk, the
    tokens so far), OpenAI's include_obfuscation, and hints that change nothing."""

    async def test(lantern: Lantern) -> None:
        body = {
            "model": "llm",
            "prompt": "x",
            "max_tokens": 3,
            "stream": True,
            "stop": None,
            "ignore_eos": True,
            "prompt_cache_key": "k",
            "safety_identifier": "u1",
            "modalities": ["text"],
            "stream_options": {
                "include_usage": True,
                "continuous_usage_stats": True,
                "include_obfuscation": False,
            },
        }
        resp = await lantern.inference.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        chunks = [json.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
        texts = [c for c in chunks if c["choices"]]
        assert [c["choices"][0]["text"] for c in texts] == ["w0", " w1", " w2"]
        assert [c["usage"]["completion_tokens"] for c in texts] == [1, 2, 3]
        assert texts[-1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
        assert chunks[-1] == {**chunks[-1], "choices": [], "usage": texts[-1]["usage"]}
        # Without continuous_usage_stats, usage is null in every chunk but the last, as before.
        del body["stream_options"]["continuous_usage_stats"]  # type: ignore[attr-defined]
        resp = await lantern.inference.post("/v1/completions", json=body)
        chunks = [json.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
        assert [c["usage"] for c in chunks[:-1]] == [None, None, None]

    serve(tmp_path, test)


def test_malformed_bodies_and_bad_messages_get_the_400_shape(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        for path, content in [
            ("/v1/completions", b"{not json"),
            ("/v1/completions", b"[1, 2]"),
            ("/v1/chat/completions", b'{"model": "llm", "messages": []}'),
            ("/v1/chat/completions", b'{"model": "llm", "messages": [{"role": "tool"}]}'),
            ("/v1/chat/completions", b'{"model": "llm", "messages": [{"role": "user"}]}'),
            ("/v1/embeddings", b'{"model": "llm", "input": [1]}'),
        ]:
            resp = await lantern.inference.post(path, content=content)
            assert resp.status_code == 400, (path, content, resp.text)
            assert resp.json()["error"]["type"] == "invalid_request_error"
        client = async_client(lantern)
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(
                model="llm", messages=[{"role": "user", "content": "x"}], max_tokens=100_000
            )
        assert "max_tokens" in _error(bad.value)["message"]

    serve(tmp_path, test)


def test_embeddings_for_models_that_offer_them(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        client = async_client(lantern)
        out = await client.embeddings.create(model="llm/1.0", input=["one two", "three"])
        assert [d.embedding for d in out.data] == [[7.0, 2.0], [5.0, 1.0]]
        assert out.usage.prompt_tokens == 3
        single = await client.embeddings.create(model="llm/1.0", input="abc")
        assert single.data[0].embedding == [3.0, 1.0]  # sent as base64, the client's default
        floats = await lantern.inference.post(
            "/v1/embeddings", json={"model": "llm/1.0", "input": "ab", "encoding_format": "float"}
        )
        assert floats.json()["data"][0]["embedding"] == [2.0, 1.0]
        with pytest.raises(openai.BadRequestError) as refused:
            await client.embeddings.create(model="llm/2.0", input="abc")
        assert "does not offer embeddings" in _error(refused.value)["message"]

    serve(tmp_path, test)


def test_the_inference_key_is_the_api_key(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        key = json.loads(Path(lantern.server.config.key_file).read_text())["inference"]["key"]
        good = async_client(lantern, key)
        assert (await good.completions.create(model="llm", prompt="a", max_tokens=1)).choices
        with pytest.raises(openai.AuthenticationError) as refused:
            await async_client(lantern, "wrong").completions.create(model="llm", prompt="a")
        assert _error(refused.value)["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            await async_client(lantern, "wrong").models.list()

    serve(tmp_path, test, disable_token_authorization=False, key_file=str(tmp_path / "keys.json"))


def test_no_worker_is_503_and_the_setting_turns_the_api_off(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        resp = await lantern.management.put(
            "/models/llm/2.0?min_worker=0&max_worker=0&synchronous=true"
        )
        assert resp.status_code == 200, resp.text
        client = async_client(lantern)
        with pytest.raises(openai.APIStatusError) as unavailable:
            await client.completions.create(model="llm/2.0", prompt="a", max_tokens=1)
        assert unavailable.value.status_code == 503
        assert _error(unavailable.value)["type"] == "server_error"

    serve(tmp_path, test, enable_model_api=True)

    async def off(lantern: Lantern) -> None:
        resp = await lantern.inference.post("/v1/completions", json={"model": "llm", "prompt": "a"})
        assert resp.status_code == 404
        assert isinstance(resp.json()["error"], str)  # KServe's /v1 tree answers it

    serve(tmp_path / "off", off, enable_openai_api=False)


def test_the_sync_client_whole_and_streamed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    config = test_config(tmp_path, store, load_models=LLM)
    with ThreadedLantern(config, InlineWorkers()) as server:
        http = server.client("inference")
        client = openai.OpenAI(
            api_key="none",
            base_url="http://inference/v1",
            http_client=http,  # type: ignore[arg-type]
            max_retries=0,
        )
        done = client.chat.completions.create(
            model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert done.choices[0].message.content == "w0 w1"
        stream = client.completions.create(model="llm", prompt="a", max_tokens=2, stream=True)
        assert "".join(c.choices[0].text for c in stream) == "w0 w1"
        # TorchServe's vLLM-handler path still reaches the handler itself.
        raw = http.post("/predictions/llm/1.0/v1/chat/completions", json={"prompt": "a b"})
        assert raw.status_code == 200 and raw.json()["text"].startswith("w0")


def test_the_oip_generate_extension(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        body = {"text_input": "a b", "parameters": {"max_tokens": 3}}
        whole = await lantern.inference.post("/v2/models/llm/versions/2.0/generate", json=body)
        assert whole.json() == {
            "model_name": "llm",
            "model_version": "2.0",
            "text_output": "w0 w1 w2",
            "finish_reason": "length",
        }
        streamed = await lantern.inference.post("/v2/models/llm/generate_stream", json=body)
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(e[6:]) for e in streamed.text.split("\n\n") if e]
        assert "".join(e["text_output"] for e in events) == "w0 w1 w2"
        assert events[-1]["finish_reason"] == "length"
        bad = await lantern.inference.post("/v2/models/llm/generate", json={"text_input": 1})
        assert bad.status_code == 400 and isinstance(bad.json()["error"], str)
        missing = await lantern.inference.post("/v2/models/nope/generate", json=body)
        assert missing.status_code == 404 and isinstance(missing.json()["error"], str)

    serve(tmp_path, test)
