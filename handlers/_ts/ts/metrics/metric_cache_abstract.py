"""``ts.metrics.metric_cache_abstract``: the ``context.metrics`` API (Lantern's store)."""

from __future__ import annotations

from handlers.metrics import MetricsStore as MetricCacheAbstract

__all__ = ["MetricCacheAbstract"]
