"""``ts.metrics.metric_abstract``: the base of cached metrics (Lantern's ``CachingMetric``)."""

from __future__ import annotations

from handlers.metrics import CachingMetric as MetricAbstract

__all__ = ["MetricAbstract"]
