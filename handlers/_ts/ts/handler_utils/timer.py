"""``ts.handler_utils.timer``."""

from __future__ import annotations

from handlers.timer import timed

__all__ = ["timed"]
