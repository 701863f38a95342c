"""``TextClassifier``: TorchServe's ``text_classifier`` default handler, batch-aware.

Each row is cleaned (HTML, case, contractions, accents, punctuation), tokenised, expanded with
bigrams and looked up in the vocabulary; the model is called as ``model(token_ids, offsets)``
(an ``EmbeddingBag`` model) and each row gets ``{label: probability}`` over all classes.

Explanations (``/explanations``, ``:explain``, v2 ``explain``) answer TorchServe's shape, one
``{"words": [...], "importances": [...]}`` per row, from Integrated Gradients on the model's
``embedding`` layer (``handlers.explain``; no captum needed), ``target`` from the first row.

Deviations from TorchServe: every row of the batch is classified and explained (TorchServe reads
``data[0]`` only, so larger batches fail the length check); the vocabulary is a plain
token->index dict or list (see ``handlers.vocab``), not a pickled torchtext ``Vocab``;
``words`` are the tokens the model sees (words and their bigrams, ``"not good"``) with one
importance each, summed over the embedding and scaled to unit length. TorchServe's captum path
lists the unigrams but attributes the embedding bag's output, so its ``importances`` are one
list of embedding-width numbers that name no word.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from handlers.exceptions import PredictionException
from handlers.explain import integrated_gradients
from handlers.labels import map_class_to_label
from handlers.text_handler import TextHandler
from handlers.text_processing import ngrams_iterator
from handlers.timer import timed


class TextClassifier(TextHandler):
    """Takes texts, returns class probabilities for each."""

    ngrams = 2
    ig_steps = 50

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
        self.input_text = []  # each row's n-grams, for explanations (get_insights)
        for row in data:
            grams = list(ngrams_iterator(self._clean(self._row_text(row)), self.ngrams))
            self.input_text.append(grams)
            offsets.append(len(token_ids))
            token_ids.extend(vocab[t] for t in grams)
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

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> list[dict]:
        """Per row, its n-grams and their Integrated Gradients importances for class ``target``."""
        embedding = getattr(self.model, "embedding", None)
        if not isinstance(embedding, torch.nn.EmbeddingBag) or embedding.mode == "max":
            raise PredictionException(
                "explanations need a PyTorch model whose `embedding` is a sum or mean EmbeddingBag",
                501,
            )
        token_ids, offsets = tensor_data
        ends = [*offsets.tolist()[1:], len(token_ids)]
        words: list[list[str]] = self.input_text or []
        return [
            {
                "words": self.get_word_token(words[i] if i < len(words) else []),
                "importances": self._importances(embedding, token_ids[start:end], int(target)),
            }
            for i, (start, end) in enumerate(zip(offsets.tolist(), ends, strict=True))
        ]

    def _importances(
        self, embedding: torch.nn.EmbeddingBag, token_ids: torch.Tensor, target: int
    ) -> list[float]:
        """One number per token: IG attributions of its embedding, summed, unit length."""
        if token_ids.numel() == 0:
            return []
        offsets = torch.zeros(1, dtype=torch.long, device=token_ids.device)
        vectors = embedding.weight[token_ids].detach().unsqueeze(0)  # [1, tokens, width]
        pool = torch.mean if embedding.mode == "mean" else torch.sum

        def forward(scaled: torch.Tensor) -> torch.Tensor:
            # The bag's output is recomputed from the (scaled) token vectors, so gradients reach
            # each token; the rest of the model runs as it is.
            bags = pool(scaled, dim=1)
            handle = embedding.register_forward_hook(lambda _m, _i, _o: bags)
            try:  # copies: ids made under inference mode cannot be saved for backward
                return self.model(token_ids.clone(), offsets.clone())
            finally:
                handle.remove()

        attributions = integrated_gradients(forward, vectors, target, n_steps=self.ig_steps)
        per_token = attributions.sum(dim=-1)[0]
        norm = torch.linalg.vector_norm(per_token)
        return (per_token / norm if norm > 0 else per_token).tolist()
