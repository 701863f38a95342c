"""The built-in text_classifier on a batch: every row classified, bigrams, vocab, labels."""

from __future__ import annotations

import pytest
import torch
from handler_helpers import set_batch, write, write_json

from handlers.exceptions import PredictionException
from handlers.text_processing import basic_english, expand_contractions, ngrams_iterator

MODEL_PY = """
    import torch
    from torch import nn


    class SentimentBag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.EmbeddingBag(8, 2, mode="sum")

        def forward(self, text, offsets):
            return self.embedding(text, offsets)
    """

VOCAB = {"<unk>": 0, "good": 1, "bad": 2, "movie": 3, "not": 4, "great": 5, "awful": 6, "is": 7}


@pytest.fixture
def text_service(package, tmp_path):
    # Sum of per-token scores [negative, positive]; unknown tokens and bigrams score 0.
    weights = torch.zeros(8, 2)
    weights[VOCAB["good"]] = torch.tensor([0.0, 3.0])
    weights[VOCAB["great"]] = torch.tensor([0.0, 3.0])
    weights[VOCAB["bad"]] = torch.tensor([3.0, 0.0])
    weights[VOCAB["awful"]] = torch.tensor([3.0, 0.0])
    torch.save({"embedding.weight": weights}, tmp_path / "sentiment.pth")
    torch.save(VOCAB, tmp_path / "source_vocab.pt")
    labels = write_json(tmp_path / "index_to_name.json", {"0": "negative", "1": "positive"})
    return package(
        model_name="sentiment",
        handler="text_classifier",
        serialized_file=tmp_path / "sentiment.pth",
        model_file=write(tmp_path / "model.py", MODEL_PY),
        extra_files=[tmp_path / "source_vocab.pt", labels],
    )


def test_every_row_of_a_batch_is_classified(text_service):
    service, ctx = text_service
    batch = [
        {"data": "This movie is <b>GOOD</b>!"},
        {"body": b"An awful, bad movie."},
        {"body": "Great."},
        {"body": ""},
        {"data": bytearray("Caf\u00e9 was awful".encode())},
    ]
    set_batch(ctx, batch)
    results = service.predict(batch, ctx)
    assert len(results) == len(batch)
    winners = [max(r, key=r.get) for r in results]
    assert winners[:3] == ["positive", "negative", "positive"]
    assert results[3] == {"negative": 0.5, "positive": 0.5}  # nothing known: a coin toss
    assert winners[4] == "negative"
    for result in results:
        assert set(result) == {"negative", "positive"}
        assert sum(result.values()) == pytest.approx(1.0)


def test_non_text_row_is_a_400(text_service):
    service, ctx = text_service
    batch = [{"body": "good"}, {"body": {"json": "object"}}]
    set_batch(ctx, batch)
    with pytest.raises(PredictionException) as info:
        service.predict(batch, ctx)
    assert info.value.error_code == 400


def test_tokenizer_and_ngrams_match_torchtext():
    assert basic_english("Don't panic, (it's) fine!") == [
        "don",
        "'",
        "t",
        "panic",
        ",",
        "(",
        "it",
        "'",
        "s",
        ")",
        "fine",
        "!",
    ]
    assert list(ngrams_iterator(["a", "b", "c"], 2)) == ["a", "b", "c", "a b", "b c"]
    assert expand_contractions("I can't've, Don't") == "I cannot have, Do not"


def test_explanations_name_the_words_that_decide(text_service):
    # TorchServe's shape, one per row: {"words": [...], "importances": [...]}, one number a word.
    service, ctx = text_service
    batch = [{"data": "good movie", "target": 1}, {"body": "awful, bad movie"}]
    set_batch(ctx, batch, [{"explain": "True"}, {"explain": "True"}])
    results = service.predict(batch, ctx)
    assert [r["words"] for r in results] == [
        ["good", "movie", "good movie"],
        ["awful", "bad", "movie", "awful bad", "bad movie"],
    ]
    for result in results:
        assert set(result) == {"words", "importances"}
        assert len(result["importances"]) == len(result["words"])
    # Class 1 (positive) is all "good"; the batch's target is its first row's, as TorchServe
    # reads it, and nothing in the second row speaks for class 1.
    assert results[0]["importances"] == pytest.approx([1.0, 0.0, 0.0])
    assert results[1]["importances"] == pytest.approx([0.0] * 5)

    batch = [{"body": "awful, bad movie"}]  # no target: class 0 (negative)
    set_batch(ctx, batch, [{"explain": "True"}])
    (result,) = service.predict(batch, ctx)
    half = 0.5**0.5
    assert result["importances"] == pytest.approx([half, half, 0.0, 0.0, 0.0])


def test_explanations_need_an_embedding_bag(text_service):
    service, ctx = text_service
    service.handler.model.embedding = torch.nn.Identity()
    batch = [{"data": "good"}]
    set_batch(ctx, batch, [{"explain": "True"}])
    with pytest.raises(PredictionException) as info:
        service.predict(batch, ctx)
    assert info.value.error_code == 501
