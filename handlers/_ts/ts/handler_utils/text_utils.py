"""``ts.handler_utils.text_utils``: tokenizers and n-grams for text handlers."""

from __future__ import annotations

from collections.abc import Callable

from handlers.text_processing import basic_english, ngrams_iterator

__all__ = ["get_tokenizer", "ngrams_iterator"]


def get_tokenizer(tokenizer: str | Callable | None, language: str = "en") -> Callable:
    """None: split on spaces; "basic_english": TorchText's normaliser; a callable: itself."""
    if tokenizer is None:
        return str.split
    if callable(tokenizer):
        return tokenizer
    if tokenizer == "basic_english":
        if language != "en":
            raise ValueError("Basic normalization is only available for English(en)")
        return basic_english
    raise ValueError(f"tokenizer {tokenizer!r} is not supported (None or 'basic_english')")
