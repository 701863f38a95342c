"""What one request may cost the other streams of a generative worker (issue 39), in process.

The real `EngineLoop` with the built-in ``text_generation`` handler and the tiny model built in
code, driven through a fake connection (`tests.serve.test_concurrent_worker`). A neighbour
stream's per-token gaps are measured quiet and while an attacking request runs beside it.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest

from handlers.generation.params import MAX_STOP_TOKEN_IDS
from serve.wire.frames import Frame, MsgType
from serve.wire.messages import ErrorItem, ResultItem, decode_result
from serve.worker.concurrent import EngineLoop
from tests.serve.test_concurrent_worker import (
    FakeConnection,
    body,
    predict,
    run_in_thread,
)
from tests.support.generation_fixtures import load_tiny_service

WAIT = 120
NEIGHBOUR_TOKENS = 60
# The bar of the issue: the neighbour's p99 gap within this much of its quiet p99.
P99_SLACK = 0.25


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return load_tiny_service(tmp_path_factory.mktemp("tiny-llm"), 8, 16)


@pytest.fixture
def loop(service) -> Iterator[FakeConnection]:
    conn = FakeConnection()
    thread, code = run_in_thread(
        EngineLoop(service, service.context, service.handler, service.handler.request_streams(), 8),
        conn,
    )
    yield conn
    conn.put(Frame(MsgType.SHUTDOWN, 0))
    thread.join(WAIT)
    assert code == [0]


class Run:
    """Frames read off a loop: the neighbour's token times and every batch's answer."""

    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn
        self.seq = 0
        self.answers: dict[int, ResultItem | ErrorItem] = {}
        self.times: dict[int, list[float]] = {}

    def send(self, request: dict[str, Any] | bytes) -> int:
        self.seq += 1
        self.times[self.seq] = []
        self.conn.put(predict(self.seq, request))
        return self.seq

    def until(self, *seqs: int) -> None:
        while not set(seqs) <= set(self.answers):
            frame = self.conn.next()
            if frame.type == MsgType.PARTIAL:
                self.times[frame.seq].append(time.perf_counter())
            elif frame.type == MsgType.RESULT:
                self.answers[frame.seq] = decode_result(frame).items[0]

    def gaps(self, seq: int) -> list[float]:
        times = self.times[seq]
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.99) - 1)]


def neighbour_gaps(run: Run, attack: list[dict[str, Any] | bytes]) -> tuple[list[float], list[int]]:
    """A neighbour stream's per-token gaps while ``attack`` runs beside it; the attack's seqs."""
    neighbour = run.send(body("the quick brown fox", NEIGHBOUR_TOKENS))
    attackers = [run.send(request) for request in attack]
    run.until(neighbour, *attackers)
    assert isinstance(run.answers[neighbour], ResultItem)
    return run.gaps(neighbour), attackers


def quiet_gaps(run: Run) -> list[float]:
    """The neighbour's gaps alone, after one warm-up stream (the first forwards are slower)."""
    neighbour_gaps(run, [])
    return neighbour_gaps(run, [])[0]


def report(name: str, quiet: list[float], attacked: list[float]) -> None:
    print(
        f"{name}: neighbour p50/p99 quiet {statistics.median(quiet) * 1e3:.1f}/"
        f"{p99(quiet) * 1e3:.1f} ms, attacked {statistics.median(attacked) * 1e3:.1f}/"
        f"{p99(attacked) * 1e3:.1f} ms"
    )


def test_a_thousand_stop_token_ids_do_not_slow_a_neighbour(service, loop) -> None:
    """Each token's stop check is a set lookup: requests with the most ids allowed (and
    ``min_tokens`` masking them all each step) cost the neighbour what plain ones do."""
    run = Run(loop)
    quiet_gaps(run)  # warm
    plain = {"prompt": "a model", "max_tokens": NEIGHBOUR_TOKENS, "ignore_eos": True, "seed": 1}
    control, _ = neighbour_gaps(run, [plain] * 3)
    vocab = service.handler.engine.vocab_size
    ids = [i % (vocab // 2) for i in range(MAX_STOP_TOKEN_IDS)]
    heavy = {**plain, "stop_token_ids": ids, "min_tokens": NEIGHBOUR_TOKENS - 1}
    attacked, seqs = neighbour_gaps(run, [heavy] * 3)
    report("stop_token_ids (control: 3 plain requests beside)", control, attacked)
    assert all(isinstance(run.answers[s], ResultItem) for s in seqs)
    too_many = run.send({**plain, "stop_token_ids": [0] * (MAX_STOP_TOKEN_IDS + 1)})
    run.until(too_many)
    refused = run.answers[too_many]
    assert isinstance(refused, ErrorItem) and refused.code == 400
    assert "stop_token_ids" in refused.message
    # The bar of the issue, against the neighbour beside the same number of plain requests
    # (medians swing from 1 to 100 ms with the machine's load: not compared).
    assert p99(attacked) < p99(control) + P99_SLACK, (p99(control), p99(attacked))


# Two nested loops of Jinja's largest range: 10**10 turns, hours of rendering.
LOOPING_TEMPLATE = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)


def test_a_template_that_never_ends_fails_its_request_and_the_reader_reads_on(
    service, loop, monkeypatch
) -> None:
    """The chat template runs on a preparation thread with a time bound: meanwhile the reader
    answers PINGs, a plain request is answered, a CANCEL is read; then the chat request fails."""
    bound = 2.0
    monkeypatch.setattr(service.handler.engine.tokenizer, "chat_template", LOOPING_TEMPLATE)
    monkeypatch.setattr(service.handler, "template_timeout", bound)
    run = Run(loop)
    started = time.monotonic()
    chat = run.send({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    loop.put(Frame(MsgType.PING, 7))
    plain = run.send(body("a model", 4, stream=False))
    run.until(plain)
    assert chat not in run.answers  # the template still runs
    assert isinstance(run.answers[plain], ResultItem)
    assert time.monotonic() - started < bound
    # the PONG went out at once, before the plain answer, on the frames the loop sent
    pongs = [f for write in loop.writes for f in write if f.type == MsgType.PONG]
    assert [f.seq for f in pongs] == [7]
    run.until(chat)
    failed = run.answers[chat]
    took = time.monotonic() - started
    assert isinstance(failed, ErrorItem) and failed.code == 500, failed
    assert "chat template ran past its bound of 2 s" in failed.message
    assert bound <= took < bound + 10, took


def test_a_cancel_read_while_a_request_is_prepared_answers_it_cancelled(
    service, loop, monkeypatch
) -> None:
    monkeypatch.setattr(service.handler.engine.tokenizer, "chat_template", LOOPING_TEMPLATE)
    monkeypatch.setattr(service.handler, "template_timeout", 2.0)
    run = Run(loop)
    chat = run.send({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    from serve.wire.messages import Cancel, encode_cancel

    loop.put(encode_cancel(Cancel(chat)))
    run.until(chat)
    answer = run.answers[chat]
    assert isinstance(answer, ErrorItem) and answer.code == 499, answer


def test_a_multi_megabyte_prompt_is_refused_before_tokenizing(service, loop, monkeypatch) -> None:
    """A prompt too long for the model whatever its tokens is a 400 from its length alone: the
    tokenizer never sees it, and a neighbour stream beside a loop of them keeps its pace."""
    engine = service.handler.engine
    encode = engine.tokenizer.encode
    seen: list[int] = []

    def counted(text: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "encode", counted)
    run = Run(loop)
    quiet = quiet_gaps(run)
    big = {"prompt": "héllo wörld " * 700_000, "max_tokens": 4}  # 8.4 MB of UTF-8
    raw = json.dumps(big).encode()
    assert len(raw) > 8_000_000
    started = time.monotonic()
    first = run.send(raw)
    run.until(first)
    took = time.monotonic() - started
    refused = run.answers[first]
    assert isinstance(refused, ErrorItem) and refused.code == 400, refused
    assert "no request this model can take has more than" in refused.message and took < 5, took
    # A body within the byte bound whose prompt has too many characters: refused from its length.
    bound = service.handler.max_prompt_chars
    long = {"prompt": "x" * bound, "max_tokens": 4}
    assert len(json.dumps(long)) < service.handler.max_request_bytes
    second = run.send(long)
    run.until(second)
    refused = run.answers[second]
    assert isinstance(refused, ErrorItem) and refused.code == 400, refused
    assert f"the prompt has {bound} characters" in refused.message
    assert max(seen, default=0) < bound  # neither was tokenized
    attacked, seqs = neighbour_gaps(run, [raw] * 6)
    report("8 MB prompts", quiet, attacked)
    assert all(isinstance(run.answers[s], ErrorItem) for s in seqs)
    assert max(seen, default=0) < service.handler.max_prompt_chars
    assert p99(attacked) < p99(quiet) + P99_SLACK, (p99(quiet), p99(attacked))


def test_a_prompt_just_under_the_bound_is_tokenized_and_refused_by_its_tokens(
    service, loop
) -> None:
    bound = service.handler.max_prompt_chars
    limit = service.handler.engine.limits().max_model_len
    run = Run(loop)
    seq = run.send({"prompt": "the quick brown fox " * ((bound - 1) // 20), "max_tokens": 4})
    run.until(seq)
    answer = run.answers[seq]
    assert isinstance(answer, ErrorItem) and answer.code == 400, answer
    assert f"this model takes at most {limit - 1}" in answer.message


def test_a_neighbour_keeps_its_pace_while_a_template_runs_to_its_bound(
    service, loop, monkeypatch
) -> None:
    monkeypatch.setattr(service.handler.engine.tokenizer, "chat_template", LOOPING_TEMPLATE)
    monkeypatch.setattr(service.handler, "template_timeout", 3.0)
    run = Run(loop)
    quiet = quiet_gaps(run)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    chats = [run.send(chat) for _ in range(2)]  # both preparation threads busy
    attacked: list[float] = []
    while not set(chats) <= set(run.answers):  # neighbours one after another until they fail
        gaps, _ = neighbour_gaps(run, [])
        attacked += gaps
    assert all(isinstance(run.answers[c], ErrorItem) for c in chats)
    report("looping templates", quiet, attacked)
    assert p99(attacked) < p99(quiet) + P99_SLACK, (p99(quiet), p99(attacked))
