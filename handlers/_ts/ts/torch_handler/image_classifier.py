"""``ts.torch_handler.image_classifier``: Lantern's ``handlers.image_classifier``."""

from __future__ import annotations

from handlers.image_classifier import ImageClassifier

__all__ = ["ImageClassifier"]
