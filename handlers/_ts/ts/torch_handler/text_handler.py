"""``ts.torch_handler.text_handler``: Lantern's ``handlers.text_handler``."""

from __future__ import annotations

from handlers.text_handler import TextHandler

__all__ = ["TextHandler"]
