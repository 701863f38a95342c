"""``ts.metrics.metric_cache_errors`` (the errors Lantern's metrics store raises)."""

from __future__ import annotations

from handlers.metrics import MetricsCacheKeyError, MetricsCacheTypeError, MetricsCacheValueError

__all__ = ["MetricsCacheKeyError", "MetricsCacheTypeError", "MetricsCacheValueError"]
