"""Generative models on a real server: the tiny model built in code, archived with
``--handler text_generation`` (the engine loop in the worker, slot placement in the frontend), and
an ``asyncCommunication`` handler shaped like TorchServe's VLLMHandler, over real HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.generation_fixtures import save_pretrained
from tests.support.server import LanternServer, build_archive

HANDLERS = Path(__file__).resolve().parents[1] / "support" / "handlers"
CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 2,
    "responseTimeout": 120,
    "handler": {"max_running_sequences": 2, "prefill_chunk_tokens": 8},
}
# Far longer than any test runs: such a stream ends when the test drops it (freeing its slot).
LONG = {"prompt": "the quick brown fox", "max_tokens": 6000, "temperature": 0, "ignore_eos": True}
LONG_PARAMETERS = {k: v for k, v in LONG.items() if k != "prompt"}  # OIP generate's parameters


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llm")
    save_pretrained(path)
    # Rotary positions go past the 256 it was built with: long streams that are surely still
    # running while the test sends other requests (the tiny model takes milliseconds a step).
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Iterator[LanternServer]:
    root = tmp_path_factory.mktemp("generation")
    store = root / "store"
    store.mkdir()
    build_archive(
        store, "tiny", "text_generation", config=CONFIG, extra_files=sorted(folder.iterdir())
    )
    async_config = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 8, "asyncCommunication": True}
    build_archive(store, "vllmlike", HANDLERS / "async_engine_handler.py", config=async_config)
    srv = LanternServer(root, store, ["tiny=tiny.mar", "vllmlike=vllmlike.mar"])
    srv.start(timeout=300)
    yield srv
    srv.stop()


def generate(
    server: LanternServer, body: dict[str, Any] | bytes, model: str = "tiny"
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.inference}/predictions/{model}", content=content, timeout=120)


def stream(server: LanternServer, body: dict[str, Any], model: str = "tiny") -> Any:
    return httpx.stream(
        "POST",
        f"{server.inference}/predictions/{model}",
        content=json.dumps({**body, "stream": True}).encode(),
        timeout=120,
    )


def greedy(folder: Path, prompt: str, n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([AutoTokenizer.from_pretrained(folder).encode(prompt)])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
    )
    return out[0, ids.shape[1] :].tolist()


def test_describe_and_greedy_output(server: LanternServer, folder: Path) -> None:
    body: dict[str, Any] = {
        "prompt": "a model server answers",
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
    }
    response = generate(server, body)
    assert response.status_code == 200, response.text
    assert response.json()["tokens"] == greedy(folder, body["prompt"], 6)
    (worker,) = server.describe("tiny")[0]["workers"]
    assert worker["limits"]["slots"] == 2 and worker["limits"]["max_running_sequences"] == 2
    assert worker["limits"]["prefill_chunk_tokens"] == 8 and worker["runningRequests"] == 0
    # Idle again: the step that ended it left the engine's counts at zero, not stale.
    engine = engine_counts(server, lambda e: e.get("running") == 0 and e["reservedTokens"] == 0)
    assert engine["waiting"] == engine["cachedTokens"] == 0 and engine["steps"] > 0, engine
    assert engine["kvCacheUsage"] == 0
    text = httpx.get(f"{server.metrics}/metrics", timeout=30).text
    assert 'serve_generation_tokens_total{model="tiny",version="1.0"}' in text
    assert 'serve_time_to_first_token_seconds_count{model="tiny",version="1.0"}' in text
    assert (
        f'serve_kv_cache_usage_perc{{model="tiny",version="1.0",worker="{worker["id"]}"}} 0.0'
        in text
    )


def engine_counts(server: LanternServer, holds: Any) -> dict[str, Any]:
    """The engine's counts in describe once ``holds`` does, or after 30 s (they come in the
    worker's ENGINE frame just after the answer, so a describe may see the one before)."""
    deadline = time.monotonic() + 30
    while True:
        (worker,) = server.describe("tiny")[0]["workers"]
        engine: dict[str, Any] = worker.get("engine") or {}
        if (engine and holds(engine)) or time.monotonic() > deadline:
            return engine
        time.sleep(0.05)


def running_on(server: LanternServer, model: str = "tiny") -> float:
    """``serve_num_requests_running`` of ``model`` (requests on its workers' slots now)."""
    text = httpx.get(f"{server.metrics}/metrics", timeout=30).text
    prefix = f'serve_num_requests_running{{model="{model}",version="1.0"}} '
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line[len(prefix) :])


def test_a_late_request_joins_a_running_stream_and_bad_input_is_a_4xx(
    server: LanternServer, folder: Path
) -> None:
    expected = greedy(folder, "héllo", 5)
    with stream(server, LONG) as long_stream:
        assert long_stream.status_code == 200
        parts = long_stream.iter_bytes()
        assert next(parts)  # the long stream has begun
        assert running_on(server) == 1
        engine = engine_counts(server, lambda e: e.get("running") == 1)
        # prompt + 6000 tokens reserved of the default 16384-position budget
        assert engine["running"] == 1 and engine["reservedTokens"] > 6000, engine
        assert 0.3 < engine["kvCacheUsage"] < 0.5
        body = {"prompt": "héllo", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
        late = generate(server, body)
        assert late.status_code == 200, late.text
        assert late.json()["tokens"] == expected
        assert generate(server, {"prompt": "x", "temprature": 0}).status_code == 400
        assert generate(server, {"prompt": ""}).status_code == 400
        assert generate(server, b"\xff\xfe not utf-8").status_code == 400
        assert generate(server, {"prompt": "x", "max_tokens": -1}).status_code == 400
        assert running_on(server) == 1  # all answered while the long stream ran beside them
        assert next(parts)


def test_a_client_that_drops_a_stream_frees_its_slot(server: LanternServer) -> None:
    # Two slots: one stream held open, one dropped; a third request then gets the freed slot.
    with stream(server, LONG) as held:
        held_parts = held.iter_bytes()
        assert next(held_parts)
        with stream(server, LONG) as dropped:
            assert next(dropped.iter_bytes())
        short = {"prompt": "x", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
        response = generate(server, short)
        assert response.status_code == 200 and len(response.json()["tokens"]) == 3
        # Served while the held stream (older than the dropped one, as long) still runs: the
        # dropped stream's slot was freed, not waited out.
        assert running_on(server) == 1
        assert next(held_parts)


def generated_tokens(server: LanternServer, model: str = "tiny") -> float:
    """``serve_generation_tokens_total`` of ``model``: counted when a request ends, not when it
    is cancelled."""
    text = httpx.get(f"{server.metrics}/metrics", timeout=30).text
    prefix = f'serve_generation_tokens_total{{model="{model}",version="1.0"}} '
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(found[0][len(prefix) :]) if found else 0.0


def assert_slot_freed(server: LanternServer, leave: Callable[[], None]) -> None:
    """Both slots taken by long requests, the second one started and left by ``leave``: a short
    request is then answered before either long one could have ended (its tokens would be
    counted), and the running gauge shows only the one still held."""
    with stream(server, LONG) as held:
        held_parts = held.iter_bytes()
        assert next(held_parts)
        before = generated_tokens(server)
        leave()
        short = {"prompt": "x", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
        response = generate(server, short)
        assert response.status_code == 200 and len(response.json()["tokens"]) == 3
        assert generated_tokens(server) - before == 3  # no long request ended first
        assert running_on(server) == 1
        assert next(held_parts)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "tiny", **LONG, "stream": True}),
        (
            "/v2/models/tiny/generate_stream",
            {"text_input": LONG["prompt"], "parameters": LONG_PARAMETERS},
        ),
    ],
)
def test_a_client_that_drops_an_openai_or_oip_stream_frees_its_slot(
    server: LanternServer, path: str, body: dict[str, Any]
) -> None:
    def drop_after_the_first_event() -> None:
        with httpx.stream("POST", f"{server.inference}{path}", json=body, timeout=120) as dropped:
            assert dropped.status_code == 200
            assert next(dropped.iter_lines()).startswith("data: {")

    assert_slot_freed(server, drop_after_the_first_event)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "tiny", **LONG}),
        ("/v2/models/tiny/generate", {"text_input": LONG["prompt"], "parameters": LONG_PARAMETERS}),
    ],
)
def test_a_client_that_gives_up_on_a_whole_answer_frees_its_slot(
    server: LanternServer, path: str, body: dict[str, Any]
) -> None:
    def give_up_after_a_second() -> None:  # nothing is sent until the end: only the disconnect
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.inference}{path}", json=body, timeout=httpx.Timeout(60, read=1))

    assert_slot_freed(server, give_up_after_a_second)


def test_a_grpc_client_that_cancels_a_stream_frees_its_slot(
    server: LanternServer, tmp_path: Path
) -> None:
    import grpc

    from tests.support.grpc_stubs import generate as grpc_stubs

    ts = grpc_stubs(tmp_path / "stubs")
    body = json.dumps({**LONG, "stream": True}).encode()
    request = ts.inference_pb2.PredictionsRequest(model_name="tiny", input={"data": body})

    def cancel_after_the_first_reply() -> None:
        with grpc.insecure_channel(server.grpc_inference) as channel:
            stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
            replies = stub.StreamPredictions(request, timeout=120)
            assert next(replies).prediction
            replies.cancel()

    assert_slot_freed(server, cancel_after_the_first_reply)


def test_many_requests_in_flight_on_an_async_communication_handler(server: LanternServer) -> None:
    def most() -> int:
        return int(generate(server, {"stats": True}, "vllmlike").json()["most"])

    with ThreadPoolExecutor(3) as pool:
        body = {"max_tokens": 3, "gate": True}
        gated = [
            pool.submit(generate, server, {**body, "prompt": f"p{i}-"}, "vllmlike")
            for i in range(3)
        ]
        for _ in range(600):  # all three held in flight by the gate
            if most() >= 3:
                break
            time.sleep(0.05)
        assert most() >= 3 and not any(f.done() for f in gated)
        with stream(server, {"prompt": "s-", "max_tokens": 3}, "vllmlike") as streamed:
            # its parts, then the whole text as the final answer
            assert b"".join(streamed.iter_bytes()) == b"s-0 s-1 s-2 s-0 s-1 s-2 "
        assert generate(server, {"open": True}, "vllmlike").content == b"opened"
        answers = [f.result(timeout=60) for f in gated]
    assert [a.status_code for a in answers] == [200, 200, 200]
    # each streamed its parts, then the whole text
    assert [a.content for a in answers] == [f"p{i}-0 p{i}-1 p{i}-2 ".encode() * 2 for i in range(3)]


def test_a_killed_worker_ends_its_streams_with_an_error_and_is_replaced(
    server: LanternServer,
) -> None:
    (pid,) = server.worker_pids("tiny")
    with stream(server, LONG) as running:
        parts = running.iter_bytes()
        assert next(parts)
        os.kill(pid, signal.SIGKILL)
        rest = b""
        for part in parts:  # it ends, never hangs, with the error as its last chunk
            rest += part
        assert b"finish_reason" not in rest
        last = json.loads(rest.splitlines()[-1])
        assert last["type"] == "WorkerDied" and last["code"] == 500, last
    short = {"prompt": "x", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    for _ in range(120):  # the replacement starts (it loads the model again)
        response = generate(server, short)
        if response.status_code == 200:
            break
    assert response.status_code == 200 and len(response.json()["tokens"]) == 2
    assert server.worker_pids("tiny") != [pid]
