"""``ts.metrics.caching_metric``."""

from __future__ import annotations

from handlers.metrics import CachingMetric

__all__ = ["CachingMetric"]
