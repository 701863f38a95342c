"""Requests that once ended or wedged a generative worker, on a real server (issue 39).

The tiny model built in code behind the ``text_generation`` handler; each test checks that the
request that used to end the worker (a seed of 2**64, ...) is answered alone while a neighbour
stream runs on, and that the worker's pid is unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.generation_fixtures import save_pretrained
from tests.support.server import LanternServer, build_archive, pid_alive

pytest.importorskip("transformers")

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CONFIG: dict[str, Any] = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "responseTimeout": 120,
    "handler": {"max_running_sequences": 4, "prefill_chunk_tokens": 16},
}
NEIGHBOUR = {"prompt": "the quick brown fox", "max_tokens": 150, "temperature": 0}
NEIGHBOUR_TOKENS = 150
BIG_SEED = 2**64
# Two nested loops of Jinja's largest range: 10**10 turns, hours of rendering.
LOOPING_TEMPLATE = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
BOUND = 2  # seconds a chat template may render
LIVENESS = 5  # seconds a worker may leave a liveness ping unanswered


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("generation_faults")
    folder = work / "tiny"
    _, tokenizer = save_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    store = work / "store"
    store.mkdir()
    build_archive(
        store, "tiny", "text_generation", config=CONFIG, extra_files=sorted(folder.iterdir())
    )
    looping = work / "looping"
    _, looping_tokenizer = save_pretrained(looping)
    looping_tokenizer.chat_template = LOOPING_TEMPLATE
    looping_tokenizer.save_pretrained(looping)
    looping_config = {**CONFIG, "handler": {**CONFIG["handler"], "chat_template_timeout": BOUND}}
    build_archive(
        store,
        "looping",
        "text_generation",
        config=looping_config,
        extra_files=sorted(looping.iterdir()),
    )
    lantern = LanternServer(
        work,
        store,
        ["tiny=tiny.mar", "looping=looping.mar"],
        args=["--no-grpc"],
        env={"LANTERN_WORKER_LIVENESS_TIMEOUT": str(LIVENESS)},
    )
    lantern.start(timeout=300)
    yield lantern
    lantern.stop()


def _post(server: LanternServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.inference}{path}", json=body, timeout=120)


def _json_parts(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a chunked /predictions stream, however its chunks were cut."""
    decoder, text, at, parts = json.JSONDecoder(), data.decode(), 0, []
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        part, at = decoder.raw_decode(text, at)
        parts.append(part)
    return parts


BAD_SEED: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "seed": BIG_SEED, "temperature": 1}),
    (
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello"}],
            "seed": BIG_SEED,
            "temperature": 1,
        },
    ),
    (
        "/v2/models/tiny/generate",
        {"text_input": "hello", "parameters": {"seed": BIG_SEED, "temperature": 1}},
    ),
    ("/predictions/tiny", {"prompt": "hello", "seed": BIG_SEED, "temperature": 1}),
]


def test_a_seed_past_64_bits_is_a_400_on_every_route_and_the_worker_lives(
    server: LanternServer,
) -> None:
    (pid,) = server.worker_pids("tiny")
    with httpx.stream(
        "POST",
        f"{server.inference}/predictions/tiny",
        content=json.dumps({**NEIGHBOUR, "ignore_eos": True, "stream": True}).encode(),
        timeout=120,
    ) as neighbour:
        assert neighbour.status_code == 200
        parts = neighbour.iter_bytes()
        streamed = next(parts)  # the stream runs: now the attack
        for path, body in BAD_SEED:
            response = _post(server, path, body)
            assert response.status_code == 400, (path, response.text)
            assert "seed" in response.text, (path, response.text)
        streamed += b"".join(parts)
    tokens = sum(len(part.get("tokens", [])) for part in _json_parts(streamed))
    assert tokens == NEIGHBOUR_TOKENS  # the neighbour stream ran to its end
    assert server.worker_pids("tiny") == [pid]
    (worker,) = server.describe("tiny")[0]["workers"]
    assert worker["pid"] == pid and worker["status"] == "READY"


@pytest.mark.parametrize("temperature", [1e-45, 5e-324])
def test_a_denormal_temperature_is_greedy_not_a_500(
    server: LanternServer, temperature: float
) -> None:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 5, "ignore_eos": True}
    greedy = _post(server, "/v1/completions", {**body, "temperature": 0})
    tiny = _post(server, "/v1/completions", {**body, "temperature": temperature})
    assert greedy.status_code == tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_a_template_that_never_ends_fails_its_request_and_the_worker_serves_on(
    server: LanternServer,
) -> None:
    (pid,) = server.worker_pids("looping")
    chat = {"model": "looping", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    started = time.monotonic()
    response = _post(server, "/v1/chat/completions", chat)
    took = time.monotonic() - started
    assert response.status_code == 500, response.text
    assert "chat template ran past its bound" in response.text
    assert BOUND <= took < BOUND + 15, took
    plain = {"model": "looping", "prompt": "hello", "max_tokens": 3, "temperature": 0}
    assert _post(server, "/v1/completions", plain).status_code == 200
    assert server.worker_pids("looping") == [pid]


def test_a_worker_that_stops_reading_frames_is_replaced(server: LanternServer) -> None:
    """SIGSTOP: the worker reads nothing, answers no PING; the frontend kills and restarts it
    within ``worker_liveness_timeout``, and /ping and describe say so."""
    (pid,) = server.worker_pids("looping")
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        while pid_alive(pid) and time.monotonic() - stopped < LIVENESS + 30:
            time.sleep(0.1)
        gone = time.monotonic() - stopped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert not pid_alive(pid)
    restarting = server.ping()  # while its replacement loads the model
    assert LIVENESS - 1 < gone < LIVENESS + 10, gone
    assert restarting == 500
    assert "answered no liveness ping" in server.log_text("lantern.log")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # the replacement loads the model again
        workers = server.describe("looping")[0]["workers"]
        if [w["status"] for w in workers] == ["READY"] and workers[0]["pid"] != pid:
            break
        time.sleep(0.2)
    (worker,) = server.describe("looping")[0]["workers"]
    assert worker["status"] == "READY" and worker["pid"] != pid
    plain = {"model": "looping", "prompt": "hello", "max_tokens": 3, "temperature": 0}
    assert _post(server, "/v1/completions", plain).status_code == 200
    assert server.ping() == 200


def _anon_rss(pid: int) -> int:
    """The worker's private memory (kB): what it allocated, not the shared arena's pages."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


def test_multi_megabyte_prompts_are_refused_at_once_and_leave_no_memory_behind(
    server: LanternServer,
) -> None:
    (pid,) = server.worker_pids("tiny")
    small = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "temperature": 0}
    assert _post(server, "/v1/completions", small).status_code == 200
    before = _anon_rss(pid)
    big = {"model": "tiny", "prompt": "héllo wörld " * 240_000, "max_tokens": 4}  # 2.9 MB
    for _ in range(8):
        started = time.monotonic()
        response = _post(server, "/v1/completions", big)
        assert response.status_code == 400, response.text
        assert time.monotonic() - started < 10
    after = _anon_rss(pid)
    assert after < before * 1.1, (before, after)
    assert server.worker_pids("tiny") == [pid]
