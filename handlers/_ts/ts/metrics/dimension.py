"""``ts.metrics.dimension``."""

from __future__ import annotations

from handlers.metrics import Dimension

__all__ = ["Dimension"]
