"""``ts.metrics.metric_type_enum``."""

from __future__ import annotations

from handlers.metrics import MetricTypes

__all__ = ["MetricTypes"]
