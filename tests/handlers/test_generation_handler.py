"""The ``text_generation`` handler on a tiny ``save_pretrained`` folder: batch mode, streaming,
TorchServe's continuous-batching contract (one ``handle`` per step), per-row errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from handlers.context import Context
from handlers.service import load_service
from tests.support.generation_fixtures import save_pretrained

MANIFEST = {"model": {"modelName": "tiny", "handler": "text_generation"}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llm")
    save_pretrained(path)
    return path


def make_context(folder, yaml_config=None) -> Context:
    return Context(
        "tiny",
        str(folder),
        MANIFEST,
        4,
        None,
        "0.12.0",
        model_yaml_config=yaml_config,
        num_threads=1,
    )


@pytest.fixture(scope="module")
def service(folder):
    yaml_config = {
        "handler": {
            "max_running_sequences": 4,
            "max_cached_tokens": 1024,
            "prefill_chunk_tokens": 8,
        }
    }
    return load_service(folder, MANIFEST, make_context(folder, yaml_config))


def reference(service, prompt: str, n: int) -> list[int]:
    engine = service.handler.engine
    ids = torch.tensor([engine.tokenizer.encode(prompt)])
    out = engine.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
    )
    return out[0, ids.shape[1] :].tolist()


def batch_context(service, n: int) -> Context:
    context = service.context
    context.request_ids = {i: f"r{i}" for i in range(n)}
    context.request_processor = None
    context.intermediate_responses = []
    return context


def test_the_builtin_resolves_and_reports_its_limits(service):
    assert type(service.handler).__name__ == "TextGenerationHandler"
    described = service.handler.describe()
    assert described["limits"] == {
        "max_running_sequences": 4,
        "max_cached_tokens": 1024,
        "max_model_len": 256,
        "prefill_chunk_tokens": 8,
        "prefix_cache_tokens": 4096,  # the default
    }
    assert described["stats"]["running"] == 0


def test_a_batch_runs_to_completion_with_greedy_equal_to_generate(service):
    rows = [
        {
            "body": {
                "prompt": "the quick brown fox",
                "max_tokens": 12,
                "temperature": 0,
                "ignore_eos": True,
            }
        },
        {
            "body": json.dumps(
                {"prompt": "a model server", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
            ).encode()
        },
    ]
    context = batch_context(service, 2)
    out = service.predict(rows, context)
    assert out[0]["tokens"] == reference(service, "the quick brown fox", 12)
    assert out[0]["finish_reason"] == "length" and out[0]["usage"]["completion_tokens"] == 12
    assert out[1]["text"] == service.handler.engine.tokenizer.decode(
        reference(service, "a model server", 5)
    )
    assert context.intermediate_responses == []  # nobody asked to stream


def test_bad_rows_fail_alone(service):
    rows = [
        {"body": b"\xff\xfe not utf-8"},
        {"body": {"prompt": "x", "temprature": 1}},
        {"body": {"prompt": ""}},
        {"body": {"prompt": "x", "max_tokens": -3}},
        {"body": "the fox"},
    ]
    context = batch_context(service, len(rows))
    out = service.predict([*rows[:4], {"body": {"prompt": "the fox", "max_tokens": 3}}], context)
    assert [context.get_response_status(i)[0] for i in range(5)] == [400, 400, 400, 400, 200]
    assert "not UTF-8" in out[0]["message"] and "temprature" in out[1]["message"]
    assert "empty" in out[2]["message"] and "max_tokens" in out[3]["message"]
    assert out[4]["usage"]["completion_tokens"] <= 3


def test_streamed_rows_get_each_step_as_an_intermediate_part(service):
    chunks: list[dict] = []
    context = batch_context(service, 1)
    context.intermediate_sink = chunks.append
    try:
        body = {
            "prompt": "héllo",
            "max_tokens": 10,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        (last,) = service.predict([{"body": body}], context)
    finally:
        context.intermediate_sink = None
    assert len(chunks) == 9 and all(len(c["results"]) == 1 for c in chunks)
    streamed = "".join(c["results"][0]["text"] for c in chunks) + last["text"]
    assert streamed == service.handler.engine.tokenizer.decode(
        reference(service, "héllo", 10), skip_special_tokens=True
    )
    assert last["finish_reason"] == "length" and len(last["tokens"]) == 1


def test_continuous_batching_contract_one_handle_per_step(folder):
    """Drive it as TorchServe's frontend does: running ids each call, finished ones leave."""
    yaml_config = {"continuousBatching": True, "handler": {"prefill_chunk_tokens": 4}}
    service = load_service(folder, MANIFEST, make_context(folder, yaml_config))
    bodies: dict[str, dict[str, Any]] = {
        "a": {
            "prompt": "the quick brown fox",
            "max_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
        },
        "b": {
            "prompt": "a model server answers",
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
        },
        "c": {"prompt": "héllo", "max_tokens": 30, "temperature": 0, "ignore_eos": True},
        "bad": {"prompt": "x", "nope": 1},
    }
    running = ["a", "bad"]
    tokens: dict[str, list[int]] = {k: [] for k in bodies}
    finished: dict[str, dict] = {}
    for step in range(60):
        if step == 2:
            running += ["b", "c"]  # join a running batch
        if step == 6:
            running.remove("c")  # the client went away
        if not running:
            break
        context = service.context
        context.request_ids = dict(enumerate(running))
        context.request_processor = None
        results = service.predict([{"body": bodies[r]} for r in running], context)
        criteria = context.stopping_criteria
        assert criteria is not None and len(criteria) == len(running)
        still = []
        for i, (request_id, result) in enumerate(zip(running, results, strict=True)):
            tokens[request_id] += result.get("tokens", [])
            if criteria[i](result):
                finished[request_id] = {"status": context.get_response_status(i)[0], **result}
            else:
                still.append(request_id)
        running = still
    assert finished["bad"]["status"] == 400 and "nope" in finished["bad"]["error"]
    assert finished["a"]["finish_reason"] == "length" and finished["b"]["finish_reason"] == "length"
    handler = service.handler
    assert tokens["a"] == reference(service, bodies["a"]["prompt"], 8)
    assert tokens["b"] == reference(service, bodies["b"]["prompt"], 4)
    assert "c" not in finished and "c" not in handler.engine
    assert service.context.cache == {}
    assert handler.engine.stats()["reserved_tokens"] == 0


def test_the_model_is_found_as_a_folder_or_one_gguf_file(tmp_path, folder):
    from handlers.exceptions import HandlerLoadError
    from handlers.generation.loading import find_model

    assert find_model(str(folder), {}) == (str(folder), None)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert find_model(str(tmp_path), {}) == (str(tmp_path), "m.gguf")
    assert find_model(str(tmp_path), {"model_path": "m.gguf"}) == (str(tmp_path), "m.gguf")
    (tmp_path / "n.gguf").write_bytes(b"GGUF")
    with pytest.raises(HandlerLoadError, match="2 .gguf files; name the model"):
        find_model(str(tmp_path), {})


def test_engine_limits_come_from_the_handler_section(service):
    from handlers.exceptions import HandlerLoadError
    from handlers.generation.loading import engine_limits

    model = service.handler.engine.model
    assert engine_limits({}, model, 1).as_dict() == {
        "max_running_sequences": 8,
        "max_cached_tokens": 16384,
        "max_model_len": 256,  # the model's own context
        "prefill_chunk_tokens": 256,
        "prefix_cache_tokens": 4096,
    }
    assert engine_limits({"prefix_cache_tokens": 0}, model, 1).prefix_cache_tokens == 0  # off
    assert engine_limits({}, model, 6).max_running_sequences == 6  # batchSize, when set
    assert engine_limits({"max_cached_tokens": 100}, model, 1).max_model_len == 256
    with pytest.raises(HandlerLoadError, match="exceeds the model's context 256"):
        engine_limits({"max_model_len": 512}, model, 1)
    with pytest.raises(HandlerLoadError, match="must be a positive integer"):
        engine_limits({"prefill_chunk_tokens": 0}, model, 1)
    with pytest.raises(HandlerLoadError, match="prefix_cache_tokens must be an integer of"):
        engine_limits({"prefix_cache_tokens": -1}, model, 1)


def test_a_row_whose_adding_raises_fails_alone(service, monkeypatch):
    """Anything that raises while a row is added (here the engine, as seeding once did) fails
    that row with a 500 naming the error, never the whole batch."""
    engine = service.handler.engine
    add = engine.add

    def add_or_raise(request_id, request, checked=None):
        if request.params.seed == 99:
            raise ValueError("Overflow when unpacking long long")
        return add(request_id, request, checked)

    monkeypatch.setattr(engine, "add", add_or_raise)
    rows = [
        {"body": {"prompt": "the fox", "seed": 99}},
        {"body": {"prompt": "the fox", "max_tokens": 3, "temperature": 0}},
    ]
    context = batch_context(service, len(rows))
    out = service.predict(rows, context)
    assert [context.get_response_status(i)[0] for i in range(2)] == [500, 200]
    assert "ValueError: Overflow" in out[0]["message"]
    assert out[1]["usage"]["completion_tokens"] <= 3
