"""``TextClassifier``: TorchServe's ``text_classifier`` default handler, batch-aware.

Each row is cleaned (HTML, case, contractions, accents, punctuation), tokenised, expanded with
bigrams and looked up in the vocabulary; the model is called as ``model(token_ids, offsets)``
(an ``EmbeddingBag`` model) and each row gets ``{label: probability}`` over all classes.

Deviations from TorchServe: every row of the batch is classified (TorchServe reads ``data[0]``
only, so larger batches fail the length check); the vocabulary is a plain token->index dict or
list (see ``handlers.vocab``), not a pickled torchtext ``Vocab``; explanations are not supported.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from handlers.labels import map_class_to_label
from handlers.text_handler import TextHandler
from handlers.text_processing import ngrams_iterator
from handlers.timer import timed


class TextClassifier(TextHandler):
    """Takes texts, returns class probabilities for each."""

    ngrams = 2

    def _clean(self, text: str) -> list[str]:
        text = self._remove_html_tags(text)
        text = text.lower()
        text = self._expand_contractions(text)
        text = self._remove_accented_characters(text)
        text = self._remove_punctuation(text)
        return self._tokenize(text)

    @timed
    def preprocess(self, data: list) -> tuple[torch.Tensor, torch.Tensor]:
        """All rows' token ids in one flat tensor, plus each row's start offset."""
        vocab = self.source_vocab
        if vocab is None:
            raise RuntimeError(f"{type(self).__name__}.initialize has not loaded the vocabulary")
        token_ids: list[int] = []
        offsets: list[int] = []
        for row in data:
            tokens = self._clean(self._row_text(row))
            offsets.append(len(token_ids))
            token_ids.extend(vocab[t] for t in ngrams_iterator(tokens, self.ngrams))
        return (
            torch.as_tensor(token_ids, dtype=torch.long, device=self.device),
            torch.as_tensor(offsets, dtype=torch.long, device=self.device),
        )

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        text_tensor, offsets = data
        return super().inference(text_tensor, offsets)

    @timed
    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        return map_class_to_label(F.softmax(data, dim=1).tolist(), self.mapping)
