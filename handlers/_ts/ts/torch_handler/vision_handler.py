"""``ts.torch_handler.vision_handler``: Lantern's ``handlers.vision_handler``."""

from __future__ import annotations

from handlers.vision_handler import VisionHandler

__all__ = ["VisionHandler"]
