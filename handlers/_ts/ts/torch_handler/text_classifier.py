"""``ts.torch_handler.text_classifier``: Lantern's ``handlers.text_classifier``."""

from __future__ import annotations

from handlers.text_classifier import TextClassifier

__all__ = ["TextClassifier"]
