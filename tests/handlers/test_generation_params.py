"""Parsing a generation request: prompt, sampling fields, and the 400s for bad ones."""

from __future__ import annotations

import pytest

from handlers.exceptions import PredictionException
from handlers.generation.params import SamplingParams, parse_request

LIMIT, VOCAB = 256, 320


def parse(payload):
    return parse_request(payload, LIMIT, VOCAB)


def test_defaults_and_text_prompts():
    assert parse({"prompt": "hi"}).params == SamplingParams()
    assert parse("hi").prompt == "hi"
    assert parse("héllo".encode()).prompt == "héllo"
    assert parse(bytearray(b"hi")).prompt == "hi"
    assert parse(b'{"prompt": "hi", "max_tokens": 3}').params.max_tokens == 3


def test_all_fields():
    request = parse(
        {
            "prompt": "hi",
            "stream": True,
            "max_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "seed": 3,
            "stop": ["a", "bc"],
            "stop_token_ids": [1, 2],
            "repetition_penalty": 1.2,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "min_tokens": 2,
            "ignore_eos": True,
            "logprobs": 3,
        }
    )
    assert request.stream
    p = request.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed) == (7, 0.5, 0.9, 5, 3)
    assert p.stop == ("a", "bc") and p.stop_token_ids == frozenset({1, 2})
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.2, 0.5, -0.5)
    assert (p.min_tokens, p.ignore_eos, p.logprobs) == (2, True, 3)
    assert not p.greedy and p.penalised


def test_aliases_and_small_forms():
    assert parse({"prompt": "x", "max_new_tokens": 9}).params.max_tokens == 9
    assert parse({"prompt": "x", "stop": "end"}).params.stop == ("end",)
    assert parse({"prompt": "x", "logprobs": True}).params.logprobs == 0
    assert parse({"prompt": "x", "logprobs": False}).params.logprobs is None
    assert parse({"prompt": "x", "temperature": 0}).params.greedy


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"prompt": ""}, "prompt is empty"),
        ("", "prompt is empty"),
        ({"text": "x"}, "prompt must be a string"),
        ({"prompt": 3}, "prompt must be a string"),
        ([1, 2], "expected a JSON object"),
        (b"\xff\xfe bad", "not UTF-8"),
        ("{not json", "starts like JSON but is not"),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens must be between 1 and 256"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens must be between 1 and 256"),
        ({"prompt": "x", "max_tokens": 10**9}, "max_tokens must be between 1 and 256"),
        ({"prompt": "x", "max_tokens": "5"}, "max_tokens must be an integer"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens must be an integer"),
        ({"prompt": "x", "max_tokens": 4, "max_new_tokens": 4}, "not both"),
        ({"prompt": "x", "temprature": 0.5}, "unknown field(s): temprature"),
        ({"prompt": "x", "temperature": -1}, "temperature must be between"),
        ({"prompt": "x", "temperature": float("nan")}, "temperature must be between"),
        ({"prompt": "x", "top_p": 0}, "top_p must be between"),
        ({"prompt": "x", "top_k": -2}, "top_k must be"),
        ({"prompt": "x", "seed": -1}, "seed must be"),
        ({"prompt": "x", "seed": 2**64}, "seed must be an integer between 0 and"),
        ({"prompt": "x", "seed": 1.5}, "seed must be"),
        ({"prompt": "x", "temperature": 10**400}, "temperature must be between 0.0 and 100.0"),
        ({"prompt": "x", "max_tokens": 10**5000}, "max_tokens must be between"),
        ({"prompt": "x", "stop_token_ids": [1] * 1025}, "at most 1024 ids"),
        ({"prompt": "x", "stop_token_ids": "1"}, "stop_token_ids must be"),
        ({"prompt": "x", "stop": ["a" * 257]}, "at most 256 characters"),
        ({"prompt": "x", "logprobs": -1}, "logprobs must be"),
        ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ({"prompt": "x", "stop": [""]}, "stop must be"),
        ({"prompt": "x", "stop": ["a"] * 17}, "at most 16"),
        ({"prompt": "x", "stop_token_ids": [VOCAB]}, "stop_token_ids must be"),
        (
            {"prompt": "x", "min_tokens": 20, "max_tokens": 10},
            "min_tokens must be between 0 and 10",
        ),
        ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos must be a boolean"),
        ({"prompt": "x", "logprobs": 21}, "logprobs must be"),
        ({"prompt": "x", "stream": "yes"}, "stream must be a boolean"),
    ],
)
def test_bad_requests_are_400(payload, message):
    with pytest.raises(PredictionException) as caught:
        parse(payload)
    assert caught.value.error_code == 400
    assert message in caught.value.message


@pytest.mark.parametrize("tiny", [1e-45, 5e-324, 9e-6])
def test_a_temperature_below_the_greedy_bound_is_greedy(tiny):
    """Dividing logits by a denormal makes them infinite: such a temperature samples greedily."""
    params = parse({"prompt": "x", "temperature": tiny}).params
    assert params.temperature == 0.0 and params.greedy
    assert parse({"prompt": "x", "temperature": 1e-5}).params.temperature == 1e-5


def test_the_largest_seed_torch_takes_is_accepted():
    assert parse({"prompt": "x", "seed": 2**64 - 1}).params.seed == 2**64 - 1
