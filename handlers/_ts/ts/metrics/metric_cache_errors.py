"""``ts.metrics.metric_cache_errors`` (the errors Lantern's metrics store raises)."""

from __future__ import annotations

from handlers.metrics import (
    GeneralMetricsCacheError,
    MetricsCacheIOError,
    MetricsCacheKeyError,
    MetricsCachePyYamlError,
    MetricsCacheTypeError,
    MetricsCacheValueError,
)

__all__ = [
    "GeneralMetricsCacheError",
    "MetricsCacheIOError",
    "MetricsCacheKeyError",
    "MetricsCachePyYamlError",
    "MetricsCacheTypeError",
    "MetricsCacheValueError",
]
