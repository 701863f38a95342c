"""``TextHandler``: base for text handlers (``ts.torch_handler.text_handler``).

Loads the vocabulary (see ``handlers.vocab``) and offers TorchServe's clean-up steps as methods.
The tokenizer is a torchtext-free ``basic_english``.
"""

from __future__ import annotations

from abc import ABC
from typing import Any

from handlers import text_processing
from handlers.base_handler import BaseHandler
from handlers.context import Context
from handlers.exceptions import PredictionException
from handlers.vocab import Vocab, find_vocab_file, load_vocab


class TextHandler(BaseHandler, ABC):
    """Vocabulary plus HTML/contraction/accent/punctuation clean-up and tokenisation."""

    def __init__(self) -> None:
        super().__init__()
        self.source_vocab: Vocab | None = None
        self.tokenizer = text_processing.basic_english
        self.input_text: Any = None

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        self.initialized = False
        model_dir: str = context.system_properties["model_dir"]
        self.source_vocab = load_vocab(find_vocab_file(model_dir, self.manifest))
        self.initialized = True

    def get_source_vocab_path(self, ctx: Context) -> str:
        return find_vocab_file(ctx.system_properties["model_dir"], ctx.manifest)

    @staticmethod
    def _row_text(row: Any) -> str:
        text = (row.get("data") or row.get("body")) if isinstance(row, dict) else row
        if isinstance(text, (bytes, bytearray)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PredictionException(f"text is not valid UTF-8: {exc}", 400) from exc
        if not isinstance(text, str):
            raise PredictionException(f"expected text, got {type(text).__name__}", 400)
        return text

    def _expand_contractions(self, text: str) -> str:
        return text_processing.expand_contractions(text)

    def _remove_accented_characters(self, text: str) -> str:
        return text_processing.remove_accented_characters(text)

    def _remove_html_tags(self, text: str) -> str:
        return text_processing.remove_html_tags(text)

    def _remove_punctuation(self, text: str) -> str:
        return text_processing.remove_punctuation(text)

    # TorchServe's original misspelling, kept for handlers that call it.
    _remove_puncutation = _remove_punctuation

    def _tokenize(self, text: str) -> list[str]:
        return self.tokenizer(text)

    def get_word_token(self, input_tokens: list[str]) -> list[str]:
        """Tokens with the BPE space marker removed."""
        return [token.replace("\u0120", "") for token in input_tokens]
