"""The ``text_generation`` handler on an archive holding one ``.gguf`` file (a tiny Llama written
here in llama.cpp's layout): transformers loads it, and greedy output equals the original's."""

from __future__ import annotations

import torch

from handlers.context import Context
from handlers.service import load_service
from tests.support.generation_fixtures import build_model, build_tokenizer, save_gguf

MANIFEST = {"model": {"modelName": "tiny-gguf", "handler": "text_generation"}}


def test_a_gguf_archive_serves_greedy_output_equal_to_the_original_model(tmp_path):
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer.eos_token_id)
    save_gguf(tmp_path / "tiny.gguf", model, tokenizer)
    context = Context("tiny-gguf", str(tmp_path), MANIFEST, 1, None, "0.12.0", num_threads=1)
    service = load_service(tmp_path, MANIFEST, context)

    prompt = "héllo the quick brown fox"
    ids = torch.tensor([tokenizer.encode(prompt)])
    expected = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=None,
    )[0, ids.shape[1] :].tolist()
    context.request_ids = {0: "r0"}
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    (result,) = service.predict([{"body": body}], context)
    assert result["tokens"] == expected
    assert result["text"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert service.handler.describe()["limits"]["max_model_len"] == 256  # from the GGUF metadata
