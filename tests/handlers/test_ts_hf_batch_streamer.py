"""``ts.handler_utils.hf_batch_streamer``: one text stream per row of a batched ``generate``."""

from __future__ import annotations

import threading

import pytest
import torch

from handlers.compat import install_ts_alias
from tests.support.generation_fixtures import build_model, build_tokenizer

install_ts_alias()

from ts.handler_utils.hf_batch_streamer import TextIteratorStreamerBatch  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_generate_streams_each_row_and_the_pieces_make_its_text(tokenizer) -> None:
    model = build_model(len(tokenizer), tokenizer.eos_token_id)
    tokenizer.padding_side = "left"
    prompts = ["the quick brown fox", "héllo"]
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    streamer = TextIteratorStreamerBatch(
        tokenizer, batch_size=2, skip_prompt=True, skip_special_tokens=True, timeout=60
    )
    out: dict[str, torch.Tensor] = {}

    def run() -> None:
        out["ids"] = model.generate(
            **inputs, max_new_tokens=12, do_sample=False, eos_token_id=None, streamer=streamer
        )

    thread = threading.Thread(target=run)
    thread.start()
    steps = list(streamer)  # what a handler sends, step by step
    thread.join(60)
    assert steps and all(len(step) == 2 for step in steps)
    new = out["ids"][:, inputs["input_ids"].shape[1] :]
    for row in range(2):
        text = "".join(step[row] for step in steps)
        assert text == tokenizer.decode(new[row], skip_special_tokens=True)


def test_a_row_that_ends_first_yields_empty_text_until_all_have(tokenizer) -> None:
    streamer = TextIteratorStreamerBatch(tokenizer, batch_size=2)
    words = tokenizer.encode(" the quick brown fox jumps over")
    one = tokenizer.encode(" dog")
    streamer.put(torch.tensor([words[:1], one[:1]]))
    for index in range(1, len(words)):
        streamer.put(torch.tensor([words[index], one[index] if index < len(one) else one[-1]]))
    streamer.end()
    steps = list(streamer)
    assert len({len(step) for step in steps}) == 1
    first = "".join(step[0] for step in steps)
    assert first == tokenizer.decode(words)  # nothing of the longer row is lost
    assert "".join(step[1] for step in steps).startswith(" dog")


def test_a_tensor_of_another_batch_size_is_refused(tokenizer) -> None:
    streamer = TextIteratorStreamerBatch(tokenizer, batch_size=2)
    with pytest.raises(ValueError, match="batch size is set to 2"):
        streamer.put(torch.tensor([[1, 2, 3]]))
