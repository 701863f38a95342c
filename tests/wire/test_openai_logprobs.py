"""The handler's logprobs rows in OpenAI's two shapes: completions' lists, chat's content."""

from __future__ import annotations

from typing import Any

import pytest

from serve.wire.openai import GenerationCall, chunk_body, completion_body, logprobs_body

PARIS = [[5, -0.25, " Paris"], [9, -2.0, " Lyon"]]
ROWS = [
    {"token_id": 5, "token": " Paris", "logprob": -0.25, "top": PARIS},
    {"token_id": 7, "token": ".", "logprob": -0.5, "top": [[7, -0.5, "."], [3, -1.5, "!"]]},
]


def call(chat: bool) -> GenerationCall:
    return GenerationCall("m", chat, False, False)


def test_completions_get_tokens_their_logprobs_the_top_ones_and_text_offsets() -> None:
    assert logprobs_body(call(False), ROWS, offset=3) == {
        "tokens": [" Paris", "."],
        "token_logprobs": [-0.25, -0.5],
        "top_logprobs": [{" Paris": -0.25, " Lyon": -2.0}, {".": -0.5, "!": -1.5}],
        "text_offset": [3, 9],  # after 3 characters already sent, then " Paris" (6)
    }


def test_chat_gets_content_entries_with_bytes_and_top_logprobs() -> None:
    body = logprobs_body(call(True), ROWS)
    assert body is not None
    first = body["content"][0]
    assert first == {
        "token": " Paris",
        "logprob": -0.25,
        "bytes": list(b" Paris"),
        "top_logprobs": [
            {"token": " Paris", "logprob": -0.25, "bytes": list(b" Paris")},
            {"token": " Lyon", "logprob": -2.0, "bytes": list(b" Lyon")},
        ],
    }
    assert [e["token"] for e in body["content"]] == [" Paris", "."]


@pytest.mark.parametrize(
    "rows", [None, "x", [{"token_id": 1}], [{"token": "a", "logprob": "?", "top": []}]]
)
def test_no_rows_or_another_handlers_shape_is_null_not_a_500(rows: Any) -> None:
    assert logprobs_body(call(False), rows) is None
    assert logprobs_body(call(True), rows) is None


def test_the_whole_answer_and_a_chunk_carry_them_in_their_choice() -> None:
    answer = {"text": " Paris.", "finish_reason": "length", "logprobs": ROWS}
    whole = completion_body(call(False), "cmpl-1", 1, answer)
    assert whole["choices"][0]["logprobs"]["tokens"] == [" Paris", "."]
    assert completion_body(call(True), "c", 1, {"text": "x"})["choices"][0]["logprobs"] is None
    chunk = chunk_body(call(True), "c", 1, text=" Paris", logprobs={"content": []})
    assert chunk["choices"][0]["logprobs"] == {"content": []}
