"""``ts.torch_handler.object_detector``: Lantern's ``handlers.object_detector``."""

from __future__ import annotations

from handlers.object_detector import ObjectDetector

__all__ = ["ObjectDetector"]
