"""The generative worker loop under random sampling parameters (hypothesis), in process.

Every example sends a batch of requests whose fields hold values at and beyond their types'
bounds (seeds of 2**64, denormal temperatures, integers too big for a float, NaN, wrong types,
over-long lists) through the real `EngineLoop`, the built-in ``text_generation`` handler and the
tiny model built in code, beside a greedy neighbour stream. Each request must get an answer, a
200 or a 400, never a 500; the loop must keep running; the neighbour's tokens must be the ones it
gets alone. A fault injected in the engine's own work (seeding, sampling, detokenizing, logprobs
text) fails that request alone. Examples per property: `tests.fuzz.settings`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.generation import engine as engine_module
from handlers.generation.sampling import Sampler
from serve.wire.frames import Frame, MsgType
from serve.wire.messages import ErrorItem, ResultItem, decode_result
from tests.fuzz.settings import examples
from tests.serve.test_concurrent_worker import (
    FakeConnection,
    body,
    greedy,
    predict,
    run_in_thread,
)
from tests.support.generation_fixtures import load_tiny_service

FUZZ = settings(max_examples=examples(25), deadline=None, suppress_health_check=list(HealthCheck))
WAIT = 120
NEIGHBOUR = "the quick brown fox"

integers = (
    st.sampled_from(
        [
            0,
            1,
            -1,
            2,
            16,
            255,
            2**31,
            2**63 - 1,
            2**63,
            2**64 - 1,
            2**64,
            -(2**63) - 1,
            10**30,
            10**400,
        ]
    )
    | st.integers()
)
floats = st.sampled_from(
    [0.0, -0.0, 1e-45, 5e-324, 1e-5, 1e-6, 0.5, 1.0, 2.0, 100.0, 100.1, 1e308, -1e-45]
) | st.floats(allow_nan=True, allow_infinity=True)
others = st.sampled_from([None, True, False, "1", "", [], [1], {}, {"a": 1}])
values = integers | floats | others
id_lists = st.lists(integers, max_size=8) | st.sampled_from([[0] * 1025, list(range(300))])
stops = st.lists(st.text(max_size=4), max_size=18) | st.sampled_from(["a" * 300, "", "x"])
FIELDS = [
    "max_tokens",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "ignore_eos",
    "logprobs",
    "stream",
]
requests = st.fixed_dictionaries(
    {"prompt": st.sampled_from(["héllo world", "a model", "x"])},
    optional={
        **{name: values for name in FIELDS},
        "stop_token_ids": id_lists | values,
        "stop": stops | values,
    },
)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return load_tiny_service(tmp_path_factory.mktemp("tiny-llm"), 8, 16)


@pytest.fixture(scope="module")
def running(service) -> Iterator[tuple[FakeConnection, Any]]:
    """One engine loop for the whole module, as a worker runs one for its life."""
    from serve.worker.concurrent import EngineLoop

    conn = FakeConnection()
    thread, code = run_in_thread(
        EngineLoop(service, service.context, service.handler, service.handler.request_streams(), 8),
        conn,
    )
    yield conn, thread
    conn.put(Frame(MsgType.SHUTDOWN, 0))
    thread.join(WAIT)
    assert code == [0]


class _Seqs:
    next = 0

    @classmethod
    def take(cls) -> int:
        cls.next += 1
        return cls.next


def _answers(conn: FakeConnection, seqs: set[int]) -> dict[int, ResultItem | ErrorItem]:
    """The RESULT of each of ``seqs`` (parts skipped); fails if one does not come."""
    answers: dict[int, ResultItem | ErrorItem] = {}
    while set(answers) != seqs:
        frame = conn.next()
        if frame.type == MsgType.RESULT and frame.seq in seqs:
            answers[frame.seq] = decode_result(frame).items[0]
    return answers


def _send(conn: FakeConnection, bodies: list[dict[str, Any]]) -> tuple[int, list[int]]:
    neighbour = _Seqs.take()
    conn.put(predict(neighbour, body(NEIGHBOUR, 12, stream=True)))
    seqs = []
    for request in bodies:
        seq = _Seqs.take()
        raw = json.dumps(request, allow_nan=True, default=str).encode()
        conn.put(predict(seq, raw))
        seqs.append(seq)
    return neighbour, seqs


@FUZZ
@given(batch=st.lists(requests, min_size=1, max_size=4))
def test_any_sampling_parameters_get_a_200_or_a_400_and_the_loop_lives(service, running, batch):
    conn, thread = running
    try:
        raws = [json.dumps(r, allow_nan=True) for r in batch]
    except ValueError:  # an integer json cannot write (over 4300 digits): not a request
        return
    neighbour, seqs = _send(conn, [json.loads(raw) for raw in raws])
    answers = _answers(conn, {neighbour, *seqs})
    for seq, raw in zip(seqs, raws, strict=True):
        answer = answers[seq]
        code = answer.code if isinstance(answer, ErrorItem) else answer.status
        assert code in (200, 400), (raw, answer)
    assert isinstance(answers[neighbour], ResultItem)
    assert thread.is_alive()


def test_the_neighbour_stream_gets_its_own_tokens_beside_bad_requests(service, running):
    conn, thread = running
    bad: list[dict[str, Any]] = [
        {"prompt": "hello", "seed": 2**64, "temperature": 1},
        {"prompt": "hello", "temperature": 1e-45, "max_tokens": 4},
        {"prompt": "hello", "temperature": 5e-324, "max_tokens": 4, "seed": 1},
        {"prompt": "hello", "top_p": 10**400},
        {"prompt": "hello", "stop_token_ids": list(range(2000))},
        {  # every token banned until min_tokens are out: nothing left to sample
            "prompt": "hello",
            "stop_token_ids": list(range(service.handler.engine.vocab_size)),
            "min_tokens": 3,
            "seed": 5,
        },
    ]
    neighbour, seqs = _send(conn, bad)
    tokens: list[int] = []
    answers: dict[int, ResultItem | ErrorItem] = {}
    while set(answers) != {neighbour, *seqs}:
        frame = conn.next()
        if frame.type == MsgType.PARTIAL and frame.seq == neighbour:
            from serve.wire.messages import decode_partial

            tokens += json.loads(decode_partial(frame)[0].body)["tokens"]
        elif frame.type == MsgType.RESULT:
            answers[frame.seq] = decode_result(frame).items[0]
    final = answers[neighbour]
    assert isinstance(final, ResultItem)
    assert tokens + json.loads(final.body)["tokens"] == greedy(service, NEIGHBOUR, 12)
    codes = [a.code if isinstance(a, ErrorItem) else a.status for a in (answers[s] for s in seqs)]
    assert codes == [400, 200, 200, 400, 400, 400]
    assert thread.is_alive()


POISON = 4242  # the seed that marks the request a fault is injected into


class _PoisonedDecoder:
    def add(self, token_id: int) -> str:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")

    def flush(self) -> str:
        return ""


@pytest.mark.parametrize("where", ["seeding", "sampling", "detokenizing", "logprobs", "answering"])
def test_a_fault_in_the_engines_own_work_fails_that_request_alone(
    service, running, monkeypatch, where
):
    conn, thread = running
    engine = service.handler.engine

    class PoisonedSampler(Sampler):
        def __init__(self, params: Any, *args: Any) -> None:
            if params.seed == POISON and where == "seeding":
                raise OverflowError("injected: seeding failed")
            super().__init__(params, *args)

        def choose(self, logits: Any) -> Any:  # a row chosen on the host (penalties, logprobs)
            if self.params.seed == POISON and where == "sampling":
                raise RuntimeError("injected: probability tensor contains nan")
            return super().choose(logits)

        def generator_on(self, device: Any) -> Any:  # a row sampled with the step's others
            if self.params.seed == POISON and where == "sampling":
                raise RuntimeError("injected: no random stream on the device")
            return super().generator_on(device)

    monkeypatch.setattr(engine_module, "Sampler", PoisonedSampler)
    add = engine.add

    def poisoned_add(request_id: str, request: Any, checked: Any = None) -> None:
        add(request_id, request, checked)
        if request.params.seed == POISON and where == "detokenizing":
            seq = engine.scheduler.find(request_id)
            seq.decoder = _PoisonedDecoder()

    monkeypatch.setattr(engine, "add", poisoned_add)
    decode = engine.tokenizer.decode

    def poisoned_decode(ids: Any, **kwargs: Any) -> str:
        if where == "logprobs" and not kwargs:  # the logprobs rows decode one token alone
            raise ValueError("injected: no text for this token")
        return decode(ids, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "decode", poisoned_decode)
    from serve.worker.concurrent import EngineLoop

    send_part = EngineLoop._send_part
    poisoned_seq = _Seqs.next + 2  # after the neighbour's

    def poisoned_send_part(self: EngineLoop, seq: int, part: dict[str, Any]) -> None:
        if where == "answering" and seq == poisoned_seq:
            raise TypeError("injected: a part that cannot be encoded")
        send_part(self, seq, part)

    monkeypatch.setattr(EngineLoop, "_send_part", poisoned_send_part)
    poisoned = {"prompt": "a model", "seed": POISON, "temperature": 1, "max_tokens": 6}
    if where == "answering":
        poisoned["stream"] = True
    if where == "logprobs":
        poisoned["logprobs"] = 2
    neighbour, seqs = _send(conn, [poisoned])
    answers = _answers(conn, {neighbour, *seqs})
    failed = answers[seqs[0]]
    assert isinstance(failed, ErrorItem) and failed.code == 500, failed
    assert "injected" in failed.message
    assert isinstance(answers[neighbour], ResultItem)
    assert thread.is_alive()
