"""``ts.torch_handler.base_handler``: Lantern's ``handlers.base_handler``."""

from __future__ import annotations

from handlers.base_handler import BaseHandler

__all__ = ["BaseHandler"]
