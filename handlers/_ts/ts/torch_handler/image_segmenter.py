"""``ts.torch_handler.image_segmenter``: Lantern's ``handlers.image_segmenter``."""

from __future__ import annotations

from handlers.image_segmenter import ImageSegmenter

__all__ = ["ImageSegmenter"]
