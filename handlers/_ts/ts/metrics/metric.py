"""``ts.metrics.metric``: the legacy single-value ``Metric``."""

from __future__ import annotations

from handlers.metrics import LegacyMetric as Metric

__all__ = ["Metric"]
