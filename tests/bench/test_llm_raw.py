"""bench/llm_raw.py's engine under the load's pattern, on the tiny model of the engine tests."""

from __future__ import annotations

import pytest

from bench.llm_raw import engine_load
from tests.support.generation_fixtures import build_model, build_tokenizer

PROMPTS = ["the quick brown fox jumps over", "a model server answers requests", "héllo"]


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tokenizer()
    return build_model(len(tokenizer), tokenizer.eos_token_id), tokenizer


@pytest.mark.parametrize("prefix_cache_tokens", [0, 512])
def test_every_request_of_the_load_is_answered_whole(tiny, prefix_cache_tokens):
    model, tokenizer = tiny
    # 7 requests over 3 streams: the last wave is partial, the prompts repeat (prefix hits)
    produced, seconds = engine_load(model, tokenizer, PROMPTS, 3, 7, 5, prefix_cache_tokens)
    assert produced == 7 * 5 and seconds > 0
