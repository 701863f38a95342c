"""``ts.metrics.metric_cache_yaml_impl``: a metrics store declared by a ``metrics.yaml``."""

from __future__ import annotations

from handlers.metrics import MetricsCacheYamlImpl

__all__ = ["MetricsCacheYamlImpl"]
